"""Mismatched calls under COLLECTIVES_DEBUG=DETAIL (counts, dtype, op, operation, root,
algorithm): every rank raises, the group stays usable."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=20)
rank = dist.get_rank()
odd = rank == 1
cases = {
    "counts": lambda: dist.all_reduce(np.ones(100 if odd else 200, np.float32)),
    "dtype": lambda: dist.all_reduce(np.ones(64, np.float64 if odd else np.float32)),
    "op": lambda: dist.all_reduce(np.ones(64, np.float32),
                                  op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM),
    "operation": lambda: (dist.broadcast(np.ones(64, np.float32), src=0) if odd
                          else dist.all_reduce(np.ones(64, np.float32))),
    "root": lambda: dist.broadcast(np.ones(64, np.float32), src=2 if odd else 0),
    "algorithm": lambda: dist.all_reduce(np.ones(64, np.float32),
                                         algorithm="tree" if odd else "ring"),
}
for name, call in cases.items():
    t0 = time.monotonic()
    try:
        call()
        report(rank=rank, case=name, unexpected="success")
    except CollectiveError as exc:
        report(rank=rank, case=name, waited=time.monotonic() - t0, **failure(exc))
x = np.full(1000, rank + 1.0)                 # the group is still usable afterwards
dist.all_reduce(x)
report(rank=rank, case="after", ok=bool((x == 6).all()))
