"""Object collectives: picklable Python objects over the byte collectives.

Each object is pickled to uint8; sizes travel first (an int64 collective) so every rank
knows the byte counts, then the bytes (all-gather-v where sizes differ, padded to the largest
size for gather/scatter, whose schedules need equal blocks). On nccl the bytes travel as CuPy
arrays on this rank's GPU (torch serializes to uint8 CUDA tensors there too), and the host
reads them back after ``transport.synchronize`` (bounded by the group's timeout). Like torch,
this unpickles whatever arrives: use it only between ranks you trust.
"""
from __future__ import annotations

import contextlib
import pickle

import numpy as np

from . import state, work as _work


def _to_bytes(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj), dtype=np.uint8)


def _from_bytes(data: np.ndarray):
    return pickle.loads(data.tobytes())


def _member(group, operation):
    return state.resolve(group, operation)


def _on_device(pg):
    """Where the group's buffers live: the host, or (nccl) this rank's GPU, made current so
    that allocations, the collectives and the host's reads use one device and stream."""
    device = getattr(_base(pg.transport), "device", None)
    return contextlib.nullcontext() if device is None else pg.xp.cuda.Device(device)


def _base(transport):
    while getattr(transport, "parent", None) is not None:       # a wrapped subgroup
        transport = transport.parent
    return transport


def _to_group(pg, host: np.ndarray):
    """``host`` as an array the group's collectives take (a device copy on nccl)."""
    return host if pg.xp in (None, np) else pg.xp.asarray(host)


def _empty(pg, count: int, dtype):
    return np.empty(count, dtype) if pg.xp in (None, np) else pg.xp.empty(count, dtype=dtype)


def _to_host(pg, array, operation) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array
    _base(pg.transport).synchronize(pg.timeout, operation=operation)
    return pg.xp.asnumpy(array)


def _run(pg, collective, **buffers):
    """One byte collective on the group's own arrays (no list splitting: one host read)."""
    run = pg.prepare(collective, **buffers)
    _work.call(pg, run, False, [b for b in buffers.values() if hasattr(b, "dtype")])


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """Broadcast picklable objects from ``src``.

    Args:
        object_list (list): on ``src``, the objects; elsewhere, as many slots, replaced element
            by element.
        src (int): the source's global rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        device: accepted for torch's signature (the bytes travel on the group's device).
        group_src (int, optional): the source's group rank, instead of ``src``.

    Returns:
        None.
    """
    pg = _member(group, "broadcast_object_list")
    if pg is None:
        return
    root = state.group_rank(pg, src, group_src, "broadcast_object_list", "src")
    operation = "broadcast_object_list"
    mine = [_to_bytes(obj) for obj in object_list] if pg.rank == root else []
    with _on_device(pg):
        sizes = _to_group(pg, np.array([m.size for m in mine] if mine else
                                       [0] * len(object_list), np.int64))
        _run(pg, "broadcast", output=sizes, root=root)
        sizes = _to_host(pg, sizes, operation)
        data = _to_group(pg, np.concatenate(mine)) if mine else \
            _empty(pg, int(sizes.sum()), np.uint8)
        _run(pg, "broadcast", output=data, root=root)
        if pg.rank == root:
            return
        data = _to_host(pg, data, operation)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for i in range(len(object_list)):
        object_list[i] = _from_bytes(data[offsets[i]:offsets[i + 1]])


def all_gather_object(object_list, obj, group=None):
    """Gather every rank's picklable ``obj`` into ``object_list``.

    Args:
        object_list (list): one slot per rank, replaced with that rank's object.
        obj: this rank's object.
        group (ProcessGroup, optional): the group to work on; None is the default group.

    Returns:
        None.
    """
    pg = _member(group, "all_gather_object")
    if pg is None:
        return
    if len(object_list) != pg.size:
        raise ValueError(f"all_gather_object on rank {pg.rank}: object_list must have "
                         f"{pg.size} slots, got {len(object_list)}")
    data = _to_bytes(obj)
    with _on_device(pg):
        sizes = _empty(pg, pg.size, np.int64)
        _run(pg, "all_gather", input=_to_group(pg, np.array([data.size], np.int64)),
             output=sizes)
        sizes = _to_host(pg, sizes, "all_gather_object")
        whole = _empty(pg, int(sizes.sum()), np.uint8)
        _run(pg, "all_gather", input=_to_group(pg, data), output=whole,
             counts=[int(n) for n in sizes])
        whole = _to_host(pg, whole, "all_gather_object")
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for i in range(pg.size):
        object_list[i] = _from_bytes(whole[offsets[i]:offsets[i + 1]])


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """Gather every rank's picklable ``obj`` into ``object_gather_list`` on ``dst``.

    Args:
        obj: this rank's object.
        object_gather_list (list, optional): on ``dst`` only, one slot per rank.
        dst (int): the destination's global rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        group_dst (int, optional): the destination's group rank, instead of ``dst``.

    Returns:
        None.
    """
    pg = _member(group, "gather_object")
    if pg is None:
        return
    root = state.group_rank(pg, dst, group_dst, "gather_object", "dst")
    if pg.rank == root and (object_gather_list is None or len(object_gather_list) != pg.size):
        raise ValueError(f"gather_object on rank {pg.rank}: object_gather_list must have "
                         f"{pg.size} slots on the destination")
    if pg.rank != root and object_gather_list is not None:
        raise ValueError(f"gather_object on rank {pg.rank}: object_gather_list must not be "
                         f"given on ranks other than the destination")
    data = _to_bytes(obj)
    with _on_device(pg):
        sizes = _empty(pg, pg.size, np.int64)
        _run(pg, "all_gather", input=_to_group(pg, np.array([data.size], np.int64)),
             output=sizes)
        sizes = _to_host(pg, sizes, "gather_object")
        width = int(sizes.max())
        padded = np.zeros(width, np.uint8)
        padded[:data.size] = data
        whole = _empty(pg, width * pg.size, np.uint8) if pg.rank == root else None
        _run(pg, "gather", input=_to_group(pg, padded), output=whole, root=root)
        if pg.rank != root:
            return
        whole = _to_host(pg, whole, "gather_object")
    for i in range(pg.size):
        object_gather_list[i] = _from_bytes(whole[i * width:i * width + sizes[i]])


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Scatter picklable objects from ``src``: rank i receives entry i.

    Args:
        scatter_object_output_list (list): at least one slot; entry 0 receives the object.
        scatter_object_input_list (list, optional): on ``src`` only, one object per rank.
        src (int): the source's global rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        group_src (int, optional): the source's group rank, instead of ``src``.

    Returns:
        None.
    """
    pg = _member(group, "scatter_object_list")
    if pg is None:
        return
    root = state.group_rank(pg, src, group_src, "scatter_object_list", "src")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError(f"scatter_object_list on rank {pg.rank}: Expected argument "
                         f"scatter_object_output_list to be a list of size at least 1.")
    if pg.rank == root and (scatter_object_input_list is None
                            or len(scatter_object_input_list) != pg.size):
        raise ValueError(f"scatter_object_list on rank {pg.rank}: scatter_object_input_list "
                         f"must hold {pg.size} objects on the source")
    operation = "scatter_object_list"
    mine = [_to_bytes(o) for o in scatter_object_input_list] if pg.rank == root else []
    with _on_device(pg):
        sizes = _to_group(pg, np.array([m.size for m in mine] if mine else [0] * pg.size,
                                       np.int64))
        _run(pg, "broadcast", output=sizes, root=root)
        sizes = _to_host(pg, sizes, operation)
        width = int(sizes.max())
        whole = None
        if pg.rank == root:
            host = np.zeros((pg.size, width), np.uint8)
            for row, m in zip(host, mine):
                row[:m.size] = m
            whole = _to_group(pg, host.reshape(-1))
        received = _empty(pg, width, np.uint8)
        _run(pg, "scatter", input=whole, output=received, root=root)
        received = _to_host(pg, received, operation)
    scatter_object_output_list[0] = _from_bytes(received[:sizes[pg.rank]])
