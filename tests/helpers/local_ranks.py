"""Ranks as threads of this process on the local backend, with a timeout short enough that a
mismatched program fails the test in seconds instead of hanging it."""
from datetime import timedelta

import collectives as dist

TIMEOUT = timedelta(seconds=20)


def spawn(n, fn, *args):
    """``fn(rank, *args)`` on n threads, each inside ``init_process_group("local")``; the
    results in rank order (``collectives.testing.spawn_local``)."""
    return dist.spawn_local(n, fn, *args, timeout=TIMEOUT)
