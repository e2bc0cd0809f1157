"""The socket transport: a full mesh of authenticated TCP connections between processes.

Setup: every rank listens on the interface that routes to the master address (loopback when
the master is local), publishes ``host:port`` in the store, connects to every lower rank and
accepts every higher one; each connection opens with the job-secret handshake
(``collectives.auth``) and is refused and logged if it fails. The key is $COLLECTIVES_SECRET
or, without it, the per-user secret file (``auth.job_secret``); it never travels in the store.

Data path: a frame is a 24-byte header (kind, tag, nbytes) and the payload. Whoever holds the
progress token (below) sleeps in ``selectors`` (no spinning) and reads every socket: a payload
whose receive was posted first lands straight in the posted buffer (``recv_into``, no copy);
otherwise it goes to an unexpected-message queue and is copied once when the receive is
posted. Small frames are read many at a time through a per-peer staging buffer. ``isend``
writes from the caller's thread while the socket takes data (``sendmsg`` of header and
payload, no concatenation) and hands the rest to the token holder, so it never blocks.
Messages between a pair with one tag arrive in order; ``irecv(peer=-1)`` takes the first
message of that tag from any rank and sets ``request.source``.

Same host: at setup each pair exchanges a host identity (boot id, hostname, network namespace,
uid) over its authenticated connection; where they match, each side creates a shared-memory
ring for its direction (``shm.py``, $COLLECTIVES_SOCKET_SHM_BYTES, default 8 MiB), the other
maps it and checks its cookie, and both unlink the name at once. Payloads of at least
$COLLECTIVES_SOCKET_SHM_MIN bytes (default 64 KiB) to such a peer then go through the ring
while TCP carries only control frames: an announcement (tag, nbytes) that is matched exactly
like a TCP message, one (offset, length) frame per chunk written (a quarter of the ring at
most, so writer and reader overlap), and credit frames back as the reader frees space. A
message's chunks are never interleaved with another message to that peer; credits go out at
any frame boundary. The caller's thread copies in while the ring has room and the token holder
does the rest; the reader copies straight into a posted receive (one copy each side).
A failure anywhere in that setup keeps the pair on TCP (logged at INFO), and
COLLECTIVES_SOCKET_SHM=0 turns it off; ``transport.shm_peers`` lists the peers that use it.
Pairs on shared memory then probe cross-memory attach (``cma.py``): each reads a random probe
out of the other's memory with process_vm_readv; if both succeed (and $COLLECTIVES_SOCKET_CMA
is not 0), such payloads are announced by one frame carrying the sender's buffer address,
the receiver's token holder copies them straight into the matched receive (one copy) and
acknowledges, and the send completes on the acknowledgement (``transport.cma_peers``).

Who reads the sockets: exactly one thread at a time, the holder of the progress token. A
thread that has to block in ``wait_all`` takes the token if it is free and polls and
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
so the others learn within milliseconds even if they never saw the drop (TCP keepalive covers
a dead host in about 4 s). ``wait_all`` raises CollectiveTimeout naming the rank, peer and tag.
Frames above ``MAX_MESSAGE`` (4 GiB, $COLLECTIVES_SOCKET_MAX_MESSAGE) are refused.

Cost: one syscall per frame per side plus the waiting thread's wake-up on receipt;
bandwidth near the loopback TCP limit, or about twice that through shared memory on one host
(two memcpys, plus a control round trip per chunk), or one kernel copy plus a round trip per
message with cross-memory attach. Limits: host (numpy) buffers only;
payloads are authenticated at connection time, not per frame, and not encrypted; shared
memory costs $COLLECTIVES_SOCKET_SHM_BYTES per ordered same-host pair (touched lazily).
"""
from __future__ import annotations

import collections
import ipaddress
import logging
import os
import selectors
import socket
import struct
import threading
import time

import numpy as np

from .. import debug, settings
from ..auth import AuthenticationError, client_handshake, job_secret, serve_handshake
from ..errors import CollectiveError, CollectiveTimeout, TransportError
from ..signature import NONE as NO_SIGNATURE, mismatch
from .base import Request, Transport
from . import cma
from .shm import Channel

log = logging.getLogger("collectives.transports.socket")

ANY_SOURCE = -1
HEADER = struct.Struct("<B7sqQ")          # kind, the call's signature, tag, nbytes
DATA, ABORT, GOODBYE = 0, 1, 2
# Shared-memory frames: SHM_SETUP carries the setup handshake (before the progress thread
# starts); SHM_MSG announces a message (tag, nbytes) whose payload comes through the ring;
# SHM_CHUNK (tag field = ring offset, nbytes = length) says a chunk of it is in the ring;
# SHM_CREDIT (nbytes) returns ring space to the writer.
SHM_SETUP, SHM_MSG, SHM_CHUNK, SHM_CREDIT = 3, 4, 5, 6
SHM_KINDS = (SHM_MSG, SHM_CHUNK, SHM_CREDIT)
# Cross-memory attach (cma.py): CMA_MSG (tag, nbytes) is followed by the 8-byte address of the
# sender's buffer, which the receiver reads with process_vm_readv; CMA_ACK (nbytes = how many)
# completes the sender's oldest CMA sends to that peer.
CMA_MSG, CMA_ACK = 7, 8
ADDRESS = struct.Struct("<Q")
MAX_SETUP_FRAME = 4096
MAX_MESSAGE = settings.SOCKET_MAX_MESSAGE()
MAX_ABORT_REASON = 4096
STAGE_BYTES = 256 << 10
SOCKET_BUFFER = settings.SOCKET_BUFFER()   # 0: kernel autotuning
# Messages of at least twice this many bytes are cut into segments by the host executor, so
# reductions overlap the arrival of later segments (0: never cut). Over TCP that measured
# 0.97-1.28x faster; between ranks of one host (shared memory, direct reads) whole messages
# measured 1.1-1.3x faster than 1 MiB segments (4 ranks, 16-64 MiB all_reduce, 2-core VM), so
# a job whose every pair shares a host does not cut unless $COLLECTIVES_SOCKET_SEGMENT says so.
SEGMENT_BYTES = settings.SOCKET_SEGMENT()
SEGMENT_SET = settings.SOCKET_SEGMENT.is_set()
# Caller-driven progress (see "Who reads the sockets" above): the progress thread stays
# parked until no caller has read the sockets for this long (back-to-back collectives come
# far sooner; it bounds how long async work waits with nobody in wait_all).
CALLER_LEASE = 0.002


def available():
    return True, ""


def create(rank, world_size, store=None, timeout=1800.0):
    return SocketTransport(rank, world_size, store, timeout)


def _byte_view(buf, operation, rank, writable):
    """A flat uint8 view of ``buf`` without copying; refuse what would need a copy."""
    arr = np.asarray(buf)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{operation} on rank {rank}: the buffer must be contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{operation} on rank {rank}: the receive buffer is read-only")
    return arr.reshape(-1).view(np.uint8)


class _Send(Request):
    kind = "send"
    shm = False
    cma = False               # done only when the receiver acknowledges its read

    def __init__(self, transport, peer, tag, frames, signature=NO_SIGNATURE):
        self.transport, self.peer, self.tag = transport, peer, tag
        self.signature = signature
        self.frames = frames          # memoryviews still to write
        self.landing = False
        self.done = False
        self.error = None

    def test(self):
        return self.transport._test(self)

    def wait(self, timeout=None):
        self.transport.wait_all([self], timeout)


class _ShmSend(_Send):
    """A send whose payload goes through the peer's shared-memory ring, chunk by chunk."""
    shm = True

    def __init__(self, transport, peer, tag, view, signature):
        super().__init__(transport, peer, tag, [], signature)
        self.view, self.nbytes = view, view.nbytes
        self.announced = False
        self.copied = 0               # bytes already in the ring


class _CmaSend(_Send):
    """A send the receiver reads straight out of ``view`` (cross-memory attach): one frame
    announcing its address, done when the receiver acknowledges the copy."""
    cma = True

    def __init__(self, transport, peer, tag, view, signature):
        header = (HEADER.pack(CMA_MSG, signature, tag, view.nbytes)
                  + ADDRESS.pack(cma.address(view)))
        super().__init__(transport, peer, tag, [memoryview(header)], signature)
        self.view = view              # keeps the buffer alive until the peer has read it


class _Recv(Request):
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


class _Unexpected:
    """A message that arrived before its receive: held in its own bytes until matched."""
    __slots__ = ("source", "tag", "data", "done", "waiter", "signature")

    def __init__(self, source, tag, data, signature):
        self.source, self.tag, self.data, self.signature = source, tag, data, signature
        self.done = False
        self.waiter = None


class _Peer:
    def __init__(self, rank, sock):
        self.rank, self.sock = rank, sock
        self.send_lock = threading.Lock()
        self.queue: collections.deque[_Send] = collections.deque()
        self.writing = False          # registered for EVENT_WRITE
        self.closed = False           # said goodbye: EOF is normal
        self.stage = bytearray(STAGE_BYTES)
        self.stage_view = memoryview(self.stage)
        self.start = self.end = 0
        self.target = None            # view being filled directly
        self.filled = 0
        self.on_filled = None
        # sending, under send_lock: the frame being written, the request it completes, and
        # whether the socket refused bytes (only then is EVENT_WRITE wanted)
        self.out: list[memoryview] = []
        self.out_req = None
        self.blocked = False
        self.credit_owed = 0          # ring bytes freed, not yet reported to the writer
        self.shm_out: Channel | None = None   # the ring we write to this peer
        self.shm_in: Channel | None = None    # the ring this peer writes to us
        self.shm_msg = None           # [destination, bytes filled, on_filled] arriving by ring
        self.cma_pid = None           # the peer's pid when we read its sends directly
        self.cma_waiting: collections.deque = collections.deque()   # our sends it still reads
        self.acks_owed = 0            # its sends we have read, not yet acknowledged


class SocketTransport(Transport):
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
        self._posted: dict[int, list[_Recv]] = collections.defaultdict(list)
        self._unexpected: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._failure: str | None = None
        self._closing = False
        self._close_deadline = 0.0
        self._peers: dict[int, _Peer] = {}
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

    # -- setup -----------------------------------------------------------------------------

    def _connect_mesh(self, store):
        generation = store.add(f"collectives/socket/generation/{self.rank}", 1)
        ns = f"collectives/socket/{generation}"
        # Never a secret handed out through the store: a store need not be authenticated
        # (torch's TCPStore, a user's own), and whoever could read it would join the mesh.
        secret = job_secret()
        context = f"transport|{ns}|{self.size}"
        host = _bind_host(store)
        listener = socket.create_server((host, 0), backlog=max(16, self.size))
        listener.settimeout(0.2)
        accepted: dict[int, socket.socket] = {}
        done = threading.Event()
        expected = set(range(self.rank + 1, self.size))

        def admit(conn, addr):
            try:
                conn.settimeout(5.0)
                who = serve_handshake(conn, secret, context, self.rank)
                if who not in expected:
                    raise AuthenticationError(f"claims rank {who}, which is not expected here")
                with self._lock:
                    if who in accepted:
                        raise AuthenticationError(f"rank {who} is already connected")
                    accepted[who] = conn
                    if len(accepted) == len(expected):
                        done.set()
            except (AuthenticationError, OSError) as exc:
                self.refused.append(f"{addr}: {exc}")
                log.warning("socket transport rank %d refused a connection from %s: %s",
                            self.rank, addr, exc)
                conn.close()

        def accept_loop():
            while not done.is_set():
                try:
                    conn, addr = listener.accept()
                except socket.timeout:
                    continue
                except OSError:
                    return
                threading.Thread(target=admit, args=(conn, addr), daemon=True).start()

        if expected:
            acceptor = threading.Thread(target=accept_loop, daemon=True)
            acceptor.start()
        else:
            done.set()
        store.set(f"{ns}/addr/{self.rank}", f"{host}:{listener.getsockname()[1]}")
        started = time.monotonic()
        deadline = started + self.timeout
        try:
            for peer in range(self.rank):
                addr = self._store_get(store, f"{ns}/addr/{peer}").decode()
                h, p = addr.rsplit(":", 1)
                sock = self._dial(h, int(p), peer, deadline)
                try:
                    who = client_handshake(sock, secret, context, self.rank)
                except (AuthenticationError, OSError) as exc:
                    sock.close()
                    raise TransportError(f"socket transport rank {self.rank}: handshake with rank "
                                         f"{peer} at {addr} failed: {exc}; it also fails where "
                                         f"the ranks disagree on the world size ({self.size} "
                                         f"here) or on how many times they have joined this "
                                         f"store ({generation} here)") from None
                if who != peer:
                    raise TransportError(f"socket transport rank {self.rank}: {addr} answered as "
                                         f"rank {who}, expected {peer}")
                self._peers[peer] = _Peer(peer, sock)
            waiting = debug.Waiting(debug.logger(log.name), self.timeout - (time.monotonic() -
                                                                            started))
            while not done.wait(waiting.step()):
                with self._lock:
                    missing = sorted(expected - set(accepted))
                if waiting.expired():
                    raise CollectiveTimeout(f"socket transport rank {self.rank}: ranks {missing} "
                                            f"did not connect within {self.timeout:.3g} s")
                waiting.report(f"socket transport rank {self.rank}: waiting for ranks "
                               f"{debug.ranks_text(missing)} to connect")
        finally:
            done.set()
            listener.close()
        for peer, sock in accepted.items():
            sock.settimeout(None)
            self._peers[peer] = _Peer(peer, sock)
        for peer in self._peers.values():
            _tune(peer.sock)
        self._setup_shm(deadline)
        self._choose_segments(store, ns)

    def _choose_segments(self, store, ns):
        """Whole messages when every pair of the job is on shared memory, segments otherwise.
        Segmenting must be the same on every rank (both ends cut a message alike), and each
        rank knows only its own pairs, so each publishes how many of its peers share its host
        and all read every count (a bounded store wait)."""
        store.set(f"{ns}/same_host/{self.rank}", str(len(self.shm_peers)))
        counts = [int(self._store_get(store, f"{ns}/same_host/{r}")) for r in range(self.size)]
        if not SEGMENT_SET and all(c == self.size - 1 for c in counts):
            self.segment_bytes = None
    def _setup_shm(self, deadline):
        """Agree with every peer, over the authenticated connections, whether the pair shares a
        host; if so each side creates the ring it writes, the other maps it and checks its
        cookie, and both unlink its name. Runs on blocking sockets before the progress thread:
        every phase sends to all peers (a few hundred bytes, never blocks) and then reads from
        all, so no order of ranks can deadlock. A pair where anything fails stays on TCP."""
        peers = [self._peers[r] for r in sorted(self._peers)]
        identity = _host_identity() if settings.SOCKET_SHM() else b""
        capacity = settings.SOCKET_SHM_BYTES()
        try:
            for peer in peers:
                peer.sock.settimeout(max(1.0, deadline - time.monotonic()))
                _send_setup(peer.sock, identity)
            theirs = {peer.rank: self._recv_setup(peer) for peer in peers}   # always read it
            same = [p for p in peers if identity and theirs[p.rank] == identity]
            for peer in same:
                offer = b""
                try:
                    peer.shm_out = Channel.create(capacity)
                    offer = f"{peer.shm_out.name} {capacity} {peer.shm_out.cookie.hex()}".encode()
                except (OSError, ValueError) as exc:
                    log.info("socket transport rank %d: no shared memory to rank %d, staying on "
                             "TCP: %s", self.rank, peer.rank, exc)
                _send_setup(peer.sock, offer)
            for peer in same:
                offer = self._recv_setup(peer)
                try:
                    if offer:
                        name, size, cookie = offer.decode().split(" ")
                        peer.shm_in = Channel.open(name, bytes.fromhex(cookie), int(size))
                        peer.shm_in.unlink()
                except (OSError, ValueError) as exc:
                    log.info("socket transport rank %d: cannot map rank %d's shared memory, "
                             "staying on TCP: %s", self.rank, peer.rank, exc)
                _send_setup(peer.sock, b"1" if peer.shm_in is not None else b"0")
            for peer in same:
                mapped = self._recv_setup(peer) == b"1"
                if peer.shm_out is not None:
                    peer.shm_out.unlink()
                if mapped and peer.shm_out is not None and peer.shm_in is not None:
                    self.shm_peers.append(peer.rank)
                else:
                    _drop_channels(peer)
            if not identity:
                log.info("socket transport rank %d: shared memory is off "
                         "(COLLECTIVES_SOCKET_SHM=0 or no host identity)", self.rank)
            self._setup_cma([p for p in same if p.rank in self.shm_peers])
        except (OSError, TransportError) as exc:
            for peer in peers:
                _drop_channels(peer)
            if isinstance(exc, TransportError):
                raise
            raise TransportError(f"socket transport rank {self.rank}: the shared-memory "
                                 f"handshake failed: {exc}") from None

    def _setup_cma(self, peers):
        """For pairs already on shared memory: may each read the other's memory? Each side
        offers its pid and the address of a random probe; each reads the other's probe with
        process_vm_readv and reports; the pair uses cross-memory attach only if both reads
        returned the probe (ptrace rights, no seccomp veto). Same phase discipline as above."""
        wanted = bool(peers) and cma.available() and settings.SOCKET_CMA()
        if wanted:
            cma.allow_same_user()
        probe = np.frombuffer(os.urandom(32), np.uint8).copy()
        offer = f"{os.getpid()} {cma.address(probe)} {probe.tobytes().hex()}".encode() \
            if wanted else b""
        for peer in peers:
            _send_setup(peer.sock, offer)
        readable = {}
        for peer in peers:
            theirs = self._recv_setup(peer)
            ok = False
            if wanted and theirs:
                try:
                    pid, where, expect = theirs.decode().split(" ")
                    got = np.empty(32, np.uint8)
                    cma.read(int(pid), int(where), got)
                    ok = got.tobytes() == bytes.fromhex(expect)
                    readable[peer.rank] = int(pid)
                except (OSError, ValueError) as exc:
                    log.info("socket transport rank %d: cannot read rank %d's memory, keeping "
                             "the shared-memory ring: %s", self.rank, peer.rank, exc)
            if not ok:
                readable.pop(peer.rank, None)
            _send_setup(peer.sock, b"1" if ok else b"0")
        for peer in peers:
            both = self._recv_setup(peer) == b"1" and peer.rank in readable
            if both:
                peer.cma_pid = readable[peer.rank]
                self.cma_peers.append(peer.rank)
        del probe

    def _recv_setup(self, peer) -> bytes:
        header = _recv_exact(peer.sock, HEADER.size)
        kind, _, _, nbytes = HEADER.unpack(header)
        if kind != SHM_SETUP or nbytes > MAX_SETUP_FRAME:
            raise TransportError(f"socket transport rank {self.rank}: rank {peer.rank} sent a "
                                 f"malformed setup frame (kind {kind}, {nbytes} bytes)")
        return _recv_exact(peer.sock, nbytes)

    def _store_get(self, store, key):
        old = store._timeout
        store.set_timeout(self.timeout)
        try:
            return store.get(key)
        finally:
            store._timeout = old

    def _dial(self, host, port, peer, deadline):
        pause = 0.01
        while True:
            try:
                sock = socket.create_connection((host, port), timeout=5.0)
                return sock
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise TransportError(f"socket transport rank {self.rank}: cannot reach rank "
                                         f"{peer} at {host}:{port}: {exc}") from None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    # -- posting ---------------------------------------------------------------------------

    def isend(self, buf, peer, tag, signature=NO_SIGNATURE):
        self.check_peer(peer, "send")
        view = _byte_view(buf, "send", self.rank, writable=False)
        if view.nbytes > MAX_MESSAGE:
            raise ValueError(f"send on rank {self.rank}: {view.nbytes} bytes exceed the frame limit "
                             f"{MAX_MESSAGE} (COLLECTIVES_SOCKET_MAX_MESSAGE)")
        if peer == self.rank:
            return self._send_to_self(view, tag, signature)
        target = self._peers[peer]
        if target.cma_pid is not None and view.nbytes >= self._shm_min:
            return self._submit(target, _CmaSend(self, peer, tag, view, signature))
        if target.shm_out is not None and view.nbytes >= self._shm_min:
            return self._submit(target, _ShmSend(self, peer, tag, view, signature))
        return self._enqueue(target, DATA, tag, memoryview(view), signature)

    def irecv(self, buf, peer, tag, signature=NO_SIGNATURE):
        if peer != ANY_SOURCE:
            self.check_peer(peer, "recv")
        view = _byte_view(buf, "recv", self.rank, writable=True)
        req = _Recv(self, view, peer, tag, signature)
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
        with self._cond:
            req.error, req.done, req.landing = error, True, False
            self._notify()
        if error is not None and NO_SIGNATURE not in (req.signature, entry.signature):
            self._fail(None, str(error))

    def _send_to_self(self, view, tag, signature):
        req = _Send(self, self.rank, tag, [], signature)
        data = bytearray(view)
        with self._lock:
            target = self._match_posted(self.rank, tag)
            if target is None:
                entry = _Unexpected(self.rank, tag, data, signature)
                entry.done = True
                self._unexpected[tag].append(entry)
        if target is not None:
            target.source = self.rank         # an any-source receive learns its sender
            entry = _Unexpected(self.rank, tag, data, signature)
            self._fill_from(target, entry)
        req.done = True
        return req

    def _enqueue(self, peer, kind, tag, payload, signature=NO_SIGNATURE):
        header = HEADER.pack(kind, signature, tag, payload.nbytes)
        return self._submit(peer, _Send(self, peer.rank, tag, [memoryview(header), payload]
                                        if payload.nbytes else [memoryview(header)], signature))

    def _submit(self, peer, req):
        """Queue a send and write what the socket (and the ring) take now, from the caller's
        thread; the token holder writes the rest, so this never blocks for long."""
        if self._failure is not None:
            raise TransportError(f"send on rank {self.rank} to rank {peer.rank} (tag {req.tag}): "
                                 f"{self._failure}")
        if peer.closed:
            raise TransportError(f"send on rank {self.rank}: rank {peer.rank} has closed its transport")
        with peer.send_lock:
            peer.queue.append(req)
            finished = self._pump(peer)
            wake = peer.blocked and not peer.writing
        if finished > 1 or (finished and not req.done):   # other threads' sends completed
            with self._cond:
                self._notify()
        if wake:
            self._wake()
        return req

    def _pump(self, peer) -> int:
        """Write queued frames, frame by frame, until the socket refuses bytes
        (``peer.blocked``), the ring has no room for the next chunk, or the queue is empty.
        Credit frames go out at any frame boundary, even between the chunks of a message, so
        two ranks streaming to each other never wait on each other's credit. Caller holds
        peer.send_lock; returns how many sends completed."""
        out, sock, finished = peer.out, peer.sock, 0
        try:
            while True:
                if out:
                    sent = sock.sendmsg(out) if len(out) > 1 else sock.send(out[0])
                    while out and sent >= out[0].nbytes:
                        sent -= out[0].nbytes
                        out.pop(0)
                    if out:
                        if sent:
                            out[0] = out[0][sent:]
                        continue
                    req, peer.out_req = peer.out_req, None
                    if req is not None:
                        peer.queue.popleft()
                        if req.cma:
                            peer.cma_waiting.append(req)   # done when the peer has read it
                        else:
                            req.done = True
                            finished += 1
                    continue
                if peer.acks_owed:
                    out.append(memoryview(HEADER.pack(CMA_ACK, NO_SIGNATURE, 0, peer.acks_owed)))
                    peer.acks_owed = 0
                    continue
                if peer.credit_owed:
                    out.append(memoryview(HEADER.pack(SHM_CREDIT, NO_SIGNATURE, 0, peer.credit_owed)))
                    peer.credit_owed = 0
                    continue
                if not peer.queue:
                    break
                req = peer.queue[0]
                if req.shm:
                    frame = self._shm_frame(peer, req)
                    if frame is None:
                        break              # the ring is full: the reader's credit resumes us
                    out.append(frame)
                    if req.copied == req.nbytes:
                        peer.out_req = req
                else:
                    out.extend(req.frames)
                    peer.out_req = req
            peer.blocked = False
        except (BlockingIOError, InterruptedError):
            peer.blocked = True
        except OSError as exc:
            peer.blocked = False
            self._fail(peer.rank, f"sending to rank {peer.rank} failed: {exc}")
        return finished

    def _shm_frame(self, peer, req):
        """The next frame of a shared-memory send: its announcement, then one chunk copied
        into the ring per call; None while the ring lacks room for the next chunk."""
        if not req.announced:
            req.announced = True
            return memoryview(HEADER.pack(SHM_MSG, req.signature, req.tag, req.nbytes))
        ring = peer.shm_out
        pos = ring.head % ring.capacity
        # whole chunks only (or up to the wrap), so frames stay few even when credit trickles
        n = min(req.nbytes - req.copied, ring.capacity - pos, ring.chunk)
        if ring.free() < n:
            return None
        ring.ring[pos:pos + n] = req.view[req.copied:req.copied + n]
        req.copied += n
        ring.head += n
        return memoryview(HEADER.pack(SHM_CHUNK, NO_SIGNATURE, pos, n))

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
        with self._cond:
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
                with self._cond:
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
        pending = bool(self._posted) or any(
            p.queue or p.out or p.cma_waiting or p.target is not None or p.shm_msg is not None
            for p in self._peers.values())
        with self._cond:
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
        with self._cond:
            for req in requests:
                if isinstance(req, _Recv) and not req.done and not req.landing:
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
                    with self._cond:
                        self._token.release()
                        if self._waiting:       # a caller asleep may take the token now
                            self._cond.notify_all()
                if self._closing and not any(p.queue for p in self._peers.values()) and (
                        all(p.closed for p in self._peers.values())
                        or time.monotonic() > self._close_deadline):
                    return   # flushed, and every peer said goodbye (or would not in time)
        except Exception as exc:       # a bug here must not leave waiters hanging
            log.exception("socket transport rank %d: progress thread crashed", self.rank)
            self._fail(None, f"the progress thread crashed: {exc!r}")

    def _take_turn(self):
        """Return holding the token once the sockets are this thread's to read: no caller
        has driven progress for CALLER_LEASE, or work was left that no caller waits for, or
        the transport is closing. Parks on a condition meanwhile (never in the selector, so
        data for a polling caller wakes only that caller)."""
        with self._cond:
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

    def _flush(self, peer):
        """Write more to ``peer`` from the token holder (the socket took bytes, or credit
        came back); watch for EVENT_WRITE only while the socket is what holds us up."""
        with peer.send_lock:
            finished = self._pump(peer)
            blocked = peer.blocked
        if blocked != peer.writing and not (peer.closed and peer.sock.fileno() < 0):
            self._register(peer, blocked)
        if finished:
            with self._cond:
                self._notify()

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
                    if peer.filled == peer.target.nbytes:
                        done, peer.target, peer.filled = peer.on_filled, None, 0
                        done()
                    elif n < want:
                        return         # drained: the selector says when more arrives
                    continue
                if peer.start == peer.end:
                    peer.start = peer.end = 0
                elif STAGE_BYTES - peer.end < HEADER.size:
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
        while peer.end - peer.start >= HEADER.size:
            kind, signature, tag, nbytes = HEADER.unpack_from(peer.stage, peer.start)
            if kind in (CMA_MSG, CMA_ACK):
                if kind == CMA_MSG and peer.end - peer.start < HEADER.size + ADDRESS.size:
                    return True            # the address is still on its way
                peer.start += HEADER.size
                if not self._on_cma_frame(peer, kind, tag, nbytes, signature):
                    return False
                continue
            if kind in SHM_KINDS:
                peer.start += HEADER.size
                if not self._on_shm_frame(peer, kind, tag, nbytes, signature):
                    return False
                continue
            if kind not in (DATA, ABORT, GOODBYE) or nbytes > MAX_MESSAGE or (
                    kind == ABORT and nbytes > MAX_ABORT_REASON) or (
                    kind == DATA and peer.shm_msg is not None):
                self._fail(peer.rank, f"rank {peer.rank} sent a malformed frame (kind {kind}, "
                                      f"{nbytes} bytes)")
                return False
            peer.start += HEADER.size
            if kind == GOODBYE:
                self._goodbye(peer)
                return False
            target, on_filled = self._land(peer, kind, tag, nbytes, signature)
            take = min(peer.end - peer.start, nbytes)
            if take:
                target[:take] = stage[peer.start:peer.start + take]
                peer.start += take
            if take == nbytes:
                on_filled()
                continue
            peer.target, peer.filled, peer.on_filled = target, take, on_filled
            return True
        return True

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
                entry = _Unexpected(peer.rank, tag, bytearray(nbytes), signature)
                self._unexpected[tag].append(entry)
        if req is not None and req.view.nbytes == nbytes and req.signature == signature:
            return req.view, lambda: self._landed(req)
        if req is not None:            # another call's message: drain it, fail the receive
            entry = _Unexpected(peer.rank, tag, bytearray(nbytes), signature)
            return memoryview(entry.data), lambda: self._fill_from(req, entry)
        return memoryview(entry.data), lambda: self._held(entry)

    def _on_shm_frame(self, peer, kind, a, n, signature) -> bool:
        """Handle an announcement, a chunk or a credit; False (and the transport failed,
        naming the peer) when it does not fit the ring's state: nothing outside the ring is
        ever read or written."""
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

    def _on_cma_frame(self, peer, kind, tag, n, signature) -> bool:
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
                return self._malformed(peer, f"acknowledgement of {n} reads with "
                                             f"{outstanding} outstanding")
            with self._cond:
                for req in acked:
                    req.done = True
                self._notify()
            return True
        (where,) = ADDRESS.unpack_from(peer.stage, peer.start)
        peer.start += ADDRESS.size
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
        with self._cond:
            req.done, req.landing = True, False
            self._notify()

    def _held(self, entry):
        with self._lock:
            entry.done = True
            waiter = entry.waiter
        if waiter is not None:
            self._fill_from(waiter, entry)

    def _goodbye(self, peer):
        with self._cond:
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

    # -- failure ---------------------------------------------------------------------------

    def _fail(self, peer_rank, reason, forward=True):
        with self._cond:
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
        frame = HEADER.pack(ABORT, NO_SIGNATURE, 0, len(payload)) + payload
        for peer in self._peers.values():
            if peer.rank == skip or peer.closed:
                continue
            if not peer.send_lock.acquire(blocking=False):
                continue               # busy writing: the peer will see our EOF instead
            try:
                if not peer.out:       # never split another frame
                    peer.sock.send(frame)
            except OSError:
                pass
            finally:
                peer.send_lock.release()

    def abort(self, reason: str) -> None:
        """Fail this rank's transport and tell every peer (they raise TransportError)."""
        self._fail(None, f"rank {self.rank} aborted: {reason}", forward=False)
        self._broadcast_abort(f"{reason}")

    # -- shutdown --------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """Flush queued sends, say goodbye to every peer, stop the thread, close sockets."""
        if self._closing:
            return
        _OPEN.discard(self)
        self._release()
        for peer in self._peers.values():
            if not peer.closed and self._failure is None:
                try:
                    self._enqueue(peer, GOODBYE, 0, memoryview(b""))
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


_DONE = object()


def _who(req):
    return "any" if req.peer == ANY_SOURCE else req.peer


def _send_setup(sock, payload: bytes):
    sock.sendall(HEADER.pack(SHM_SETUP, NO_SIGNATURE, 0, len(payload)) + payload)


def _recv_exact(sock, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        chunk = sock.recv(nbytes - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during setup")
        data += chunk
    return bytes(data)


def _drop_channels(peer):
    for channel in (peer.shm_out, peer.shm_in):
        if channel is not None:
            channel.unlink()
            channel.close()
    peer.shm_out = peer.shm_in = None


def _host_identity() -> bytes:
    """Boot id, hostname, network namespace and uid: equal on both sides of a pair only when
    they can share /dev/shm (a second network namespace, as in the two-hosts test, counts as
    another host, so that pair keeps its real network path)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError as exc:
        log.info("socket transport: no host identity (%s), shared memory is off", exc)
        return b""
    return f"{boot}|{socket.gethostname()}|{netns}|{os.getuid()}".encode()


def _tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 2), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 2)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if SOCKET_BUFFER:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)


def _bind_host(store) -> str:
    """The address to listen on: $COLLECTIVES_SOCKET_HOST, else the local interface that routes
    to the master (the store's host or $MASTER_ADDR), loopback when the master is local."""
    explicit = settings.SOCKET_HOST()
    if explicit:
        return explicit
    master = os.environ.get("MASTER_ADDR")
    inner = store
    while master is None and inner is not None:
        master = getattr(inner, "host", None)
        inner = getattr(inner, "underlying_store", None)
    if not master:
        return "127.0.0.1"
    try:
        ip = socket.getaddrinfo(master, None, socket.AF_INET)[0][4][0]
    except OSError:
        return "127.0.0.1"
    if ipaddress.ip_address(ip).is_loopback:
        return "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((ip, 9))          # no packet is sent: this only asks the routing table
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


_OPEN: "set[SocketTransport]" = set()


def _close_all_at_exit():
    # A clean interpreter exit says goodbye, so peers do not mistake it for a crash.
    for transport in list(_OPEN):
        try:
            transport.close(timeout=5.0)
        except Exception:
            pass


import atexit  # noqa: E402
import multiprocessing.util  # noqa: E402

atexit.register(_close_all_at_exit)
# multiprocessing children leave through os._exit, skipping atexit; they run these finalizers.
multiprocessing.util.Finalize(None, _close_all_at_exit, exitpriority=100)
