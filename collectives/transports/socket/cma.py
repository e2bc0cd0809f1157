"""Cross-memory attach: one copy from another process's memory into ours (Linux).

``process_vm_readv`` copies bytes straight from a peer process's address space into a local
buffer, in the kernel, without a shared bounce buffer: one copy per message where the
shared-memory ring (``shm.py``) needs two (into the ring, out of it). The socket transport
uses it between ranks of one host when a probe at setup succeeds in both directions: the
sender announces the address and length of its (still untouched) send buffer over TCP, the
receiver reads it into the posted receive and acknowledges, and only then is the send done.

Permission: reading another process's memory needs ptrace rights over it. Same-uid processes
have them where Yama's ptrace_scope is 0 (or as root); where it is 1 (Ubuntu's default) only
for descendants, unless the target declares any process of the uid its tracer:
``allow_same_user()`` does that (``prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)``, what Open
MPI's shared-memory transport does). That widens who may read this process's memory to every
process of the same user, so it is done only when the transport is about to use CMA, and
$COLLECTIVES_SOCKET_CMA=0 keeps it off. Containers whose seccomp profile forbids the call fail
the probe, and the pair keeps the shared-memory ring.

Cost: one syscall and one kernel copy per message (no copy into and out of a shared ring),
plus the acknowledgement frame. Limits: Linux only; both processes alive for the whole copy
(a sender that dies makes the read fail with ESRCH, which the transport reports as the
peer's death).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_IOV_MAX_BYTES = 1 << 30          # one call moves at most this much; larger reads loop


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                          ctypes.POINTER(_IoVec), ctypes.c_ulong,
                                          ctypes.c_ulong]
        libc.prctl.restype = ctypes.c_int
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def available() -> bool:
    return _LIBC is not None


def allow_same_user() -> bool:
    """Let processes of this user read this process's memory (Yama ptrace_scope 1). False
    where Yama is not active or refuses (EINVAL): then the setup probe decides."""
    if _LIBC is None:
        return False
    return _LIBC.prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0) == 0


def address(array) -> int:
    """The address of a contiguous numpy array's first byte."""
    return array.ctypes.data


def read(pid: int, remote_address: int, into) -> None:
    """Copy ``into.nbytes`` bytes from ``remote_address`` in process ``pid`` into the
    contiguous numpy array ``into``; OSError when the kernel refuses or the process is gone.
    The GIL is released during the copy (ctypes calls release it)."""
    if _LIBC is None:
        raise OSError("process_vm_readv is not available on this system")
    base, total, done = address(into), into.nbytes, 0
    while done < total:
        n = min(total - done, _IOV_MAX_BYTES)
        local = _IoVec(base + done, n)
        remote = _IoVec(remote_address + done, n)
        got = _LIBC.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else 0
            raise OSError(err, f"process_vm_readv from pid {pid}: "
                               f"{os.strerror(err) if err else 'read nothing'}")
        done += got
