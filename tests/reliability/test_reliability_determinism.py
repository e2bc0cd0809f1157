"""Determinism: all_reduce gives bitwise identical results on every rank, for every algorithm
and dtype, with inputs whose rounding depends on the order of reduction (random floats, not the
exact small integers of the layer-2 suite), and the same bits when the call is repeated.

A rank that summed in its own order would hand its neighbours a different model after a
gradient all-reduce: a silent divergence. The local transport runs the very schedules the
process transports run, so this holds for them too.
"""
from datetime import timedelta

import numpy as np
import pytest

import collectives as dist
from collectives.algorithms import capabilities
from collectives.kernels.reduce import BFLOAT16
from collectives.ops import ReduceOp

DTYPES = [np.float16, BFLOAT16, np.float32, np.float64, np.complex64, np.complex128]
OPS = [ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT]
SIZES = [2, 3, 4, 5, 6, 7, 8]
COUNT = 257                       # uneven blocks everywhere


def algorithms():
    return [a for a in capabilities()["all_reduce"] if a != "native"]


def inputs(rank, dtype, op):
    rng = np.random.default_rng(1000 + rank)
    if op == ReduceOp.PRODUCT:     # near 1, so products neither overflow nor vanish
        values = 1 + rng.uniform(-0.1, 0.1, COUNT)
    else:
        values = rng.standard_normal(COUNT) * 10.0 ** rng.integers(-3, 4, COUNT)
    if np.dtype(dtype).kind == "c":
        values = values + 1j * rng.standard_normal(COUNT)
    return values.astype(dtype)


def _job(rank, cases):
    out = []
    for algorithm, dtype, op in cases:
        first = inputs(rank, dtype, op)
        second = first.copy()
        dist.all_reduce(first, op=op, algorithm=algorithm)
        dist.all_reduce(second, op=op, algorithm=algorithm)
        out.append((first.tobytes(), second.tobytes()))
    return out


@pytest.mark.parametrize("p", SIZES)
def test_all_reduce_bits_agree_on_every_rank(p):
    cases = [(a, d, o) for a in algorithms() for d in DTYPES for o in OPS]
    results = dist.spawn_local(p, _job, cases, timeout=timedelta(seconds=60))
    for index, (algorithm, dtype, op) in enumerate(cases):
        bits = {results[rank][index][0] for rank in range(p)}
        where = f"{algorithm} {np.dtype(dtype).name} {op.name} p={p}"
        assert len(bits) == 1, f"{where}: ranks disagree bitwise"
        assert results[0][index][1] == results[0][index][0], f"{where}: a repeat differs"
        # and close to the exact sum (bits that agree but are wrong would be no comfort)
        exact = sum(inputs(r, dtype, op).astype(np.complex128) for r in range(p)) \
            if op != ReduceOp.PRODUCT else \
            np.prod([inputs(r, dtype, op).astype(np.complex128) for r in range(p)], axis=0)
        if op == ReduceOp.AVG:
            exact = exact / p
        got = np.frombuffer(results[0][index][0], dtype=dtype).astype(np.complex128)
        scale = np.abs(exact).max() + 1
        tolerance = {2: 0.05, 4: 1e-3, 8: 1e-5, 16: 1e-12}[np.dtype(dtype).itemsize // (
            2 if np.dtype(dtype).kind == "c" else 1)]
        assert np.abs(got - exact).max() <= tolerance * scale * p, where
