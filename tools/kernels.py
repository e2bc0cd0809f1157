"""Time the numpy twin against the Numba kernels for SUM (dst = a + b, in place into a).

    python tools/kernels.py [--dtypes float32,float16,bfloat16] [--sizes 4K,64K,1M,16M]

GB/s counts the three streams (read a, read b, write dst) per call. ``numba x1`` pins one
thread; ``numba xT`` always cuts the arrays into one chunk per thread (T = cores, or
COLLECTIVES_KERNEL_THREADS); ``fast`` is ``fast_reducer``, what collectives use. Median of
repeats sized to ~0.2 s per cell; the kernels are warmed (compiled) first.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives.kernels import numba_reduce  # noqa: E402
from collectives.kernels.reduce import BFLOAT16, fast_reducer, reducer  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402
from collectives.settings import byte_size  # noqa: E402

def seconds_per_call(fn, dst, a, b, budget=0.2):
    fn(dst, a, b)
    t0 = time.perf_counter()
    fn(dst, a, b)
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(3, min(2000, int(budget / once / 5)))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(dst, a, b)
        samples.append((time.perf_counter() - t0) / reps)
    return float(np.median(samples))


def measure(dtype, nbytes, threads):
    """One record: seconds per call for each implementation at this size."""
    dtype = np.dtype(dtype)
    n = nbytes // dtype.itemsize
    rng = np.random.default_rng(0)
    a = rng.standard_normal(n).astype(dtype)
    b = rng.standard_normal(n).astype(dtype)
    os.environ["COLLECTIVES_KERNEL_THREADS"] = "1"
    single = numba_reduce.reducer(ReduceOp.SUM, dtype)
    record = {"dtype": dtype.name, "bytes": nbytes,
              "numpy": seconds_per_call(reducer(ReduceOp.SUM, dtype), a, a, b),
              "numba x1": seconds_per_call(single, a, a, b)}
    os.environ["COLLECTIVES_KERNEL_THREADS"] = str(threads)
    saved = numba_reduce.PARALLEL_MIN_BYTES
    numba_reduce.PARALLEL_MIN_BYTES = 0
    record[f"numba x{threads}"] = seconds_per_call(numba_reduce.reducer(ReduceOp.SUM, dtype), a, a, b)
    numba_reduce.PARALLEL_MIN_BYTES = saved
    record["fast"] = seconds_per_call(fast_reducer(ReduceOp.SUM, dtype), a, a, b)
    return record


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="float32,float16,bfloat16")
    parser.add_argument("--sizes", default="4K,64K,1M,16M")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    ok, why = numba_reduce.available()
    if not ok:
        sys.exit(f"tools/kernels.py: {why}")
    dtypes = [BFLOAT16 if d == "bfloat16" else np.dtype(d) for d in args.dtypes.split(",")]
    numba_reduce.warmup(dtypes, [ReduceOp.SUM])
    columns = ["numpy", "numba x1", f"numba x{args.threads}", "fast"]
    print(f"# {why}, {os.cpu_count()} cores; GB/s = 3 x bytes / time; ratio = numpy time / time")
    print(f"{'dtype':>9} {'bytes':>9} " + " ".join(f"{c + ' GB/s':>15}" for c in columns)
          + " " + " ".join(f"{c + ' ratio':>16}" for c in columns[1:]))
    for dtype in dtypes:
        for size in args.sizes.split(","):
            r = measure(dtype, byte_size(size), args.threads)
            gbs = [3 * r["bytes"] / r[c] / 1e9 for c in columns]
            ratios = [r["numpy"] / r[c] for c in columns[1:]]
            print(f"{r['dtype']:>9} {size:>9} " + " ".join(f"{g:15.2f}" for g in gbs) + " "
                  + " ".join(f"{x:16.2f}" for x in ratios))


if __name__ == "__main__":
    main()
