"""Point-to-point: send, recv, isend, irecv, batch_isend_irecv, P2POp.

Straight onto the group's transport with the group's user-tag namespace (``p2p_tag``), so
user messages never meet collective traffic. ``src``/``dst`` are global ranks, as in torch
(``group_src``/``group_dst`` are group ranks). ``recv(src=None)`` receives from any rank and
returns the sender's global rank. Before posting, the group's queued async collectives are
drained, so a transport is never driven from two threads for one group at once.
"""
from __future__ import annotations

from . import state, tensors, work as _work
from .transports.base import ANY_SOURCE, finish


def _peer(pg, rank, group_rank, operation, name, allow_any=False):
    if allow_any and rank is None and group_rank is None:
        return ANY_SOURCE
    if rank is None and group_rank is None:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} is required")
    peer = state.group_rank(pg, rank, group_rank, operation, name)
    if peer == pg.rank:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} must not be this rank itself")
    return peer


def _post(kind, tensor, rank, group, tag, group_rank):
    operation = "send" if kind == "send" else "recv"
    pg = state.resolve(group, operation)
    if pg is None:
        return None, None, None
    peer = _peer(pg, rank, group_rank, operation, "dst" if kind == "send" else "src",
                 allow_any=kind == "recv")
    buf = tensors.flat(tensor, operation, pg.rank)
    if kind == "recv" and not tensors.writeable(buf):
        raise ValueError(f"recv on rank {pg.rank}: the tensor is read-only")
    wire_tag = pg.p2p_tag(tag, operation)
    _work.drain(pg)
    post = pg.transport.isend if kind == "send" else pg.transport.irecv
    return pg, post(buf, peer, wire_tag), peer


def _source(pg, request, peer):
    source = getattr(request, "source", None) if peer == ANY_SOURCE else peer
    return None if source is None or source < 0 else pg.ranks[source]


def _finish(pg, request, tensor) -> None:
    """Complete a blocking send/recv inside the transport's call scope (nccl: on the stream
    the caller's tensor is ordered on, as the collectives do)."""
    scope = pg.transport.call_scope([tensor])
    if scope is None:
        finish(pg.transport, [request], pg.timeout)
        return
    with scope():
        finish(pg.transport, [request], pg.timeout)


def send(tensor, dst=None, group=None, tag=0, group_dst=None) -> None:
    """Send ``tensor`` to ``dst``; returns once the tensor may be reused.

    Args:
        tensor (Tensor or array): the data.
        dst (int): the receiver's global rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        tag (int, optional): matches this send with a recv of the same tag.
        group_dst (int, optional): the receiver's group rank, instead of ``dst``.

    Returns:
        None.
    """
    pg, request, _ = _post("send", tensor, dst, group, tag, group_dst)
    if pg is not None:
        _finish(pg, request, tensor)


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor`` from ``src``, or from any rank when ``src`` is None.

    Args:
        tensor (Tensor or array): the output.
        src (int, optional): the sender's global rank; None: any rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        tag (int, optional): matches a send of the same tag.
        group_src (int, optional): the sender's group rank, instead of ``src``.

    Returns:
        int: the sender's global rank; -1 on a rank outside ``group``.
    """
    pg, request, peer = _post("recv", tensor, src, group, tag, group_src)
    if pg is None:
        return -1
    _finish(pg, request, tensor)
    return _source(pg, request, peer)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to ``dst`` without waiting.

    Args:
        tensor, dst, group, tag, group_dst: as for send; leave ``tensor`` alone until the Work
            completes.

    Returns:
        Work, or None on a rank outside ``group``.
    """
    pg, request, _ = _post("send", tensor, dst, group, tag, group_dst)
    if pg is None:
        return None
    return _work.Work([tensor], requests=[request], transport=pg.transport)


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor`` without waiting.

    Args:
        tensor, src, group, tag, group_src: as for recv.

    Returns:
        Work, or None on a rank outside ``group``; its ``source_rank`` (also ``_source_rank()``)
            is the sender's global rank once complete.
    """
    pg, request, peer = _post("recv", tensor, src, group, tag, group_src)
    if pg is None:
        return None
    work = _work.Work([tensor], requests=[request], transport=pg.transport)
    work.source_rank = None
    work._source_rank = lambda: work.source_rank

    def record():
        work.source_rank = _source(pg, request, peer)
    work._on_done = record
    return work


class P2POp:
    """One operation of batch_isend_irecv: ``op`` is isend or irecv (ours or torch's)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        name = getattr(op, "__name__", "")
        if name not in ("isend", "irecv"):
            raise ValueError(f"P2POp: op must be isend or irecv, got {op!r}")
        self.op, self.tensor, self.peer, self.group = name, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer

    def __repr__(self):
        return f"P2POp({self.op}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list):
    """Post every operation of the list at once.

    Args:
        p2p_op_list (list[P2POp]): the sends and receives, posted in order.

    Returns:
        list[Work]: one per operation, in order.
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list or \
            not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("batch_isend_irecv: expects a non-empty list of P2POp")
    works = []
    for p in p2p_op_list:
        if p.op == "isend":
            works.append(isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        else:
            works.append(irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
    return works
