"""Bidirectional rings: half of the data goes clockwise, the other half counter-clockwise.

Each step sends to both neighbours and receives from both (one message each way per link), so
a full-duplex link to each neighbour carries half of what the one-way ring puts on one link.
Where a rank can drive both of its links at once (NVLink/NVSwitch GPUs move the same bytes
split over both neighbours faster than over one), a step takes about half the time of a ring
step; over a single port it gains nothing.

Costs with one send port and one receive port per rank, the two sends of a step serialized
in the best order (p ranks, n elements as in ``ring.py``, α per message, β per element
moved, γ per element reduced):

    all_reduce      4(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ
    reduce_scatter  2(p-1)α + ((p-1)/p)n(β + γ)
    all_gather      2(p-1)α + ((p-1)/p)nβ
    all_to_all       (p-1)α + ((p-1)/p)nβ          (⌈(p-1)/2⌉ steps of two messages)

That is the ring's β and γ with twice its α. ``cost.py`` has no closed form for these
(``COUNTED_ONLY``): its replay serves ports first come first served, which chains the two
directions around the ring and counts more than this optimum, so ``auto`` never prefers a
bidirectional ring; ask for it by name where the links are full duplex to both neighbours. With two ports driven at once (k-port model,
k = 2) the β terms halve and the α terms equal the ring's: all_reduce 2(p-1)α + ((p-1)/p)nβ
+ ((p-1)/p)nγ. The reductions do not shrink: each step still reduces n/p elements.

Schedules:

* all_reduce: the vector is cut in two halves (``partition(count, 2)``), each half into p
  blocks; the first half runs the ring reduce-scatter + all-gather clockwise (send right,
  receive left), the second the mirror image counter-clockwise, step for step together. Each
  half lands in its own scratch slot.
* reduce_scatter / all_gather (any per-rank counts): every rank's block is cut in two
  halves; the first halves travel clockwise, the second counter-clockwise.
* all_to_all (any per-pair counts): step s exchanges whole blocks with rank+s and rank-s at
  once (one peer when s = p/2), so p-1 messages take ⌈(p-1)/2⌉ steps.

Messages of one step between the same pair of ranks (p = 2, where the left neighbour is the
right one) are matched in order: every step lists the clockwise transfer first on both sides.
Valid for any world size and counts (uneven blocks, count < p: empty transfers are dropped on
both sides alike).
"""
from .schedule import (Copy, Recv, Reduce, Region, Send, Step, algorithm, copy, layout,
                       partition)

NAME = "ring_bidirectional"


def _halves(region: Region) -> tuple[Region, Region]:
    """The first (clockwise) and second (counter-clockwise) half of a region."""
    first, second = partition(region.count, 2, region.buffer, region.offset)
    return first, second


def _merge(*steps: Step) -> Step:
    """One step doing all of ``steps``' transfers at once, then their local ops in order."""
    return Step(sends=sum((s.sends for s in steps), ()),
                recvs=sum((s.recvs for s in steps), ()),
                local=sum((s.local for s in steps), ()))


def _ring_reduce_scatter(rank, size, direction, blocks, result, base):
    """The p-1 steps of a ring reduce-scatter of the read-only ``blocks`` going ``direction``
    (+1 clockwise, -1 counter-clockwise); block ``rank`` ends reduced in ``result``. Partial
    sums use two scratch slots (double buffering) at [base, base + 2·max block). Steps are
    never skipped, so step s of every rank meets step s of its neighbours."""
    ahead, behind = (rank + direction) % size, (rank - direction) % size
    width = max(b.count for b in blocks)

    def slot(k, count):
        return Region("scratch", base + (k % 2) * width, count)

    for s in range(size - 1):
        outgoing = blocks[(rank - direction * (s + 1)) % size]
        incoming = blocks[(rank - direction * (s + 2)) % size]
        if s > 0:              # what the previous step reduced; step 0 sends raw input
            outgoing = slot(s - 1, outgoing.count)
        landing = slot(s, incoming.count)
        into = result if s == size - 2 else landing
        yield Step(sends=(Send(ahead, outgoing),), recvs=(Recv(behind, landing),),
                   local=(Reduce(into, incoming, landing),))


@algorithm("all_reduce", NAME)
def all_reduce(rank, size, count):
    """Two in-place rings (reduce-scatter then all-gather) in opposite directions."""
    if size == 1:
        return
    first, second = partition(count, 2)
    cw = partition(first.count, size, "output", first.offset)
    ccw = partition(second.count, size, "output", second.offset)
    # landing zones: the clockwise half at scratch[0, w), the other right after it
    # (partition puts the largest block first)
    halves = ((cw, +1, 0), (ccw, -1, cw[0].count))

    def reduce_step(s, blocks, d, base):
        ahead, behind = (rank + d) % size, (rank - d) % size
        out, inc = blocks[(rank - d * s) % size], blocks[(rank - d * (s + 1)) % size]
        landing = Region("scratch", base, inc.count)
        return Step(sends=(Send(ahead, out),), recvs=(Recv(behind, landing),),
                    local=(Reduce(inc, inc, landing),))

    def gather_step(s, blocks, d):
        ahead, behind = (rank + d) % size, (rank - d) % size
        return Step(sends=(Send(ahead, blocks[(rank - d * (s - 1)) % size]),),
                    recvs=(Recv(behind, blocks[(rank - d * s) % size]),))

    for s in range(size - 1):
        yield _merge(*(reduce_step(s, blocks, d, base) for blocks, d, base in halves))
    for s in range(size - 1):
        yield _merge(*(gather_step(s, blocks, d) for blocks, d, _ in halves))


@algorithm("reduce_scatter", NAME)
def reduce_scatter(rank, size, counts):
    """First halves of every block reduce clockwise, second halves counter-clockwise."""
    blocks = layout(counts, "input")
    mine = Region("output", 0, counts[rank])
    if size == 1:
        yield copy(blocks[0], mine)
        return
    split = [_halves(b) for b in blocks]
    ours = _halves(mine)
    width = max(h[0].count for h in split)
    clockwise = _ring_reduce_scatter(rank, size, +1, [h[0] for h in split], ours[0], 0)
    counter = _ring_reduce_scatter(rank, size, -1, [h[1] for h in split], ours[1], 2 * width)
    for a, b in zip(clockwise, counter):
        yield _merge(a, b)


@algorithm("all_gather", NAME)
def all_gather(rank, size, counts):
    """First halves of every block go clockwise, second halves counter-clockwise."""
    out = [_halves(b) for b in layout(counts, "output")]
    own = _halves(Region("input", 0, counts[rank]))
    yield Step(local=(Copy(own[0], out[rank][0]), Copy(own[1], out[rank][1])))
    for s in range(size - 1):
        steps = []
        for half, d in ((0, +1), (1, -1)):
            ahead, behind = (rank + d) % size, (rank - d) % size
            outgoing = own[half] if s == 0 else out[(rank - d * s) % size][half]
            incoming = out[(rank - d * (s + 1)) % size][half]
            steps.append(Step(sends=(Send(ahead, outgoing),), recvs=(Recv(behind, incoming),)))
        yield _merge(*steps)


@algorithm("all_to_all", NAME)
def all_to_all(rank, size, counts):
    """Step s exchanges whole blocks with rank+s and rank-s at once (alltoallv)."""
    outgoing = layout(counts[rank], "input")
    incoming = layout([row[rank] for row in counts], "output")
    yield copy(outgoing[rank], incoming[rank])
    for s in range(1, size // 2 + 1):
        forward, backward = (rank + s) % size, (rank - s) % size
        peers = (forward,) if forward == backward else (forward, backward)
        # sends to rank+s then rank-s; receives from rank-s then rank+s (what they send us)
        sends = tuple(Send(q, outgoing[q]) for q in peers)
        recvs = tuple(Recv(q, incoming[q]) for q in reversed(peers))
        yield Step(sends=sends, recvs=recvs)
