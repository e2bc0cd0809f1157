"""Huge timeouts (inf, 1e300, timedelta.max) are no deadline, everywhere one is taken."""
import os

import numpy as np

import collectives as dist
from reporting import failure, report

from datetime import timedelta

FOREVER = {"inf": float("inf"), "1e300": 1e300, "timedelta.max": timedelta.max}
rank = int(os.environ["RANK"])
peer = 1 - rank


def exchange(buf, group=None):
    if rank == 0:
        dist.send(buf, peer, group=group)
        dist.recv(buf, peer, group=group)
    else:
        dist.recv(buf, peer, group=group)
        dist.send(buf, peer, group=group)


def per_call(forever):
    # a group with a deadline; each call's own timeout is none
    dist.init_process_group("gloo", timeout=30)
    x = np.full(1 << 16, rank + 1.0)
    dist.all_reduce(x, timeout=forever)
    works = [dist.all_reduce(np.full(4096, 1.0), async_op=True, timeout=forever)
             for _ in range(8)]
    assert all(w.wait(timeout=forever) for w in works)
    dist.barrier(timeout=forever)
    buf = np.full(1 << 14, float(rank))
    work = dist.irecv(buf, peer) if rank else dist.isend(buf, peer)
    work.wait(timeout=forever)
    dist.monitored_barrier(timeout=forever)
    dist.destroy_process_group()
    return bool((x == 3).all()) and buf[0] == 0.0


def per_group(forever):
    # groups without a deadline: their collectives and p2p wait as long as it takes
    dist.init_process_group("gloo", timeout=forever)
    x = np.full(1 << 16, rank + 1.0)
    dist.all_reduce(x)
    buf = np.full(1 << 14, float(rank))
    exchange(buf)
    sub = dist.new_group([0, 1], timeout=forever)
    y = np.full(1 << 16, float(rank))
    dist.broadcast(y, src=1, group=sub)
    exchange(buf, sub)
    dist.barrier(group=sub)
    dist.destroy_process_group()
    return bool((x == 3).all() and (y == 1).all()) and buf[0] == 0.0


for name, forever in FOREVER.items():
    for entry in (per_call, per_group):
        try:
            report(forever=name, entry=entry.__name__, ok=bool(entry(forever)))
        except Exception as exc:
            report(forever=name, entry=entry.__name__, **failure(exc))
            os._exit(1)             # the other rank fails on the dropped connection
