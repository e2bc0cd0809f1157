"""Rank 2 of 3 kills itself (SIGKILL) 1 s into a loop of all_reduces; the others report their
error."""
import os
import signal
import threading
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

dist.init_process_group("gloo", timeout=60)
rank = dist.get_rank()
x = np.empty(1 << 18, np.float32)
if rank == 2:
    def killer():
        time.sleep(1.0)
        with open("killed_at", "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=killer, daemon=True).start()
done = 0
try:
    while True:
        x.fill(rank + 1)
        dist.all_reduce(x)
        if x[0] != 6 or x[-1] != 6:
            raise SystemExit(f"wrong result {x[0]}")
        done += 1
except CollectiveError as exc:
    report(done=done, **failure(exc))
