"""Mismatched calls of equal message lengths without DETAIL (dtype, op, sizes per algorithm):
every rank raises naming both calls."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

from collectives.executors import compiled
dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=20)
rank = dist.get_rank()
odd = rank == 1
report(rank=rank, case="executor", compiled=compiled.available())
cases = {}
for algorithm in ("ring", "tree", "recursive_doubling", "direct", None):
    cases["dtype", algorithm] = lambda a=algorithm: dist.all_reduce(
        np.full(64, rank + 1, np.int32 if odd else np.float32), algorithm=a)
    cases["op", algorithm] = lambda a=algorithm: dist.all_reduce(
        np.full(64, rank + 1.0, np.float32), algorithm=a,
        op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
for algorithm in ("ring", "tree"):
    cases["sizes", algorithm] = lambda a=algorithm: dist.all_reduce(
        np.ones(100 if odd else 200, np.float32), algorithm=a)
for (name, algorithm), call in cases.items():
    t0 = time.monotonic()
    try:
        call()
        report(rank=rank, case=name, algorithm=algorithm, unexpected="success")
    except CollectiveError as exc:
        report(rank=rank, case=name, algorithm=algorithm, waited=time.monotonic() - t0,
               **failure(exc))
x = np.full(1000, rank + 1.0)                 # the group is still usable afterwards
dist.all_reduce(x)
report(rank=rank, case="after", ok=bool((x == 6).all()))
