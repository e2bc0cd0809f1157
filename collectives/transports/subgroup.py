"""A subgroup as a transport: group ranks translated to the parent's ranks.

new_group uses this when the parent transport has no ``subgroup`` of its own (the local
transport, the socket mesh). It adds no connections and costs one list lookup per message;
messages travel on the parent transport, kept apart from the parent's own traffic and every
other subgroup's by the subgroup's group id in the tag bits above ``GROUP_SHIFT`` (the world
group's tags stay below it). A parent that cannot carry the group id is an error at creation,
never a shared tag space. The library's native collectives span the parent's whole world, so a
wrapped subgroup has none (``native`` is None).
"""
from __future__ import annotations

from .base import ANY_SOURCE, Request, Transport

# Each group's own tags (group.TAG_BITS) sit below this bit; the group id above it.
GROUP_SHIFT = 32


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

    def __init__(self, parent: Transport, ranks, group_id: int):
        ranks = [int(r) for r in ranks]
        if parent.rank not in ranks:
            raise ValueError(f"rank {parent.rank} is not a member of the subgroup {ranks}")
        self.parent = parent
        self.ranks = ranks
        self.rank = ranks.index(parent.rank)
        self.size = len(ranks)
        self.xp = parent.xp
        self.name = parent.name
        self.carries_signatures = parent.carries_signatures
        if parent.max_tag is None:            # no tags: nothing to keep apart by
            self.max_tag, self._base = None, 0
            return
        if group_id < 1 or ((group_id + 1) << GROUP_SHIFT) - 1 > parent.max_tag:
            most = (parent.max_tag + 1 >> GROUP_SHIFT) - 1
            raise ValueError(f"new_group on rank {parent.rank}: group id {group_id} does not fit "
                             f"the {parent.name} transport's tags (at most {max(most, 0)} "
                             f"subgroups can be kept apart)")
        self.max_tag = (1 << GROUP_SHIFT) - 1
        self._base = group_id << GROUP_SHIFT

    def _tag(self, tag):
        if not 0 <= tag <= (self.max_tag if self.max_tag is not None else tag):
            raise ValueError(f"rank {self.rank}: tag {tag} is outside this subgroup's range "
                             f"0..{self.max_tag}")
        return self._base | tag

    def isend(self, buf, peer, tag, **signature):
        self.check_peer(peer, "send")
        return self.parent.isend(buf, self.ranks[peer], self._tag(tag), **signature)

    def irecv(self, buf, peer, tag, **signature):
        if peer == ANY_SOURCE:
            return _Translated(self.parent.irecv(buf, ANY_SOURCE, self._tag(tag), **signature),
                               self, peer)
        self.check_peer(peer, "recv")
        return self.parent.irecv(buf, self.ranks[peer], self._tag(tag), **signature)

    def cancel(self, requests):
        self.parent.cancel([getattr(r, "inner", r) for r in requests])

    def call_scope(self, buffers):
        return self.parent.call_scope(buffers)

    def enqueued(self, buffers):
        return self.parent.enqueued(buffers)

    def wait_all(self, requests, timeout=None):
        self.parent.wait_all([getattr(r, "inner", r) for r in requests], timeout)

    def abort(self, reason: str) -> None:
        abort = getattr(self.parent, "abort", None)
        if abort is not None:
            abort(reason)
