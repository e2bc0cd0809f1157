"""Plans lowered for peer memory: every rank writes its messages straight into the receiving
rank's memory (a *push*), and ranks order themselves with flags instead of messages.

Pure: the program is a table of integers in the protocol's instruction set
(``kernels/peer_protocol.py``; docs/peer-memory.md explains the protocol: epochs, rendezvous
and eager messages, flagged lines, the flag words); here it is only built, row by row by
column name. The peer-memory executor runs it on the GPU, ``tests/schedules/peer_model.py``
on the CPU.

What the lowering decides, per rank and call:

* How each message travels: rendezvous (``PUSH``/``ARRIVE``), eagerly into the receiver's
  inbox (``lower(plan, eager)``: messages of at most ``eager`` elements, ``SEND``/``TAKE``) or
  in flagged lines (at most ``lines``, ``SEND_LL``/``TAKE_LL``); inbox slots are laid out
  alike on both sides from the receiver's plan. A rank publishes an epoch only where some
  sender waits for it: its first step and steps with a rendezvous receive.
* Where regions live: a receive writes into the receiver's memory, so every region any
  receive lands in must be in memory other ranks can write (the group's staging buffers).
  ``scratch`` always lives there; ``output`` lives there on a rank where some rendezvous
  receive lands in output (``staged``), and then its values are copied in at the start where
  the plan reads output before writing it, and copied out to the caller's output region by
  region after its last write; unless the caller's output is symmetric (``symmetric``).
  ``input`` is never written by receives. Each rank works out every other rank's placement
  from its plan, so a sender knows where to write.
* Barriers only where accesses conflict (``_Barriers``, ``hazards.ordering``): each worker
  moves its share of every message and op (``share``, a function of the count only), so a
  conflict on one region made alike needs a block barrier, one across shares a grid barrier.
  A ring's steps on equal chunks need no grid barrier at all.
* Fusions: a receive whose first use is a reduction is reduced straight out of the inbox
  (``REDUCE_LL``, ``TAKE_REDUCE``); a chain of reductions runs as one ``REDUCE_N``
  (``_chains``), reading eager messages out of the inbox (``_inbox_runs``) and sending its
  result on in the same pass (``_send_on``); eager messages land straight in a symmetric
  output where the receiver says so (``_direct``).

``lower(seeded=True)``: an all_reduce or broadcast called out of place reads input wherever
its plan reads output not yet written, instead of the group copying input to output first.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import hazards
from .schedule import Copy, Plan, Reduce, Region, buffer_sizes, build_plan

# The instruction set, the buffers a row names and the operand encodings are the protocol's
# (kernels/peer_protocol.py, docs/peer-memory.md); named here as everywhere.
from ..kernels.peer_protocol import (  # noqa: F401 (re-exported)
    ARRIVE, BARRIER, BUFFER_BITS, CALLER_OUTPUT, COPY, EPOCH, FOLD, INBOX, INPUT, INSTRUCTIONS,
    KIND, LINE_PEER_BITS, LINE_PERIOD, OUTPUT, PUSH, REDUCE, REDUCE_LL, REDUCE_N, SCRATCH, SEND,
    SEND_LL, SENDS_ON, SENDS_ON_MAX, SLOT_ALIGN, STEP, STEP_BITS, TAKE, TAKE_LL, TAKE_REDUCE, WIDTH,
    buffer_operand, chain_operands, decode_line_operand, decode_operand, in_place_epoch,
    line_flag, line_operand, scrubs)

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


def plans_of(plan: Plan) -> list:
    """Every rank's plan of the call ``plan`` belongs to (``plan`` itself for its rank)."""
    if not plan.args and plan.collective != "barrier":
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {plan.rank}: the plan "
                         f"was built by hand, so the other ranks' plans (where each message "
                         f"lands) cannot be derived; build it with build_plan")
    return [plan if r == plan.rank else
            build_plan(plan.collective, plan.algorithm, r, plan.size, *plan.args)
            for r in range(plan.size)]


def lower(plan: Plan, eager: int = 0, lines: int = 0, seeded: bool = False,
          symmetric: bool = False, direct: bool = False) -> Program:
    """The push program of ``plan`` (cached on it); messages of at most ``eager`` elements go
    eagerly, those of at most ``lines`` elements in flagged lines (``SEND_LL``); every rank of
    the call must pass the same values. ``seeded`` (this rank's choice): output starts as a
    copy of input, as an all_reduce or broadcast called out of place needs. The program
    makes no such copy: it reads input wherever the plan reads output it has not written
    yet, and copies at the end only what the plan never writes. ``symmetric`` (this rank's
    choice): the caller's output lies in memory every peer has mapped (a symmetric buffer),
    so receives land in it directly: no staging, no copies in or out. Its senders learn
    where with each of its epochs (the output's place in its symmetric memory, ``PUSH``).
    ``direct`` (every rank alike): eager messages after the first step may land in such an
    output straight from their senders (``_direct``)."""
    lines = min(lines, eager)
    return plan.derived("_pushed", (eager, lines, seeded, symmetric, direct),
                        lambda: _lower(plan, plans_of(plan), eager, lines, seeded, symmetric,
                                       direct))


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


def _lower(plan, plans, eager, lines, seeded, symmetric, direct):
    rank, size = plan.rank, plan.size
    longest = max(len(other.steps) for other in plans)
    if longest >= (1 << STEP_BITS) - 1:
        # the step would spill into the call number and order one call's steps wrongly (the
        # last value is in_place_epoch's)
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {rank}: a plan of "
                         f"{longest} steps does not fit the peer-memory epoch "
                         f"(at most {(1 << STEP_BITS) - 2} steps)")
    for other in plans:
        for step in other.steps:
            for r in step.recvs:
                if r.region.buffer == "input":
                    raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {other.rank} "
                                     f"receives into its input, which peers cannot write")
    # Where each receiver's k-th message from each sender lands, in which of its steps, and
    # its inbox slot if it goes eagerly (-1 if not).
    # Messages in lines have an inbox of their own: a line counts as arrived when its flag
    # half holds the call's number, so no other kind of message may ever have written those
    # bytes (plain data of an earlier call could hold the number and pass for a line).
    landing = {}                              # (src, dst) -> [(step, region, slot)]
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
    # A rank publishes its epoch where some sender waits for it: at its first step (eager
    # senders wait for the previous call's) and where a receive is not eager.
    waited = {0} | {index for pairs in (p for (src, dst), p in landing.items() if dst == rank)
                    for index, _, slot in pairs if slot < 0}
    mine = {}                                 # (src, k) -> slot, for this rank's receives
    for (src, dst), pairs in landing.items():
        if dst == rank:
            for k, (_, _, slot) in enumerate(pairs):
                mine[src, k] = slot

    code = []
    touched = []           # per row: its access (``_Barriers.before``'s), None for barriers,
                           # epochs and what reads only the inbox
    posted = {}            # step -> the accesses of this rank's rendezvous receives in it

    def emit(row):
        code.append(row)
        touched.append(order.take() if row[KIND] != BARRIER else None)

    order = _Barriers(emit)
    out_staged = staged(plan, eager) and not symmetric
    # The first epoch says only "this call has started" where no rendezvous receive lands in
    # step 0: published before anything else, it needs no barrier.
    early = 0 in waited and all(mine[r.peer, k] >= 0 for k, r in _numbered(plan.steps[0].recvs)) \
        if plan.steps else False
    if early:
        emit(EPOCH.row(0, published=0, first=1))
    written = hazards.Ranges()                # output the plan has written so far
    regions_written = {}                      # ... region by region, as an ordered set
    # staged output regions still to be written, with how many of the plan's writes remain:
    # each is copied out to the caller's output right after its last write, while later
    # messages still travel (where the written regions tile the output)
    remaining = _writes_to_output(plan) if out_staged else {}
    out_early = set()
    # with ``direct`` into a symmetric output, eager receives that may land there directly
    # (``_may_land_directly``): where each is taken (its TAKE row), or None where the plan
    # reads it out of the inbox
    into_output = []

    def done(index, *regions):
        """The plan's writes of ``regions`` have been emitted: copy out what is final."""
        for region in regions:
            if region in remaining:
                remaining[region] -= 1
                if not remaining[region]:
                    order.before(((region,), ()), index)
                    emit(COPY.row(index, dst_buffer=CALLER_OUTPUT, dst_offset=region.offset,
                                  src_buffer=OUTPUT, src_offset=region.offset,
                                  count=region.count))
                    out_early.add(region)

    def read(region):
        """The region to read for ``region`` (input where seeded output is not written)."""
        if not seeded or region.buffer != "output":
            return region
        gaps = list(written.gaps(region.offset, region.end))
        if gaps == [(region.offset, region.end)]:
            return Region("input", region.offset, region.count)
        for lo, hi in gaps:                   # partly written: the rest copied in first
            copied = (Region("input", lo, hi - lo),), (Region("output", lo, hi - lo),)
            order.before(copied, -1)
            emit(COPY.row(-1, dst_buffer=OUTPUT, dst_offset=lo, src_buffer=INPUT, src_offset=lo,
                          count=hi - lo))
            written.add(lo, hi)
            regions_written[Region("output", lo, hi - lo)] = None
        return region

    def wrote(*regions):
        for region in regions:
            if region.buffer == "output":
                written.add(region.offset, region.end)
                regions_written[region] = None

    for lo, hi in _read_before_written(plan) if out_staged and not seeded else []:
        copied = Region("output", lo, hi - lo)       # the caller's output values, staged
        order.before(((copied,), (copied,)), -1)
        emit(COPY.row(-1, dst_buffer=OUTPUT, dst_offset=lo, src_buffer=CALLER_OUTPUT,
                      src_offset=lo, count=hi - lo))
    sent = [0] * size
    received = [0] * size
    for index, step in enumerate(plan.steps):
        if index in waited and not (index == 0 and early):
            # every worker done with what the receives overwrite: a grid barrier, unless no
            # worker has touched those regions since the last one
            posted[index] = [hazards.access(r) for k, r in _numbered(step.recvs, received)
                             if mine[r.peer, k] < 0]
            if code and not order.clear_of(posted[index]):
                order.grid(index)
            emit(EPOCH.row(index, published=index))
        for s in step.sends:
            k = sent[s.peer]
            sent[s.peer] += 1
            pairs = landing.get((rank, s.peer), ())
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
            source = read(s.region)
            order.before(((source,), ()), index)
            if slot >= 0 and s.region.count <= lines:
                emit(SEND_LL.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                                 src_offset=source.offset, slot=slot, count=s.region.count,
                                 message=k))
            elif slot >= 0:
                emit(SEND.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                              src_offset=source.offset, slot=slot, count=s.region.count,
                              message=k, output_at=region.offset if direct and
                              _may_land_directly(region, their_step) else -1))
            else:
                emit(PUSH.row(index, peer=s.peer, src_buffer=_BUFFER[source.buffer],
                              src_offset=source.offset, dst_buffer=_BUFFER[region.buffer],
                              dst_offset=region.offset, count=s.region.count,
                              their_step=their_step, message=k))
        taken = {}                         # local op position -> (receive, slot, k): fused
        # chains that read eager messages straight out of the inbox (those messages are
        # never taken), after the receives
        early = _apart_from_receives(step)
        in_inbox = {r.region: (r, mine[r.peer, k], k) for k, r in _numbered(step.recvs, received)
                    if mine[r.peer, k] >= 0}
        inbox_runs = _inbox_runs(plan, index, early, in_inbox)
        in_inbox_runs = {p for first, (run, _) in inbox_runs.items()
                         for p in range(first, first + len(run))}
        consumed = {x for _, regions in inbox_runs.values() for x in regions}

        def local(position, op):
            if position in taken:          # the message reduced straight out of the inbox
                r, slot, k = taken[position]
                first = op.a == r.region
                other = read(op.b if first else op.a)
                keep = r.region.buffer == "output" or _read_later(plan, index, position,
                                                                   r.region)
                order.before(((other,), (op.dst,) + ((r.region,) if keep else ())), index)
                wrote(op.dst, r.region)
                kind = REDUCE_LL if r.region.count <= lines else TAKE_REDUCE
                emit(kind.row(index, peer=r.peer,
                              keep_buffer=_BUFFER[r.region.buffer] if keep else -1,
                              keep_offset=r.region.offset, slot=slot, count=op.dst.count,
                              dst_buffer=_BUFFER[op.dst.buffer], dst_offset=op.dst.offset,
                              other_buffer=_BUFFER[other.buffer], other_offset=other.offset,
                              first=int(first), message=k))
                done(index, op.dst, r.region)
                return
            if position in folded:
                run = folded[position]
                from_inbox = inbox_runs[position][1] if position in inbox_runs else {}
                operands = [x if x in from_inbox else read(x)
                            for x in (run[0].a,) + tuple(r.b for r in run)]
                dst = run[-1].dst
                order.before((tuple(x for x in operands if x not in from_inbox), (dst,)),
                             index)
                emit(REDUCE_N.row(index, dst_buffer=_BUFFER[dst.buffer], dst_offset=dst.offset,
                                  count=dst.count, operands=len(operands),
                                  operand=[_message_operand(from_inbox[x], lines)
                                           if x in from_inbox else operand(x)
                                           for x in operands]))
                wrote(dst)
                done(index, *(x.dst for x in run))
                return
            if isinstance(op, Copy):
                src = read(op.src)
                order.before(((src,), (op.dst,)), index)
                emit(COPY.row(index, dst_buffer=_BUFFER[op.dst.buffer],
                              dst_offset=op.dst.offset, src_buffer=_BUFFER[src.buffer],
                              src_offset=src.offset, count=op.dst.count))
            else:
                a, b = read(op.a), read(op.b)
                order.before(((a, b), (op.dst,)), index)
                emit(REDUCE.row(index, dst_buffer=_BUFFER[op.dst.buffer],
                                dst_offset=op.dst.offset, a_buffer=_BUFFER[a.buffer],
                                a_offset=a.offset, b_buffer=_BUFFER[b.buffer],
                                b_offset=b.offset, count=op.dst.count))
            wrote(op.dst)
            done(index, op.dst)

        # local ops that touch nothing the step receives run while its messages travel
        folded = {}                        # first position of a chain -> its reductions
        for first, last in _chains(plan, index, 0, early):
            folded[first] = step.local[first:last]
        skipped = _run_with_their_first(folded)
        for position in range(early):
            if position not in skipped:
                local(position, step.local[position])
        for k, r in _numbered(step.recvs, received):
            slot = mine[r.peer, k]
            directly = direct and symmetric and slot >= 0 and r.region.count > lines and \
                _may_land_directly(r.region, index)
            if directly:
                into_output.append(None)
            if r.region in consumed:       # a chain reads it out of the inbox: in lines it
                if r.region.count > lines:  # polls them itself, else it waits here first
                    emit(ARRIVE.row(index, peer=r.peer, message=k))
                continue
            at = _fused_at(step, r) if slot >= 0 else None
            if at in in_inbox_runs:        # its reduction runs inside such a chain
                at = None
            if at is not None:
                taken[at] = (r, slot, k)
                continue
            order.before(hazards.access(r), index)
            wrote(r.region)
            if directly:
                into_output[-1] = (len(code), r.region)
            if slot >= 0:                  # each worker copies its share of the slot
                emit((TAKE_LL if r.region.count <= lines else TAKE).row(
                    index, peer=r.peer, message=k, dst_buffer=_BUFFER[r.region.buffer],
                    dst_offset=r.region.offset, slot=slot, count=r.region.count))
            else:                          # the sender's worker of the same share wrote it
                emit(ARRIVE.row(index, peer=r.peer, message=k))
            done(index, r.region)
        for r in step.recvs:
            received[r.peer] += 1
        for first, (run, _) in inbox_runs.items():
            folded[first] = run
        for first, last in _chains(plan, index, early, len(step.local),
                                   set(taken) | in_inbox_runs):
            folded[first] = step.local[first:last]
        skipped = _run_with_their_first(folded)
        for position in range(early, len(step.local)):
            if position not in skipped:
                local(position, step.local[position])
    if out_staged:                            # what the plan (or a seeding copy) wrote
        for region in _copies_out(written, regions_written):
            if region in out_early:
                continue
            order.before(((region,), ()), -1)
            emit(COPY.row(-1, dst_buffer=CALLER_OUTPUT, dst_offset=region.offset,
                          src_buffer=OUTPUT, src_offset=region.offset, count=region.count))
    if seeded:                                # what the plan never wrote keeps input's values
        for lo, hi in list(written.gaps(0, _output_count(plan))):
            order.before(((Region("input", lo, hi - lo),),
                          () if out_staged else (Region("output", lo, hi - lo),)), -1)
            emit(COPY.row(-1, dst_buffer=CALLER_OUTPUT if out_staged else OUTPUT,
                          dst_offset=lo, src_buffer=INPUT, src_offset=lo, count=hi - lo))
    for (src, dst), pairs in landing.items():
        if src == rank and len(pairs) != sent[dst]:
            raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {dst} receives "
                             f"{len(pairs)} messages from rank {rank}, which sends {sent[dst]}")

    direct = direct and symmetric and _direct(code, touched, into_output)
    code = _send_on(code, touched, posted)
    table = np.zeros((len(code), WIDTH), np.int64)
    for i, row in enumerate(code):
        table[i, :len(row)] = row
    table.flags.writeable = False
    largest = max((t.region.count for other in plans for step in other.steps
                   for t in step.sends), default=0)
    busiest = max((sum(t.region.count for t in step.sends) for other in plans
                   for step in other.steps), default=0)
    outputs = [_staged_output(other, eager) for other in plans]
    return Program(table, out_staged, outputs[rank], plan.scratch, tuple(sent), tuple(received),
                   largest, busiest, max(outputs), max(other.scratch for other in plans),
                   max(inboxes), max(line_inboxes), direct)


def _may_land_directly(region, step) -> bool:
    """Whether an eager message (not in lines) into ``region`` in the receiver's ``step``
    lands in its output straight from the sender where the receiver says so (``_direct``).
    Not in its first step: its sender would have to wait for it to start the call (for its
    say) where it otherwise writes into the inbox at once."""
    return region.buffer == "output" and step >= 1


def _direct(code, touched, into_output) -> bool:
    """Whether this rank (its output symmetric: every peer has it mapped) can take its eager
    messages into output straight from their senders, with no copy out of the inbox; if so,
    ``code`` is marked for it (in place). Senders write such a message any time after the
    rank's first epoch of the call, so each must be taken by a TAKE (no chain or reduction
    reads it out of the inbox) and nothing of the call before its TAKE may touch its region.
    The rank says per call that it takes them directly (its first epoch's DIRECT word; the
    senders' SENDs carry where each lands in its output), so ranks need not agree. Its every
    worker says so at that epoch, which must come before any send: a sender that has taken
    a message of this call from it then reads the word without waiting for its epoch."""
    if not into_output or None in into_output:
        return False
    first = next(i for i, row in enumerate(code) if row[KIND] == EPOCH)
    if any(row[KIND] in (PUSH, SEND, SEND_LL) for row in code[:first]):
        return False
    for at, region in into_output:
        for access in touched[:at]:
            if access and any(region.overlaps(x) for x in access[0] + access[1]):
                return False
    for at, _ in into_output:
        code[at] = _set(code[at], TAKE.direct, 1)
    code[first] = _set(code[first], EPOCH.direct, 1)
    return True


def _batch(row):
    """What rows of one batch share: their kind and step (the kernel's ``batch_end``)."""
    return row[KIND], row[STEP]


def _set(row, column, value):
    """``row`` with ``value`` in ``column``."""
    return row[:column] + (value,) + row[column + 1:]


def _send_on(code, touched=None, posted=None):
    """``code`` with each chain whose result the next step sends on, and nothing else,
    marked SENDS_ON (two_shot's reduction, then its sends of the reduced block): the kernel
    then stores each result to the peers' slots, lines or regions in the pass that computes
    it, after the sends' waits, instead of writing it, meeting at a barrier and reading it
    back. Only where every send of the batch (the step's consecutive SENDs, SEND_LLs or
    PUSHes) reads exactly the chain's result, so each of them splits among the workers as
    the chain does; sends of plain data only after a chain that polls no lines (the kernel's
    pass for them reads plain memory). The block barriers between the two go: a thread
    sends what it computed itself, and the kernel orders the block after the sends as after
    every batch; so a staged output's copy of the result out to the caller's output moves
    after the sends.

    Rendezvous sends come after the next step's epoch (and the grid barrier before it,
    where there is one): the chain moves after both (``touched``, ``posted``: each row's
    access, each step's rendezvous receives) where that changes nothing: no receive the
    epoch lets peers write meets what the chain accesses, and no row after it up to the
    next grid barrier meets it across workers (the grid barrier it leaves ordered those)."""
    out, i = [], 0
    while i < len(code):
        row = code[i]
        out.append(row)
        i += 1
        if row[KIND] == REDUCE_N:
            fused = _fused_sends(code, i - 1, touched, posted)
            if fused is not None:
                ahead, sends, later, i = fused
                marked = _set(row, REDUCE_N.operands, row[REDUCE_N.operands] | SENDS_ON)
                out[-1:] = ahead + [marked] + sends + later
    return out


def _fused_sends(code, at, touched, posted):
    """For the chain at ``at``: (the rows to move ahead of it, the batch of sends it runs,
    the copies out of its result to move after them, the row after all of them), or None
    where they cannot fuse (``_send_on``)."""
    chain, n = code[at], len(code)
    # the chain's result: what a copy of it out, or a send of it, reads
    result = chain[REDUCE_N.dst_buffer], chain[REDUCE_N.dst_offset], chain[REDUCE_N.count]
    ahead, later = [], []
    j = at + 1
    while j < n:
        row = code[j]
        if row[KIND] == BARRIER and not row[BARRIER.grid]:
            pass                                  # ordered the chain before what follows
        elif row[KIND] == COPY and row[COPY.dst_buffer] == CALLER_OUTPUT and \
                row[COPY.dst_offset] == result[1] and \
                (row[COPY.src_buffer], row[COPY.src_offset], row[COPY.count]) == result:
            later.append(row)                     # the result copied out
        elif touched is not None and row[KIND] == EPOCH and not ahead[1:]:
            ahead.append(row)
        elif touched is not None and row[KIND] == BARRIER and not ahead and j + 1 < n \
                and code[j + 1][KIND] == EPOCH:
            ahead.append(row)                     # the epoch's grid barrier
        else:
            break
        j += 1
    kind = code[j][KIND] if j < n else None
    if kind not in (SEND, SEND_LL, PUSH) or \
            (kind != SEND_LL and any(x < 0 for x in chain_operands(chain))):
        return None
    kind = INSTRUCTIONS[kind]
    first = end = j
    while end < n and _batch(code[end]) == _batch(code[first]) and \
            (code[end][kind.src_buffer], code[end][kind.src_offset],
             code[end][kind.count]) == result:
        end += 1
    if end == first or end - first > SENDS_ON_MAX or \
            (end < n and _batch(code[end]) == _batch(code[first])):
        return None
    if ahead and ahead[-1][KIND] != EPOCH:
        return None
    if ahead:
        mine = touched[at]
        if mine is None or any(hazards.ordering(mine, r)
                               for r in posted[ahead[-1][EPOCH.published]]):
            return None
        for row, access in zip(code[end:], touched[end:]):
            if row[KIND] == BARRIER and row[BARRIER.grid]:
                break
            if access is not None and hazards.ordering(mine, access) == hazards.ACROSS:
                return None
    return ahead, list(code[first:end]), later, end


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


def _apart_from_receives(step):
    """How many of ``step``'s first local ops conflict with none of its receives: they may
    run before the receives complete (the plan means all transfers, then the ops in order;
    these ops neither see nor change what is received)."""
    received = [hazards.access(r) for r in step.recvs]
    for position, op in enumerate(step.local):
        if any(hazards.conflict(hazards.access(op), r) for r in received):
            return position
    return len(step.local)


def _fused_at(step, recv):
    """The position of the local op of ``step`` that can reduce the eager ``recv`` straight
    out of the inbox (``REDUCE_LL``, ``TAKE_REDUCE``), or None: the first op touching the received region must be
    a Reduce reading exactly that region as one operand, its destination apart from it and
    its other operand apart from every region the step receives."""
    region = recv.region
    for position, op in enumerate(step.local):
        reads, writes = hazards.access(op)
        if not any(region.overlaps(x) for x in reads + writes):
            continue
        if isinstance(op, Copy) or (op.a == region) == (op.b == region):
            return None
        other = op.b if op.a == region else op.a
        if op.dst.overlaps(region) or any(other.overlaps(r.region) for r in step.recvs):
            return None                    # (the other operand is no message of the step)
        return position
    return None


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


def _inbox_runs(plan, index, start, in_inbox):
    """{first: (run, {region: receive})}: the chains of step ``index``'s local ops from
    ``start`` on (``_chains``) that read some eager message of the step as an operand and
    nothing else reads: the REDUCE_N then reads it out of the inbox itself (polling its
    lines, or after its ARRIVE), where the message would first be copied out of the inbox
    (TAKE, TAKE_LL) or reduced on its own (TAKE_REDUCE, REDUCE_LL), each behind a barrier.
    A sender's worker writes the share of the message that the reading worker reads: a
    chain's operands have its count, so both split alike. ``in_inbox``: region ->
    (receive, slot, k) of the step's eager messages. A message read outside its run, kept in
    output, or read twice in the run is taken as before."""
    step = plan.steps[index]
    local = step.local
    out = {}
    for first, last in _chains(plan, index, start, len(local)):
        run = local[first:last]
        operands = [run[0].a] + [r.b for r in run]
        read_elsewhere = [x for op in local[start:first] for x in hazards.access(op)[0]]
        consumed = {}
        for x in operands:
            if x not in in_inbox or x.buffer == "output" or operands.count(x) != 1 or \
                    any(x.overlaps(y) for y in read_elsewhere) or \
                    _read_later(plan, index, last - 1, x):
                continue
            consumed[x] = in_inbox[x]
        if consumed:
            out[first] = (run, consumed)
    return out


def _writes_to_output(plan):
    """Output region -> how many of ``plan``'s receives and local ops write it, where those
    regions tile the output (equal or apart: each then has a last write); else {}."""
    counts = {}
    for step in plan.steps:
        for region in [r.region for r in step.recvs] + [op.dst for op in step.local]:
            if region.buffer == "output" and region.count:
                counts[region] = counts.get(region, 0) + 1
    return counts if _tile(counts) else {}


def _tile(regions) -> bool:
    """Whether ``regions`` (of one buffer) are each equal to or apart from every other."""
    tiles = sorted(set(regions), key=lambda r: (r.offset, r.count))
    return all(a.end <= b.offset for a, b in zip(tiles, tiles[1:]))


def _copies_out(written, regions):
    """The staged output to copy out, as regions: those the plan wrote, region by region,
    where no two of them partly overlap, so each copy is shared out among the workers as
    its last write was and needs no grid barrier before it; else the written ranges."""
    tiles = [r for r in regions if r.count]
    if _tile(tiles):
        return sorted(tiles, key=lambda r: (r.offset, r.count))
    return [Region("output", lo, hi - lo) for lo, hi in zip(written.starts, written.ends)]


def _run_with_their_first(folded) -> set:
    """Positions of the reductions that run as part of an earlier one's REDUCE_N."""
    return {p for first, run in folded.items() for p in range(first + 1, first + len(run))}


def _chains(plan, index, start, end, taken=()):
    """[(first, last)]: runs of step ``index``'s local ops in [start, end) that one REDUCE_N
    does in a single pass: Reduces of one count, each folding one more operand into the
    previous one's result (``Reduce(t, acc, x)`` after ``Reduce(acc, ., .)``), at most FOLD
    operands. The pass keeps the running value in registers and writes only the last
    destination, so a result in between may be skipped only where nothing reads it: it is
    the last destination itself or scratch the plan never reads again, and no operand of a
    later reduction of the run overlaps it. Every operand equals the last destination or
    lies apart from it (each element is read before it is written, in the same thread).
    A reduction fused with a receive (``taken``) is no part of any run."""
    local = plan.steps[index].local
    runs, position = [], start
    while position < end:
        last = position + 1
        op = local[position]
        if isinstance(op, Reduce) and position not in taken:
            while last < end and last - position + 1 < FOLD and _folds(plan, index, local,
                                                                         position, last, taken):
                last += 1
        if last - position > 1:
            runs.append((position, last))
        position = last
    return runs


def _folds(plan, index, local, first, position, taken):
    """Whether local op ``position`` extends the run of reductions ``first..position-1``."""
    op, before = local[position], local[position - 1]
    if not isinstance(op, Reduce) or position in taken or op.a != before.dst \
            or op.dst.count != before.dst.count or op.b.overlaps(before.dst):
        return False
    run = local[first:position + 1]
    for earlier in run[:-1]:               # results skipped if op ends the run
        if earlier.dst != op.dst and (earlier.dst.buffer != "scratch" or _read_later(
                plan, index, position, earlier.dst)):
            return False
        if any(later.b.overlaps(earlier.dst) for later in run[run.index(earlier) + 1:]):
            return False
    operands = [run[0].a] + [r.b for r in run]
    return all(x == op.dst or not x.overlaps(op.dst) for x in operands)


def _read_later(plan, index, position, region):
    """Whether anything after local op ``position`` of step ``index`` reads some element of
    ``region`` before the plan writes it again (then a fused receive must keep the data)."""
    written = hazards.Ranges()             # of region, since: those reads see new data

    def reads(regions):
        return any(r.overlaps(region) and
                   next(written.gaps(max(r.offset, region.offset), min(r.end, region.end)),
                        None) is not None for r in regions)

    def overwrite(regions):
        for r in regions:
            if r.overlaps(region):
                written.add(max(r.offset, region.offset), min(r.end, region.end))

    for later, step in enumerate(plan.steps[index:], index):
        ops = step.local[position + 1:] if later == index else step.local
        if later > index:
            if reads([s.region for s in step.sends]):
                return True
            overwrite([r.region for r in step.recvs])
        for op in ops:
            read, wrote = hazards.access(op)
            if reads(read):
                return True
            overwrite(wrote)
        if written.covered(region.offset, region.end) == region.count:
            return False
    return False


def _staged_output(plan, eager):
    if not staged(plan, eager):
        return 0
    end = max((region.end for step in plan.steps for region in _regions(step)
               if region.buffer == "output"), default=0)
    return max(end, _output_count(plan))


def reads_input(plan: Plan) -> bool:
    """Whether any step of ``plan`` touches its input buffer."""
    return any(region.buffer == "input" for step in plan.steps for region in _regions(step))


def _regions(step):
    for t in step.sends + step.recvs:
        yield t.region
    for op in step.local:
        yield from op


def _read_before_written(plan):
    """Output ranges the plan reads before anything of the plan writes them (sorted)."""
    written, needed = hazards.Ranges(), hazards.Ranges()

    def read(region):
        if region.buffer == "output":
            for lo, hi in written.gaps(region.offset, region.end):
                needed.add(lo, hi)

    def write(region):
        if region.buffer == "output":
            written.add(region.offset, region.end)

    for step in plan.steps:
        for s in step.sends:
            read(s.region)
        for r in step.recvs:
            write(r.region)
        for op in step.local:
            reads, writes = hazards.access(op)
            for region in reads:
                read(region)
            for region in writes:
                write(region)
    return list(zip(needed.starts, needed.ends))


def share(count: int, worker: int, workers: int, align: int = 1) -> tuple[int, int]:
    """The [start, end) of ``count`` elements that worker ``worker`` of ``workers`` moves,
    boundaries at multiples of ``align`` (the kernel's: 16 bytes). It depends only on the
    count, so two regions of one count split alike (what ``_Barriers`` relies on)."""
    units = -(-count // align)
    return (min(count, units * worker // workers * align),
            min(count, units * (worker + 1) // workers * align))
