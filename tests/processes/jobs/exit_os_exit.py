"""Under mpiexec: os._exit(3) on one rank ends the job with its code."""
import os
import time

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 0:
    report(rank=rank, leaving=time.time())
    os._exit(3)
dist.all_reduce(x)
report(rank=rank, unexpected="success")
