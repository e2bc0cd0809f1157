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
def test_in_order_matches_reference(collective, algorithm, monkeypatch):
    for size in (2, 4):
        _run(collective, algorithm, size, 37, 0, size, monkeypatch)
