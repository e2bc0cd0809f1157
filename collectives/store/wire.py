"""TCPStore's wire format, shared by its server and its clients.

A request is len | op byte | fields; each field is len | bytes. A reply is len | status byte |
fields. Lengths are u32 and bounded by MAX_FRAME, which the server and the client read from
this module at call time (one limit for both sides). After the connection's handshake every
frame is closed by its 16-byte tag (``auth.FrameAuth``): a relay that forwarded the handshake
can neither alter, insert nor replay a request or a reply (``Connection``).
"""
from __future__ import annotations

import math
import struct

from ..auth import TAG, AuthenticationError, recv_exact
from .base import _FOREVER_S

MAX_FRAME = 64 << 20            # a store value larger than this is a bug or an attack
_LEN = struct.Struct("<I")

_OK, _TIMEOUT, _ERROR = 0, 1, 2
_OPS = {"set": 1, "get": 2, "add": 3, "wait": 4, "cas": 5, "delete": 6, "num_keys": 7,
        "check": 8, "join": 9, "ping": 10}
_OP_NAMES = {v: k for k, v in _OPS.items()}
# The fields each request carries: (fewest, most or None for no limit, what they are).
_FIELDS = {"set": (2, 2, "key, value"), "get": (2, 2, "key, timeout"),
           "add": (2, 2, "key, amount"), "wait": (1, None, "timeout, keys..."),
           "cas": (3, 3, "key, expected, desired"), "delete": (1, 1, "key"),
           "num_keys": (0, 0, "none"), "check": (0, None, "keys..."), "join": (0, 0, "none"),
           "ping": (0, 0, "none")}
_NUMBER_FIELD = 64              # bytes: a timeout or an amount longer than this is not one
_STORE_CONTEXT = "collectives-store"


def _pack(head: int, fields) -> bytes:
    body = bytes([head]) + b"".join(_LEN.pack(len(f)) + f for f in fields)
    return _LEN.pack(len(body)) + body


def _split_fields(body: bytes) -> list[bytes]:
    fields, pos, n = [], 1, len(body)
    while pos < n:
        if pos + 4 > n:
            raise ValueError(f"truncated field length at byte {pos} of {n}")
        (k,) = _LEN.unpack_from(body, pos)
        pos += 4
        if pos + k > n:
            raise ValueError(f"a field of {k} bytes runs past the {n}-byte frame")
        fields.append(body[pos:pos + k])
        pos += k
    return fields


class Connection:
    """One store connection after its handshake: frames written and read with their tags."""
    __slots__ = ("sock", "frames")

    def __init__(self, sock, frames):
        self.sock, self.frames = sock, frames       # frames: the handshake's auth.FrameAuth

    def send(self, frame: bytes) -> None:
        # sealed as it is read: the length apart from the body
        self.sock.sendall(frame + self.frames.seal(frame[:_LEN.size], frame[_LEN.size:] or None))

    def read_body(self, limit: int | None = None) -> bytes:
        """The next frame's body, its tag checked; a length beyond ``limit`` is returned as
        an int, unread, for the caller to refuse."""
        head = recv_exact(self.sock, 4)
        (n,) = _LEN.unpack(head)
        if limit is not None and n > limit:
            return n
        body = recv_exact(self.sock, n) if n else b""
        if not self.frames.authentic(head, body or None, recv_exact(self.sock, TAG)):
            raise AuthenticationError("a store frame failed authentication: the connection "
                                      "was altered in transit (a relay or injection), not "
                                      "written by the other end")
        return body

    def read(self) -> tuple[int, list[bytes]]:
        """The next reply: (status, fields)."""
        body = self.read_body(MAX_FRAME)
        if isinstance(body, int) or not body:
            raise ValueError(f"frame of {body if isinstance(body, int) else 0} bytes is out "
                             f"of bounds (1..{MAX_FRAME})")
        return body[0], _split_fields(body)

    def close(self) -> None:
        self.sock.close()


def _key(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ValueError(f"key {raw[:40]!r} is not UTF-8") from None


def _amount_field(raw: bytes) -> int:
    """An add amount: a decimal int64, as torch's store takes."""
    try:
        value = int(raw) if len(raw) <= _NUMBER_FIELD else None
    except ValueError:
        value = None
    if value is None or not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"amount {raw[:40]!r} is not a 64-bit integer")
    return value


def _timeout_field(raw: bytes):
    """Seconds from a request, or None (no deadline) for a negative value (the client sends -1),
    inf or anything from _FOREVER_S up; NaN or not a number is a ValueError."""
    try:
        value = float(raw) if len(raw) <= _NUMBER_FIELD else math.nan
    except ValueError:
        value = math.nan
    if math.isnan(value):
        raise ValueError(f"timeout {raw[:40]!r} is not a number of seconds")
    return None if value < 0 or value >= _FOREVER_S else value
