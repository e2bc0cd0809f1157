"""Element-wise reductions on CuPy arrays: one compiled kernel per (ReduceOp, dtype).

``reduce_kernel(op, dtype)`` returns ``apply(dst, a, b)`` computing dst = a op b on the
current CUDA stream (dst may alias a or b). The bits match the numpy twin in ``reduce.py``:
bool follows torch (SUM = or, PRODUCT = and); float16 is computed in float32 and rounded
once, as numpy does; bfloat16 is computed on its uint16 bit patterns in float32 and rounded to
nearest even (what ml_dtypes does), so it works whether or not this CuPy knows bfloat16.
MIN/MAX propagate NaN like numpy.minimum/maximum. Cost: one pass, 2 reads + 1 write per
element; the launch from Python costs more host time than a small operand's pass (why
``chain_kernel`` fuses chains). Kernels compile on first use (NVRTC, cached).

``chain_kernel(op, dtype, operands, writes)`` fuses a chain dst_i = dst_(i-1) op b_i of
``operands`` reductions into one launch: each element is carried through the chain in a
register, rounded to the dtype after every operation exactly as one kernel per operation
would round it, and stored into the chain's distinct destinations (``writes``: after which
operation each one takes its value). The direct all_reduce on p GPUs is such a chain of p-1
reductions, and p-1 launches from Python cost more than its transfers at 1 MiB.
"""
from __future__ import annotations

import functools

import numpy as np

from ..ops import ReduceOp
from .reduce import BFLOAT16

# Expressions on operands x, y of the computation type.
_ARITH = {
    ReduceOp.SUM: "x + y", ReduceOp.AVG: "x + y", ReduceOp.PRODUCT: "x * y",
    # NaN first so MIN/MAX propagate it, as numpy does
    ReduceOp.MIN: "(x != x) ? x : ((y != y) ? y : ((y < x) ? y : x))",
    ReduceOp.MAX: "(x != x) ? x : ((y != y) ? y : ((x < y) ? y : x))",
    ReduceOp.BAND: "x & y", ReduceOp.BOR: "x | y", ReduceOp.BXOR: "x ^ y",
}
_INT_MINMAX = {ReduceOp.MIN: "(y < x) ? y : x", ReduceOp.MAX: "(x < y) ? y : x"}
_BOOL = {ReduceOp.SUM: "x || y", ReduceOp.PRODUCT: "x && y", ReduceOp.MIN: "x && y",
         ReduceOp.MAX: "x || y", ReduceOp.BAND: "x && y", ReduceOp.BOR: "x || y",
         ReduceOp.BXOR: "x != y"}

_BF16_BODY = """
float x = __uint_as_float(((unsigned int)a) << 16);
float y = __uint_as_float(((unsigned int)b) << 16);
float r = {expr};
unsigned int u = __float_as_uint(r);
if ((u & 0x7fffffffu) > 0x7f800000u) {{
    c = (unsigned short)((u >> 16) | 0x40u);
}} else {{
    c = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}}
"""


def _expression(op: ReduceOp, dtype: np.dtype) -> str:
    if dtype == np.bool_:
        return _BOOL[op]
    if dtype.kind in "iu" and op in _INT_MINMAX:
        return _INT_MINMAX[op]
    return _ARITH[op]


def _step(op: ReduceOp, dtype: np.dtype, b: str) -> str:
    """One operation acc = acc op b in the kernel's types (acc and b as in ``_kernel``)."""
    expr = _expression(op, dtype)
    if dtype == BFLOAT16:
        body = _BF16_BODY.format(expr=expr).replace("(unsigned int)a)", "(unsigned int)acc)")
        body = body.replace("(unsigned int)b)", f"(unsigned int){b})").replace("c = ", "acc = ")
        return "{" + body + "}"
    if dtype == np.float16:
        return f"{{ float x = (float)acc; float y = (float){b}; acc = (float16)({expr}); }}"
    if dtype.kind == "c" and op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT):
        return f"acc = acc {'*' if op == ReduceOp.PRODUCT else '+'} {b};"
    return f"{{ T x = acc; T y = {b}; acc = ({expr}); }}"


@functools.lru_cache(maxsize=None)
def chain_kernel(op, dtype, operands: int, writes: tuple):
    """``apply(outputs, a, bs)``: acc = a, then acc = acc op bs[i] for each i, outputs[k]
    stored after operation ``writes[k]`` (0-based). One launch; see the module text."""
    import cupy
    op, dtype = ReduceOp.parse(op), np.dtype(dtype)
    if op not in _ARITH or (dtype.kind == "c" and op not in (ReduceOp.SUM, ReduceOp.AVG,
                                                            ReduceOp.PRODUCT)):
        raise TypeError(f"ReduceOp.{op.name} has no CUDA kernel for dtype {dtype.name}")
    storage = "uint16" if dtype == BFLOAT16 else "T"
    ins = ", ".join([f"{storage} a"] + [f"{storage} b{i}" for i in range(operands)])
    outs = ", ".join(f"{storage} d{k}" for k in range(len(writes)))
    acc = "unsigned short" if dtype == BFLOAT16 else "T"
    lines = [f"{acc} acc = a;"]
    for i in range(operands):
        lines.append(_step(op, dtype, f"b{i}"))
        lines += [f"d{k} = acc;" for k, after in enumerate(writes) if after == i]
    name = (f"collectives_chain{operands}_{op.name.lower()}_"
            f"{'bfloat16' if dtype == BFLOAT16 else dtype.name}")
    kernel = cupy.ElementwiseKernel(ins, outs, "\n".join(lines), name)

    def apply(outputs, a, bs):
        if dtype == BFLOAT16:
            outputs, a, bs = ([_bits(o, cupy) for o in outputs], _bits(a, cupy),
                              [_bits(b, cupy) for b in bs])
        kernel(a, *bs, *outputs)
    return apply


@functools.lru_cache(maxsize=None)
def _kernel(op: ReduceOp, dtype: np.dtype):
    import cupy
    name = f"collectives_{op.name.lower()}_{'bfloat16' if dtype == BFLOAT16 else dtype.name}"
    expr = _expression(op, dtype)
    if dtype == BFLOAT16:
        return cupy.ElementwiseKernel("uint16 a, uint16 b", "uint16 c",
                                      _BF16_BODY.format(expr=expr), name)
    if dtype == np.float16:
        body = f"float x = (float)a; float y = (float)b; c = (float16)({expr});"
    elif dtype.kind == "c" and op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT):
        body = f"c = a {'*' if op == ReduceOp.PRODUCT else '+'} b;"
    else:
        body = f"T x = a; T y = b; c = ({expr});"
    return cupy.ElementwiseKernel("T a, T b", "T c", body, name)


def reduce_kernel(op, dtype):
    """``apply(dst, a, b)`` for CuPy arrays of ``dtype``; TypeError for an undefined pair."""
    op = ReduceOp.parse(op)
    dtype = np.dtype(dtype)
    if op not in _ARITH or (dtype.kind == "c" and op not in (ReduceOp.SUM, ReduceOp.AVG,
                                                           ReduceOp.PRODUCT)):
        raise TypeError(f"ReduceOp.{op.name} has no CUDA kernel for dtype {dtype.name}")
    kernel = _kernel(op, dtype)
    if dtype == BFLOAT16:
        import cupy

        def apply(dst, a, b):
            kernel(_bits(a, cupy), _bits(b, cupy), _bits(dst, cupy))
    else:
        def apply(dst, a, b):
            kernel(a, b, dst)
    apply.op = op
    return apply


def _bits(array, cupy):
    return array if array.dtype == np.uint16 else array.view(cupy.uint16)
