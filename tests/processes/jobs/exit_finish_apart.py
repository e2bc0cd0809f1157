"""Under mpiexec: a clean job whose ranks finish apart (one still busy) exits zero."""
import sys
import time

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
rank, size = dist.get_rank(), dist.get_world_size()
x = np.full(1000, rank + 1.0)
dist.all_reduce(x)
assert x[0] == size * (size + 1) / 2
if rank == 0:
    time.sleep(2)                         # still busy while the others have left
    report(rank=rank, done="late")
elif rank == 1:
    dist.destroy_process_group()
    report(rank=rank, done="destroyed")
    sys.exit(0)
else:
    report(rank=rank, done="fell off the end")
