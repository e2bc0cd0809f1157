"""The progress engine: who reads the sockets, waiting, failure.

Exactly one thread at a time reads the sockets, parses frames or changes the selector's
registrations: the holder of the progress token. It sleeps in ``selectors`` (no spinning).
A thread that has to block in ``wait_all`` takes the token if it is free and polls and
dispatches the sockets itself, for every request and every thread (others sleeping on the
condition are woken as their requests complete, or take the token when it is handed back).
The progress thread then stays parked on a condition, out of the selector, so a message
wakes only the waiting caller: one thread wake-up per message instead of two (progress
thread, then the caller it hands over to), which took the 2-rank 4 KiB all_reduce from
~120 to ~45 us on the 2-core VM. It takes the token back when no caller has polled for
CALLER_LEASE (2 ms), at once when a caller hands back with work no one waits for (queued or
blocked sends, posted receives, a half-read frame), and when the transport closes; so async
requests complete and a dead peer is noticed with nobody in ``wait_all``. A caller that finds
the progress thread inside the selector sleeps on the condition as before, and the thread
yields after that poll. COLLECTIVES_SOCKET_CALLER_PROGRESS=0 leaves all reading to the
progress thread.

Faults: a connection that drops without a goodbye fails the whole transport: every pending
and later wait raises TransportError naming that rank, and this rank forwards an abort frame
so the others learn within milliseconds even if they never saw the drop. ``wait_all`` raises
CollectiveTimeout naming the rank, peer and tag.

A mixin of ``SocketTransport``, which creates the state it uses (``_lock``, ``_cond``,
``_token``, ``_selector``, the wake pipe, ...); reading is ``inbound.py``, writing
``outbound.py``.
"""
from __future__ import annotations

import logging
import selectors
import threading
import time

from ...errors import CollectiveError, CollectiveTimeout, TransportError
from .inbound import ANY_SOURCE, Recv
from .wire import ABORT, MAX_ABORT_REASON, NO_SIGNATURE, HEADER

log = logging.getLogger("collectives.transports.socket")

# The progress thread stays parked until no caller has read the sockets for this long
# (back-to-back collectives come far sooner; it bounds how long async work waits with nobody
# in wait_all).
CALLER_LEASE = 0.002
_DONE = object()


def _who(req):
    return "any" if req.peer == ANY_SOURCE else req.peer


class Engine:
    # -- waking ----------------------------------------------------------------------------

    def _wake(self):
        """Make whoever holds the token look at the sockets' registrations again (a send is
        blocked): a byte in the wake pipe, and a parked progress thread starts polling."""
        self._ring_wake_pipe()
        if self._caller_progress:
            with self._lock:
                self._kicked = True
                if self._engine_parked:
                    self._engine_cond.notify()

    def _ring_wake_pipe(self):
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass

    def _notify(self):
        """Requests changed (caller holds _cond): wake the sleepers, and a caller polling the
        sockets in another thread, which cannot hear the condition."""
        self._cond.notify_all()
        poller = self._poller
        if poller is not None and poller != threading.get_ident():
            self._ring_wake_pipe()

    # -- waiting ---------------------------------------------------------------------------

    def _test(self, req):
        with self._lock:
            if req.error is not None:
                raise req.error
            if not req.done and self._failure is not None:
                raise TransportError(f"rank {self.rank}: {self._failure}")
            return req.done

    def wait_all(self, requests, timeout=None):
        """Complete ``requests``. A caller that has to block takes the progress token if it is
        free and reads the sockets itself (one thread wake-up less per message than sleeping
        while the progress thread reads and then hands over); otherwise it sleeps on the
        condition until its requests complete or the token comes free."""
        requests = list(requests)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._waiting += 1
            try:
                while True:
                    left = self._outstanding(requests, timeout, deadline)
                    if left is _DONE:
                        return
                    if self._caller_progress:
                        self._caller_at = time.monotonic()
                        self._kicked = False
                        if self._token.acquire(blocking=False):
                            self._poller = threading.get_ident()
                            break
                    self._cond.wait(left)
            finally:
                self._waiting -= 1
        try:
            while True:
                if left is None or left >= 1.0:
                    self._poll_once(1.0)
                elif left >= 0.001:
                    # epoll rounds up to whole milliseconds: round down instead, so a timeout
                    # is raised on time, not up to a millisecond late
                    self._poll_once(int(left * 1000) / 1000)
                else:
                    time.sleep(max(left, 0.0))
                    self._poll_once(0)
                with self._lock:
                    left = self._outstanding(requests, timeout, deadline)
                    if left is _DONE:
                        return
        except CollectiveError:
            raise
        except Exception as exc:       # a bug while dispatching must fail the transport, too
            log.exception("socket transport rank %d: reading the sockets crashed", self.rank)
            self._fail(None, f"the caller's progress crashed: {exc!r}")
            raise TransportError(f"rank {self.rank}: {self._failure}") from exc
        finally:
            self._hand_back()

    def _hand_back(self):
        """Release the token after a caller's wait: the progress thread stays parked for
        CALLER_LEASE (the next wait_all is usually that close), unless work is left that no
        caller waits for; sleepers on the condition get their turn to take the token."""
        pending = bool(self._posted) or any(p.busy() for p in self._peers.values())
        with self._lock:
            self._poller = None
            self._token.release()
            self._caller_at = time.monotonic()
            if pending or self._writers or self._closing:
                self._kicked = True
                if self._engine_parked:
                    self._engine_cond.notify()
            if self._waiting:
                self._cond.notify_all()

    def _outstanding(self, requests, timeout, deadline):
        """_DONE when every request is complete, else the seconds left (None: no deadline);
        raises a request's error, the transport's failure, or the timeout. Caller holds
        _cond."""
        pending = None
        for req in requests:
            if req.error is not None:
                raise req.error
            if not req.done and pending is None:
                pending = req
        if pending is None:
            return _DONE
        if self._failure is not None:
            raise TransportError(f"rank {self.rank}: {pending.kind} with rank "
                                 f"{_who(pending)} (tag {pending.tag}) cannot complete: "
                                 f"{self._failure}")
        closed = self._closed_peer_blocking(pending)
        if closed is not None:
            raise TransportError(f"rank {self.rank}: {pending.kind} with rank {closed} "
                                 f"(tag {pending.tag}) cannot complete: rank {closed} "
                                 f"has closed its transport")
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:        # every request stays pending (cancel())
            stuck = [r for r in requests if not r.done]
            more = f" and {len(stuck) - 1} more requests" if len(stuck) > 1 else ""
            direction = "from" if pending.kind == "recv" else "to"
            raise CollectiveTimeout(
                f"rank {self.rank}: {pending.kind} {direction} rank {_who(pending)} "
                f"(tag {pending.tag}) did not complete within {timeout:.3g} s{more}")
        return left

    def _closed_peer_blocking(self, req):
        if req.peer in (ANY_SOURCE, self.rank) or req.landing:
            return None
        peer = self._peers.get(req.peer)
        if peer is not None and peer.closed and (req.kind == "recv" or not req.done):
            return req.peer
        return None

    def cancel(self, requests):
        """Withdraw receives not yet matched, so a late message cannot land in a buffer the
        caller has given up on (it is held as unexpected, for a later receive of its tag);
        a later wait on one raises. A receive already landing completes. Sends already
        queued still go out."""
        with self._lock:
            for req in requests:
                if isinstance(req, Recv) and not req.done and not req.landing:
                    posted = self._posted.get(req.tag)
                    if posted and req in posted:
                        posted.remove(req)
                        if not posted:
                            del self._posted[req.tag]
                    req.error = CollectiveError(
                        f"rank {self.rank}: recv from rank {_who(req)} (tag {req.tag}) was "
                        f"cancelled after a timeout or error; it will never complete")

    # -- the progress thread ---------------------------------------------------------------

    def _progress(self):
        try:
            while True:
                self._take_turn()
                try:
                    self._poll_once(1.0)
                finally:
                    with self._lock:
                        self._token.release()
                        if self._waiting:       # a caller asleep may take the token now
                            self._cond.notify_all()
                if self._closing and (self._failure is not None or (
                        not any(p.queue for p in self._peers.values() if not p.closed) and (
                            all(p.closed for p in self._peers.values())
                            or time.monotonic() > self._close_deadline))):
                    # failed (nothing left to flush), or flushed and every peer said goodbye
                    # (or would not in time)
                    return
        except Exception as exc:       # a bug here must not leave waiters hanging
            log.exception("socket transport rank %d: progress thread crashed", self.rank)
            self._fail(None, f"the progress thread crashed: {exc!r}")

    def _take_turn(self):
        """Return holding the token once the sockets are this thread's to read: no caller
        has driven progress for CALLER_LEASE, or work was left that no caller waits for, or
        the transport is closing. Parks on a condition meanwhile (never in the selector, so
        data for a polling caller wakes only that caller)."""
        with self._lock:
            while True:
                idle = time.monotonic() - self._caller_at
                if (not self._caller_progress or self._closing or self._kicked
                        or idle >= CALLER_LEASE) and self._token.acquire(blocking=False):
                    return
                self._engine_parked = True
                self._engine_cond.wait(max(CALLER_LEASE - idle, 0.0) or CALLER_LEASE)
                self._engine_parked = False

    def _poll_once(self, timeout):
        """Wait up to ``timeout`` for socket events and dispatch them; token holder only."""
        events = self._selector.select(timeout=timeout)
        try:
            for key, mask in events:
                peer = key.data
                if peer is None:
                    self._drain_wake()
                    continue
                if mask & selectors.EVENT_READ:
                    self._read(peer)
                if mask & selectors.EVENT_WRITE:
                    self._flush(peer)
        except (KeyboardInterrupt, SystemExit) as exc:
            # a caller's thread was interrupted mid-frame: what is left of the stream can no
            # longer be parsed, so fail loudly rather than misread it later
            self._fail(None, f"interrupted ({type(exc).__name__}) while reading the sockets")
            raise

    def _drain_wake(self):
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        for peer in self._peers.values():
            with peer.send_lock:
                want = peer.blocked
            if want != peer.writing and not (peer.closed and peer.sock.fileno() < 0):
                self._register(peer, want)

    def _register(self, peer, writing):
        self._writers += 1 if writing else -1
        peer.writing = writing
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
        try:
            self._selector.modify(peer.sock, events, peer)
        except (KeyError, ValueError):
            if writing:
                try:
                    self._selector.register(peer.sock, selectors.EVENT_WRITE, peer)
                except (KeyError, ValueError):
                    pass

    # -- failure ---------------------------------------------------------------------------

    def _fail(self, peer_rank, reason, forward=True):
        with self._lock:
            first = self._failure is None
            if first:
                self._failure = reason
            self._notify()
        if peer_rank is not None:
            peer = self._peers.get(peer_rank)
            if peer is not None:
                peer.closed = True     # stop reading it; further EOFs are not news
                try:
                    self._selector.unregister(peer.sock)
                except (KeyError, ValueError, OSError):
                    pass
        if first and forward and not self._closing:
            log.error("socket transport rank %d: %s", self.rank, reason)
            self._broadcast_abort(f"rank {self.rank} saw: {reason}", skip=peer_rank)

    def _broadcast_abort(self, reason, skip=None):
        payload = reason.encode()[:MAX_ABORT_REASON]
        head = HEADER.pack(ABORT, NO_SIGNATURE, 0, len(payload))
        for peer in self._peers.values():
            if peer.rank == skip or peer.closed or peer.broken:
                continue
            if not peer.send_lock.acquire(blocking=False):
                continue               # busy writing: the peer will see our EOF instead
            try:
                if not peer.out:       # never split another frame
                    peer.sock.send(head + payload + peer.auth.seal(head, payload))
            except OSError:
                pass
            finally:
                peer.send_lock.release()
