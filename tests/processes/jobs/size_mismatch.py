"""An all_reduce whose sizes differ on rank 1, without DETAIL: an error on every rank."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=3)
rank = dist.get_rank()
x = np.full(100 if rank == 1 else 200, 1.0, np.float32)
before = x.copy()
t0 = time.monotonic()
try:
    dist.all_reduce(x, algorithm="ring")
    report(rank=rank, unexpected="success", values=sorted(set(x.tolist())))
except CollectiveError as exc:
    report(rank=rank, waited=time.monotonic() - t0, **failure(exc))
