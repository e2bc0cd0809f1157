"""Key-value stores for rendezvous, with torch.distributed's names and meanings.

``TCPStore`` (a server thread in one process, clients everywhere), ``FileStore`` (a shared
file, for one host or a shared filesystem), ``HashStore`` (one process), ``PrefixStore`` (a
namespace over another store). Methods: ``set``, ``get`` (blocks until the key exists or the
timeout), ``add``, ``wait(keys, timeout)``, ``compare_set``, ``delete_key``, ``num_keys``,
``check``. Keys are str, values bytes (str values are encoded). Timeouts raise
``StoreTimeout`` naming the keys still missing.

TCPStore connections are authenticated with the job secret (``collectives.auth``); a client
that fails the handshake is logged and dropped, never trusted. Frames are length-prefixed and
bounded (``MAX_FRAME``); a malformed request is answered with an error naming the operation.
Cost: one round trip per call; the server runs one thread per connection, bounded against
floods (see ``_StoreServer``), fine for the hundreds of ranks rendezvous needs, not a database.
Timeouts: None, inf, ``timedelta.max`` or anything from ``_FOREVER_S`` (about 31 years) up
mean no deadline; NaN and negative timeouts are ValueError.
FileStore polls the file (fcntl lock, append-only log) every few milliseconds.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import math
import numbers
import os
import socket
import struct
import threading
import time
from datetime import timedelta

from . import settings
from .auth import AuthenticationError, client_handshake, job_secret, recv_exact, serve_handshake
from .errors import CollectiveError, CollectiveTimeout

log = logging.getLogger("collectives.store")

DEFAULT_TIMEOUT = timedelta(seconds=300)
MAX_FRAME = 64 << 20            # a store value larger than this is a bug or an attack
_LEN = struct.Struct("<I")
# Every lock and socket timeout has a finite maximum (threading.TIMEOUT_MAX, about 292 years):
# a timeout at least this long is "no deadline", so nothing downstream ever overflows.
_FOREVER_S = 1e9


class StoreError(CollectiveError):
    """The store failed: its server went away, or answered something unexpected."""


class StoreGone(StoreError):
    """The connection to the store server broke mid-request (the server closed or died)."""


class StoreTimeout(CollectiveTimeout):
    """A blocking store call ran out of time; the message names the missing keys."""


def _seconds(timeout, operation: str = "store") -> float | None:
    """A timeout (timedelta or seconds) as seconds, or None for no deadline.

    None, inf, ``timedelta.max`` and anything from ``_FOREVER_S`` up are no deadline. NaN and
    negative values raise ValueError, anything else TypeError, both naming ``operation``: they
    are caught here, before a request is sent, not in a server thread.
    """
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real):
        seconds = float(timeout)
    else:
        raise TypeError(f"{operation}: timeout must be a timedelta or a number of seconds, "
                        f"got {type(timeout).__name__} {timeout!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{operation}: timeout must be >= 0 seconds (inf for no deadline), "
                         f"got {timeout!r}")
    return None if seconds >= _FOREVER_S else seconds


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
        self._timeout = _seconds(timeout, f"{type(self).__name__}()")

    @property
    def timeout(self) -> timedelta:
        return timedelta(seconds=self._timeout if self._timeout is not None else _FOREVER_S)

    def set_timeout(self, timeout) -> None:
        self._timeout = _seconds(timeout, f"{self._describe()}.set_timeout")

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
        if timeout is None:
            seconds = self._timeout
        else:
            seconds = _seconds(timeout, f"{self._describe()}.wait")
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

    Format: the line ``HEADER``, then an append-only log of (op, key, value) records; the state
    is the log replayed under an exclusive lock on byte 0. Blocking calls poll (2 to 50 ms).

    Safety: the file is opened with O_NOFOLLOW and created with mode 0600. A symbolic link, a
    file owned by another user, a file that group or others may read or write, and a non-empty
    file without the header are refused (StoreError naming the path, the fault and the fix)
    before any byte is written: another user can neither read the job's keys nor make it
    append to a file of theirs. An empty file (``mkstemp``) is adopted.

    Lifetime: each open instance holds a shared lock on byte 1 through a second descriptor of
    the file, released by close() or by the process's death. With ``world_size`` > 0
    (rendezvous), an instance that finds nobody holding it knows that every record is from a
    job that is over (finished, failed or killed) and starts the log afresh, so a re-run on
    the same path works; the last instance to close (or be collected) removes the file, as
    torch's does. With ``world_size`` < 1 the file is a plain persistent store: never reset,
    never removed.

    Limits: a process of an earlier job that still has the file open (hung, not killed) makes
    the new job join its records: kill it, or use a new path. Every rank must run as the same
    user. The locks are Linux's open-file-description locks (per descriptor, like flock, but
    per byte); they need a filesystem that honours them across the processes (local, or NFS
    with locking). Elsewhere they are POSIX record locks, which a process shares between its
    instances: there, open one FileStore per file per process. Each call re-reads the whole
    log: fine for rendezvous, not a database.
    """

    HEADER = b"collectives FileStore v1\n"
    _REC = struct.Struct("<cII")
    _POLL = 0.002
    # Two locks on one file, independent because they cover different bytes (whole-file flock
    # could not: a descriptor's exclusive lock would block the same store's liveness lock).
    # Locks may lie past the end of the file.
    _MUTEX, _LIVE = 0, 1
    _SETLK = getattr(fcntl, "F_OFD_SETLK", fcntl.F_SETLK)
    _SETLKW = getattr(fcntl, "F_OFD_SETLKW", fcntl.F_SETLKW)
    _FLOCK = struct.Struct("hhqqi4x")            # struct flock; l_pid must be 0 for OFD locks

    @classmethod
    def _lock(cls, fd, byte, kind, wait=True) -> bool:
        """Set ``kind`` (F_RDLCK, F_WRLCK, F_UNLCK) on ``byte``; without ``wait``, False when
        another descriptor holds a conflicting lock."""
        try:
            fcntl.fcntl(fd, cls._SETLKW if wait else cls._SETLK,
                        cls._FLOCK.pack(kind, os.SEEK_SET, byte, 1, 0))
            return True
        except OSError as exc:
            if not wait and exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise

    def __init__(self, file_name: str, world_size: int = -1, timeout=DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self.path, self.world_size = os.fspath(file_name), world_size
        self._fd = self._live = -1
        self._closed = True               # until both descriptors are ours
        self._end = 0                     # where the next record goes (after _load)
        self._open()
        self._pid = self._live_pid = os.getpid()     # the data lock's and the liveness lock's
        self._closed = False

    def _describe(self):
        return f"FileStore({self.path!r})"

    def _refuse(self, problem: str, fix: str = "remove it, or pass another path"):
        raise StoreError(f"{self._describe()}: {problem}; {fix}")

    def _open_checked(self, flags) -> int:
        """Open the path itself (never a link's target) and refuse anything not our own."""
        import stat
        try:
            fd = os.open(self.path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno == errno.ENOENT and not flags & os.O_CREAT:
                raise                   # removed since the first open: the caller retries
            if exc.errno == errno.ELOOP:
                self._refuse("the path is a symbolic link, which a store never follows (it could "
                             "make the job write into the file it points to)",
                             "remove the link, or pass the path of a plain file")
            raise StoreError(f"{self._describe()}: cannot open the file: {exc}") from None
        try:
            st = os.fstat(fd)
            me = os.geteuid()
            if not stat.S_ISREG(st.st_mode):
                self._refuse("the path is not a regular file")
            if st.st_uid != me:
                self._refuse(f"the file is owned by uid {st.st_uid}, not by this process's uid "
                             f"{me}: another user may have planted it to read the job's keys",
                             "remove it, or use a path in a directory only you can write")
            if st.st_mode & 0o077:
                self._refuse(f"the file has mode {oct(stat.S_IMODE(st.st_mode))}, so group or "
                             f"others may read or write the job's keys",
                             "remove it (the store creates it with mode 0600), or chmod 600 it "
                             "if nobody else can have opened it")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open(self):
        """Open the data and liveness descriptors on the file now at the path, under the lock:
        adopt an empty file, start a stale log afresh (world_size > 0), refuse foreign files."""
        while True:
            fd = self._open_checked(os.O_RDWR | os.O_CREAT)
            live = -1
            try:
                try:
                    live = self._open_checked(os.O_RDWR)        # a write lock needs it
                except FileNotFoundError:
                    continue
                self._lock(fd, self._MUTEX, fcntl.F_WRLCK)
                # The last user of an earlier job may have removed (or another process
                # replaced) the path since we opened it: use only the file now at the path.
                if not self._is_current(fd, live):
                    continue
                head = os.pread(fd, len(self.HEADER), 0)
                size = os.fstat(fd).st_size
                if size and head != self.HEADER:
                    self._refuse(f"the file is not a FileStore's (it does not start with "
                                 f"{self.HEADER!r}) and is left untouched",
                                 "pass the path of a new or empty file")
                alone = self._lock(live, self._LIVE, fcntl.F_WRLCK, wait=False)
                if size == 0 or (alone and self.world_size > 0 and size > len(self.HEADER)):
                    if size > len(self.HEADER):
                        log.info("%s: nobody has the file open, so its records are from an "
                                 "earlier job; starting afresh", self._describe())
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, self.HEADER, 0)
                # Liveness is write-locked only under the mutex, which we hold: taking (or
                # downgrading to) a read lock cannot block.
                self._lock(live, self._LIVE, fcntl.F_RDLCK)
                self._lock(fd, self._MUTEX, fcntl.F_UNLCK)
                self._fd, self._live, fd, live = fd, live, -1, -1
                return
            finally:
                for left in (fd, live):
                    if left >= 0:
                        os.close(left)

    def _is_current(self, *fds) -> bool:
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return False
        return all((st.st_dev, st.st_ino) == (now.st_dev, now.st_ino) and st.st_nlink > 0
                   for st in map(os.fstat, fds))

    def _locked(self, fn):
        if self._closed:
            raise StoreError(f"{self._describe()} is closed")
        if self._pid != os.getpid():
            self._after_fork()
        self._lock(self._fd, self._MUTEX, fcntl.F_WRLCK)
        try:
            return fn(self._load())
        finally:
            self._lock(self._fd, self._MUTEX, fcntl.F_UNLCK)

    def _after_fork(self):
        """A forked child shares the parent's open file, and so its lock: take our own."""
        fd = self._open_checked(os.O_RDWR)
        if not self._is_current(fd, self._fd):
            os.close(fd)
            raise StoreError(f"{self._describe()}: the file was replaced or removed since this "
                             f"store was opened in the parent process")
        os.close(self._fd)
        self._fd, self._pid = fd, os.getpid()

    def _load(self) -> dict:
        chunks, pos = [], 0
        while True:
            chunk = os.pread(self._fd, 1 << 20, pos)
            if not chunk:
                break
            chunks.append(chunk)
            pos += len(chunk)
        raw = b"".join(chunks)
        if not raw.startswith(self.HEADER):
            raise StoreError(f"{self._describe()}: the file lost its FileStore header: something "
                             f"else wrote to it or truncated it; start the job again on a new path")
        data, pos, end = {}, len(self.HEADER), len(raw)
        while pos + self._REC.size <= end:
            op, klen, vlen = self._REC.unpack_from(raw, pos)
            stop = pos + self._REC.size + klen + vlen
            if stop > end:
                break                     # cut short by a writer that died: dropped below
            try:
                key = raw[pos + self._REC.size:pos + self._REC.size + klen].decode()
            except UnicodeDecodeError:
                key = None
            if key is None or op not in (b"S", b"D"):
                raise StoreError(f"{self._describe()}: the file is corrupt at byte {pos} (a "
                                 f"record that no FileStore writes); start the job again on a "
                                 f"new path")
            if op == b"S":
                data[key] = raw[stop - vlen:stop]
            else:
                data.pop(key, None)
            pos = stop
        # Writers append only under the lock, so bytes past the last whole record are a record
        # that a killed writer left half-written: the next append overwrites them.
        self._end, self._tail = pos, end - pos
        return data

    def _append(self, op, key, value=b""):
        k = key.encode()
        record = self._REC.pack(op, len(k), len(value)) + k + value
        os.pwrite(self._fd, record, self._end)
        if self._tail > len(record):
            os.ftruncate(self._fd, self._end + len(record))
        self._end, self._tail = self._end + len(record), 0

    def _set(self, key, value):
        self._locked(lambda d: self._append(b"S", key, value))

    def _add(self, key, amount):
        def apply(d):
            current = d.get(key, b"0")
            try:
                value = int(current) + amount
            except ValueError:
                raise StoreError(f"add: key {key!r} holds {current[:40]!r}, not an integer") from None
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
        return self._locked(len)

    def _check(self, keys):
        return self._locked(lambda d: all(k in d for k in keys))

    def close(self):
        """Give the file up; the last holder of a rendezvous file (world_size > 0) removes it.
        In a forked child the file and its locks are the parent's: only descriptors close."""
        if self._closed:
            return
        self._closed = True
        fd, live = self._fd, self._live
        try:
            if self._live_pid == os.getpid():
                self._lock(fd, self._MUTEX, fcntl.F_WRLCK)
                try:
                    self._lock(live, self._LIVE, fcntl.F_UNLCK)
                    last = self._lock(live, self._LIVE, fcntl.F_WRLCK, wait=False)
                    if last and self.world_size > 0 and self._is_current(fd):
                        os.unlink(self.path)
                finally:
                    self._lock(fd, self._MUTEX, fcntl.F_UNLCK)
        finally:
            os.close(live)
            if fd != live:
                os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


# ---------------------------------------------------------------------------------------------
# TCPStore: wire format. A request is len | op byte | fields; each field is len | bytes.
# A reply is len | status byte | fields. Lengths are u32 and bounded by MAX_FRAME.

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
_HELLO_WAIT = 30.0              # s a client waits for the challenge before it reconnects
_AUTH_ATTEMPTS = 3              # handshake failures before a client calls it a wrong secret


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


def _read_frame(sock) -> tuple[int, list[bytes]]:
    (n,) = _LEN.unpack(recv_exact(sock, 4))
    if n < 1 or n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes is out of bounds (1..{MAX_FRAME})")
    body = recv_exact(sock, n)
    return body[0], _split_fields(body)


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
                serve_handshake(_HandshakeDeadline(conn, self.handshake_timeout), self.secret,
                                _STORE_CONTEXT)
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
                self._serve_requests(conn, addr)
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

    def _serve_requests(self, conn, addr):
        while True:
            (n,) = _LEN.unpack(recv_exact(conn, 4))
            if n > MAX_FRAME:
                message = (f"request of {n} bytes exceeds MAX_FRAME ({MAX_FRAME} bytes); "
                           f"closing the connection")
                self._refusals.note(f"dropped client {addr}: {message}")
                conn.sendall(_pack(_ERROR, [message.encode()]))
                # Closing with the body unread would send a reset, which can destroy the
                # reply before the client reads it: end our side, discard a while, then close.
                conn.shutdown(socket.SHUT_WR)
                deadline = time.monotonic() + _LINGER
                while (left := deadline - time.monotonic()) > 0:
                    conn.settimeout(left)
                    if not conn.recv(1 << 16):
                        break
                return
            conn.sendall(self._answer(recv_exact(conn, n) if n else b"", addr))

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
                client_handshake(sock, self._secret, _STORE_CONTEXT)
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except AuthenticationError as exc:
                sock.close()
                refusals, last = refusals + 1, exc
                if refusals >= _AUTH_ATTEMPTS:
                    raise StoreError(f"{self._describe()}: authentication failed: {exc}") from None
            except OSError as exc:
                if sock is not None:
                    sock.close()
                last = exc
                if exc.errno not in (errno.ECONNREFUSED, errno.ECONNRESET, errno.ETIMEDOUT,
                                     errno.EHOSTUNREACH, errno.ENETUNREACH, None):
                    raise StoreError(f"{self._describe()}: cannot connect: {exc}") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise StoreTimeout(f"{self._describe()}: no server answered within "
                                   f"{self._timeout:.3g} s (last error: {last})")
            time.sleep(pause if deadline is None else min(pause, deadline - time.monotonic()))
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
        size = 1 + sum(_LEN.size + len(f) for f in fields)
        if size > MAX_FRAME:
            raise ValueError(f"{self._describe()}: {op}: a request of {size} bytes exceeds "
                             f"MAX_FRAME ({MAX_FRAME} bytes)")
        sock = self._conn()
        try:
            sock.sendall(_pack(_OPS[op], fields))
            status, out = _read_frame(sock)
        except (OSError, ValueError) as exc:
            raise StoreGone(f"{self._describe()}: {op} failed, the store server is gone "
                            f"or broken: {exc}") from None
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
