"""Key-value stores for rendezvous, with torch.distributed's names and meanings.

``TCPStore`` (a server thread in one process, clients everywhere), ``FileStore`` (a shared
file, for one host or a shared filesystem), ``HashStore`` (one process), ``PrefixStore`` (a
namespace over another store). Methods: ``set``, ``get`` (blocks until the key exists or the
timeout), ``add``, ``wait(keys, timeout)``, ``compare_set``, ``delete_key``, ``num_keys``,
``check``. Keys are str, values bytes (str values are encoded). Timeouts raise
``StoreTimeout`` naming the keys still missing.

TCPStore connections are authenticated with the job secret (``collectives.auth``); a client
that fails the handshake or sends a malformed frame is logged and dropped, never trusted.
Frames are length-prefixed and bounded (``MAX_FRAME``). Cost: one round trip per call; the
server runs one thread per client, fine for the hundreds of ranks rendezvous needs, not a
database. FileStore polls the file (fcntl lock, append-only log) every few milliseconds.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import struct
import threading
import time
from datetime import timedelta

from .auth import AuthenticationError, client_handshake, job_secret, recv_exact, serve_handshake
from .errors import CollectiveError, CollectiveTimeout

log = logging.getLogger("collectives.store")

DEFAULT_TIMEOUT = timedelta(seconds=300)
MAX_FRAME = 64 << 20            # a store value larger than this is a bug or an attack
_LEN = struct.Struct("<I")


class StoreError(CollectiveError):
    """The store failed: its server went away, or answered something unexpected."""


class StoreTimeout(CollectiveTimeout):
    """A blocking store call ran out of time; the message names the missing keys."""


def _seconds(timeout) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _as_bytes(value) -> bytes:
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (list, tuple)):       # torch also accepts a list of ints
        return bytes(value)
    raise TypeError(f"store values are bytes or str, got {type(value).__name__}")


def _as_key(key) -> str:
    if isinstance(key, bytes):
        return key.decode()
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__}")
    return key


# ---------------------------------------------------------------------------------------------
# The table: the data and the semantics, shared by HashStore and the TCPStore server


class _Table:
    def __init__(self):
        self.data: dict[str, bytes] = {}
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = value
            self.cond.notify_all()

    def get(self, key, timeout):
        missing = self.wait([key], timeout)
        if missing:
            return None
        with self.cond:
            return self.data[key]

    def add(self, key, amount):
        with self.cond:
            current = self.data.get(key, b"0")
            try:
                value = int(current) + amount
            except ValueError:
                raise StoreError(f"add: key {key!r} holds {current[:40]!r}, not an integer") from None
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def wait(self, keys, timeout):
        """Block until every key exists; return the keys still missing at the deadline."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while True:
                missing = [k for k in keys if k not in self.data]
                if not missing:
                    return []
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return missing
                self.cond.wait(left)

    def compare_set(self, key, expected, desired):
        with self.cond:
            current = self.data.get(key)
            if (current is None and expected == b"") or current == expected:
                self.data[key] = desired
                self.cond.notify_all()
                return desired
            return expected if current is None else current

    def delete(self, key):
        with self.cond:
            return self.data.pop(key, None) is not None

    def num_keys(self):
        with self.cond:
            return len(self.data)

    def check(self, keys):
        with self.cond:
            return all(k in self.data for k in keys)


# ---------------------------------------------------------------------------------------------
# The store interface


class Store:
    """torch.distributed.Store's methods over ``self._table``-like primitives."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        self._timeout = _seconds(timeout)

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self._timeout if self._timeout is not None else 1e9)

    def set_timeout(self, timeout) -> None:
        self._timeout = _seconds(timeout)

    def _describe(self) -> str:
        return type(self).__name__

    def _timed_out(self, operation, missing, timeout):
        raise StoreTimeout(f"{self._describe()}: {operation} timed out after {timeout:.3g} s; "
                           f"missing keys: {missing}")

    def set(self, key, value) -> None:
        self._set(_as_key(key), _as_bytes(value))

    def get(self, key) -> bytes:
        key = _as_key(key)
        value = self._get(key, self._timeout)
        if value is None:
            self._timed_out("get", [key], self._timeout)
        return value

    def add(self, key, amount: int) -> int:
        return self._add(_as_key(key), int(amount))

    def wait(self, keys, timeout=None) -> None:
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        keys = [_as_key(k) for k in keys]
        seconds = self._timeout if timeout is None else _seconds(timeout)
        missing = self._wait(keys, seconds)
        if missing:
            self._timed_out("wait", missing, seconds)

    def compare_set(self, key, expected_value, desired_value) -> bytes:
        return self._compare_set(_as_key(key), _as_bytes(expected_value), _as_bytes(desired_value))

    def delete_key(self, key) -> bool:
        return self._delete(_as_key(key))

    def num_keys(self) -> int:
        return self._num_keys()

    def check(self, keys) -> bool:
        if isinstance(keys, (str, bytes)):
            keys = [keys]
        return self._check([_as_key(k) for k in keys])

    def multi_set(self, keys, values) -> None:
        for key, value in zip(keys, values):
            self.set(key, value)

    def multi_get(self, keys) -> list[bytes]:
        self.wait(keys)
        return [self.get(key) for key in keys]

    def close(self) -> None:
        pass


class HashStore(Store):
    """A store inside one process (threads as ranks, tests)."""

    def __init__(self, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self._t = _Table()

    def _set(self, key, value): self._t.set(key, value)
    def _get(self, key, timeout): return self._t.get(key, timeout)
    def _add(self, key, amount): return self._t.add(key, amount)
    def _wait(self, keys, timeout): return self._t.wait(keys, timeout)
    def _compare_set(self, key, e, d): return self._t.compare_set(key, e, d)
    def _delete(self, key): return self._t.delete(key)
    def _num_keys(self): return self._t.num_keys()
    def _check(self, keys): return self._t.check(keys)


class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix + '/'``."""

    def __init__(self, prefix: str, store: Store):
        self.prefix, self.underlying_store = str(prefix), store

    @property
    def _timeout(self):
        return self.underlying_store._timeout

    @_timeout.setter
    def _timeout(self, value):
        self.underlying_store._timeout = value

    def _k(self, key):
        return f"{self.prefix}/{key}"

    def _describe(self):
        return f"PrefixStore({self.prefix!r}, {self.underlying_store._describe()})"

    def _set(self, key, value): self.underlying_store._set(self._k(key), value)
    def _get(self, key, timeout): return self.underlying_store._get(self._k(key), timeout)
    def _add(self, key, amount): return self.underlying_store._add(self._k(key), amount)
    def _compare_set(self, key, e, d): return self.underlying_store._compare_set(self._k(key), e, d)
    def _delete(self, key): return self.underlying_store._delete(self._k(key))
    def _num_keys(self): return self.underlying_store._num_keys()
    def _check(self, keys): return self.underlying_store._check([self._k(k) for k in keys])

    def _wait(self, keys, timeout):
        missing = self.underlying_store._wait([self._k(k) for k in keys], timeout)
        return [m[len(self.prefix) + 1:] for m in missing]


# ---------------------------------------------------------------------------------------------
# FileStore: an append-only log of records in one file, under an fcntl lock


class FileStore(Store):
    """A store in ``file_name``, shared by processes that see the same file.

    Each record is (op, key, value); the state is the log replayed. Blocking calls poll.
    The last of ``world_size`` instances to ``close()`` removes the file (as torch does).
    """

    _REC = struct.Struct("<cII")
    _POLL = 0.002

    def __init__(self, file_name: str, world_size: int = -1, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self.path, self.world_size = os.fspath(file_name), world_size
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._closed = False
        self._add("__collectives_filestore_users__", 1)

    def _describe(self):
        return f"FileStore({self.path!r})"

    def _locked(self, fn):
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            return fn(self._load())
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _load(self) -> dict:
        os.lseek(self._fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            chunk = os.read(self._fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
        raw = b"".join(chunks)
        data, pos = {}, 0
        while pos + self._REC.size <= len(raw):
            op, klen, vlen = self._REC.unpack_from(raw, pos)
            pos += self._REC.size
            key = raw[pos:pos + klen].decode()
            value = raw[pos + klen:pos + klen + vlen]
            pos += klen + vlen
            if op == b"S":
                data[key] = value
            else:
                data.pop(key, None)
        return data

    def _append(self, op, key, value=b""):
        k = key.encode()
        os.lseek(self._fd, 0, os.SEEK_END)
        os.write(self._fd, self._REC.pack(op, len(k), len(value)) + k + value)

    def _set(self, key, value):
        self._locked(lambda d: self._append(b"S", key, value))

    def _add(self, key, amount):
        def apply(d):
            value = int(d.get(key, b"0")) + amount
            self._append(b"S", key, str(value).encode())
            return value
        return self._locked(apply)

    def _compare_set(self, key, expected, desired):
        def apply(d):
            current = d.get(key)
            if (current is None and expected == b"") or current == expected:
                self._append(b"S", key, desired)
                return desired
            return expected if current is None else current
        return self._locked(apply)

    def _delete(self, key):
        def apply(d):
            if key in d:
                self._append(b"D", key)
                return True
            return False
        return self._locked(apply)

    def _wait(self, keys, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = self._POLL
        while True:
            data = self._locked(lambda d: d)
            missing = [k for k in keys if k not in data]
            if not missing or (deadline is not None and time.monotonic() >= deadline):
                return missing
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)

    def _get(self, key, timeout):
        if self._wait([key], timeout):
            return None
        return self._locked(lambda d: d.get(key))

    def _num_keys(self):
        return self._locked(lambda d: len(d) - ("__collectives_filestore_users__" in d))

    def _check(self, keys):
        return self._locked(lambda d: all(k in d for k in keys))

    def close(self):
        if self._closed:
            return
        self._closed = True
        left = self._add("__collectives_filestore_users__", -1)
        if left <= 0 and self.world_size > 0:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        os.close(self._fd)


# ---------------------------------------------------------------------------------------------
# TCPStore: wire format. A request is len | op byte | fields; each field is len | bytes.
# A reply is len | status byte | fields. Lengths are u32 and bounded by MAX_FRAME.

_OK, _TIMEOUT, _ERROR = 0, 1, 2
_OPS = {"set": 1, "get": 2, "add": 3, "wait": 4, "cas": 5, "delete": 6, "num_keys": 7,
        "check": 8, "join": 9, "ping": 10}
_OP_NAMES = {v: k for k, v in _OPS.items()}
_STORE_CONTEXT = "collectives-store"


def _pack(head: int, fields) -> bytes:
    body = bytes([head]) + b"".join(_LEN.pack(len(f)) + f for f in fields)
    return _LEN.pack(len(body)) + body


def _read_frame(sock) -> tuple[int, list[bytes]]:
    (n,) = _LEN.unpack(recv_exact(sock, 4))
    if n < 1 or n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is out of bounds (1..{MAX_FRAME})")
    body = recv_exact(sock, n)
    fields, pos = [], 1
    while pos < n:
        if pos + 4 > n:
            raise ValueError("truncated field length")
        (k,) = _LEN.unpack_from(body, pos)
        pos += 4
        if pos + k > n:
            raise ValueError("field runs past the frame")
        fields.append(body[pos:pos + k])
        pos += k
    return body[0], fields


class _StoreServer:
    """The TCPStore server: an accept thread and one thread per authenticated client."""

    def __init__(self, host, port, secret, world_size):
        self.table = _Table()
        self.secret, self.world_size = secret, world_size
        self.joined = 0
        self.listener = socket.create_server((host, port), reuse_port=False, backlog=512)
        self.port = self.listener.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept_loop, name="collectives-store-accept",
                         daemon=True).start()

    def _accept_loop(self):
        while not self.closed:
            try:
                conn, addr = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                             name="collectives-store-client").start()

    def _serve(self, conn, addr):
        try:
            conn.settimeout(10.0)        # a silent client cannot hold a thread past the handshake
            serve_handshake(conn, self.secret, _STORE_CONTEXT)
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (AuthenticationError, OSError) as exc:
            log.warning("TCPStore on port %d refused a connection from %s: %s", self.port, addr, exc)
            conn.close()
            return
        try:
            while True:
                op, fields = _read_frame(conn)
                conn.sendall(self._handle(op, fields))
        except ConnectionError:
            pass                          # the client went away: normal at shutdown
        except (ValueError, OSError, UnicodeDecodeError, struct.error) as exc:
            log.warning("TCPStore on port %d dropped client %s after a malformed request: %s",
                        self.port, addr, exc)
        finally:
            conn.close()

    def _handle(self, op, f) -> bytes:
        t = self.table
        name = _OP_NAMES.get(op)
        if name is None:
            raise ValueError(f"unknown store op {op}")
        if name == "set":
            t.set(f[0].decode(), f[1])
            return _pack(_OK, [])
        if name == "get":
            value = t.get(f[0].decode(), _timeout_field(f[1]))
            return _pack(_TIMEOUT, [f[0]]) if value is None else _pack(_OK, [value])
        if name == "add":
            try:
                return _pack(_OK, [str(t.add(f[0].decode(), int(f[1]))).encode()])
            except StoreError as exc:
                return _pack(_ERROR, [str(exc).encode()])
        if name == "wait":
            missing = t.wait([k.decode() for k in f[1:]], _timeout_field(f[0]))
            return _pack(_TIMEOUT if missing else _OK, [m.encode() for m in missing])
        if name == "cas":
            return _pack(_OK, [t.compare_set(f[0].decode(), f[1], f[2])])
        if name == "delete":
            return _pack(_OK, [b"1" if t.delete(f[0].decode()) else b"0"])
        if name == "num_keys":
            return _pack(_OK, [str(t.num_keys()).encode()])
        if name == "check":
            return _pack(_OK, [b"1" if t.check([k.decode() for k in f]) else b"0"])
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


def _timeout_field(raw: bytes):
    value = float(raw)
    return None if value < 0 else value


class TCPStore(Store):
    """torch.distributed.TCPStore: ``is_master`` runs the server in this process.

    ``port=0`` with ``is_master`` picks a free port (read it back from ``.port``). Clients
    retry the connection until the timeout, so start order does not matter. ``secret``
    defaults to $COLLECTIVES_SECRET. The server listens on ``host_name``'s interface only.
    """

    def __init__(self, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout=DEFAULT_TIMEOUT, wait_for_workers: bool = True,
                 *, secret: bytes | str | None = None, multi_tenant: bool = False):
        super().__init__(timeout)
        self.host, self.world_size, self.is_master = host_name, world_size, is_master
        self._secret = job_secret(secret)
        self._server = None
        self._lock = threading.Lock()
        self._local = threading.local()
        self._socks: list[socket.socket] = []
        self._closed = False
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

    def _connect(self) -> socket.socket:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        pause, last = 0.01, None
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=10.0)
                client_handshake(sock, self._secret, _STORE_CONTEXT)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except AuthenticationError as exc:
                raise StoreError(f"{self._describe()}: authentication failed: {exc}") from None
            except OSError as exc:
                last = exc
                if exc.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT,
                                     errno.EHOSTUNREACH, errno.ENETUNREACH, None):
                    raise StoreError(f"{self._describe()}: cannot connect: {exc}") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise StoreTimeout(f"{self._describe()}: no server answered within "
                                   f"{self._timeout:.3g} s (last error: {last})")
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _conn(self) -> socket.socket:
        """This thread's connection: a blocking get in one thread never stalls another."""
        sock = getattr(self._local, "sock", None)
        if sock is None:
            with self._lock:
                if self._closed:
                    raise StoreError(f"{self._describe()} is closed")
            sock = self._connect()
            self._local.sock = sock
            with self._lock:
                self._socks.append(sock)
        return sock

    def _call(self, op, fields):
        sock = self._conn()
        try:
            sock.sendall(_pack(_OPS[op], fields))
            status, out = _read_frame(sock)
        except (OSError, ValueError) as exc:
            raise StoreError(f"{self._describe()}: {op} failed, the store server is gone "
                             f"or broken: {exc}") from None
        if status == _ERROR:
            raise StoreError(f"{self._describe()}: {out[0].decode(errors='replace')}")
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
            socks, self._socks = self._socks, []
        for sock in socks:
            sock.close()
        if self._server is not None:
            self._server.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
