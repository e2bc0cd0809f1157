"""Ranks started with different world sizes: every rank fails naming both."""
import os
import time

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

t0 = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=float(os.environ.get("TIMEOUT", 60)))
    report(unexpected="joined")
except (ValueError, CollectiveError) as exc:
    report(waited=time.monotonic() - t0, **failure(exc))
