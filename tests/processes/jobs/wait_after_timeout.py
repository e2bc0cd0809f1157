"""A wait after a timeout completes with the data (socket or MPI, BACKEND)."""
import os
import sys

import collectives as dist
from reporting import report

sys.path[:0] = [os.environ["TESTS"], os.environ["HELPERS_DIR"]]   # this module and its helpers
from test_reliability_corruption import _wait_again
dist.init_process_group(os.environ.get("BACKEND", "gloo"), timeout=30)
rank = dist.get_rank()
import test_reliability_corruption as here
here.short = dist.new_group([0, 1], timeout=0.3)
report(rank=rank, got=_wait_again(rank))
