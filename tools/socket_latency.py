"""Small-message latency of the socket transport, with and without a barrier per call.

    python tools/socket_latency.py [--size 4096] [--algorithm direct] [--calls 1000]
                                        [--profile]
    python tools/socket_latency.py --barriers [--calls 1000]

Two local processes (forked, TCP store on 127.0.0.1) run ``calls`` back-to-back all_reduces
of ``size`` bytes through ProcessGroup.prepare, after 200 warm-up calls, and print the mean
microseconds per call on each rank; ``--profile`` prints rank 0's cProfile (by own time).
This is the floor a collective pays in the transport and executor.

``--barriers`` times each call the way bench.py does (a barrier before every call, each rank
times its own call, an iteration lasts as long as its slower rank, p50 over iterations) for
ours and torch gloo's all_reduce (same processes, a torch view of the same buffer), once per
kind of barrier before the call: gloo's (what bench.py used before each of our rows too,
until this comparison showed it unfair to us; it now gives each side its own), ours (the
socket transport's ``barrier``), a spin on a shared-memory counter (neither library's; the
ranks leave it within a microsecond), none, and gloo's followed by the spin (gloo's exit skew
removed, whatever its threads still do after it kept). The barrier's exit skew between the
ranks lands in the next call's time, so this shows how much of a row is the barrier's and
whether it treats both sides alike. Needs torch.
"""
import argparse
import cProfile
import io
import multiprocessing
import os
import pstats
import sys
import time
from datetime import timedelta

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives.group import ProcessGroup  # noqa: E402
from collectives.store import TCPStore  # noqa: E402
from collectives.transports import create  # noqa: E402

SECRET = b"socket-latency"
WARMUP = 200


def rank_main(rank, port, gloo_port, args, results, flags):
    store = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
    group = ProcessGroup(create("socket", rank=rank, world_size=2, store=store, timeout=60),
                         backend="socket")
    x = np.ones(args.size // 4, np.float32)
    out = np.empty_like(x)

    def call():
        group.prepare("all_reduce", input=x, output=out, algorithm=args.algorithm)()
    if args.barriers:
        results.put((rank, barrier_table(rank, gloo_port, group, call, x, args, flags), ""))
        group.transport.close()
        return
    for _ in range(WARMUP):
        call()
    profile = cProfile.Profile() if args.profile and rank == 0 else None
    if profile:
        profile.enable()
    start = time.perf_counter()
    for _ in range(args.calls):
        call()
    per_call = (time.perf_counter() - start) / args.calls * 1e6
    text = ""
    if profile:
        profile.disable()
        stream = io.StringIO()
        pstats.Stats(profile, stream=stream).sort_stats("tottime").print_stats(12)
        text = stream.getvalue()
    group.transport.close()
    results.put((rank, per_call, text))


def barrier_table(rank, gloo_port, group, ours, x, args, flags):
    """({(barrier, side): this rank's per-call seconds}, {...: their start times}), the
    cases interleaved in rounds."""
    import torch
    import torch.distributed as tdist
    tstore = tdist.TCPStore("127.0.0.1", gloo_port, 2, is_master=False,
                            timeout=timedelta(seconds=60))
    tdist.init_process_group("gloo", store=tstore, rank=rank, world_size=2,
                             timeout=timedelta(seconds=60))
    tensor = torch.from_numpy(x)
    calls = {"ours": ours, "gloo": lambda: tdist.all_reduce(tensor)}
    barriers = {"gloo": tdist.barrier, "ours": group.prepare("barrier", algorithm=None),
                "spin": lambda: spin_barrier(rank, flags), "none": lambda: None,
                "gloo+spin": lambda: (tdist.barrier(), spin_barrier(rank, flags))}
    times = {(b, side): [] for b in barriers for side in calls}
    starts = {key: [] for key in times}
    rounds = 5
    for _ in range(rounds):
        for (b, side), seconds in times.items():
            barrier, call = barriers[b], calls[side]
            for _ in range(WARMUP // rounds):
                call()
            for _ in range(args.calls // rounds):
                barrier()
                start = time.perf_counter()
                call()
                seconds.append(time.perf_counter() - start)
                starts[b, side].append(start)
    tdist.destroy_process_group()
    return times, starts


def spin_barrier(rank, flags):
    """Neither library's barrier: each rank bumps its counter in shared memory and spins
    until the other's has caught up, so both leave within a fraction of a microsecond (on one
    host; perf_counter is the system-wide monotonic clock there)."""
    flags[rank] += 1
    mine, other = flags[rank], 1 - rank
    while flags[other] < mine:
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--algorithm", default="direct")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--barriers", action="store_true",
                    help="time ours and gloo's call after each kind of barrier, as bench.py does")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("fork")
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=30, secret=SECRET)
    gloo_store = None
    if args.barriers:
        import torch.distributed as tdist
        gloo_store = tdist.TCPStore("127.0.0.1", 0, 2, is_master=True,
                                    timeout=timedelta(seconds=60), wait_for_workers=False)
    results = ctx.Queue()
    flags = ctx.RawArray("q", 2)
    procs = [ctx.Process(target=rank_main, args=(r, store.port, gloo_store.port if gloo_store
                                                 else 0, args, results, flags)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(10)
    store.close()
    if args.barriers:
        report_barriers(args, got[0][1], got[1][1])
        return 0
    print(f"{args.size}-byte all_reduce ({args.algorithm}), 2 ranks: "
          + ", ".join(f"rank {r} {us:.1f} µs/call" for r, us, _ in got))
    if got[0][2]:
        print(got[0][2])
    return 0


def report_barriers(args, rank0, rank1):
    (times0, starts0), (times1, starts1) = rank0, rank1
    print(f"{args.size}-byte all_reduce, 2 ranks, {args.calls} calls per case; p50 µs of the "
          f"slower rank per call (rank 0 / rank 1 own p50), and the p50 of |start skew|, the "
          f"gap between the ranks leaving the barrier; ours = {args.algorithm}")
    print(f"{'barrier':>9} {'ours':>20} {'skew':>6} {'gloo':>20} {'skew':>6} {'ours/gloo':>10}")
    for b in ("gloo", "ours", "spin", "none", "gloo+spin"):
        cells, p50 = [], {}
        for side in ("ours", "gloo"):
            a, c = np.array(times0[b, side]), np.array(times1[b, side])
            p50[side] = np.median(np.maximum(a, c)) * 1e6
            skew = np.median(np.abs(np.array(starts0[b, side]) - np.array(starts1[b, side])))
            cells.append(f"{p50[side]:6.1f} ({np.median(a) * 1e6:4.0f}/{np.median(c) * 1e6:4.0f}) "
                         f"{skew * 1e6:6.1f}")
        print(f"{b:>9} {cells[0]:>27} {cells[1]:>27} {p50['ours'] / p50['gloo']:>9.2f}x")


if __name__ == "__main__":
    sys.exit(main())
