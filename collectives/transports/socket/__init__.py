"""The socket transport: a full mesh of authenticated TCP connections between processes,
with shared memory or direct reads between ranks of one host.

One concern per module, as Gloo's ``transport/tcp``:

- ``bootstrap.py``: listen, dial, the job-secret handshake, address exchange through the store;
- ``wire.py``: frame kinds, the header, limits, setup frames;
- ``channels.py``: per-peer state and the three channels a payload can take (TCP frames, a
  shared-memory ring ``shm.py``, cross-memory attach ``cma.py``) behind one send interface,
  negotiated per pair at setup;
- ``outbound.py``: the writer (sends from the caller's thread, the rest from the engine);
- ``inbound.py``: the reader (frames parsed, payloads matched to posted receives);
- ``engine.py``: the progress token and thread, waiting, timeouts and failure;
- ``transport.py``: ``SocketTransport``, which puts them together.

Cost: one syscall per frame per side plus the waiting thread's wake-up on receipt;
bandwidth near the loopback TCP limit, or about twice that through shared memory on one host
(two memcpys, plus a control round trip per chunk), or one kernel copy plus a round trip per
message with cross-memory attach. Limits: host (numpy) buffers only; payloads are
authenticated at connection time, not per frame, and not encrypted; frames above
``MAX_MESSAGE`` (4 GiB, $COLLECTIVES_SOCKET_MAX_MESSAGE) are refused; shared memory costs
$COLLECTIVES_SOCKET_SHM_BYTES per ordered same-host pair (touched lazily).
"""
from __future__ import annotations

from .bootstrap import bind_host as _bind_host  # noqa: F401  (tests pin the address choice)
from .inbound import ANY_SOURCE
from .transport import SEGMENT_BYTES, SocketTransport
from .wire import (ADDRESS, CMA_ACK, CMA_MSG, HEADER, MAX_MESSAGE, SHM_CHUNK, SHM_CREDIT,
                   SHM_MSG)

__all__ = ["ADDRESS", "ANY_SOURCE", "CMA_ACK", "CMA_MSG", "HEADER", "MAX_MESSAGE",
           "SEGMENT_BYTES", "SHM_CHUNK", "SHM_CREDIT", "SHM_MSG", "SocketTransport",
           "available", "create"]


def available():
    return True, ""


def create(rank, world_size, store=None, timeout=1800.0):
    return SocketTransport(rank, world_size, store, timeout)
