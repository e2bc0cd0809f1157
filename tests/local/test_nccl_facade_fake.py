"""The facade on the nccl backend, on the CPU: ranks are threads of this process, each with a
thread-local default group over an NcclTransport on the fake CuPy/NCCL of ``nccl_fake``
(streams as queues, run in orders CUDA and NCCL allow). What runs is the facade's own code:
point-to-point on CuPy arrays (send, recv, isend, irecv, batch_isend_irecv), the object
collectives, and what init_process_group("nccl") installs against an uncaught exception.
The real thing on GPUs is tests/gpu/test_nccl_usability.py.
"""
import sys
import threading

import numpy as np
import pytest

import collectives as dist
from collectives import state
from collectives.store import HashStore

from nccl_fake import Comm, FakeArray, ThreadedWorld

# NCCL's own collectives are not modelled by the fake: the schedules run instead.
SCHEDULES = "broadcast=ring,all_gather=ring,gather=tree,scatter=tree,all_reduce=ring"


@pytest.fixture
def world(monkeypatch):
    def make(size):
        fake = ThreadedWorld(size)
        for name, module in fake.modules().items():
            monkeypatch.setitem(sys.modules, name, module)
        monkeypatch.setenv("COLLECTIVES_ALGORITHM", SCHEDULES)
        return fake
    return make


def run_ranks(fake, fn, timeout=20.0):
    """``fn(rank)`` on one thread per rank, each inside its own nccl world; returns the
    results by rank, re-raising the first rank's error."""
    from collectives.group import ProcessGroup
    from collectives.transports.nccl import NcclTransport
    results, errors = {}, {}

    def one(rank):
        with fake.on(rank):
            transport = NcclTransport(Comm(fake, rank), rank, fake.size, rank, timeout)
            pg = ProcessGroup(transport, backend="nccl", timeout=timeout)
            world = state.World("nccl", transport, pg, thread_local=True, timeout=timeout)
            state.install(world)
            try:
                results[rank] = fn(rank)
            except BaseException as exc:       # noqa: BLE001  (reported below)
                errors[rank] = exc
            finally:
                state.uninstall(world)
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(fake.size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    for rank in sorted(errors):
        raise AssertionError(f"rank {rank} failed: {errors[rank]!r}") from errors[rank]
    return [results[r] for r in range(fake.size)]


def device(fake, values, dtype=np.float32):
    return fake.asarray(np.asarray(values, dtype))


# -- point-to-point on CuPy arrays ---------------------------------------------------------


def test_send_and_recv_on_cupy_arrays(world):
    # before: recv raised AttributeError: CuPy's flags have no 'writeable'
    fake = world(2)

    def body(rank):
        if rank == 0:
            dist.send(device(fake, [1, 2, 3]), dst=1)
            return None
        out = device(fake, [0, 0, 0])
        source = dist.recv(out, src=0)
        return source, fake.asnumpy(out).tolist()
    assert run_ranks(fake, body)[1] == (0, [1.0, 2.0, 3.0])


def test_isend_irecv_on_cupy_arrays(world):
    fake = world(2)

    def body(rank):
        out = device(fake, [0, 0])
        peer = 1 - rank
        works = [dist.irecv(out, src=peer), dist.isend(device(fake, [rank, rank + 10]), dst=peer)]
        for work in works:
            work.wait()
        return works[0].source_rank, fake.asnumpy(out).tolist()
    assert run_ranks(fake, body) == [(1, [1.0, 11.0]), (0, [0.0, 10.0])]


def test_batch_isend_irecv_ring_on_cupy_arrays(world):
    fake = world(3)

    def body(rank):
        size = 3
        out = device(fake, [-1] * 4)
        ops = [dist.P2POp(dist.isend, device(fake, [rank] * 4), (rank + 1) % size),
               dist.P2POp(dist.irecv, out, (rank - 1) % size)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return fake.asnumpy(out).tolist()
    assert run_ranks(fake, body) == [[float((r - 1) % 3)] * 4 for r in range(3)]


# -- object collectives ------------------------------------------------------------------


def test_object_collectives_on_nccl(world):
    # before: the bytes went as numpy arrays, which the nccl transport refuses
    fake = world(3)

    def body(rank):
        got = [None] * 3
        dist.all_gather_object(got, {"rank": rank, "pad": "x" * (rank * 50)})
        listed = [{"from": 1}, (1, 2), "three"] if rank == 1 else [None] * 3
        dist.broadcast_object_list(listed, src=1)
        gathered = [None] * 3 if rank == 2 else None
        dist.gather_object(("g", rank), gathered, dst=2)
        scattered = [None]
        dist.scatter_object_list(scattered, [f"to {r}" * (r + 1) for r in range(3)]
                                 if rank == 0 else None, src=0)
        return got, listed, gathered, scattered[0]
    results = run_ranks(fake, body)
    for rank, (got, listed, gathered, scattered) in enumerate(results):
        assert got == [{"rank": r, "pad": "x" * (r * 50)} for r in range(3)]
        assert listed == [{"from": 1}, (1, 2), "three"]
        assert gathered == ([("g", r) for r in range(3)] if rank == 2 else None)
        assert scattered == f"to {rank}" * (rank + 1)


# -- an uncaught exception aborts the communicator -----------------------------------------


@pytest.fixture
def one_rank_nccl(world, monkeypatch):
    """init_process_group("nccl") for a world of one, on the fake; no MPI job to abort."""
    fake = world(1)
    from collectives import transports
    from collectives.transports.nccl import NcclTransport
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)     # never MPI_Abort here
    made = []

    def create(backend, *, rank, world_size, store=None, timeout=1800.0):
        made.append(NcclTransport(Comm(fake, rank), rank, world_size, rank, timeout))
        return made[0]
    monkeypatch.setattr(transports, "create", create)
    hook = sys.excepthook
    dist.init_process_group("nccl", store=HashStore(), rank=0, world_size=1)
    made[0].hook_before_init = hook
    yield made[0]
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.excepthook = hook


def test_an_uncaught_exception_on_nccl_aborts_the_communicator(one_rank_nccl, capsys):
    transport = one_rank_nccl
    comm = transport.comm
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)       # what Python does at the top
    assert comm.destroyed and transport.aborted                 # ncclCommAbort ran
    err = capsys.readouterr().err
    assert "RuntimeError: boom" in err
    assert "rank 0 of 1 raised an uncaught RuntimeError; aborting its NCCL communicator" in err


def test_a_failing_exit_on_nccl_aborts_the_communicator(one_rank_nccl, monkeypatch):
    transport = one_rank_nccl
    monkeypatch.setattr(state, "exit_status", lambda: (0, None))
    dist._abort_nccl_if_failing()
    assert not transport.aborted                 # a clean exit keeps the usual teardown
    monkeypatch.setattr(state, "exit_status", lambda: (3, None))
    dist._abort_nccl_if_failing()                 # the atexit hook, after sys.exit(3)
    assert transport.aborted and transport.comm.destroyed


def test_destroy_process_group_puts_the_hook_back(one_rank_nccl):
    assert sys.excepthook is not one_rank_nccl.hook_before_init
    dist.destroy_process_group()
    assert sys.excepthook is one_rank_nccl.hook_before_init
    assert dist._nccl_at_exit == []


def test_fake_arrays_look_like_cupys():
    # the facade sees what CuPy shows: no 'writeable' flag, flat reshape
    array = FakeArray(np.zeros(3, np.float32), 4096)
    assert array.flags.c_contiguous and not hasattr(array.flags, "writeable")
    assert array.reshape(-1) is array and array.shape == (3,)


def test_symmetric_memory_needs_the_peer_path(world):
    """A group without peer memory (here: no CUDA IPC in the fake) refuses symmetric_empty
    naming the call and the rank, before anything is allocated."""
    def body(rank):
        with pytest.raises(dist.CollectiveError, match=f"symmetric_empty on rank {rank}: this "
                                                       f"group has no peer memory"):
            state.current().default.symmetric_empty(16)
        for operation in ("register_buffer", "deregister_buffer"):
            with pytest.raises(dist.CollectiveError, match=f"{operation} on rank {rank}: this "
                                                           f"group has no peer memory"):
                getattr(state.current().default, operation)(np.zeros(4, np.float32))
        return True
    assert run_ranks(world(2), body) == [True, True]


# -- async collectives on GPU arrays --------------------------------------------------------


def test_async_collectives_are_enqueued_from_the_callers_thread(world):
    """async_op=True on a GPU transport enqueues the collective at the call, on the caller's
    stream, from the caller's thread (a worker thread lacks the device's context: the real
    launch failed there with CUDA_ERROR_INVALID_CONTEXT); wait() orders the caller's stream
    after it, and the host never blocks."""
    from collectives import work as work_module
    fake = world(2)

    def body(rank):
        x = device(fake, [rank + 1.0] * 4)
        out = device(fake, [0.0] * 8)
        gathered = dist.all_gather_into_tensor(out, x, async_op=True)
        broadcast = dist.broadcast(x, src=1, async_op=True)
        assert gathered.wait() and broadcast.wait()
        assert state.world().default not in work_module._workers   # no worker thread ran them
        value = fake.asnumpy(x)                                 # the stream ran up to here
        assert gathered.is_completed() and broadcast.is_completed()
        return value.tolist(), fake.asnumpy(out).tolist()

    for value, gathered in run_ranks(fake, body):
        assert value == [2.0] * 4 and gathered == [1.0] * 4 + [2.0] * 4
