"""Plan transforms: rewrite a built plan without touching the algorithm that made it. What
may be cut, merged or reordered is decided in ``hazards``.

``segmented(plan, max_count)``: large messages cut into pieces (segments), for executors that
overlap a reduction with the arrival of later pieces.

``read_input_first(plan)``: all_reduce and broadcast schedules work in ``output``, which the
caller must first fill with this rank's data. Out of place, that copy is a whole pass over
memory (a third of the time of a 64 MiB all_reduce on two ranks). The transform removes it:
any read of an output region that nothing has written yet reads the same offsets of ``input``
instead (its value is the same: output would hold a copy of input there), and output regions
that the plan never writes get one Copy from input at the end. A read of a region that is
partly written (some of it already holds results, some still input) cannot be redirected as a
whole, so the transform gives up and returns None; the caller then copies as before. For the
ring, ring_bidirectional, tree and recursive-doubling all_reduce every first read is of a
whole unwritten block, so the copy disappears: the first reduction becomes out of place
(dst = input op received).

``in_rounds(plan, max_count)`` (``rounds(step, max_count)`` per step): each step's messages
cut into pieces of at most ``max_count`` elements, each by its own size, and moved in rounds
(piece k of every message of the step in round k), for an executor that issues a step's
transfers as one group and overlaps the reduction of piece k with round k+1 (NCCL's
pipelined mode).

``windowed(plan, window)``: executors wait for all of a step's transfers before its local ops
and the next step, so a plan of independent exchanges (the pairwise all_to_all) pays one
round trip of latency per step. The transform merges runs of consecutive steps whose
transfers may be in flight together into one step (rule in its docstring): up to ``window``
message-carrying steps per merged step, so at most that many steps' requests are posted at
once. Pure data rule, per rank: ranks may disagree on the window (see ``windowed``).
"""
from __future__ import annotations

import dataclasses
import functools
import operator

from . import hazards
from .schedule import Copy, Plan, Recv, Reduce, Region, Send, Step


# ---------------------------------------------------------------------------------------------
# segmented: large messages cut into pieces


@functools.lru_cache(maxsize=1024)
def segmented(plan: Plan, max_count: int) -> Plan:
    """``plan`` with every transfer of at least ``2 * max_count`` elements cut into segments of
    ``max_count .. 2 * max_count - 1`` elements, and every local op that can be cut
    (``hazards.cuttable``) cut by the same rule, so segment k of a reduction reads exactly
    segment k of its landing zone. Pieces replace their message in place: messages between a
    pair keep their order and the pieces of one message follow each other, on both sides
    alike (FIFO per pair and tag keeps them matched). The result means the same as ``plan``
    under the step semantics; executors that wait per piece overlap reductions with later
    pieces. Cached like ``build_plan`` (a plan is hashable); ``plan`` itself is returned when
    nothing is large enough to cut."""
    if max_count < 1:
        raise ValueError(f"segmented: max_count must be >= 1, got {max_count}")

    def pieces(region, n):
        return [hazards.cut(region, k, n) for k in range(n)]

    steps, changed = [], False
    for step in plan.steps:
        sends, recvs, local = [], [], []
        for send_ in step.sends:
            n = hazards.pieces_of_at_least(send_.region.count, max_count)
            sends.extend(Send(send_.peer, r) for r in pieces(send_.region, n))
        for recv_ in step.recvs:
            n = hazards.pieces_of_at_least(recv_.region.count, max_count)
            recvs.extend(Recv(recv_.peer, r) for r in pieces(recv_.region, n))
        for op in step.local:
            n = hazards.pieces_of_at_least(op[0].count, max_count) \
                if hazards.cuttable(op) else 1
            if n == 1:
                local.append(op)
            else:
                local.extend(type(op)(*parts) for parts in zip(*(pieces(r, n) for r in op)))
        if len(sends) != len(step.sends) or len(recvs) != len(step.recvs) \
                or len(local) != len(step.local):
            changed = True
            step = Step(tuple(sends), tuple(recvs), tuple(local))
        steps.append(step)
    if not changed:
        return plan
    return dataclasses.replace(plan, steps=tuple(steps))


# ---------------------------------------------------------------------------------------------
# in_rounds: each step's messages cut by their own size and moved in rounds


def rounds(step: Step, max_count: int) -> tuple[Step, ...]:
    """``step`` as consecutive steps (rounds) meaning what it means under the step semantics.
    Each message is cut into ``hazards.pieces_of_at_most(count, max_count)`` pieces by its own
    count, so sender and receiver cut it alike whatever else their steps hold; round k moves
    piece k of every message of the step (sends and receives in step order; empty pieces
    dropped). The step's local ops follow its transfers: when ``hazards.splittable(step)``
    they are cut by the same rule, piece k of each (in op order) in round k, so a reduction
    of piece k needs only round k's transfers; otherwise each runs whole in the last round.
    Every piece of every op runs: a step of local ops alone, or ops longer than its messages,
    has as many rounds as its longest op has pieces. Rounds with nothing in them are left
    out. ``max_count`` is in elements, >= 1."""
    if max_count < 1:
        raise ValueError(f"rounds: max_count must be >= 1, got {max_count}")

    def pieces(count):
        return hazards.pieces_of_at_most(count, max_count)

    sends = [(s, pieces(s.region.count)) for s in step.sends]
    recvs = [(r, pieces(r.region.count)) for r in step.recvs]
    split = hazards.splittable(step)
    cuts = [(op, pieces(op[0].count)) for op in step.local] if split else []
    total = max([n for _, n in sends + recvs + cuts] + [1])
    out = []
    for k in range(total):
        round_sends = tuple(Send(s.peer, r) for s, n in sends if k < n
                            for r in (hazards.cut(s.region, k, n),) if r.count)
        round_recvs = tuple(Recv(t.peer, r) for t, n in recvs if k < n
                            for r in (hazards.cut(t.region, k, n),) if r.count)
        local = tuple(piece for op, n in cuts if k < n
                      for piece in (type(op)(*(hazards.cut(r, k, n) for r in op)),)
                      if piece[0].count)
        if not split and k == total - 1:
            local = step.local
        if round_sends or round_recvs or local:
            out.append(Step(round_sends, round_recvs, local))
    return tuple(out)


def in_rounds(plan: Plan, max_count: int) -> Plan:
    """``plan`` with each step replaced by its ``rounds`` (see there); cached on the plan."""
    if max_count < 1:
        raise ValueError(f"in_rounds: max_count must be >= 1, got {max_count}")
    return plan.derived("_in_rounds", max_count, lambda: dataclasses.replace(
        plan, steps=tuple(r for step in plan.steps for r in rounds(step, max_count))))


# ---------------------------------------------------------------------------------------------
# read_input_first: out-of-place all_reduce without the input -> output copy


class _GiveUp(Exception):
    pass


def read_input_first(plan: Plan, count: int) -> Plan | None:
    """The plan reading unwritten output from ``input`` (see the module), or None.
    ``count`` is the length of output. Cached on the plan object."""
    cached = plan.__dict__.get("_read_input_first", _MISSING)
    if cached is _MISSING:
        try:
            cached = _rewrite(plan, count)
        except _GiveUp:
            cached = None
        object.__setattr__(plan, "_read_input_first", cached)
    return cached


_MISSING = object()


def _rewrite(plan: Plan, count: int) -> Plan:
    written = hazards.Ranges()

    def read(region: Region) -> Region:
        if region.buffer != "output" or region.count == 0:
            return region
        done = written.covered(region.offset, region.end)
        if done == 0:
            return Region("input", region.offset, region.count)
        if done == region.count:
            return region
        raise _GiveUp

    def write(region: Region) -> None:
        if region.buffer == "output":
            written.add(region.offset, region.end)

    steps = []
    for step in plan.steps:
        sends = tuple(Send(s.peer, read(s.region)) for s in step.sends)
        for r in step.recvs:
            write(r.region)
        local = []
        for op in step.local:
            if isinstance(op, Copy):
                local.append(Copy(read(op.src), op.dst))
            else:
                local.append(Reduce(op.dst, read(op.a), read(op.b)))
            write(op.dst)
        steps.append(Step(sends, step.recvs, tuple(local)))
    rest = tuple(Copy(Region("input", lo, hi - lo), Region("output", lo, hi - lo))
                 for lo, hi in written.gaps(0, count))
    if rest:
        steps.append(Step(local=rest))
    return dataclasses.replace(plan, steps=tuple(steps))


# ---------------------------------------------------------------------------------------------
# windowed: several independent steps in flight at once


def windowed(plan: Plan, window: int) -> Plan:
    """``plan`` with runs of consecutive steps merged into one step where that cannot change
    any result; ``plan`` itself when ``window <= 1`` or nothing merges. Cached on the plan
    object (dict lookup per call; plans come from build_plan's cache).

    A merged step posts the receives of its members, then their sends (each in member order),
    waits for all of them, then runs the members' local ops in member order. Against the step
    walk, a later member B's transfers now run concurrently with every earlier member A's
    transfers and before A's local ops. So B joins the run only if, for every earlier member A:

    B's transfers conflict with nothing of A (``hazards.conflict``): B's receives write
    nothing A reads or writes (A's sends, receives and local ops), and B's sends read nothing
    A writes (A's receives and local ops).

    Nothing else changes order: A's transfers and local ops still precede B's local ops, and
    B's own transfers precede its own local ops. A later member C is held to the same rule
    against B's local ops, which now run after C's transfers. Hence one footprint per run:
    everything its members read and write.

    ``window`` counts the members that carry transfers (steps with only local ops join for
    free: they add nothing in flight), so a run posts at most ``window`` steps' requests. Runs
    are greedy from the first step; a step that may not join starts the next run, so steps
    never reorder.

    Matching: a run keeps each peer's sends and each peer's receives in plan order, and every
    transport matches messages between a pair with one tag in posting order (MPI's
    non-overtaking rule; the socket transport's per-peer queues; the local transport and the
    host executors complete receives from one peer in posting order). So the other side of a
    message need not merge alike: ranks may use different windows. Posting earlier never
    delays a peer, and a rank leaves a run only when its last member's transfers are done,
    as before, so a deadlock-free plan stays deadlock-free.

    Barrier plans are returned unchanged: their one-element token messages carry no data
    dependences the rule could see, and their ordering is the whole point."""
    if isinstance(window, bool):
        raise TypeError("windowed: window must be an int, got bool")
    try:
        window = operator.index(window)
    except TypeError:
        raise TypeError(f"windowed: window must be an int, got {type(window).__name__}") from None
    if window <= 1 or plan.collective == "barrier" or len(plan.steps) < 2:
        return plan
    return plan.derived("_windowed", window, lambda: _merge_runs(plan, window))


def _merge_runs(plan: Plan, window: int) -> Plan:
    runs: list[list[Step]] = []
    footprint = None
    in_flight = 0                  # members of the current run that carry transfers

    for step in plan.steps:
        moves = bool(step.sends or step.recvs)
        transfers = [hazards.access(t) for t in step.recvs + step.sends]
        joins = runs and (not moves or in_flight < window) \
            and not any(footprint.conflicts(t) for t in transfers)
        if not joins:
            runs.append([])
            footprint, in_flight = hazards.Footprint(), 0
        runs[-1].append(step)
        in_flight += moves
        for accessed in transfers:
            footprint.add(accessed)
        for op in step.local:
            footprint.add(hazards.access(op))

    if len(runs) == len(plan.steps):
        return plan
    steps = tuple(run[0] if len(run) == 1 else
                  Step(sends=tuple(s for member in run for s in member.sends),
                       recvs=tuple(r for member in run for r in member.recvs),
                       local=tuple(op for member in run for op in member.local))
                  for run in runs)
    return dataclasses.replace(plan, steps=steps)
