"""init_process_group, destroy, init again on the same MASTER_PORT."""
import numpy as np

import collectives as dist
from reporting import report

for round in range(3):
    dist.init_process_group("gloo", timeout=30)
    x = np.full(8, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    report(round=round, ok=bool((x == 3).all()))
    dist.destroy_process_group()
