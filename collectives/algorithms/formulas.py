"""Closed forms of the schedules' cost (Thakur, Rabenseifner & Gropp, "Optimization of
collective communication operations in MPICH", 2005), for the schedules as this package writes
them: what ``cost.estimate`` uses where replaying the schedules is too dear, and what the tests
hold the counted model to at powers of two."""
from __future__ import annotations

import math

from .params import Params



def formula(collective: str, algorithm: str, p: int, nbytes: float, params: Params,
            itemsize: int = 4, *, copies: bool = False) -> float | None:
    """Closed-form seconds, or None where this package has no formula for the pair.

    ``nbytes`` is n in the paper's sense: the whole vector (all_reduce, broadcast, reduce),
    all p blocks (reduce_scatter, all_gather, gather, scatter), one rank's send buffer
    (all_to_all). Exact for the schedules at powers of two with n divisible by p (data-moving
    schedules then differ from the counted model only by their local copies, γ/2 per byte);
    ``itemsize`` matters where a schedule switches shape at an element count.

    ``copies=True`` adds the local copies on the schedule's critical path (γ/2 per byte,
    ``copied_bytes``), which makes the closed form equal to the counted model wherever the
    tests say so; ``estimate`` uses it that way at large world sizes.

    The pipelined trees' forms are approximations: each slot priced at its busiest rank
    (``_pipelined``; close to the replay on large messages, optimistic under one port, where
    the replay serializes a step's messages in arrival order)."""
    closed = _textbook(collective, algorithm, p, nbytes, params, itemsize)
    if closed is None or not copies:
        return closed
    return closed + 0.5 * params.gamma * copied_bytes(collective, algorithm, p, nbytes)


def copied_bytes(collective: str, algorithm: str, p: int, nbytes: float) -> float:
    """Bytes copied locally on the critical path of the schedule (n as in ``formula``),
    read off the schedules: the own block filed into the output (n/p), Bruck's rotation (n)
    and packing (the slots of every round), the tree all_to_all's rearrangement at its root.
    Exact at powers of two; an upper bound where Bruck's slots happen to lie back to back."""
    if p == 1:
        return 0.0
    block, lg = nbytes / p, math.ceil(math.log2(p))
    power = p & (p - 1) == 0
    if collective in ("all_gather", "gather", "scatter", "all_to_all") and algorithm == "ring":
        return block
    if algorithm == "recursive_doubling" and collective in ("gather", "scatter"):
        algorithm = "tree"            # the same schedules are registered under both names
    if algorithm == "recursive_doubling":
        if collective == "all_gather":
            return block if power else block + nbytes
        if collective == "all_to_all":
            return (_bruck_slots(p) + p) * block
    if algorithm == "tree":
        if collective in ("all_gather", "gather"):
            return block
        if collective in ("scatter", "reduce_scatter"):
            return max(1, lg - 1) * block       # own blocks along the way down
        if collective == "all_to_all":
            return (p + lg + (1 if p == 2 else 0)) * nbytes
    return 0.0


def _bruck_slots(p: int) -> int:
    """Blocks Bruck sends in all: round k sends the slots j < p that have bit k set."""
    return sum((p >> (k + 1) << k) + max(0, p % (2 << k) - (1 << k))
               for k in range(math.ceil(math.log2(p))))


def _textbook(collective, algorithm, p, nbytes, params, itemsize):
    a, b, g = params.alpha, params.beta, params.gamma
    n = float(nbytes)
    if p == 1:
        return None                   # only local copies, no formula to speak of
    lg = math.ceil(math.log2(p))
    frac = (p - 1) / p
    pof2 = 1 << (p.bit_length() - 1)
    power = pof2 == p
    count = -(-int(nbytes) // itemsize)
    # MPICH folding for non-powers of two: the extra ranks hand their vector over and get the
    # result back: 2α + 2nβ + nγ on top of the p'-rank algorithm.
    fold = 0.0 if power else 2 * a + 2 * n * b + n * g
    lgf, fracf = int(math.log2(pof2)), (pof2 - 1) / pof2
    if algorithm == "ring":
        if collective == "all_reduce":
            return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g
        if collective == "reduce_scatter":
            return (p - 1) * a + frac * n * (b + g)
        if collective in ("all_gather", "all_to_all", "gather", "scatter"):
            return (p - 1) * a + frac * n * b
        if collective == "reduce":
            return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g
        if collective == "broadcast":
            from .ring import segment_count
            s = segment_count(count, p)
            return (p + s - 2) * (a + (n / s) * b)
        if collective == "barrier":
            return (2 * p - 1) * (a + b)
    if algorithm == "recursive_doubling":
        from .recursive_doubling import BROADCAST_SCATTER_MIN_BLOCK, RABENSEIFNER_MIN_BLOCK
        if collective == "all_reduce":
            if count >= RABENSEIFNER_MIN_BLOCK * pof2:       # Rabenseifner
                return fold + 2 * lgf * a + 2 * fracf * n * b + fracf * n * g
            return fold + lgf * (a + n * b + n * g)
        if collective == "reduce_scatter":
            return fold + lgf * a + fracf * n * (b + g)
        if collective == "reduce":     # the folded ranks only hand their vector over
            fold = 0.0 if power else a + n * b + n * g
            return fold + 2 * lgf * a + 2 * fracf * n * b + fracf * n * g
        if collective in ("all_gather", "gather", "scatter"):
            return lg * a + frac * n * b
        if collective == "all_to_all":
            # Bruck: round k sends the slots j < p with bit k set, n/p bytes each
            return lg * a + _bruck_slots(p) * (n / p) * b
        if collective == "broadcast":
            if count >= BROADCAST_SCATTER_MIN_BLOCK * p:     # van de Geijn
                allgather = lg * a if power else (p - 1) * a
                return lg * a + allgather + 2 * frac * n * b
            return lg * (a + n * b)
        if collective == "barrier":
            return lg * (a + b)
    if algorithm in ("tree_pipelined", "double_binary_tree"):
        return _pipelined(collective, algorithm, p, n, count, params)
    if algorithm == "tree":                                 # binomial trees, one-port
        if collective == "broadcast":
            return lg * (a + n * b)
        if collective == "reduce":
            return lg * (a + n * b + n * g)
        if collective in ("gather", "scatter"):
            return lg * a + frac * n * b
        if collective == "all_reduce":
            return 2 * lg * a + 2 * lg * n * b + lg * n * g
        if collective == "reduce_scatter":
            return 2 * lg * a + (lg + frac) * n * b + lg * n * g
        if collective == "all_gather":
            return 2 * lg * a + (lg + frac) * n * b
        if collective == "all_to_all":     # gather everything to rank 0, scatter it back
            return 2 * lg * a + 2 * (p - 1) * n * b
        if collective == "barrier":
            return 2 * lg * (a + b)
    return None


def _pipelined(collective, algorithm, p, n, count, params):
    """The pipeline's phases (``pipelined_tree.shape``), each slot priced at its busiest
    rank as the replay prices a step: its k messages in ⌈k/ports⌉ rounds, those of a round
    sharing its link, then its reductions."""
    from .pipelined_tree import LOAD, shape
    if (algorithm, collective) not in LOAD:
        return None
    chunks, parts, phases = shape(algorithm, collective, p, count)
    m = n / (parts * chunks)                    # bytes of one message
    link = params.link_beta or params.beta
    total = 0.0
    for slots, messages, reductions in phases:
        together = min(params.ports, messages)
        beta = params.beta_at(m)
        if together > 1:
            beta = max(beta, together * link)
        transfers = math.ceil(messages / params.ports) * (params.alpha + beta * m)
        local = reductions * (m * params.gamma_at(m, p) + params.local_alpha)
        total += slots * (transfers + local)
    return total
