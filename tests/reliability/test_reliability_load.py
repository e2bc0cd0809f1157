"""Load: 10,000 small asynchronous collectives over three process groups at once (the world and
two more groups, each with its own worker thread), interleaved with point-to-point ring
traffic from the main thread, on the socket transport (3 processes) and under
``mpiexec -n 2``. Every result is checked, resident memory is measured after a warm-up and at
the end (growth must stay under ``RSS_LIMIT_MIB``), and the job is killed at its limit, so a
hang fails the test. Numbers are printed (``pytest -s``).
"""
import pytest

from mpiexec import needs_mpi
from reliability_jobs import explain, job

pytestmark = pytest.mark.slow
TOTAL = 10_000
RSS_LIMIT_MIB = 4.0

LOAD = job("load.py")


def _check(results, size, label):
    assert len(results) == size, results
    for r in results:
        assert r["done"] == TOTAL and r["wrong"] == 0, r
        growth = r["rss_end"] - r["rss_start"]
        print(f"\n{label} rank {r['rank']}: {TOTAL} collectives (+ p2p) in "
              f"{r['seconds'] + r['warmup']:.1f} s, {(r['seconds']) / (TOTAL - 600) * 1e6:.0f} "
              f"us each after warm-up; RSS {r['rss_start']:.1f} -> {r['rss_end']:.1f} MiB "
              f"({growth:+.2f})")
        assert growth < RSS_LIMIT_MIB, r


def test_load_socket_three_processes(socket_job):
    records = socket_job(LOAD, 3, env={"BACKEND": "gloo", "TOTAL": str(TOTAL)}, limit=150)
    assert all(r["rc"] == 0 for r in records), explain(records)
    _check([r["results"][0] for r in records], 3, "socket")


@needs_mpi
def test_load_mpi_two_ranks(mpi_job):
    record = mpi_job(LOAD, 2, env={"BACKEND": "mpi", "TOTAL": str(TOTAL)}, limit=150)
    assert record["rc"] == 0, explain(record)
    _check(sorted(record["results"], key=lambda r: r["rank"]), 2, "mpi")
