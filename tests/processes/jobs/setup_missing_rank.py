"""init_process_group with a rank that never starts: a timeout naming it."""
import time

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

t0 = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=2)
    report(unexpected="joined")
except CollectiveError as exc:
    report(waited=time.monotonic() - t0, **failure(exc))
