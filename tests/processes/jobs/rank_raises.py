"""Under mpiexec: a rank that raises aborts the job quickly, naming it."""
import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
dist.all_reduce(x)                 # the others wait here for rank 1
report(rank=rank, unexpected="finished")
