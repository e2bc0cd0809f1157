"""Layer 2: every collective x algorithm on the local transport (threads as ranks, real data).

Grid: collective x algorithm (whatever ``capabilities()`` lists when the tests run) x world
size {1,2,3,4,5,7,8,13,16} x dtype x op x in-place/out-of-place, against the numpy
reference (``simulate.reference``); every rank's result must be bitwise identical to it.
Float inputs are small integers (or powers of two for PRODUCT), so sums are exact in any
order and bitwise equality is a fair demand of every algorithm. The full grid runs at world
sizes 1-4; larger sizes run every (collective, algorithm) pair once plus a seeded random
sample. Each world size is one spawn_local job that runs its cases back to back.
"""
import itertools
import random
from datetime import timedelta

import numpy as np
import pytest

import collectives as dist
from collectives.algorithms import capabilities
from collectives.algorithms.simulate import reference
from collectives.kernels.reduce import BFLOAT16, check_op
from collectives.ops import ReduceOp

DTYPES = [np.float16, BFLOAT16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8,
          np.uint64, np.bool_, np.complex64]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
       ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce", "gather", "scatter")
FULL_GRID_SIZES = [1, 2, 3, 4]
SAMPLED_SIZES = {5: 400, 7: 300, 8: 300, 13: 200, 16: 200}     # world size -> extra random cases


def ops_for(collective, dtype):
    if collective not in REDUCING:
        return [ReduceOp.SUM]
    valid = []
    for op in OPS:
        try:
            check_op(op, dtype, collective, 0)
            valid.append(op)
        except TypeError:
            pass
    return valid


def modes_for(collective):
    if collective == "barrier":
        return ["out"]
    if collective == "broadcast":
        return ["in"]
    return ["in", "out"]


def grid_cases(p):
    """Every (collective, algorithm, dtype, op, mode) at world size p."""
    for collective, algorithms in capabilities().items():
        dtypes = DTYPES if collective != "barrier" else [np.uint8]
        for algorithm, dtype in itertools.product(algorithms, dtypes):
            for op, mode in itertools.product(ops_for(collective, dtype), modes_for(collective)):
                yield collective, algorithm, np.dtype(dtype), op, mode


def sampled_cases(p, extra, rng):
    every = list(grid_cases(p))
    chosen = {}
    for case in every:                       # each (collective, algorithm) at least once
        chosen.setdefault(case[:2], [])
        chosen[case[:2]].append(case)
    picked = [rng.choice(options) for options in chosen.values()]
    return picked + rng.sample(every, min(extra, len(every)))


# -- inputs ---------------------------------------------------------------------------------


def values(rng, dtype, op, n):
    """Inputs whose reduction is exact in any order (so every algorithm must agree bitwise)."""
    if dtype == np.bool_:
        return rng.random(n) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    if dtype.kind == "c":
        if op == ReduceOp.PRODUCT:
            return rng.choice(np.array([1, -1, 1j, -1j], dtype), n)
        return (rng.integers(-8, 9, n) + 1j * rng.integers(-8, 9, n)).astype(dtype)
    if op == ReduceOp.PRODUCT:
        return rng.choice(np.array([1.0, -1.0, 2.0, 0.5]), n).astype(dtype)
    return rng.integers(-8, 9, n).astype(dtype)


def counts_for(collective, p, rng, index):
    """A count (or per-rank counts, or an all-to-all matrix), cycling through edge cases."""
    total = [0, 1, max(p - 1, 0), p + 1, 37][index % 5]
    if collective in ("all_reduce", "broadcast", "reduce"):
        return total
    if collective == "all_to_all":
        return tuple(tuple(int(c) for c in row) for row in rng.integers(0, 4, (p, p)))
    if collective == "barrier":
        return None
    return tuple(int(c) for c in rng.integers(0, 5, p))


def make_case(p, case, index, seed):
    collective, algorithm, dtype, op, mode = case
    rng = np.random.default_rng(seed)
    counts = counts_for(collective, p, rng, index)
    if collective == "all_to_all" and mode == "in":
        row = int(rng.integers(0, 4))
        counts = tuple((row,) * p for _ in range(p))      # in place needs equal in/out sizes
    root = int(rng.integers(0, p)) if collective in ROOTED else 0
    sizes = []
    for r in range(p):
        if collective in ("all_reduce", "broadcast", "reduce"):
            sizes.append(counts)
        elif collective in ("all_gather", "gather"):
            sizes.append(counts[r])
        elif collective in ("reduce_scatter",) or (collective == "scatter" and r == root):
            sizes.append(sum(counts))
        elif collective == "all_to_all":
            sizes.append(sum(counts[r]))
        else:
            sizes.append(0)
    arrays = [values(rng, dtype, op, n) for n in sizes]
    return dict(collective=collective, algorithm=algorithm, dtype=dtype, op=op, mode=mode,
                counts=counts, root=root, arrays=arrays)


# -- one rank's side ------------------------------------------------------------------------


def run_case(rank, p, case):
    """Run one case on this rank through ProcessGroup.prepare; return this rank's output."""
    pg = dist.GroupMember.WORLD
    c, counts, root, mode = case["collective"], case["counts"], case["root"], case["mode"]
    dtype, mine = case["dtype"], case["arrays"][rank].copy()
    kw = dict(algorithm=case["algorithm"], op=case["op"], root=root)
    if c == "barrier":
        pg.prepare("barrier", algorithm=case["algorithm"])()
        return None
    if c in ("all_reduce", "broadcast"):
        if mode == "in" or c == "broadcast":
            pg.prepare(c, output=mine, **kw)()
            return mine
        out = np.zeros_like(mine)
        pg.prepare(c, input=mine, output=out, **kw)()
        return out
    if c == "reduce":
        out = (mine if mode == "in" else np.zeros_like(mine)) if rank == root else None
        pg.prepare(c, input=mine, output=out, **kw)()
        return out
    offsets = None if c == "all_to_all" else np.cumsum((0,) + counts)
    if c in ("reduce_scatter", "scatter"):
        # In place, this rank's block of the whole input is the output (where it has input).
        inp = mine if c == "reduce_scatter" or rank == root else None
        if mode == "in" and inp is not None:
            out = mine[offsets[rank]:offsets[rank + 1]]
            pg.prepare(c, input=inp, output=out, counts=counts, **kw)()
            return out.copy()
        out = np.zeros(counts[rank], dtype)
        pg.prepare(c, input=inp, output=out, counts=counts, **kw)()
        return out
    if c in ("all_gather", "gather"):
        receives = c == "all_gather" or rank == root
        out = np.zeros(sum(counts), dtype) if receives else None
        inp = mine
        if mode == "in" and receives:
            out[offsets[rank]:offsets[rank + 1]] = mine
            inp = out[offsets[rank]:offsets[rank + 1]]
        pg.prepare(c, input=inp, output=out, counts=counts, **kw)()
        return out
    if c == "all_to_all":
        n_out = sum(row[rank] for row in counts)
        out = mine if mode == "in" else np.zeros(n_out, dtype)
        pg.prepare(c, input=mine, output=out, counts=counts, **kw)()
        return out
    raise AssertionError(f"no runner for {c}")


def run_all(rank, p, cases):
    return [run_case(rank, p, case) for case in cases]


def expected(p, case):
    c = case["collective"]
    if c == "barrier":
        return [None] * p
    arrays = list(case["arrays"])
    if c == "scatter":
        arrays = [a if r == case["root"] else None for r, a in enumerate(arrays)]
    return reference(c, arrays, op=case["op"], root=case["root"],
                     counts=case["counts"] if not isinstance(case["counts"], int) else None)


def describe(p, case):
    return (f"{case['collective']} ({case['algorithm']}) p={p} dtype={case['dtype'].name} "
            f"op={case['op'].name} mode={case['mode']} root={case['root']} "
            f"counts={str(case['counts'])[:60]}")


def canonical_bytes(a):
    """Bytes with -0.0 read as +0.0: complex products give zeros whose sign depends on the
    order of multiplication, which is not an error. Everything else must match bit for bit."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind == "c":
        a = a.view(np.dtype(f"f{a.dtype.itemsize // 2}"))
    if a.dtype.kind == "f" or a.dtype == BFLOAT16:
        a = np.where(a == 0, np.zeros_like(a), a)
    return a.tobytes()


SAME_EVERYWHERE = ("all_reduce", "broadcast", "all_gather")


def check_world(p, cases):
    outputs = dist.spawn_local(p, run_all, p, cases, timeout=timedelta(seconds=30))
    for i, case in enumerate(cases):
        want = expected(p, case)
        for rank in range(p):
            got = outputs[rank][i]
            if want[rank] is None:
                assert got is None or case["collective"] in ("reduce", "gather"), describe(p, case)
                continue
            assert got is not None and got.dtype == want[rank].dtype, describe(p, case)
            assert canonical_bytes(got) == canonical_bytes(want[rank]), \
                f"rank {rank}: {describe(p, case)}: got {got[:8]}, want {want[rank][:8]}"
            if case["collective"] in SAME_EVERYWHERE:      # bit for bit, signed zeros included
                assert got.tobytes() == outputs[0][i].tobytes(), f"rank {rank}: {describe(p, case)}"


@pytest.mark.parametrize("p", FULL_GRID_SIZES)
def test_full_grid(p):
    cases = [make_case(p, case, i, seed=1000 * p + i) for i, case in enumerate(grid_cases(p))]
    assert cases
    check_world(p, cases)


@pytest.mark.parametrize("p", sorted(SAMPLED_SIZES))
def test_sampled_grid(p):
    rng = random.Random(p)
    picked = sampled_cases(p, SAMPLED_SIZES[p], rng)
    check_world(p, [make_case(p, case, i, seed=7919 * p + i) for i, case in enumerate(picked)])


def _prepare_foreign_buffer(rank, p):
    """A buffer of another array library (here: array-like, not numpy) on a host group."""
    class DeviceLike:
        dtype, ndim, size = np.dtype(np.float32), 1, 4
        flags = np.zeros(4, np.float32).flags
    mine = np.arange(4, dtype=np.float32)
    try:
        dist.GroupMember.WORLD.prepare("all_reduce", input=DeviceLike(), output=mine)
    except TypeError as exc:
        return str(exc), mine.tolist()
    return None, mine.tolist()


def test_buffer_of_the_wrong_array_library_is_a_clear_error():
    """A GPU array on a host group (or the reverse) is refused before any data moves."""
    for message, untouched in dist.spawn_local(2, _prepare_foreign_buffer, 2,
                                               timeout=timedelta(seconds=30)):
        assert message is not None and "all_reduce on rank" in message
        assert "works on numpy arrays (host memory)" in message
        assert untouched == [0.0, 1.0, 2.0, 3.0]


def _repeat_with_bad_buffers(rank, p):
    """A call shape run once, then the same shape (dtype and size) with arrays that the first
    call's checks would refuse: each must still be refused, naming the operation and rank,
    before any data moves (the repeated-call path skips only what the shape implies)."""
    group = dist.GroupMember.WORLD
    good_in, good_out = np.ones(8, np.float32), np.zeros(8, np.float32)
    group.prepare("all_reduce", input=good_in, output=good_out, algorithm="ring")()
    strided = np.ones(16, np.float32)[::2]
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False

    class Subclass(np.ndarray):
        pass
    cases = {"strided input": dict(input=strided, output=good_out),
             "read-only output": dict(input=good_in, output=frozen),
             "2-d output": dict(input=good_in, output=np.zeros((1, 8), np.float32)),
             "subclass input": dict(input=np.ones(8, np.float32).view(Subclass),
                                    output=good_out)}
    said = {}
    for name, buffers in cases.items():
        before = {k: v.copy() for k, v in buffers.items()}
        try:
            group.prepare("all_reduce", algorithm="ring", **buffers)()
            said[name] = None
        except (TypeError, ValueError) as exc:
            said[name] = str(exc)
        assert all(np.array_equal(before[k], v) for k, v in buffers.items()), name
    group.prepare("all_reduce", input=good_in, output=good_out, algorithm="ring")()
    return said, good_out.tolist()


def test_a_repeated_call_shape_still_checks_every_array():
    for said, result in dist.spawn_local(2, _repeat_with_bad_buffers, 2,
                                         timeout=timedelta(seconds=30)):
        assert said["strided input"] and "flat contiguous" in said["strided input"]
        assert said["read-only output"] and "read-only" in said["read-only output"]
        assert said["2-d output"] and "flat contiguous" in said["2-d output"]
        assert said["subclass input"] is None      # a numpy array after all: accepted
        assert result == [2.0] * 8
