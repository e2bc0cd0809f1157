"""Ranks on an agent store that the test kills: once ranks 0 and 1 wait at the rendezvous
(a rank with AFTER_STORE_GONE starts only after that), or once every rank joined."""
import os
import time

import numpy as np

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

if os.environ.get("AFTER_STORE_GONE"):
    deadline = time.monotonic() + 30
    while not os.path.exists("store-gone") and time.monotonic() < deadline:
        time.sleep(0.01)
t0 = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=5)
    x = np.full(10, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    report(phase="joined", ok=bool((x == 3).all()))
    open(f"joined-{dist.get_rank()}", "w").close()
    deadline = time.monotonic() + 30      # the test kills the store once every rank joined
    while not os.path.exists("store-gone") and time.monotonic() < deadline:
        time.sleep(0.01)
    dist.all_reduce(x)                    # collectives do not need the store
    report(phase="after", ok=bool((x == 6).all()))
except CollectiveError as exc:
    report(waited=time.monotonic() - t0, **failure(exc))
