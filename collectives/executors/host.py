"""The host executor: walks a plan step by step on any transport with host buffers.

Each step posts its receives first (so eager transports can land data directly), then its
sends, waits for all of them within the collective's deadline, then runs its local copies and
reductions. This is the reference executor; compiled ones must give the same bits.
"""
from __future__ import annotations

import time


from ..algorithms.schedule import Copy, Plan
from ..errors import CollectiveError, CollectiveTimeout


def execute(plan: Plan, transport, buffers: dict, reduce=None, *, tag: int = 0,
            timeout: float | None = None, operation: str | None = None, dtype=None,
            op=None) -> None:
    """Run ``plan`` over ``buffers`` ({'input': flat array, 'output': flat array}).

    ``reduce(dst, a, b)`` computes dst = a op b; it is needed only by plans that reduce.
    ``op`` (the ReduceOp) is for executors that reduce with kernels of their own.
    Scratch is allocated here, with the dtype of the data.
    """
    arrays = dict(buffers)
    if plan.scratch and "scratch" not in arrays:
        if dtype is None:
            dtype = next(a.dtype for a in arrays.values() if a is not None)
        arrays["scratch"] = transport.xp.empty(plan.scratch, dtype=dtype)

    def view(region):
        return arrays[region.buffer][region.offset:region.end]

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    for index, step in enumerate(plan.steps):
        try:
            if step.sends or step.recvs:
                requests = [transport.irecv(view(r.region), r.peer, tag) for r in step.recvs]
                requests += [transport.isend(view(s.region), s.peer, tag) for s in step.sends]
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                transport.wait_all(requests, left)
        except CollectiveError as exc:
            # The transport's message names the peer and the tag; say where in the schedule
            # and, for a timeout, how long the whole collective waited (not just this step).
            waited = (f", after {time.monotonic() - started:.3g} s"
                      if isinstance(exc, CollectiveTimeout) else "")
            raise type(exc)(f"{operation or plan.collective} ({plan.algorithm}) on rank "
                            f"{plan.rank}, step {index + 1} of {len(plan.steps)}{waited}: "
                            f"{exc}") from exc
        for op in step.local:
            if isinstance(op, Copy):
                view(op.dst)[...] = view(op.src)
            else:
                reduce(view(op.dst), view(op.a), view(op.b))
