"""The local transport: every rank is a thread of one process.

Sends are eager: the data is copied into the receiver's mailbox at once, so a send never
blocks and the sender may reuse its buffer when ``isend`` returns. A receive waits for the
first message from (peer, tag). ``LocalWorld.abort`` wakes every waiter with an error, so a
failing rank never leaves the others hanging. Messages carry the call's signature
(``collectives.signature``): a collective's message taken by a receive of another call fails
that receive and aborts the world, so every rank learns of the mismatched calls.
"""
from __future__ import annotations

import collections
import threading
import time

import numpy as np

from ..errors import CollectiveError, CollectiveTimeout, TransportError
from ..signature import NONE as NO_SIGNATURE, mismatch
from .base import ANY_SOURCE, Request, Transport


class LocalWorld:
    """Shared state of one in-process job: mailboxes keyed by (src, dst, tag)."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"world size must be >= 1, got {size}")
        self.size = size
        self._mail: dict[tuple, collections.deque] = collections.defaultdict(collections.deque)
        self._cond = threading.Condition()
        self._failure: str | None = None

    def transport(self, rank: int) -> "LocalTransport":
        return LocalTransport(self, rank)

    def abort(self, reason: str) -> None:
        with self._cond:
            if self._failure is None:
                self._failure = reason
            self._cond.notify_all()

    def _post(self, src, dst, tag, payload):
        with self._cond:
            self._mail[(src, dst, tag)].append(payload)
            self._cond.notify_all()

    def _take(self, src, dst, tag):
        """Pop the oldest matching message, or None. Caller holds the lock."""
        if src != ANY_SOURCE:
            box = self._mail.get((src, dst, tag))
            return (src, box.popleft()) if box else None
        for (s, d, t), box in self._mail.items():
            if d == dst and t == tag and box:
                return s, box.popleft()
        return None


class _Done(Request):
    kind = "send"

    def __init__(self, peer):
        self.peer = peer

    def test(self):
        return True

    def wait(self, timeout=None):
        pass


class _Receive(Request):
    kind = "recv"

    def __init__(self, transport, buf, peer, tag, signature):
        self.transport, self.buf, self.peer, self.tag = transport, buf, peer, tag
        self.signature = signature
        self.source = None if peer == ANY_SOURCE else peer
        self.done = False

    def _complete(self, source, message):
        signature, payload = message
        self.source = source
        dst = self.buf.reshape(-1).view(np.uint8)
        if signature != self.signature:
            error = mismatch(self.transport.rank, source, self.tag, self.signature, signature)
            if NO_SIGNATURE not in (signature, self.signature):
                self.transport.world.abort(str(error))
            raise error
        if payload.nbytes != dst.nbytes:
            raise CollectiveError(
                f"rank {self.transport.rank}: message from rank {source} (tag {self.tag}) has "
                f"{payload.nbytes} bytes but the receive expects {dst.nbytes}: the ranks called "
                f"mismatched operations or sizes")
        dst[...] = payload
        self.done = True

    def test(self):
        if self.done:
            return True
        world = self.transport.world
        with world._cond:
            got = world._take(self.peer, self.transport.rank, self.tag)
        if got is not None:
            self._complete(*got)
        return self.done

    def wait(self, timeout=None):
        if self.done:
            return
        world = self.transport.world
        deadline = None if timeout is None else time.monotonic() + timeout
        with world._cond:
            while True:
                if world._failure is not None:
                    raise TransportError(f"rank {self.transport.rank}: job aborted while "
                                         f"waiting for rank {self.peer}: {world._failure}")
                got = world._take(self.peer, self.transport.rank, self.tag)
                if got is not None:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    who = "any rank" if self.peer == ANY_SOURCE else f"rank {self.peer}"
                    raise CollectiveTimeout(f"rank {self.transport.rank}: nothing arrived from "
                                            f"{who} (tag {self.tag}) within {timeout:.3g} s")
                world._cond.wait(left)
        self._complete(*got)


class LocalTransport(Transport):
    name = "local"
    xp = np
    carries_signatures = True

    def __init__(self, world: LocalWorld, rank: int):
        if not 0 <= rank < world.size:
            raise ValueError(f"rank {rank} is out of range for world size {world.size}")
        self.world, self.rank, self.size = world, rank, world.size

    def isend(self, buf, peer, tag, signature=NO_SIGNATURE):
        self.check_peer(peer, "send")
        payload = np.array(buf, copy=True).reshape(-1).view(np.uint8)
        self.world._post(self.rank, peer, tag, (signature, payload))
        return _Done(peer)

    def irecv(self, buf, peer, tag, signature=NO_SIGNATURE):
        if peer != ANY_SOURCE:
            self.check_peer(peer, "recv")
        return _Receive(self, buf, peer, tag, signature)

    def abort(self, reason: str) -> None:
        self.world.abort(f"rank {self.rank}: {reason}")
