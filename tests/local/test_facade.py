"""The torch.distributed-shaped facade on the local backend (ranks are threads).

Every function of the facade, over world sizes 1-5, with numpy arrays (torch tensors in
test_facade_torch.py): results against numpy, async Work, subgroups, object collectives,
point-to-point with tags and any-source, and torch's error behaviour, including bad input
that must fail before any data moves and leave the caller's output untouched.
"""
from datetime import timedelta

import numpy as np
import pytest

import collectives as dist
from collectives.errors import CollectiveTimeout
from collectives.testing import RankFailed
from local_ranks import spawn

SIZES = [1, 2, 3, 4, 5]


def data(rank, n=7, dtype=np.float64):
    return (np.arange(n) + 10 * rank).astype(dtype)


# -- setup and errors ---------------------------------------------------------------------


def test_collectives_before_init_raise_torchs_value_error():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.all_reduce(np.ones(3))
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.get_rank()
    assert not dist.is_initialized()
    assert dist.GroupMember.WORLD is None and dist.group.WORLD is None


def test_double_init_raises():
    def fn(rank):
        with pytest.raises(ValueError, match="twice"):
            dist.init_process_group("local", rank=rank, world_size=2, store=None)
        return True
    assert spawn(2, fn) == [True, True]


def test_unknown_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match="known backends: .*mpi.*socket"):
        dist.init_process_group("carrier-pigeon", rank=0, world_size=1)
    with pytest.raises(ValueError, match="known backends"):
        dist.Backend("carrier-pigeon")
    assert not dist.is_initialized()


def test_backend_names():
    assert dist.Backend("GLOO") == "gloo" == dist.Backend.GLOO
    assert isinstance(dist.Backend("mpi"), str)
    assert (dist.Backend.MPI, dist.Backend.NCCL, dist.Backend.SOCKET) == ("mpi", "nccl", "socket")
    assert dist.is_available() and isinstance(dist.is_mpi_available(), bool)
    assert isinstance(dist.is_gloo_available(), bool) and isinstance(dist.is_nccl_available(), bool)
    assert dist.is_torchelastic_launched() is False or dist.is_torchelastic_launched() is True


def test_local_backend_needs_a_local_world():
    with pytest.raises(ValueError, match="LocalWorld"):
        dist.init_process_group("local", rank=0, world_size=1)


@pytest.mark.parametrize("n", SIZES)
def test_world_queries(n):
    def fn(rank):
        world = dist.group.WORLD
        assert world is dist.GroupMember.WORLD
        assert dist.get_process_group_ranks(world) == list(range(n))
        assert dist.get_global_rank(world, rank) == rank == dist.get_group_rank(world, rank)
        return dist.get_rank(), dist.get_world_size(), dist.get_backend(), dist.is_initialized()
    assert spawn(n, fn) == [(r, n, "local", True) for r in range(n)]
    assert not dist.is_initialized()


def test_failure_on_one_rank_reaches_the_caller_not_a_hang():
    def fn(rank):
        if rank == 1:
            raise KeyError("boom")
        dist.all_reduce(np.ones(3))
    with pytest.raises(RankFailed, match="rank 1 .*boom"):
        spawn(3, fn)


# -- collectives, numpy -------------------------------------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_reduce_all_reduce(n):
    def fn(rank):
        b = data(rank)
        dist.broadcast(b, src=n - 1)
        r = data(rank)
        dist.reduce(r, dst=n // 2, op=dist.ReduceOp.MAX)
        s = data(rank, dtype=np.int32)
        dist.all_reduce(s)
        a = data(rank, dtype=np.float32)
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        x = data(rank, dtype=np.uint8)
        dist.all_reduce(x, op="bxor")
        return b, r, s, a, x
    out = spawn(n, fn)
    rows = [data(r) for r in range(n)]
    xor = np.bitwise_xor.reduce([data(r, dtype=np.uint8) for r in range(n)])
    for rank, (b, r, s, a, x) in enumerate(out):
        np.testing.assert_array_equal(b, data(n - 1))
        np.testing.assert_array_equal(r, np.max(rows, 0) if rank == n // 2 else data(rank))
        np.testing.assert_array_equal(s, np.sum(rows, 0).astype(np.int32))
        np.testing.assert_allclose(a, np.mean(rows, 0), rtol=1e-6)
        np.testing.assert_array_equal(x, xor)


@pytest.mark.parametrize("n", SIZES)
def test_gathers_and_scatters(n):
    def fn(rank):
        even = [np.zeros(3) for _ in range(n)]
        dist.all_gather(even, data(rank, 3))
        uneven = [np.zeros(r + 1, np.int64) for r in range(n)]
        dist.all_gather(uneven, data(rank, rank + 1, np.int64))
        whole = np.zeros((n, 3))
        dist.all_gather_into_tensor(whole, data(rank, 3))
        root = n - 1
        gathered = [np.zeros(4) for _ in range(n)] if rank == root else None
        dist.gather(data(rank, 4), gathered, dst=root)
        mine = np.zeros(2)
        dist.scatter(mine, [data(j, 2) for j in range(n)] if rank == 0 else None, src=0)
        return even, uneven, whole, gathered, mine
    for rank, (even, uneven, whole, gathered, mine) in enumerate(spawn(n, fn)):
        for j in range(n):
            np.testing.assert_array_equal(even[j], data(j, 3))
            np.testing.assert_array_equal(uneven[j], data(j, j + 1, np.int64))
            np.testing.assert_array_equal(whole[j], data(j, 3))
            if rank == n - 1:
                np.testing.assert_array_equal(gathered[j], data(j, 4))
        assert gathered is None or rank == n - 1
        np.testing.assert_array_equal(mine, data(rank, 2))


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_even_uneven_and_tensor(n):
    def fn(rank):
        even = np.zeros(3)
        dist.reduce_scatter(even, [data(rank, 3) + j for j in range(n)])
        uneven = np.zeros(rank + 1, np.int64)
        dist.reduce_scatter(uneven, [data(rank, j + 1, np.int64) for j in range(n)],
                            op=dist.ReduceOp.MIN)
        flat = np.zeros(2)
        dist.reduce_scatter_tensor(flat, data(rank, 2 * n))
        return even, uneven, flat
    for rank, (even, uneven, flat) in enumerate(spawn(n, fn)):
        np.testing.assert_array_equal(even, sum(data(r, 3) + rank for r in range(n)))
        np.testing.assert_array_equal(uneven, data(0, rank + 1, np.int64))
        total = sum(data(r, 2 * n) for r in range(n))
        np.testing.assert_array_equal(flat, total[2 * rank:2 * rank + 2])


def chunk(src, dst, length):
    return np.full(length, 100 * src + dst, np.int32)


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_lists_and_single(n):
    def fn(rank):
        outs = [np.zeros(1 + (j + rank) % 3, np.int32) for j in range(n)]
        dist.all_to_all(outs, [chunk(rank, j, 1 + (rank + j) % 3) for j in range(n)])
        single = np.zeros(2 * n, np.int32)
        dist.all_to_all_single(single, np.concatenate([chunk(rank, j, 2) for j in range(n)]))
        sends = [(rank + j) % 2 + 1 for j in range(n)]
        recvs = [(j + rank) % 2 + 1 for j in range(n)]
        split = np.zeros((sum(recvs), 2), np.int32)
        inp = np.concatenate([chunk(rank, j, 2 * sends[j]) for j in range(n)]).reshape(-1, 2)
        dist.all_to_all_single(split, inp, recvs, sends)
        return outs, single, split
    for rank, (outs, single, split) in enumerate(spawn(n, fn)):
        for j in range(n):
            np.testing.assert_array_equal(outs[j], chunk(j, rank, 1 + (j + rank) % 3))
        np.testing.assert_array_equal(single, np.concatenate([chunk(j, rank, 2) for j in range(n)]))
        want = np.concatenate([chunk(j, rank, 2 * ((j + rank) % 2 + 1)) for j in range(n)])
        np.testing.assert_array_equal(split.reshape(-1), want)


@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "auto"])
def test_algorithm_keyword(algorithm):
    def fn(rank):
        a = data(rank, 11)
        dist.all_reduce(a, algorithm=algorithm)
        dist.barrier(algorithm=algorithm)
        return a
    for a in spawn(3, fn):
        np.testing.assert_array_equal(a, sum(data(r, 11) for r in range(3)))


def test_unknown_algorithm_is_a_value_error_everywhere():
    def fn(rank):
        a = data(rank)
        with pytest.raises(ValueError, match="valid"):
            dist.all_reduce(a, algorithm="telepathy")
        np.testing.assert_array_equal(a, data(rank))
        return True
    assert all(spawn(2, fn))


def test_barrier_and_monitored_barrier():
    def fn(rank):
        dist.barrier()
        dist.monitored_barrier(timeout=timedelta(seconds=5))
        if rank == 0:   # rank 1 never comes: a timeout, not a hang
            with pytest.raises(CollectiveTimeout):
                dist.monitored_barrier(timeout=timedelta(seconds=0.2))
        return True
    assert all(spawn(2, fn))


# -- async ----------------------------------------------------------------------------------


def test_async_ops_complete_in_order_with_futures():
    def fn(rank):
        a, b = data(rank), data(rank, dtype=np.int64)
        w1 = dist.all_reduce(a, async_op=True)
        w2 = dist.broadcast(b, src=1, async_op=True)
        outs = [np.zeros(7) for _ in range(3)]
        w3 = dist.all_gather(outs, data(rank), async_op=True)
        chained = w1.get_future().then(lambda f: f.value()[0].sum())
        assert isinstance(w1, dist.Work)
        assert w3.wait() is True and w2.wait(timeout=timedelta(seconds=5))
        assert w1.is_completed() and w1.is_success() and w1.exception() is None
        assert w1.result()[0] is a
        assert dist.barrier(async_op=True).wait()
        return a, b, outs, chained.wait()
    for a, b, outs, total in spawn(3, fn):
        want = sum(data(r) for r in range(3))
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(b, data(1, dtype=np.int64))
        for j in range(3):
            np.testing.assert_array_equal(outs[j], data(j))
        assert total == want.sum()


def test_synchronous_call_waits_for_pending_async_work():
    def fn(rank):
        a = data(rank)
        dist.all_reduce(a, async_op=True)       # never waited on
        b = a.copy() if False else data(rank)
        dist.all_reduce(b)                       # must run after the first one
        return a, b
    for a, b in spawn(4, fn):
        np.testing.assert_array_equal(a, sum(data(r) for r in range(4)))
        np.testing.assert_array_equal(b, a)


def test_work_delivers_a_failure():
    from collectives import work as work_module

    class Group:
        rank, group_id = 0, 99

    def broken():
        raise RuntimeError("wire on fire")
    w = work_module.submit(Group(), broken, [])
    with pytest.raises(RuntimeError, match="wire on fire"):
        w.wait()
    assert w.is_completed() and not w.is_success()
    assert isinstance(w.exception(), RuntimeError)
    with pytest.raises(RuntimeError):
        w.get_future().wait()


# -- subgroups ------------------------------------------------------------------------------


def test_subgroup_collectives_while_others_work():
    def fn(rank):
        evens = dist.new_group([0, 2])
        odds = dist.new_group([3, 1])
        a = data(rank)
        if rank in (0, 2):
            assert odds is dist.GroupMember.NON_GROUP_MEMBER
            assert dist.get_rank(evens) == rank // 2 and dist.get_world_size(evens) == 2
            assert dist.get_process_group_ranks(evens) == [0, 2]
            assert dist.get_global_rank(evens, 1) == 2 and dist.get_group_rank(evens, 2) == 1
            assert dist.all_reduce(a, group=odds) is None          # not a member: a no-op
            assert dist.get_rank(odds) == -1 and dist.get_world_size(odds) == -1
            dist.all_reduce(a, group=evens)
            dist.broadcast(a, src=2, group=evens)                 # src is a global rank
            got = [np.zeros(7), np.zeros(7)]
            dist.all_gather(got, data(rank), group=evens)
        else:
            dist.send(a, dst=4 - rank, group=odds) if rank == 3 else dist.recv(a, src=3, group=odds)
            got = None
        w = dist.all_reduce(np.ones(2), async_op=True)
        dist.barrier()
        w.wait()
        return a, got
    out = spawn(4, fn)
    for rank in (0, 2):
        np.testing.assert_array_equal(out[rank][0], data(0) + data(2))
        np.testing.assert_array_equal(out[rank][1][1], data(2))
    np.testing.assert_array_equal(out[1][0], data(3))


def test_new_subgroups_splits_the_world():
    def fn(rank):
        mine, every = dist.new_subgroups(2)
        assert len(every) == 2
        a = np.array([rank], np.int64)
        dist.all_reduce(a, group=mine)
        with pytest.raises(ValueError, match="divide"):
            dist.new_subgroups(3)
        return int(a[0])
    assert spawn(4, fn) == [1, 1, 5, 5]


def test_new_group_rejects_bad_ranks():
    def fn(rank):
        with pytest.raises(ValueError, match="distinct"):
            dist.new_group([0, 0])
        with pytest.raises(ValueError, match="distinct"):
            dist.new_group([0, 5])
        return True
    assert all(spawn(2, fn))


# -- object collectives ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 4])
def test_object_collectives(n):
    def fn(rank):
        payload = {"rank": rank, "text": "x" * rank, "list": list(range(rank))}
        objs = [None] * n
        dist.all_gather_object(objs, payload)
        blist = [{"from": 0}, (1, 2), "three"] if rank == n - 1 else [None, None, None]
        dist.broadcast_object_list(blist, src=n - 1)
        gathered = [None] * n if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        out = [None]
        dist.scatter_object_list(out, [f"for {j}" * (j + 1) for j in range(n)] if rank == 1 % n
                                 else None, src=1 % n)
        return objs, blist, gathered, out[0]
    for rank, (objs, blist, gathered, got) in enumerate(spawn(n, fn)):
        assert [o["rank"] for o in objs] == list(range(n)) and objs[-1]["text"] == "x" * (n - 1)
        assert blist == [{"from": 0}, (1, 2), "three"]
        assert gathered is None or [g["list"] for g in gathered] == [list(range(j)) for j in range(n)]
        assert got == f"for {rank}" * (rank + 1)


# -- point to point -------------------------------------------------------------------------


def test_send_recv_tags_and_any_source():
    def fn(rank):
        if rank == 0:
            first, second = np.zeros(3), np.zeros(3)
            dist.recv(second, src=1, tag=2)          # tags keep the two messages apart
            dist.recv(first, src=1, tag=1)
            senders = set()
            for _ in range(2):
                buf = np.zeros(1)
                source = dist.recv(buf)                  # any source
                assert buf[0] == source
                senders.add(source)
            return first, second, senders
        if rank == 1:
            dist.send(np.full(3, 1.0), dst=0, tag=1)
            dist.send(np.full(3, 2.0), dst=0, tag=2)
        dist.send(np.array([float(rank)]), dst=0)
        return None
    first, second, senders = spawn(3, fn)[0]
    assert first[0] == 1.0 and second[0] == 2.0 and senders == {1, 2}


@pytest.mark.parametrize("n", [2, 5])
def test_isend_irecv_and_batch_ring(n):
    def fn(rank):
        right, left = (rank + 1) % n, (rank - 1) % n
        got = np.zeros(4, np.int64)
        ops = [dist.P2POp(dist.irecv, got, left), dist.P2POp(dist.isend, data(rank, 4, np.int64), right)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        any_buf = np.zeros(1)
        req = dist.irecv(any_buf, tag=7)
        dist.isend(np.array([float(rank)]), dst=right, tag=7).wait()
        req.wait()
        assert req.is_completed() and req.source_rank == left == req._source_rank()
        return got, any_buf
    for rank, (got, any_buf) in enumerate(spawn(n, fn)):
        np.testing.assert_array_equal(got, data((rank - 1) % n, 4, np.int64))
        assert any_buf[0] == (rank - 1) % n


def test_p2p_bad_arguments():
    def fn(rank):
        with pytest.raises(ValueError, match="not be this rank"):
            dist.send(np.zeros(1), dst=rank)
        with pytest.raises(ValueError, match="not a rank"):
            dist.send(np.zeros(1), dst=7)
        with pytest.raises(ValueError, match="tag"):
            dist.send(np.zeros(1), dst=1 - rank, tag=-1)
        with pytest.raises(ValueError, match="isend or irecv"):
            dist.P2POp(dist.send, np.zeros(1), 0)
        return True
    assert all(spawn(2, fn))


# -- bad input: errors before data moves, output untouched ---------------------------------


def test_bad_collective_arguments_leave_output_untouched():
    def fn(rank):
        n = dist.get_world_size()
        f, i = data(rank), data(rank, dtype=np.int32)
        cases = [
            (TypeError, lambda: dist.all_reduce(f, op=dist.ReduceOp.BAND)),       # op vs dtype
            (TypeError, lambda: dist.all_reduce(i, op=dist.ReduceOp.AVG)),
            (ValueError, lambda: dist.broadcast(f, src=n)),                         # root range
            (ValueError, lambda: dist.reduce(f, dst=-1)),
            (ValueError, lambda: dist.all_reduce(np.zeros((4, 4))[:, 0])),          # strided
            (ValueError, lambda: dist.all_gather_into_tensor(np.zeros(5), f)),      # sizes
            (ValueError, lambda: dist.reduce_scatter_tensor(np.zeros(2), f)),
            (ValueError, lambda: dist.all_gather([np.zeros(7)], f)),                # list length
            (ValueError, lambda: dist.all_to_all([f], [f, f, f])),
            (TypeError, lambda: dist.all_gather([np.zeros(7, np.int32)] * n, f)),   # dtypes
            (TypeError, lambda: dist.all_reduce([1.0, 2.0])),                        # not an array
            (ValueError, lambda: dist.all_to_all_single(np.zeros(6), np.zeros(6), [1, 1, 1])),
            (ValueError, lambda: dist.all_to_all_single(np.zeros(7), np.zeros(7))),
        ]
        for index, (kind, call) in enumerate(cases):
            with pytest.raises(kind):
                call()
                pytest.fail(f"case {index} raised nothing")
        ro = data(rank)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            dist.all_reduce(ro)
        np.testing.assert_array_equal(f, data(rank))
        np.testing.assert_array_equal(i, data(rank, dtype=np.int32))
        dist.all_reduce(f)      # the failed calls took no tags: this still matches up
        return f
    for f in spawn(2, fn):
        np.testing.assert_array_equal(f, data(0) + data(1))


def test_rooted_list_rules():
    def fn(rank):
        t = data(rank, 3)
        if rank == 0:        # only the root checks its list, so only it makes the bad calls
            with pytest.raises(ValueError, match="gather_list"):
                dist.gather(t, [np.zeros(3)], dst=0)
            with pytest.raises(ValueError, match="gather_list"):
                dist.gather(t, None, dst=0)
            with pytest.raises(ValueError, match="must match"):
                dist.gather(t, [np.zeros(3), np.zeros(4)], dst=0)
            with pytest.raises(ValueError, match="scatter_list"):
                dist.scatter(t, [t], src=0)
        else:
            with pytest.raises(ValueError, match="must not be given"):
                dist.gather(t, [np.zeros(3), np.zeros(3)], dst=0)
            with pytest.raises(ValueError, match="must not be given"):
                dist.scatter(t, [t, t], src=0)
        np.testing.assert_array_equal(t, data(rank, 3))
        dist.barrier()
        return True
    assert all(spawn(2, fn))


def test_mismatched_all_to_all_sizes_fail_on_every_rank_before_data_moves():
    def fn(rank):
        outs = [np.full(2, -1.0), np.full(1 + rank, -1.0)]      # rank 1 expects 2, gets 1
        with pytest.raises(ValueError, match="expects"):
            dist.all_to_all(outs, [np.ones(1), np.ones(1)])
        assert all((o == -1).all() for o in outs)
        return True
    assert all(spawn(2, fn))


def test_backend_choice(monkeypatch):
    for name in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                 "HYDI_CONTROL_FD", "MPI_LOCALRANKID", "MV2_COMM_WORLD_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert dist._backend_name(None, None, None) == "socket"
    monkeypatch.setenv("PMI_RANK", "0")
    assert dist._backend_name(None, None, None) == "mpi"
    assert dist._backend_name(None, "tcp://127.0.0.1:1234", None) == "socket"   # explicit rendezvous
    assert dist._backend_name("cpu:gloo,cuda:nccl", None, None) == "gloo"
    assert dist._backend_name("NCCL", None, None) == "nccl"


def test_p2p_work_timeout_then_completion_and_subgroup_any_source():
    def fn(rank):
        sub = dist.new_group([1, 2, 3])
        if rank == 0:
            buf = np.zeros(2)
            work = dist.irecv(buf, src=1, tag=3)
            with pytest.raises(CollectiveTimeout):
                work.wait(timeout=0.05)                  # nothing sent yet: still pending
            assert not work.is_completed()
            dist.barrier()
            assert work.wait() and buf[0] == 5.0 and work.get_future().wait() == [buf]
            return None
        if rank == 1:
            dist.barrier()
            dist.send(np.full(2, 5.0), dst=0, tag=3)
            got = set()
            for _ in range(2):
                b = np.zeros(1)
                got.add((dist.recv(b, group=sub), b[0]))    # any source, within the subgroup
            dist.destroy_process_group(sub)
            return got
        dist.barrier()
        dist.send(np.array([float(rank)]), dst=1, group=sub)
        return None
    assert spawn(4, fn)[1] == {(2, 2.0), (3, 3.0)}


def test_a_per_call_timeout_bounds_one_collective():
    """``timeout=`` on a call overrides the group's (here 60 s) for that call only."""
    import time

    def body(rank):
        x = np.ones(4, np.float32)
        if rank == 1:
            time.sleep(0.01)
            return None                     # rank 1 never joins the all_reduce
        started = time.monotonic()
        with pytest.raises(dist.CollectiveTimeout) as info:
            dist.all_reduce(x, timeout=0.3, algorithm="ring")
        return time.monotonic() - started, str(info.value)

    waited, message = dist.spawn_local(2, body)[0]
    assert waited < 5, waited
    assert "all_reduce" in message and "rank 0" in message
