"""What the bench runs: the sweep's sizes and element types, and buffers whose result is known.

Every rank's input is a closed-form pattern of small integers (exact in every float type for
moderate world sizes), so the expected output of every collective is computed locally
(``Case``), and a wrong element anywhere is counted, not guessed. Bandwidths follow
nccl-tests (``BUS_FACTOR``): algbw = size / time, busbw = algbw x 2(p-1)/p for all_reduce and
x (p-1)/p for reduce_scatter, all_gather and all_to_all; ``size`` is the larger buffer of the
call.
"""
from __future__ import annotations

import numpy as np

from ..ops import REDUCING, ReduceOp
from ..settings import byte_size
from ..tuning import format_bytes as format_size

BENCH_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ALGORITHMS = ("ring", "tree", "recursive_doubling", "auto", "native")
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}
DEFAULT_SIZES = "4K:16M"
__all__ = ["ALGORITHMS", "BENCH_COLLECTIVES", "BUS_FACTOR", "Case", "DEFAULT_SIZES", "REDUCING",
           "element_count", "format_size", "parse_dtype", "parse_size", "parse_sizes"]


# ---------------------------------------------------------------------------------------------
# sizes and dtypes

def parse_size(text: str) -> int:
    """Bytes as the settings read them (``4096``, ``64K``, ``1.5GiB``), in the bench's words."""
    try:
        return byte_size(text)
    except ValueError:
        raise ValueError(f"bad size {text!r}: use bytes with an optional K, M or G "
                         f"suffix") from None


def parse_sizes(text: str) -> tuple:
    """``4K:16M`` (x4 steps), ``4K:16M:2`` (x2 steps), ``1M``, ``4K,64K``, or a mix."""
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ":" in part:
            bits = part.split(":")
            if len(bits) not in (2, 3):
                raise ValueError(f"bad size range {part!r}: use LOW:HIGH or LOW:HIGH:FACTOR")
            low, high = parse_size(bits[0]), parse_size(bits[1])
            factor = int(bits[2]) if len(bits) == 3 else 4
            if low < 1 or high < low or factor < 2:
                raise ValueError(f"bad size range {part!r}: need 1 <= LOW <= HIGH, FACTOR >= 2")
            size = low
            while size <= high:
                sizes.append(size)
                size *= factor
        else:
            sizes.append(parse_size(part))
    if not sizes:
        raise ValueError(f"no sizes in {text!r}")
    return tuple(sorted(set(sizes)))


def parse_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "bf16"):
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(f"unknown dtype {name!r}") from None


# ---------------------------------------------------------------------------------------------
# data whose result is known: small integer patterns

_PERIOD = 60          # every pattern repeats with this period in the element index


def _pattern(rank, k, op, dtype):
    """This rank's input value at element index ``k`` (an int array) for reducing ``op``."""
    if dtype == np.bool_:
        return (rank + k) % 3 == 0
    if op == ReduceOp.PRODUCT:
        return 1 + (rank + k) % 2
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return (rank * 3 + k) % 16
    return rank % 7 + 1 + k % 5


def _moved(rank, k, dtype, peer=0):
    """Values for data-movement collectives: differ by rank (and by destination ``peer``)."""
    values = (rank * 7 + peer * 3 + k) % 13 + 1
    return values % 2 == 1 if dtype == np.bool_ else values


_COMBINE = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
            ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
            ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
_COMBINE_BOOL = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and,
                 ReduceOp.MIN: np.logical_and, ReduceOp.MAX: np.logical_or,
                 ReduceOp.BAND: np.logical_and, ReduceOp.BOR: np.logical_or,
                 ReduceOp.BXOR: np.logical_xor}


def _reduced_period(size, op, dtype):
    """The reduction over all ranks of one period of the pattern (computed in float64/ints)."""
    k = np.arange(_PERIOD)
    wide = np.bool_ if dtype == np.bool_ else (np.int64 if dtype.kind in "iu" else np.float64)
    table = _COMBINE_BOOL if dtype == np.bool_ else _COMBINE
    acc = np.asarray(_pattern(0, k, op, dtype), dtype=wide)
    for r in range(1, size):
        acc = table[op](acc, np.asarray(_pattern(r, k, op, dtype), dtype=wide))
    if op == ReduceOp.AVG:
        acc = acc / size
    return acc.astype(dtype)


class Case:
    """Buffers and the expected result of one (collective, count, dtype, op) on one rank."""

    def __init__(self, collective, rank, size, count, dtype, op):
        self.collective, self.rank, self.size = collective, rank, size
        k = np.arange(count)
        block = count // size if collective != "all_reduce" else count
        if collective == "all_reduce":
            self.input = np.asarray(_pattern(rank, k, op, dtype)).astype(dtype)
            self.expected = _reduced_period(size, op, dtype)[k % _PERIOD]
        elif collective == "reduce_scatter":
            self.input = np.asarray(_pattern(rank, k, op, dtype)).astype(dtype)
            mine = np.arange(rank * block, (rank + 1) * block)
            self.expected = _reduced_period(size, op, dtype)[mine % _PERIOD]
        elif collective == "all_gather":
            kb = np.arange(block)
            self.input = np.asarray(_moved(rank, kb, dtype)).astype(dtype)
            self.expected = np.concatenate([np.asarray(_moved(r, kb, dtype)).astype(dtype)
                                            for r in range(size)])
        elif collective == "all_to_all":
            kb = np.arange(block)
            self.input = np.concatenate([np.asarray(_moved(rank, kb, dtype, peer=j)).astype(dtype)
                                         for j in range(size)])
            self.expected = np.concatenate([np.asarray(_moved(i, kb, dtype, peer=rank))
                                            .astype(dtype) for i in range(size)])
        else:
            raise ValueError(f"bench: collective {collective!r} is not benchmarked; choose from "
                             f"{', '.join(BENCH_COLLECTIVES)}")
        self.output = np.empty_like(self.expected)
        # exact for integer-valued patterns; AVG divides, and half floats round large sums
        self.exact = op != ReduceOp.AVG and dtype.itemsize >= 4 or dtype.kind in "iub"

    def wrong(self, output=None) -> int:
        got = self.output if output is None else output
        if self.exact or self.expected.dtype == np.bool_:
            return int(np.count_nonzero(got != self.expected))
        a, b = got.astype(np.float64), self.expected.astype(np.float64)
        return int(np.count_nonzero(~np.isclose(a, b, rtol=1e-2 if got.itemsize < 4 else 1e-5)))

    def poison(self):
        """Overwrite the output so a call that writes nothing cannot pass the check."""
        if self.output.dtype == np.bool_:
            self.output[...] = ~self.expected
        else:
            self.output[...] = self.expected + 1


def element_count(collective, nbytes, itemsize, size) -> int:
    """Elements of the larger buffer; a multiple of the world size where blocks are split."""
    count = max(1, nbytes // itemsize)
    if collective != "all_reduce":
        count = max(1, count // size) * size
    return count
