"""One rank's push program (``pushed.lower``), built in named steps: the plans checked; where
every message lands (``_landings``); then this rank's rows (``_RankLowering``): the first
epoch and the staged output's values copied in, each step in turn (its epoch, its sends, its
local ops and receives, fused where they may be), the staged output copied out and the
seeded output's rest filled; then the passes over the rows (``pushed_passes``) and the
table. ``pushed``'s module text says what the lowering decides and why.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..kernels.peer_protocol import (ARRIVE, BARRIER, CALLER_OUTPUT, COPY, EPOCH, INBOX, INPUT,
                                     KIND, OUTPUT, PUSH, REDUCE, REDUCE_LL, REDUCE_N, SCRATCH,
                                     SEND, SEND_LL, SLOT_ALIGN, TAKE, TAKE_LL,
                                     TAKE_REDUCE, WIDTH, buffer_operand, line_operand)
from . import hazards
from .pushed_passes import (_apart_from_receives, _chains, _copies_out, _direct, _fused_at,
                            _inbox_runs, _may_land_directly, _read_before_written, _read_later,
                            _run_with_their_first, _send_on, _writes_to_output)
from .schedule import Copy, Plan, Region, buffer_sizes

_BUFFER = {"input": INPUT, "output": OUTPUT, "scratch": SCRATCH}


class Program(NamedTuple):
    code: np.ndarray          # (n, WIDTH) int64
    output_staged: bool       # this rank's output lives in the staging memory
    staged_output: int        # elements of output the staging memory must hold (0 if not staged)
    scratch: int              # elements of scratch
    sends: tuple              # messages this rank sends to each peer in one call
    recvs: tuple              # messages it receives from each peer in one call
    largest: int              # elements of the largest message of any rank
    busiest: int              # elements the busiest rank sends in its busiest step (for
                              # ``blocks``: a worker moves its share of every message of a step)
    scratch_at: int           # where scratch starts in every rank's staging memory, in
                              # elements (after the largest staged output of any rank)
    scratch_max: int          # the largest scratch of any rank (then the inboxes)
    inbox: int                # elements of one inbox half (the largest of any rank)
    line_inbox: int           # elements of one half of the inbox of messages in lines
    direct: bool = False      # eager messages into output land there directly (``_direct``)

    @property
    def staging(self) -> bool:
        """Some rank's plan stages its output (where that output is not symmetric): alike on
        every rank, what the executor's size limit looks at."""
        return self.scratch_at > 0


def _output_count(plan):
    """Elements of the caller's output on ``plan``'s rank (what a staged output copies out)."""
    if plan.collective == "barrier":
        return 0
    return buffer_sizes(plan.collective, plan.rank, plan.size, *plan.args)[1]


def staged(plan: Plan, eager: int = 0) -> bool:
    """Whether some rendezvous receive of ``plan`` (more than ``eager`` elements) lands in
    output; then output is staged (a peer writes it). Eager receives land in the inbox and
    are copied out by the receiver itself, so they can go straight to the caller's output."""
    return any(r.region.buffer == "output" and r.region.count > eager
               for step in plan.steps for r in step.recvs)


def operand(region: Region) -> int:
    """A REDUCE_N operand in one column: its offset and buffer (``_BUFFER``)."""
    return buffer_operand(_BUFFER[region.buffer], region.offset)


def inbox_operand(slot: int) -> int:
    """A REDUCE_N operand that is an eager message in this call's half of the inbox."""
    return buffer_operand(INBOX, slot)


def _message_operand(received_as, lines: int) -> int:
    """The REDUCE_N operand of a message read out of the inbox: ``received_as`` is its
    (receive, slot, k)."""
    r, slot, _ = received_as
    return line_operand(slot, r.peer) if r.region.count <= lines else inbox_operand(slot)


def _staged_output(plan, eager):
    if not staged(plan, eager):
        return 0
    end = max((region.end for step in plan.steps for region in _regions(step)
               if region.buffer == "output"), default=0)
    return max(end, _output_count(plan))


def _regions(step):
    for t in step.sends + step.recvs:
        yield t.region
    for op in step.local:
        yield from op


class _Barriers:
    """Places barriers between the accesses of one rank's program. Every worker moves its
    share of each region, and a share depends only on the region's count (``share``), so an
    access that conflicts with an earlier one only on the very same region needs the
    worker's own threads in order (a block barrier, ``grid`` 0); one that conflicts on
    elements another worker may have moved needs every worker done first (a grid barrier,
    ``grid`` 1). Grid barriers cost microseconds on a GPU, block barriers nanoseconds."""

    KEPT = 64            # accesses remembered since the last grid barrier (bounds the scan)

    def __init__(self, emit):
        self.emit = emit
        self.unordered = []          # accesses since the last barrier of either kind
        self.apart = []              # since the last grid barrier
        self.last = None             # the access ordered last, for the row that makes it

    def take(self):
        """The access ``before`` ordered last (None if taken already): the emitted row's."""
        last, self.last = self.last, None
        return last

    def before(self, accessed, step):
        if len(self.apart) >= self.KEPT or any(
                hazards.ordering(a, accessed) == hazards.ACROSS for a in self.apart):
            self.grid(step)
        elif any(hazards.ordering(a, accessed) for a in self.unordered):
            self.emit(BARRIER.row(step, grid=0))
            self.unordered = []
        self.unordered.append(accessed)
        self.apart.append(accessed)
        self.last = accessed

    def clear_of(self, accessed):
        """Whether no access since the last grid barrier conflicts with any of ``accessed``
        (then every worker may be anywhere since that barrier without touching them)."""
        return len(self.apart) < self.KEPT and not any(
            hazards.ordering(a, x) for a in self.apart for x in accessed)

    def grid(self, step):
        self.emit(BARRIER.row(step, grid=1))
        self.unordered = []
        self.apart = []


def _numbered(recvs, received=None):
    """(k, recv): each receive with its number among this call's receives from its peer."""
    seen = {}
    for r in recvs:
        k = (received[r.peer] if received else 0) + seen.get(r.peer, 0)
        seen[r.peer] = seen.get(r.peer, 0) + 1
        yield k, r


def lower_rank(plan: Plan, plans, eager, lines, seeded, symmetric, direct) -> Program:
    """The push program of ``plan`` (``pushed.lower``'s, uncached), ``plans`` every rank's
    plan of the call (checked: ``pushed._check``); ValueError where a message's two ends
    disagree."""
    landing, inboxes, line_inboxes = _landings(plans, eager, lines)
    rank = _RankLowering(plan, landing, eager, lines, seeded, symmetric, direct)
    rank.start()
    for index, step in enumerate(plan.steps):
        rank.epoch(index, step)
        for s in step.sends:
            rank.send(index, s)
        rank.locals_and_receives(index, step)
    rank.finish()
    direct = direct and symmetric and _direct(rank.code, rank.touched, rank.into_output)
    code = _send_on(rank.code, rank.touched, rank.posted)
    table = np.zeros((len(code), WIDTH), np.int64)
    for i, row in enumerate(code):
        table[i, :len(row)] = row
    table.flags.writeable = False
    largest = max((t.region.count for other in plans for step in other.steps
                   for t in step.sends), default=0)
    busiest = max((sum(t.region.count for t in step.sends) for other in plans
                   for step in other.steps), default=0)
    outputs = [_staged_output(other, eager) for other in plans]
    return Program(table, rank.out_staged, outputs[plan.rank], plan.scratch, tuple(rank.sent),
                   tuple(rank.received), largest, busiest, max(outputs),
                   max(other.scratch for other in plans), max(inboxes), max(line_inboxes),
                   direct)


def _landings(plans, eager, lines):
    """(landing, inboxes, line_inboxes): where each receiver's k-th message from each sender
    lands, {(src, dst): [(its step, region, its inbox slot, or -1 if it is not eager)]}, and
    the elements of each rank's inbox and inbox of lines. Messages in lines have an inbox of
    their own: a line counts as arrived when its flag half holds the call's number, so no
    other kind of message may ever have written those bytes (plain data of an earlier call
    could hold the number and pass for a line)."""
    landing = {}
    inboxes, line_inboxes = [], []
    for other in plans:
        inbox = in_lines = 0
        for index, step in enumerate(other.steps):
            for r in step.recvs:
                slot, count = -1, r.region.count
                if count <= lines:            # 8 bytes of line per 4 bytes of data
                    slot = in_lines
                    in_lines += -(-(2 * -(-count // 4) * 4) // SLOT_ALIGN) * SLOT_ALIGN
                elif count <= eager:
                    slot = inbox
                    inbox += -(-count // SLOT_ALIGN) * SLOT_ALIGN
                landing.setdefault((r.peer, other.rank), []).append((index, r.region, slot))
        inboxes.append(inbox)
        line_inboxes.append(in_lines)
    return landing, inboxes, line_inboxes


class _RankLowering:
    """The rows of one rank's program as they are emitted, with what emitting them needs to
    know: the barriers so far (``order``), what the plan has written of output, which staged
    output regions are final, the messages sent to and received from each peer so far."""

    def __init__(self, plan, landing, eager, lines, seeded, symmetric, direct):
        self.plan, self.landing = plan, landing
        self.eager, self.lines, self.seeded = eager, lines, seeded
        self.symmetric, self.direct = symmetric, direct
        rank, size = plan.rank, plan.size
        # A rank publishes its epoch where some sender waits for it: at its first step (eager
        # senders wait for the previous call's) and where a receive is not eager.
        self.waited = {0} | {index for pairs in (p for (src, dst), p in landing.items()
                                                 if dst == rank)
                             for index, _, slot in pairs if slot < 0}
        self.mine = {}                        # (src, k) -> slot, for this rank's receives
        for (src, dst), pairs in landing.items():
            if dst == rank:
                for k, (_, _, slot) in enumerate(pairs):
                    self.mine[src, k] = slot
        self.code = []
        self.touched = []      # per row: its access (``_Barriers.before``'s), None for
                               # barriers, epochs and what reads only the inbox
        self.posted = {}       # step -> the accesses of this rank's rendezvous receives in it
        self.order = _Barriers(self.emit)
        self.out_staged = staged(plan, eager) and not symmetric
        self.written = hazards.Ranges()       # output the plan has written so far
        self.regions_written = {}             # ... region by region, as an ordered set
        # staged output regions still to be written, with how many of the plan's writes
        # remain: each is copied out to the caller's output right after its last write,
        # while later messages still travel (where the written regions tile the output)
        self.remaining = _writes_to_output(plan) if self.out_staged else {}
        self.out_early = set()
        # with ``direct`` into a symmetric output, eager receives that may land there
        # directly (``_may_land_directly``): where each is taken (its TAKE row), or None
        # where the plan reads it out of the inbox
        self.into_output = []
        self.sent = [0] * size
        self.received = [0] * size
        self.early = False                    # the first epoch published before anything

    def emit(self, row):
        self.code.append(row)
        self.touched.append(self.order.take() if row[KIND] != BARRIER else None)

    def done(self, index, *regions):
        """The plan's writes of ``regions`` have been emitted: copy out what is final."""
        for region in regions:
            if region in self.remaining:
                self.remaining[region] -= 1
                if not self.remaining[region]:
                    self.order.before(((region,), ()), index)
                    self.emit(COPY.row(index, dst_buffer=CALLER_OUTPUT,
                                       dst_offset=region.offset, src_buffer=OUTPUT,
                                       src_offset=region.offset, count=region.count))
                    self.out_early.add(region)

    def read(self, region):
        """The region to read for ``region`` (input where seeded output is not written)."""
        if not self.seeded or region.buffer != "output":
            return region
        gaps = list(self.written.gaps(region.offset, region.end))
        if gaps == [(region.offset, region.end)]:
            return Region("input", region.offset, region.count)
        for lo, hi in gaps:                   # partly written: the rest copied in first
            copied = (Region("input", lo, hi - lo),), (Region("output", lo, hi - lo),)
            self.order.before(copied, -1)
            self.emit(COPY.row(-1, dst_buffer=OUTPUT, dst_offset=lo, src_buffer=INPUT,
                               src_offset=lo, count=hi - lo))
            self.written.add(lo, hi)
            self.regions_written[Region("output", lo, hi - lo)] = None
        return region

    def wrote(self, *regions):
        for region in regions:
            if region.buffer == "output":
                self.written.add(region.offset, region.end)
                self.regions_written[region] = None

    def start(self):
        """The first epoch, where it says only "this call has started" (no rendezvous
        receive lands in step 0: published before anything else, it needs no barrier); the
        caller's output values a staged output reads before writing them, copied in."""
        plan = self.plan
        self.early = 0 in self.waited and all(
            self.mine[r.peer, k] >= 0 for k, r in _numbered(plan.steps[0].recvs)) \
            if plan.steps else False
        if self.early:
            self.emit(EPOCH.row(0, published=0, first=1))
        for lo, hi in _read_before_written(plan) if self.out_staged and not self.seeded else []:
            copied = Region("output", lo, hi - lo)       # the caller's output values, staged
            self.order.before(((copied,), (copied,)), -1)
            self.emit(COPY.row(-1, dst_buffer=OUTPUT, dst_offset=lo, src_buffer=CALLER_OUTPUT,
                               src_offset=lo, count=hi - lo))

    def epoch(self, index, step):
        """Step ``index``'s epoch where some sender waits for it: every worker done with
        what the receives overwrite first (a grid barrier, unless no worker has touched
        those regions since the last one)."""
        if index not in self.waited or (index == 0 and self.early):
            return
        self.posted[index] = [hazards.access(r) for k, r in _numbered(step.recvs, self.received)
                              if self.mine[r.peer, k] < 0]
        if self.code and not self.order.clear_of(self.posted[index]):
            self.order.grid(index)
        self.emit(EPOCH.row(index, published=index))

    def send(self, index, s):
        """One send of step ``index``: in a line, eagerly into the inbox, or pushed."""
        plan, rank = self.plan, self.plan.rank
        k = self.sent[s.peer]
        self.sent[s.peer] += 1
        pairs = self.landing.get((rank, s.peer), ())
        if k >= len(pairs):
            raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {rank} sends "
                             f"message {k + 1} to rank {s.peer}, which receives only "
                             f"{len(pairs)} from it")
        their_step, region, slot = pairs[k]
        if region.count != s.region.count:
            raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {rank} step "
                             f"{index + 1} sends {s.region.count} elements to rank "
                             f"{s.peer}, whose step {their_step + 1} receives "
                             f"{region.count}")
        source = self.read(s.region)
        self.order.before(((source,), ()), index)
        if slot >= 0 and s.region.count <= self.lines:
            self.emit(SEND_LL.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                                  src_offset=source.offset, slot=slot, count=s.region.count,
                                  message=k))
        elif slot >= 0:
            self.emit(SEND.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                               src_offset=source.offset, slot=slot, count=s.region.count,
                               message=k, output_at=region.offset if self.direct and
                               _may_land_directly(region, their_step) else -1))
        else:
            self.emit(PUSH.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                               src_offset=source.offset, dst_buffer=_BUFFER[region.buffer],
                               dst_offset=region.offset, count=s.region.count,
                               their_step=their_step, message=k))

    def locals_and_receives(self, index, step):
        """Step ``index``'s local ops and receives: the ops that touch nothing the step
        receives first (they run while its messages travel), then the receives (or none,
        where a chain reads them out of the inbox or a reduction takes them), then the rest
        of the ops; runs of reductions as chains."""
        plan = self.plan
        # local op position -> (receive, slot, k): fused chains that read eager messages
        # straight out of the inbox (those messages are never taken), after the receives
        self.taken = {}
        early = _apart_from_receives(step)
        in_inbox = {r.region: (r, self.mine[r.peer, k], k)
                    for k, r in _numbered(step.recvs, self.received) if self.mine[r.peer, k] >= 0}
        self.inbox_runs = _inbox_runs(plan, index, early, in_inbox)
        in_inbox_runs = {p for first, (run, _) in self.inbox_runs.items()
                         for p in range(first, first + len(run))}
        consumed = {x for _, regions in self.inbox_runs.values() for x in regions}
        self.folded = {}                   # first position of a chain -> its reductions
        for first, last in _chains(plan, index, 0, early):
            self.folded[first] = step.local[first:last]
        skipped = _run_with_their_first(self.folded)
        for position in range(early):
            if position not in skipped:
                self.local(index, position, step.local[position])
        for k, r in _numbered(step.recvs, self.received):
            self.receive(index, step, k, r, consumed, in_inbox_runs)
        for r in step.recvs:
            self.received[r.peer] += 1
        for first, (run, _) in self.inbox_runs.items():
            self.folded[first] = run
        for first, last in _chains(plan, index, early, len(step.local),
                                   set(self.taken) | in_inbox_runs):
            self.folded[first] = step.local[first:last]
        skipped = _run_with_their_first(self.folded)
        for position in range(early, len(step.local)):
            if position not in skipped:
                self.local(index, position, step.local[position])

    def receive(self, index, step, k, r, consumed, in_inbox_runs):
        """Receive ``r`` (message ``k`` from its peer) of step ``index``: waited for, taken
        out of the inbox, left to the chain that reads it there (``consumed``), or left to
        the reduction that takes it (``self.taken``)."""
        slot = self.mine[r.peer, k]
        directly = self.direct and self.symmetric and slot >= 0 and \
            r.region.count > self.lines and _may_land_directly(r.region, index)
        if directly:
            self.into_output.append(None)
        if r.region in consumed:           # a chain reads it out of the inbox: in lines it
            if r.region.count > self.lines:   # polls them itself, else it waits here first
                self.emit(ARRIVE.row(index, peer=r.peer, message=k))
            return
        at = _fused_at(step, r) if slot >= 0 else None
        if at in in_inbox_runs:            # its reduction runs inside such a chain
            at = None
        if at is not None:
            self.taken[at] = (r, slot, k)
            return
        self.order.before(hazards.access(r), index)
        self.wrote(r.region)
        if directly:
            self.into_output[-1] = (len(self.code), r.region)
        if slot >= 0:                      # each worker copies its share of the slot
            self.emit((TAKE_LL if r.region.count <= self.lines else TAKE).row(
                index, peer=r.peer, message=k, dst_buffer=_BUFFER[r.region.buffer],
                dst_offset=r.region.offset, slot=slot, count=r.region.count))
        else:                              # the sender's worker of the same share wrote it
            self.emit(ARRIVE.row(index, peer=r.peer, message=k))
        self.done(index, r.region)

    def local(self, index, position, op):
        """Local op ``position`` of step ``index``: fused with a receive, the first of a
        chain, or alone."""
        if position in self.taken:
            self.take_reduce(index, position, op)
        elif position in self.folded:
            self.chain(index, position)
        elif isinstance(op, Copy):
            src = self.read(op.src)
            self.order.before(((src,), (op.dst,)), index)
            self.emit(COPY.row(index, dst_buffer=_BUFFER[op.dst.buffer],
                               dst_offset=op.dst.offset, src_buffer=_BUFFER[src.buffer],
                               src_offset=src.offset, count=op.dst.count))
            self.wrote(op.dst)
            self.done(index, op.dst)
        else:
            a, b = self.read(op.a), self.read(op.b)
            self.order.before(((a, b), (op.dst,)), index)
            self.emit(REDUCE.row(index, dst_buffer=_BUFFER[op.dst.buffer],
                                 dst_offset=op.dst.offset, a_buffer=_BUFFER[a.buffer],
                                 a_offset=a.offset, b_buffer=_BUFFER[b.buffer],
                                 b_offset=b.offset, count=op.dst.count))
            self.wrote(op.dst)
            self.done(index, op.dst)

    def take_reduce(self, index, position, op):
        """The reduction at ``position`` with the message it reduces straight out of the
        inbox (``REDUCE_LL`` from lines, else ``TAKE_REDUCE``)."""
        r, slot, k = self.taken[position]
        first = op.a == r.region
        other = self.read(op.b if first else op.a)
        keep = r.region.buffer == "output" or _read_later(self.plan, index, position, r.region)
        self.order.before(((other,), (op.dst,) + ((r.region,) if keep else ())), index)
        self.wrote(op.dst, r.region)
        kind = REDUCE_LL if r.region.count <= self.lines else TAKE_REDUCE
        self.emit(kind.row(index, peer=r.peer,
                           keep_buffer=_BUFFER[r.region.buffer] if keep else -1,
                           keep_offset=r.region.offset, slot=slot, count=op.dst.count,
                           dst_buffer=_BUFFER[op.dst.buffer], dst_offset=op.dst.offset,
                           other_buffer=_BUFFER[other.buffer], other_offset=other.offset,
                           first=int(first), message=k))
        self.done(index, op.dst, r.region)

    def chain(self, index, position):
        """The chain of reductions starting at ``position`` as one REDUCE_N, reading the
        messages its inbox run consumes out of the inbox."""
        run = self.folded[position]
        from_inbox = self.inbox_runs[position][1] if position in self.inbox_runs else {}
        operands = [x if x in from_inbox else self.read(x)
                    for x in (run[0].a,) + tuple(r.b for r in run)]
        dst = run[-1].dst
        self.order.before((tuple(x for x in operands if x not in from_inbox), (dst,)), index)
        self.emit(REDUCE_N.row(index, dst_buffer=_BUFFER[dst.buffer], dst_offset=dst.offset,
                               count=dst.count, operands=len(operands),
                               operand=[_message_operand(from_inbox[x], self.lines)
                                        if x in from_inbox else operand(x)
                                        for x in operands]))
        self.wrote(dst)
        self.done(index, *(x.dst for x in run))

    def finish(self):
        """After the last step: the staged output copied out (what the plan or a seeding
        copy wrote), a seeded output's unwritten rest filled from input; a ValueError where
        this rank sends some peer fewer messages than it receives from it."""
        plan, rank = self.plan, self.plan.rank
        if self.out_staged:
            for region in _copies_out(self.written, self.regions_written):
                if region in self.out_early:
                    continue
                self.order.before(((region,), ()), -1)
                self.emit(COPY.row(-1, dst_buffer=CALLER_OUTPUT, dst_offset=region.offset,
                                   src_buffer=OUTPUT, src_offset=region.offset,
                                   count=region.count))
        if self.seeded:                # what the plan never wrote keeps input's values
            for lo, hi in list(self.written.gaps(0, _output_count(plan))):
                self.order.before(((Region("input", lo, hi - lo),),
                                   () if self.out_staged else (Region("output", lo, hi - lo),)),
                                  -1)
                self.emit(COPY.row(-1, dst_buffer=CALLER_OUTPUT if self.out_staged else OUTPUT,
                                   dst_offset=lo, src_buffer=INPUT, src_offset=lo,
                                   count=hi - lo))
        for (src, dst), pairs in self.landing.items():
            if src == rank and len(pairs) != self.sent[dst]:
                raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {dst} receives "
                                 f"{len(pairs)} messages from rank {rank}, which sends "
                                 f"{self.sent[dst]}")
