"""A collective call's signature: what every message of the call carries, where the transport
can, so that a message of one call never lands in another.

Ranks that make different calls with the same byte sizes (float32 against int32, SUM against
MAX, all_reduce against reduce_scatter) exchange messages of the right length: without a
check each reduces the other's bytes as its own and returns garbage. The signature packs the
call's collective, algorithm, dtype, op and root into 7 bytes; transports that can carry it
at no extra message (the socket transport in its frame header's spare bytes, the local
transport in its mailboxes) compare the sender's with the receiver's when they match a
message, and a difference is a ``CallMismatch`` on the receiving rank. Counts need no field:
the receive already checks the message's length. The sequence number is the tag.

Limits: the algorithm travels as one byte of a hash of its name (two research algorithms may
share it, 1 in 255); the root as 16 bits (roots 65536 apart look alike). MPI and NCCL carry
no signature: there ``COLLECTIVES_DEBUG=DETAIL`` is the check.
"""
from __future__ import annotations

import zlib

import numpy as np

from .errors import CollectiveError
from .ops import COLLECTIVES

SIZE = 7
NONE = bytes(SIZE)                   # no signature: user point-to-point, internal exchanges
_DTYPE_NAMES = ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
                "complex128")
_OTHER_DTYPE = 255
_OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")


class CallMismatch(CollectiveError):
    """A message of a different call reached this rank's receive: the ranks of the group
    made mismatched calls (raised before the message's bytes are used)."""


def encode(collective: str, algorithm: str, dtype, op=None, root=None) -> bytes:
    """The 7 bytes of a call: marker, collective, algorithm, dtype, op, root (2 bytes)."""
    root_code = 0 if root is None else int(root) % 0xFFFF + 1
    return bytes((1, COLLECTIVES.index(collective) + 1, _name_code(algorithm),
                  _dtype_code(dtype), 0 if op is None else _OPS.index(op.name) + 1,
                  root_code & 0xFF, root_code >> 8))


def describe(signature: bytes) -> str:
    """``all_reduce(ring, float32, SUM)``: the call a signature stands for."""
    if signature == NONE:
        return "a point-to-point message"
    _, collective, algorithm, dtype, op, root_lo, root_hi = signature
    parts = [_algorithm_name(algorithm), _dtype_name(dtype)]
    if op:
        parts.append(_OPS[op - 1])
    root = root_lo | root_hi << 8
    if root:
        parts.append(f"root {root - 1}")
    return f"{COLLECTIVES[collective - 1]}({', '.join(parts)})"


def mismatch(rank: int, source: int, tag: int, mine: bytes, theirs: bytes) -> CallMismatch:
    return CallMismatch(
        f"rank {rank}: the message from rank {source} (tag {tag}) belongs to "
        f"{describe(theirs)}, but this rank called {describe(mine)}: the ranks of the group "
        f"made mismatched calls")


def _name_code(name: str) -> int:
    return zlib.crc32(name.encode()) % 255 + 1


def _algorithm_name(code: int) -> str:
    from .algorithms.schedule import REGISTRY      # only to name it in an error
    names = {name for table in REGISTRY.values() for name in table} | {"native"}
    found = sorted(name for name in names if _name_code(name) == code)
    return "/".join(found) if found else f"algorithm #{code}"


def _dtype_code(dtype) -> int:
    name = np.dtype(dtype).name
    return _DTYPE_NAMES.index(name) + 1 if name in _DTYPE_NAMES else _OTHER_DTYPE


def _dtype_name(code: int) -> str:
    return _DTYPE_NAMES[code - 1] if code != _OTHER_DTYPE else "another dtype"
