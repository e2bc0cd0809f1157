"""Two threads calling on one group: an error, never garbage."""
import os
import threading

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=20)
rank, size = dist.get_rank(), dist.get_world_size()
wrong, errors, right = [], [], [0]

def caller(k):
    for i in range(100):
        x = np.full(256, (k + 1) * 1000.0 + i, np.float64)
        try:
            dist.all_reduce(x, algorithm="ring")
        except CollectiveError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        if not (x == size * ((k + 1) * 1000.0 + i)).all():
            wrong.append((k, i))
        else:
            right[0] += 1

threads = [threading.Thread(target=caller, args=(k,), name=f"caller{k}") for k in range(2)]
for t in threads: t.start()
for t in threads: t.join()
report(rank=rank, wrong=len(wrong), right=right[0], errors=errors[:2])
