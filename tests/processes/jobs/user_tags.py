"""User tags (0 and 65536, received out of order) and the 65th group's own tags, under BACKEND
(socket or MPI)."""
import os

import numpy as np

import collectives as dist
from reporting import failure, report

dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=30)
rank = dist.get_rank()
peer = 1 - rank
if rank == 0:
    dist.send(np.full(4, 1.0), dst=1, tag=0)
    dist.send(np.full(4, 2.0), dst=1, tag=65536)
else:
    first, late = np.zeros(4), np.zeros(4)
    dist.recv(first, src=0, tag=65536)
    dist.recv(late, src=0, tag=0)
    report(rank=rank, first=float(first[0]), late=float(late[0]))
try:
    dist.send(np.ones(1), dst=peer, tag=2**40)
except ValueError as exc:
    report(rank=rank, **failure(exc))
groups = [dist.new_group() for _ in range(64)] if os.environ.get("GROUPS") else []
wrong = 0
for i in range(200 if groups else 0):
    a, b = np.full(64, float(i + rank)), np.full(64, 1000.0 * (i + rank))
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, group=groups[-1], async_op=True)
    wa.wait(); wb.wait()
    wrong += int(not (a == 2 * i + 1).all()) + int(not (b == 1000.0 * (2 * i + 1)).all())
report(rank=rank, wrong=wrong, groups=len(groups))
