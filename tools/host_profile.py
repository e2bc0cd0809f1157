"""Where the host time of one collective call goes on a GPU group: ``group.prepare(...)()``
as the bench and the facade call it, timed without and then with cProfile on rank 0 (every
rank makes the same calls). Run on the GPUs of one host:

    mpiexec -n 2 python tools/host_profile.py [--collective all_reduce] [--algorithm direct]

With COLLECTIVES_PEER_LANE=0 every call takes the Python path (the compiled repeat path's
before/after in one device call).
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collectives.bench.nccl import nccl_group  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--collective", default="all_reduce")
    ap.add_argument("--algorithm", default="direct")
    ap.add_argument("--count", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=4000)
    args = ap.parse_args()
    group, cupy = nccl_group(timeout=120)
    host = group.bench_host
    n_in = n_out = args.count
    if args.collective in ("reduce_scatter", "all_to_all"):
        n_in *= group.size
    if args.collective in ("all_gather", "all_to_all"):
        n_out *= group.size
    d_in, d_out = cupy.ones(n_in, np.float32), cupy.zeros(n_out, np.float32)

    def calls(n):
        for _ in range(n):
            group.prepare(args.collective, input=d_in, output=d_out, algorithm=args.algorithm)()

    calls(200)
    group.transport.synchronize(30)
    host.barrier()
    start = time.perf_counter()
    calls(args.calls)
    issued = (time.perf_counter() - start) / args.calls
    group.transport.synchronize(30)
    # the floor under it: an empty kernel launched from a Python loop through the driver
    # (what every call pays whatever the path), and through CuPy's generic launch
    from cupy.cuda import driver
    empty = cupy.RawKernel('extern "C" __global__ void empty() {}', "empty")
    empty((1,), (32,), ())
    function, stream = empty.kernel.ptr, cupy.cuda.get_current_stream().ptr
    floors = {}
    for name, launch in (("the driver's cuLaunchKernel", lambda: driver.launchKernel(
            function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)),
                         ("CuPy's RawKernel call", lambda: empty((1,), (32,), ()))):
        for _ in range(200):
            launch()
        start = time.perf_counter()
        for _ in range(args.calls):
            launch()
        floors[name] = (time.perf_counter() - start) / args.calls
        group.transport.synchronize(30)
    # as the bench times it: CUDA events around a batch of back-to-back calls after a
    # barrier, beside the host's own time for the same batch (what the GPU waits on)
    from collectives.bench.timing import CudaEvents
    clock = CudaEvents(cupy)
    batches = {}
    for n in (50, 500):
        rows = []
        for _ in range(7):
            group.transport.synchronize(30)
            host.barrier()
            start = time.perf_counter()
            event = clock.batch(lambda: calls(1), n)
            rows.append((event, (time.perf_counter() - start) / n))
        rows.sort()
        batches[n] = rows[len(rows) // 2]
    host.barrier()
    profile = cProfile.Profile()
    if group.rank == 0:
        profile.enable()
    calls(args.calls)
    profile.disable()
    group.transport.synchronize(30)
    if group.rank == 0:
        lane = group._lane
        path = "the Python path (no compiled repeat path: not built, or COLLECTIVES_PEER_LANE=0)" \
            if lane is None else f"the compiled repeat path launched {lane.launched} calls"
        print(f"{args.collective} {args.algorithm} {args.count} elements: {issued * 1e6:.1f} µs "
              f"of host time per call (issued without waiting); {path}", flush=True)
        for name, took in floors.items():
            print(f"  floor: an empty kernel launched from Python through {name}: "
                  f"{took * 1e6:.1f} µs per launch")
        for n, (event, wall) in batches.items():
            print(f"  batches of {n} after a barrier (as the bench): {event * 1e6:.1f} µs per "
                  f"call by CUDA events, {wall * 1e6:.1f} µs by the host clock (p50 of 7)")
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    host.barrier()


if __name__ == "__main__":
    sys.exit(main())
