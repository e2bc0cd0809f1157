"""Under mpiexec: an uncaught exception after destroy_process_group ends the job."""
import time

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
rank = dist.get_rank()
x = np.ones(1000)
dist.all_reduce(x)
if rank == 0:
    dist.destroy_process_group()           # takes the excepthook that aborts the job along
    report(rank=rank, leaving=time.time())
    raise RuntimeError("rank 0 fails after destroy_process_group")
time.sleep(120)                            # busy: neither leaves nor waits in a collective
report(rank=rank, unexpected="woke")
