"""Where a peer-memory call spends its device time: the kernel compiled with TRACE, calls
captured in a CUDA graph and replayed, then per call the kernel's duration and the gap
before the next kernel (global timer), and per instruction of the latest call block 0's
clock cycles, in µs. Beside it, the same graph of an empty kernel (the launch floor) and of
NCCL's own all_reduce.

    mpiexec -n 2 python tools/peer_trace.py [--cases all_reduce:direct:4K,all_reduce:ring:64K]

``--eager``: the calls issued from Python back to back instead (as the bench issues them),
timed with CUDA events over the batch after a barrier: a kernel that runs longer there than in
the graph waits for its peer's host.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collectives.algorithms import pushed  # noqa: E402
from collectives.bench.nccl import nccl_group  # noqa: E402
from collectives.bench.timing import CudaEvents  # noqa: E402
from collectives.kernels import cuda_peer  # noqa: E402
from peer_check import capture, replay_seconds  # noqa: E402  (tools/, beside this file)

NAMES = {pushed.BARRIER: "BARRIER", pushed.EPOCH: "EPOCH", pushed.PUSH: "PUSH",
         pushed.ARRIVE: "ARRIVE", pushed.COPY: "COPY", pushed.REDUCE: "REDUCE",
         pushed.SEND: "SEND", pushed.TAKE: "TAKE", pushed.SEND_LL: "SEND_LL",
         pushed.TAKE_LL: "TAKE_LL", pushed.REDUCE_LL: "REDUCE_LL",
         pushed.TAKE_REDUCE: "TAKE_REDUCE", pushed.REDUCE_N: "REDUCE_N"}
MODULES = {}


def traced_kernel(op, dtype, fences=0):
    """``cuda_peer.program_kernel`` compiled with TRACE; its module kept to read the trace."""
    import cupy
    key = (op, np.dtype(dtype), fences)
    if key not in MODULES:
        MODULES[key] = cupy.RawModule(code=cuda_peer.source(op, dtype, fences, trace=True),
                                      options=("-std=c++14",))
    return MODULES[key].get_function("run_program")


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="all_reduce:direct:4K,all_reduce:ring:4K,"
                    "all_reduce:direct:64K,all_reduce:ring:64K,all_reduce:ring:1M,"
                    "all_to_all:direct:64K,all_reduce:recursive_doubling:256K")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--eager", action="store_true",
                    help="issue the calls from Python back to back instead of a graph replay")
    args = ap.parse_args()
    cuda_peer.program_kernel = traced_kernel          # before the group lowers any plan
    group, cupy = nccl_group(timeout=120)
    host = group.bench_host
    rank, p = group.rank, group.size
    say = print if rank == 0 else (lambda *a, **k: None)
    stream = cupy.cuda.Stream(non_blocking=True)
    clock_khz = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["clockRate"]
    say(f"{p} ranks; SM clock {clock_khz / 1e6:.2f} GHz (per-instruction µs use it)")

    empty = cupy.RawKernel('extern "C" __global__ void empty() {}', "empty")
    with stream:
        g = capture(stream, lambda: empty((1,), (512,), ()), args.iters)
        launch = replay_seconds(cupy, stream, g, args.iters) * 1e6
        say(f"empty kernel, 1 block: {host.max(launch):.2f} µs/launch")
    for case in args.cases.split(","):
        collective, algorithm, size = case.split(":")
        nbytes = size_of(size)
        per = p if collective in ("reduce_scatter", "all_gather", "all_to_all") else 1
        count = max(1, nbytes // 4 // per)
        n_in = count * p if collective in ("reduce_scatter", "all_to_all") else count
        n_out = count * p if collective in ("all_gather", "all_to_all") else count
        d_in = cupy.arange(n_in, dtype=cupy.float32)
        d_out = cupy.zeros(n_out, cupy.float32)
        times = {}
        for label in ("native", algorithm):
            def call(label=label):
                group.prepare(collective, input=d_in, output=d_out, algorithm=label)()
            with stream:
                if args.eager:
                    for _ in range(3):
                        call()
                    stream.synchronize()
                    host.barrier()
                    took = CudaEvents(cupy).batch(call, args.iters) * 1e6   # as the bench
                    times[label] = host.max(took)
                else:
                    g = capture(stream, call, args.iters)
                    host.barrier()
                    times[label] = host.max(replay_seconds(cupy, stream, g, args.iters) * 1e6)
        how = "issued from Python back to back" if args.eager else \
            f"device time per call in a graph of {args.iters}"
        say(f"\n== {case}: NCCL {times['native']:.1f} µs, ours {times[algorithm]:.1f} µs ({how})")
        # the module that ran last: the one whose latest call entry is the newest
        traces = [(_read(cupy, m, "trace_calls", 128).reshape(32, 4).astype(np.int64), m)
                  for m in MODULES.values()]
        calls, module = max(traces, key=lambda t: t[0][:, 0].max())
        ops = _read(cupy, module, "trace_ops", 4096).astype(np.int64)
        entry = _latest_entry(group, collective)
        n = len(entry.program.code) if entry else 0
        # per call: duration and the gap before the next one (the last `iters` calls)
        # (entry, after the prologue, block 0 at the program's end, the last block's exit)
        order = np.argsort(calls[:, 0])
        seq = calls[order][-min(args.iters, 32):]
        durations = (seq[:, 2] - seq[:, 1]) / 1e3
        prologue = (seq[:, 1] - seq[:, 0]) / 1e3
        tail = (seq[:, 3] - seq[:, 2]) / 1e3
        launch = (seq[1:, 0] - seq[:-1, 3]) / 1e3
        lines = [f"rank {rank}: blocks {entry.blocks if entry else '?'}, kernel "
                 f"{np.median(durations):.2f} µs (min {durations.min():.2f}); around it: "
                 f"prologue {np.median(prologue):.2f}, block 0's end to the last block's exit "
                 f"{np.median(tail):.2f}, that exit to the next kernel's entry "
                 f"{np.median(launch):.2f} µs"]
        if n:
            # instructions run as one batch leave no mark of their own: time from each
            # marked instruction to the next marked one
            marked = [i for i in range(n + 2) if ops[0] <= ops[i] <= ops[n + 1]]
            for i, after in zip(marked, marked[1:]):
                took = (ops[after] - ops[i]) / clock_khz * 1e3
                kind = "END BARRIER" if i == n else NAMES.get(int(entry.program.code[i][0]), "?")
                row = "" if i == n else " ".join(str(int(v)) for v in entry.program.code[i][1:8])
                if took >= 0.05:
                    lines.append(f"    {i:3}-{after - 1:<3} {kind:11} {took:7.2f} µs   {row}")
            lines.append(f"    total in block 0: {(ops[n + 1] - ops[0]) / clock_khz * 1e3:.2f} µs")
        for r in range(p):
            host.barrier()
            if r == rank:
                print("\n".join(lines), flush=True)
        host.barrier()


def _latest_entry(group, collective):
    """The peer executor's newest cached entry for ``collective`` (the one just traced)."""
    executor = group.executor.peer
    found = None
    for plan, entry in (executor._entries.values() if executor else ()):
        if entry and plan.collective == collective:
            found = entry
    return found


def _read(cupy, module, name, n):
    pointer = module.get_global(name)
    return cupy.ndarray((n,), cupy.uint64, pointer).get()


if __name__ == "__main__":
    sys.exit(main())
