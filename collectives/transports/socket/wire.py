"""What travels on a socket transport connection: frame kinds, the header, the limits.

A frame is a 24-byte header (kind, the call's signature, tag, nbytes), for DATA and ABORT
``nbytes`` of payload (for CMA_MSG an 8-byte address), and a 16-byte tag that authenticates
all of it (``auth.FrameAuth``: keys from the connection's handshake, an implicit counter per
direction); a frame is acted on only once its tag checks. The signature (``collectives/signature.py``) lets a receive refuse a
message of another call; internal frames carry ``signature.NONE``. The same header opens the
setup frames that pairs exchange on blocking sockets before the progress engine starts.
"""
from __future__ import annotations

import struct

from ... import settings, signature
from ...auth import TAG
from ...errors import TransportError

# kind, the call's signature, tag (or a ring offset), nbytes
HEADER = struct.Struct(f"<B{signature.SIZE}sqQ")
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
# Frames without a payload: read whole (with their tag) from the staging buffer.
CONTROL_KINDS = frozenset((GOODBYE, SHM_MSG, SHM_CHUNK, SHM_CREDIT, CMA_MSG, CMA_ACK))
MAX_CONTROL = HEADER.size + ADDRESS.size + TAG
MAX_SETUP_FRAME = 4096
MAX_MESSAGE = settings.SOCKET_MAX_MESSAGE()
MAX_ABORT_REASON = 4096
NO_SIGNATURE = signature.NONE


def header(kind, tag, nbytes, sig=NO_SIGNATURE) -> memoryview:
    return memoryview(HEADER.pack(kind, sig, tag, nbytes))


def send_setup(peer, payload: bytes):
    """One setup frame to ``peer`` (a ``channels.Peer``) on its blocking socket."""
    head = HEADER.pack(SHM_SETUP, NO_SIGNATURE, 0, len(payload))
    peer.sock.sendall(head + payload + peer.auth.seal(head, payload))


def recv_setup(peer, rank) -> bytes:
    """The payload of the next setup frame from ``peer``; anything else, or a frame whose
    tag does not check, fails the setup."""
    head = recv_exact(peer.sock, HEADER.size)
    kind, _, _, nbytes = HEADER.unpack(head)
    if kind != SHM_SETUP or nbytes > MAX_SETUP_FRAME:
        raise TransportError(f"socket transport rank {rank}: rank {peer.rank} sent a "
                             f"malformed setup frame (kind {kind}, {nbytes} bytes)")
    payload = recv_exact(peer.sock, nbytes)
    if not peer.auth.authentic(head, payload, recv_exact(peer.sock, TAG)):
        raise TransportError(f"socket transport rank {rank}: {unauthentic(peer.rank)}")
    return payload


def unauthentic(peer) -> str:
    return (f"a frame from rank {peer} failed authentication: the connection was altered in "
            f"transit (a relay or injection between the ranks), not sent by a rank of this job")


def recv_exact(sock, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        chunk = sock.recv(nbytes - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection during setup")
        data += chunk
    return bytes(data)
