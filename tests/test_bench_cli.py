"""What a new user meets running the bench: its help, the message when no backend can be
guessed, errors said once per job, the header naming the executor that runs (and why not
the compiled one), and the warning when ranks outnumber cores. Every run is tiny."""
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from types import SimpleNamespace

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench.py")
TINY = ["--sizes", "4K", "--collectives", "all_reduce", "--iters", "2", "--warmup", "1",
        "--no-progress"]
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PMI_RANK", "PMIX_RANK",
                 "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "COLLECTIVES_TUNING",
                 "COLLECTIVES_ALGORITHM")
MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
pinnable = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                              reason="cannot pin a process to one core here")


def hidden(tmp_path, module):
    """A folder that, first on PYTHONPATH, makes ``import module`` fail."""
    folder = tmp_path / f"no_{module}"
    (folder / module).mkdir(parents=True)
    (folder / module / "__init__.py").write_text(f"raise ImportError('{module} hidden by the "
                                                 f"test')\n")
    return str(folder)


def one_core():
    """Run the child on one core (its ranks inherit it): oversubscribed with 2 ranks."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def run(command, *, path=(), timeout=120, pin=False):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = os.pathsep.join([*path, ROOT])
    env["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"       # ranks sharing a core yield it while waiting
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT, preexec_fn=one_core if pin else None)


def test_help_has_text_for_every_flag_and_shows_the_defaults():
    from collectives.bench import DEFAULT_SIZES, build_parser
    parser = build_parser()
    silent = [a.option_strings[0] for a in parser._actions if not (a.help or "").strip()]
    assert not silent, f"flags without help: {silent}"
    result = run([sys.executable, BENCH, "--help"], timeout=60)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())           # argparse wraps lines anywhere
    for default in (f"(default: {DEFAULT_SIZES})", "(default: float32)", "(default: sum)",
                    "(default: all_reduce,reduce_scatter,all_gather,all_to_all)",
                    "(default: 2)", "(default: 0.25)"):
        assert default in text, default
    assert "examples:" in text and "--backend socket --world-size 2" in text


def test_no_backend_detected_says_what_was_looked_for_and_what_to_do(tmp_path):
    """No mpi4py, no launcher, no flags: not a traceback about --backend local (which the user
    never chose) but what was detected and the three ways on."""
    result = run([sys.executable, BENCH], path=[hidden(tmp_path, "mpi4py")], timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    err = result.stderr
    assert "no --backend given and none detected" in err and "mpi4py is not importable" in err
    assert "pip install mpi4py mpich" in err and "mpiexec -n 2" in err
    assert "--backend socket --world-size 2" in err and "--backend local --world-size 2" in err
    assert "needs --world-size" not in err


def test_local_without_world_size_and_mpi_without_mpi4py_are_messages(tmp_path):
    local = run([sys.executable, BENCH, "--backend", "local"], timeout=60)
    assert local.returncode == 2 and "Traceback" not in local.stderr
    assert "--backend local needs --world-size N" in local.stderr
    mpi = run([sys.executable, BENCH, "--backend", "mpi"], path=[hidden(tmp_path, "mpi4py")],
              timeout=60)
    assert mpi.returncode == 2 and "Traceback" not in mpi.stderr
    assert "--backend mpi: mpi4py is not importable" in mpi.stderr


@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec beside this Python")
def test_plot_without_matplotlib_is_said_once_per_job(tmp_path):
    result = run([MPIEXEC, "-n", "3", sys.executable, BENCH, "--plot", str(tmp_path / "p.png"),
                  *TINY], path=[hidden(tmp_path, "matplotlib")], timeout=90)
    assert result.returncode != 0
    assert result.stderr.count("--plot needs matplotlib") == 1, result.stderr


@pinnable
def test_local_header_names_the_executor_and_warns_when_oversubscribed(tmp_path):
    """2 ranks (threads) on one core: the header and the summary both say so; 1 rank on one
    core does not. The executor and the host's load are in the JSON metadata too."""
    import json
    out = tmp_path / "b.json"
    crowded = run([sys.executable, BENCH, "--backend", "local", "--world-size", "2",
                   "--json", str(out), *TINY], pin=True)
    assert crowded.returncode == 0, crowded.stdout + crowded.stderr
    head, summary = crowded.stdout.split("# Summary", 1)
    assert "# executor: Python host executor (the local transport" in head
    assert "# host: 2 ranks of this job on 1 usable core" in head
    for part in (head, summary):
        text = " ".join(part.replace("#", " ").split())
        assert "WARNING: 2 ranks on 1 core of this host: oversubscribed" in text
        assert "ratios between algorithms and to native are unreliable" in text
    meta = json.loads(out.read_text())["meta"]
    assert meta["executor"].startswith("Python host executor")
    assert (meta["ranks_on_host"], meta["cores_on_host"], meta["oversubscribed"]) == (2, 1, True)
    alone = run([sys.executable, BENCH, "--backend", "local", "--world-size", "1", *TINY],
                pin=True)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert "# host: 1 rank of this job on 1 usable core" in alone.stdout
    assert "WARNING" not in alone.stdout


@pinnable
@pytest.mark.skipif(not os.path.exists(MPIEXEC), reason="no mpiexec beside this Python")
def test_mpi_header_names_the_executor_and_counts_the_ranks_on_this_host():
    """Under mpiexec the ranks on this host are counted through MPI (a shared-memory split)
    and the cores are their affinity: 2 ranks pinned to one core are oversubscribed. The
    executor line names the compiled executor, or says why the Python one runs instead."""
    result = run([MPIEXEC, "-n", "2", sys.executable, BENCH, "--algorithms", "ring", *TINY],
                 pin=True)
    assert result.returncode == 0, result.stdout + result.stderr
    head, summary = result.stdout.split("# Summary", 1)
    executor = " ".join(head.split("# executor: ", 1)[1].split("# host:")[0]
                        .replace("#", " ").split())
    assert executor.startswith("compiled MPI executor") or executor.startswith(
        "Python host executor: the compiled MPI executor is not used here: "), executor
    assert "# host: 2 ranks of this job on 1 usable core" in head
    assert "WARNING: 2 ranks on 1 core" in head and "WARNING: 2 ranks on 1 core" in summary


@pinnable
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 if hasattr(os, "sched_getaffinity")
                    else True, reason="binding 2 ranks to cores needs 2 cores")
def test_socket_ranks_run_by_hand_are_bound_to_cores_when_asked():
    """--backend socket run by hand with --bind-to core binds each process to one core
    (collectives.run --bind-to core: our rows moved a third as much between rounds on the
    2-core VM), the header says so and counts the cores of all ranks together (each has one,
    the job two); by default (none) they run where the OS puts them."""
    cores = len(os.sched_getaffinity(0))
    bound = "# host: 2 ranks of this job on 2 usable cores, each bound to one core"
    free = f"# host: 2 ranks of this job on {cores} usable cores\n"
    for flags, want in ((("--bind-to", "core"), bound), ((), free)):
        result = run([sys.executable, BENCH, "--backend", "socket", "--world-size", "2",
                      "--algorithms", "ring", *TINY, *flags])
        assert result.returncode == 0, result.stdout + result.stderr
        assert want in result.stdout, result.stdout


def _fake_tree(tmp_path, *, extension_in_checkout=False, installed_copy=True):
    """A checkout (setup.py, collectives/executors/) and, elsewhere, an installed copy whose
    executors folder has the compiled extension."""
    checkout = tmp_path / "checkout"
    (checkout / "collectives" / "executors").mkdir(parents=True)
    (checkout / "setup.py").write_text("")
    site = tmp_path / "site-packages"
    suffix = EXTENSION_SUFFIXES[0]
    if installed_copy:
        (site / "collectives" / "executors").mkdir(parents=True)
        (site / "collectives" / "executors" / f"_mpi_exec{suffix}").write_bytes(b"")
    if extension_in_checkout:
        (checkout / "collectives" / "executors" / f"_mpi_exec{suffix}").write_bytes(b"")
    return str(checkout / "collectives"), str(site)


def test_a_source_tree_shadowing_the_installed_package_is_explained(tmp_path):
    from collectives.bench import missing_extension_reason
    package, site = _fake_tree(tmp_path)
    why = missing_extension_reason(package, [str(tmp_path / "checkout"), site])
    assert why.startswith(f"extension not built in {package}")
    assert f"shadows the installed package at {os.path.join(site, 'collectives')}" in why
    assert "pip install -e ." in why and "run from outside the checkout" in why
    # no other copy: still a source tree, which an editable install builds in place
    lone, _ = _fake_tree(tmp_path / "lone", installed_copy=False)
    assert "a source tree: pip install -e" in missing_extension_reason(lone, [])
    # the extension where it was imported from: nothing to explain
    built, site = _fake_tree(tmp_path / "built", extension_in_checkout=True)
    assert missing_extension_reason(built, [site]) is None


def test_the_bench_header_and_info_explain_the_shadowing(tmp_path, monkeypatch):
    """The executor line of the bench and the compiled line of ``python -m collectives info``
    give the shadowing reason instead of "reinstall with Cython and an MPI compiler"."""
    from collectives import __main__ as info
    from collectives import bench
    from collectives.bench import machine
    from collectives.executors import compiled
    package, site = _fake_tree(tmp_path)
    monkeypatch.setattr(compiled, "status", lambda: "extension not built (cannot import name "
                        "'_mpi_exec'); reinstall with Cython and an MPI compiler")
    monkeypatch.setattr(machine, "_package_dir", lambda: package)
    monkeypatch.setattr(info, "_package_dir", lambda: package)
    monkeypatch.setattr(sys, "path", [str(tmp_path / "checkout"), site])
    group = SimpleNamespace(transport=SimpleNamespace(name="mpi", execute=None))
    line = bench.describe_executor(group)
    assert line.startswith("Python host executor: the compiled MPI executor is not used here: "
                           f"extension not built in {package} (the source tree shadows")
    assert "reinstall with Cython" not in line
    assert "the source tree shadows the installed package" in info._compiled_executor()


def test_oversubscription_warning_text():
    from collectives.bench import oversubscription_warning
    assert oversubscription_warning(2, 2, "mpi") is None
    text = oversubscription_warning(8, 2, "mpi")
    assert text.startswith("WARNING: 8 ranks on 2 cores of this host: oversubscribed")
    assert "mpiexec -n 2 here" in text
    assert "--world-size 2 here" in oversubscription_warning(3, 2, "socket")


def test_the_executor_line_says_what_the_compiled_executor_hands_to_python(monkeypatch):
    from collectives import bench
    from collectives.executors import compiled
    # the real status() would load mpi4py.MPI (MPI_Init) in the test process
    monkeypatch.setattr(compiled, "status", lambda: "in use (built for MPICH)")
    group = SimpleNamespace(execute=lambda *a, **k: None,
                            transport=SimpleNamespace(name="mpi", execute=None))
    assert bench.describe_executor(group, "float32", 1 << 20).startswith(
        "compiled MPI executor (Cython, the whole plan in C), ")
    assert "Python" not in bench.describe_executor(group, "float32", 1 << 20).replace(
        compiled.status(), "")
    assert bench.describe_executor(group, "complex64", 1 << 20).endswith(
        "; but complex64 plans run in the Python host executor")
    assert bench.describe_executor(group, "float32", 4 << 30).endswith(
        "; but messages of 2 GiB or more run in the Python host executor")
    socket = SimpleNamespace(transport=SimpleNamespace(name="socket"))
    assert bench.describe_executor(socket).startswith("Python host executor (the socket")
