"""The simulator: every rank's plan run in one process, no threads, no transport, as the
program the host executor runs (``lowered``: the step walk, or the overlapped walk).

Matching is rendezvous: a send completes only when the receiver has posted the matching
receive in its current step, so a schedule that could deadlock on a real transport deadlocks
here too, and is reported. Messages between a pair match in FIFO order; a size mismatch is an
error. That replay is ``replay_engine``'s, the cost model's too; here it carries data. Used
by the tests to prove schedules at world sizes no machine here has, and by research code to
run an algorithm on a list of arrays:

    >>> from collectives.algorithms.simulate import run
    >>> outs = run("all_reduce", "ring", [np.ones(5), np.arange(5.0), np.full(5, 2.0)])
"""
from __future__ import annotations

import contextlib
import gc

import numpy as np

from ..errors import CollectiveError
from ..kernels.reduce import check_op, finish_average, reducer
from ..ops import ReduceOp
from .lowered import Chain, stepwise
from .replay_engine import Payload, Replay
from .schedule import (COLLECTIVES, ROOTED, Copy, Matrix, buffer_sizes, build_plan,
                       is_family_name, plan_args, schedule_function)


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
    deadlock or a size mismatch. The replay is ``replay_engine``'s, carrying data."""
    Replay(plans, lowering, _Data(buffers, reduce)).run()


class _Data(Payload):
    """The simulator's payload: a message's data lands in the receiver's region when the two
    ends match; local operations run on the rank's buffers."""

    def __init__(self, buffers, reduce):
        self.views = [_Views(b) for b in buffers]
        self.reduce = reduce

    def posted(self, rank, transfers, now):
        return self.views[rank]

    def moved(self, src, dst, sent, into):
        into[3][into[0].region][...] = sent[3][sent[0].region]
        return 0.0

    def local(self, rank, ops, now):
        at, reduce = self.views[rank], self.reduce
        for op in ops:
            if isinstance(op, Copy):
                at[op.dst][...] = at[op.src]
            elif isinstance(op, Chain):
                self.fused(at, op)
            else:
                reduce(at[op.dst], at[op.a], at[op.b])
        return now

    def fused(self, at, chain):
        """A Chain as a fused kernel runs it (every operand loaded before anything is
        stored), not op by op, so a chain the hazard rule should not have allowed gives
        different bits here."""
        acc = at[chain.a].copy()
        operands = [at[b].copy() for b in chain.bs]
        stores = {}
        for i, b in enumerate(operands):
            self.reduce(acc, acc, b)
            if i in chain.writes:
                stores[i] = acc.copy()
        for dst, after in zip(chain.dsts, chain.writes):
            at[dst][...] = stores[after]

    def stuck_detail(self, plan, step):
        return (f" (sends to {[s.peer for s in step.sends]}, receives from "
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

    Inputs by collective: all_reduce/reduce: each rank's data, all of one length;
    reduce_scatter: each rank's whole vector, all of one length, split by ``counts``
    (default: evenly); all_gather/gather: each rank's block (lengths may differ: they are
    the counts); broadcast: ``arrays[root]`` is the data (others give arrays of its length,
    or None); scatter: ``arrays[root]`` is the whole buffer, split by ``counts`` (default:
    evenly; others give None or anything); all_to_all: each rank's send buffer, split by
    ``counts[i][j]`` (default: each evenly). Every array given has one dtype. Ranks that
    receive nothing (non-roots of reduce and gather) get ``None``.

    Raises ValueError (unknown names, lengths or counts that do not fit the collective, a
    bad root) or TypeError (mixed dtypes) before anything runs; CollectiveError where the
    schedule deadlocks or its two ends of a message disagree.
    """
    algorithm = _checked_names(collective, algorithm)
    arrays = _checked_arrays(collective, arrays, root)
    size = len(arrays)
    op = ReduceOp.parse(op)
    dtype = next(a.dtype for a in arrays if a is not None)
    given = counts is not None
    counts = _default_counts(collective, arrays, size, root, counts)
    _check_counts(collective, arrays, size, root, counts, given)
    if collective in ("all_reduce", "reduce", "reduce_scatter"):
        check_op(op, dtype, collective, 0)
    reduce = reducer(op, dtype)
    plans, buffers = [], []
    for rank in range(size):
        plan = build_plan(collective, algorithm, rank, size, *plan_args(collective, size, counts, root))
        n_in, n_out = buffer_sizes(collective, rank, size, counts, root)
        data = arrays[rank]
        if collective in ("all_reduce", "broadcast"):
            inp, out = None, np.zeros(n_out, dtype) if data is None else data.copy()
        elif collective == "scatter" and rank != root:
            inp, out = np.empty(0, dtype), np.empty(n_out, dtype)
        else:
            inp, out = data, np.zeros(n_out, dtype)
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


# The ranks that may give None instead of an array: the non-roots of the collectives whose
# data starts at the root alone.
_NONE_BESIDE_ROOT = ("broadcast", "scatter")
# The collectives every rank gives one vector of the same length to (the call's count).
_EQUAL_LENGTHS = ("all_reduce", "reduce", "reduce_scatter")


def _checked_names(collective, algorithm) -> str:
    """The registered schedule ``algorithm`` names for ``collective`` (an alias resolved);
    a ValueError that lists the valid names where either name is unknown."""
    from . import capabilities, canonical
    if collective not in COLLECTIVES:
        raise ValueError(f"simulate: unknown collective {collective!r}; known: "
                         f"{', '.join(COLLECTIVES)}")
    if is_family_name(algorithm):       # hierarchical:...: the family says what is wrong
        schedule_function(collective, algorithm)
        return canonical(collective, algorithm)
    names = capabilities(aliases=True)[collective]
    if not isinstance(algorithm, str) or algorithm not in names:
        raise ValueError(f"simulate: {collective} has no algorithm {algorithm!r} (the "
                         f"simulator runs a named schedule); valid: "
                         f"{', '.join(names) or '(none registered)'}")
    return canonical(collective, algorithm)


def _checked_arrays(collective, arrays, root) -> list:
    """``arrays`` as flat contiguous arrays (None where a rank may give none), after the
    checks that need no counts: one per rank, a root among them, one dtype."""
    if isinstance(arrays, np.ndarray) or not hasattr(arrays, "__len__"):
        raise TypeError(f"simulate {collective}: arrays must be a list of one array per rank, "
                        f"got {type(arrays).__name__}")
    if not len(arrays):
        raise ValueError(f"simulate {collective}: no ranks (an empty list of arrays)")
    size = len(arrays)
    if collective in ROOTED and (isinstance(root, bool) or not isinstance(root, int)
                                 or not 0 <= root < size):
        raise ValueError(f"simulate {collective}: root must be a rank in 0..{size - 1}, "
                         f"got {root!r}")
    out = []
    for rank, a in enumerate(arrays):
        if collective == "scatter" and rank != root:
            a = None                # brings no data: whatever was given is not read
        if a is None:
            if collective not in _NONE_BESIDE_ROOT or rank == root:
                whose = "the root" if collective in _NONE_BESIDE_ROOT else "every rank"
                raise ValueError(f"simulate {collective}: rank {rank} gives None; "
                                 f"{collective} needs an array from {whose}")
            out.append(None)
            continue
        out.append(np.ascontiguousarray(a).reshape(-1))
    given = [(rank, a) for rank, a in enumerate(out) if a is not None]
    first_rank, first = given[0]
    for rank, a in given[1:]:
        if a.dtype != first.dtype:
            raise TypeError(f"simulate {collective}: rank {rank} gives {a.dtype} but rank "
                            f"{first_rank} gives {first.dtype}; every rank's array must have "
                            f"one dtype")
    return out


def _check_counts(collective, arrays, size, root, counts, given) -> None:
    """A ValueError, naming the rank, where the counts (``given`` by the caller, or derived
    from the arrays) do not fit the collective's shape or the arrays."""
    where = f"simulate {collective}"
    if collective == "barrier":
        return
    if collective in ("all_reduce", "broadcast", "reduce"):
        if not isinstance(counts, int) or counts < 0:
            raise ValueError(f"{where}: counts must be one element count >= 0, got {counts!r}")
    elif collective == "all_to_all":
        if len(counts) != size or any(len(row) != size for row in counts) or \
                any(c < 0 for row in counts for c in row):
            raise ValueError(f"{where}: counts must be a {size} x {size} matrix of counts "
                             f">= 0 (counts[i][j]: what rank i sends rank j)")
    elif isinstance(counts, int) or len(counts) != size or any(c < 0 for c in counts):
        raise ValueError(f"{where}: counts must hold one count >= 0 per rank ({size}), "
                         f"got {_short(counts)}")
    if collective in _EQUAL_LENGTHS or collective == "broadcast":
        # one vector of one length on every rank: name the rank that differs from the first
        # (or from the counts given)
        want = buffer_sizes(collective, 0, size, counts, root)[0]
        source = "the counts say" if given else \
            f"rank {root if collective == 'broadcast' else 0} gives"
        for rank, a in enumerate(arrays):
            if a is not None and a.size != want:
                raise ValueError(f"{where}: rank {rank} gives {a.size} elements, but {source} "
                                 f"{want}; every rank gives one vector of one length")
        return
    for rank, a in enumerate(arrays):
        if a is None or (collective == "scatter" and rank != root):
            continue
        n_in = buffer_sizes(collective, rank, size, counts, root)[0]
        if a.size != n_in:
            raise ValueError(f"{where}: rank {rank} gives {a.size} elements, but its counts "
                             f"say {n_in}")


def _default_counts(collective, arrays, size, root, counts):
    if counts is not None:
        try:
            if collective == "all_to_all":
                return Matrix(tuple(_count(c) for c in row) for row in counts)
            return _count(counts) if np.isscalar(counts) else tuple(_count(c) for c in counts)
        except (TypeError, ValueError):
            raise ValueError(f"simulate {collective}: counts {_short(counts)} are not element "
                             f"counts") from None
    if collective in ("all_reduce", "reduce"):
        return arrays[0].size
    if collective == "broadcast":
        return arrays[root].size
    if collective in ("all_gather", "gather"):
        return tuple(a.size for a in arrays)
    if collective in ("reduce_scatter", "scatter"):
        total = arrays[root if collective == "scatter" else 0].size
        return tuple(r.count for r in _even(total, size))
    if collective == "all_to_all":
        return Matrix(tuple(r.count for r in _even(a.size, size)) for a in arrays)
    return ()


def _count(value) -> int:
    """An element count as an int (numpy integers too); a TypeError for anything else."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(value)
    return int(value)


def _even(total, size):
    from .schedule import partition
    return partition(total, size)


def reference(collective, arrays, *, op=ReduceOp.SUM, root=0, counts=None):
    """What ``run`` must return, computed directly with numpy (the same arguments, checked
    alike)."""
    if collective not in COLLECTIVES:
        raise ValueError(f"simulate: unknown collective {collective!r}; known: "
                         f"{', '.join(COLLECTIVES)}")
    arrays = _checked_arrays(collective, arrays, root)
    size = len(arrays)
    op = ReduceOp.parse(op)
    given = counts is not None
    counts = _default_counts(collective, arrays, size, root, counts)
    _check_counts(collective, arrays, size, root, counts, given)

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
            at_root = f", root {root}" if collective in ROOTED else ""
            raise AssertionError(f"{collective} ({algorithm}) at world size {size}, counts "
                                 f"{_short(counts)}{at_root}: rank {rank} holds a wrong result")


def _short(counts):
    text = repr(counts)
    return text if len(text) < 80 else text[:77] + "..."


# ---------------------------------------------------------------------------------------------
# Proving a schedule before ``auto`` may run it

# Above this many ranks the cases are the schedule tests' sparse one (few non-empty blocks)
# and a few small counts: the simulator walks every transfer, and dense cases cost O(p^2)
# transfers per schedule step at such sizes.
DENSE_CASES_MAX_SIZE = 64


def proving_cases(collective: str, size: int) -> list[tuple]:
    """[(counts, root)] that ``prove`` runs a schedule with at ``size`` ranks, the schedule
    tests' cases: whole counts 0, 1, p-1, p, p+1, 31 and 1000 (uneven blocks where the
    collective takes one count per rank), roots 0, p/2 and p-1; above
    ``DENSE_CASES_MAX_SIZE`` ranks sparse blocks (most empty) and counts 1, 3 and p+1."""
    if collective == "barrier":
        return [(None, 0)]
    roots = sorted({0, size // 2, size - 1}) if collective in ROOTED else [0]
    if size <= DENSE_CASES_MAX_SIZE:
        totals = sorted({0, 1, max(size - 1, 0), size, size + 1, 31, 1000})
        return [(_case_counts(collective, size, c), root) for c in totals for root in roots]
    if collective in ("all_reduce", "broadcast", "reduce"):
        return [(c, root) for c in (1, 3, size + 1) for root in roots]
    if collective == "all_to_all":
        sparse = Matrix(tuple(1 if (i + j) % 97 == 0 else 0 for j in range(size))
                        for i in range(size))
    else:
        sparse = tuple(i % 7 + 1 if i % 97 == 5 else 0 for i in range(size))
    return [(sparse, root) for root in roots]


def _case_counts(collective, size, total):
    """The counts argument for whole count ``total``: uneven per rank where it can be."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return total
    if collective == "all_to_all":
        return Matrix(tuple((total + 3 * i + j) % 5 + total // (size * size)
                            for j in range(size)) for i in range(size))
    return tuple((total + i) % 7 + total // size for i in range(size))


def prove(collective: str, algorithm: str, size: int, cases) -> str | None:
    """Run ``algorithm`` at ``size`` ranks on each of ``cases`` ((counts, root) pairs) in the
    simulator (``verify``): None where every rank ends with exactly the right result each
    time, else what went wrong first (a wrong result and where, a deadlock, a size mismatch,
    or what the schedule function raised)."""
    for counts, root in cases:
        where = f"counts {_short(counts)}" + (f", root {root}" if collective in ROOTED else "")
        try:
            verify(collective, algorithm, size, counts, root=root)
        except AssertionError as exc:
            return str(exc)
        except CollectiveError as exc:
            return f"{exc} ({where})"
        except Exception as exc:        # the schedule function's own failure, reported as such
            return f"{type(exc).__name__} at {where}: {exc}"
    return None
