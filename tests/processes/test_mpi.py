"""Layer 3: the MPI transport under real ``mpiexec`` processes (world sizes 1-4), and the bench.

Each test launches ``jobs/check_collectives.py`` or the bench under ``mpiexec -n k`` and
checks the exit code and the per-check ``ok`` lines. The launcher and its flags: helpers/mpiexec.py.
Skipped when mpi4py or an mpiexec is missing. The bench runs on ``--backend local`` too.
"""
import json
import os
import subprocess
import sys

import pytest

from mpiexec import mpirun, needs_mpi
from repo import JOBS, ROOT

CHECKS = os.path.join(JOBS, "check_collectives.py")
BENCH = os.path.join(ROOT, "benchmarks", "bench.py")
pytestmark = needs_mpi


def expected_checks():
    with open(CHECKS) as f:
        text = f.read()
    return text.count('@check(')


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_collectives_under_mpiexec(n):
    from collectives.algorithms import capabilities
    result = mpirun(n, CHECKS)
    assert result.returncode == 0, result.stdout + result.stderr
    oks = [line for line in result.stdout.splitlines() if line.startswith("ok ")]
    # one differential check per collective, plus every other @check in the script
    assert len(oks) == expected_checks() - 1 + len(capabilities()), result.stdout
    assert result.stdout.rstrip().endswith("done")


def test_bench_smoke_json(tmp_path):
    out, csv_path = tmp_path / "bench.json", tmp_path / "bench.csv"
    result = mpirun(2, BENCH, "--sizes", "4K,16K", "--iters", "3", "--warmup", "1",
                    "--json", str(out), "--csv", str(csv_path), "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(out.read_text())
    records = data["records"]
    assert data["meta"]["backend"] == "mpi" and data["meta"]["world_size"] == 2
    assert "mpi_library" in data["meta"]
    collectives = {r["collective"] for r in records}
    assert collectives == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"}
    # --iters counts the timed calls of one round; the default 3 rounds pool theirs
    assert all(r["wrong"] == 0 and r["iters"] == 3 * r["rounds"] == 9 for r in records)
    natives = [r for r in records if r["algorithm"] == "native"]
    assert natives and all(r["ratio_to_native"] == pytest.approx(1.0) for r in natives)
    ours = [r for r in records if r["algorithm"] != "native"]
    assert all(r["ratio_to_native"] > 0 for r in ours)
    assert len(csv_path.read_text().splitlines()) == len(records) + 1
    assert "# Summary" in result.stdout and "ring vs" in result.stdout


def test_bench_local_backend(tmp_path):
    out = tmp_path / "local.json"
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "collectives.bench", "--backend", "local", "--world-size", "3",
         "--sizes", "1K,8K", "--iters", "2", "--warmup", "1", "--op", "max",
         "--collectives", "all_reduce,reduce_scatter", "--json", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    records = json.loads(out.read_text())["records"]
    assert {r["backend"] for r in records} == {"local"}
    assert all(r["wrong"] == 0 and r["op"] == "max" and r["world_size"] == 3 for r in records)
    assert all(r["ratio_to_native"] is None for r in records)     # local has no native


def test_bench_counts_wrong_results(tmp_path):
    """A broken algorithm must be caught: #wrong > 0 and a non-zero exit."""
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys\n"
        "import collectives.kernels.reduce as k\n"
        "real = k.reducer\n"
        "def broken(op, dtype):\n"
        "    f = real(op, dtype)\n"
        "    def apply(dst, a, b):\n"
        "        f(dst, a, b); dst[:1] += 1\n"
        "    return apply\n"
        "import collectives.call as c\n"
        "c.reducer = broken\n"
        "from collectives.bench import main\n"
        "sys.exit(main(sys.argv[1:]))\n")
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run(
        [sys.executable, str(script), "--backend", "local", "--world-size", "2",
         "--sizes", "1K", "--iters", "1", "--warmup", "1", "--collectives", "all_reduce",
         "--algorithms", "ring", "--no-progress"],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "wrong elements" in result.stderr


@pytest.mark.parametrize("text,expected", [
    ("4K:64K", (4096, 16384, 65536)), ("4K:16K:2", (4096, 8192, 16384)),
    ("1M", (1 << 20,)), ("4K,64K", (4096, 65536)), ("100", (100,))])
def test_parse_sizes(text, expected):
    from collectives.bench import parse_sizes
    assert parse_sizes(text) == expected


@pytest.mark.parametrize("text", ["", "4X", "64K:4K", "1K:2K:1"])
def test_parse_sizes_rejects(text):
    from collectives.bench import parse_sizes
    with pytest.raises(ValueError):
        parse_sizes(text)


def test_plot_without_matplotlib_is_a_clear_error(tmp_path):
    from collectives.bench import check_plotting
    problem = check_plotting()
    result = subprocess.run(
        [sys.executable, "-m", "collectives.bench", "--backend", "local", "--world-size", "2",
         "--sizes", "1K", "--iters", "1", "--collectives", "all_reduce", "--no-progress",
         "--plot", str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT),
        cwd=ROOT)
    if problem:
        assert result.returncode == 2 and "pip install matplotlib" in result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "p.png").stat().st_size > 0
