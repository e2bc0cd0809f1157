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

A transport with room for only a few bits (MPI, in its tags: ``transports/mpi.py``) carries
``fold(signature, width)``: a receive posted with one call's bits never matches a message of
another's, and ``folded_mismatch`` names the other call as the calls nearest this rank's
whose signature folds to the bits that arrived.

Limits: the algorithm travels as one byte of a hash of its name (two research algorithms may
share it, 1 in 255); the root as 16 bits (roots 65536 apart look alike). Folded into 8 bits,
two calls look alike 1 time in 254, and the other call is named by its bits (an exact name
where one call near this rank's folds to them). NCCL carries no signature: there
``COLLECTIVES_DEBUG=DETAIL`` is the check.
"""
from __future__ import annotations

import zlib

import numpy as np

from .errors import CollectiveError
from .ops import COLLECTIVES, REDUCING

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


def fold(signature: bytes, width: int) -> int:
    """The signature in ``width`` bits: 1 .. 2**width - 2. NONE folds to 0, and 2**width - 1
    is left to the transport (MPI marks its notices with it)."""
    if signature == NONE:
        return 0
    return zlib.crc32(signature) % ((1 << width) - 2) + 1


def folded_mismatch(rank: int, source: int, tag: int, mine: bytes, theirs: int, width: int,
                    size: int) -> CallMismatch:
    """``mismatch`` where only ``theirs = fold(their signature, width)`` arrived."""
    return CallMismatch(
        f"rank {rank}: the message from rank {source} (tag {tag}) belongs to another call: "
        f"{_folded_name(mine, theirs, width, size)}, but this rank called {describe(mine)}: "
        f"the ranks of the group made mismatched calls")


def _folded_name(mine: bytes, folded: int, width: int, size: int) -> str:
    """The calls nearest ``mine`` (fewest fields differing) that fold to ``folded``: 8 bits
    cannot say which of the many calls folding alike it was, the nearest is the likely one."""
    if folded == 0:
        return "an exchange that carries no signature"
    near = _near_calls(mine, folded, width, size)
    if not near:
        return f"its tag carries signature bits {folded:#x}"
    shown = " or ".join(describe(s) for s in near[:3]) + (" or ..." if len(near) > 3 else "")
    return f"its tag carries the signature bits of {shown} (the nearest such " \
           f"call{'s' if len(near) > 1 else ''})"


_ROOTS_TRIED = 256          # roots beyond (and this rank's) are not tried when naming a call


def _near_calls(mine: bytes, folded: int, width: int, size: int) -> list:
    from .algorithms.schedule import REGISTRY, ROOTED      # only to name calls in an error
    fields = _fields(mine)
    root = mine[5] | mine[6] << 8
    found = []
    for collective in COLLECTIVES:
        algorithms = sorted({_name_code(name) for name in REGISTRY.get(collective, ())}
                            | {mine[2]})
        ops = range(1, len(_OPS) + 1) if collective in REDUCING else (0,)
        roots = sorted(set(range(1, min(size, _ROOTS_TRIED) + 1)) | ({root} if root else set())) \
            if collective in ROOTED else (0,)
        for algorithm in algorithms:
            for dtype in (*range(1, len(_DTYPE_NAMES) + 1), _OTHER_DTYPE):
                for op in ops:
                    for root in roots:
                        call = bytes((1, COLLECTIVES.index(collective) + 1, algorithm, dtype,
                                      op, root & 0xFF, root >> 8))
                        if call != mine and fold(call, width) == folded:
                            found.append((sum(a != b for a, b in zip(_fields(call), fields)),
                                          call))
    if not found:
        return []
    nearest = min(distance for distance, _ in found)
    return [call for distance, call in found if distance == nearest]


def _fields(signature: bytes) -> tuple:
    return (*signature[1:5], signature[5:7])


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
