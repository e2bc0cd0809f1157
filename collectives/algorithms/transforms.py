"""Plan transforms: rewrite a built plan without touching the algorithm that made it.

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

``windowed(plan, window)``: executors wait for all of a step's transfers before its local ops
and the next step, so a plan of independent exchanges (the pairwise all_to_all) pays one
round trip of latency per step. The transform merges runs of consecutive steps whose
transfers may be in flight together into one step (rule in its docstring): up to ``window``
message-carrying steps per merged step, so at most that many steps' requests are posted at
once. Pure data rule, per rank: ranks may disagree on the window (see ``windowed``).
"""
from __future__ import annotations

import bisect
import dataclasses
import operator

from .schedule import Copy, Plan, Reduce, Region, Send, Step


class _Written:
    """Which element ranges of ``output`` hold values the plan wrote (merged intervals)."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    def covered(self, lo: int, hi: int) -> int:
        """How many elements of [lo, hi) are written."""
        total = 0
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.starts) and self.starts[i] < hi:
            total += max(0, min(hi, self.ends[i]) - max(lo, self.starts[i]))
            i += 1
        return total

    def add(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        i = bisect.bisect_left(self.ends, lo)          # first interval that may touch [lo, hi)
        j = i
        while j < len(self.starts) and self.starts[j] <= hi:
            lo, hi = min(lo, self.starts[j]), max(hi, self.ends[j])
            j += 1
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def gaps(self, lo: int, hi: int):
        """The unwritten ranges of [lo, hi)."""
        at = lo
        for start, end in zip(self.starts, self.ends):
            if end <= at:
                continue
            if start >= hi:
                break
            if start > at:
                yield at, start
            at = max(at, end)
        if at < hi:
            yield at, hi


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
    written = _Written()

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


class _Touched:
    """Element ranges per buffer (merged intervals), asked only whether a region meets them."""

    def __init__(self):
        self.by_buffer: dict[str, _Written] = {}

    def add(self, region: Region) -> None:
        if region.count > 0:
            self.by_buffer.setdefault(region.buffer, _Written()).add(region.offset, region.end)

    def meets(self, region: Region) -> bool:
        ranges = self.by_buffer.get(region.buffer)
        # an empty region meets nothing (an empty range strictly inside another must not count)
        return region.count > 0 and ranges is not None and \
            ranges.covered(region.offset, region.end) > 0


def windowed(plan: Plan, window: int) -> Plan:
    """``plan`` with runs of consecutive steps merged into one step where that cannot change
    any result; ``plan`` itself when ``window <= 1`` or nothing merges. Cached on the plan
    object (dict lookup per call; plans come from build_plan's cache).

    A merged step posts the receives of its members, then their sends (each in member order),
    waits for all of them, then runs the members' local ops in member order. Against the step
    walk, a later member B's transfers now run concurrently with every earlier member A's
    transfers and before A's local ops. So B joins the run only if, for every earlier member A:

    * B's receives write nothing that A touches at all: not what A's sends read (A would send
      B's data, or race with it), not what A's receives write (which one lands last?), not
      what A's local ops read (they would see B's data) or write (they would overwrite B's);
    * B's sends read nothing that A writes: neither A's receives (a race with the arrival)
      nor A's local ops (B would send the value from before them).

    Nothing else changes order: A's transfers and local ops still precede B's local ops, and
    B's own transfers precede its own local ops. A later member C is held to the same rule
    against B's local ops, which now run after C's transfers. Hence the two sets kept per run:
    everything its members touch (receives, sends, local ops) and everything they write
    (receives, local ops). Regions meet when they share a buffer and an element.

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
    touched = written = None
    in_flight = 0                  # members of the current run that carry transfers

    for step in plan.steps:
        moves = bool(step.sends or step.recvs)
        joins = runs and (not moves or in_flight < window) \
            and not any(touched.meets(r.region) for r in step.recvs) \
            and not any(written.meets(s.region) for s in step.sends)
        if not joins:
            runs.append([])
            touched, written, in_flight = _Touched(), _Touched(), 0
        runs[-1].append(step)
        in_flight += moves
        for s in step.sends:
            touched.add(s.region)
        for r in step.recvs:
            touched.add(r.region)
            written.add(r.region)
        for op in step.local:
            for region in op:           # Copy and Reduce are tuples of regions, dst first
                touched.add(region)
            written.add(op.dst)

    if len(runs) == len(plan.steps):
        return plan
    steps = tuple(run[0] if len(run) == 1 else
                  Step(sends=tuple(s for member in run for s in member.sends),
                       recvs=tuple(r for member in run for r in member.recvs),
                       local=tuple(op for member in run for op in member.local))
                  for run in runs)
    return dataclasses.replace(plan, steps=steps)
