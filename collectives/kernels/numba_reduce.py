"""Numba reduction kernels: the compiled twins of ``kernels.reduce.reducer``.

``reducer(op, dtype)`` returns ``apply(dst, a, b)`` computing dst = a op b element-wise, with
the same bits as the numpy twin (dst may be a or b). float16 and bfloat16 are decoded to
float32 with bit operations, combined, and rounded once to nearest-even, which is what numpy
(float16) and ml_dtypes (bfloat16) do; for add and multiply float32 has enough precision that
this double rounding equals the correctly rounded result. Where numpy's own NaN choice is
deterministic (which NaN survives, its payload, its sign) the kernels copy it explicitly rather
than trusting the operand order LLVM picks.

Cost: one pass over three arrays, vectorised by LLVM, in place too (dst is a or b gets a loop
over two distinct arrays, which LLVM's alias check lets it vectorise); float16 and bfloat16
run far faster than numpy's scalar half loops and ml_dtypes' (a vectorised loop in float32
against one call per element), float32 ties numpy. The Python wrapper is a few dispatches
more than numpy's own call, which matters only for small arrays.
Compilation is lazy per (kernel, storage dtype) and cached on disk (``cache=True``), so a
machine pays it once; ``warmup(dtypes)`` compiles ahead. To keep
the number of compiled signatures (and the compile time) small, kernels run on storage views:
signed and unsigned integers of one width share the wrapping add/multiply and bitwise kernels,
complex SUM is float SUM over twice the elements, float16 / bfloat16 / bool run on uint views.

Threads: kernels release the GIL; above ``PARALLEL_MIN_BYTES`` the array is cut into one chunk
per thread and the chunks run on a small thread pool. This replaces ``parallel=True``: a
prange variant of every kernel would double the compiled signatures and parfor compiles take
seconds each, while the chunked pool reuses the serial kernels. Set ``COLLECTIVES_KERNEL_THREADS``
to cap the threads (1 disables them; with one MPI rank per core they only compete).

Limits: only C-contiguous arrays of equal shape and dtype take the compiled path; anything else
(strided views, mixed dtypes, partially overlapping buffers) goes to the numpy twin. Without
numba the module still imports; ``available()`` says why it is off.
"""
from __future__ import annotations

import os
import threading
import types as types_module

import numpy as np

from .. import settings
from ..ops import ReduceOp
from .reduce import BFLOAT16, dtype_kind, reducer as numpy_reducer

try:
    import numba
    from numba import njit, types
    from numba.core.extending import intrinsic
    from llvmlite import ir
    _IMPORT_ERROR = None
except Exception as exc:  # ImportError, or a numba that fails against this numpy / llvmlite
    numba = None
    _IMPORT_ERROR = f"numba unavailable: {type(exc).__name__}: {exc}"

# Below this many bytes per operand one thread is faster than handing chunks to a pool: the
# hand-off costs more than a small reduction, and one core already draws most of a small
# host's memory bandwidth (tools/kernels.py measures it); machines with more memory bandwidth
# than one core can draw are where the pool pays.
PARALLEL_MIN_BYTES = settings.KERNEL_PARALLEL_MIN_BYTES()


def available():
    """(True, numba version) when the compiled kernels can run, else (False, why not)."""
    if numba is None:
        return False, _IMPORT_ERROR
    return True, f"numba {numba.__version__}"


if numba is not None:
    _jit = njit(cache=True, nogil=True)
    _inline = njit(inline="always", cache=True)

    # ---- bit casts (scalar views), the only way to reach float bits inside a kernel ----
    @intrinsic
    def _u32_as_f32(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(types.float32))
        return types.float32(types.uint32), codegen

    @intrinsic
    def _f32_as_u32(typingctx, x):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(types.uint32))
        return types.uint32(types.float32), codegen

    @intrinsic
    def _fma(typingctx, x, y, z):
        # numpy's complex multiply uses fused multiply-add where the CPU has it (see
        # _numpy_complex_mul_is_fused); LLVM never fuses on its own without fastmath.
        def codegen(context, builder, signature, args):
            return builder.fma(*args)
        return x(x, x, x), codegen

    # ---- float16 <-> float32 ----
    # LLVM's own half conversions: exact widening, round-to-nearest-even narrowing, NaN payload
    # kept in the top bits and quieted (numpy's rule); F16C / AVX-512 FP16 vectorise them.
    @intrinsic
    def _f16_to_f32(typingctx, h):
        def codegen(context, builder, signature, args):
            half = builder.bitcast(args[0], ir.HalfType())
            return builder.fpext(half, ir.FloatType())
        return types.float32(types.uint16), codegen

    @intrinsic
    def _f32_to_f16(typingctx, f):
        def codegen(context, builder, signature, args):
            half = builder.fptrunc(args[0], ir.HalfType())
            return builder.bitcast(half, ir.IntType(16))
        return types.uint16(types.float32), codegen

    # ---- bfloat16 <-> float32 ----
    @_inline
    def _bf16_to_f32(h):
        return _u32_as_f32(np.uint32(h) << np.uint32(16))

    @_inline
    def _f32_to_bf16(f):
        u = _f32_as_u32(f)
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        nan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)  # ml_dtypes keeps the sign only
        return np.uint16(nan if f != f else rounded)

    # ---- element functions: one per (op, storage), inlined into the loops below ----
    @_inline
    def _e_add(x, y):
        return x + y

    @_inline
    def _e_mul(x, y):
        return x * y

    @_inline
    def _e_band(x, y):
        return x & y

    @_inline
    def _e_bor(x, y):
        return x | y

    @_inline
    def _e_bxor(x, y):
        return x ^ y

    # numpy.minimum / maximum on float32/64: NaN in a wins, then NaN in b; on ties (0.0 vs
    # -0.0) b is returned. On ints the same rule is plain min / max.
    @_inline
    def _e_min(x, y):
        return x if (x < y or x != x) else y

    @_inline
    def _e_max(x, y):
        return x if (x > y or x != x) else y

    # bool on uint8 views, normalised to 0/1 as numpy's logical ufuncs do.
    @_inline
    def _e_lor(x, y):
        return np.uint8((x | y) != 0)

    @_inline
    def _e_land(x, y):
        return np.uint8((x != 0) & (y != 0))

    @_inline
    def _e_lxor(x, y):
        return np.uint8((x != 0) ^ (y != 0))

    # float16 (uint16 views). Arithmetic with a NaN operand: numpy returns b's NaN when b is
    # NaN, else a's, quieted.
    @_inline
    def _e_add_f16(p, q):
        x = _f16_to_f32(p)
        y = _f16_to_f32(q)
        r = _f32_to_f16(x + y)
        r = (p | np.uint16(0x200)) if x != x else r
        return (q | np.uint16(0x200)) if y != y else r

    @_inline
    def _e_mul_f16(p, q):
        x = _f16_to_f32(p)
        y = _f16_to_f32(q)
        r = _f32_to_f16(x * y)
        r = (p | np.uint16(0x200)) if x != x else r
        return (q | np.uint16(0x200)) if y != y else r

    # numpy's half minimum/maximum return a on ties (unlike float32, which returns b).
    @_inline
    def _e_min_f16(p, q):
        x = _f16_to_f32(p)
        y = _f16_to_f32(q)
        return p if (x <= y or x != x) else q

    @_inline
    def _e_max_f16(p, q):
        x = _f16_to_f32(p)
        y = _f16_to_f32(q)
        return p if (x >= y or x != x) else q

    # bfloat16 (uint16 views). ml_dtypes computes in float32 and squashes NaN to sign|0x7fc0;
    # the sign comes from b's NaN when b is NaN, else from a's. A NaN made by the operation
    # (inf - inf) keeps the CPU's sign.
    @_inline
    def _e_add_bf16(p, q):
        x = _bf16_to_f32(p)
        y = _bf16_to_f32(q)
        r = _f32_to_bf16(x + y)
        r = ((p & np.uint16(0x8000)) | np.uint16(0x7FC0)) if x != x else r
        return ((q & np.uint16(0x8000)) | np.uint16(0x7FC0)) if y != y else r

    @_inline
    def _e_mul_bf16(p, q):
        x = _bf16_to_f32(p)
        y = _bf16_to_f32(q)
        r = _f32_to_bf16(x * y)
        r = ((p & np.uint16(0x8000)) | np.uint16(0x7FC0)) if x != x else r
        return ((q & np.uint16(0x8000)) | np.uint16(0x7FC0)) if y != y else r

    @_inline
    def _e_min_bf16(p, q):
        x = _bf16_to_f32(p)
        y = _bf16_to_f32(q)
        return p if (x < y or x != x) else q

    @_inline
    def _e_max_bf16(p, q):
        x = _bf16_to_f32(p)
        y = _bf16_to_f32(q)
        return p if (x > y or x != x) else q

    @_inline
    def _overlaps(d, x, span):
        """Partial overlap: the ranges meet but do not start at the same byte."""
        return d != x and d < x + span and x < d + span

    def _elementwise_template(dst, a, b):
        """dst = _elem(a, b) element-wise; 0 done, 1 (nothing written) when dst partially
        overlaps a or b. In-place calls (dst is a or b, found by address here, so the caller
        pays nothing for it) get loops of their own: with dst and a the same array LLVM's
        runtime alias check fails and it runs scalar code; over two distinct arrays it
        vectorises. ``_elem`` is a global of each copy (see ``_elementwise``)."""
        n = dst.size
        d, x, y = dst.ctypes.data, a.ctypes.data, b.ctypes.data
        span = n * dst.itemsize
        if _overlaps(d, x, span) or _overlaps(d, y, span):
            return 1
        if d == x:
            for i in range(n):
                dst[i] = _elem(dst[i], b[i])
        elif d == y:
            for i in range(n):
                dst[i] = _elem(a[i], dst[i])
        else:
            for i in range(n):
                dst[i] = _elem(a[i], b[i])
        return 0

    def _elementwise(elem, name):
        """A copy of the template whose global ``_elem`` is ``elem``, named ``name``.

        Not a closure: numba keys its disk cache on pickled closure variables, and a pickled
        dispatcher differs per process, so closures would recompile every run. The copy's code
        is the template's and its name gives it cache files of its own."""
        scope = dict(globals(), _elem=elem)
        fn = types_module.FunctionType(_elementwise_template.__code__, scope, name)
        fn.__qualname__ = name
        return _jit(fn)

    _add = _elementwise(_e_add, "_add")
    _mul = _elementwise(_e_mul, "_mul")
    _band = _elementwise(_e_band, "_band")
    _bor = _elementwise(_e_bor, "_bor")
    _bxor = _elementwise(_e_bxor, "_bxor")
    _min = _elementwise(_e_min, "_min")
    _max = _elementwise(_e_max, "_max")
    _lor = _elementwise(_e_lor, "_lor")
    _land = _elementwise(_e_land, "_land")
    _lxor = _elementwise(_e_lxor, "_lxor")
    _add_f16 = _elementwise(_e_add_f16, "_add_f16")
    _mul_f16 = _elementwise(_e_mul_f16, "_mul_f16")
    _min_f16 = _elementwise(_e_min_f16, "_min_f16")
    _max_f16 = _elementwise(_e_max_f16, "_max_f16")
    _add_bf16 = _elementwise(_e_add_bf16, "_add_bf16")
    _mul_bf16 = _elementwise(_e_mul_bf16, "_mul_bf16")
    _min_bf16 = _elementwise(_e_min_bf16, "_min_bf16")
    _max_bf16 = _elementwise(_e_max_bf16, "_max_bf16")

    # complex on float views (re, im pairs): numpy multiplies with or without FMA per CPU.
    # Each pair is read before it is written, so dst may be a or b.
    @_jit
    def _cmul_fused(dst, a, b):
        span = dst.size * dst.itemsize
        d = dst.ctypes.data
        if _overlaps(d, a.ctypes.data, span) or _overlaps(d, b.ctypes.data, span):
            return 1
        for i in range(0, dst.size, 2):
            ar, ai, br, bi = a[i], a[i + 1], b[i], b[i + 1]
            dst[i] = _fma(ar, br, -(ai * bi))
            dst[i + 1] = _fma(ar, bi, ai * br)
        return 0

    @_jit
    def _cmul_plain(dst, a, b):
        span = dst.size * dst.itemsize
        d = dst.ctypes.data
        if _overlaps(d, a.ctypes.data, span) or _overlaps(d, b.ctypes.data, span):
            return 1
        for i in range(0, dst.size, 2):
            ar, ai, br, bi = a[i], a[i + 1], b[i], b[i + 1]
            dst[i] = ar * br - ai * bi
            dst[i + 1] = ar * bi + ai * br
        return 0


def _numpy_complex_mul_is_fused() -> bool:
    """Does numpy's complex multiply round a*c - b*d once (FMA) on this CPU? Probe one product
    where the two answers differ: (1+e) * (1-e) with e = 2**-30 has real part 1 - e**2; the plain
    formula rounds e**2 away, FMA keeps it."""
    e = 2.0 ** -30
    x = np.array([complex(1 + e, 1)], np.complex128)
    y = np.array([complex(1 - e, 1)], np.complex128)  # real = (1+e)(1-e) - 1 = -e**2 with FMA
    return bool((x * y).real[0] != 0.0)


_UNSIGNED = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _plan(op: ReduceOp, dtype: np.dtype):
    """(kernel, storage dtype the arrays are viewed as), or None where no kernel exists."""
    kind = dtype_kind(dtype)
    if op == ReduceOp.AVG:  # AVG is SUM here; finish_average divides afterwards
        op = ReduceOp.SUM
    if kind == "bool":
        table = {ReduceOp.SUM: _lor, ReduceOp.PRODUCT: _land, ReduceOp.MIN: _land,
                 ReduceOp.MAX: _lor, ReduceOp.BAND: _land, ReduceOp.BOR: _lor,
                 ReduceOp.BXOR: _lxor}
        return (table[op], np.dtype(np.uint8)) if op in table else None
    if kind == "int":
        if op in (ReduceOp.MIN, ReduceOp.MAX):  # signedness matters: keep the dtype
            return (_min if op == ReduceOp.MIN else _max), dtype
        table = {ReduceOp.SUM: _add, ReduceOp.PRODUCT: _mul, ReduceOp.BAND: _band,
                 ReduceOp.BOR: _bor, ReduceOp.BXOR: _bxor}  # two's complement: wraps alike
        return (table[op], np.dtype(_UNSIGNED[dtype.itemsize])) if op in table else None
    if dtype == np.float16 or dtype == BFLOAT16:
        half = dtype == np.float16
        table = {ReduceOp.SUM: _add_f16 if half else _add_bf16,
                 ReduceOp.PRODUCT: _mul_f16 if half else _mul_bf16,
                 ReduceOp.MIN: _min_f16 if half else _min_bf16,
                 ReduceOp.MAX: _max_f16 if half else _max_bf16}
        return (table[op], np.dtype(np.uint16)) if op in table else None
    if kind == "float" and dtype in (np.float32, np.float64):
        table = {ReduceOp.SUM: _add, ReduceOp.PRODUCT: _mul, ReduceOp.MIN: _min,
                 ReduceOp.MAX: _max}
        return (table[op], dtype) if op in table else None
    if kind == "complex" and dtype in (np.complex64, np.complex128):
        part = np.dtype(np.float32 if dtype == np.complex64 else np.float64)
        if op == ReduceOp.SUM:
            return _add, part
        if op == ReduceOp.PRODUCT:
            return (_cmul_fused if _COMPLEX_FUSED else _cmul_plain), part
    return None  # longdouble, clongdouble, ops the dtype does not define


_COMPLEX_FUSED = _numpy_complex_mul_is_fused()
_compiled: set = set()   # (kernel name, storage dtype) pairs this process has run
_pool = None
_pool_lock = threading.Lock()


def _threads() -> int:
    cap = settings.KERNEL_THREADS()
    n = os.cpu_count() or 1
    return max(1, min(n, cap) if cap > 0 else n)


def _get_pool(workers: int):
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers != workers:
            from concurrent.futures import ThreadPoolExecutor
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="collectives-reduce")
        return _pool


def _run_chunked(kernel, dst, a, b, threads: int, step: int):
    """Run ``kernel`` on ``threads`` slices, the last one on the calling thread."""
    n = dst.size
    per = -(-n // threads)
    per += -per % step  # complex pairs stay whole; 64-element alignment keeps vectors full
    bounds = [(lo, min(lo + per, n)) for lo in range(0, n, per)]
    pool = _get_pool(threads - 1)
    futures = [pool.submit(kernel, dst[lo:hi], a[lo:hi], b[lo:hi]) for lo, hi in bounds[:-1]]
    lo, hi = bounds[-1]
    kernel(dst[lo:hi], a[lo:hi], b[lo:hi])
    for f in futures:
        f.result()


def _partial_overlap(x, y) -> bool:
    """True when x and y share memory without starting at the same address."""
    return (x is not y and np.may_share_memory(x, y)
            and x.__array_interface__["data"][0] != y.__array_interface__["data"][0])


def reducer(op, dtype):
    """``apply(dst, a, b)`` computing dst = a op b with the numpy twin's bits.

    Raises TypeError where the twin does (no element-wise kernel for ``op``); pairs the
    compiled kernels do not cover (and any call with arrays they cannot take) use the twin.
    """
    op = ReduceOp.parse(op)
    dtype = np.dtype(dtype)
    twin = numpy_reducer(op, dtype)
    plan = _plan(op, dtype) if numba is not None else None
    if plan is None:
        return twin
    kernel, storage = plan
    key = (kernel.py_func.__name__, storage.str)
    step = 64  # chunk sizes stay even, so complex (re, im) pairs never split across threads
    min_parallel = max(PARALLEL_MIN_BYTES, 1)

    same_storage = storage == dtype

    def apply(dst, a, b):
        # The common call (contiguous writable arrays of this dtype) costs attribute reads and
        # one kernel call; aliasing is sorted out by address inside the kernel.
        try:
            fd, fa, fb = dst.flags, a.flags, b.flags
            ok = (dst.dtype == dtype and a.dtype == dtype and b.dtype == dtype
                  and dst.shape == a.shape == b.shape and fd.c_contiguous and fa.c_contiguous
                  and fb.c_contiguous and fd.writeable and fa.writeable and fb.writeable)
        except AttributeError:       # not numpy arrays
            ok = False
        if not ok:
            # read-only inputs would compile a second signature: the copy-free twin instead
            return twin(dst, a, b)
        if dst.ndim == 1:
            if same_storage:
                d, x, y = dst, a, b
            else:
                d, x, y = dst.view(storage), a.view(storage), b.view(storage)
        else:
            d = dst.reshape(-1).view(storage)
            x = a.reshape(-1).view(storage)
            y = b.reshape(-1).view(storage)
        if dst.nbytes >= min_parallel and _threads() > 1:
            # Exact aliasing (dst is a or b) is safe chunk by chunk; partial overlap is not.
            if _partial_overlap(dst, a) or _partial_overlap(dst, b):
                return twin(dst, a, b)
            _run_chunked(kernel, d, x, y, _threads(), step)
        elif kernel(d, x, y):        # 1: partial overlap, nothing written
            return twin(dst, a, b)
        _compiled.add(key)
    return apply


def warmup(dtypes=None, ops=None) -> list:
    """Compile (or load from the disk cache) the kernels for ``dtypes`` × ``ops`` now.

    Returns the (op name, dtype name) pairs that have a compiled kernel. Default dtypes:
    every one the numpy twin supports; default ops: every op defined on each dtype.
    """
    if numba is None:
        return []
    from .reduce import _SUPPORTED
    if dtypes is None:
        dtypes = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                  np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                  np.complex128] + ([BFLOAT16] if BFLOAT16 is not None else [])
    done = []
    for dt in dtypes:
        dt = np.dtype(dt)
        for op in (ops if ops is not None else sorted(_SUPPORTED[dtype_kind(dt)])):
            op = ReduceOp.parse(op)
            if _plan(op, dt) is None:
                continue
            x = np.zeros(2, dt)
            reducer(op, dt)(x, x, x)
            done.append((op.name, dt.name))
    return done


def status() -> dict:
    """What ``python -m collectives info`` prints about the compiled reductions."""
    ok, why = available()
    return {
        "backend": "numba" if ok else "numpy",
        "available": ok,
        "detail": why,
        "compiled": sorted(f"{name}[{np.dtype(s).name}]" for name, s in _compiled),
        "cache_dir": (numba.config.CACHE_DIR or "beside the sources (__pycache__)") if ok else None,
        "threads": _threads(),
        "parallel_min_bytes": PARALLEL_MIN_BYTES,
        "complex_multiply": "fma" if _COMPLEX_FUSED else "plain",
    }
