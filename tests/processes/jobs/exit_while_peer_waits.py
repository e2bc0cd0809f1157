"""Under mpiexec: a rank exits normally while its peer waits in a collective."""
import time

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 1:
    report(rank=rank, leaving=time.time())  # a normal exit, without the second call
else:
    dist.all_reduce(x)                    # waits for rank 1 (up to the 60 s timeout)
    report(rank=rank, unexpected="success")
