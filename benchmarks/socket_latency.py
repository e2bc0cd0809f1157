"""Small-message latency of the socket transport without the benchmark's per-iteration barrier.

    python benchmarks/socket_latency.py [--size 4096] [--algorithm direct] [--calls 1000] [--profile]

Two local processes (forked, TCP store on 127.0.0.1) run ``calls`` back-to-back all_reduces
of ``size`` bytes through ProcessGroup.prepare, after 200 warm-up calls, and print the mean
microseconds per call on each rank; ``--profile`` prints rank 0's cProfile (by own time).
This is the floor a collective pays in the transport and executor; bench.py's rows add the
barrier before every iteration and take the slowest rank.
"""
import argparse
import cProfile
import io
import multiprocessing
import os
import pstats
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives.group import ProcessGroup  # noqa: E402
from collectives.store import TCPStore  # noqa: E402
from collectives.transports import create  # noqa: E402

SECRET = b"socket-latency"


def rank_main(rank, port, args, results):
    store = TCPStore("127.0.0.1", port, timeout=30, secret=SECRET)
    group = ProcessGroup(create("socket", rank=rank, world_size=2, store=store, timeout=60),
                         backend="socket")
    x = np.ones(args.size // 4, np.float32)
    out = np.empty_like(x)

    def call():
        group.prepare("all_reduce", input=x, output=out, algorithm=args.algorithm)()
    for _ in range(200):
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--algorithm", default="direct")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    ctx = multiprocessing.get_context("fork")
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=30, secret=SECRET)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, store.port, args, results)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(10)
    store.close()
    print(f"{args.size}-byte all_reduce ({args.algorithm}), 2 ranks: "
          + ", ".join(f"rank {r} {us:.1f} µs/call" for r, us, _ in got))
    if got[0][2]:
        print(got[0][2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
