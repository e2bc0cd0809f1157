"""The simulator: every rank's plan run in one process, no threads, no transport, as the
program the host executor runs (``lowered``: the step walk, or the overlapped walk).

Matching is rendezvous: a send completes only when the receiver has posted the matching
receive in its current step, so a schedule that could deadlock on a real transport deadlocks
here too, and is reported. Messages between a pair match in FIFO order; a size mismatch is an
error. Used by the tests to prove schedules at world sizes no machine here has, and by
research code to run an algorithm on a list of arrays:

    >>> from collectives.algorithms.simulate import run
    >>> outs = run("all_reduce", "ring", [np.ones(5), np.arange(5.0), np.full(5, 2.0)])
"""
from __future__ import annotations

import collections
import contextlib
import gc

import numpy as np

from ..errors import CollectiveError
from ..kernels.reduce import check_op, finish_average, reducer
from ..ops import ReduceOp
from .lowered import POST, WAIT, Chain, stepwise
from .schedule import Copy, Matrix, buffer_sizes, build_plan, plan_args


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector paused while plans are built and run: at p = 1024 they are
    millions of small objects that all live until the run ends, and every full collection
    walks each of them (about half of the direct all_reduce's time at p = 1024). Cycles
    left behind are collected once it runs again."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@_collector_paused()
def execute_all(plans, buffers, reduce=None, *, lowering=stepwise):
    """Run one plan per rank to completion over ``buffers`` (one dict of flat arrays per rank,
    scratch included), each as the program an executor runs: ``lowering(plan)`` (the step walk
    by default; ``lowered.overlapped`` for the overlapped one; any pass over them, such as
    ``lowered.chained``: a Chain runs as a fused kernel would). Raises CollectiveError on a
    deadlock or a size mismatch."""
    size = len(plans)
    programs = [lowering(plan).code for plan in plans]
    pc = [0] * size                           # the next instruction of each rank
    posted = [0] * size                       # requests each rank posted (their numbers)
    unfinished = [set() for _ in range(size)]     # per rank: requests posted, not completed
    # Posted transfers not matched yet, per ordered pair src * size + dst, oldest first:
    # (region, its view, request number). A pair is dropped once empty, so ``key in sends``
    # says whether anything waits there. Lists, not deques: at p = 1024 the direct algorithms
    # keep half a million pairs waiting at once, nearly all holding one message.
    sends, recvs = {}, {}
    ready = collections.deque(range(size))
    blocked = [None] * size                   # requests the WAIT a rank stopped at still needs
    views = [_Views(b) for b in buffers]

    def step_of(rank):
        code = programs[rank]
        return code[min(pc[rank], len(code) - 1)][1] if code else 0

    def complete(rank, number):
        unfinished[rank].discard(number)
        waiting = blocked[rank]
        if waiting is not None:
            waiting.discard(number)
            if not waiting:
                blocked[rank] = None
                pc[rank] += 1
                ready.append(rank)

    def post(table, key, rank, region):
        number = posted[rank]
        posted[rank] += 1
        unfinished[rank].add(number)
        table.setdefault(key, []).append((region, views[rank][region], number))

    def match(src, dst):
        key = src * size + dst
        s, r = sends.get(key), recvs.get(key)
        if not (s and r):             # an earlier match of this post may have emptied it
            return
        while s and r:
            (sent, data, n_send), (into, landing, n_recv) = s.pop(0), r.pop(0)
            if sent.count != into.count:
                raise CollectiveError(
                    f"{plans[src].collective} ({plans[src].algorithm}): rank {src} step "
                    f"{step_of(src) + 1} sends {sent.count} elements to rank {dst}, whose step "
                    f"{step_of(dst) + 1} receives {into.count}")
            landing[...] = data
            complete(src, n_send)
            complete(dst, n_recv)
        if not s:
            del sends[key]
        if not r:
            del recvs[key]

    def fused(rank, chain):
        """A Chain as a fused kernel runs it (every operand loaded before anything is
        stored), not op by op, so a chain the hazard rule should not have allowed gives
        different bits here."""
        at = views[rank]
        acc = at[chain.a].copy()
        operands = [at[b].copy() for b in chain.bs]
        stores = {}
        for i, b in enumerate(operands):
            reduce(acc, acc, b)
            if i in chain.writes:
                stores[i] = acc.copy()
        for dst, after in zip(chain.dsts, chain.writes):
            at[dst][...] = stores[after]

    def run_until_blocked(rank):
        code, at = programs[rank], views[rank]
        while pc[rank] < len(code):
            kind, _, what = code[pc[rank]]
            if kind is POST:
                receives, sending = what
                # every transfer of the instruction is posted before any is matched
                for peer, region in receives:
                    post(recvs, peer * size + rank, rank, region)
                for peer, region in sending:
                    post(sends, rank * size + peer, rank, region)
                pc[rank] += 1
                for peer, _ in receives:
                    if peer * size + rank in sends:
                        match(peer, rank)
                for peer, _ in sending:
                    if rank * size + peer in recvs:
                        match(rank, peer)
            elif kind is WAIT:
                numbers = range(what.start, what.stop) if isinstance(what, slice) else what
                waiting = unfinished[rank].intersection(numbers)
                if waiting:
                    blocked[rank] = waiting
                    return
                pc[rank] += 1
            else:
                for op in what:
                    if isinstance(op, Copy):
                        at[op.dst][...] = at[op.src]
                    elif isinstance(op, Chain):
                        fused(rank, op)
                    else:
                        reduce(at[op.dst], at[op.a], at[op.b])
                pc[rank] += 1

    while ready:
        rank = ready.popleft()
        if blocked[rank] is None:
            run_until_blocked(rank)

    stuck = [r for r in range(size) if pc[r] < len(programs[r])]
    if stuck:
        first = stuck[0]
        step = plans[first].steps[step_of(first)]
        raise CollectiveError(
            f"{plans[first].collective} ({plans[first].algorithm}) deadlocks at world size "
            f"{size}: {len(stuck)} ranks never finish; rank {first} waits in step "
            f"{step_of(first) + 1} (sends to {[s.peer for s in step.sends]}, receives from "
            f"{[r.peer for r in step.recvs]})")


class _Views(dict):
    """One rank's regions as numpy views of its buffers, each sliced once: a direct
    all_reduce sends one region p-1 times and folds p-1 operands through one accumulator,
    and slicing costs several times the look-up."""

    def __init__(self, buffers):
        super().__init__()
        self.buffers = buffers

    def __missing__(self, region):
        buffer, offset, count = region
        view = self[region] = self.buffers[buffer][offset:offset + count]
        return view


@_collector_paused()
def run(collective, algorithm, arrays, *, op=ReduceOp.SUM, root=0, counts=None):
    """Run ``algorithm`` for ``collective`` on one array per rank; return one output per rank.

    Inputs by collective: all_reduce/reduce/reduce_scatter/all_gather/gather: each rank's
    data; broadcast: ``arrays[root]`` is the data (others give arrays of the same size);
    scatter: ``arrays[root]`` is the whole buffer, split by ``counts`` (default: evenly);
    all_to_all: each rank's send buffer, split by ``counts[i][j]`` (default: evenly).
    reduce_scatter splits by ``counts`` (default: evenly). Ranks that receive nothing
    (non-roots of reduce and gather) get ``None``.
    """
    size = len(arrays)
    arrays = [None if a is None else np.ascontiguousarray(a).reshape(-1) for a in arrays]
    op = ReduceOp.parse(op)
    dtype = next(a.dtype for a in arrays if a is not None)
    counts = _default_counts(collective, arrays, size, root, counts)
    if collective in ("all_reduce", "reduce", "reduce_scatter"):
        check_op(op, dtype, collective, 0)
    reduce = reducer(op, dtype)
    plans, buffers = [], []
    for rank in range(size):
        plan = build_plan(collective, algorithm, rank, size, *plan_args(collective, size, counts, root))
        n_in, n_out = buffer_sizes(collective, rank, size, counts, root)
        data = arrays[rank]
        if collective in ("all_reduce", "broadcast"):
            inp, out = None, data.copy()
        elif collective == "scatter" and rank != root:
            inp, out = np.empty(0, dtype), np.empty(n_out, dtype)
        else:
            inp, out = data, np.zeros(n_out, dtype)
        if inp is not None and inp.size != n_in and not (collective == "scatter" and rank != root):
            raise ValueError(f"{collective}: rank {rank} gives {inp.size} elements, expected {n_in}")
        plans.append(plan)
        buffers.append({"input": inp, "output": out, "scratch": np.empty(plan.scratch, dtype)})
    execute_all(plans, buffers, reduce)
    outputs = [b["output"] for b in buffers]
    if op == ReduceOp.AVG and collective in ("all_reduce", "reduce", "reduce_scatter"):
        for rank, out in enumerate(outputs):
            if collective != "reduce" or rank == root:
                finish_average(out, size)
    if collective in ("reduce", "gather"):
        outputs = [out if rank == root else None for rank, out in enumerate(outputs)]
    return outputs


def _default_counts(collective, arrays, size, root, counts):
    if counts is not None:
        if collective == "all_to_all":
            return Matrix(tuple(int(c) for c in row) for row in counts)
        return tuple(int(c) for c in counts) if not np.isscalar(counts) else int(counts)
    if collective in ("all_reduce", "broadcast", "reduce"):
        return arrays[root if collective == "broadcast" else 0].size
    if collective in ("all_gather", "gather"):
        return tuple(a.size for a in arrays)
    if collective in ("reduce_scatter", "scatter"):
        total = arrays[root if collective == "scatter" else 0].size
        return tuple(r.count for r in _even(total, size))
    if collective == "all_to_all":
        return Matrix(tuple(r.count for r in _even(a.size, size)) for a in arrays)
    return ()


def _even(total, size):
    from .schedule import partition
    return partition(total, size)


def reference(collective, arrays, *, op=ReduceOp.SUM, root=0, counts=None):
    """What ``run`` must return, computed directly with numpy."""
    size = len(arrays)
    arrays = [None if a is None else np.ascontiguousarray(a).reshape(-1) for a in arrays]
    op = ReduceOp.parse(op)
    counts = _default_counts(collective, arrays, size, root, counts)

    def reduced():
        acc = arrays[0].copy()
        fn = reducer(op, acc.dtype)
        for a in arrays[1:]:
            fn(acc, acc, a)
        if op == ReduceOp.AVG:
            finish_average(acc, size)
        return acc

    if collective == "all_reduce":
        total = reduced()
        return [total.copy() for _ in range(size)]
    if collective == "reduce":
        return [reduced() if r == root else None for r in range(size)]
    if collective == "reduce_scatter":
        total = reduced()
        offsets = np.cumsum((0,) + counts)
        return [total[offsets[r]:offsets[r + 1]].copy() for r in range(size)]
    if collective == "broadcast":
        return [arrays[root].copy() for _ in range(size)]
    if collective == "all_gather":
        return [np.concatenate(arrays) for _ in range(size)]
    if collective == "gather":
        return [np.concatenate(arrays) if r == root else None for r in range(size)]
    if collective == "scatter":
        offsets = np.cumsum((0,) + counts)
        return [arrays[root][offsets[r]:offsets[r + 1]].copy() for r in range(size)]
    if collective == "all_to_all":
        offsets = [np.cumsum((0,) + row) for row in counts]
        return [np.concatenate([arrays[i][offsets[i][j]:offsets[i][j + 1]] for i in range(size)])
                for j in range(size)]
    if collective == "barrier":
        return [None] * size
    raise ValueError(f"unknown collective {collective!r}")


@_collector_paused()
def verify(collective, algorithm, size, counts, root=0, seed=0):
    """Prove one algorithm at one world size and counts: random 64-bit words reduced with a
    wrapping SUM, so a missing or doubled contribution changes the result (up to 2**-64)."""
    rng = np.random.default_rng(seed)
    if collective == "barrier":
        plans = [build_plan("barrier", algorithm, r, size) for r in range(size)]
        execute_all(plans, [{"scratch": np.zeros(p.scratch, np.uint8)} for p in plans])
        return
    n_in = [buffer_sizes(collective, r, size, counts, root)[0] for r in range(size)]
    if collective in ("all_reduce", "broadcast", "reduce"):
        n_in = [counts] * size
    arrays = [rng.integers(0, 2**63, n, dtype=np.uint64, endpoint=True) for n in n_in]
    got = run(collective, algorithm, arrays, root=root, counts=counts)
    want = reference(collective, arrays, root=root, counts=counts)
    for rank, (g, w) in enumerate(zip(got, want)):
        if (g is None) != (w is None) or (g is not None and not np.array_equal(g, w)):
            raise AssertionError(f"{collective} ({algorithm}) at world size {size}, counts "
                                 f"{_short(counts)}: rank {rank} holds a wrong result")


def _short(counts):
    text = repr(counts)
    return text if len(text) < 80 else text[:77] + "..."
