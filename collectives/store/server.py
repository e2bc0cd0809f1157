"""The TCPStore server: an accept thread and one thread per connection, bounded against floods."""
from __future__ import annotations

import errno
import logging
import socket
import threading
import time

from .. import settings
from ..auth import AuthenticationError, serve_handshake
from . import wire
from .base import StoreError, _Table
from .wire import (_ERROR, _FIELDS, _OK, _OP_NAMES, _STORE_CONTEXT, _TIMEOUT, Connection,
                   _amount_field, _key, _pack, _split_fields, _timeout_field)

log = logging.getLogger("collectives.store")

# Flood limits of the server (see _StoreServer); each can be set in the environment.
HANDSHAKE_TIMEOUT = settings.STORE_HANDSHAKE_TIMEOUT.default    # s for a whole handshake
MAX_PENDING_HANDSHAKES = settings.STORE_MAX_PENDING.default     # connections not yet authenticated
CLIENTS_PER_RANK = 4            # connections: 4 x world_size + 64 ($COLLECTIVES_STORE_MAX_CLIENTS)
SPARE_CLIENTS = 64
CLIENTS_WITHOUT_WORLD_SIZE = 1024
LOG_SUMMARY_INTERVAL = 30.0     # s between summaries of refused connections
_PENDING_GRACE = 0.5            # s a handshake is left alone before a newcomer may evict it
_ACCEPT_POLL = 0.5              # s: the accept loop wakes this often to flush the summary
_ACCEPT_BACKOFF = (0.005, 0.5)  # s after a failed accept, doubling up to the second
_LINGER = 1.0                   # s an oversized request is discarded before its connection closes


class _HandshakeDeadline:
    """The socket as ``serve_handshake`` sees it, with one deadline for the whole handshake.

    A per-recv timeout lets a client that drips one byte now and then hold the connection
    forever; here every send and recv gets only what is left of the one deadline.
    """

    def __init__(self, sock, seconds):
        self.sock, self.seconds = sock, seconds
        self.deadline = time.monotonic() + seconds

    def _arm(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"handshake not finished within {self.seconds:.3g} s")
        self.sock.settimeout(left)

    def sendall(self, data):
        self._arm()
        self.sock.sendall(data)

    def recv_into(self, buffer, nbytes=0):
        self._arm()
        return self.sock.recv_into(buffer, nbytes)


class _Refusals:
    """Warnings about refused or failed connections: the first at once, then at most one
    summary with the count every LOG_SUMMARY_INTERVAL seconds, so that a flood of connections
    does not become a flood of log lines."""

    def __init__(self, port):
        self.port = port
        self.lock = threading.Lock()
        self.count, self.latest, self.quiet_until = 0, "", 0.0

    def note(self, message: str) -> None:
        now = time.monotonic()
        with self.lock:
            first = self.count == 0 and now >= self.quiet_until
            if first:
                self.quiet_until = now + LOG_SUMMARY_INTERVAL
            else:
                self.count += 1
                self.latest = message
        if first:
            log.warning("TCPStore on port %d %s", self.port, message)
        else:
            self.flush()

    def flush(self) -> None:
        now = time.monotonic()
        with self.lock:
            if self.count == 0 or now < self.quiet_until:
                return
            count, latest, self.count = self.count, self.latest, 0
            self.quiet_until = now + LOG_SUMMARY_INTERVAL
        log.warning("TCPStore on port %d: %d more connections refused, dropped or answered with "
                    "an error in the last %.0f s (latest: %s)", self.port, count,
                    LOG_SUMMARY_INTERVAL, latest)


class _StoreServer:
    """The TCPStore server: an accept thread and one thread per connection, bounded.

    A local user flooding the port must neither kill the server nor lock honest ranks out:
    - a handshake must finish within ``handshake_timeout`` in all (one deadline, not one per
      recv), so a client dripping a byte at a time is dropped on time;
    - at most ``max_pending`` connections are in their handshake at once; a newcomer beyond
      that evicts the oldest one if it has had ``_PENDING_GRACE`` s, else is closed. Silent
      connections therefore delay an honest client by about the grace, not the handshake
      timeout; only an attacker opening connections faster than a handshake completes wins;
    - at most ``max_clients`` connections in all; extras are closed before the challenge,
      which clients take as "busy" and retry until their timeout;
    - when accept fails (out of file descriptors: EMFILE/ENFILE) the oldest pending
      handshake is dropped to free one, and the loop backs off briefly and goes on;
    - refused connections are logged once, then summarised (``_Refusals``).
    Threads: at most 2 x max_pending (evicted ones are still exiting) + max_clients + 1.
    Every request is validated (field count, UTF-8 keys, numbers, MAX_FRAME): a bad one is
    answered with an error naming its operation and the connection goes on serving; a frame
    over MAX_FRAME is answered, then the connection is closed (its body is never read).
    Limits: an authenticated client is trusted with memory (values up to MAX_FRAME each) and
    may hold a connection forever; without a job secret anyone can authenticate.
    """

    def __init__(self, host, port, secret, world_size):
        self.table = _Table()
        self.secret, self.world_size = secret, world_size
        self.joined = 0
        self.handshake_timeout = settings.STORE_HANDSHAKE_TIMEOUT()
        self.max_pending = settings.STORE_MAX_PENDING()
        default_clients = (CLIENTS_PER_RANK * world_size + SPARE_CLIENTS if world_size
                           else CLIENTS_WITHOUT_WORLD_SIZE)
        self.max_clients = settings.STORE_MAX_CLIENTS() or default_clients
        self.listener = socket.create_server((host, port), reuse_port=False, backlog=512)
        self.listener.settimeout(_ACCEPT_POLL)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        self._lock = threading.Lock()
        self._pending: dict[socket.socket, float] = {}    # in arrival order: oldest first
        self._evicted: set[socket.socket] = set()
        self._clients: set[socket.socket] = set()
        self._refusals = _Refusals(self.port)
        threading.Thread(target=self._accept_loop, name="collectives-store-accept",
                         daemon=True).start()

    def _accept_loop(self):
        pause = _ACCEPT_BACKOFF[0]
        while not self.closed:
            self._refusals.flush()
            try:
                conn, addr = self.listener.accept()
            except socket.timeout:
                continue
            except OSError as exc:
                if self.closed:
                    return
                # Out of descriptors (or a connection reset while queued): the queued
                # connections wait in the backlog; free a descriptor and try again shortly.
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    with self._lock:
                        self._evict_oldest_locked(time.monotonic())
                self._refusals.note(f"could not accept a connection ({exc}); retrying in "
                                    f"{pause * 1e3:.0f} ms")
                time.sleep(pause)
                pause = min(pause * 2, _ACCEPT_BACKOFF[1])
                continue
            pause = _ACCEPT_BACKOFF[0]
            try:
                self._admit(conn, addr)
            except Exception as exc:      # e.g. no thread can be started: drop this one only
                with self._lock:
                    self._pending.pop(conn, None)
                conn.close()
                self._refusals.note(f"dropped a connection from {addr}: {exc!r}")

    def _admit(self, conn, addr):
        now = time.monotonic()
        with self._lock:
            full = self._full_locked(now)
            if full is None:
                self._pending[conn] = now
        if full is not None:
            conn.close()
            self._refusals.note(f"closed a connection from {addr} unanswered: {full}")
            return
        threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                         name="collectives-store-client").start()

    def _full_locked(self, now) -> str | None:
        """Why a new connection cannot be taken now, or None (evicting a stale one if needed)."""
        clients, live = len(self._clients), len(self._pending) - len(self._evicted)
        why = (f"server full ({clients} clients, {live} handshakes pending; limits "
               f"{self.max_clients} connections, {self.max_pending} handshakes)")
        if clients >= self.max_clients:
            return why
        if live >= self.max_pending or clients + live >= self.max_clients:
            if not self._evict_oldest_locked(now - _PENDING_GRACE):
                return why
        if len(self._pending) >= 2 * self.max_pending:
            return why + "; evicted handshakes are still closing"
        return None

    def _evict_oldest_locked(self, born_before) -> bool:
        for conn, born in self._pending.items():
            if conn in self._evicted:
                continue
            if born > born_before:
                return False
            self._evicted.add(conn)
            try:
                conn.shutdown(socket.SHUT_RDWR)    # wakes its thread, which closes it
            except OSError:
                pass
            return True
        return False

    def _serve(self, conn, addr):
        admitted = False
        try:
            try:
                _, frames = serve_handshake(_HandshakeDeadline(conn, self.handshake_timeout),
                                            self.secret, _STORE_CONTEXT)
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except (AuthenticationError, OSError) as exc:
                with self._lock:
                    evicted = conn in self._evicted
                what = "dropped a pending handshake to make room" if evicted else "refused"
                self._refusals.note(f"{what}: connection from {addr}: {exc}")
                return
            with self._lock:
                admitted = conn not in self._evicted and not self.closed
                if admitted:
                    self._clients.add(conn)
                self._pending.pop(conn, None)
                self._evicted.discard(conn)
            if admitted:
                self._serve_requests(Connection(conn, frames), addr)
        except AuthenticationError as exc:
            self._refusals.note(f"dropped client {addr}: {exc}")
        except ConnectionError:
            pass                          # the client went away: normal at shutdown
        except Exception as exc:          # never let one connection's failure reach the others
            self._refusals.note(f"dropped client {addr}: {exc!r}")
        finally:
            with self._lock:
                self._pending.pop(conn, None)
                self._evicted.discard(conn)
                self._clients.discard(conn)
            conn.close()

    def _serve_requests(self, link, addr):
        conn = link.sock
        while True:
            body = link.read_body(wire.MAX_FRAME)
            if isinstance(body, int):
                message = (f"request of {body} bytes exceeds MAX_FRAME ({wire.MAX_FRAME} "
                           f"bytes); closing the connection")
                self._refusals.note(f"dropped client {addr}: {message}")
                link.send(_pack(_ERROR, [message.encode()]))
                # Closing with the body unread would send a reset, which can destroy the
                # reply before the client reads it: end our side, discard a while, then close.
                conn.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + _LINGER
                while (left := deadline - time.monotonic()) > 0:
                    conn.settimeout(left)
                    if not conn.recv(1 << 16):
                        break
                return
            link.send(self._answer(body, addr))

    def _answer(self, body: bytes, addr) -> bytes:
        """The reply to one request; a bad request gets an error reply, never an exception."""
        name = _OP_NAMES.get(body[0]) if body else None
        what = name or (f"operation {body[0]}" if body else "an empty request")
        try:
            if name is None:
                raise ValueError("unknown operation" if body else "no operation byte")
            fields = _split_fields(body)
            fewest, most, names = _FIELDS[name]
            if len(fields) < fewest or (most is not None and len(fields) > most):
                count = fewest if fewest == most else f"at least {fewest}"
                raise ValueError(f"takes {count} fields ({names}), got {len(fields)}")
            return self._handle(name, fields)
        except Exception as exc:
            message = f"{what}: bad request: {exc}"
            self._refusals.note(f"answered an error to {addr}: {message}")
            return _pack(_ERROR, [message.encode()])

    def _handle(self, name, f) -> bytes:
        t = self.table
        if name == "set":
            t.set(_key(f[0]), f[1])
            return _pack(_OK, [])
        if name == "get":
            value = t.get(_key(f[0]), _timeout_field(f[1]))
            return _pack(_TIMEOUT, [f[0]]) if value is None else _pack(_OK, [value])
        if name == "add":
            try:
                return _pack(_OK, [str(t.add(_key(f[0]), _amount_field(f[1]))).encode()])
            except StoreError as exc:
                return _pack(_ERROR, [str(exc).encode()])
        if name == "wait":
            timeout = _timeout_field(f[0])
            missing = t.wait([_key(k) for k in f[1:]], timeout)
            return _pack(_TIMEOUT if missing else _OK, [m.encode() for m in missing])
        if name == "cas":
            return _pack(_OK, [t.compare_set(_key(f[0]), f[1], f[2])])
        if name == "delete":
            return _pack(_OK, [b"1" if t.delete(_key(f[0])) else b"0"])
        if name == "num_keys":
            return _pack(_OK, [str(t.num_keys()).encode()])
        if name == "check":
            return _pack(_OK, [b"1" if t.check([_key(k) for k in f]) else b"0"])
        if name == "join":
            with t.cond:
                self.joined += 1
                t.cond.notify_all()
            return _pack(_OK, [])
        if name == "ping":
            return _pack(_OK, [])
        raise ValueError(f"unhandled op {name}")

    def wait_joined(self, count, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.table.cond:
            while self.joined < count:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self.table.cond.wait(left)
        return True

    def close(self):
        self.closed = True
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:                  # handshakes in flight end now, not at their deadline
            for conn in self._pending:
                if conn not in self._evicted:
                    self._evicted.add(conn)
                    try:
                        conn.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
