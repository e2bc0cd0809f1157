"""Plans lowered once into the program a host-style executor runs: post a transfer, wait for
some of the posted ones, run a local op. What may happen when is decided here, at lowering,
by the hazard rules (``hazards``); the executor only interprets, so one walker runs every mode.

Two lowerings, each cached on the plan:

``stepwise(plan)``: the step semantics exactly. Each step posts its receives, then its sends,
waits for all of them, then runs its local ops in order.

``overlapped(plan)``: for transports that move data in the background, usually over a
segmented plan (``transforms.segmented``). Each local op waits only for the posted transfers
it conflicts with (``hazards.conflict``: receives writing what it reads or writes, sends
reading what it writes), so the reduction of segment k runs while segments k+1.. still
arrive. The next step's transfers are posted, in order, as soon as nothing left in this step
conflicts with them (a ring's segment k goes on to the next rank right after its reduction,
as gloo's pipelined ring does). A receive waited for takes every earlier receive from its
peer along: some transports (local) match a receive to a message when it completes, not
when it is posted, so receives from one peer must complete in posting order. Each peer's
messages are posted in plan order, so they match as in the step walk; a step ends only when
all its own transfers are done.

A program is a tuple of instructions ``(kind, step, what)``: ``POST`` with ``(recvs, sends)``
(tuples of Recv/Send, posted receives first; requests are numbered in posting order),
``WAIT`` with the request numbers (a ``slice`` when they are consecutive), ``LOCAL`` with a
tuple of Copy/Reduce ops to run in order. ``step`` is the plan step the instruction belongs
to (for error messages). Consecutive posts and consecutive ops are one instruction each, so
an interpreter in Python pays its dispatch per step, not per message.
"""
from __future__ import annotations

from typing import NamedTuple

from . import hazards
from .schedule import Plan

POST, WAIT, LOCAL = "post", "wait", "local"


class Program(NamedTuple):
    plan: Plan
    code: tuple
    requests: int           # how many transfers it posts


def stepwise(plan: Plan) -> Program:
    """The step walk as a program (see the module)."""
    return plan.derived("_lowered", "stepwise", lambda: _stepwise(plan))


def overlapped(plan: Plan) -> Program:
    """Each op waiting only for what it conflicts with, later transfers posted early."""
    return plan.derived("_lowered", "overlapped", lambda: _overlapped(plan))


def _stepwise(plan):
    code, posted = [], 0
    for index, step in enumerate(plan.steps):
        if step.sends or step.recvs:
            first = posted
            code.append((POST, index, (step.recvs, step.sends)))
            posted += len(step.recvs) + len(step.sends)
            code.append((WAIT, index, slice(first, posted)))
        if step.local:
            code.append((LOCAL, index, step.local))
    return Program(plan, tuple(code), posted)


def _merged(code):
    """Consecutive posts, and consecutive local ops, of one step as one instruction."""
    out = []
    for kind, index, what in code:
        if out and out[-1][0] == kind == LOCAL and out[-1][1] == index:
            out[-1] = (LOCAL, index, out[-1][2] + what)
        elif out and out[-1][0] == kind == POST and out[-1][1] == index and \
                not out[-1][2][1]:              # receives only so far: posting order holds
            out[-1] = (POST, index, (out[-1][2][0] + what[0], what[1]))
        elif out and out[-1][0] == kind == POST and out[-1][1] == index and not what[0]:
            out[-1] = (POST, index, (out[-1][2][0], out[-1][2][1] + what[1]))
        else:
            out.append((kind, index, what))
    return out


def _overlapped(plan):
    code = []
    steps = plan.steps
    count = 0

    def post(transfer, is_receive, index):
        """Emit the post; the pending entry (number, access, is_receive, peer)."""
        nonlocal count
        code.append((POST, index, ((transfer,), ()) if is_receive else ((), (transfer,))))
        count += 1
        return count - 1, hazards.access(transfer), is_receive, transfer.peer

    early, early_recvs, early_sends = [], 0, 0      # the next step's transfers posted already
    for index, step in enumerate(steps):
        pending = early
        pending += [post(r, True, index) for r in step.recvs[early_recvs:]]
        pending += [post(s, False, index) for s in step.sends[early_sends:]]
        following = steps[index + 1] if index + 1 < len(steps) else None
        early, early_recvs, early_sends = [], 0, 0

        def look_ahead(remaining):
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
                    early.append(post(transfers[done], is_receive, index))
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
                    code.append((WAIT, index, tuple(e[0] for e in reversed(needed))))
                    pending = rest[::-1]
            code.append((LOCAL, index, (op,)))
            if following is not None:
                look_ahead(local[j + 1:])
        if pending:
            code.append((WAIT, index, tuple(e[0] for e in pending)))
    return Program(plan, tuple(_merged(code)), count)
