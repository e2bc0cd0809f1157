"""Pipelined NCCL plans at full size, checked element by element on every rank.

    mpiexec -n 4 python tools/nccl_pipeline_check.py [CASE ...]

CASE is collective:algorithm:bytes:segment_bytes[:flag...], e.g. all_reduce:tree:256M:64M
(segment 0 = in order, "default" = the executor's own choice); flags: inplace, stream (run
on a non-blocking stream, as bench.py does), pattern (bench.py's inputs instead of random
integers). Each rank prints how many
elements differ from the exact host reference and where (first, last, and which
segment-sized pieces hold them). The GPU suite (tests/gpu) checks the pipelined path with tiny
segments; this runs the sizes the benchmark uses. The "default" cases come first: a fault in
the executor's default segment size shows only where the size is left to it, as bench.py
leaves it.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "gpu"))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from collectives.bench import Case, parse_size  # noqa: E402
from collectives.executors import nccl as nccl_executor  # noqa: E402
from collectives.group import ProcessGroup  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402
from collectives.transports import nccl as nccl_transport  # noqa: E402
from nccl_worker import case_inputs, expected  # noqa: E402

DEFAULT = ["all_reduce:tree:256M:default", "reduce_scatter:tree:256M:default",
           "all_reduce:tree:256M:64M", "all_reduce:tree:256M:0",
           "all_reduce:tree:256M:64M:inplace", "all_reduce:tree:64M:16M",
           "all_reduce:tree:4M:1M", "all_reduce:recursive_doubling:256M:32M",
           "reduce_scatter:tree:256M:64M", "reduce_scatter:tree:64M:16M"]


def check(group, cupy, collective, algorithm, nbytes, segment, flags, seed):
    p, rank = group.size, group.rank
    dtype = np.dtype(np.float32)
    in_place = "inplace" in flags
    count = nbytes // dtype.itemsize
    op = ReduceOp.SUM
    if "pattern" in flags:               # bench.py's inputs (Case) instead of random ones
        case = Case(collective, rank, p, count, dtype, op)
        want, counts = case.expected, None
        d_in = cupy.asarray(case.input)
    else:
        if collective != "all_reduce":
            count //= p                  # bytes name the whole input, as bench's sizes do
        inputs, counts = case_inputs(seed, collective, p, count, dtype, op, 0)
        want = expected(collective, inputs, rank, 0, op, dtype, counts)
        d_in = cupy.asarray(inputs[rank])
    if segment is None:
        os.environ.pop(nccl_executor.ENV_SEGMENT, None)      # the executor's default
    else:
        os.environ[nccl_executor.ENV_SEGMENT] = str(segment)
    if collective == "all_reduce":
        out = d_in if in_place else cupy.full(count, 99, dtype)
        call = group.prepare(collective, input=None if in_place else d_in, output=out,
                             op=op, algorithm=algorithm)
    else:
        out = cupy.full(want.size, 99, dtype)
        call = group.prepare(collective, input=d_in, output=out, op=op, algorithm=algorithm,
                             **({"counts": counts} if counts else {}))
    call()
    group.transport.synchronize(60.0, operation=collective)
    got = cupy.asnumpy(out)
    bad = np.flatnonzero(got != want)
    text = f"rank {rank}: {len(bad)} of {want.size} wrong"
    if len(bad):
        piece = max(1, (segment or nccl_executor.DEFAULT_SEGMENT_BYTES) // dtype.itemsize) \
            if segment != 0 else want.size
        pieces = sorted(set((bad // piece).tolist()))
        text += (f"; first {bad[0]} (got {got[bad[0]]} want {want[bad[0]]}), last {bad[-1]}; "
                 f"pieces of {piece} elements: {pieces[:12]}; sample got/want "
                 f"{got[bad[len(bad) // 2]]}/{want[bad[len(bad) // 2]]}")
    return text


def main():
    from mpi4py import MPI
    import cupy
    world = MPI.COMM_WORLD
    transport = nccl_transport.create(rank=world.Get_rank(), world_size=world.Get_size(),
                                      timeout=120.0)
    group = ProcessGroup(transport, backend="nccl", timeout=120.0)
    for seed, case in enumerate(sys.argv[1:] or DEFAULT):
        parts = case.split(":")
        collective, algorithm, size, segment = parts[:4]
        flags = set(parts[4:])
        stream = cupy.cuda.Stream(non_blocking=True) if "stream" in flags else \
            cupy.cuda.Stream.null
        with stream:
            text = check(group, cupy, collective, algorithm, parse_size(size),
                         None if segment == "default" else parse_size(segment), flags,
                         seed + 1)
        lines = world.gather(text, root=0)
        if world.Get_rank() == 0:
            print(f"== {case}", flush=True)
            for line in lines:
                print("   " + line, flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    transport.close()


if __name__ == "__main__":
    main()
