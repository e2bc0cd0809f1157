"""Run a job on the ``local`` backend: every rank a thread of this process.

``spawn_local(world_size, fn, *args)`` calls ``fn(rank, *args)`` on ``world_size`` threads,
each already inside ``init_process_group("local", ...)``, and returns their results in rank
order. A rank that raises aborts the LocalWorld, so the others fail fast instead of waiting
for it; the first failure (lowest rank) is re-raised here. Threads share the GIL, so this is
for correctness and research, not for timing.
"""
from __future__ import annotations

import threading
from datetime import timedelta

from .transports.local import LocalWorld


class RankFailed(RuntimeError):
    """Raised by spawn_local when a rank's function raised; ``__cause__`` is its error."""


def spawn_local(world_size: int, fn, *args, timeout=timedelta(seconds=60), **kwargs):
    """Run ``fn(rank, *args, **kwargs)`` on every rank of a ``local`` world, ranks as threads.

    Args:
        world_size (int): the number of ranks.
        fn (callable): the rank's program; the default group is initialized around it.
        timeout (timedelta, optional, keyword-only): bounds every collective's wait (torch's
            init timeout), so a mismatched program fails with CollectiveTimeout rather than
            hanging the caller.
        args, kwargs: passed to ``fn``.

    Returns:
        list: ``fn``'s results in rank order; a rank that raised makes it raise RankFailed.
    """
    from . import destroy_process_group, init_process_group, is_initialized
    world = LocalWorld(world_size)
    results = [None] * world_size
    errors: list = [None] * world_size

    def body(rank):
        try:
            init_process_group("local", rank=rank, world_size=world_size, store=world,
                               timeout=timeout)
            try:
                results[rank] = fn(rank, *args, **kwargs)
            finally:
                if is_initialized():
                    destroy_process_group()
        except BaseException as exc:   # reported to the caller below
            errors[rank] = exc
            world.abort(f"rank {rank} raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), name=f"local-rank{r}", daemon=True)
               for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r, e in enumerate(errors) if e is not None]
    if failed:
        # The first rank to fail on its own is the interesting one; the rest mostly report
        # the abort it caused (TransportError).
        from .errors import TransportError
        own = [r for r in failed if not isinstance(errors[r], TransportError)] or failed
        rank = own[0]
        raise RankFailed(f"rank {rank} of {world_size} failed: {type(errors[rank]).__name__}: "
                         f"{errors[rank]}") from errors[rank]
    return results
