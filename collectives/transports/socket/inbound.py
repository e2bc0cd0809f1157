"""The reader: frames parsed from each connection, payloads matched to receives.

The progress engine's token holder reads every socket. A payload whose receive was posted
first lands straight in the posted buffer (``recv_into``, no copy); otherwise it goes to an
unexpected-message queue and is copied once when the receive is posted. Small frames are read
many at a time through a per-peer staging buffer. Messages between a pair with one tag arrive
in order; ``irecv(peer=-1)`` takes the first message of that tag from any rank and sets
``request.source``. A message of another call (its signature) or size fails the receive, and
when it belongs to a collective the whole transport, so every rank learns of the mismatch.
Shared-memory and direct-read frames are checked against the ring's state before anything is
read: a malformed frame fails the transport naming the peer, and nothing outside the ring is
ever read or written. Every frame's tag (``auth.FrameAuth``) is checked before the frame is
acted on: a control frame is read whole with its tag first; a payload lands before its tag
arrives, and its receive completes only once the tag, checked over the header and the landed
payload at once, holds; a tag that fails fails the transport.

A mixin of ``SocketTransport``: it uses the transport's ``_lock``, ``_cond``, ``_posted``,
``_unexpected``, ``_fail``, ``_notify`` and ``_flush``.
"""
from __future__ import annotations

import numpy as np

from ...errors import CollectiveError
from ...signature import mismatch
from ..base import ANY_SOURCE, Request
from . import cma
from .channels import STAGE_BYTES, Send
from .wire import (ABORT, ADDRESS, CMA_ACK, CMA_MSG, CONTROL_KINDS, DATA, GOODBYE, HEADER,
                   MAX_ABORT_REASON, MAX_CONTROL, MAX_MESSAGE, NO_SIGNATURE, SHM_CREDIT,
                   SHM_KINDS, SHM_MSG, TAG, unauthentic)


class Recv(Request):
    kind = "recv"

    def __init__(self, transport, view, peer, tag, signature=NO_SIGNATURE):
        self.transport, self.view, self.peer, self.tag = transport, view, peer, tag
        self.signature = signature
        self.source = None if peer == ANY_SOURCE else peer
        self.done = False
        self.error = None
        self.landing = False          # the token holder is writing into view

    def test(self):
        return self.transport._test(self)

    def wait(self, timeout=None):
        self.transport.wait_all([self], timeout)


class Unexpected:
    """A message that arrived before its receive: held in its own bytes until matched."""
    __slots__ = ("source", "tag", "data", "done", "waiter", "signature")

    def __init__(self, source, tag, data, signature):
        self.source, self.tag, self.data, self.signature = source, tag, data, signature
        self.done = False
        self.waiter = None


def byte_view(buf, operation, rank, writable):
    """A flat uint8 view of ``buf`` without copying; refuse what would need a copy."""
    arr = np.asarray(buf)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{operation} on rank {rank}: the buffer must be contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{operation} on rank {rank}: the receive buffer is read-only")
    return arr.reshape(-1).view(np.uint8)


class Inbound:
    # -- posting and matching --------------------------------------------------------------

    def irecv(self, buf, peer, tag, signature=NO_SIGNATURE):
        if peer != ANY_SOURCE:
            self.check_peer(peer, "recv")
        view = byte_view(buf, "recv", self.rank, writable=True)
        req = Recv(self, view, peer, tag, signature)
        with self._lock:
            entry = self._take_unexpected(peer, tag)
            if entry is None:
                self._posted[tag].append(req)
                return req
            req.source = entry.source
            if not entry.done:
                entry.waiter = req        # the token holder copies it when it lands
                req.landing = True
                return req
        self._fill_from(req, entry)
        return req

    def _take_unexpected(self, peer, tag):
        box = self._unexpected.get(tag)
        if not box:
            return None
        for i, entry in enumerate(box):
            if peer == ANY_SOURCE or entry.source == peer:
                del box[i]
                if not box:            # tags are per call: an empty entry per call would leak
                    del self._unexpected[tag]
                return entry
        return None

    def _fill_from(self, req, entry):
        """Copy a held message into its receive; called without the lock. A message of
        another call (signature) or size fails the receive; when it belongs to a collective
        it also fails the transport, so every rank of the job learns of the mismatched calls,
        not only the ranks that receive from the odd one out."""
        if entry.signature != req.signature:
            error = mismatch(self.rank, entry.source, req.tag, req.signature, entry.signature)
        elif len(entry.data) != req.view.nbytes:
            error = CollectiveError(
                f"rank {self.rank}: message from rank {entry.source} (tag {req.tag}) has "
                f"{len(entry.data)} bytes but the receive expects {req.view.nbytes}: the ranks "
                f"called mismatched operations or sizes")
        else:
            req.view[...] = np.frombuffer(entry.data, np.uint8)
            error = None
        with self._lock:
            req.error, req.done, req.landing = error, True, False
            self._notify()
        if error is not None and NO_SIGNATURE not in (req.signature, entry.signature):
            self._fail(None, str(error))

    def _send_to_self(self, view, tag, signature):
        req = Send(self, self.rank, tag, [], signature)
        data = bytearray(view)
        with self._lock:
            target = self._match_posted(self.rank, tag)
            if target is None:
                entry = Unexpected(self.rank, tag, data, signature)
                entry.done = True
                self._unexpected[tag].append(entry)
        if target is not None:
            target.source = self.rank         # an any-source receive learns its sender
            entry = Unexpected(self.rank, tag, data, signature)
            self._fill_from(target, entry)
        req.done = True
        return req

    def _match_posted(self, source, tag):
        posted = self._posted.get(tag)
        if posted:
            for i, req in enumerate(posted):
                if req.peer == source or req.peer == ANY_SOURCE:
                    del posted[i]
                    if not posted:
                        del self._posted[tag]
                    return req
        return None

    def _landed(self, req):
        with self._lock:
            req.done, req.landing = True, False
            self._notify()

    def _held(self, entry):
        with self._lock:
            entry.done = True
            waiter = entry.waiter
        if waiter is not None:
            self._fill_from(waiter, entry)

    # -- reading (token holder only) -------------------------------------------------------

    def _read(self, peer):
        sock = peer.sock
        try:
            while True:
                if peer.target is not None:
                    want = peer.target.nbytes - peer.filled
                    n = sock.recv_into(peer.target[peer.filled:])
                    if n == 0:
                        return self._eof(peer)
                    peer.filled += n
                    if peer.filled == peer.target.nbytes:       # its tag comes next
                        peer.sealed = peer.head, peer.target, peer.on_filled
                        peer.target, peer.filled = None, 0
                    elif n < want:
                        return         # drained: the selector says when more arrives
                    continue
                if peer.start == peer.end:
                    peer.start = peer.end = 0
                elif STAGE_BYTES - peer.end < MAX_CONTROL:
                    left = peer.end - peer.start
                    peer.stage[:left] = peer.stage[peer.start:peer.end]
                    peer.start, peer.end = 0, left
                want = STAGE_BYTES - peer.end
                n = sock.recv_into(peer.stage_view[peer.end:])
                if n == 0:
                    return self._eof(peer)
                peer.end += n
                if not self._parse(peer) or n < want:
                    return             # a short read drained the socket (level-triggered)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(peer.rank, f"connection to rank {peer.rank} broke: {exc}")

    def _parse(self, peer) -> bool:
        """Consume whole frames from the staging buffer; False once the peer is unusable."""
        stage = peer.stage_view
        while True:
            start, avail = peer.start, peer.end - peer.start
            if peer.sealed is not None:            # a payload is in: its tag closes the frame
                if avail < TAG:
                    return True
                (head, body, on_filled), peer.sealed = peer.sealed, None
                peer.start += TAG
                if not peer.auth.authentic(head, body, stage[start:start + TAG]):
                    return self._unauthentic(peer)
                on_filled()
                continue
            if avail < HEADER.size:
                return True
            kind, signature, tag, nbytes = HEADER.unpack_from(peer.stage, start)
            if kind in CONTROL_KINDS:
                size = HEADER.size + (ADDRESS.size if kind == CMA_MSG else 0)
                if avail < size + TAG:
                    return True            # the rest of the frame is still on its way
                if not peer.auth.authentic(stage[start:start + size], None,
                                           stage[start + size:start + size + TAG]):
                    return self._unauthentic(peer)
                peer.start += size + TAG
                if kind == GOODBYE:
                    self._goodbye(peer)
                    return False
                if kind in SHM_KINDS:
                    ok = self._on_shm_frame(peer, kind, tag, nbytes, signature)
                else:
                    where = ADDRESS.unpack_from(peer.stage, start + HEADER.size)[0] \
                        if kind == CMA_MSG else 0
                    ok = self._on_cma_frame(peer, kind, tag, nbytes, signature, where)
                if not ok:
                    return False
                continue
            if kind not in (DATA, ABORT) or nbytes > MAX_MESSAGE or (
                    kind == ABORT and nbytes > MAX_ABORT_REASON) or (
                    kind == DATA and peer.shm_msg is not None):
                self._fail(peer.rank, f"rank {peer.rank} sent a malformed frame (kind {kind}, "
                                      f"{nbytes} bytes)")
                return False
            head = bytes(stage[start:start + HEADER.size])
            peer.start += HEADER.size
            target, on_filled = self._land(peer, kind, tag, nbytes, signature)
            take = min(peer.end - peer.start, nbytes)
            if take:
                target[:take] = stage[peer.start:peer.start + take]
                peer.start += take
            if take == nbytes:
                peer.sealed = head, target, on_filled
                continue
            peer.target, peer.filled, peer.on_filled, peer.head = target, take, on_filled, head
            return True

    def _unauthentic(self, peer) -> bool:
        self._fail(peer.rank, unauthentic(peer.rank))
        return False

    def _land(self, peer, kind, tag, nbytes, signature):
        """Where the payload of a new frame goes, and what to do once it is in."""
        if kind == ABORT:
            data = bytearray(nbytes)
            return memoryview(data), lambda: self._fail(
                None, f"rank {peer.rank} aborted the job: {data.decode(errors='replace')}",
                forward=False)
        with self._lock:
            req = self._match_posted(peer.rank, tag)
            if req is not None:
                req.source, req.landing = peer.rank, True
            else:
                entry = Unexpected(peer.rank, tag, bytearray(nbytes), signature)
                self._unexpected[tag].append(entry)
        if req is not None and req.view.nbytes == nbytes and req.signature == signature:
            return req.view, lambda: self._landed(req)
        if req is not None:            # another call's message: drain it, fail the receive
            entry = Unexpected(peer.rank, tag, bytearray(nbytes), signature)
            return memoryview(entry.data), lambda: self._fill_from(req, entry)
        return memoryview(entry.data), lambda: self._held(entry)

    def _on_shm_frame(self, peer, kind, a, n, signature) -> bool:
        """Handle an announcement, a chunk or a credit; False (and the transport failed,
        naming the peer) when it does not fit the ring's state."""
        if kind == SHM_CREDIT:
            ring = peer.shm_out
            if ring is None or not 0 < n <= ring.head - ring.tail:
                outstanding = 0 if ring is None else ring.head - ring.tail
                return self._malformed(peer, f"credit of {n} bytes with {outstanding} "
                                             f"outstanding")
            ring.tail += n
            self._flush(peer)
            return True
        ring = peer.shm_in
        if ring is None:
            return self._malformed(peer, f"kind {kind} without a shared-memory channel")
        if kind == SHM_MSG:
            if peer.shm_msg is not None or not 0 < n <= MAX_MESSAGE:
                return self._malformed(peer, f"announcement of {n} bytes (tag {a})")
            target, on_filled = self._land(peer, DATA, a, n, signature)
            if not isinstance(target, np.ndarray):
                target = np.frombuffer(target, np.uint8)
            peer.shm_msg = [target, 0, on_filled]
            return True
        msg, pos = peer.shm_msg, ring.head % ring.capacity
        if msg is None or a != pos or not 0 < n <= ring.capacity - pos or (
                msg[1] + n > msg[0].nbytes):
            return self._malformed(peer, f"chunk at offset {a} of {n} bytes (expected offset "
                                         f"{pos} of a {ring.capacity}-byte ring)")
        target, filled = msg[0], msg[1]
        target[filled:filled + n] = ring.ring[pos:pos + n]
        ring.head += n
        msg[1] = filled + n
        with peer.send_lock:
            peer.credit_owed += n
        self._flush(peer)
        if msg[1] == target.nbytes:
            peer.shm_msg = None
            msg[2]()
        return True

    def _on_cma_frame(self, peer, kind, tag, n, signature, where) -> bool:
        """Read an announced message straight out of the peer's memory into its receive, then
        owe it an acknowledgement; or complete our acknowledged sends. False (transport
        failed, naming the peer) on a frame that does not fit."""
        if kind == CMA_ACK:
            # under send_lock: the sender's thread moves a send to cma_waiting right after
            # writing its frame, and the acknowledgement may arrive before that returns
            with peer.send_lock:
                outstanding = len(peer.cma_waiting)
                acked = [peer.cma_waiting.popleft() for _ in range(n)] \
                    if 0 < n <= outstanding else None
            if acked is None:
                if self._failure is not None:     # this rank's writer was interrupted
                    return False
                return self._malformed(peer, f"acknowledgement of {n} reads with "
                                             f"{outstanding} outstanding")
            with self._lock:
                for req in acked:
                    req.done = True
                self._notify()
            return True
        if peer.cma_pid is None or peer.shm_msg is not None or not 0 < n <= MAX_MESSAGE:
            return self._malformed(peer, f"direct-read announcement of {n} bytes (tag {tag})")
        target, on_filled = self._land(peer, DATA, tag, n, signature)
        if not isinstance(target, np.ndarray):
            target = np.frombuffer(target, np.uint8)
        try:
            cma.read(peer.cma_pid, where, target)
        except OSError as exc:
            self._fail(peer.rank, f"reading rank {peer.rank}'s message (tag {tag}, {n} bytes) "
                                  f"from its memory failed (it died or was killed?): {exc}")
            return False
        with peer.send_lock:
            peer.acks_owed += 1
        self._flush(peer)
        on_filled()
        return True

    def _malformed(self, peer, what) -> bool:
        self._fail(peer.rank, f"rank {peer.rank} sent a malformed shared-memory frame: {what}")
        return False

    def _goodbye(self, peer):
        with self._lock:
            peer.closed = True
            self._notify()
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass

    def _eof(self, peer):
        if peer.closed:
            return
        self._fail(peer.rank, f"rank {peer.rank} closed its connection without a goodbye "
                              f"(it died or was killed)")
