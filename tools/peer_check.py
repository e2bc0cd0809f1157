"""Peer-memory executor on the GPUs of one host: a smoke check of every collective x algorithm
against NCCL's send/recv executor (bitwise), then timings beside NCCL's own collective and
the NCCL send/recv executor running the same schedules, all in one run.

    mpiexec -n 4 python tools/peer_check.py [--sizes 4K,64K,1M,16M] [--quick]

Prints one line per check and a table of times (µs, p50 of rounds of back-to-back calls,
CUDA events) with NCCL's time / ours. Needs CuPy with NCCL and GPUs with peer access.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collectives.algorithms import capabilities  # noqa: E402
from collectives.bench.nccl import nccl_group, timed  # noqa: E402
from collectives.executors import nccl as nccl_executor  # noqa: E402
from collectives.group import ProcessGroup  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402


def buffers(cupy, collective, count, p, dtype, rank, seed):
    rng = np.random.default_rng(seed * 100 + rank)
    n_in = count * p if collective in ("reduce_scatter", "all_to_all") else count
    n_out = count * p if collective in ("all_gather", "all_to_all") else count
    if collective == "all_reduce":
        n_in = n_out = count
    data = rng.integers(-8, 8, n_in).astype(dtype)
    return cupy.asarray(data), cupy.zeros(n_out, dtype)


def check_one(group, baseline, collective, kwargs, d_in, out, ref, rank, root, transport,
              cupy) -> int:
    """Bytes of ``out`` that differ from the NCCL send/recv executor's result of the same
    call into ``ref`` (0 where this rank's output is not defined), -1 where it raised."""
    try:
        if collective == "broadcast":
            mine, ref = d_in.copy(), d_in.copy()
            group.prepare(collective, output=mine, **kwargs)()
            baseline.prepare(collective, output=ref, **kwargs)()
        else:
            group.prepare(collective, input=d_in, output=out, **kwargs)()
            baseline.prepare(collective, input=d_in, output=ref, **kwargs)()
            mine = out
        transport.synchronize(30.0)
        if collective in ("reduce", "gather") and rank != root:
            return 0
        return int((mine.view(cupy.uint8) != ref.view(cupy.uint8)).sum())   # bit for bit
    except Exception as exc:      # noqa: BLE001
        print(f"rank {rank}: {collective}: {type(exc).__name__}: {exc}", flush=True)
        return -1


def capture(stream, call, iters):
    """``iters`` calls captured in one CUDA graph on ``stream`` (after three warm-up calls on
    it: staging grown, plans cached), launched once."""
    for _ in range(3):
        call()
    stream.synchronize()
    stream.begin_capture()
    for _ in range(iters):
        call()
    graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    return graph


def replay_seconds(cupy, stream, graph, iters, reps=5):
    """Seconds per call of a graph of ``iters`` calls, p50 of ``reps`` replays."""
    samples = []
    for _ in range(reps):
        start = stream.record()
        graph.launch(stream)
        end = stream.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / iters)
    return float(np.median(samples))


def graph_time(cupy, stream, call, iters, reps):
    """Seconds per call of ``iters`` calls captured in one graph, p50 of ``reps`` replays."""
    return replay_seconds(cupy, stream, capture(stream, call, iters), iters, reps)


def slowest_graph_time(cupy, stream, call, host, say, label, iters=20, reps=5):
    """``graph_time`` on ``stream``, the slowest rank's (collective over ``host``), or NaN
    where capturing failed on this rank (said as ``label``'s)."""
    try:
        with stream:
            return host.max(graph_time(cupy, stream, call, iters, reps))
    except Exception as exc:      # noqa: BLE001
        say(f"  {label}: graph failed: {type(exc).__name__}: {exc}")
        return host.max(float("nan"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M")
    ap.add_argument("--algorithms", default="ring,tree,recursive_doubling,direct,two_shot,ring_bidirectional")
    ap.add_argument("--collectives", default="all_reduce,reduce_scatter,all_gather,all_to_all")
    ap.add_argument("--quick", action="store_true", help="float32 checks only")
    ap.add_argument("--no-checks", action="store_true", help="timings only")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA graph timings")
    ap.add_argument("--symmetric", action="store_true",
                    help="also check (float32, int32; every rank's output symmetric, then "
                         "the even ranks' only) and time each algorithm with its output in "
                         "symmetric memory (<algorithm>:symm rows; group.symmetric_empty)")
    ap.add_argument("--registered", action="store_true",
                    help="as --symmetric, with outputs in an ordinary CuPy array every rank "
                         "registered (<algorithm>:reg rows; group.register_buffer)")
    args = ap.parse_args()
    group, cupy = nccl_group(timeout=120)
    host = group.bench_host
    rank, p = group.rank, group.size
    transport = group.transport
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"peer path: {group.executor.peer_path}; executor "
        f"{type(group.execute).__name__}", flush=True)
    # the same transport, run by the NCCL send/recv executor: the reference and the baseline
    baseline = ProcessGroup.__new__(ProcessGroup)
    baseline.__dict__.update(group.__dict__)
    baseline.execute = nccl_executor.execute
    baseline._repeats, baseline._lane = {}, None

    have = capabilities()
    wrong = 0
    sizes = [int(float(s[:-1]) * {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[s[-1]])
             if s[-1] in "KMG" else int(s) for s in args.sizes.split(",")]
    elements = max(max(sizes) // 4, p * ((1 << 17) + 3)) + 4096
    heap, kind = None, "symm"
    if args.registered:           # the caller's own memory, mapped by the peers
        heap, kind = cupy.empty(elements, np.float32), "reg"
        group.register_buffer(heap)
    elif args.symmetric:
        heap = group.symmetric_empty(elements, "float32")
    place = {"symm": "symmetric", "reg": "registered"}[kind]
    from collectives.kernels.reduce import BFLOAT16
    dtypes = [np.float32] if args.quick else [np.float32, np.float16, np.int32] + \
        ([BFLOAT16] if BFLOAT16 is not None else [])
    for collective in ([] if args.no_checks else args.collectives.split(",") +
                       ["broadcast", "reduce", "gather", "scatter"]):
        for algorithm in have.get(collective, ()):
            for dtype in dtypes:
                for count in (1, 3, 1000, 65536 + 7, (1 << 17) + 3):
                    root = count % p
                    if collective in ("broadcast", "reduce"):
                        d_in, d_out = buffers(cupy, "all_reduce", count, p, dtype, rank, count)
                    elif collective == "gather":
                        d_in, d_out = buffers(cupy, "all_gather", count, p, dtype, rank, count)
                    elif collective == "scatter":
                        d_in, d_out = buffers(cupy, "reduce_scatter", count, p, dtype, rank,
                                              count)
                    else:
                        d_in, d_out = buffers(cupy, collective, count, p, dtype, rank, count)
                    ref_out = d_out.copy()
                    kwargs = dict(algorithm=algorithm)
                    placements = ["staged"]
                    if heap is not None and collective in ("all_reduce", "reduce_scatter",
                                                          "all_gather", "all_to_all") \
                            and np.dtype(dtype) in (np.float32, np.int32):
                        placements += [place, f"{place} on even ranks"]
                    if collective in ("all_reduce", "reduce_scatter", "reduce"):
                        kwargs["op"] = ReduceOp.SUM
                    if collective in ("broadcast", "reduce", "gather", "scatter"):
                        kwargs["root"] = root
                    for placement in placements:
                        out = d_out
                        if placement == place or (placement != "staged" and rank % 2 == 0):
                            out = heap.view(dtype)[:d_out.size]
                        out[...] = ref_out
                        bad = check_one(group, baseline, collective, kwargs, d_in, out,
                                        ref_out.copy(), rank, root, transport, cupy)
                        if bad < 0:
                            print(f"rank {rank}: {collective} {algorithm} "
                                  f"{np.dtype(dtype).name} {count} ({placement}) failed",
                                  flush=True)
                        bad = host.sum(1 if bad else 0)
                        if bad:
                            wrong += 1
                            say(f"WRONG {collective} {algorithm} {np.dtype(dtype).name} "
                                f"n={count} ({placement}) on {bad} ranks", flush=True)
    say(f"checks done: {wrong} wrong", flush=True)

    say(f"{'collective':15} {'algorithm':20} " + " ".join(f"{s:>10}" for s in args.sizes.split(",")))
    for collective in args.collectives.split(","):
        times = {}
        for nbytes in sizes:
            count = max(1, nbytes // 4 // (p if collective in ("reduce_scatter", "all_gather",
                                                             "all_to_all") else 1))
            d_in, d_out = buffers(cupy, collective, count, p, np.float32, rank, 0)
            iters = 50 if nbytes <= (4 << 20) else 10
            rows = [("native", group, "native", d_out)]
            for algorithm in args.algorithms.split(","):
                if algorithm in have[collective]:
                    rows.append((algorithm, group, algorithm, d_out))
                    if heap is not None:
                        rows.append((f"{algorithm}:{kind}", group, algorithm,
                                     heap[:d_out.size]))
                    rows.append((algorithm + ":nccl", baseline, algorithm, d_out))
            for label, g, algorithm, out in rows:
                def call(g=g, algorithm=algorithm, out=out):
                    g.prepare(collective, input=d_in, output=out, algorithm=algorithm)()
                host.barrier()
                t = host.max(timed(cupy, call, iters, 5))
                times.setdefault(label, []).append(t)
        for label, ts in times.items():
            ratio = " ".join(f"{t * 1e6:8.1f}/{times['native'][i] / t:4.2f}"
                             for i, t in enumerate(ts))
            say(f"{collective:15} {label:20} {ratio}", flush=True)
    # device time alone: the same calls captured in a CUDA graph and replayed (no host cost)
    say("device time per call in CUDA graphs (µs; NCCL's / ours):")
    stream = cupy.cuda.Stream(non_blocking=True)
    for collective in ([] if args.no_graphs else args.collectives.split(",")):
        for nbytes in sizes:
            count = max(1, nbytes // 4 // (p if collective in ("reduce_scatter", "all_gather",
                                                             "all_to_all") else 1))
            d_in, d_out = buffers(cupy, collective, count, p, np.float32, rank, 0)
            cells = []
            base = None
            timed_rows = [("native", "native", d_out)]
            for a in args.algorithms.split(","):
                if a in have[collective] and a != "tree":
                    timed_rows.append((a, a, d_out))
                    if heap is not None:
                        timed_rows.append((f"{a}:{kind}", a, heap[:d_out.size]))
            for label, algorithm, out in timed_rows:
                def call(algorithm=algorithm, out=out):
                    group.prepare(collective, input=d_in, output=out, algorithm=algorithm)()
                t = slowest_graph_time(cupy, stream, call, host, say, f"{collective} {label}")
                base = t if algorithm == "native" else base
                cells.append(f"{label} {t * 1e6:.1f}/{base / t:.2f}")
            say(f"  {collective:15} {nbytes:>10}: " + "  ".join(cells), flush=True)
    # fixed cost per step: ring all_reduce at 4 KiB, time / steps
    d_in, d_out = buffers(cupy, "all_reduce", 1024, p, np.float32, rank, 0)
    for label, g in (("peer", group), ("nccl", baseline)):
        def call(g=g):
            g.prepare("all_reduce", input=d_in, output=d_out, algorithm="ring")()
        t = host.max(timed(cupy, call, 200, 5))
        say(f"ring all_reduce 4 KiB on {label}: {t * 1e6:.1f} µs, {t * 1e6 / (2 * (p - 1)):.2f} "
            f"µs per step ({2 * (p - 1)} steps)", flush=True)
    # host cost of one call: issue many without waiting
    def call():
        group.prepare("all_reduce", input=d_in, output=d_out, algorithm="ring")()
    transport.synchronize(30)
    start = time.perf_counter()
    for _ in range(200):
        call()
    issue = (time.perf_counter() - start) / 200
    transport.synchronize(30)
    say(f"host time to issue one call (peer): {issue * 1e6:.1f} µs", flush=True)
    host.barrier()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
