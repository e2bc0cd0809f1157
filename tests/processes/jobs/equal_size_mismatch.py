"""Mismatched calls of equal sizes (CASE, ALGORITHM): every rank fails."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=10)
rank = dist.get_rank()
case = os.environ["CASE"]
kw = {"algorithm": os.environ["ALGORITHM"]}
if case == "dtype":
    x = np.full(1000, 3, np.int32 if rank == 1 else np.float32)
    call = lambda: dist.all_reduce(x, **kw)
elif case == "op":
    x = np.full(1000, rank + 1.0, np.float32)
    call = lambda: dist.all_reduce(x, op=dist.ReduceOp.MAX if rank == 2 else dist.ReduceOp.SUM, **kw)
else:                          # collective: all_reduce of 3000 against reduce_scatter into 1000
    x = np.full(3000, 1.0, np.float32)
    out = np.zeros(1000, np.float32)
    call = (lambda: dist.reduce_scatter_tensor(out, x, **kw)) if rank == 0 else \
        (lambda: dist.all_reduce(x, **kw))
t0 = time.monotonic()
try:
    dist.barrier()      # every rank past init (its table agreement is a collective of its own)
    t0 = time.monotonic()
    call()
    report(rank=rank, unexpected="success")
except CollectiveError as exc:
    report(rank=rank, waited=time.monotonic() - t0, **failure(exc))
