"""NaN and negative timeouts fail every rank before anything moves."""
import os

import numpy as np

import collectives as dist
from reporting import report

from datetime import timedelta

BAD = {"nan": float("nan"), "-1": -1, "timedelta(-1 s)": timedelta(seconds=-1)}
rank = int(os.environ["RANK"])


def refused(call):
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


for name, bad in BAD.items():
    said = refused(lambda: dist.init_process_group("gloo", timeout=bad))
    assert not dist.is_initialized()
    report(where="init_process_group", bad=name, said=said)
dist.init_process_group("gloo", timeout=30)
size = dist.get_world_size()
for name, bad in BAD.items():
    x = np.full(1024, rank + 1.0)
    report(where="all_reduce", bad=name, said=refused(lambda: dist.all_reduce(x, timeout=bad)),
           untouched=bool((x == rank + 1.0).all()))
    report(where="barrier", bad=name, said=refused(lambda: dist.barrier(timeout=bad)))
    report(where="new_group", bad=name,
           said=refused(lambda: dist.new_group(list(range(size)), timeout=bad)))
    work = dist.all_reduce(x, async_op=True)
    report(where="Work.wait", bad=name, said=refused(lambda: work.wait(timeout=bad)))
    work.wait()
    report(where="after", bad=name, ok=bool((x == size * (size + 1) / 2).all()))
dist.destroy_process_group()
