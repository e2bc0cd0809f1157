"""Under mpiexec: a rank that exits after a timeout ends the job."""
import sys
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveTimeout
from reporting import failure, report

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 1:
    time.sleep(120)                     # never makes the second call
    report(rank=rank, unexpected="woke")
else:
    try:
        dist.all_reduce(x, timeout=1)
        report(rank=rank, unexpected="success")
    except CollectiveTimeout as exc:
        report(rank=rank, leaving=time.time(), **failure(exc))
        sys.exit(1)
