"""Element-wise reductions on host (numpy) arrays, and which (op, dtype) pairs are defined.

This is the pure-numpy reference; faster kernels must give the same bits.
"""
from __future__ import annotations

import numpy as np

from ..ops import ReduceOp

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # ml_dtypes is a dependency, but keep the module importable without it
    BFLOAT16 = None


def dtype_kind(dtype) -> str:
    """'bool', 'int', 'float', 'complex' (bfloat16 counts as float)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "bool"
    if dtype.kind in "iu":
        return "int"
    if dtype.kind == "f" or dtype == BFLOAT16:
        return "float"
    if dtype.kind == "c":
        return "complex"
    return "other"


# Which ops each kind of dtype supports. AVG on integers is an error, as in torch.
_SUPPORTED = {
    "bool": {ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
             ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR},
    "int": {ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX,
            ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR},
    "float": {ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX},
    "complex": {ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT},
    "other": set(),
}

# bool follows torch: SUM is logical or, PRODUCT logical and.
_UFUNC = {
    ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum,
    ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
}
_BOOL_UFUNC = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and,
               ReduceOp.MIN: np.logical_and, ReduceOp.MAX: np.logical_or}


def check_op(op: ReduceOp, dtype, operation: str, rank: int) -> None:
    """Raise a clear TypeError if ``op`` is not defined on ``dtype``."""
    kind = dtype_kind(dtype)
    if op not in _SUPPORTED[kind]:
        valid = sorted(o.name for o in _SUPPORTED[kind])
        raise TypeError(
            f"{operation} on rank {rank}: ReduceOp.{op.name} is not defined for dtype "
            f"{np.dtype(dtype).name}" + (f"; valid ops for it: {', '.join(valid)}" if valid
                                         else "; this dtype cannot be reduced"))


def reducer(op: ReduceOp, dtype):
    """A function ``(dst, a, b)`` computing dst = a op b in place, without temporaries."""
    ufunc = _BOOL_UFUNC.get(op, _UFUNC.get(op)) if np.dtype(dtype) == np.bool_ else _UFUNC.get(op)
    if ufunc is None:
        raise TypeError(f"ReduceOp.{op.name} has no element-wise kernel")

    def apply(dst, a, b):
        ufunc(a, b, out=dst)
    return apply


def finish_average(out, size: int) -> None:
    """AVG = SUM then one division, so every rank divides the same bits the same way."""
    if out.size == 0:
        return
    if out.dtype.kind in "fc" and out.dtype.itemsize >= 4:
        np.divide(out, size, out=out)
    else:  # float16 / bfloat16: divide in float32, round once
        out[...] = (out.astype(np.float32) / size).astype(out.dtype)


# Operands of at least this many bytes go to the compiled kernels even where numpy's own loop
# is vectorised (float32, ints): one Numba thread only ties numpy there, in place or not, so
# only the kernels' threads can win, and only on operands large enough to pay for handing out
# chunks (tools/kernels.py measures where).
FAST_MIN_BYTES = 16 << 20


def fast_reducer(op: ReduceOp, dtype):
    """Like ``reducer`` but through the Numba kernels where they pay: always for float16
    (numpy's half loops are scalar) and bfloat16 (ml_dtypes' loops are scalar too, slower at
    every size), from FAST_MIN_BYTES up for the rest; the numpy twin otherwise, and whenever
    numba is missing (``kernel_status`` says why)."""
    op = ReduceOp.parse(op)
    twin = reducer(op, dtype)
    try:
        from . import numba_reduce
    except Exception:  # a broken numba must never break a collective
        return twin
    if not numba_reduce.available()[0]:
        return twin
    compiled = numba_reduce.reducer(op, dtype)
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype == BFLOAT16:
        return compiled

    def apply(dst, a, b):
        (compiled if dst.nbytes >= FAST_MIN_BYTES else twin)(dst, a, b)
    return apply


def kernel_status() -> dict:
    """Which reduction kernels run here, for ``python -m collectives info``."""
    try:
        from . import numba_reduce
    except Exception as exc:
        return {"backend": "numpy", "available": False,
                "detail": f"collectives.kernels.numba_reduce failed to import: {exc}"}
    return numba_reduce.status()
