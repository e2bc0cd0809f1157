"""README.md says what the code does: the algorithm table (docs/algorithms.md) names exactly
the registered algorithms, README's Quick start holds the commands CI runs, and every fenced
code block of README runs as written. Each block is listed below (``BLOCKS``, by its first line) with what it is and how
it is run; a block that cannot run in CI is listed with the reason. A new or changed block
fails ``test_every_block_is_listed`` until it is listed here.

Python blocks run in a fresh interpreter (a block that continues the one before it runs
after it, in one interpreter); a block whose first line reads ``# NAME.py, run with: COMMAND``
is saved as NAME.py and run with COMMAND (several ranks, through the launcher). Shell
commands run with ``python`` and ``mpiexec`` of this interpreter, at most 2 ranks (CI has 2
cores, and more ranks than cores times the scheduler, not the bench) and the bench's
smallest sweep (``SMALL``): each shows that the command and its flags work, not its numbers.
"""
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from collectives.algorithms import capabilities

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
ALGORITHMS = ROOT / "docs" / "algorithms.md"
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
# the bench's smallest sweep, appended to every bench command (later flags win)
SMALL = ["--sizes", "4K", "--collectives", "all_reduce", "--iters", "2", "--warmup", "1",
         "--no-progress", "--verify-seconds", "2"]
MAX_RANKS = 2
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                 "MPI_LOCALRANKID", "COLLECTIVES_TUNING", "COLLECTIVES_ALGORITHM")


@dataclass
class Block:
    section: str
    language: str
    text: str
    line: int

    @property
    def first(self) -> str:
        return _normal(self.text.strip().splitlines()[0])


def _normal(line: str) -> str:
    """A line without its trailing ``# comment`` and with single spaces (README aligns the
    comments of a block in columns; realigning them changes nothing)."""
    if not line.lstrip().startswith("#"):
        line = re.split(r"\s{2,}#\s", line)[0]
    return " ".join(line.split())


def readme_blocks() -> list[Block]:
    blocks, section, fence = [], "", None
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if fence is None and line.startswith("## "):
            section = line[3:].strip()
        match = re.match(r"^```(\w*)\s*$", line)
        if match and fence is None:
            fence, language, body, start = line, match.group(1), [], number
        elif line.startswith("```") and fence is not None:
            blocks.append(Block(section, language, "\n".join(body), start))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


# --- what each block is ------------------------------------------------------------------

@dataclass
class Exempt:
    reason: str


@dataclass
class Python:
    continues: str | None = None          # the first line of the block it continues
    expect: list = field(default_factory=list)   # regexes the output must match


@dataclass
class Shell:
    pass                                  # each line is listed in SHELL_LINES


BLOCKS = {
    # Quick start
    'python3 -m venv .venv && .venv/bin/pip install -e ".[mpi,fast]" && .venv/bin/mpiexec '
    '-n 8 .venv/bin/python benchmarks/bench.py': Exempt(
        "makes a venv and builds the package in it (minutes), then runs the full default "
        "sweep on 8 ranks (minutes more); run by hand in a fresh clone. Its form is checked "
        "by test_quick_start_has_the_two_commands and test_quick_start_installs_editable"),
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]" && .venv/bin/python -m '
    'pytest -q': Exempt("the test suite itself: CI runs exactly this line (.ci/run)"),
    # Use it
    "# demo.py, run with: python -m collectives.run --standalone --nproc-per-node 2 demo.py":
        Python(expect=[r"rank 0: 8 == 8", r"rank 1: 8 == 8"]),
    "# train.py, run with: python -m collectives.run --standalone --nproc-per-node 2 train.py":
        Python(expect=[r"rank 0: collectives -?\d", r"rank 1: collectives -?\d"]),
    "from collectives.algorithms.schedule import algorithm, partition, sendrecv": Python(),
    "# in the same Python session as the block above, which registered my_ring": Python(
        continues="from collectives.algorithms.schedule import algorithm, partition, "
                  "sendrecv"),
    # Algorithms
    "COLLECTIVES_SECRET=<one secret> COLLECTIVES_TOPOLOGY=2x4 python -m collectives.run "
    "--nnodes 2 \\": Exempt(
        "needs two hosts with a train.py on each; tests/reliability/test_two_hosts.py runs "
        "the same launcher flags across two network namespaces, and "
        "tests/reliability/test_two_hosts_slow_link.py a hierarchical job on COLLECTIVES_TOPOLOGY"),
    # The cost model
    "mpiexec -n 8 python benchmarks/bench.py --calibrate tuning.json --tune tuning.json "
    "--rounds 3": Shell(),
    # Benchmarks
    "mpiexec -n 8 python benchmarks/bench.py": Shell(),
}

SHELL_LINES = {
    "mpiexec -n 8 python benchmarks/bench.py --calibrate tuning.json --tune tuning.json "
    "--rounds 3": None,
    "COLLECTIVES_TUNING=tuning.json mpiexec -n 8 python train.py": Exempt(
        "train.py stands for the reader's own training script"),
    "mpiexec -n 8 python benchmarks/bench.py": None,
    "python benchmarks/bench.py --backend socket --world-size 4": None,
    "mpiexec -n 4 python benchmarks/bench.py --backend nccl --sizes 1M:1G": Exempt(
        "needs NVIDIA GPUs with CuPy (tests/gpu runs the nccl bench where there are some)"),
    "python -m collectives.run --standalone --nproc-per-node 4 benchmarks/bench.py --backend "
    "nccl": Exempt("needs NVIDIA GPUs with CuPy (tests/gpu runs the nccl bench where there "
                   "are some)"),
    "python benchmarks/bench.py --backend local --world-size 8": None,
    "python benchmarks/bench.py --simulate 4096": None,
}


def _kind(block: Block):
    return BLOCKS.get(block.first)


def _environment() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    return env


def _executable(word: str) -> str:
    return {"python": sys.executable, "python3": sys.executable, "mpiexec": MPIEXEC}.get(word,
                                                                                          word)


def _command(line: str, tmp_path) -> tuple[list, dict]:
    """A README command as this test runs it: (argv, extra environment)."""
    words = shlex.split(line)
    env = {}
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    argv = []
    for i, word in enumerate(words):
        if i and words[i - 1] in ("-n", "--world-size", "--nproc-per-node") and word.isdigit():
            word = str(min(int(word), MAX_RANKS))
        elif word == "tuning.json":
            word = str(tmp_path / "tuning.json")
        argv.append(_executable(word))
    return argv, env


def _run(argv, *, cwd, env=(), timeout=60) -> subprocess.CompletedProcess:
    if argv[0] == MPIEXEC and not os.path.exists(MPIEXEC):
        pytest.skip(f"no mpiexec beside {sys.executable}")
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                            env={**_environment(), **dict(env)})
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr, result.stderr
    return result


def _needs(text: str):
    for module in ("torch", "cupy", "matplotlib"):
        if re.search(rf"^\s*(import|from) {module}\b", text, re.M) and \
                importlib.util.find_spec(module) is None:
            pytest.skip(f"this block imports {module}, which is not installed")


# --- the tests ---------------------------------------------------------------------------

def test_algorithm_table_matches_the_capability_table():
    text = ALGORITHMS.read_text()
    documented = set(re.findall(r"^\| (\w+) \| `(\w+)` \|", text, re.M))
    registered = {(c, a) for c, algs in capabilities().items() for a in algs}
    assert documented == registered, (f"in docs/algorithms.md only: "
                                       f"{sorted(documented - registered)}; "
                                       f"in code only: {sorted(registered - documented)}")


def _quick_start() -> list[Block]:
    return [b for b in readme_blocks() if b.section == "Quick start"]


def test_quick_start_has_the_two_commands():
    commands = [b.text.strip() for b in _quick_start()]
    assert len(commands) == 2
    assert "mpiexec -n 8" in commands[0] and "benchmarks/bench.py" in commands[0]
    assert "pytest" in commands[1]


def test_quick_start_installs_editable():
    """Python started in the checkout imports the checkout's ``collectives`` (sys.path[0] is
    the current folder or the script's). A plain ``pip install .`` builds the compiled MPI
    executor into the installed copy only, so from the checkout the Python executor runs,
    several times slower on small messages. An editable install builds it beside the sources,
    so every way of running from the checkout finds it."""
    for block in _quick_start():
        installs = re.findall(r"pip install (.*?)(?:&&|$)", block.text)
        assert installs and all(i.split()[0] == "-e" for i in installs), block.text


def test_every_block_is_listed():
    blocks = readme_blocks()
    unknown = [f"README.md:{b.line} ({b.section}): {b.first!r}" for b in blocks
               if _kind(b) is None]
    assert not unknown, "blocks to list in tests/test_readme.py: " + "; ".join(unknown)
    firsts = [b.first for b in blocks]
    stale = [key for key in BLOCKS if key not in firsts]
    assert not stale, f"listed here but not in README.md any more: {stale}"
    lines = {_normal(line) for b in blocks if isinstance(_kind(b), Shell)
             for line in b.text.splitlines() if line.strip() and not line.startswith("#")}
    assert lines == set(SHELL_LINES), (f"shell lines to list: {sorted(lines - set(SHELL_LINES))}"
                                       f"; listed but gone: {sorted(set(SHELL_LINES) - lines)}")
    for block in blocks:
        kind = _kind(block)
        if isinstance(kind, Python):
            assert block.language == "python", f"README.md:{block.line} is Python: ```python"
        if block.section in ("Quick start", "Use it") and not isinstance(kind, Exempt):
            assert block.language, f"README.md:{block.line}: mark the block's language"


@pytest.mark.parametrize("block", [b for b in readme_blocks() if isinstance(_kind(b), Python)],
                         ids=lambda b: f"line{b.line}")
def test_python_block_runs_as_written(block, tmp_path):
    kind = _kind(block)
    text = block.text
    if kind.continues:
        before = next(b for b in readme_blocks() if b.first == kind.continues)
        text = before.text + "\n\n" + text
    _needs(text)
    launch = re.match(r"# (\w+\.py), run with: (.+)", block.text)
    if launch:
        (tmp_path / launch.group(1)).write_text(text + "\n")
        argv, env = _command(launch.group(2), tmp_path)
    else:
        (tmp_path / "block.py").write_text(text + "\n")
        argv, env = [sys.executable, "block.py"], {}
    result = _run(argv, cwd=tmp_path, env=env)
    for pattern in kind.expect:
        assert re.search(pattern, result.stdout), (pattern, result.stdout)


@pytest.mark.parametrize("line", sorted(SHELL_LINES))
def test_shell_command_runs(line, tmp_path):
    kind = SHELL_LINES[line]
    if isinstance(kind, Exempt):
        pytest.skip(kind.reason)
    argv, env = _command(line, tmp_path)
    if "benchmarks/bench.py" in line:
        argv += SMALL
    result = _run(argv, cwd=ROOT, env=env, timeout=90)
    if "--simulate" in line:
        assert "0 failed" in result.stdout, result.stdout
    else:
        assert "0 wrong elements" in result.stdout, result.stdout
    if "--tune" in line:
        assert (tmp_path / "tuning.json").exists()


def test_ci_runs_the_quick_start_test_command():
    """The test command is exempt from running here because CI runs it: ``.ci/run`` reads
    it out of README.md's Quick start. Its reading must give exactly that block's line."""
    script = (ROOT / ".ci" / "run").read_text()
    reading = re.search(r"^test_command=\$\((.+)\)$", script, re.M)
    assert reading, ".ci/run no longer reads test_command=$(...) out of README.md"
    result = subprocess.run(["bash", "-c", reading.group(1)], capture_output=True, text=True,
                            cwd=ROOT, timeout=30)
    assert result.returncode == 0, result.stderr
    commands = [b.text.strip() for b in _quick_start() if "pytest" in b.text]
    assert len(commands) == 1, commands
    assert result.stdout.strip() == commands[0], (result.stdout, commands[0])


def test_every_exemption_says_why():
    """A block or shell line that does not run here names its reason."""
    exempt = [k for k in [*BLOCKS.values(), *SHELL_LINES.values()] if isinstance(k, Exempt)]
    assert exempt and all(len(k.reason.split()) >= 3 for k in exempt), exempt
