"""Object collectives: picklable Python objects over the byte collectives.

Each object is pickled to uint8; sizes travel first (an int64 collective) so every rank
knows the byte counts, then the bytes (all-gather-v where sizes differ, padded to the largest
size for gather/scatter, whose schedules need equal blocks). Like torch, this unpickles
whatever arrives: use it only between ranks you trust.
"""
from __future__ import annotations

import pickle

import numpy as np

from . import state


def _to_bytes(obj) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj), dtype=np.uint8)


def _from_bytes(data: np.ndarray):
    return pickle.loads(data.tobytes())


def _member(group, operation):
    return state.resolve(group, operation)


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """``object_list`` on ``src`` is copied, element by element, into every rank's list."""
    from . import broadcast
    pg = _member(group, "broadcast_object_list")
    if pg is None:
        return
    root = state.group_rank(pg, src, group_src, "broadcast_object_list", "src")
    root_global = pg.ranks[root]
    mine = [_to_bytes(obj) for obj in object_list] if pg.rank == root else []
    sizes = np.array([m.size for m in mine] if mine else [0] * len(object_list), np.int64)
    broadcast(sizes, root_global, group)
    data = np.concatenate(mine) if mine else np.empty(int(sizes.sum()), np.uint8)
    broadcast(data, root_global, group)
    if pg.rank != root:
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        for i in range(len(object_list)):
            object_list[i] = _from_bytes(data[offsets[i]:offsets[i + 1]])


def all_gather_object(object_list, obj, group=None):
    """``object_list`` (one slot per rank) receives every rank's ``obj``."""
    from . import all_gather_into_tensor, all_gather
    pg = _member(group, "all_gather_object")
    if pg is None:
        return
    if len(object_list) != pg.size:
        raise ValueError(f"all_gather_object on rank {pg.rank}: object_list must have "
                         f"{pg.size} slots, got {len(object_list)}")
    data = _to_bytes(obj)
    sizes = np.empty(pg.size, np.int64)
    all_gather_into_tensor(sizes, np.array([data.size], np.int64), group)
    pieces = [np.empty(int(n), np.uint8) for n in sizes]
    all_gather(pieces, data, group)
    for i, piece in enumerate(pieces):
        object_list[i] = _from_bytes(piece)


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """On ``dst``, ``object_gather_list`` (one slot per rank) receives every rank's ``obj``."""
    from . import all_gather_into_tensor, gather
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
    sizes = np.empty(pg.size, np.int64)
    all_gather_into_tensor(sizes, np.array([data.size], np.int64), group)
    width = int(sizes.max())
    padded = np.zeros(width, np.uint8)
    padded[:data.size] = data
    slots = [np.empty(width, np.uint8) for _ in range(pg.size)] if pg.rank == root else None
    gather(padded, slots, pg.ranks[root], group)
    if pg.rank == root:
        for i, slot in enumerate(slots):
            object_gather_list[i] = _from_bytes(slot[:sizes[i]])


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """Rank i receives ``scatter_object_input_list[i]`` (given on ``src``) into
    ``scatter_object_output_list[0]``."""
    from . import broadcast, scatter
    pg = _member(group, "scatter_object_list")
    if pg is None:
        return
    root = state.group_rank(pg, src, group_src, "scatter_object_list", "src")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError(f"scatter_object_list on rank {pg.rank}: scatter_object_output_list "
                         f"must be a non-empty list")
    if pg.rank == root and (scatter_object_input_list is None
                            or len(scatter_object_input_list) != pg.size):
        raise ValueError(f"scatter_object_list on rank {pg.rank}: scatter_object_input_list "
                         f"must hold {pg.size} objects on the source")
    mine = [_to_bytes(o) for o in scatter_object_input_list] if pg.rank == root else []
    sizes = np.array([m.size for m in mine] if mine else [0] * pg.size, np.int64)
    broadcast(sizes, pg.ranks[root], group)
    width = int(sizes.max())
    slots = None
    if pg.rank == root:
        slots = [np.zeros(width, np.uint8) for _ in range(pg.size)]
        for slot, m in zip(slots, mine):
            slot[:m.size] = m
    received = np.empty(width, np.uint8)
    scatter(received, slots, pg.ranks[root], group)
    scatter_object_output_list[0] = _from_bytes(received[:sizes[pg.rank]])
