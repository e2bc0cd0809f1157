"""The hazard rules: when two operations of a plan may run in another order, together, or in
pieces without changing a result. Every transform and executor that moves, merges or cuts
operations asks here, so the rules exist once.

An operation's *access* is ``(reads, writes)``, two tuples of regions: a Send reads its
region, a Recv writes its region, a Copy reads ``src`` and writes ``dst``, a Reduce reads
``a`` and ``b`` and writes ``dst``. Two accesses *conflict* when one writes what the other
reads or writes (read-after-write, write-after-read, write-after-write on regions that share
a buffer and an element): such operations must keep their plan order. Accesses that do not
conflict may run in either order or at once. Messages between one pair also keep their
order, whatever they access: every transport matches a pair's messages in posting order.

Cutting: piece ``k`` of ``n`` of a region has proportional bounds (``cut``), so two regions
of equal count (a message at both ends, a reduction and its landing zone) cut alike and piece
k of one meets only piece k of the other. An op may be cut only when that cannot make one of
its pieces read what an earlier piece wrote (``cuttable``); a step's local ops may be
interleaved, piece by piece, with its transfers only when every overlap between them is an
equality (``splittable``).

Fusing: consecutive reductions through one accumulator may run as one kernel that loads
every operand before it stores anything (``extends_chain``).
"""
from __future__ import annotations

import bisect

from .schedule import Copy, Reduce, Region, Send

NOTHING = ()


def access(item) -> tuple[tuple, tuple]:
    """(regions read, regions written) of a Send, Recv, Copy or Reduce."""
    if isinstance(item, Reduce):
        return (item.a, item.b), (item.dst,)
    if isinstance(item, Copy):
        return (item.src,), (item.dst,)
    if isinstance(item, Send):
        return (item.region,), NOTHING
    return NOTHING, (item.region,)


def _meet(regions_a, regions_b) -> bool:
    return any(a.overlaps(b) for a in regions_a for b in regions_b)


def conflict(first, second) -> bool:
    """Whether two accesses must keep their order (see the module)."""
    reads_a, writes_a = first
    reads_b, writes_b = second
    return _meet(writes_a, reads_b) or _meet(writes_a, writes_b) or _meet(reads_a, writes_b)


INDEPENDENT, ALIKE, ACROSS = 0, 1, 2


def ordering(first, second) -> int:
    """How two accesses made by several workers at once, each moving its share of every
    region (a share depending only on the region's count), must be ordered: INDEPENDENT (no
    conflict); ALIKE, when every conflicting pair of regions is one region (same buffer,
    offset and count), so each worker meets only its own share of it and needs only its own
    order; ACROSS, when some element may be moved by one worker in one and by another worker
    in the other, so every worker must finish the first before any starts the second."""
    reads_a, writes_a = first
    reads_b, writes_b = second
    pairs = [(w, x) for w in writes_a for x in reads_b + writes_b] + \
            [(r, w) for r in reads_a for w in writes_b]
    found = INDEPENDENT
    for a, b in pairs:
        if a.overlaps(b):
            if a != b:
                return ACROSS
            found = ALIKE
    return found


class Ranges:
    """Element ranges of one buffer, merged: how much of [lo, hi) they cover."""

    def __init__(self):
        self.starts: list[int] = []
        self.ends: list[int] = []

    def covered(self, lo: int, hi: int) -> int:
        total = 0
        i = max(0, bisect.bisect_right(self.starts, lo) - 1)
        while i < len(self.starts) and self.starts[i] < hi:
            total += max(0, min(hi, self.ends[i]) - max(lo, self.starts[i]))
            i += 1
        return total

    def add(self, lo: int, hi: int) -> None:
        if lo >= hi:
            return
        i = bisect.bisect_left(self.ends, lo)          # first range that may touch [lo, hi)
        j = i
        while j < len(self.starts) and self.starts[j] <= hi:
            lo, hi = min(lo, self.starts[j]), max(hi, self.ends[j])
            j += 1
        self.starts[i:j], self.ends[i:j] = [lo], [hi]

    def gaps(self, lo: int, hi: int):
        """The uncovered ranges of [lo, hi)."""
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


class Footprint:
    """What a group of operations reads and writes, merged per buffer, so that asking
    whether one more access conflicts with all of them costs a few bisections, not a scan of
    every region (windowing merges thousands of steps at large world sizes)."""

    def __init__(self):
        self.read: dict[str, Ranges] = {}
        self.written: dict[str, Ranges] = {}

    def add(self, accessed) -> None:
        reads, writes = accessed
        for table, regions in ((self.read, reads), (self.written, writes)):
            for region in regions:
                if region.count > 0:
                    table.setdefault(region.buffer, Ranges()).add(region.offset, region.end)

    def conflicts(self, accessed) -> bool:
        """Whether an access conflicts with anything added (an empty region meets nothing)."""
        reads, writes = accessed
        return any(_covers(self.written, r) for r in reads) or any(
            _covers(self.written, w) or _covers(self.read, w) for w in writes)


def _covers(table, region) -> bool:
    ranges = table.get(region.buffer)
    return region.count > 0 and ranges is not None and \
        ranges.covered(region.offset, region.end) > 0


# -- cutting ------------------------------------------------------------------------------------


def cut(region: Region, k: int, n: int) -> Region:
    """Piece ``k`` of ``n`` of ``region``, with proportional bounds (see the module)."""
    lo = region.count * k // n
    return region.sub(lo, region.count * (k + 1) // n - lo)


def pieces_of_at_least(count: int, least: int) -> int:
    """Pieces of ``least .. 2 * least - 1`` elements (one piece below 2 * least): both ends of
    a message see the same count, hence the same cut."""
    return max(1, count // least)


def pieces_of_at_most(count: int, most: int) -> int:
    """The fewest pieces of at most ``most`` elements."""
    return max(1, -(-count // max(1, most)))


def cuttable(op) -> bool:
    """A local op may be cut into element-wise pieces only when any two of its regions are
    equal or disjoint (a Reduce's dst aliasing a or b exactly); a partial overlap would make
    piece k read what piece j < k already wrote."""
    regions = list(op)
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            if a != b and a.overlaps(b):
                return False
    return True


def splittable(step) -> bool:
    """Whether a step's local ops may be cut into pieces and interleaved with its transfer
    rounds (piece k of every op right after round k) without changing what the step means
    (all transfers, then each op whole, in order). True when every two regions that overlap
    and of which one is written are *equal* (so they are cut at the same bounds and piece k
    of one meets only piece k of the other), between an op and a transfer and between two
    ops; also within one op."""
    sent = [s.region for s in step.sends]        # read by the step: op writes must match
    received = [r.region for r in step.recvs]    # written by the step: any op access must
    ops = [access(op) for op in step.local]
    for reads, writes in ops:
        for region in reads + writes:
            if not _same_or_apart(region, received):
                return False
        for region in writes:
            if not _same_or_apart(region, sent):
                return False
    for i, (reads_i, writes_i) in enumerate(ops):
        for reads_j, writes_j in ops[i:]:
            pairs = [(w, x) for w in writes_i for x in reads_j + writes_j] + \
                    [(r, w) for r in reads_i for w in writes_j]
            for a, b in pairs:
                if a != b and a.overlaps(b):
                    return False
    return True


def _same_or_apart(region, others) -> bool:
    return all(region == other or not region.overlaps(other) for other in others)


# -- fusing ------------------------------------------------------------------------------------


def extends_chain(run, op) -> bool:
    """Whether ``op`` may join ``run`` (one op, or Reduce ops each of whose ``a`` is the
    previous one's ``dst``: an accumulator carried through) in one fused kernel. A fused
    kernel loads ``a`` and every ``b`` before it stores anything, and its threads each own
    one element index, storing each distinct destination once, with its value after the
    last op that writes it. So ``op`` joins only if it is a Reduce reading the previous
    destination as its ``a``, all of one count; if its ``b`` overlaps no earlier destination
    of the run (it would read the value before the run, not the one the run wrote); and if
    each destination is either the very same region as, or disjoint from, every region the
    run touches (no element is read at one index and written at another)."""
    first, prev = run[0], run[-1]
    if not (isinstance(first, Reduce) and isinstance(op, Reduce) and op.a == prev.dst
            and op.dst.count == op.b.count == first.dst.count):
        return False
    dsts = [r.dst for r in run]
    if any(op.b.overlaps(d) for d in dsts):
        return False
    touched = [first.a] + [r.b for r in run] + dsts + [op.b]
    return all(d == t or not d.overlaps(t) for d in dsts + [op.dst] for t in touched + [op.dst])
