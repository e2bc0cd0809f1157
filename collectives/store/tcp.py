"""TCPStore, torch.distributed.TCPStore's client (and, with ``is_master``, its server)."""
from __future__ import annotations

import errno
import socket
import threading
import time

from ..auth import AuthenticationError, client_handshake, job_secret
from . import wire
from .base import DEFAULT_TIMEOUT, Store, StoreError, StoreGone, StoreTimeout
from .server import _StoreServer
from .wire import _LEN, _OPS, _ERROR, _STORE_CONTEXT, _TIMEOUT, Connection, _pack

_HELLO_WAIT = 30.0              # s a client waits for the challenge before it reconnects
_AUTH_ATTEMPTS = 3              # handshake failures before a client calls it a wrong secret
# Idle connections a client keeps for its next calls: its main thread's and one other's
# (c10d's, a heartbeat). More concurrent callers open one each and close it after the call,
# so the server's connection budget (CLIENTS_PER_RANK per rank) holds however many threads
# use the client.
_IDLE_KEPT = 2


class TCPStore(Store):
    """torch.distributed.TCPStore: ``is_master`` runs the server in this process.

    ``port=0`` with ``is_master`` picks a free port (read it back from ``.port``). Clients
    retry the connection until the timeout, so start order does not matter. ``secret``
    defaults to $COLLECTIVES_SECRET. The server listens on ``host_name``'s interface only.

    Threads: each call takes a connection no other call is using (an idle one, else a new
    one) for its one round trip, so a ``get`` blocked in one thread never stalls another.
    A client holds as many connections as calls run at once, and keeps ``_IDLE_KEPT`` of
    them between calls, however many threads come and go.
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout=DEFAULT_TIMEOUT, wait_for_workers: bool = True,
                 *, secret: bytes | str | None = None, multi_tenant: bool = False):
        super().__init__(timeout)
        self.host, self.world_size, self.is_master = host_name, world_size, is_master
        self._secret = job_secret(secret)
        self._server = None
        self._lock = threading.Lock()
        self._idle: list[Connection] = []      # open, and no call is using them
        self._socks: set[Connection] = set()   # every open connection (close() ends them)
        self._closed = False
        self._gone = None           # why the server is known gone: later calls fail at once
        if is_master:
            self._server = _StoreServer(host_name, int(port), self._secret, world_size)
            port = self._server.port
        self.port = int(port)
        self._call("join", [])
        if is_master and wait_for_workers and world_size:
            if not self._server.wait_joined(world_size, self._timeout):
                joined = self._server.joined
                self.close()
                raise StoreTimeout(f"TCPStore server on {host_name}:{self.port}: only {joined} of "
                                   f"{world_size} workers connected within {self._timeout:.3g} s")

    def _describe(self):
        return f"TCPStore({self.host}:{self.port})"

    def _connect(self) -> Connection:
        """A new authenticated connection, retried until the store's timeout.

        A server that is full, flooded or out of file descriptors closes a new connection
        before its challenge (or leaves it queued): that is "busy", retried, never reported
        as a wrong secret. It may also evict a handshake in flight to make room, which looks
        like a refused secret: only _AUTH_ATTEMPTS refusals in a row are reported as one.
        """
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        pause, last, refusals = 0.01, None, 0
        while True:
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
            sock = None
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=min(left or 10.0, 10.0))
                sock.settimeout(min(left or _HELLO_WAIT, _HELLO_WAIT))
                if not sock.recv(1, socket.MSG_PEEK):
                    raise ConnectionResetError(
                        errno.ECONNRESET, "the server closed the connection before its "
                        "challenge: it is busy (at its connection limit, flooded or out of "
                        "file descriptors)")
                _, frames = client_handshake(sock, self._secret, _STORE_CONTEXT)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return Connection(sock, frames)
            except AuthenticationError as exc:
                sock.close()
                refusals, last = refusals + 1, exc
                if refusals >= _AUTH_ATTEMPTS:
                    raise StoreError(f"{self._describe()}: authentication failed: {exc}") from None
            except OSError as exc:
                if sock is not None:
                    sock.close()
                if last is None or not isinstance(exc, TimeoutError):
                    last = exc      # an attempt cut by the deadline says less than a refusal
                if exc.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT,
                                     errno.EHOSTUNREACH, errno.ENETUNREACH, None):
                    raise StoreError(f"{self._describe()}: cannot connect: {exc}") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise StoreTimeout(f"{self._describe()}: no server answered within "
                                   f"{self._timeout:.3g} s (last error: {last})")
            time.sleep(pause if deadline is None else min(pause, deadline - time.monotonic()))
            pause = min(pause * 2, 0.5)

    def _take(self) -> Connection:
        """A connection for one call: an idle one, else a new one."""
        with self._lock:
            if self._closed:
                raise StoreError(f"{self._describe()} is closed")
            if self._gone is not None:
                raise StoreGone(self._gone)
            if self._idle:
                return self._idle.pop()
        sock = self._connect()
        with self._lock:
            if not self._closed:
                self._socks.add(sock)
                return sock
        sock.close()
        raise StoreError(f"{self._describe()} is closed")

    def _put_back(self, sock, reusable: bool) -> None:
        """After a call: kept for the next one, or closed (a broken or interrupted connection
        may still carry a late reply; beyond _IDLE_KEPT idle ones it is not needed)."""
        with self._lock:
            keep = reusable and not self._closed and len(self._idle) < _IDLE_KEPT
            if keep:
                self._idle.append(sock)
            else:
                self._socks.discard(sock)
        if not keep:
            sock.close()

    def _conn(self) -> Connection:
        """A connection of this client, left idle: the next call takes it (the tests speak
        raw frames on it)."""
        sock = self._take()
        self._put_back(sock, True)
        return sock

    def _call(self, op, fields):
        size = 1 + sum(_LEN.size + len(f) for f in fields)
        if size > wire.MAX_FRAME:
            raise ValueError(f"{self._describe()}: {op}: a request of {size} bytes exceeds "
                             f"MAX_FRAME ({wire.MAX_FRAME} bytes)")
        sock = self._take()
        reusable = False
        try:
            sock.send(_pack(_OPS[op], fields))
            status, out = sock.read()
            reusable = True
        except (OSError, ValueError) as exc:
            # the server closed or died: its other connections are no better, and
            # reconnecting would only retry until the timeout
            self._gone = (f"{self._describe()}: {op} failed, the store server is gone or "
                          f"broken: {exc}")
            raise StoreGone(self._gone) from None
        finally:
            self._put_back(sock, reusable)
        if status == _ERROR:
            said = out[0].decode(errors="replace") if out else "an error without a message"
            raise StoreError(f"{self._describe()}: {said}")
        return status, out

    @staticmethod
    def _t(timeout):
        return b"-1" if timeout is None else repr(float(timeout)).encode()

    def _set(self, key, value):
        self._call("set", [key.encode(), value])

    def _get(self, key, timeout):
        status, out = self._call("get", [key.encode(), self._t(timeout)])
        return None if status == _TIMEOUT else out[0]

    def _add(self, key, amount):
        return int(self._call("add", [key.encode(), str(amount).encode()])[1][0])

    def _wait(self, keys, timeout):
        status, out = self._call("wait", [self._t(timeout)] + [k.encode() for k in keys])
        return [m.decode() for m in out] if status == _TIMEOUT else []

    def _compare_set(self, key, expected, desired):
        return self._call("cas", [key.encode(), expected, desired])[1][0]

    def _delete(self, key):
        return self._call("delete", [key.encode()])[1][0] == b"1"

    def _num_keys(self):
        return int(self._call("num_keys", [])[1][0])

    def _check(self, keys):
        return self._call("check", [k.encode() for k in keys])[1][0] == b"1"

    def close(self):
        with self._lock:
            self._closed = True
            socks, self._socks, self._idle = self._socks, set(), []
        for sock in socks:
            sock.close()
        if self._server is not None:
            self._server.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
