"""Silent wrong results that must be errors or right answers: tags that wrapped, a subgroup
that shared the world's tag space, a wait repeated after a timeout that "succeeded" without
data, mismatched calls of equal byte sizes, and two threads calling collectives on one group.

Each case runs on the local transport (threads as ranks, fast) and, where the transport's own
code is involved, as a real job over sockets and under mpiexec. Every job is killed at its
limit, so a hang is a failure.
"""
import os

import numpy as np
import pytest

import collectives as dist
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.testing import spawn_local
from mpiexec import needs_mpi
from repo import HELPERS
from reliability_jobs import explain, job, mpi_job, socket_job

# -- tags ---------------------------------------------------------------------------------------


def _tags_beyond_16_bits(rank):
    """Tag 65536 is its own tag (it was folded onto tag 0)."""
    if rank == 0:
        dist.send(np.full(4, 1.0), dst=1, tag=0)
        dist.send(np.full(4, 2.0), dst=1, tag=65536)
        dist.send(np.full(4, 3.0), dst=1, tag=2**31 - 1)
        return None
    late, first, top = np.zeros(4), np.zeros(4), np.zeros(4)
    dist.recv(top, src=0, tag=2**31 - 1)
    dist.recv(first, src=0, tag=65536)
    dist.recv(late, src=0, tag=0)
    return top[0], first[0], late[0]


def test_user_tags_never_wrap_local():
    assert spawn_local(2, _tags_beyond_16_bits)[1] == (3.0, 2.0, 1.0)


def _tag_out_of_range(rank):
    errors = []
    for tag in (2**31, -1, 1.5, True):
        try:
            dist.isend(np.ones(2), dst=1 - rank, tag=tag)
        except (TypeError, ValueError) as exc:
            errors.append(str(exc))
    return errors


def test_a_tag_the_transport_cannot_carry_is_an_error_naming_call_and_rank():
    for rank, errors in enumerate(spawn_local(2, _tag_out_of_range)):
        assert len(errors) == 4, errors
        assert f"send on rank {rank}: tag 2147483648 is larger than the local transport can " \
               f"carry in this group (at most 2147483647)" in errors[0]
        assert all(f"send on rank {rank}" in e for e in errors)


def _many_groups(rank):
    """The 65th group (id 64) once shared the world group's tags: its p2p and collective
    traffic crossed the world's."""
    groups = [dist.new_group([0, 1]) for _ in range(64)]
    g64 = groups[-1]
    assert g64.group_id == 64
    if rank == 0:
        dist.send(np.full(3, 10.0), dst=1, tag=5)                 # world
        dist.send(np.full(3, 64.0), dst=1, tag=5, group=g64)      # group 64
    else:
        on_group, on_world = np.zeros(3), np.zeros(3)
        dist.recv(on_group, src=0, tag=5, group=g64)
        dist.recv(on_world, src=0, tag=5)
        assert on_group[0] == 64.0 and on_world[0] == 10.0, (on_group, on_world)
    wrong = 0
    for i in range(50):
        a, b = np.full(8, float(i)), np.full(8, 1000.0 + i)
        wa = dist.all_reduce(a, async_op=True)
        wb = dist.all_reduce(b, group=g64, async_op=True)
        wa.wait()
        wb.wait()
        wrong += int(not (a == 2 * i).all()) + int(not (b == 2 * (1000.0 + i)).all())
    return wrong


def test_the_65th_group_keeps_its_own_tags_local():
    assert spawn_local(2, _many_groups) == [0, 0]


TAGS_JOB = job("user_tags.py")


def _check_tags_job(results):
    by_rank = {}
    for r in results:
        by_rank.setdefault(r["rank"], []).append(r)
    assert any(r.get("first") == 2.0 and r.get("late") == 1.0 for r in by_rank[1]), results
    for rank in (0, 1):
        messages = [r["message"] for r in by_rank[rank] if "message" in r]
        assert messages and f"send on rank {rank}: tag 1099511627776 is larger than" \
            in messages[0], results
        assert [r["wrong"] for r in by_rank[rank] if "wrong" in r] == [0], results


def test_user_tags_and_the_65th_group_over_sockets(tmp_path):
    records = socket_job(tmp_path, TAGS_JOB, 2, env={"GROUPS": "1"}, limit=60)
    assert all(r["rc"] == 0 for r in records), explain(records)
    _check_tags_job([x for r in records for x in r["results"]])


@needs_mpi
def test_user_tags_under_mpiexec(tmp_path):
    record = mpi_job(tmp_path, TAGS_JOB, 2, env={"BACKEND": "mpi"}, limit=60)
    assert record["rc"] == 0, explain(record)
    _check_tags_job(record["results"])


# -- a wait repeated after a timeout -------------------------------------------------------------


def _wait_again(rank, group=None):
    """The receive stays pending after wait(timeout) raises; a later wait completes it with
    the data. A blocking recv that times out gives its receive up: the late message is left
    for the next receive and never lands in the abandoned buffer."""
    if rank == 1:
        buf = np.zeros(4)
        work = dist.irecv(buf, src=0, tag=3)
        with pytest.raises(CollectiveTimeout):
            work.wait(timeout=0.2)
        dist.barrier()                          # rank 0 sends now
        assert work.wait(timeout=20) is True
        abandoned = np.zeros(4)
        try:
            dist.recv(abandoned, src=0, tag=4, group=group or short)
        except CollectiveTimeout:
            pass
        else:
            raise AssertionError("recv on an empty channel returned")
        dist.barrier()                          # rank 0 sends the next message now
        taken = np.zeros(4)
        dist.recv(taken, src=0, tag=4)
        return buf.tolist(), abandoned.tolist(), taken.tolist()
    dist.barrier()
    dist.send(np.full(4, 7.0), dst=1, tag=3)
    dist.barrier()
    dist.send(np.full(4, 9.0), dst=1, tag=4)
    return None


short = None           # a group with a 0.3 s timeout, set by each job (one rank per process)


def _wait_again_local(rank):
    group = dist.new_group([0, 1], timeout=0.3)
    return _wait_again(rank, group)


def test_wait_after_a_timeout_completes_with_the_data_local():
    got = spawn_local(2, _wait_again_local)[1]
    assert got == ([7.0] * 4, [0.0] * 4, [9.0] * 4)


WAIT_AGAIN_JOB = job("wait_after_timeout.py")
TESTS = {"TESTS": os.path.dirname(os.path.abspath(__file__)), "HELPERS_DIR": HELPERS}


def _check_wait_again(results):
    got = [r["got"] for r in results if r["rank"] == 1]
    assert got == [[[7.0] * 4, [0.0] * 4, [9.0] * 4]], results


def test_wait_after_a_timeout_completes_with_the_data_over_sockets(tmp_path):
    records = socket_job(tmp_path, WAIT_AGAIN_JOB, 2, env=TESTS, limit=60)
    assert all(r["rc"] == 0 for r in records), explain(records)
    _check_wait_again([x for r in records for x in r["results"]])


@needs_mpi
def test_wait_after_a_timeout_completes_with_the_data_under_mpiexec(tmp_path):
    record = mpi_job(tmp_path, WAIT_AGAIN_JOB, 2, env={"BACKEND": "mpi", **TESTS}, limit=60)
    assert record["rc"] == 0, explain(record)
    _check_wait_again(record["results"])


# -- mismatched calls without DETAIL -------------------------------------------------------------

MISMATCH_JOB = job("equal_size_mismatch.py")


@pytest.mark.parametrize("case, algorithm", [("dtype", "ring"), ("op", "tree"),
                                             ("collective", "direct")])
def test_mismatched_calls_of_equal_sizes_fail_every_rank_over_sockets(tmp_path, case, algorithm):
    records = socket_job(tmp_path, MISMATCH_JOB, 3, env={"CASE": case, "ALGORITHM": algorithm},
                         limit=60)
    results = [x for r in records for x in r["results"]]
    assert sorted(r["rank"] for r in results) == [0, 1, 2], explain(records)
    for r in results:
        print(f"\n{case}: rank {r['rank']}: {r.get('type')} after {r.get('waited', 0):.3f} s: "
              f"{r.get('message')}")
        assert "unexpected" not in r, explain(records)
        assert "mismatched calls" in r["message"], r
        assert r["waited"] < 5, r                # an error, not a timeout (10 s)
    named = " ".join(r["message"] for r in results)
    wanted = {"dtype": "int32", "op": "MAX", "collective": "reduce_scatter"}[case]
    assert wanted in named, named


def _mismatch_local(rank):
    x = np.full(10, 2, np.int32 if rank == 0 else np.float32)
    try:
        # every rank past the group's making (its table agreement is a collective of its own);
        # a rank still in the barrier when the mismatch aborts the job hears of it there
        dist.barrier()
        dist.all_reduce(x, algorithm="ring")
    except CollectiveError as exc:
        return str(exc)
    return "no error"


def test_mismatched_dtypes_fail_every_rank_local():
    for message in spawn_local(3, _mismatch_local):
        assert "mismatched calls" in message and "int32" in message, message


# -- two threads, one group ---------------------------------------------------------------------

THREADS_JOB = job("two_threads_one_group.py")


def test_two_threads_calling_on_one_group_are_an_error_never_garbage(tmp_path):
    records = socket_job(tmp_path, THREADS_JOB, 2, limit=60)
    results = [x for r in records for x in r["results"]]
    assert len(results) == 2, explain(records)
    for r in results:
        print(f"\nrank {r['rank']}: {r['right']} right, {r['wrong']} wrong, "
              f"errors {r['errors']}")
        assert r["wrong"] == 0, r
        assert r["errors"], r
    assert any("ConcurrentCalls" in e and "at the same time" in e
               for r in results for e in r["errors"]), results


def _threads_local(rank):
    import threading
    pg = dist.GroupMember.WORLD
    errors = []

    def caller():
        for i in range(50):
            try:
                pg.prepare("all_reduce", output=np.ones(4), algorithm="ring")()
            except CollectiveError as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=caller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        dist.all_reduce(np.ones(4))              # one thread again, but the group is failed
    except CollectiveError as exc:
        return [type(e).__name__ for e in errors], type(exc).__name__
    return [type(e).__name__ for e in errors], None


def test_a_group_failed_by_concurrent_calls_stays_failed_local():
    results = spawn_local(2, _threads_local)
    assert any("ConcurrentCalls" in names for names, _ in results), results
    for names, later in results:
        assert len(names) == 2 and later is not None, results


# -- a call refused on one rank only -------------------------------------------------------------


def _refused_on_one_rank(rank):
    """Rank 1 refuses an all_reduce (an op its dtype cannot take); the others' call times out
    waiting for it. The next call must pair with the next call, not with the refused one's
    stray messages."""
    pg = dist.new_group([0, 1, 2], timeout=1.0)
    x = np.full(6, rank + 1, np.int64 if rank != 1 else np.float64)
    try:
        dist.all_reduce(x, op=dist.ReduceOp.BAND, group=pg, algorithm="ring")
        first = "ok"
    except (TypeError, CollectiveError) as exc:
        first = type(exc).__name__
    y = np.full(6, 10.0 * (rank + 1))
    dist.all_reduce(y, group=pg, algorithm="ring", timeout=20)  # rank 1 comes 1 s early
    return first, y.tolist()


def test_a_call_refused_on_one_rank_keeps_the_order_local():
    results = spawn_local(3, _refused_on_one_rank)
    assert [first for first, _ in results] == ["CollectiveTimeout", "TypeError",
                                               "CollectiveTimeout"], results
    assert all(y == [60.0] * 6 for _, y in results), results
