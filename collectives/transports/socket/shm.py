"""One-directional shared-memory byte rings for same-host peers of the socket transport.

A channel is one file in /dev/shm (created O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, a random
128-bit name), mapped by exactly two processes: the writer, which created it, and the reader.
The file starts with a 64-byte header holding a random cookie (the reader checks it against
the one it got over the authenticated TCP connection, so it never trusts a file some other
process put under that name), then ``capacity`` bytes of ring. Both sides unlink the name as
soon as they have it mapped, so nothing stays in /dev/shm once setup is over, even if a
process is SIGKILLed later.

The ring holds no indices of its own: the writer announces each chunk (offset, length) and
the reader returns credit (bytes freed) over TCP, so a confused or hostile peer can corrupt
only the bytes of its own messages, never make us read or write outside the mapping. The
ring is a byte ring rather than fixed slots so odd sizes and wrap-around waste nothing;
chunks are at most a quarter of the capacity, so the writer fills the next chunk while the
reader drains the previous one (four chunks in flight: 2 MiB each with the 8 MiB default).

Cost: one memcpy in (writer) and one out (reader, straight into a posted receive), numpy
copies that release the GIL; pages are touched lazily (8 MiB per ordered pair by default).
Limits: Linux (or any system with a tmpfs /dev/shm); both processes must run as one user in
one /dev/shm (the socket transport checks boot id, hostname, network namespace and uid first).
"""
from __future__ import annotations

import hmac
import mmap
import os
import secrets
import stat

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "collectives-shm-"
HEADER_BYTES = 64
COOKIE_BYTES = 32
MIN_CAPACITY = 4096


class ShmError(OSError):
    """A channel could not be created or opened (the pair then stays on TCP)."""


def _path(name: str) -> str:
    if not (name.startswith(PREFIX) and len(name) < 128 and "/" not in name
            and all(c.isalnum() or c == "-" for c in name)):
        raise ShmError(f"refusing shared-memory name {name!r}")
    return os.path.join(SHM_DIR, name)


class Channel:
    """One mapped ring. ``ring`` is a uint8 numpy view of the data area; ``head`` counts
    bytes written (writer) or read (reader) since setup, ``tail`` bytes credited back."""

    def __init__(self, name, cookie, fd, capacity, created):
        self.name, self.cookie, self.capacity = name, cookie, capacity
        self.chunk = max(1, capacity // 4)
        self.created = created
        self._map = mmap.mmap(fd, HEADER_BYTES + capacity, mmap.MAP_SHARED,
                              mmap.PROT_READ | mmap.PROT_WRITE)
        self.ring = np.frombuffer(self._map, np.uint8, capacity, HEADER_BYTES)
        self.head = 0
        self.tail = 0
        self.linked = created

    # -- setup -----------------------------------------------------------------------------

    @classmethod
    def create(cls, capacity: int) -> "Channel":
        if capacity < MIN_CAPACITY:
            raise ShmError(f"shared-memory ring of {capacity} bytes is below {MIN_CAPACITY}")
        name = PREFIX + secrets.token_hex(16)
        path = _path(name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, HEADER_BYTES + capacity)
            cookie = secrets.token_bytes(COOKIE_BYTES)
            channel = cls(name, cookie, fd, capacity, created=True)
            channel._map[:COOKIE_BYTES] = cookie
            return channel
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)

    @classmethod
    def open(cls, name: str, cookie: bytes, capacity: int) -> "Channel":
        path = _path(name)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or (
                    info.st_mode & 0o077):
                raise ShmError(f"{path}: not a private regular file of this user")
            if info.st_size != HEADER_BYTES + capacity or capacity < MIN_CAPACITY:
                raise ShmError(f"{path}: {info.st_size} bytes, expected "
                               f"{HEADER_BYTES + capacity}")
            channel = cls(name, cookie, fd, capacity, created=False)
        finally:
            os.close(fd)
        if not hmac.compare_digest(bytes(channel._map[:COOKIE_BYTES]), cookie):
            channel.close()
            raise ShmError(f"{path}: the cookie does not match")
        channel.linked = True
        return channel

    def unlink(self) -> None:
        """Remove the name (the mappings stay); safe to call from both sides, and twice."""
        if self.linked:
            self.linked = False
            try:
                os.unlink(_path(self.name))
            except FileNotFoundError:
                pass

    # -- data ------------------------------------------------------------------------------

    def free(self) -> int:
        return self.capacity - (self.head - self.tail)

    def close(self) -> None:
        """Unmap. Any numpy view still alive keeps the mapping (mmap refuses to close under
        exported buffers), so a late copy can never touch unmapped memory."""
        self.ring = None
        try:
            self._map.close()
        except BufferError:
            pass              # freed with the last view
