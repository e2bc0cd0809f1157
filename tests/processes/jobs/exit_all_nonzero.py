"""Under mpiexec: every rank exits with a code, which is no abort."""
import sys

import numpy as np

import collectives as dist
from reporting import report

dist.init_process_group("mpi", timeout=60)
x = np.ones(10)
dist.all_reduce(x)
report(rank=dist.get_rank(), done=True)
sys.exit(2)
