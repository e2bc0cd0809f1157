"""Rank 2 never makes its second all_reduce: ranks 0 and 1 time out on the group's 1.5 s (socket
and MPI reliability tests)."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveTimeout
from reporting import failure, report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=60)
rank = dist.get_rank()
g = dist.new_group(timeout=1.5)           # the per-group override of the 60 s default
x = np.full(1000, rank + 1.0)
dist.all_reduce(x, group=g)               # one good call first
if rank == 2:
    time.sleep(5)                          # never makes the second call (a slow peer, on purpose)
    report(rank=rank, skipped=True)
else:
    t0 = time.monotonic()
    try:
        dist.all_reduce(x, group=g, algorithm="ring")
        report(rank=rank, unexpected="success")
    except CollectiveTimeout as exc:
        report(rank=rank, waited=time.monotonic() - t0, **failure(exc))
    # stay connected until the other waiting rank's own timeout has fired: ranks 0 and 1 start
    # this call a few ms apart, and the first to time out would otherwise exit and close its
    # transport, which the other then reports instead ("rank 0 has closed its transport").
    # Each says so with a file in the job's folder (the cwd of every rank, either transport).
    open(f"timed-out-{rank}", "w").close()
    deadline = time.monotonic() + 10
    while not os.path.exists(f"timed-out-{1 - rank}") and time.monotonic() < deadline:
        time.sleep(0.01)
