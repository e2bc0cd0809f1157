"""FileStore: an append-only log of records in one file, under an fcntl lock."""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import time

from .base import DEFAULT_TIMEOUT, Store, StoreError

log = logging.getLogger("collectives.store")


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
