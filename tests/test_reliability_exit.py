"""How a job ends when one of its processes leaves.

Under ``mpiexec`` (the MPICH wheel's): a rank that catches a CollectiveTimeout and calls
``sys.exit(1)`` while a peer never arrives, a rank that exits normally while a peer waits
for it in a collective, and a rank that leaves by ``os._exit`` each end the whole job within
seconds, naming the rank; a clean job, and ranks that finish at different times, still exit
0 without an abort. (The uncaught exception is in test_reliability_mpi.py.)

Under the launcher (``python -m collectives.run``): a launcher killed with SIGKILL takes its
workers (and their children) with it, and SIGTERM to the launcher stops them.

Every job is killed at its limit, so a hang fails the test instead of stalling CI.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from reliability_jobs import ROOT, explain, have_mpi, mpi_job

CI_BOUND = 10.0          # the promise is a few seconds; a loaded 2-core CI machine gets slack

needs_mpi = pytest.mark.skipif(not have_mpi(), reason="needs mpi4py and an mpiexec "
                                                      "(pip install mpi4py mpich)")


def _results(record, **match):
    return [r for r in record["results"] if all(r.get(k) == v for k, v in match.items())]


def _ended_after(record, ended, **match):
    """Seconds from the moment a rank reported it was leaving to the end of mpiexec."""
    leaving = _results(record, **match)
    assert leaving, explain(record)
    return ended - leaving[0]["leaving"]


# -- MPI: a rank leaves, the job ends -----------------------------------------------------------

TIMEOUT_THEN_EXIT = """
dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 1:
    time.sleep(120)                     # never makes the second call
    report(rank=rank, unexpected="woke")
else:
    try:
        dist.all_reduce(x, timeout=1)
        report(rank=rank, unexpected="success")
    except CollectiveTimeout as exc:
        report(rank=rank, leaving=time.time(), **failure(exc))
        sys.exit(1)
"""


@needs_mpi
def test_mpi_rank_that_exits_after_a_timeout_ends_the_job(tmp_path):
    record = mpi_job(tmp_path, TIMEOUT_THEN_EXIT, 2, limit=40)
    ended = time.time()
    delay = _ended_after(record, ended, rank=0)
    print(f"\nrank 0 caught a timeout and called sys.exit(1): mpiexec exited {record['rc']} "
          f"{delay:.2f} s later ({record['wall']:.2f} s in all)")
    assert record["rc"] == 1, explain(record)
    assert "rank 0 of 2 is exiting with code 1 after CollectiveTimeout: all_reduce" in \
        record["stderr"] and "aborting the MPI job" in record["stderr"], explain(record)
    assert delay < CI_BOUND and record["wall"] < 5 + CI_BOUND, explain(record)
    assert not _results(record, unexpected="woke")


LEAVES_WHILE_PEER_WAITS = """
dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 1:
    report(rank=rank, leaving=time.time())  # a normal exit, without the second call
else:
    dist.all_reduce(x)                    # waits for rank 1 (up to the 60 s timeout)
    report(rank=rank, unexpected="success")
"""


@needs_mpi
def test_mpi_normal_exit_while_a_peer_waits_ends_the_job(tmp_path):
    record = mpi_job(tmp_path, LEAVES_WHILE_PEER_WAITS, 2, limit=40)
    ended = time.time()
    delay = _ended_after(record, ended, rank=1)
    print(f"\nrank 1 exited normally while rank 0 waited for it: mpiexec exited "
          f"{record['rc']} {delay:.2f} s later")
    assert record["rc"] not in (0, None), explain(record)
    assert "rank 1 of 2 is exiting while rank 0 waits for it in a collective that rank 1 " \
        "never called" in \
        record["stderr"] and "aborting the MPI job" in record["stderr"], explain(record)
    assert delay < CI_BOUND, explain(record)


OS_EXIT = """
dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 0:
    report(rank=rank, leaving=time.time())
    os._exit(3)
dist.all_reduce(x)
report(rank=rank, unexpected="success")
"""


@needs_mpi
def test_mpi_os_exit_ends_the_job_with_its_code(tmp_path):
    record = mpi_job(tmp_path, OS_EXIT, 2, limit=40)
    delay = _ended_after(record, time.time(), rank=0)
    print(f"\nrank 0 called os._exit(3): mpiexec exited {record['rc']} {delay:.2f} s later")
    assert record["rc"] == 3 and delay < CI_BOUND, explain(record)


FINISH_APART = """
dist.init_process_group("mpi", timeout=60)
rank, size = dist.get_rank(), dist.get_world_size()
x = np.full(1000, rank + 1.0)
dist.all_reduce(x)
assert x[0] == size * (size + 1) / 2
if rank == 0:
    time.sleep(2)                         # still busy while the others have left
    report(rank=rank, done="late")
elif rank == 1:
    dist.destroy_process_group()
    report(rank=rank, done="destroyed")
    sys.exit(0)
else:
    report(rank=rank, done="fell off the end")
"""


@needs_mpi
def test_mpi_clean_job_exits_zero_and_waits_for_a_busy_rank(tmp_path):
    record = mpi_job(tmp_path, FINISH_APART, 3, limit=40)
    print(f"\nclean job, rank 0 finishing 2 s after the others: mpiexec exited "
          f"{record['rc']} after {record['wall']:.2f} s")
    assert record["rc"] == 0, explain(record)
    assert sorted(r["done"] for r in record["results"]) == \
        ["destroyed", "fell off the end", "late"], explain(record)
    assert "aborting" not in record["stderr"], explain(record)
    assert record["wall"] < 2 + CI_BOUND, explain(record)


ALL_EXIT_NONZERO = """
dist.init_process_group("mpi", timeout=60)
x = np.ones(10)
dist.all_reduce(x)
report(rank=dist.get_rank(), done=True)
sys.exit(2)
"""


@needs_mpi
def test_mpi_every_rank_exiting_with_a_code_is_no_abort(tmp_path):
    record = mpi_job(tmp_path, ALL_EXIT_NONZERO, 2, limit=40)
    assert record["rc"] == 2 and len(record["results"]) == 2, explain(record)
    assert "aborting" not in record["stderr"], explain(record)
    assert record["wall"] < CI_BOUND, explain(record)
