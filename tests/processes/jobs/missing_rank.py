"""A rank that never arrives: named while the others wait and at the timeout."""
import time

import collectives as dist
from collectives.errors import CollectiveError
from reporting import failure, report

from collectives import debug
debug.Waiting.REPORT_SECONDS = 0.3         # the log's 5 s, shortened for the test
t0 = time.monotonic()
try:
    dist.init_process_group("gloo", timeout=2)
    report(unexpected="joined")
except CollectiveError as exc:
    report(waited=time.monotonic() - t0, **failure(exc))
