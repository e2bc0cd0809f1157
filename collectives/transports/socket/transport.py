"""SocketTransport: the bootstrap, the channels and the progress engine put together.

Construction connects the mesh (``bootstrap.py``), negotiates each pair's channels
(``channels.py``), agrees on segmenting, and starts the progress thread (``engine.py``);
``isend`` picks a peer's channel and hands the request to the writer (``outbound.py``);
``irecv`` and matching are ``inbound.py``. ``close`` flushes, says goodbye to every peer
and unmaps the rings; an interpreter that exits cleanly closes every open transport, so
peers do not mistake it for a crash.
"""
from __future__ import annotations

import atexit
import collections
import multiprocessing.util
import selectors
import socket
import threading
import time

import numpy as np

from ... import settings
from ...errors import TransportError
from ..base import Transport
from . import bootstrap, channels
from .engine import Engine
from .inbound import Inbound, Recv, byte_view
from .outbound import Outbound
from .wire import GOODBYE, MAX_MESSAGE, NO_SIGNATURE

# Messages of at least twice this many bytes are cut into segments by the host executor, so
# reductions overlap the arrival of later segments (0: never cut). Over TCP the overlap pays;
# between ranks of one host (shared memory, direct reads) a message arrives in one copy, so
# cutting it only adds per-segment costs: a job whose every pair shares a host does not cut
# unless $COLLECTIVES_SOCKET_SEGMENT says so.
SEGMENT_BYTES = settings.SOCKET_SEGMENT()
SEGMENT_SET = settings.SOCKET_SEGMENT.is_set()


class SocketTransport(Inbound, Outbound, Engine, Transport):
    name = "socket"
    xp = np
    carries_signatures = True
    segment_bytes = SEGMENT_BYTES or None    # read by executors/host.py

    def __init__(self, rank, world_size, store, timeout=1800.0):
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"socket transport: world size must be a positive int, got {world_size!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"socket transport: rank {rank!r} is out of range for world size {world_size}")
        if store is None and world_size > 1:
            raise ValueError(f"socket transport on rank {rank}: a store is needed to exchange addresses")
        self.rank, self.size, self.timeout = rank, world_size, float(timeout)
        # Blocks take ``with self._lock`` (a C-level enter), never ``with self._cond``: a
        # KeyboardInterrupt inside Condition.__enter__, after the lock is taken, would leave it
        # held for good. The conditions share the lock, so their wait and notify work there.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        # The progress token: only its holder reads sockets, parses frames or changes the
        # selector's registrations. The progress thread takes it when no caller wants it.
        self._token = threading.Lock()
        self._caller_progress = settings.SOCKET_CALLER_PROGRESS()
        self._engine_cond = threading.Condition(self._lock)   # the parked progress thread
        self._engine_parked = False
        self._caller_at = 0.0         # when a caller last drove (or wanted to drive) progress
        self._kicked = False          # work is left that no caller waits for: engine, poll
        self._poller = None           # thread id of the caller holding the token, if any
        self._waiting = 0             # callers asleep on _cond, not holding the token
        self._writers = 0             # peers registered for EVENT_WRITE
        self._posted: dict[int, list[Recv]] = collections.defaultdict(list)
        self._unexpected: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._failure: str | None = None
        self._closing = False
        self._close_deadline = 0.0
        self._peers: dict[int, channels.Peer] = {}
        self.refused: list[str] = []      # connections refused during setup, for diagnosis
        self.shm_peers: list[int] = []    # peers reached through shared memory
        self.cma_peers: list[int] = []    # peers whose sends we read directly (cma.py)
        self._shm_min = max(1, settings.SOCKET_SHM_MIN())
        if world_size > 1:
            self._connect_mesh(store)
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        for peer in self._peers.values():
            peer.sock.setblocking(False)
            self._selector.register(peer.sock, selectors.EVENT_READ, peer)
        self._engine = threading.Thread(target=self._progress, daemon=True,
                                         name=f"collectives-socket-rank{rank}")
        self._engine.start()
        _OPEN.add(self)

    def _connect_mesh(self, store):
        socks, ns, deadline = bootstrap.connect(self.rank, self.size, store, self.timeout,
                                                self.refused)
        for peer in sorted(socks):
            self._peers[peer] = channels.Peer(peer, *socks[peer])
        self.shm_peers, self.cma_peers = channels.negotiate(
            self.rank, [self._peers[r] for r in sorted(self._peers)], deadline)
        self._choose_segments(store, ns)

    def _choose_segments(self, store, ns):
        """Whole messages when every pair of the job is on shared memory, segments otherwise.
        Segmenting must be the same on every rank (both ends cut a message alike), and each
        rank knows only its own pairs, so each publishes how many of its peers share its host
        and all read every count (a bounded store wait)."""
        store.set(f"{ns}/same_host/{self.rank}", str(len(self.shm_peers)))
        counts = [int(bootstrap.store_get(store, f"{ns}/same_host/{r}", self.timeout))
                  for r in range(self.size)]
        if not SEGMENT_SET and all(c == self.size - 1 for c in counts):
            self.segment_bytes = None

    def isend(self, buf, peer, tag, signature=NO_SIGNATURE):
        self.check_peer(peer, "send")
        view = byte_view(buf, "send", self.rank, writable=False)
        if view.nbytes > MAX_MESSAGE:
            raise ValueError(f"send on rank {self.rank}: {view.nbytes} bytes exceed the frame limit "
                             f"{MAX_MESSAGE} (COLLECTIVES_SOCKET_MAX_MESSAGE)")
        if peer == self.rank:
            return self._send_to_self(view, tag, signature)
        target = self._peers[peer]
        return self._submit(target, target.send_request(self, tag, view, signature, self._shm_min))

    def abort(self, reason: str) -> None:
        """Fail this rank's transport and tell every peer (they raise TransportError)."""
        self._fail(None, f"rank {self.rank} aborted: {reason}", forward=False)
        self._broadcast_abort(f"{reason}")

    def close(self, timeout: float = 10.0) -> None:
        """Flush queued sends, say goodbye to every peer, stop the thread, close sockets."""
        if self._closing:
            return
        _OPEN.discard(self)
        self._release()
        for peer in self._peers.values():
            if not peer.closed and self._failure is None:
                try:
                    self._submit(peer, channels.frame_request(self, peer, GOODBYE, 0,
                                                              memoryview(b"")))
                except TransportError:
                    pass
        # Wait briefly for the peers' goodbyes too: closing a socket with unread data resets
        # the connection, which could cost a peer the goodbye we just sent.
        self._close_deadline = time.monotonic() + min(timeout, 1.0)
        self._closing = True
        self._wake()
        self._engine.join(timeout)
        stopped = not self._engine.is_alive()
        for peer in self._peers.values():
            try:
                peer.sock.close()
            except OSError:
                pass
            for ring in (peer.shm_out, peer.shm_in):
                if ring is not None:
                    ring.unlink()
                    if stopped:            # else the thread may still copy: leave it mapped
                        ring.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()


_OPEN: "set[SocketTransport]" = set()


def _close_all_at_exit():
    # A clean interpreter exit says goodbye, so peers do not mistake it for a crash.
    for transport in list(_OPEN):
        try:
            transport.close(timeout=5.0)
        except Exception:
            pass


atexit.register(_close_all_at_exit)
# multiprocessing children leave through os._exit, skipping atexit; they run these finalizers.
multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)
