"""Ring algorithms: every rank talks only to its neighbours, right = rank+1, left = rank-1.

Costs in the α-β-γ model: p ranks, n elements (the whole vector; for all_gather the whole
output, for reduce_scatter the whole input, for all_to_all one rank's send buffer), α per
message, β per element moved, γ per element reduced. Ring schedules are bandwidth-optimal and
latency-linear: they win for large n and lose to log-p trees for small n or large p.

all_reduce: reduce-scatter then all-gather around the ring; 2(p-1) steps of n/p elements.
Cost 2(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ. Uneven blocks (n not divisible by p, even n < p)
are handled by ``partition``.

reduce_scatter: p-1 steps; at step s a rank sends the partial sum of block rank-s-1 right and
receives block rank-s-2 from the left, adding its own input block. The first step sends
straight from input; partial sums live in two scratch slots (double buffering), the last one
lands in output. Cost (p-1)α + ((p-1)/p)nβ + ((p-1)/p)nγ; with uneven counts every step costs
its largest block.

all_gather: copy the own block into place, then p-1 steps forwarding the block received last
(allgatherv: any per-rank counts). Cost (p-1)α + ((p-1)/p)nβ, each step bounded by its
largest block.

all_to_all: pairwise shifted exchange; step s sends to rank+s and receives from rank-s, the
own block is copied locally (alltoallv: any per-pair counts). Cost (p-1)α + ((p-1)/p)nβ for
even counts; steps whose pair exchanges nothing are skipped.

broadcast: pipelined chain root → root+1 → ... → root-1; the vector is cut into S segments
and a middle rank receives segment k while forwarding segment k-1. Cost (p+S-2)(α + (n/S)β),
minimized at S* = sqrt((p-2)nβ/α); ``segment_count`` takes S* for α/β = 8192 elements (32 KiB
of float32, the order of a host link's latency-bandwidth product) so large n approaches nβ,
the optimum.

reduce: ring reduce-scatter (input read-only, partial sums in scratch), then every rank sends
its reduced block to the root in one step. Cost 2(p-1)α + 2((p-1)/p)nβ + ((p-1)/p)nγ:
bandwidth-optimal, unlike a tree's log(p)·nβ. Non-roots never touch output.

gather: pipelined chain toward the root, one block per message: at step t rank root+v sends
the block of rank root+v+t to its left neighbour (its own first, then the ones it received),
so the root receives one block per step. Cost (p-1)α + ((p-1)/p)nβ with even counts: the
root's incoming link is busy every step, which is the bandwidth optimum; latency is linear.
(Forwarding everything accumulated in one message per hop would cost (p-1)α + ((p-1)/2)nβ.)

scatter: the mirror of gather: the root sends the farthest block first, each rank forwards
the blocks meant for ranks beyond it and keeps the last one it receives. Same cost.

barrier: a one-element token goes around the ring twice: the first lap (0 → 1 → ... → p-1 →
0) proves every rank arrived, the second lap (0 → ... → p-1) releases them. Cost (2p-1)α.
"""
import math

from .schedule import (Recv, Reduce, Region, Send, Step, algorithm, copy, layout,
                       partition, recv, send, sendrecv)

# α/β of the link in elements: a host link moves tens of KiB in one message's latency.
ALPHA_OVER_BETA_ELEMENTS = 8192


@algorithm("all_reduce", "ring")
def all_reduce(rank, size, count):
    """Ring: reduce-scatter then all-gather; 2(p-1) steps of count/p elements each."""
    block = partition(count, size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for s in range(size - 1):
        yield sendrecv(right, block[(rank - s) % size], left, block[(rank - s - 1) % size],
                       reduce=True)
    for s in range(size - 1):
        yield sendrecv(right, block[(rank - s + 1) % size], left, block[(rank - s) % size])


def _slot(base, width, k, count):
    """One of two scratch slots ``width`` elements wide (double buffering): step t receives
    into slot t % 2 while sending what step t-1 left in the other slot."""
    return Region("scratch", base + (k % 2) * width, count)


def _reduce_scatter_steps(rank, size, blocks, result, base=0):
    """Ring reduce-scatter of the read-only ``blocks``; this rank's reduced block (index
    ``rank``) ends in ``result``. Partial sums use scratch [base, base + 2·max block)."""
    if size == 1:
        yield copy(blocks[0], result)
        return
    right, left = (rank + 1) % size, (rank - 1) % size
    width = max(b.count for b in blocks)
    for s in range(size - 1):
        outgoing = blocks[(rank - s - 1) % size]
        incoming = blocks[(rank - s - 2) % size]
        if not (outgoing.count or incoming.count):
            continue
        if s > 0:   # what the previous step reduced; step 0 sends raw input
            outgoing = _slot(base, width, s - 1, outgoing.count)
        landing = _slot(base, width, s, incoming.count)
        into = result if s == size - 2 else landing
        yield Step(sends=(Send(right, outgoing),), recvs=(Recv(left, landing),),
                   local=(Reduce(into, incoming, landing),))


@algorithm("reduce_scatter", "ring")
def reduce_scatter(rank, size, counts):
    """Ring reduce-scatter: p-1 steps; block i of the result lands on rank i."""
    yield from _reduce_scatter_steps(rank, size, layout(counts, "input"),
                                     Region("output", 0, counts[rank]))


@algorithm("all_gather", "ring")
def all_gather(rank, size, counts):
    """Ring all-gather (allgatherv): p-1 steps, each forwarding the block received last."""
    out = layout(counts, "output")
    own = Region("input", 0, counts[rank])
    right, left = (rank + 1) % size, (rank - 1) % size
    yield copy(own, out[rank])
    for s in range(size - 1):
        outgoing = own if s == 0 else out[(rank - s) % size]
        incoming = out[(rank - s - 1) % size]
        if outgoing.count or incoming.count:
            yield sendrecv(right, outgoing, left, incoming)


@algorithm("all_to_all", "ring")
def all_to_all(rank, size, counts):
    """Pairwise shifted exchange (alltoallv): step s sends to rank+s, receives from rank-s."""
    outgoing = layout(counts[rank], "input")
    incoming = layout([row[rank] for row in counts], "output")
    yield copy(outgoing[rank], incoming[rank])
    for s in range(1, size):
        to, frm = (rank + s) % size, (rank - s) % size
        if outgoing[to].count or incoming[frm].count:
            yield sendrecv(to, outgoing[to], frm, incoming[frm])


def segment_count(count, size):
    """Segments of a pipelined chain: (p+S-2)(α + (n/S)β) is least at S = sqrt((p-2)n·β/α)."""
    best = round(math.sqrt(max(size - 2, 0) * count / ALPHA_OVER_BETA_ELEMENTS))
    return max(1, min(count, best))


@algorithm("broadcast", "ring")
def broadcast(rank, size, count, root, segments=None):
    """Pipelined chain from the root; ``segments`` overrides ``segment_count``."""
    if size == 1:
        return
    segs = partition(count, segments or segment_count(count, size))
    v = (rank - root) % size
    right, left = (rank + 1) % size, (rank - 1) % size
    if v == 0:
        for seg in segs:
            yield send(right, seg)
    elif v == size - 1:
        for seg in segs:
            yield recv(left, seg)
    else:
        yield recv(left, segs[0])
        for k in range(1, len(segs)):
            yield sendrecv(right, segs[k - 1], left, segs[k])
        yield send(right, segs[-1])


@algorithm("reduce", "ring")
def reduce(rank, size, count, root):
    """Ring reduce-scatter in scratch, then every block straight to the root."""
    blocks = partition(count, size, "input")
    out = partition(count, size, "output")
    width = blocks[0].count        # partition puts the largest block first
    mine = out[rank] if rank == root else Region("scratch", 2 * width, blocks[rank].count)
    yield from _reduce_scatter_steps(rank, size, blocks, mine)
    if size == 1:
        return
    if rank == root:
        yield Step(recvs=tuple(Recv(r, out[r]) for r in range(size) if r != root))
    else:
        yield send(root, mine)


@algorithm("gather", "ring")
def gather(rank, size, counts, root):
    """Pipelined chain toward the root, one block per message."""
    v = (rank - root) % size
    right, left = (rank + 1) % size, (rank - 1) % size

    def count_of(u):                      # block of relative rank u
        return counts[(root + u) % size]

    if v == 0:
        out = layout(counts, "output")
        yield copy(Region("input", 0, counts[rank]), out[rank])
        for t in range(size - 1):
            src = (root + t + 1) % size
            if out[src].count:
                yield recv(right, out[src])
        return
    width = max(counts)
    for t in range(size - v):
        # step t forwards the block of relative rank v+t and takes in that of v+t+1
        outgoing = (Region("input", 0, count_of(v)) if t == 0
                    else _slot(0, width, t - 1, count_of(v + t)))
        incoming = _slot(0, width, t, count_of(v + t + 1)) if v + t + 1 < size else None
        if outgoing.count or (incoming is not None and incoming.count):
            yield sendrecv(left, outgoing, None if incoming is None else right, incoming)


@algorithm("scatter", "ring")
def scatter(rank, size, counts, root):
    """Pipelined chain away from the root, farthest block first; the mirror of gather."""
    v = (rank - root) % size
    right, left = (rank + 1) % size, (rank - 1) % size
    own = Region("output", 0, counts[rank])

    def count_of(u):
        return counts[(root + u) % size]

    if v == 0:
        blocks = layout(counts, "input")
        yield copy(blocks[rank], own)
        for t in range(size - 1):
            block = blocks[(root - 1 - t) % size]     # relative rank p-1-t
            if block.count:
                yield send(right, block)
        return
    width = max(counts)
    for t in range(size - v):
        u = size - 1 - t                     # relative rank of the block arriving at step t
        incoming = own if u == v else _slot(0, width, t, count_of(u))
        outgoing = _slot(0, width, t - 1, count_of(u + 1)) if t > 0 else None
        if incoming.count or (outgoing is not None and outgoing.count):
            yield sendrecv(None if outgoing is None else right, outgoing, left, incoming)


@algorithm("barrier", "ring")
def barrier(rank, size):
    """A token twice around the ring: arrival lap, then release lap."""
    if size == 1:
        return
    token = Region("scratch", 0, 1)
    right, left = (rank + 1) % size, (rank - 1) % size
    if rank == 0:
        yield send(right, token)      # arrival lap starts
        yield recv(left, token)       # ... and returns: everyone has arrived
        yield send(right, token)      # release lap
    else:
        yield recv(left, token)
        yield send(right, token)
        yield recv(left, token)
        if rank != size - 1:
            yield send(right, token)
