"""What the facade's collectives share: resolving ``group=``, checking list-shaped arguments
before any byte moves, and the one backend call that ends each (``_issue``: the group's
``prepare``, splitting a gathered buffer, torch's words on a barrier's timeout, the Work)."""
from __future__ import annotations

import time as _time

from .. import state, tensors, work as _work
from ..errors import TIMED_OUT, CollectiveTimeout


def _group(group, operation):
    return state.resolve(group, operation)


def _issue(pg, collective, async_op, result, *, split=None, operation=None, algorithm=None,
           timeout=None, **buffers):
    """The end of every collective, once its arguments are checked: one ``prepare`` of the
    group, run now or queued on the group's worker (a Work if ``async_op``).

    ``timeout`` (seconds or a timedelta; inf: no deadline) bounds this call's waits instead of
    the group's timeout; None keeps the group's. The group checks it (NaN or negative: a
    ValueError before anything moves). ``split`` = (whole, parts): after the run, the gathered
    buffer is copied into the caller's tensors. A barrier's timeout is told in torch's words,
    naming ``operation`` (default: the collective). ``result``: the tensors the Work holds."""
    run = pg.prepare(collective, algorithm=algorithm, timeout=timeout, **buffers)
    if split is not None:
        run = _work.then(run, tensors.split_into, *split)
    if collective == "barrier":
        run = _timed_out_words(run, operation or collective, pg)
    return _work.call(pg, run, async_op, result)


def _real_views(items, operation, pg, name, length=None):
    """Flat views of a list of tensors of one dtype, complex ones as (re, im) pairs of reals:
    as in torch's coalesced collectives, a complex tensor and its element type (complex64
    and float32) may be mixed."""
    tensors.check_list(items, operation, pg.rank, name, length, per_rank=False)
    views = [tensors.as_real(tensors.flat(t, operation, pg.rank, f"{name}[{i}]"))
             for i, t in enumerate(items)]
    for i, view in enumerate(views[1:], 1):
        if view.dtype != views[0].dtype:
            raise TypeError(f"{operation} on rank {pg.rank}: {name} mixes dtypes "
                            f"({items[0].dtype} and {items[i].dtype} at index {i})")
    return views


def _check_outputs(operation, pg, outs):
    for i, view in enumerate(outs):
        if not tensors.writeable(view):
            raise ValueError(f"{operation} on rank {pg.rank}: output tensor {i} is read-only")


def _check_same_dtype(operation, pg, one, many):
    for i, view in enumerate(many):
        if one is not None and view.dtype != one.dtype:
            raise TypeError(f"{operation} on rank {pg.rank}: input and output dtypes differ "
                            f"({view.dtype} at index {i} vs {one.dtype})")


def _rooted_list(operation, pg, root, items, name, like):
    """gather_list / scatter_list: required on the root (one per rank, each like ``like``),
    forbidden elsewhere, as in torch. Returns (views, a flat buffer for gather's output)."""
    if pg.rank != root:
        if items:
            raise ValueError(f"{operation} on rank {pg.rank}: {name} must not be given on "
                             f"ranks other than the root ({root})")
        return [], None
    if items is None:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} is required on the root")
    views = tensors.flat_list(items, operation, pg.rank, name, pg.size)
    for i, view in enumerate(views):
        if view.size != like.size or view.dtype != like.dtype:
            raise ValueError(f"{operation} on rank {pg.rank}: {name}[{i}] has {view.size} "
                             f"{view.dtype} elements; each entry must match the tensor "
                             f"({like.size} {like.dtype})")
    if operation == "gather":
        _check_outputs(operation, pg, views)
    return views, tensors.empty(like, like.size * pg.size)


def _splits(pg, sizes, total, per_row, name):
    if sizes is None:
        if total % pg.size:
            raise ValueError(f"all_to_all_single on rank {pg.rank}: {total} elements do not "
                             f"split evenly over {pg.size} ranks; give {name}")
        return [total // pg.size] * pg.size
    sizes = [int(s) for s in sizes]
    if len(sizes) != pg.size or any(s < 0 for s in sizes) or sum(sizes) * per_row != total:
        raise ValueError(f"all_to_all_single on rank {pg.rank}: {name} {sizes} must be "
                         f"{pg.size} non-negative row counts adding up to the tensor's rows")
    return [s * per_row for s in sizes]


def _all_to_all_counts(pg, sends, recvs, algorithm):
    """The full matrix counts[i][j] (i sends to j): ProcessGroup.all_to_all_matrix. MPI's
    native all-to-all needs only this rank's row and column."""
    p, me = pg.size, pg.rank
    if (algorithm or pg.overrides.get("all_to_all")) == "native":
        matrix = [[0] * p for _ in range(p)]
        matrix[me] = list(sends)
        for i in range(p):
            matrix[i][me] = recvs[i]
        return matrix
    return pg.all_to_all_matrix(sends, recvs, "all_to_all",
                                lambda run: _work.call(pg, run, False, []))


def _timed_out_words(run, operation, pg):
    """A barrier's timeout says TIMED_OUT, torch's words (gloo's "Timed out waiting ...",
    which code and torch's tests match), before the executor's account of where it waited
    (the host executor's says them already; the compiled and NCCL ones do not)."""
    def run_or_time_out():
        started = _time.monotonic()
        try:
            run()
        except CollectiveTimeout as exc:
            if TIMED_OUT in str(exc):
                raise
            raise CollectiveTimeout(f"{operation} on rank {pg.rank}: {TIMED_OUT} after "
                                    f"{_time.monotonic() - started:.3g} s; {exc}") from exc
    return run_or_time_out
