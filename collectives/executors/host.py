"""The host executor: walks a plan step by step on any transport with host buffers.

Each step posts its receives first (so eager transports can land data directly), then its
sends, waits for all of them within the collective's deadline, then runs its local copies and
reductions. This is the reference executor; compiled ones must give the same bits.

Overlapped mode, for transports that move data in the background (a progress thread) and say
so with ``segment_bytes``: messages of at least twice that many bytes are cut into segments
(``transforms.segmented``, cached per plan), and within a step each local op waits only for
the transfers it conflicts with (``hazards.conflict``: receives writing what it reads or
writes, sends reading what it writes) before it runs. So the reduction of segment k runs while segments k+1.. are
still arriving (numpy releases the GIL on large ufuncs). The next step's transfers are posted
as soon as nothing left in this step can touch them (a ring's segment k goes on to the next
rank right after its reduction, as gloo's pipelined ring does); each peer's messages are still
posted in plan order, so they match as in the plain walk. A step ends only when all its own
transfers are done. Plans with no message that large run the plain walk (small messages pay
nothing for the mode).
"""
from __future__ import annotations

import time

from ..algorithms import hazards
from ..algorithms.schedule import Copy, Plan
from ..algorithms.transforms import segmented
from ..errors import CollectiveError, CollectiveTimeout
from ..transports.base import finish


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
    if segment and dtype is not None:
        cut = _segmented_plan(plan, max(1, segment // transport.xp.dtype(dtype).itemsize))
        if cut is not plan:
            return _overlapped(cut, transport, arrays, reduce, tag, timeout, operation, mark)

    def view(region):
        return arrays[region.buffer][region.offset:region.end]

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    for index, step in enumerate(plan.steps):
        if step.sends or step.recvs:
            requests = []
            try:
                for r in step.recvs:
                    requests.append(transport.irecv(view(r.region), r.peer, tag, **mark))
                for s in step.sends:
                    requests.append(transport.isend(view(s.region), s.peer, tag, **mark))
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                finish(transport, requests, left)
            except CollectiveError as exc:
                transport.cancel(requests)
                raise _where(exc, plan, index, started, operation) from exc
        for op in step.local:
            if isinstance(op, Copy):
                view(op.dst)[...] = view(op.src)
            else:
                reduce(view(op.dst), view(op.a), view(op.b))


def _where(exc, plan, index, started, operation):
    """The transport's message names the peer and the tag; say where in the schedule and, for
    a timeout, how long the whole collective waited (not just this step)."""
    waited = (f", after {time.monotonic() - started:.3g} s"
              if isinstance(exc, CollectiveTimeout) else "")
    return type(exc)(f"{operation or plan.collective} ({plan.algorithm}) on rank "
                     f"{plan.rank}, step {index + 1} of {len(plan.steps)}{waited}: {exc}")


def _segmented_plan(plan: Plan, max_count: int) -> Plan:
    return plan.derived("_segmented", max_count, lambda: segmented(plan, max_count))


def _overlapped(plan, transport, arrays, reduce, tag, timeout, operation, mark):
    """The step walk, with each local op waiting only for the transfers it depends on, and
    the next step's transfers posted as soon as nothing left in this step can touch them."""
    def view(region):
        return arrays[region.buffer][region.offset:region.end]

    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    index = 0
    posted = []         # every request, so that a failure gives up all that are pending

    def wait(requests):
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            transport.wait_all(requests, left)
        except CollectiveError as exc:
            transport.cancel(posted)
            raise _where(exc, plan, index, started, operation) from exc

    def post(transfer, is_receive):
        try:
            if is_receive:
                req = transport.irecv(view(transfer.region), transfer.peer, tag, **mark)
            else:
                req = transport.isend(view(transfer.region), transfer.peer, tag, **mark)
        except CollectiveError as exc:
            transport.cancel(posted)
            raise _where(exc, plan, index, started, operation) from exc
        posted.append(req)
        # (request, its access, is_receive, peer)
        return req, hazards.access(transfer), is_receive, transfer.peer

    steps = plan.steps
    early, early_recvs, early_sends = [], 0, 0      # the next step's transfers posted already
    for index, step in enumerate(steps):
        pending = early
        pending += [post(r, True) for r in step.recvs[early_recvs:]]
        pending += [post(s, False) for s in step.sends[early_sends:]]
        following = steps[index + 1] if index + 1 < len(steps) else None
        early, early_recvs, early_sends = [], 0, 0

        def look_ahead(remaining):
            """Post the following step's transfers, in order, while they conflict with
            nothing still to happen in this step (pending transfers, remaining ops). Posting
            earlier never blocks (only transports that progress in the background run this
            mode) and keeps each peer's messages in plan order."""
            nonlocal early_recvs, early_sends
            if following is None:
                return
            later = [e[1] for e in pending] + [hazards.access(op) for op in remaining]
            for transfers, is_receive in ((following.recvs, True), (following.sends, False)):
                done = early_recvs if is_receive else early_sends
                while done < len(transfers):
                    accessed = hazards.access(transfers[done])
                    if any(hazards.conflict(accessed, other) for other in later):
                        break
                    early.append(post(transfers[done], is_receive))
                    done += 1
                if is_receive:
                    early_recvs = done
                else:
                    early_sends = done

        local = step.local
        look_ahead(local)
        for j, op in enumerate(local):
            if pending:
                accessed = hazards.access(op)
                # A receive needed now takes every earlier receive from its peer along: some
                # transports (local) match a receive to a message when it completes, not when
                # it is posted, so receives from one peer must complete in posting order.
                needed, rest, peers = [], [], set()
                for entry in reversed(pending):
                    _, transfer, is_receive, peer = entry
                    if (is_receive and (peer in peers or -1 in peers)) or \
                            hazards.conflict(transfer, accessed):
                        needed.append(entry)
                        if is_receive:
                            peers.add(peer)
                    else:
                        rest.append(entry)
                if needed:
                    wait([e[0] for e in reversed(needed)])
                    pending = rest[::-1]
            if isinstance(op, Copy):
                view(op.dst)[...] = view(op.src)
            else:
                reduce(view(op.dst), view(op.a), view(op.b))
            if following is not None:
                look_ahead(local[j + 1:])
        if pending:
            wait([e[0] for e in pending])
