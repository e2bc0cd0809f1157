"""The analyses and passes of the push lowering (``pushed_lowering``) that look at one
plan or one rank's rows alone: which local ops may run before a step's receives, which
reductions one REDUCE_N runs (``_chains``) and which of them read eager messages out of the
inbox (``_inbox_runs``), which receive a reduction takes straight out of the inbox
(``_fused_at``), what a staged output copies in and out; and the passes over the finished
rows: chains that send their result on (``_send_on``) and eager messages taken straight into
a symmetric output (``_direct``). ``pushed``'s module text says what each is for.
"""
from __future__ import annotations

from ..kernels.peer_protocol import (BARRIER, CALLER_OUTPUT, COPY, EPOCH, FOLD, INSTRUCTIONS,
                                     KIND, PUSH, REDUCE_N, SEND, SEND_LL, SENDS_ON,
                                     SENDS_ON_MAX, STEP, TAKE, chain_operands)
from . import hazards
from .schedule import Copy, Reduce, Region

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
    out of the inbox (``REDUCE_LL``, ``TAKE_REDUCE``), or None: the first op touching the
    received region must be a Reduce reading exactly that region as one operand, its
    destination apart from it and its other operand apart from every region the step
    receives."""
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
