"""The NCCL executor's stream ordering, checked on the CPU with a fake CuPy/NCCL.

``nccl_fake`` queues every transfer, copy and kernel on its stream and runs the queues of all
ranks in random orders that respect only stream order, events and NCCL matching, so a missing
cross-stream dependency in the pipelined mode gives wrong data under some seed. Every
collective x algorithm at 2, 3 and 4 ranks, uneven counts, unsegmented and pipelined with
tiny segments (several pieces per message), against the numpy reference; plus the transport's
batched isend/irecv and barrier paths. No GPU is needed; the real thing is tests/gpu.
"""
import sys

import numpy as np
import pytest

from collectives.algorithms import capabilities
from collectives.algorithms.schedule import buffer_sizes, build_plan, plan_args, Matrix
from collectives.algorithms.simulate import reference
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp

from nccl_fake import World

SEEDS = 3
CASES = [(c, a) for c, algs in capabilities().items() if c != "barrier" for a in algs]


def _counts(collective, size, count, rng):
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count
    if collective == "all_to_all":
        return Matrix(tuple(int(x) for x in rng.integers(count // 2, count + 1, size))
                      for _ in range(size))
    return tuple(count + (i % 2) for i in range(size))


def _run(collective, algorithm, size, count, segment_bytes, seed, monkeypatch):
    world = World(size)
    monkeypatch.setitem(sys.modules, "cupy", world.modules()["cupy"])
    monkeypatch.setitem(sys.modules, "cupy.cuda", world.modules()["cupy.cuda"])
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", world.modules()["cupy.cuda.nccl"])
    from collectives.executors import nccl as executor
    from collectives.transports.nccl import NcclTransport
    from nccl_fake import Comm

    rng = np.random.default_rng(seed)
    dtype = np.dtype(np.int64)
    root = seed % size
    counts = _counts(collective, size, count, rng)
    host_reduce = reducer(ReduceOp.SUM, dtype)

    def kernel(dst, a, b):           # a CUDA kernel: runs when its stream gets there
        world.launch(lambda: host_reduce(dst.np, a.np, b.np))

    arrays, outputs = [], []
    for rank in range(size):
        n_in, n_out = buffer_sizes(collective, rank, size, counts, root)
        if collective in ("all_reduce", "broadcast", "reduce"):
            n_in = counts
        arrays.append(rng.integers(-1000, 1000, n_in).astype(dtype))
    for rank in range(size):
        with world.on(rank):
            transport = NcclTransport(Comm(world, rank), rank, size, rank)
            plan = build_plan(collective, algorithm, rank, size,
                              *plan_args(collective, size, counts, root))
            n_in, n_out = buffer_sizes(collective, rank, size, counts, root)
            if collective in ("all_reduce", "broadcast"):
                inp, out = None, world.asarray(arrays[rank])
            else:
                inp = world.asarray(arrays[rank] if not (collective == "scatter" and rank != root)
                                    else np.empty(0, dtype))
                out = world.asarray(np.full(n_out, -7, dtype))
            outputs.append(out)
            executor.execute(plan, transport, {"input": inp, "output": out}, kernel,
                             dtype=dtype, segment=segment_bytes)
    world.drain(seed)
    want = reference(collective, arrays, root=root, counts=counts)
    for rank in range(size):
        if want[rank] is None:
            continue
        got = outputs[rank].np
        assert np.array_equal(got, want[rank]), (
            f"{collective} ({algorithm}) size {size} count {count} segment {segment_bytes} "
            f"seed {seed}: rank {rank} differs at "
            f"{np.flatnonzero(got != want[rank])[:5]}")


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_pipelined_matches_reference(collective, algorithm, monkeypatch):
    # 8-byte elements, 48-byte segments: messages of ~10-40 elements cut into 2-7 pieces
    for size in (2, 3, 4):
        for seed in range(SEEDS):
            _run(collective, algorithm, size, 37, 48, seed, monkeypatch)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_default_segmentation_cuts_every_ranks_messages_alike(collective, algorithm,
                                                               monkeypatch):
    """No segment size given: each rank's plan takes the default. A tree all_reduce's leaves
    hold no reduction while their parents do; deciding per plan, leaves sent whole messages
    into pieces (wrong data at 256 MiB on 4 GPUs). A 48-byte default stands in for 64 MiB."""
    from collectives.executors import nccl as executor
    monkeypatch.delenv(executor.ENV_SEGMENT, raising=False)
    monkeypatch.setattr(executor, "DEFAULT_SEGMENT_BYTES", 48)
    for size in (3, 4):
        _run(collective, algorithm, size, 37, None, size, monkeypatch)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_in_order_matches_reference(collective, algorithm, monkeypatch):
    for size in (2, 4):
        _run(collective, algorithm, size, 37, 0, size, monkeypatch)


def _install(world, monkeypatch):
    for name, module in world.modules().items():
        monkeypatch.setitem(sys.modules, name, module)


def _transports(world, size):
    from collectives.transports.nccl import NcclTransport
    from nccl_fake import Comm
    out = []
    for rank in range(size):
        with world.on(rank):
            out.append(NcclTransport(Comm(world, rank), rank, size, rank))
    return out


@pytest.mark.parametrize("algorithm", capabilities()["all_reduce"])
def test_graph_replay_then_close(algorithm, monkeypatch):
    """COLLECTIVES_NCCL_GRAPH=1 on a non-default stream: eager, captured, replayed; right
    each time; then close() must destroy the graphs before the communicator (the fake comm,
    like NCCL >= 2.26, refuses to go while a graph holds it: the 4-GPU hang at close)."""
    from collectives.executors import nccl as executor
    size, count = 3, 41
    world = World(size)
    _install(world, monkeypatch)
    monkeypatch.setenv(executor.ENV_GRAPH, "1")
    transports = _transports(world, size)
    host_reduce = reducer(ReduceOp.SUM, np.dtype(np.int64))

    def kernel(dst, a, b):
        world.launch(lambda: host_reduce(dst.np, a.np, b.np))

    rng = np.random.default_rng(1)
    streams, outs = [], []
    for rank in range(size):
        with world.on(rank):
            streams.append(sys.modules["cupy"].cuda.Stream(non_blocking=True))
            outs.append(world.asarray(np.zeros(count, np.int64)))
    for call in range(4):
        data = [rng.integers(-50, 50, count) for _ in range(size)]
        for rank in range(size):
            with world.on(rank), streams[rank]:
                outs[rank].np[...] = data[rank]        # host-side: the stream is idle here
                plan = build_plan("all_reduce", algorithm, rank, size, count)
                executor.execute(plan, transports[rank], {"output": outs[rank]}, kernel,
                                 dtype=np.int64)
        world.drain(call)
        for rank in range(size):
            assert np.array_equal(outs[rank].np, sum(data)), (algorithm, call, rank)
    assert all(len([e for e in executor.graph_cache(t).entries.values() if e[0] is not None])
               == 1 for t in transports)
    for rank in range(size):
        with world.on(rank):
            with pytest.raises(RuntimeError, match="live graphs"):
                transports[rank].comm.destroy()     # what close() did before the fix
            transports[rank].close()
            assert transports[rank].comm is None
            assert world.live_graphs(rank) == 0


def test_isend_irecv_batched_and_barrier(monkeypatch):
    """isend/irecv issue together at the first wait (one group per rank); the native barrier
    is an all_reduce the fake does not model, so the schedule barriers run instead."""
    size = 4
    world = World(size)
    _install(world, monkeypatch)
    transports = _transports(world, size)
    outs, reqs = [], []
    for rank in range(size):
        with world.on(rank):
            t = transports[rank]
            out = world.asarray(np.zeros(5, np.float32))
            outs.append(out)
            reqs.append([t.isend(world.asarray(np.full(5, rank, np.float32)), (rank + 1) % size),
                         t.irecv(out, (rank - 1) % size)])
            t.flush()
    world.drain(0)
    for rank in range(size):
        assert (outs[rank].np == (rank - 1) % size).all()
    from collectives.executors import nccl as executor
    for algorithm in capabilities()["barrier"]:
        for rank in range(size):
            with world.on(rank):
                plan = build_plan("barrier", algorithm, rank, size)
                scratch = world.asarray(np.zeros(plan.scratch, np.uint8))
                executor.execute(plan, transports[rank], {"scratch": scratch}, None)
        world.drain(1)
    for rank in range(size):
        with world.on(rank):
            transports[rank].close()


def test_point_to_point_chunk_size_is_set_before_nccl_starts(monkeypatch):
    """create() shrinks NCCL's NVLink p2p chunk (measured 2x the bandwidth at 64 MiB) unless
    the user chose one; 0 leaves NCCL's default; a bad value is a clear error."""
    from collectives.transports import nccl as transport
    monkeypatch.delenv("NCCL_P2P_NVL_CHUNKSIZE", raising=False)
    monkeypatch.delenv("COLLECTIVES_NCCL_P2P_CHUNKSIZE", raising=False)
    transport._tune_point_to_point()
    assert transport.os.environ["NCCL_P2P_NVL_CHUNKSIZE"] == "65536"
    monkeypatch.setenv("NCCL_P2P_NVL_CHUNKSIZE", "1048576")
    transport._tune_point_to_point()
    assert transport.os.environ["NCCL_P2P_NVL_CHUNKSIZE"] == "1048576"
    monkeypatch.delenv("NCCL_P2P_NVL_CHUNKSIZE")
    monkeypatch.setenv("COLLECTIVES_NCCL_P2P_CHUNKSIZE", "0")
    transport._tune_point_to_point()
    assert "NCCL_P2P_NVL_CHUNKSIZE" not in transport.os.environ
    monkeypatch.setenv("COLLECTIVES_NCCL_P2P_CHUNKSIZE", "128k")     # a byte size, as all
    transport._tune_point_to_point()
    assert transport.os.environ["NCCL_P2P_NVL_CHUNKSIZE"] == str(128 << 10)
    monkeypatch.delenv("NCCL_P2P_NVL_CHUNKSIZE")
    monkeypatch.setenv("COLLECTIVES_NCCL_P2P_CHUNKSIZE", "64 kilo")
    with pytest.raises(ValueError, match="COLLECTIVES_NCCL_P2P_CHUNKSIZE='64 kilo'"):
        transport._tune_point_to_point()


def test_default_segments_only_for_plans_that_reduce(monkeypatch):
    """Without $COLLECTIVES_NCCL_SEGMENT_BYTES, plans that reduce are pipelined in 64 MiB
    segments (measured faster at 1 GiB) and pure data movement stays whole; the variable
    applies to every plan; a bad value is a clear error."""
    from collectives.executors import nccl as executor
    monkeypatch.delenv(executor.ENV_SEGMENT, raising=False)
    reducing = build_plan("all_reduce", "ring", 0, 4, *plan_args("all_reduce", 4, 1 << 20))
    moving = build_plan("all_gather", "ring", 0, 4, *plan_args("all_gather", 4, (1 << 18,) * 4))
    assert executor.segment_bytes(reducing) == executor.DEFAULT_SEGMENT_BYTES == 64 << 20
    assert executor.segment_bytes(moving) == 0
    leaf = build_plan("all_reduce", "tree", 3, 4, *plan_args("all_reduce", 4, 1 << 20))
    assert not any(step.local for step in leaf.steps)      # no reduction on this rank...
    assert executor.segment_bytes(leaf) == executor.DEFAULT_SEGMENT_BYTES   # ...cut alike
    monkeypatch.setenv(executor.ENV_SEGMENT, "1 meg")
    with pytest.raises(ValueError, match="COLLECTIVES_NCCL_SEGMENT_BYTES='1 meg'"):
        executor.segment_bytes(moving)
    monkeypatch.setenv(executor.ENV_SEGMENT, "-1")
    with pytest.raises(ValueError, match="COLLECTIVES_NCCL_SEGMENT_BYTES='-1'"):
        executor.segment_bytes(moving)
    monkeypatch.setenv(executor.ENV_SEGMENT, "1M")
    assert executor.segment_bytes(moving) == 1 << 20
    monkeypatch.setenv(executor.ENV_SEGMENT, str(1 << 20))
    assert executor.segment_bytes(moving) == executor.segment_bytes(reducing) == 1 << 20
