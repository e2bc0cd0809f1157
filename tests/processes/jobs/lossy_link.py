"""Collectives over a slow, lossy link, exact results (two network namespaces)."""
import time

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("gloo", timeout=60)
rank, p = dist.get_rank(), dist.get_world_size()
checked = 0
t0 = time.monotonic()
for algorithm in ("ring", "tree", "recursive_doubling"):
    for count in (7, 1000, 1 << 18):
        x = np.arange(count, dtype=np.float64) * (rank + 1)
        dist.all_reduce(x, algorithm=algorithm)
        assert (x == np.arange(count) * 3).all(), (algorithm, count)
        outs = [np.empty(count, np.int32) for _ in range(p)]
        dist.all_gather(outs, np.full(count, rank + 5, np.int32), algorithm=algorithm)
        assert all((o == r + 5).all() for r, o in enumerate(outs)), (algorithm, count)
        y = np.full(count, rank, np.float32)
        dist.broadcast(y, src=1, algorithm=algorithm)
        assert (y == 1).all()
        checked += 3
works = [dist.all_reduce(np.ones(64), async_op=True) for _ in range(50)]
for w in works:
    w.wait()
checked += 50
report(rank=rank, checked=checked, seconds=time.monotonic() - t0)
