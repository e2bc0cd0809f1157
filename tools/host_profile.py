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
    ap.add_argument("--parts", action="store_true",
                    help="also split a call's host time: the repeat path with a launch that "
                         "does nothing, the driver's launch alone from compiled code, and "
                         "what the path asks of CuPy (needs a C compiler)")
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
    if args.parts:
        parts(group, cupy, args, calls, function, stream, d_in, d_out)
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


HELPER = r"""
typedef int (*launch_t)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);
int nothing(void* f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e, unsigned g,
            unsigned s, void* stream, void** params, void** extra) { return 0; }
int launches(void* launch, void* f, int n, void* stream) {
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc = ((launch_t)launch)(f, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0);
    return rc;
}
"""


def parts(group, cupy, args, calls, empty_function, stream_ptr, d_in, d_out):
    """Where the repeat path's host time goes (rank 0 prints; every rank makes the same
    calls): the whole path with a launch that does nothing (ours alone), the driver's launch
    of an empty kernel from compiled code (the driver alone), and the CuPy look-ups the
    path makes, each per call."""
    import ctypes
    import subprocess
    import tempfile
    from collectives.executors import peer as peer_executor
    from collectives.executors._peer_lane import Lane
    from collectives import settings
    from collectives.kernels import cuda_peer
    from collectives.ops import ReduceOp
    folder = tempfile.mkdtemp()
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-x", "c", "-o", f"{folder}/h.so", "-"],
                   input=HELPER.encode(), check=True)
    helper = ctypes.CDLL(f"{folder}/h.so")
    nothing = ctypes.cast(helper.nothing, ctypes.c_void_p).value
    real = group._lane
    n = args.calls
    took = {}

    def per_call(name, run):
        group.transport.synchronize(30)
        group.bench_host.barrier()
        start = time.perf_counter()
        run()
        took[name] = (time.perf_counter() - start) / n * 1e6

    executor = group.executor.peer
    group._lane = Lane(group, executor, nothing, cuda_peer.THREADS,
                       cupy.cuda.get_current_stream, peer_executor._Elsewhere)
    for key, shape in group._repeats.items():      # the shapes the real lane was given
        group._lane.remember(key, shape)
    launched = group._lane.launched
    per_call("the repeat path, its launch doing nothing", lambda: calls(n))
    assert group._lane.launched - launched == n, "the no-op lane did not take every call"
    # its two halves: prepare (group.prepare, then the lane's), then run() (the _Call)
    kw = dict(input=d_in, output=d_out, algorithm=args.algorithm)
    runs = []
    per_call("  group.prepare(...) alone (the lane's prepare in it)",
             lambda: runs.extend(group.prepare(args.collective, **kw) for _ in range(n)))
    per_call("  run() alone (the lane's _Call, its launch doing nothing)",
             lambda: [run() for run in runs])
    lane = group._lane
    op = ReduceOp.SUM

    def lane_prepare():
        for _ in range(n):
            lane.prepare(group, args.collective, d_in, d_out, None, 0, op, args.algorithm, None)
    per_call("  the lane's prepare alone", lane_prepare)
    key = (args.collective, 0, op, args.algorithm, None, group.timeout,
           (d_in.dtype, d_in.size), (d_out.dtype, d_out.size))
    table = {key: 1}
    for name, look in (("settings.DEBUG()", settings.DEBUG),
                       ("the call's key built and looked up (the lane does it only when "
                        "a call differs from the previous one)",
                        lambda: table.get((args.collective, 0, op, args.algorithm, None,
                                           group.timeout, (d_in.dtype, d_in.size),
                                           (d_out.dtype, d_out.size)))),
                       ("hash(ReduceOp.SUM)", lambda: hash(op)),
                       ("the group's gate taken and given", lambda: (
                           group._gate.acquire(False), group._gate.release())),
                       ("getattr(array.flags, 'writeable', True) (what the lane asked "
                        "before it read array._c_contiguous)",
                        lambda: getattr(d_out.flags, "writeable", True))):
        def run(look=look):
            for _ in range(n):
                look()
        per_call("    " + name, run)
    group._lane = real
    launch = peer_executor.launch_address()
    helper.launches.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    per_call("the driver's launch of an empty kernel from C",
             lambda: helper.launches(launch, empty_function, n, stream_ptr))
    a = cupy.zeros(args.count, np.float32)
    for name, look in (("cupy.cuda.get_current_stream()", cupy.cuda.get_current_stream),
                       ("array.flags", lambda: a.flags),
                       ("array._c_contiguous", lambda: a._c_contiguous),
                       ("array.data.ptr", lambda: a.data.ptr),
                       ("array.dtype", lambda: a.dtype)):
        def run(look=look):
            for _ in range(n):
                look()
        per_call(name, run)
    if args.collective == "all_reduce":       # the anchor's host time, the same way
        from collectives.bench.cases import Case
        from collectives.bench.symmetric import SymmetricMemory
        symmetric, why = SymmetricMemory.open(group, group.bench_host)
        case = Case("all_reduce", group.rank, group.size, args.count, np.dtype(np.float32), op)
        rows = [] if symmetric is None else symmetric.entries(
            case, d_in, cupy.asarray(case.expected), args.count, np.dtype(np.float32), op,
            group.bench_host)
        for row in rows:
            def run(call=row.call):
                for _ in range(n):
                    call()
            per_call(f"torch {row.algorithm}", run)
        if not rows and group.rank == 0:
            print(f"  (no SymmetricMemory rows: {why})")
    group.transport.synchronize(30)
    if group.rank == 0:
        print("  parts of a call (µs, host clock, issued without waiting):")
        for name, us in took.items():
            print(f"    {name}: {us:.2f}")


if __name__ == "__main__":
    sys.exit(main())
