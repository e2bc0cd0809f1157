"""One collective call as the group sees it: its arguments checked before any byte moves,
its counts and its size as ``auto`` sees it, and the shape ``ProcessGroup.prepare`` works
out once and reuses for every later call shaped alike (``CallShape``, with the quick checks
that let a repeated call skip the full ones: ``plain``).

Every check raises ``ValueError``/``TypeError`` naming the operation and the rank.
"""
from __future__ import annotations

import numpy as np

from .algorithms.schedule import ROOTED, Matrix
from .algorithms.transforms import read_input_first, windowed
from .kernels.reduce import BFLOAT16, fast_reducer, reducer


def check_root(collective, root, rank, size):
    """A rooted collective's ``root``: a rank of the group."""
    if collective in ROOTED and not (isinstance(root, (int, np.integer)) and 0 <= root < size):
        raise ValueError(f"{collective} on rank {rank}: root {root!r} is out of range "
                         f"for a group of size {size}")


def check_buffer(collective, name, buf, dtype, rank, transport):
    """``buf`` (the call's ``name``: input or output; None passes): a flat contiguous array
    of the transport's array type and of ``dtype``, writable where it is the output."""
    if buf is None:
        return
    if not hasattr(buf, "dtype") or not hasattr(buf, "ndim"):
        raise TypeError(f"{collective} on rank {rank}: {name} must be an array, "
                        f"got {type(buf).__name__}")
    xp = transport.xp
    if xp is not None and not isinstance(buf, xp.ndarray):
        where = "GPU" if xp is not np else "host"
        raise TypeError(f"{collective} on rank {rank}: {name} is a "
                        f"{type(buf).__module__}.{type(buf).__name__}, but this group's "
                        f"{transport.name} transport works on {xp.__name__} arrays "
                        f"({where} memory): move the buffer to the {where} first")
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"{collective} on rank {rank}: {name} must be a flat "
                         f"contiguous array (got ndim={buf.ndim}, "
                         f"contiguous={buf.flags.c_contiguous})")
    if buf.dtype != dtype:
        raise TypeError(f"{collective} on rank {rank}: input and output dtypes differ "
                        f"({dtype} vs {buf.dtype})")
    if name == "output" and not getattr(buf.flags, "writeable", True):   # cupy: no flag
        raise ValueError(f"{collective} on rank {rank}: the output buffer is read-only")


def call_counts(collective, counts, input, output, rank, p):
    """The call's counts as the schedules take them (elements; per rank, or the matrix for
    all_to_all) from the given ``counts`` or, without them, from the buffers' sizes."""
    if collective == "barrier":
        return None
    if collective in ("all_reduce", "broadcast"):
        return output.size
    if collective == "reduce":
        return input.size
    if counts is not None:
        if collective == "all_to_all":
            counts = Matrix(tuple(int(c) for c in row) for row in counts)
            bad = len(counts) != p or any(len(row) != p for row in counts)
        else:
            counts = tuple(int(c) for c in counts)
            bad = len(counts) != p
        if bad or any(c < 0 for c in np.ravel(counts)):
            raise ValueError(f"{collective} on rank {rank}: counts must be {p} "
                             f"non-negative integers per rank, got {counts!r}")
        return counts
    if collective in ("all_gather", "gather"):
        return (input.size,) * p
    if collective == "reduce_scatter":
        return (output.size,) * p
    if collective == "scatter":
        return (output.size,) * p
    if collective == "all_to_all":
        if input.size % p:
            raise ValueError(f"all_to_all on rank {rank}: {input.size} elements do not "
                             f"split evenly over {p} ranks; give split sizes")
        return Matrix(((input.size // p,) * p,) * p)
    raise ValueError(f"unknown collective {collective!r}")


def check_sizes(collective, input, output, n_in, n_out, root, rank):
    """The buffers hold what the counts say (``n_in``/``n_out``: ``buffer_sizes``'); a rooted
    collective's buffers are checked only where they are used."""
    rooted_out = collective in ("reduce", "gather") and rank != root
    rooted_in = collective == "scatter" and rank != root
    if input is not None and not rooted_in and input.size != n_in \
            and collective not in ("all_reduce", "broadcast"):
        raise ValueError(f"{collective} on rank {rank}: input has {input.size} "
                         f"elements, expected {n_in}")
    if output is not None and not rooted_out and output.size != n_out:
        raise ValueError(f"{collective} on rank {rank}: output has {output.size} "
                         f"elements, expected {n_out}")
    if collective == "all_reduce" and input is not None and input.size != output.size:
        raise ValueError(f"all_reduce on rank {rank}: input has {input.size} elements, "
                         f"output {output.size}")


def host_reducer(op, dtype):
    """numpy's half-precision loops are scalar (many times slower than float32), so float16 and
    bfloat16 take the Numba kernels (imported only then); everything else stays on numpy,
    which is as fast as Numba on these sizes and costs no compile."""
    if dtype == np.float16 or dtype == BFLOAT16:
        return fast_reducer(op, dtype)
    return reducer(op, dtype)


def call_size(collective, counts, size) -> int:
    """The call's size in elements as ``auto`` sees it (cost.uniform_counts' convention),
    computed only from what every rank knows alike: ranks that disagreed here would pick
    different algorithms and deadlock."""
    if collective == "barrier":
        return 0
    if collective in ("all_reduce", "broadcast", "reduce"):
        return counts
    if collective in ("reduce_scatter", "all_gather", "gather"):
        return sum(counts)
    if collective == "scatter":
        return sum(counts) // size
    return sum(map(sum, counts)) // size          # all_to_all: the average send buffer


def no_check():
    """The check of a call that needs none (``prepare`` keeps the shapes of such calls)."""
    return None


_UNSET = object()


class CallShape:
    """What ``prepare`` worked out for a call of one shape (collective, dtypes, sizes, op,
    algorithm, root, timeout), reused by every later call of that shape. ``plan`` None: the
    native collective. ``steps``: the plan as the executor runs it (its steps merged into
    windows of ``window``, transforms.windowed). ``extra``: what the executor is also passed
    (the call's signature where the transport compares it)."""
    __slots__ = ("collective", "dtype", "plan", "steps", "window", "reduce", "op", "deadline",
                 "counts", "extra", "_direct")

    def __init__(self, collective, dtype, plan, reduce, op, deadline, counts, mark, window):
        self.collective, self.dtype, self.plan, self.reduce = collective, dtype, plan, reduce
        self.op, self.deadline, self.counts, self.window = op, deadline, counts, window
        self.steps = windowed(plan, window) if plan is not None and window > 1 else plan
        self.extra = {} if mark is None else {"signature": mark}
        self._direct = _UNSET

    def reading_input_first(self):
        """The all_reduce plan rewritten to read input instead of copying it into output
        first, as the executor runs it (None where it cannot be), worked out once."""
        if self._direct is _UNSET:
            direct = read_input_first(self.plan, self.counts)    # all_reduce: counts = n
            if direct is not None and self.window > 1:
                direct = windowed(direct, self.window)
            self._direct = direct
        return self._direct


def plain(buf, array_type, written) -> bool:
    """Whether ``buf`` (of a shape seen before: its dtype and size are the key's) is surely
    fine: None, or a flat contiguous array of the group's type (writable where ``written``).
    False sends it through ``check_buffer``, which says what is wrong."""
    if buf is None:
        return True
    if array_type is None or type(buf) is not array_type or buf.ndim != 1:
        return False
    flags = buf.flags
    return flags.c_contiguous and (not written or getattr(flags, "writeable", True))


def same_memory(a, b) -> bool:
    return a is b or (a.size == b.size and a.size > 0 and _address(a) == _address(b))


def overlap(a, b) -> bool:
    if a.size == 0 or b.size == 0:
        return False
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.shares_memory(a, b)
    lo_a, lo_b = _address(a), _address(b)
    return lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes


def _address(a) -> int:
    if isinstance(a, np.ndarray):
        return a.__array_interface__["data"][0]
    return a.data.ptr          # cupy
