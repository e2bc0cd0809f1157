"""Per-job authentication for TCP connections: a mutual HMAC challenge-response.

Every store and transport connection opens with this handshake before any other byte is
trusted. The listener sends a magic word and a random nonce; the connector answers with its
own nonce, an 8-byte identity (its rank, or -1) and HMAC-SHA256(secret, "client" | context |
both nonces | identity); the listener checks it and answers with its own identity and
HMAC(secret, "server" | ...). Both sides therefore prove they hold the secret without sending
it, nonces defeat replay, and ``context`` (e.g. "store" or a transport namespace) keeps a
handshake of one purpose from being accepted for another. Cost: two small round trips per
connection, once.

The secret comes from ``COLLECTIVES_SECRET`` (the launcher generates one per job). Without it
the key is empty: connections still need to speak the protocol, but anyone who can reach the
port can join. Limits: no encryption; payloads after the handshake are not MACed.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct

SECRET_ENV = "COLLECTIVES_SECRET"
MAGIC = b"COLLv1\x00\x00"
NONCE = 32
DIGEST = 32
_IDENT = struct.Struct("<q")

log = logging.getLogger("collectives.auth")


class AuthenticationError(ConnectionError):
    """The peer did not prove it holds the job's secret, or did not speak the protocol."""


def job_secret(explicit: bytes | str | None = None) -> bytes:
    """The key: ``explicit`` if given, else $COLLECTIVES_SECRET, else empty (no real auth)."""
    value = explicit if explicit is not None else os.environ.get(SECRET_ENV, "")
    return value.encode() if isinstance(value, str) else bytes(value)


def new_secret() -> str:
    return secrets.token_hex(32)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _mac(secret, role, context, first, second, ident):
    msg = role + b"|" + context.encode() + b"|" + first + second + _IDENT.pack(ident)
    return hmac.new(secret, msg, hashlib.sha256).digest()


def serve_handshake(sock: socket.socket, secret: bytes, context: str, my_ident: int = -1) -> int:
    """Listener side. Returns the connector's identity; raises AuthenticationError."""
    nonce_s = os.urandom(NONCE)
    sock.sendall(MAGIC + nonce_s)
    try:
        reply = recv_exact(sock, len(MAGIC) + NONCE + _IDENT.size + DIGEST)
    except (ConnectionError, OSError) as exc:
        raise AuthenticationError(f"handshake cut short: {exc}") from None
    magic, rest = reply[:len(MAGIC)], reply[len(MAGIC):]
    if magic != MAGIC:
        raise AuthenticationError("peer does not speak the collectives protocol (bad magic)")
    nonce_c, ident_b, digest = rest[:NONCE], rest[NONCE:NONCE + 8], rest[NONCE + 8:]
    ident = _IDENT.unpack(ident_b)[0]
    if not hmac.compare_digest(digest, _mac(secret, b"client", context, nonce_s, nonce_c, ident)):
        raise AuthenticationError("peer failed the challenge (wrong or missing job secret)")
    sock.sendall(_IDENT.pack(my_ident) + _mac(secret, b"server", context, nonce_c, nonce_s, my_ident))
    return ident


def client_handshake(sock: socket.socket, secret: bytes, context: str, my_ident: int = -1) -> int:
    """Connector side. Returns the listener's identity; raises AuthenticationError."""
    try:
        hello = recv_exact(sock, len(MAGIC) + NONCE)
    except (ConnectionError, OSError) as exc:
        raise AuthenticationError(f"listener closed during handshake ({exc}); "
                                  f"it may have refused our secret") from None
    if hello[:len(MAGIC)] != MAGIC:
        raise AuthenticationError("listener does not speak the collectives protocol (bad magic)")
    nonce_s = hello[len(MAGIC):]
    nonce_c = os.urandom(NONCE)
    sock.sendall(MAGIC + nonce_c + _IDENT.pack(my_ident)
                 + _mac(secret, b"client", context, nonce_s, nonce_c, my_ident))
    try:
        answer = recv_exact(sock, _IDENT.size + DIGEST)
    except (ConnectionError, OSError) as exc:
        raise AuthenticationError(f"listener refused us ({exc}): wrong job secret? "
                                  f"(set {SECRET_ENV} identically on every rank)") from None
    ident = _IDENT.unpack(answer[:8])[0]
    if not hmac.compare_digest(answer[8:], _mac(secret, b"server", context, nonce_c, nonce_s, ident)):
        raise AuthenticationError("listener failed the challenge (wrong job secret)")
    return ident
