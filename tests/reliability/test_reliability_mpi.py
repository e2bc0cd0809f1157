"""Reliability under ``mpiexec`` (the MPICH wheel's): a rank that raises aborts the whole job
at once with a message naming it, mismatched calls under COLLECTIVES_DEBUG=DETAIL fail every
rank naming the ranks and fields, mismatched calls without DETAIL (dtype, op, sizes) fail
every rank naming both calls, on the compiled executor and the Python one, and a rank that
never arrives is a CollectiveTimeout naming operation, algorithm, rank, peer, step and time.
The same job scripts as the socket tests; every job is killed at its limit, so a hang fails.
"""
import re

import pytest

from mpiexec import needs_mpi
from reliability_jobs import (CALL_MISMATCHES, CI_BOUND, MISMATCHES, NEVER_ARRIVES,
                              SIZE_MISMATCH, check_call_mismatch_reports, check_detail_reports,
                              explain, job)

pytestmark = needs_mpi
MPI = {"BACKEND": "mpi"}


def by_rank(record, size):
    ranks = [[r for r in record["results"] if r.get("rank") == rank] for rank in range(size)]
    assert all(ranks), explain(record)
    return ranks


RAISES = job("rank_raises.py")


def test_a_rank_that_raises_aborts_the_job_quickly_naming_it(mpi_job):
    record = mpi_job(RAISES, 3, limit=60)
    print(f"\nuncaught exception on rank 1 of 3: mpiexec exited {record['rc']} after "
          f"{record['wall']:.2f} s (including start-up)")
    assert record["rc"] not in (0, None), explain(record)
    assert record["wall"] < 5 + CI_BOUND, explain(record)
    assert "rank 1 of 3 raised an uncaught RuntimeError; aborting the MPI job" in \
        record["stderr"], explain(record)
    assert "rank 1 fails on purpose" in record["stderr"]
    assert not record["results"], explain(record)


def test_detail_mismatches_under_mpiexec(mpi_job):
    record = mpi_job(MISMATCHES, 3, env={**MPI, "COLLECTIVES_DEBUG": "DETAIL"},
                     limit=60)
    assert record["rc"] == 0, explain(record)
    check_detail_reports(by_rank(record, 3))


def test_size_mismatch_without_detail_under_mpiexec(mpi_job):
    record = mpi_job(SIZE_MISMATCH, 3, env=MPI, limit=60)
    print("\n" + "\n".join(f"rank {r['rank']}: {r.get('type')} after {r.get('waited', 0):.2f} s:"
                           f" {r.get('message')}" for r in record["results"]))
    for results in by_rank(record, 3):
        assert "type" in results[0], explain(record)       # an error, never quiet garbage
    assert any("mismatched" in r["message"] for r in record["results"]), explain(record)


@pytest.mark.parametrize("compiled", ["1", "0"], ids=["compiled", "python"])
def test_call_mismatches_without_detail_fail_every_rank(mpi_job, compiled):
    record = mpi_job(CALL_MISMATCHES, 3, env={**MPI, "COLLECTIVES_COMPILED": compiled},
                     limit=120)
    assert record["rc"] == 0, explain(record)
    results = by_rank(record, 3)
    in_c = {r["compiled"] for rank in results for r in rank if r["case"] == "executor"}
    if compiled == "1" and in_c != {True}:
        pytest.skip("the compiled executor is not built here")
    assert in_c == {compiled == "1"}, explain(record)
    for r in results[0]:
        if "message" in r:
            print(f"\nrank 0, {r['case']} ({r['algorithm']}): {r['type']} after "
                  f"{r['waited'] * 1000:.0f} ms: {r['message']}")
    check_call_mismatch_reports(results)


def test_rank_that_never_arrives_under_mpiexec(mpi_job):
    record = mpi_job(NEVER_ARRIVES, 3, env=MPI, limit=60)
    assert record["rc"] == 0, explain(record)
    for rank, results in enumerate(by_rank(record, 3)[:2]):
        got = results[0]
        print(f"\nrank {rank}: {got.get('type')} after {got.get('waited', 0):.2f} s: "
              f"{got.get('message')}")
        assert got.get("type") == "CollectiveTimeout", got
        message = got["message"]
        assert message.startswith(f"all_reduce (ring) on rank {rank}, step "), message
        assert re.search(r"step \d+ of \d+", message) and re.search(r"waiting after 1\.\d+ s on rank(\(s\))? [0-2]", message), message
        assert re.search(r"after 1\.\d+ s", message), message
        assert 1.4 < got["waited"] < 1.5 + CI_BOUND
