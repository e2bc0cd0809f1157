"""Compiled reduction kernels against their numpy twin: every op × dtype, odd lengths,
aliasing, non-finite values, the threaded path and the fallbacks. Results must be bitwise
equal, except where numpy itself is not deterministic (see ``_nan_is_free``)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# Compile into a private cache so the test neither depends on nor pollutes another cache.
os.environ.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="collectives-numba-"))

from collectives.kernels import numba_reduce as nr  # noqa: E402
from collectives.kernels.reduce import (  # noqa: E402
    BFLOAT16, _SUPPORTED, dtype_kind, fast_reducer, kernel_status, reducer)
from collectives.ops import ReduceOp  # noqa: E402
from repo import ROOT

pytestmark = pytest.mark.skipif(not nr.available()[0], reason=str(nr.available()[1]))

DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
          np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128, BFLOAT16]
LENGTHS = (0, 1, 7, 1023, 100003)
N = max(LENGTHS)
CASES = [(op, np.dtype(dt)) for dt in DTYPES for op in sorted(_SUPPORTED[dtype_kind(dt)])]
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _bits_dtype(dtype):
    """Unsigned view with one lane per real component."""
    if dtype.kind == "c":
        return _UINT[dtype.itemsize // 2], 2
    return _UINT[dtype.itemsize], 1


def _operand(dtype, seed):
    """N values: for floats random bit patterns (every NaN payload, inf, subnormals, huge and
    tiny exponents), ordinary values, and the specials at fixed places."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, N).astype(np.bool_)
    uint, lanes = _bits_dtype(dtype)
    bits = rng.integers(0, np.iinfo(uint).max, N * lanes, dtype=uint, endpoint=True)
    out = bits.view(dtype).copy()
    if dtype_kind(dtype) in ("float", "complex"):
        flat = out.view(np.float32 if uint == np.uint32 else
                        np.float64 if uint == np.uint64 else dtype)
        if uint == np.uint16:  # float16 / bfloat16 are their own lanes
            flat = out
        normal = rng.standard_normal(flat.size // 2).astype(np.float32)
        flat[::2][: normal.size] = normal.astype(flat.dtype)  # half the lanes: ordinary values
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0])
        specials = specials.astype(flat.dtype)
        idx = rng.integers(0, flat.size, 4000)
        flat[idx] = specials[rng.integers(0, specials.size, idx.size)]
    return out


_A = {}


def _pair(dtype):
    if dtype not in _A:
        _A[dtype] = (_operand(dtype, 1), _operand(dtype, 2))
    return _A[dtype]


def _nan_is_free(op, dtype, a, b):
    """Lanes where numpy's NaN payload and sign are not reproducible, so only isnan is compared.

    float32/float64/complex add and multiply with NaN in *both* operands: numpy's SIMD body and
    its scalar tail pick different operands' NaN (seen: the same call returns a's NaN for some
    elements and b's for others), so no kernel can match its bits. Complex multiply with any
    non-finite part mixes several NaNs through four products. float16 / bfloat16 and all
    MIN/MAX are deterministic and compared bit for bit."""
    if dtype.kind not in "fc" or dtype == np.float16 or op in (ReduceOp.MIN, ReduceOp.MAX):
        return None
    lanes = _bits_dtype(dtype)[1]
    fa = a.view(a.real.dtype).reshape(-1, lanes) if lanes == 2 else a.reshape(-1, 1)
    fb = b.view(b.real.dtype).reshape(-1, lanes) if lanes == 2 else b.reshape(-1, 1)
    if dtype.kind == "c" and op == ReduceOp.PRODUCT:
        bad = ~(np.isfinite(fa).all(1) & np.isfinite(fb).all(1))
        return np.repeat(bad, 2)
    if dtype.kind == "c":
        return (np.isnan(fa) & np.isnan(fb)).reshape(-1)
    return np.isnan(a) & np.isnan(b)


def _assert_same(got, want, free):
    uint, _ = _bits_dtype(got.dtype) if got.dtype != np.bool_ else (np.uint8, 1)
    g, w = got.view(uint).reshape(-1), want.view(uint).reshape(-1)
    if free is not None and free.any():
        lane = got.view(got.real.dtype).reshape(-1) if got.dtype.kind == "c" else got.reshape(-1)
        wane = want.view(want.real.dtype).reshape(-1) if want.dtype.kind == "c" else want.reshape(-1)
        np.testing.assert_array_equal(np.isnan(lane[free]), np.isnan(wane[free]))
        g, w = g[~free], w[~free]
    mismatch = np.flatnonzero(g != w)
    if mismatch.size:
        i = mismatch[0]
        raise AssertionError(f"{mismatch.size} elements differ; first at {i}: "
                             f"got {hex(int(g[i]))}, numpy {hex(int(w[i]))}")


@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o.name}-{d.name}" for o, d in CASES])
def test_kernel_matches_numpy_twin(op, dtype):
    a_full, b_full = _pair(dtype)
    kernel, twin = nr.reducer(op, dtype), reducer(op, dtype)
    for n in LENGTHS:
        a, b = a_full[:n], b_full[:n]
        free = _nan_is_free(op, dtype, a, b)
        want = np.empty_like(a)
        with np.errstate(all="ignore"):
            twin(want, a, b)
            got = np.empty_like(a)
            kernel(got, a, b)
            _assert_same(got, want, free)
            in_a, in_b = a.copy(), b.copy()   # dst is a / dst is b
            kernel(in_a, in_a, b)
            kernel(in_b, a, in_b)
        _assert_same(in_a, want, free)
        _assert_same(in_b, want, free)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, BFLOAT16, np.complex128, np.int64],
                         ids=lambda d: np.dtype(d).name)
def test_threaded_chunks_match(monkeypatch, dtype):
    monkeypatch.setattr(nr, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("COLLECTIVES_KERNEL_THREADS", "3")
    dtype = np.dtype(dtype)
    a, b = _pair(dtype)
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT):
        want, got = np.empty_like(a), np.empty_like(a)
        with np.errstate(all="ignore"):
            reducer(op, dtype)(want, a, b)
            nr.reducer(op, dtype)(got, a, b)
        _assert_same(got, want, _nan_is_free(op, dtype, a, b))


def test_fallbacks_give_the_twin_result():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1001).astype(np.float16)
    y = rng.standard_normal(1001).astype(np.float16)
    fn = nr.reducer(ReduceOp.SUM, np.float16)
    # strided views
    got, want = np.empty(501, np.float16), np.empty(501, np.float16)
    fn(got, x[::2], y[::2])
    np.add(x[::2], y[::2], out=want)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    # partial overlap: dst is a shifted by one element
    buf, ref = x.copy(), x.copy()
    fn(buf[1:], buf[:-1], y[1:])
    np.add(ref[:-1], y[1:], out=ref[1:])
    assert np.array_equal(buf.view(np.uint16), ref.view(np.uint16))
    # read-only input, 2-D arrays
    ro = y.copy()
    ro.flags.writeable = False
    fn(got[:0], x[:0], ro[:0])
    m = x[:1000].reshape(10, 100)
    out = np.empty_like(m)
    fn(out, m, m)
    assert np.array_equal(out, m + m)


def test_errors_match_twin_and_unsupported_falls_back():
    with pytest.raises(TypeError):
        nr.reducer(ReduceOp.PREMUL_SUM, np.float32)
    # longdouble has no compiled kernel: the twin itself comes back
    fn = nr.reducer(ReduceOp.SUM, np.longdouble)
    a = np.arange(5, dtype=np.longdouble)
    out = np.empty_like(a)
    fn(out, a, a)
    assert np.array_equal(out, 2 * a)


def test_fast_reducer_and_status():
    a = np.arange(100, dtype=np.float16)
    out = np.empty_like(a)
    fast_reducer(ReduceOp.AVG, np.float16)(out, a, a)
    assert np.array_equal(out, a + a)
    with pytest.raises(TypeError):
        fast_reducer(ReduceOp.PREMUL_SUM, np.float32)
    done = nr.warmup([np.float32], [ReduceOp.SUM])
    assert done == [("SUM", "float32")]
    info = kernel_status()
    assert info["available"] is True and info["backend"] == "numba"
    assert "_add[float32]" in info["compiled"]


def test_imports_and_falls_back_without_numba():
    code = ("import sys; sys.modules['numba'] = None\n"
            "import numpy as np\n"
            "from collectives.kernels import numba_reduce as nr, reduce as r\n"
            "ok, why = nr.available(); assert not ok and 'numba' in why, why\n"
            "a = np.arange(9, dtype=np.float16); out = np.empty_like(a)\n"
            "r.fast_reducer('sum', np.float16)(out, a, a)\n"
            "assert np.array_equal(out, a + a)\n"
            "s = r.kernel_status(); assert s['backend'] == 'numpy', s\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr
