"""Direct (one-shot) algorithms: every rank exchanges with every other rank in one step; and
two_shot, two such steps.

Where all ranks can talk to all others at once (NVSwitch GPUs, the ranks of one shared-memory
host) a collective can finish in a single round of latency: each rank posts p-1 sends and p-1
receives together, then works locally. It pays p-1 messages per rank where a ring pays one
per step, so it is for small and medium messages, or for links that run many peers at once;
with one port the p-1 sends serialize and it is no faster than the ring.

Costs for p ranks, n elements (the whole vector for all_reduce; the whole input for
reduce_scatter; the whole output for all_gather; one rank's send buffer for all_to_all), α per
message, β per element moved, γ per element reduced, with one send and one receive port; with
k ports the messages run k at a time (⌈(p-1)/k⌉ rounds), each sharing the rank's link with the
k-1 others (cost.py's ``ports`` term):

    all_reduce      (p-1)(α + nβ) + (p-1)nγ              k = p-1: α + (p-1)nβ + (p-1)nγ
    reduce_scatter  (p-1)(α + (n/p)β) + ((p-1)/p)nγ
    all_gather      (p-1)(α + (n/p)β)                     plus the own block copied (n/p)
    all_to_all      (p-1)(α + (n/p)β)                     plus the own block copied (n/p)

Schedules (one step each; the local operations run after all of its transfers):

* all_reduce: send the whole vector to every peer, receive every peer's vector into its own
  scratch slot ((p-1)n scratch), then reduce the p vectors in rank order 0, 1, ..., p-1, the
  order ``simulate.reference`` uses: every rank combines the same operands in the same order,
  so all ranks hold the same bits (floating point included). A rank other than 0 accumulates
  in rank 0's slot up to its own vector, then into output; no copies.
* reduce_scatter: send block i of the input to rank i, receive the p-1 peers' copies of this
  rank's block into scratch ((p-1)·counts[rank]), reduce them in rank order into output.
* all_gather: send the own block to every peer and receive every peer's block straight into
  its place in output (allgatherv); the own block is copied into place.
* all_to_all: every pairwise block at once (alltoallv); the own block is copied.

``cost.py`` counts these schedules (no closed form, like the bidirectional ring): with
``ports`` >= p-1 its replay is exactly the k = p-1 column above; with fewer ports its
first-come-first-served replay serves the p-1 messages in matching order and counts up to ~2x
the ⌈(p-1)/k⌉-round optimum, so ``auto`` prefers direct only where a rank drives (nearly) all
peers at once. Over NCCL send/recv on GPUs its transfers take a fraction of its time: the
p-1 reductions are the rest, one kernel each, which is why the NCCL executor fuses such a
chain into one kernel (BENCHMARKS.md §3).

``two_shot`` (all_reduce) chains the two: direct reduce_scatter of the vector's p blocks, then
direct all_gather of the reduced blocks, one plan of two steps. A rank moves 2(p-1)/p of the
vector (the ring's bytes) in 2 steps instead of the one-shot's p-1 vectors in one, so over
peer memory it beats both direct (fewer bytes) and the ring (fewer steps) from medium sizes
on (BENCHMARKS.md §6).

Every rank sends to rank+1, rank+2, ... and receives from rank-1, rank-2, ..., so at any
moment each rank is the target of one sender under a one-port transport, not of everyone at
once. Zero-size blocks are dropped by the vocabulary on both sides alike; p = 1 is a copy (or
nothing, for all_reduce). The rooted collectives (broadcast, reduce, gather, scatter) are not
here: a root sending to or receiving from all p-1 ranks at once is the tree with full fan-out,
which the tree module covers.
"""
import functools

from .schedule import Copy, Recv, Reduce, Region, Send, Step, algorithm, layout, partition

NAME = "direct"
TWO_SHOT = "two_shot"


def _peers(rank, size):
    """(send-to, receive-from) pairs in the order messages are posted: shifted by 1, 2, ..."""
    return [((rank + k) % size, (rank - k) % size) for k in range(1, size)]


def _rank_order_operands(rank, size, width, own):
    """One region per rank, in rank order: ``own`` for this rank, a scratch slot of ``width``
    elements for every peer (peers in rank order, this rank skipped): where peer data lands."""
    slots = _slots(size - 1, width)
    return [*slots[:rank], own, *slots[rank:]]


@functools.lru_cache(maxsize=64)
def _slots(n, width):
    """``n`` consecutive scratch slots; shared by the plans of every rank (at p = 1024 a plan
    holds thousands of regions, and building them is most of the cost of a plan)."""
    return tuple(Region("scratch", j * width, width) for j in range(n))


def _rank_order_sum(operands, dst):
    """Reductions combining ``operands`` (one per rank, in rank order) into ``dst`` as
    ((x0 op x1) op x2) op ...; ``dst`` may be one of the operands (read only by its turn)."""
    if len(operands) == 1:
        return [] if operands[0] == dst else [Copy(operands[0], dst)]
    # the running sum stays in operand 0's place (scratch) while dst still holds an operand
    # yet to come; from that operand on it lives in dst
    last_in_dst = max((k for k, x in enumerate(operands) if x == dst), default=0)
    ops, acc = [], operands[0]
    for k in range(1, len(operands)):
        into = acc if k < last_in_dst else dst
        ops.append(Reduce(into, acc, operands[k]))
        acc = into
    return ops


@algorithm("all_reduce", NAME)
def all_reduce(rank, size, count):
    """One step: the whole vector to every peer; then the p vectors reduced in rank order."""
    if size == 1:
        return
    mine = Region("output", 0, count)
    operands = _rank_order_operands(rank, size, count, mine)
    peers = _peers(rank, size)
    yield Step(sends=tuple(Send(to, mine) for to, _ in peers),
               recvs=tuple(Recv(frm, operands[frm]) for _, frm in peers),
               local=tuple(_rank_order_sum(operands, mine)))


@algorithm("all_reduce", TWO_SHOT)
def all_reduce_two_shot(rank, size, count):
    """Two steps: direct reduce_scatter of the vector's p blocks, then direct all_gather.

    Step 1 sends block i to rank i and reduces the p copies of this rank's block in rank
    order; step 2 sends the reduced block to every peer, whose copies land in their places.
    A rank moves 2(p-1)/p of the vector instead of the one-shot's p-1 vectors, for one more
    step: the one-shot wins while a message is latency, this from where bytes dominate (on
    NVLink from ~1 MiB at p = 4). Every block is reduced by its owner alone, in rank order,
    so every rank holds the same bits, those of ``simulate.reference``.
    """
    if size == 1:
        return
    blocks = partition(count, size)
    mine = blocks[rank]
    operands = _rank_order_operands(rank, size, mine.count, mine)
    peers = _peers(rank, size)
    yield Step(sends=tuple(Send(to, blocks[to]) for to, _ in peers),
               recvs=tuple(Recv(frm, operands[frm]) for _, frm in peers),
               local=tuple(_rank_order_sum(operands, mine)))
    yield Step(sends=tuple(Send(to, mine) for to, _ in peers),
               recvs=tuple(Recv(frm, blocks[frm]) for _, frm in peers))


@algorithm("reduce_scatter", NAME)
def reduce_scatter(rank, size, counts):
    """One step: block i of the input to rank i; the p copies of my block reduced in rank order."""
    blocks = layout(counts, "input")
    out = Region("output", 0, counts[rank])
    operands = _rank_order_operands(rank, size, counts[rank], blocks[rank])
    peers = _peers(rank, size)
    yield Step(sends=tuple(Send(to, blocks[to]) for to, _ in peers),
               recvs=tuple(Recv(frm, operands[frm]) for _, frm in peers),
               local=tuple(_rank_order_sum(operands, out)))


@algorithm("all_gather", NAME)
def all_gather(rank, size, counts):
    """One step: my block to everyone, every block straight into its place in output."""
    out = layout(counts, "output")
    own = Region("input", 0, counts[rank])
    peers = _peers(rank, size)
    yield Step(sends=tuple(Send(to, own) for to, _ in peers),
               recvs=tuple(Recv(frm, out[frm]) for _, frm in peers),
               local=(Copy(own, out[rank]),))


@algorithm("all_to_all", NAME)
def all_to_all(rank, size, counts):
    """One step: every pairwise block at once (alltoallv)."""
    outgoing = layout(counts[rank], "input")
    incoming = layout([row[rank] for row in counts], "output")
    peers = _peers(rank, size)
    yield Step(sends=tuple(Send(to, outgoing[to]) for to, _ in peers),
               recvs=tuple(Recv(frm, incoming[frm]) for _, frm in peers),
               local=(Copy(outgoing[rank], incoming[rank]),))
