"""Load: TOTAL async all_reduces and all_gathers over the world and two
subgroups, every result checked (BACKEND)."""
import os
import time

import numpy as np

import collectives as dist
from reporting import report, rss_mib

backend = os.environ["BACKEND"]
dist.init_process_group(backend, timeout=60)
rank, p = dist.get_rank(), dist.get_world_size()
groups = [None, dist.new_group(), dist.new_group()]
right, left = (rank + 1) % p, (rank - 1) % p
total = int(os.environ["TOTAL"])
BATCH = 60
wrong = []

def batch(start, count):
    works, checks = [], []
    for i in range(start, start + count):
        g = groups[i % 3]
        if i % 4 == 3:
            mine = np.full(8, rank + i, np.int64)
            outs = [np.empty(8, np.int64) for _ in range(p)]
            works.append(dist.all_gather(outs, mine, group=g, async_op=True))
            checks.append((i, "gather", outs))
        else:
            x = np.full(16, rank + i % 1000, np.float64)
            works.append(dist.all_reduce(x, group=g, async_op=True))
            checks.append((i, "reduce", x))
        if i % 6 == 0:                    # point-to-point around the ring, in between
            send = np.full(4, rank * 100000 + i, np.int64)
            got = np.empty(4, np.int64)
            r = dist.irecv(got, src=left, tag=i % 1000)
            s = dist.isend(send, dst=right, tag=i % 1000)
            works += [s, r]
            checks.append((i, "p2p", got))
    for w in works:
        w.wait()
    for i, kind, value in checks:
        if kind == "reduce":
            ok = (value == sum(r + i % 1000 for r in range(p))).all()
        elif kind == "gather":
            ok = all((v == r + i).all() for r, v in enumerate(value))
        else:
            ok = (value == left * 100000 + i).all()
        if not ok:
            wrong.append((i, kind))

done = 0
t0 = time.monotonic()
batch(0, 600); done += 600                # warm-up: caches, buffers, threads
rss_start = rss_mib()
t1 = time.monotonic()
while done < total:
    count = min(BATCH, total - done)
    batch(done, count)
    done += count
elapsed = time.monotonic() - t1
rss_end = rss_mib()
dist.barrier()
report(rank=rank, done=done, wrong=len(wrong), first_wrong=wrong[:3], rss_start=rss_start,
       rss_end=rss_end, seconds=elapsed, warmup=t1 - t0)
dist.destroy_process_group()
