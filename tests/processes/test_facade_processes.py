"""The facade in real processes: ``jobs/facade_suite.py`` under ``mpiexec -n 1..4``
(the mpi backend, native algorithms included) and under ``python -m collectives.run
--standalone --nproc-per-node 1..5`` (the socket backend).

The script calls every facade function with exact checks and prints ``OK rank R checks N``
per rank; here each run must exit 0 with one OK line per rank and no FAIL line. Each run is
bounded (a hang fails, and its whole process group is killed). Importing torch costs ~1.3 s
of CPU per rank, so torch tensors are checked in two runs only (mpi at 2 ranks, socket at 3);
the others set FACADE_SUITE_TORCH=0. The mpi runs are skipped when mpi4py or mpiexec is
missing (helpers/mpiexec.py: the mpiexec next to this Python first).
"""
import os
import re
import signal
import subprocess
import sys

import pytest

import mpiexec
from repo import JOBS, ROOT, child_env

SUITE = os.path.join(JOBS, "facade_suite.py")
LIMIT_S = 90
OK_LINE = re.compile(r"OK rank (\d+) checks (\d+)")
TORCH_RUNS = {("mpi", 2), ("socket", 3)}


def run_job(cmd, backend, n):
    env = child_env()
    env.pop("COLLECTIVES_ALGORITHM", None)      # every algorithm is asked for by name
    env.pop("COLLECTIVES_SECRET", None)
    env["FACADE_SUITE_TORCH"] = "1" if (backend, n) in TORCH_RUNS else "0"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)     # mpiexec / the launcher and every rank
        out, err = proc.communicate()
        pytest.fail(f"{backend} with {n} ranks hung past {LIMIT_S} s:\n{out}\n{err}")
    return proc.returncode, out, err


def assert_every_rank_ok(n, returncode, out, err):
    report = f"exit {returncode}\nstdout:\n{out}\nstderr:\n{err}"
    assert returncode == 0, report
    assert "FAIL" not in out, report
    found = {int(r): int(c) for r, c in OK_LINE.findall(out)}
    assert sorted(found) == list(range(n)), report
    assert all(count > 100 for count in found.values()), report


@mpiexec.needs_mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_facade_under_mpiexec(n):
    cmd = mpiexec.command(n, SUITE, "mpi")
    assert_every_rank_ok(n, *run_job(cmd, "mpi", n))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_facade_under_the_launcher(n):
    cmd = [sys.executable, "-m", "collectives.run", "--standalone", "--nproc-per-node", str(n),
           SUITE, "socket"]
    assert_every_rank_ok(n, *run_job(cmd, "socket", n))
