"""A subgroup as a transport: group ranks translated to the parent's ranks.

new_group uses this when the parent transport has no ``subgroup`` of its own (the local
transport, the socket mesh). It adds no connections and costs one list lookup per message;
messages travel on the parent transport, kept apart from the parent's own traffic by the
subgroup's group id in every tag. The library's native collectives span the parent's whole
world, so a wrapped subgroup has none (``native`` is None).
"""
from __future__ import annotations

from .base import Request, Transport

ANY_SOURCE = -1


class _Translated(Request):
    """A parent request whose ``source`` (any-source receives) reads as a group rank."""

    def __init__(self, inner, group: "SubgroupTransport", peer: int):
        self.inner, self.group = inner, group
        self.peer, self.kind = peer, getattr(inner, "kind", "recv")

    @property
    def source(self):
        parent_source = getattr(self.inner, "source", None)
        if parent_source is None or parent_source == ANY_SOURCE:
            return None
        return self.group.ranks.index(parent_source)

    def test(self):
        return self.inner.test()

    def wait(self, timeout=None):
        self.inner.wait(timeout)


class SubgroupTransport(Transport):
    native = None

    def __init__(self, parent: Transport, ranks):
        ranks = [int(r) for r in ranks]
        if parent.rank not in ranks:
            raise ValueError(f"rank {parent.rank} is not a member of the subgroup {ranks}")
        self.parent = parent
        self.ranks = ranks
        self.rank = ranks.index(parent.rank)
        self.size = len(ranks)
        self.xp = parent.xp
        self.name = parent.name

    def isend(self, buf, peer, tag):
        self.check_peer(peer, "send")
        return self.parent.isend(buf, self.ranks[peer], tag)

    def irecv(self, buf, peer, tag):
        if peer == ANY_SOURCE:
            return _Translated(self.parent.irecv(buf, ANY_SOURCE, tag), self, peer)
        self.check_peer(peer, "recv")
        return self.parent.irecv(buf, self.ranks[peer], tag)

    def call_scope(self, buffers):
        return self.parent.call_scope(buffers)

    def wait_all(self, requests, timeout=None):
        self.parent.wait_all([getattr(r, "inner", r) for r in requests], timeout)

    def abort(self, reason: str) -> None:
        abort = getattr(self.parent, "abort", None)
        if abort is not None:
            abort(reason)
