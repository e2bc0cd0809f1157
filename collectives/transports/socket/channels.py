"""Channels: how a payload reaches a peer, and the per-peer state of the connection.

Every pair has its TCP connection, which carries every frame. Between ranks of one host a
payload of at least $COLLECTIVES_SOCKET_SHM_MIN bytes (default 64 KiB) takes a faster channel,
negotiated once at setup:

- **shm** (``shm.py``): each direction has a shared-memory ring ($COLLECTIVES_SOCKET_SHM_BYTES,
  default 8 MiB). TCP then carries only control frames: an announcement (tag, nbytes) matched
  exactly like a TCP message, one (offset, length) frame per chunk written (a quarter of the
  ring at most, so writer and reader overlap), and credit frames back as the reader frees
  space. A message's chunks are never interleaved with another message to that peer; credits
  go out at any frame boundary. The caller's thread copies in while the ring has room and the
  progress engine does the rest; the reader copies straight into a posted receive (one copy
  each side).
- **cma** (``cma.py``): pairs on shared memory probe cross-memory attach: each reads a random
  probe out of the other's memory with process_vm_readv; if both succeed (and
  $COLLECTIVES_SOCKET_CMA is not 0), a payload is announced by one frame carrying the sender's
  buffer address, the receiver copies it straight into the matched receive (one copy) and
  acknowledges, and the send completes on the acknowledgement.

Same host means equal host identities (boot id, hostname, network namespace, uid) exchanged
over the authenticated connection; the side that writes a ring creates it, the other maps it
and checks its cookie, and both unlink the name at once. A failure anywhere in that setup
keeps the pair on TCP (logged at INFO); COLLECTIVES_SOCKET_SHM=0 turns it off.

The one interface: a send is a request whose ``next_frames(peer)`` gives the frames to write
next (None while its channel has no room) and whose ``written(peer)`` says whether writing
them completed it. The outbound writer (``outbound.py``) knows nothing else of the channels.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time

import numpy as np

from ... import settings
from ...errors import TransportError
from ..base import Request
from . import cma
from .bootstrap import host_identity
from .shm import Channel
from .wire import (ADDRESS, CMA_MSG, DATA, HEADER, NO_SIGNATURE, SHM_CHUNK, SHM_MSG, header,
                   recv_setup, send_setup)

log = logging.getLogger("collectives.transports.socket")

STAGE_BYTES = 256 << 10


class Send(Request):
    """A send over TCP: its frames, written as the socket takes them."""
    kind = "send"

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

    def next_frames(self, peer):
        """(frames to write next, whether they are this send's last); None: no room yet."""
        return self.frames, True

    def written(self, peer) -> bool:
        """Its last frame is out (caller holds peer.send_lock): is the send complete?"""
        self.done = True
        return True


class ShmSend(Send):
    """A send whose payload goes through the peer's shared-memory ring, chunk by chunk."""

    def __init__(self, transport, peer, tag, view, signature):
        super().__init__(transport, peer, tag, [], signature)
        self.view, self.nbytes = view, view.nbytes
        self.announced = False
        self.copied = 0               # bytes already in the ring

    def next_frames(self, peer):
        """The announcement, then one chunk copied into the ring per call; None while the
        ring lacks room for the next chunk (the reader's credit resumes the writer)."""
        if not self.announced:
            self.announced = True
            return [header(SHM_MSG, self.tag, self.nbytes, self.signature)], False
        ring = peer.shm_out
        pos = ring.head % ring.capacity
        # whole chunks only (or up to the wrap), so frames stay few even when credit trickles
        n = min(self.nbytes - self.copied, ring.capacity - pos, ring.chunk)
        if ring.free() < n:
            return None
        ring.ring[pos:pos + n] = self.view[self.copied:self.copied + n]
        self.copied += n
        ring.head += n
        return [header(SHM_CHUNK, pos, n)], self.copied == self.nbytes


class CmaSend(Send):
    """A send the receiver reads straight out of ``view`` (cross-memory attach): one frame
    announcing its address, done when the receiver acknowledges the copy."""

    def __init__(self, transport, peer, tag, view, signature):
        frame = HEADER.pack(CMA_MSG, signature, tag, view.nbytes) + ADDRESS.pack(cma.address(view))
        super().__init__(transport, peer, tag, [memoryview(frame)], signature)
        self.view = view              # keeps the buffer alive until the peer has read it

    def next_frames(self, peer):
        # waiting before a byte of its frame leaves (under send_lock, where the reader takes
        # acknowledgements): an acknowledgement never finds it missing, even when the writer
        # is interrupted between a write and its bookkeeping
        peer.cma_waiting.append(self)
        return self.frames, True

    def written(self, peer) -> bool:
        return False                      # done when the peer acknowledges its read


class Peer:
    """One connection: its socket, what is being read from it and written to it, and the
    channels negotiated for it."""

    def __init__(self, rank, sock, auth):
        self.rank, self.sock = rank, sock
        self.auth = auth              # the tags of every frame each way (auth.FrameAuth)
        self.send_lock = threading.Lock()
        self.queue: collections.deque[Send] = collections.deque()
        self.writing = False          # registered for EVENT_WRITE
        self.closed = False           # said goodbye: EOF is normal
        self.stage = bytearray(STAGE_BYTES)
        self.stage_view = memoryview(self.stage)
        self.start = self.end = 0
        self.target = None            # view being filled directly
        self.filled = 0
        self.on_filled = None
        self.head = None              # the header of the frame whose payload is landing
        self.sealed = None            # (header, payload, on_filled): its tag is next
        # sending, under send_lock: the frame being written, the request it completes, and
        # whether the socket refused bytes (only then is EVENT_WRITE wanted)
        self.out: list[memoryview] = []
        self.out_req = None
        self.blocked = False
        self.broken = False           # a write was interrupted mid-frame: nothing more goes out
        self.credit_owed = 0          # ring bytes freed, not yet reported to the writer
        self.shm_out: Channel | None = None   # the ring we write to this peer
        self.shm_in: Channel | None = None    # the ring this peer writes to us
        self.shm_msg = None           # [destination, bytes filled, on_filled] arriving by ring
        self.cma_pid = None           # the peer's pid when we read its sends directly
        self.cma_waiting: collections.deque = collections.deque()   # our sends it still reads
        self.acks_owed = 0            # its sends we have read, not yet acknowledged

    def send_request(self, transport, tag, view, signature, shm_min):
        """The send of ``view`` on the best channel this pair has for its size."""
        if view.nbytes >= shm_min:
            if self.cma_pid is not None:
                return CmaSend(transport, self.rank, tag, view, signature)
            if self.shm_out is not None:
                return ShmSend(transport, self.rank, tag, view, signature)
        return frame_request(transport, self, DATA, tag, memoryview(view), signature)

    def busy(self) -> bool:
        """Work on this connection that may need the progress engine with no caller waiting."""
        return bool(self.queue or self.out or self.cma_waiting or self.target is not None
                    or self.shm_msg is not None)

    def drop_channels(self):
        for channel in (self.shm_out, self.shm_in):
            if channel is not None:
                channel.unlink()
                channel.close()
        self.shm_out = self.shm_in = None


def frame_request(transport, peer, kind, tag, payload, signature=NO_SIGNATURE):
    """A TCP send of one frame (header and payload)."""
    frames = [header(kind, tag, payload.nbytes, signature)]
    if payload.nbytes:
        frames.append(payload)
    return Send(transport, peer.rank, tag, frames, signature)


def negotiate(rank, peers, deadline):
    """Agree with every peer, over the authenticated connections, whether the pair shares a
    host; if so each side creates the ring it writes, the other maps it and checks its
    cookie, and both unlink its name; then the pairs on shared memory probe cross-memory
    attach. Runs on blocking sockets before the progress engine: every phase sends to all
    peers (a few hundred bytes, never blocks) and then reads from all, so no order of ranks
    can deadlock. A pair where anything fails stays on TCP. Returns (the peers on shared
    memory, the peers whose sends we read directly)."""
    identity = host_identity() if settings.SOCKET_SHM() else b""
    capacity = settings.SOCKET_SHM_BYTES()
    shm_peers = []
    try:
        for peer in peers:
            peer.sock.settimeout(max(1.0, deadline - time.monotonic()))
            send_setup(peer, identity)
        theirs = {peer.rank: recv_setup(peer, rank) for peer in peers}
        same = [p for p in peers if identity and theirs[p.rank] == identity]
        for peer in same:
            offer = b""
            try:
                peer.shm_out = Channel.create(capacity)
                offer = f"{peer.shm_out.name} {capacity} {peer.shm_out.cookie.hex()}".encode()
            except (OSError, ValueError) as exc:
                log.info("socket transport rank %d: no shared memory to rank %d, staying on "
                         "TCP: %s", rank, peer.rank, exc)
            send_setup(peer, offer)
        for peer in same:
            offer = recv_setup(peer, rank)
            try:
                if offer:
                    name, size, cookie = offer.decode().split(" ")
                    peer.shm_in = Channel.open(name, bytes.fromhex(cookie), int(size))
                    peer.shm_in.unlink()
            except (OSError, ValueError) as exc:
                log.info("socket transport rank %d: cannot map rank %d's shared memory, "
                         "staying on TCP: %s", rank, peer.rank, exc)
            send_setup(peer, b"1" if peer.shm_in is not None else b"0")
        for peer in same:
            mapped = recv_setup(peer, rank) == b"1"
            if peer.shm_out is not None:
                peer.shm_out.unlink()
            if mapped and peer.shm_out is not None and peer.shm_in is not None:
                shm_peers.append(peer.rank)
            else:
                peer.drop_channels()
        if not identity:
            log.info("socket transport rank %d: shared memory is off "
                     "(COLLECTIVES_SOCKET_SHM=0 or no host identity)", rank)
        cma_peers = _probe_cma(rank, [p for p in same if p.rank in shm_peers])
    except (OSError, TransportError) as exc:
        for peer in peers:
            peer.drop_channels()
        if isinstance(exc, TransportError):
            raise
        raise TransportError(f"socket transport rank {rank}: the shared-memory "
                             f"handshake failed: {exc}") from None
    return shm_peers, cma_peers


def _probe_cma(rank, peers):
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
        send_setup(peer, offer)
    readable = {}
    for peer in peers:
        theirs = recv_setup(peer, rank)
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
                         "the shared-memory ring: %s", rank, peer.rank, exc)
        if not ok:
            readable.pop(peer.rank, None)
        send_setup(peer, b"1" if ok else b"0")
    cma_peers = []
    for peer in peers:
        if recv_setup(peer, rank) == b"1" and peer.rank in readable:
            peer.cma_pid = readable[peer.rank]
            cma_peers.append(peer.rank)
    del probe
    return cma_peers
