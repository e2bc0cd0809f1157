"""Binomial-tree algorithms: ⌈log2 p⌉ rounds; latency-optimal, bandwidth-poor.

Ranks are renamed relative to the root, v = (rank - root) % p. In a binomial tree rank v ≠ 0
has parent v - lowbit(v) and owns the subtree [v, v + lowbit(v)) ∩ [0, p); its children are
v + m for the powers of two m < lowbit(v) (for the root: m < p). Data flows up the tree
(reduce, gather) smallest subtree first, and down it (broadcast, scatter) largest subtree
first, one message per step. Costs in the α-β-γ model with L = ⌈log2 p⌉, n elements (the
vector; for gather/scatter/all_gather/reduce_scatter the whole concatenation):

broadcast: the root's data goes down the tree, in place in output. Cost L(α + nβ). Limits:
every round moves the whole vector, so for large n a ring (pipelined chain) wins.

reduce: partial sums go up the tree; each rank adds its children's subtrees in ascending
order into an accumulator (output at the root, scratch elsewhere; input is read-only, a leaf
sends its input as is). Cost L(α + nβ + nγ).

gather: subtrees' blocks go up, concatenated in relative-rank order; a rank's subtree is one
contiguous run of relative ranks, so every message is one region. Cost Lα + ((p-1)/p)nβ.
Relative order wraps around for root ≠ 0 (relative ranks 0.. are ranks root..p-1, 0..root-1),
so that root assembles in scratch and copies the two runs into output at the end (one local
copy of n). Non-roots write only scratch.

scatter: the mirror of gather: the root (after staging its input in relative order in scratch
when root ≠ 0) sends each child its subtree's run; inner ranks keep their own block and pass
the rest down. Cost Lα + ((p-1)/p)nβ.

all_reduce: binomial reduce to rank 0, then binomial broadcast of rank 0's final vector, so
every rank holds bitwise the same result. Cost 2Lα + 2Lnβ + Lnγ: the choice for small n.

reduce_scatter: binomial reduce of the whole input to rank 0 (in scratch), then binomial
scatter of the blocks. Cost 2Lα + (L + (p-1)/p)nβ + Lnγ.

all_gather: binomial gather to rank 0, then binomial broadcast of the whole output. Cost
2Lα + (L + (p-1)/p)nβ.

all_to_all: binomial gather of every rank's whole send buffer to rank 0, which rearranges the
p² blocks by destination, then binomial scatter. With n elements per send buffer the root's
link carries (p-1)n each way: cost 2Lα + 2(p-1)nβ against the pairwise exchange's
(p-1)α + ((p-1)/p)nβ. It trades bandwidth (a factor ≈ p²) for latency (L instead of p-1
messages), so it only makes sense for tiny messages at large p.

barrier: one-element tokens gathered up the tree, then released down it. Cost 2Lα.
"""
from .schedule import Copy, Recv, Reduce, Region, Send, Step, algorithm, copy, recv, send


def _limit(v, size):
    """Subtree width of relative rank v: lowbit(v), or for the root the power of two ≥ p."""
    return v & -v if v else 1 << (size - 1).bit_length()


def _children(v, size):
    """Relative ranks of v's children, smallest subtree first."""
    limit, m, kids = _limit(v, size), 1, []
    while m < limit and v + m < size:
        kids.append(v + m)
        m <<= 1
    return kids


def _span_end(v, size):
    """One past the last relative rank of v's subtree."""
    return min(v + _limit(v, size), size)


def _parent(v):
    return v - (v & -v)


def _offsets(counts):
    offsets, total = [0], 0
    for n in counts:
        total += n
        offsets.append(total)
    return offsets


# --- the four tree shapes, in relative ranks; ``actual(u)`` maps back to a real rank --------

def _reduce_up(v, size, actual, src, acc, landing):
    """acc = src (op) every child's subtree sum; sent to the parent unless v is the root.
    ``landing`` (scratch) takes each child's message; ``acc`` may be ``src`` (in place)."""
    first = src
    kids = _children(v, size)
    for child in kids:
        yield Step(recvs=(Recv(actual(child), landing),), local=(Reduce(acc, first, landing),))
        first = acc
    if v:
        yield send(actual(_parent(v)), acc if kids else src)
    elif not kids and acc != src:
        yield copy(src, acc)


def _broadcast_down(v, size, actual, region):
    if v:
        yield recv(actual(_parent(v)), region)
    for child in reversed(_children(v, size)):
        yield send(actual(child), region)


def _gather_up(v, size, actual, offsets, own, assembled):
    """Collect the blocks of v's subtree, in relative order, into ``assembled`` (which starts
    with v's own block, relative offset ``offsets[v]``) and pass them to the parent."""
    kids = _children(v, size)
    if v and not kids:
        yield send(actual(_parent(v)), own)       # a leaf sends its input as is
        return
    base = offsets[v]
    place_own = (Copy(own, assembled.sub(0, own.count)),) if own != assembled.sub(0, own.count) else ()
    if not kids:
        yield Step(local=place_own)
    for i, child in enumerate(kids):
        start, end = offsets[child], offsets[_span_end(child, size)]
        yield Step(recvs=(Recv(actual(child), assembled.sub(start - base, end - start)),),
                   local=place_own if i == 0 else ())
    if v:
        yield send(actual(_parent(v)), assembled.sub(0, offsets[_span_end(v, size)] - base))


def _scatter_down(v, size, actual, offsets, assembled, out):
    """The mirror of ``_gather_up``: at the root ``assembled`` holds every block in relative
    order; elsewhere it is where v's subtree arrives (a leaf receives straight into ``out``)."""
    kids = _children(v, size)
    base = offsets[v]
    own = assembled.sub(0, offsets[v + 1] - base)
    if v:
        if not kids:
            yield recv(actual(_parent(v)), out)
            return
        yield Step(recvs=(Recv(actual(_parent(v)), assembled.sub(0, offsets[_span_end(v, size)] - base)),),
                   local=(Copy(own, out),))
    keep_own = () if v else (Copy(own, out),)   # the root's own block, after its first send
    if not kids and keep_own:
        yield Step(local=keep_own)
    for i, child in enumerate(reversed(kids)):
        start, end = offsets[child], offsets[_span_end(child, size)]
        yield Step(sends=(Send(actual(child), assembled.sub(start - base, end - start)),),
                   local=keep_own if i == 0 else ())


def _identity(u):
    return u


def _rooted(root, size):
    return lambda u: (u + root) % size


def _relative(counts, root):
    """Per-rank counts reordered by relative rank (rank root first)."""
    return counts[root:] + counts[:root]


# --- the collectives -----------------------------------------------------------------------

@algorithm("broadcast", "tree")
def broadcast(rank, size, count, root):
    """Binomial broadcast from ``root``, in place in output."""
    yield from _broadcast_down((rank - root) % size, size, _rooted(root, size),
                               Region("output", 0, count))


@algorithm("reduce", "tree")
def reduce(rank, size, count, root):
    """Binomial reduce to ``root``; non-roots accumulate in scratch."""
    acc = Region("output", 0, count) if rank == root else Region("scratch", count, count)
    yield from _reduce_up((rank - root) % size, size, _rooted(root, size),
                          Region("input", 0, count), acc, Region("scratch", 0, count))


@algorithm("all_reduce", "tree")
def all_reduce(rank, size, count):
    """Binomial reduce to rank 0, then binomial broadcast of rank 0's result."""
    data = Region("output", 0, count)
    yield from _reduce_up(rank, size, _identity, data, data, Region("scratch", 0, count))
    yield from _broadcast_down(rank, size, _identity, data)


@algorithm("gather", "tree")
def gather(rank, size, counts, root):
    """Binomial gather to ``root`` in relative order; root ≠ 0 unwraps through scratch."""
    v = (rank - root) % size
    offsets = _offsets(_relative(counts, root))
    total = offsets[-1]
    own = Region("input", 0, counts[rank])
    if v == 0 and root == 0:
        assembled = Region("output", 0, total)
    else:
        assembled = Region("scratch", 0, offsets[_span_end(v, size)] - offsets[v])
    yield from _gather_up(v, size, _rooted(root, size), offsets, own, assembled)
    if v == 0 and root != 0:
        # relative 0..p-root-1 are ranks root..p-1, the tail of output; the rest its head
        head = offsets[size - root]
        yield Step(local=(Copy(assembled.sub(0, head), Region("output", total - head, head)),
                          Copy(assembled.sub(head, total - head), Region("output", 0, total - head))))


@algorithm("scatter", "tree")
def scatter(rank, size, counts, root):
    """Binomial scatter from ``root``; root ≠ 0 first stages its input in relative order."""
    v = (rank - root) % size
    offsets = _offsets(_relative(counts, root))
    total = offsets[-1]
    if v == 0 and root == 0:
        assembled = Region("input", 0, total)
    elif v == 0:
        head = offsets[size - root]        # ranks root..p-1: the tail of input
        assembled = Region("scratch", 0, total)
        yield Step(local=(Copy(Region("input", total - head, head), assembled.sub(0, head)),
                          Copy(Region("input", 0, total - head), assembled.sub(head, total - head))))
    else:
        assembled = Region("scratch", 0, offsets[_span_end(v, size)] - offsets[v])
    yield from _scatter_down(v, size, _rooted(root, size), offsets, assembled,
                             Region("output", 0, counts[rank]))


@algorithm("reduce_scatter", "tree")
def reduce_scatter(rank, size, counts):
    """Binomial reduce of the whole input to rank 0, then binomial scatter of its blocks."""
    offsets = _offsets(counts)
    total = offsets[-1]
    acc = Region("scratch", total, total)
    yield from _reduce_up(rank, size, _identity, Region("input", 0, total), acc,
                          Region("scratch", 0, total))
    # the reduce phase is over on this rank, so the scatter may reuse scratch from 0
    assembled = acc if rank == 0 else Region(
        "scratch", 0, offsets[_span_end(rank, size)] - offsets[rank])
    yield from _scatter_down(rank, size, _identity, offsets, assembled,
                             Region("output", 0, counts[rank]))


@algorithm("all_gather", "tree")
def all_gather(rank, size, counts):
    """Binomial gather to rank 0, then binomial broadcast of the whole output."""
    offsets = _offsets(counts)
    everything = Region("output", 0, offsets[-1])
    assembled = everything if rank == 0 else Region(
        "scratch", 0, offsets[_span_end(rank, size)] - offsets[rank])
    yield from _gather_up(rank, size, _identity, offsets, Region("input", 0, counts[rank]),
                          assembled)
    yield from _broadcast_down(rank, size, _identity, everything)


_totals_cache = [None, None]


def _matrix_totals(counts):
    """(row sums, column sums) of the all_to_all count matrix. Every rank of a simulation asks
    about the same matrix object, and at p = 1024 summing it costs more than the schedule, so
    the last answer is kept (keyed by identity, with the object itself held so the id stays
    valid)."""
    if _totals_cache[0] is not counts:
        rows = [sum(row) for row in counts]
        cols = [sum(col) for col in zip(*counts)] if counts else []
        _totals_cache[:] = [counts, (rows, cols)]
    return _totals_cache[1]


@algorithm("all_to_all", "tree")
def all_to_all(rank, size, counts):
    """Binomial gather of whole send buffers to rank 0, rearranged there by destination,
    then binomial scatter. Only for tiny messages: the root moves (p-1)·n each way."""
    rows, cols = _matrix_totals(counts)
    sent = _offsets(rows)
    received = _offsets(cols)
    total = sent[-1]
    if rank == 0:
        gathered = Region("scratch", 0, total)
        by_destination = Region("scratch", total, total)
    else:
        gathered = Region("scratch", 0, sent[_span_end(rank, size)] - sent[rank])
        by_destination = Region("scratch", 0, received[_span_end(rank, size)] - received[rank])
    yield from _gather_up(rank, size, _identity, sent, Region("input", 0, rows[rank]), gathered)
    if rank == 0:
        yield Step(local=tuple(_rearrange(counts, received, gathered, by_destination)))
    # on other ranks the gather phase is over before the scatter reuses scratch from 0
    yield from _scatter_down(rank, size, _identity, received, by_destination,
                             Region("output", 0, cols[rank]))


def _rearrange(counts, received, gathered, by_destination):
    """Copies that turn source-major blocks (i sends to j) into destination-major ones."""
    cursor = list(received[:-1])       # next free offset in each destination's run
    src = 0
    for row in counts:
        for j, n in enumerate(row):
            if n:
                yield Copy(gathered.sub(src, n), by_destination.sub(cursor[j], n))
                cursor[j] += n
                src += n


@algorithm("barrier", "tree")
def barrier(rank, size):
    """Tokens gathered up a binomial tree to rank 0, then released down it."""
    token = Region("scratch", 0, 1)
    kids = _children(rank, size)
    for child in kids:
        yield recv(child, token)
    if rank:
        yield send(_parent(rank), token)
        yield recv(_parent(rank), token)
    for child in reversed(kids):
        yield send(child, token)
