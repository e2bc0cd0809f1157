"""The host executor: interprets a lowered plan (``algorithms.lowered``) on any transport with
host buffers: posts transfers, waits for them within the collective's deadline, runs local
copies and reductions. This is the reference executor; compiled ones must give the same bits.

Which program runs: the step walk (``lowered.stepwise``), or, for transports that move data
in the background and say so with ``segment_bytes``, when the plan has messages of at least
twice that many bytes, the overlapped program of the segmented plan (``lowered.overlapped``
over ``transforms.segmented``): each reduction waits only for the segments it reads, and the
next step's segments go out as soon as nothing left in this step conflicts with them. Plans
with no message that large run the step walk (small messages pay nothing for the mode). A
failure gives up (``Transport.cancel``) every transfer the call posted.
"""
from __future__ import annotations

import time

from ..algorithms import lowered
from ..algorithms.lowered import POST, WAIT, Chain
from ..algorithms.schedule import Copy, Plan
from ..algorithms.transforms import segmented
from ..errors import TIMED_OUT, CollectiveError, CollectiveTimeout


_UNMARKED: dict = {}        # no keyword for transports that carry no signature (never mutated)


def execute(plan: Plan, transport, buffers: dict, reduce=None, *, tag: int = 0,
            timeout: float | None = None, operation: str | None = None, dtype=None,
            op=None, signature: bytes | None = None) -> None:
    """Run ``plan`` over ``buffers`` ({'input': flat array, 'output': flat array}).

    ``reduce(dst, a, b)`` computes dst = a op b; it is needed only by plans that reduce.
    ``op`` (the ReduceOp) is for executors that reduce with kernels of their own.
    ``signature`` (given only to transports that carry one) goes with every message.
    Scratch is allocated here, with the dtype of the data.
    """
    mark = _UNMARKED if signature is None else {"signature": signature}
    arrays = dict(buffers)
    if dtype is None:
        dtype = next((a.dtype for a in arrays.values() if a is not None), None)
    if plan.scratch and "scratch" not in arrays:
        arrays["scratch"] = transport.xp.empty(plan.scratch, dtype=dtype)

    segment = getattr(transport, "segment_bytes", None)
    program = None
    if segment and dtype is not None:
        cut = _segmented_plan(plan, max(1, segment // transport.xp.dtype(dtype).itemsize))
        if cut is not plan:
            program = lowered.overlapped(cut)
    if program is None:
        program = lowered.stepwise(plan)

    def view(region):
        return arrays[region.buffer][region.offset:region.end]

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    posted = []
    index = 0
    try:
        for kind, index, what in program.code:
            if kind is POST:
                recvs, sends = what
                for r in recvs:
                    posted.append(transport.irecv(view(r.region), r.peer, tag, **mark))
                for s in sends:
                    posted.append(transport.isend(view(s.region), s.peer, tag, **mark))
            elif kind is WAIT:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                transport.wait_all(posted[what] if what.__class__ is slice
                                   else [posted[i] for i in what], left)
            else:
                for op in what:
                    if isinstance(op, Copy):
                        view(op.dst)[...] = view(op.src)
                    elif isinstance(op, Chain):     # a fused run: op by op gives its bits
                        for r in op.ops:
                            reduce(view(r.dst), view(r.a), view(r.b))
                    else:
                        reduce(view(op.dst), view(op.a), view(op.b))
    except CollectiveError as exc:
        transport.cancel(posted)
        raise _where(exc, program.plan, index, started, operation) from exc


def _where(exc, plan, index, started, operation):
    """The transport's message names the peer and the tag; say where in the schedule and, for
    a timeout, how long the whole collective waited (not just this step), in torch's words
    (TIMED_OUT: gloo's messages say it, and code and torch's own tests match it)."""
    waited = (f" {TIMED_OUT} after {time.monotonic() - started:.3g} s;"
              if isinstance(exc, CollectiveTimeout) else "")
    return type(exc)(f"{operation or plan.collective} ({plan.algorithm}) on rank "
                     f"{plan.rank}, step {index + 1} of {len(plan.steps)}:{waited} {exc}")


def _segmented_plan(plan: Plan, max_count: int) -> Plan:
    return plan.derived("_segmented", max_count, lambda: segmented(plan, max_count))
