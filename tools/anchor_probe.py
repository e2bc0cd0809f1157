"""Where the anchor's gap lies: our all_reduce against torch's SymmetricMemory one-shot and
two-shot, each timed two ways in one run on the GPUs of one host.

    mpiexec -n 4 python tools/anchor_probe.py [--sizes 4K,64K,256K,1M,4M]

* back to back: ``iters`` calls between CUDA events, as the bench times a row (host and
  device together: a row that issues slower than the GPUs run it is timed by its host);
* graph: 20 calls captured in one CUDA graph and replayed (p50 of 5 replays): the device
  alone, each kernel launched by the graph;
* issue: the host's time per call issuing 200 calls without waiting (host clock): what a
  call costs the host, the bound of back to back where it exceeds the device's time.

Rows: NCCL's own all_reduce; ours (``direct``, ``two_shot``) with the output staged and with it
in symmetric memory (``:symm``), and two_shot in place on symmetric memory
(``two_shot:symm_in_place``, one pass); SymmetricMemory's ``one_shot`` (``one_shot_all_reduce_out``
into a buffer made once, so that capture allocates nothing) and ``two_shot`` (in place), on
buffers from ``symm_mem.empty``. The columns say which of the two costs sets each row's
time: where back to back is far above graph, the host (or the launches) is the bound.
Needs CuPy with NCCL, torch with CUDA and ``torch.distributed._symmetric_memory``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collectives.bench.cases import parse_sizes  # noqa: E402
from collectives.bench.nccl import nccl_group  # noqa: E402
from collectives.bench.symmetric import SymmetricMemory  # noqa: E402
from collectives.bench.timing import timed  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402
from peer_check import slowest_graph_time  # noqa: E402  (tools/, beside this file)


def torch_graph(torch, call, iters=20, reps=5):
    """The same for torch ops, captured with ``torch.cuda.graph`` on a side stream (replayed
    on it too: replay launches on the current stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(iters):
            call()
    samples = []
    with torch.cuda.stream(side):
        for _ in range(reps + 1):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3 / iters)
    return float(np.median(samples[1:]))


def torch_back_to_back(torch, call, iters, reps=5):
    """p50 over ``reps`` of the event time of ``iters`` calls on torch's current stream."""
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return float(np.median(samples))


def issue_seconds(call, sync, calls=200):
    """Host seconds per call, ``calls`` issued without waiting (after a sync)."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    spent = (time.perf_counter() - start) / calls
    sync()
    return spent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4K,64K,256K,1M,4M")
    ap.add_argument("--iters", type=int, default=200, help="calls per back-to-back batch")
    args = ap.parse_args()
    group, cupy = nccl_group(timeout=120)
    host = group.bench_host
    rank, size = group.rank, group.size
    say = print if rank == 0 else (lambda *a, **k: None)
    sm, why = SymmetricMemory.open(group, host)
    if sm is None:
        say(f"no SymmetricMemory rows: {why}")
    torch = sm.torch if sm is not None else None
    stream = cupy.cuda.Stream(non_blocking=True)
    say(f"{size} ranks; µs per call (the slowest rank's): back to back (as the bench) / "
        f"device in a graph / the host's issue")
    for nbytes in parse_sizes(args.sizes):
        count = nbytes // 4
        rng = np.random.default_rng(rank)
        d_in = cupy.asarray(rng.integers(-8, 8, count).astype(np.float32))
        d_out = cupy.zeros(count, np.float32)
        symm = group.symmetric_empty(count, "float32")
        rows = [("nccl", lambda: group.prepare("all_reduce", input=d_in, output=d_out,
                                               algorithm="native", op=ReduceOp.SUM)())]
        for algorithm in ("direct", "two_shot"):
            for label, out in ((algorithm, d_out), (f"{algorithm}:symm", symm)):
                rows.append((label, lambda a=algorithm, o=out: group.prepare(
                    "all_reduce", input=d_in, output=o, algorithm=a, op=ReduceOp.SUM)()))
        symm[...] = d_in        # in place on it, as SymmetricMemory's two-shot (one pass)
        rows.append(("two_shot:symm_in_place", lambda: group.prepare(
            "all_reduce", input=symm, output=symm, algorithm="two_shot", op=ReduceOp.SUM)()))
        cells = []
        for label, call in rows:
            host.barrier()
            with stream:
                eager = host.max(timed(cupy, call, args.iters, 5))
                host.barrier()
                issue = host.max(issue_seconds(call, stream.synchronize))
            graphed = slowest_graph_time(cupy, stream, call, host, say, label)
            cells.append(f"{label} {eager * 1e6:.1f}/{graphed * 1e6:.1f}/{issue * 1e6:.1f}")
        if sm is not None:
            buf = sm.symm_mem.empty(count, dtype=torch.float32,
                                    device=torch.device("cuda", sm.device))
            sm.symm_mem.rendezvous(buf, sm.group_name)
            out = torch.empty_like(buf)
            source = torch.from_dlpack(d_in)
            buf.copy_(source)
            ops = torch.ops.symm_mem
            sm_rows = [("sm:two_shot", lambda: ops.two_shot_all_reduce_(buf, "sum",
                                                                         sm.group_name))]
            if hasattr(ops, "one_shot_all_reduce_out"):
                sm_rows.insert(0, ("sm:one_shot", lambda: ops.one_shot_all_reduce_out(
                    buf, "sum", sm.group_name, out)))
            side = torch.cuda.Stream()
            for label, call in sm_rows:
                host.barrier()
                with torch.cuda.stream(side):
                    eager = host.max(torch_back_to_back(torch, call, args.iters))
                    host.barrier()
                    issue = host.max(issue_seconds(call, torch.cuda.synchronize))
                try:
                    graphed = host.max(torch_graph(torch, call))
                except Exception as exc:      # noqa: BLE001
                    say(f"  {label}: graph failed: {type(exc).__name__}: {exc}")
                    graphed = host.max(float("nan"))
                cells.append(f"{label} {eager * 1e6:.1f}/{graphed * 1e6:.1f}/"
                             f"{issue * 1e6:.1f}")
                buf.copy_(source)
            torch.cuda.synchronize()
        say(f"{nbytes:>9}: " + "  ".join(cells), flush=True)
    host.barrier()
    if sm is not None:
        sm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
