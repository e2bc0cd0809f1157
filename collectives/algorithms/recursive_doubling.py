"""Recursive doubling and halving: partners at distance 1, 2, 4, ... (or the reverse), so every
collective finishes in about log2 p rounds. Costs below are for p ranks and n elements in all
(α: per-message latency, β: per-element transfer time, γ: per-element reduction time); lg p is
log2 p rounded up. Non-powers of two are first-class: reductions *fold* the extra ranks the
MPICH way, data movements use Bruck's rotated layout, rooted trees use relative ranks.

Folding (all_reduce, reduce_scatter, reduce). Let p' = 2^floor(log2 p) and r = p - p'. Among
the first 2r ranks every odd rank sends its whole vector to the even rank below it, which
reduces it and stands for both; the p' survivors (new rank = rank/2 below 2r, rank - r above)
run the power-of-two algorithm; at the end each even rank sends the odd one its result. It
costs two extra rounds (2α + 2nβ + nγ on the folded pairs) and leaves r ranks idle meanwhile.

all_reduce. Below ``RABENSEIFNER_MIN_BLOCK * p'`` elements (16 per block) it is plain
recursive doubling: in round k every survivor swaps its whole vector with new rank ^ 2^k and
reduces, lg p' rounds: lg p'·(α + nβ + nγ). From that count on it is Rabenseifner's: a
recursive-halving reduce-scatter (round k swaps half of the still-shared range with new rank ^
p'/2^(k+1), keeps and reduces its own half) then a recursive-doubling all-gather of the
reduced blocks: 2 lg p'·α + 2((p'-1)/p')nβ + ((p'-1)/p')nγ, bandwidth-optimal like the ring
with log latency. The threshold is in elements, not bytes (schedules do not know the dtype):
16 elements per block is where the extra lg p' messages stop outweighing the n lg p' volume
of recursive doubling for α/β of a few hundred elements. Every rank ends with the same bits:
in recursive doubling both partners combine the same two partial results, always as (lower
new rank's) op (higher new rank's); in Rabenseifner each block is reduced on one rank and
copied everywhere else.

reduce_scatter. Recursive halving over the p' survivors, each standing for a contiguous group
of output blocks (two after folding, one otherwise), uneven and empty blocks allowed; the
folded pairs then split their group: lg p'·α + ((p'-1)/p')nβ + ((p'-1)/p')nγ, plus the fold.
The input is read-only, so the running partial sums live in scratch (n elements plus an
n-element landing area).

all_gather. Powers of two: recursive doubling, round k swaps the 2^k blocks gathered so far
with rank ^ 2^k: lg p·α + ((p-1)/p)nβ. Other sizes: Bruck; each rank keeps blocks in rotated
order in scratch (slot i = block of rank + i); round k sends the first min(2^k, p - 2^k) slots
to rank - 2^k and receives as many from rank + 2^k; at the end one rotation (two copies)
puts them in place: lg p·α + ((p-1)/p)nβ + n copied. Uneven blocks (allgatherv) work because
every rank knows every block's size.

all_to_all. Bruck: slot j of rank r holds what r sends to r + j; round k sends every slot
whose index has bit k set to r + 2^k, which keeps it in the same slot; after lg p rounds slot j
of r holds the block from r - j. Per round one message: the outgoing slots are packed into a
staging area (unless they already lie back to back) and the incoming ones stay where they
land, so the only copies are one pack per round and the final placement. Per-pair counts
may be arbitrary (the matrix is known to every rank). lg p·α + (n/2)lg p·β (n = elements a
rank sends, spread evenly) plus the copies: latency-optimal, but it moves lg p/2 times the
data of a direct exchange, so it is for small blocks. Scratch holds up to (n/2)(lg p + 1).

broadcast. From ``BROADCAST_SCATTER_MIN_BLOCK * p`` elements (16 per block) on, van de Geijn's
scatter + all-gather: a binomial scatter of the p blocks from the root (relative ranks) then
an all-gather of the blocks, recursive doubling for powers of two (lg p·α + ((p-1)/p)nβ) and a
ring otherwise ((p-1)α + ((p-1)/p)nβ): 2 lg p·α + 2((p-1)/p)nβ for powers of two. Below that
it is a binomial tree, lg p·(α + nβ).

reduce. Rabenseifner's reduce: in ranks relative to the root (so the root is never folded
away), fold, recursive-halving reduce-scatter, then a binomial gather of the reduced blocks to
the root: 2 lg p'·α + 2((p'-1)/p')nβ + ((p'-1)/p')nγ, plus the fold. Non-roots work in
scratch and never touch output; for counts below p' some blocks are empty and some rounds
carry nothing, so small counts pay 2 lg p' latencies where a binomial tree pays lg p.

gather / scatter. A binomial tree is the recursive-doubling pattern for these (distances
doubling toward the root, halving away from it): the tree module's schedules are registered
under this name as well, so every collective has a recursive-doubling schedule.
lg p·α + ((p-1)/p)nβ.

barrier. Dissemination: in round k send one byte to rank + 2^k and receive one from
rank - 2^k; after lg p rounds every rank has heard, directly or not, from every other:
lg p·α, for any p.
"""
from __future__ import annotations

from itertools import chain

from . import tree

from .schedule import (Copy, Recv, Reduce, Region, Send, Step, algorithm, copy, recv, send,
                       sendrecv)

NAME = "recursive_doubling"

# Elements per block from which all_reduce switches to Rabenseifner (see the module text).
RABENSEIFNER_MIN_BLOCK = 16
# Elements per block from which broadcast uses scatter + all-gather instead of a binomial tree.
BROADCAST_SCATTER_MIN_BLOCK = 16


# ---------------------------------------------------------------------------------------------
# Offsets and folding: small pure functions, the data movement stays in the schedules below.


def _bounds(counts) -> list[int]:
    """Block boundaries: block i spans [bounds[i], bounds[i+1])."""
    bounds, total = [0], 0
    for n in counts:
        total += n
        bounds.append(total)
    return bounds


def _even_bounds(count: int, parts: int) -> list[int]:
    """Boundaries of ``partition(count, parts)``: the first count % parts blocks get one more."""
    q, r = divmod(count, parts)
    return [i * q + min(i, r) for i in range(parts + 1)]


def _span(where, bounds, first, stop) -> Region:
    """Blocks [first, stop) of a buffer laid out by ``bounds``; ``where`` = (buffer, base)."""
    buffer, base = where
    return Region(buffer, base + bounds[first], bounds[stop] - bounds[first])


def _is_power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


def _fold(rank: int, size: int):
    """MPICH folding: (p', r, new rank), new rank None for the odd ranks below 2r."""
    pof2 = 1 << (size.bit_length() - 1)
    rem = size - pof2
    if rank < 2 * rem:
        return pof2, rem, (None if rank % 2 else rank // 2)
    return pof2, rem, rank - rem


def _unfold(newrank: int, rem: int) -> int:
    """The rank that plays new rank ``newrank``."""
    return 2 * newrank if newrank < rem else newrank + rem


def _reduce_pair(dst, mine, theirs, me, partner):
    """dst = (lower rank's data) op (higher rank's data): both partners of an exchange combine
    the same operands in the same order, so non-commutative quirks (-0.0 vs 0.0 under MIN, NaN
    payloads) cannot make ranks disagree."""
    return Reduce(dst, mine, theirs) if me < partner else Reduce(dst, theirs, mine)


def _halving(n, pof2, to_real, bounds, src, work, landing_base, last_dst=None):
    """Recursive-halving reduce-scatter among new ranks 0..pof2-1 over pof2 groups of blocks
    laid out by ``bounds``. The data starts in ``src`` and the kept halves are reduced into
    ``work`` (both (buffer, base)); the last round writes into ``last_dst`` when given. At the
    end new rank n holds group n, reduced over all survivors, in ``work``."""
    lo, hi, mask = 0, pof2, pof2 // 2
    while mask:
        partner = n ^ mask
        mid = lo + mask
        keep, give = ((mid, hi), (lo, mid)) if n & mask else ((lo, mid), (mid, hi))
        dst = _span(work, bounds, *keep)
        if mask == 1 and last_dst is not None:
            dst = last_dst
        landing = Region("scratch", landing_base, dst.count)
        peer = to_real(partner)
        yield Step(sends=(Send(peer, _span(src, bounds, *give)),), recvs=(Recv(peer, landing),),
                   local=(_reduce_pair(dst, _span(src, bounds, *keep), landing, n, partner),))
        src = work
        lo, hi = keep
        mask //= 2


def _doubling_all_gather(n, pof2, to_real, where, bounds):
    """Recursive-doubling all-gather among new ranks 0..pof2-1; new rank n starts with block n."""
    mask = 1
    while mask < pof2:
        partner = n ^ mask
        mine, theirs = n & -mask, partner & -mask
        peer = to_real(partner)
        yield sendrecv(peer, _span(where, bounds, mine, mine + mask),
                       peer, _span(where, bounds, theirs, theirs + mask))
        mask *= 2


# ---------------------------------------------------------------------------------------------
# Reductions


@algorithm("all_reduce", NAME)
def all_reduce(rank, size, count):
    """Recursive doubling below 16 elements per block, Rabenseifner above; folds non-powers
    of two."""
    if size == 1:
        return
    pof2, rem, n = _fold(rank, size)
    out = Region("output", 0, count)
    landing = Region("scratch", 0, count)
    if rank < 2 * rem:
        if n is None:                       # folded away: hand over the data, wait for the result
            yield send(rank - 1, out)
            yield recv(rank - 1, out)
            return
        yield Step(recvs=(Recv(rank + 1, landing),), local=(Reduce(out, out, landing),))

    def to_real(m):
        return _unfold(m, rem)

    if count >= RABENSEIFNER_MIN_BLOCK * pof2:
        bounds = _even_bounds(count, pof2)
        yield from _halving(n, pof2, to_real, bounds, ("output", 0), ("output", 0), 0)
        yield from _doubling_all_gather(n, pof2, to_real, ("output", 0), bounds)
    else:
        mask = 1
        while mask < pof2:
            partner = n ^ mask
            peer = to_real(partner)
            yield Step(sends=(Send(peer, out),), recvs=(Recv(peer, landing),),
                       local=(_reduce_pair(out, out, landing, n, partner),))
            mask *= 2
    if rank < 2 * rem:
        yield send(rank + 1, out)


@algorithm("reduce_scatter", NAME)
def reduce_scatter(rank, size, counts):
    """Recursive halving over the p' survivors' groups of blocks; folds non-powers of two."""
    total = sum(counts)
    bounds = _bounds(counts)
    mine = Region("output", 0, counts[rank])
    whole_input = Region("input", 0, total)
    if size == 1:
        yield copy(whole_input, mine)
        return
    pof2, rem, n = _fold(rank, size)
    src = ("input", 0)
    if rank < 2 * rem:
        if n is None:
            yield send(rank - 1, whole_input)
            yield recv(rank - 1, mine)
            return
        landing = Region("scratch", total, total)
        yield Step(recvs=(Recv(rank + 1, landing),),
                   local=(Reduce(Region("scratch", 0, total), whole_input, landing),))
        src = ("scratch", 0)
    # Survivor m stands for blocks [_unfold(m), _unfold(m + 1)): two after folding, else one.
    group_bounds = [bounds[_unfold(m, rem)] for m in range(pof2)] + [total]
    single = rank >= 2 * rem
    yield from _halving(n, pof2, lambda m: _unfold(m, rem), group_bounds, src, ("scratch", 0),
                        total, last_dst=mine if single else None)
    if not single:
        partner_block = Region("scratch", bounds[rank + 1], counts[rank + 1])
        yield Step(sends=(Send(rank + 1, partner_block),),
                   local=(Copy(Region("scratch", bounds[rank], counts[rank]), mine),))


@algorithm("reduce", NAME)
def reduce(rank, size, count, root):
    """Rabenseifner's reduce: fold, recursive-halving reduce-scatter, binomial gather to the
    root, all in ranks relative to the root. Non-roots work in scratch."""
    if size == 1:
        yield copy(Region("input", 0, count), Region("output", 0, count))
        return
    rel = (rank - root) % size
    pof2, rem, n = _fold(rel, size)

    def real(v):
        return (v + root) % size

    def to_real(m):
        return real(_unfold(m, rem))

    whole_input = Region("input", 0, count)
    work = ("output", 0) if rel == 0 else ("scratch", 0)
    landing_base = 0 if rel == 0 else count
    src = ("input", 0)
    if rel < 2 * rem:
        if n is None:
            yield send(real(rel - 1), whole_input)
            return
        landing = Region("scratch", landing_base, count)
        yield Step(recvs=(Recv(real(rel + 1), landing),),
                   local=(Reduce(Region(work[0], 0, count), whole_input, landing),))
        src = work
    bounds = _even_bounds(count, pof2)
    yield from _halving(n, pof2, to_real, bounds, src, work, landing_base)
    mask = 1
    while mask < pof2:                      # binomial gather of the reduced blocks to new rank 0
        if n & mask:
            yield send(to_real(n - mask), _span(work, bounds, n, n + mask))
            return
        yield recv(to_real(n + mask), _span(work, bounds, n + mask, n + 2 * mask))
        mask *= 2


# ---------------------------------------------------------------------------------------------
# Data movement


@algorithm("all_gather", NAME)
def all_gather(rank, size, counts):
    """Recursive doubling for powers of two, Bruck otherwise."""
    own = Region("input", 0, counts[rank])
    bounds = _bounds(counts)
    out = ("output", 0)
    if size == 1:
        yield copy(own, _span(out, bounds, 0, 1))
        return
    if _is_power_of_two(size):
        mask = 1
        while mask < size:
            partner = rank ^ mask
            mine, theirs = rank & -mask, partner & -mask
            # The first round sends straight from input and files the own block meanwhile.
            outgoing = own if mask == 1 else _span(out, bounds, mine, mine + mask)
            local = (Copy(own, _span(out, bounds, rank, rank + 1)),) if mask == 1 else ()
            yield Step(sends=(Send(partner, outgoing),),
                       recvs=(Recv(partner, _span(out, bounds, theirs, theirs + mask)),),
                       local=local)
            mask *= 2
        return
    # Bruck: slot i holds the block of rank + i; rank 0's rotation is the identity, so it
    # works in output directly.
    slots = ("output", 0) if rank == 0 else ("scratch", 0)
    slot_bounds = _bounds([counts[(rank + i) % size] for i in range(size)])
    dist = 1
    while dist < size:
        n_slots = min(dist, size - dist)
        outgoing = own if dist == 1 else _span(slots, slot_bounds, 0, n_slots)
        local = [Copy(own, _span(slots, slot_bounds, 0, 1))] if dist == 1 else []
        if 2 * dist >= size and rank != 0:          # last round: rotate into place
            local.append(Copy(_span(slots, slot_bounds, 0, size - rank),
                              _span(out, bounds, rank, size)))
            local.append(Copy(_span(slots, slot_bounds, size - rank, size),
                              _span(out, bounds, 0, rank)))
        yield Step(sends=(Send((rank - dist) % size, outgoing),),
                   recvs=(Recv((rank + dist) % size,
                               _span(slots, slot_bounds, dist, dist + n_slots)),),
                   local=tuple(local))
        dist *= 2


def _contiguous(regions) -> Region | None:
    """The one region the given regions make up end to end, or None."""
    first = regions[0]
    end = first.end
    for region in regions[1:]:
        if region.buffer != first.buffer or region.offset != end:
            return None
        end = region.end
    return Region(first.buffer, first.offset, end - first.offset)


def _with_bit(dist, size):
    """The slot indices below ``size`` that have bit ``dist`` set, in increasing order."""
    return list(chain.from_iterable(range(base, min(base + dist, size))
                                    for base in range(dist, size, 2 * dist)))


@algorithm("all_to_all", NAME)
def all_to_all(rank, size, counts):
    """Bruck: lg p rounds, slots with bit k set travel 2^k ranks on in round k."""
    row = counts[rank]
    send_bounds = _bounds(row)
    recv_bounds = _bounds([counts[i][rank] for i in range(size)])
    if size == 1:
        yield copy(Region("input", 0, row[0]), Region("output", 0, row[0]))
        return
    dists = []
    dist = 1
    while dist < size:
        dists.append(dist)
        dist *= 2
    # Pass 1: what arrives in each round. After round k, slot j holds the block from
    # s = rank - (j mod 2^(k+1)) to s + j (each round moves slots with its bit set).
    arrivals, landing_bases, scratch_end = [], [], 0
    moving = [_with_bit(dist, size) for dist in dists]
    for k, dist in enumerate(dists):
        low = 2 * dist - 1
        incoming = []
        for j in moving[k]:
            s = (rank - (j & low)) % size
            n = counts[s][(s + j) % size]
            if n:
                incoming.append((j, n))
        arrivals.append(incoming)
        landing_bases.append(scratch_end)
        scratch_end += sum(n for _, n in incoming)
    stage_base = scratch_end
    # Pass 2: where each slot's data lies now (None: empty); initially the input blocks.
    where = [None] * size
    for j in range(1, size):
        dest = (rank + j) % size
        if row[dest]:
            where[j] = Region("input", send_bounds[dest], row[dest])
    pending_local = []                       # local ops of the previous step (packing)
    steps = []
    for k, dist in enumerate(dists):
        outgoing = [where[j] for j in moving[k] if where[j] is not None]
        message = _contiguous(outgoing) if outgoing else None
        if outgoing and message is None:
            offset = stage_base
            for region in outgoing:
                staged = Region("scratch", offset, region.count)
                pending_local.append(Copy(region, staged))
                offset += region.count
            message = Region("scratch", stage_base, offset - stage_base)
        if steps:
            steps[-1] = Step(steps[-1].sends, steps[-1].recvs, tuple(pending_local))
        elif pending_local:
            steps.append(Step(local=tuple(pending_local)))
        pending_local = []
        offset = landing_bases[k]
        for j in moving[k]:
            where[j] = None
        for j, n in arrivals[k]:
            where[j] = Region("scratch", offset, n)
            offset += n
        landing = Region("scratch", landing_bases[k], offset - landing_bases[k])
        sends = (Send((rank + dist) % size, message),) if message is not None else ()
        steps.append(Step(sends=sends, recvs=(Recv((rank - dist) % size, landing),)))
    # Slot j now holds the block from rank - j; file every block in output.
    final = [Copy(Region("input", send_bounds[rank], row[rank]),
                  Region("output", recv_bounds[rank], row[rank]))]
    for j in range(1, size):
        if where[j] is not None:
            source = (rank - j) % size
            final.append(Copy(where[j], Region("output", recv_bounds[source], where[j].count)))
    steps[-1] = Step(steps[-1].sends, steps[-1].recvs, tuple(final))
    yield from steps


@algorithm("broadcast", NAME)
def broadcast(rank, size, count, root):
    """van de Geijn (binomial scatter + all-gather) from 16 elements per block, else a
    binomial tree."""
    if size == 1:
        return
    rel = (rank - root) % size

    def real(v):
        return (v + root) % size

    whole = Region("output", 0, count)
    if count < BROADCAST_SCATTER_MIN_BLOCK * size:
        yield from _binomial_down(rel, size, real, lambda first, stop: whole)
        return
    bounds = _even_bounds(count, size)       # block v belongs to relative rank v
    out = ("output", 0)
    yield from _binomial_down(rel, size, real,
                              lambda first, stop: _span(out, bounds, first, stop))
    if _is_power_of_two(size):
        yield from _doubling_all_gather(rel, size, real, out, bounds)
        return
    right, left = real(rel + 1), real(rel - 1)
    for s in range(size - 1):
        sent, got = (rel - s) % size, (rel - s - 1) % size
        yield sendrecv(right, _span(out, bounds, sent, sent + 1),
                       left, _span(out, bounds, got, got + 1))


def _binomial_down(rel, size, real, subtree):
    """Binomial scatter/broadcast from relative rank 0: receive ``subtree(rel, end)`` from the
    parent, then hand each child its subtree, largest first. ``subtree(first, stop)`` is the
    region holding relative ranks [first, stop)'s data."""
    mask = 1
    while mask < size:
        if rel & mask:
            yield recv(real(rel - mask), subtree(rel, min(rel + mask, size)))
            break
        mask *= 2
    mask //= 2
    while mask:
        if rel + mask < size:
            yield send(real(rel + mask), subtree(rel + mask, min(rel + 2 * mask, size)))
        mask //= 2


# A binomial tree is already the recursive-doubling pattern for gather (distances doubling
# toward the root) and scatter (halving away from it): the tree module's schedules serve
# under this name too, rather than a second copy of them.
algorithm("gather", NAME)(tree.gather)
algorithm("scatter", NAME)(tree.scatter)


@algorithm("barrier", NAME)
def barrier(rank, size):
    """Dissemination: round k sends to rank + 2^k, receives from rank - 2^k."""
    dist = 1
    while dist < size:
        yield sendrecv((rank + dist) % size, Region("scratch", 0, 1),
                       (rank - dist) % size, Region("scratch", 1, 1))
        dist *= 2
