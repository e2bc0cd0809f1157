"""Peer memory: the GPUs of one group map each other's staging memory over NVLink.
docs/peer-memory.md explains the protocol that runs on it (flag words, staging, inboxes,
where outputs land, error words); this module allocates and maps the memory.

Per group, opened once: each rank allocates a small block of flag words and a staging area
(growable) with ``cudaMalloc`` (a whole allocation: an IPC handle names the allocation, never
a piece of a pool), exports both with ``cudaIpcGetMemHandle``, and the handles travel to
every rank through an all_gather on the group's NCCL communicator; each rank opens its
peers' handles (``cudaIpcOpenMemHandle``). The error words live in pinned host memory mapped
into the device, so the host reads what a kernel reported without synchronizing.

``open_peer_memory(transport)`` says whether the group can use it at all: every rank on one
host, each GPU with peer access to every other. Every rank makes the same decision (each sees
every rank's host and GPU), so the group either runs plans on peer memory everywhere or
nowhere. The staging area grows when a call needs more (``ensure``): all ranks of the call
compute the same size from the same plans, so they grow together, through the same
all_gather; the old area is freed once the device is idle. Every such all_gather is bounded: a
rank that never makes the call (so never sends its handle) ends it on the others with
CollectiveTimeout at the call's timeout, and the NCCL communicator is aborted, as any NCCL
wait past its deadline is (the all_gather cannot be withdrawn).

Symmetric memory (``symmetric``): allocations every rank makes together and every peer maps,
handed to the caller as arrays; a call whose output lies in one needs no staging (peers write
into it directly). ``place`` says where an output lies, for the kernel to tell its senders.

Registered buffers (``register``): the caller's own allocations, mapped by every peer once
(collective: every rank registers its buffer at the same point), then used as symmetric
memory is. An IPC handle names a whole allocation, so each rank sends its handle with the
buffer's offset in it, and the driver's buffer id is kept: an output whose allocation is no
longer the one registered (freed and allocated again at the same address) is staged, never
written through the stale mapping. The caller keeps a registered buffer allocated until
``deregister``.

Never uses NVLink multicast (cuMulticastCreate): only point-to-point mappings.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import socket

import numpy as np

from ..errors import CollectiveTimeout, TransportError
from ..kernels.cuda_peer import ABORT_WORD, FLAG_BYTES, HEAP_SHIFT, MAX_HEAPS
from ..kernels.peer_protocol import (ERROR_CLOSED, ERROR_KIND_WORD, ERROR_NONE, ERROR_PEER_WORD,
                                     ERROR_STEP_WORD)

_HANDLE = 64                 # sizeof(cudaIpcMemHandle_t)
_INFO = 64 + 16 + 16         # handle, host digest, PCI bus id
_LAZY_PEER_ACCESS = 1        # cudaIpcMemLazyEnablePeerAccess
_MAPPED = 2                  # cudaHostAllocMapped
_NCCL_UINT8 = 1


class _Heap:
    """A symmetric allocation (``owned``: the group allocated it) or a registered buffer: this
    rank's pointer and bytes, every rank's as mapped here, what to close, and (registered
    only) the driver's id of the allocation it lies in."""
    __slots__ = ("ptr", "nbytes", "peers", "owned", "opened", "buffer_id")

    def __init__(self, ptr, nbytes, peers, owned, opened=(), buffer_id=None):
        self.ptr, self.nbytes, self.peers, self.owned = ptr, nbytes, peers, owned
        self.opened, self.buffer_id = list(opened), buffer_id


class _Driver:
    """The driver calls registration needs that CuPy does not bind (loaded once)."""
    BUFFER_ID, IPC_CAPABLE, RANGE_START, RANGE_SIZE = 7, 10, 11, 12   # CUpointer_attribute
    _lib = None

    @classmethod
    def attribute(cls, ptr: int, attribute: int) -> int:
        if cls._lib is None:
            lib = ctypes.CDLL("libcuda.so.1")
            lib.cuPointerGetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int,
                                                  ctypes.c_uint64]
            lib.cuPointerGetAttribute.restype = ctypes.c_int
            cls._lib = lib
        value = ctypes.c_uint64(0)
        rc = cls._lib.cuPointerGetAttribute(ctypes.byref(value), attribute, ptr)
        if rc != 0:
            raise RuntimeError(f"cuPointerGetAttribute({attribute}) failed with CUresult {rc}")
        return value.value

    @classmethod
    def allocation(cls, ptr: int) -> tuple:
        """(start, bytes, legacy IPC capable, buffer id) of the allocation ``ptr`` lies in."""
        return (cls.attribute(ptr, cls.RANGE_START), cls.attribute(ptr, cls.RANGE_SIZE),
                bool(cls.attribute(ptr, cls.IPC_CAPABLE) & 0xFFFFFFFF),
                cls.attribute(ptr, cls.BUFFER_ID))

    @classmethod
    def buffer_id(cls, ptr: int) -> int:
        return cls.attribute(ptr, cls.BUFFER_ID)


def _host_digest() -> bytes:
    """What tells this host from others: the boot id where Linux has one, plus the name."""
    try:
        boot = open("/proc/sys/kernel/random/boot_id", "rb").read()
    except OSError:
        boot = b""
    return hashlib.sha256(boot + socket.gethostname().encode()).digest()[:16]


class PeerMemory:
    """Flags and staging memory of one group's ranks, mapped into every rank."""

    def __init__(self, transport):
        import cupy
        self.cupy = cupy
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        runtime = cupy.cuda.runtime
        with cupy.cuda.Device(transport.device):
            self.flags_ptr = runtime.malloc(FLAG_BYTES)
            with self._landed() as stream:
                runtime.memsetAsync(self.flags_ptr, 0, FLAG_BYTES, stream.ptr)
            self.peer_flags, self._opened = self._share(self.flags_ptr)
            with self._landed():
                self.peer_flags_array = cupy.asarray(np.array(self.peer_flags, np.uint64))
            self._error_host = runtime.hostAlloc(16, _MAPPED)
            ctypes.memset(self._error_host, 0, 16)
            # the error words (kind, step, peer): 0s until a kernel reports; None once closed
            self.words = (ctypes.c_int32 * 4).from_address(self._error_host)
            self.error_ptr = self._error_host    # unified addressing: the same pointer
        self.data_ptr, self.capacity = 0, 0
        self.peer_data, self.peer_data_array = [], None
        self.inbox_ptr, self.inbox_half = 0, 0
        self.peer_inbox, self.peer_inbox_array = [], None
        self.lines_ptr, self.lines_half = 0, 0          # the inbox of messages in lines
        self.peer_lines, self.peer_lines_array = [], None
        # symmetric allocations and registered buffers (_Heap; None: a slot deregistered);
        # the peers' addresses in one device array, [heap][rank], that never moves
        self.heaps = []
        self.places = {}            # place()'s answers that cannot change while heaps do not
        with cupy.cuda.Device(transport.device), self._landed():
            self.peer_heaps_array = cupy.zeros(MAX_HEAPS * self.size, np.uint64)
        self.last_stream = None
        self.layout = object()      # replaced whenever an area moves (ensure)

    # -- opening -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _landed(self):
        """Writes of what kernels read (the peers' addresses) on a stream of their own,
        finished on leaving: a kernel may run on any stream, and one copy queued on the
        caller's current stream behind long work would land after kernels on another."""
        stream = self.cupy.cuda.Stream(non_blocking=True)
        with stream:
            yield stream
        stream.synchronize()

    def _share(self, start, offset: int = 0, what: str = "peer memory",
               timeout: float | None = None) -> tuple:
        """(every rank's address of its memory ``offset`` bytes into its allocation at
        ``start``, as mapped here; the peers' allocations this rank opened), through an
        all_gather of the IPC handles and offsets over the group's communicator. Every rank
        maps every peer's memory or none does: a rank that could not open one says so in a
        second all_gather, and then every rank closes what it opened and raises, naming it
        (a rank that went on alone would have senders write through mappings they lack)."""
        runtime = self.cupy.cuda.runtime
        handle = bytes(runtime.ipcGetMemHandle(start))
        blobs = _all_gather(self.transport, handle + int(offset).to_bytes(8, "little"),
                            what, timeout)
        out, opened, why = [], [], ""
        for r, blob in enumerate(blobs):
            if r == self.rank:
                out.append(start + offset)
                continue
            try:
                base = runtime.ipcOpenMemHandle(blob[:_HANDLE], _LAZY_PEER_ACCESS)
            except Exception as exc:          # noqa: BLE001 (every rank hears of it)
                why = f"rank {r}'s: {exc}"
                break
            opened.append(base)
            out.append(base + int.from_bytes(blob[_HANDLE:_HANDLE + 8], "little"))
        failed = [r for r, b in enumerate(_all_gather(self.transport, b"\1" if why else b"\0",
                                                      what, timeout)) if b[0]]
        if failed:
            for q in opened:
                runtime.ipcCloseMemHandle(q)
            mine = f" ({why})" if why else ""
            raise TransportError(f"{what} on rank {self.rank}: rank(s) "
                                 f"{', '.join(map(str, failed))} could not map a peer's "
                                 f"memory{mine}; no rank mapped it")
        return out, opened

    def ensure(self, nbytes: int, inbox: int = 0, lines: int = 0, what: str = "peer memory",
               timeout: float | None = None) -> None:
        """Staging memory of at least ``nbytes``, inbox halves of at least ``inbox`` bytes and
        halves of the inbox of lines of at least ``lines`` bytes on every rank (collective:
        every rank of the call asks for the same sizes at the same call). Inboxes are
        separate allocations, zeroed (a line's flag 0 never matches), whose halves stay where
        they are until they grow. ``what`` names the call that grows them and ``timeout`` bounds
        the wait for the other ranks (the transport's own when None)."""
        if nbytes <= self.capacity and inbox <= self.inbox_half and lines <= self.lines_half:
            return
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        with cupy.cuda.Device(self.transport.device):
            runtime.deviceSynchronize()          # nothing of this rank may still use them
            # entries place themselves again; each area is released and forgotten before its
            # allocation, so an exchange that fails (a rank that never calls, or one that
            # cannot map) leaves no freed pointer behind
            self.layout = object()
            if nbytes > self.capacity:
                self._release(self.peer_data, self.data_ptr)
                grown = max(nbytes, 2 * self.capacity, 1 << 20)
                self.data_ptr, self.capacity, self.peer_data = 0, 0, []
                self.data_ptr, self.peer_data, self.peer_data_array = \
                    self._allocate(grown, zeroed=False, what=what, timeout=timeout)
                self.capacity = grown
            if inbox > self.inbox_half or self.inbox_ptr == 0:
                self._release(self.peer_inbox, self.inbox_ptr)
                grown = max(inbox, 2 * self.inbox_half, 1 << 16)
                self.inbox_ptr, self.inbox_half, self.peer_inbox = 0, 0, []
                self.inbox_ptr, self.peer_inbox, self.peer_inbox_array = \
                    self._allocate(2 * grown, zeroed=True, what=what, timeout=timeout)
                self.inbox_half = grown
            if lines > self.lines_half or self.lines_ptr == 0:
                self._release(self.peer_lines, self.lines_ptr)
                grown = max(lines, 2 * self.lines_half, 1 << 16)
                self.lines_ptr, self.lines_half, self.peer_lines = 0, 0, []
                self.lines_ptr, self.peer_lines, self.peer_lines_array = \
                    self._allocate(2 * grown, zeroed=True, what=what, timeout=timeout)
                self.lines_half = grown

    def _allocate(self, nbytes: int, zeroed: bool, what: str = "peer memory",
                  timeout: float | None = None):
        """(this rank's pointer, every rank's address as mapped here, those as a device
        array) of a new allocation of ``nbytes`` on every rank (collective)."""
        runtime = self.cupy.cuda.runtime
        ptr = runtime.malloc(nbytes)
        if zeroed:      # (cudaMemset's legacy stream does not order non-blocking ones)
            with self._landed() as stream:
                runtime.memsetAsync(ptr, 0, nbytes, stream.ptr)
        try:
            peers, _ = self._share(ptr, what=what, timeout=timeout)
        except TransportError:
            runtime.free(ptr)
            raise
        with self._landed():
            return ptr, peers, self.cupy.asarray(np.array(peers, np.uint64))

    def _slot(self, what: str) -> int:
        """The heap slot the next symmetric allocation or registration takes (every rank
        alike: they come in the same order)."""
        for h, heap in enumerate(self.heaps):
            if heap is None:
                return h
        if len(self.heaps) >= MAX_HEAPS:
            raise ValueError(f"{what} on rank {self.rank}: at most {MAX_HEAPS} symmetric "
                             f"allocations and registered buffers per group (this group has "
                             f"{len(self.heaps)}); use fewer, larger ones, or deregister one")
        self.heaps.append(None)
        return len(self.heaps) - 1

    def _keep(self, h: int, heap: _Heap) -> None:
        self.heaps[h] = heap
        self.places.clear()
        with self._landed():
            self.peer_heaps_array[h * self.size:(h + 1) * self.size] = \
                self.cupy.asarray(np.array(heap.peers, np.uint64))

    def symmetric(self, nbytes: int):
        """A new symmetric allocation of ``nbytes`` on this rank, mapped by every peer
        (collective: every rank of the group calls it, in the same order; sizes may differ).
        Its memory stays until the group closes. Returns the allocation's pointer."""
        h = self._slot("symmetric memory")
        nbytes = max(int(nbytes), 256)
        with self.cupy.cuda.Device(self.transport.device):
            ptr, peers, _ = self._allocate(nbytes, zeroed=True, what="symmetric memory")
            self._keep(h, _Heap(ptr, nbytes, peers, owned=True,
                                opened=[q for r, q in enumerate(peers) if r != self.rank]))
        return ptr

    def register(self, ptr: int, nbytes: int, what: str = "register_buffer") -> None:
        """Map this rank's buffer at ``ptr`` (``nbytes``, in a cudaMalloc allocation) into
        every peer (collective: every rank registers one buffer, in the same order; sizes
        may differ). A rank whose buffer cannot be mapped makes every rank raise, naming it."""
        if self.find(ptr, nbytes) is not None:
            why = "it is registered already (or lies in symmetric memory)"
        else:
            why = ""
        start, buffer_id = 0, 0
        with self.cupy.cuda.Device(self.transport.device):
            if not why:
                try:
                    start, size, capable, buffer_id = _Driver.allocation(ptr)
                    if not capable:
                        why = ("its allocation cannot be shared through CUDA IPC (a virtual "
                               "memory mapping, as torch's expandable segments make)")
                    elif not (start <= ptr and ptr + nbytes <= start + size):
                        why = "it does not lie in one allocation"
                except Exception as exc:       # a CUDA without the attributes, a host pointer
                    why = f"the driver cannot describe it ({exc})"
            failed = [r for r, b in enumerate(_all_gather(self.transport,
                                                          b"\1" if why else b"\0")) if b[0]]
            if failed:
                mine = f": {why}" if why else ""
                raise ValueError(f"{what} on rank {self.rank}: the buffer of rank(s) "
                                 f"{', '.join(map(str, failed))} cannot be mapped by the "
                                 f"peers{mine}; no rank registered its buffer")
            h = self._slot(what)
            try:
                peers, opened = self._share(start, ptr - start, what)
            except TransportError:
                self.heaps[h] = None            # every rank alike: the slot stays free
                raise
            self._keep(h, _Heap(ptr, nbytes, peers, owned=False, opened=opened,
                                buffer_id=buffer_id))

    def deregister(self, ptr: int, what: str = "deregister_buffer") -> None:
        """Forget the registered buffer at ``ptr`` on every rank (collective: every rank
        deregisters its own, in the same order), once no kernel of this rank still runs."""
        h = next((h for h, heap in enumerate(self.heaps) if heap is not None and
                  not heap.owned and heap.ptr == ptr), None)
        flags = _all_gather(self.transport, b"\0" if h is not None else b"\1")
        failed = [r for r, b in enumerate(flags) if b[0]]
        if failed:
            raise ValueError(f"{what} on rank {self.rank}: rank(s) "
                             f"{', '.join(map(str, failed))} have no registered buffer "
                             f"starting there; nothing was deregistered")
        runtime = self.cupy.cuda.runtime
        with self.cupy.cuda.Device(self.transport.device):
            runtime.deviceSynchronize()          # no kernel of this rank writes through it
            with self._landed():
                self.peer_heaps_array[h * self.size:(h + 1) * self.size] = 0
            for q in self.heaps[h].opened:
                runtime.ipcCloseMemHandle(q)
        self.heaps[h] = None
        self.places.clear()

    def find(self, ptr: int, nbytes: int):
        """The heap slot holding [ptr, ptr + nbytes), or None."""
        for h, heap in enumerate(self.heaps):
            if heap is not None and heap.ptr <= ptr and ptr + nbytes <= heap.ptr + heap.nbytes:
                return h
        return None

    def place(self, array) -> int:
        """Where peers write this rank's output ``array`` (``cuda_peer.PLACE_WORDS``): 0
        (the staging memory) unless it lies whole in a symmetric allocation or a registered
        buffer whose allocation is still the one registered. Asked on every call: answers
        that only the heaps decide (outside every heap, or in a symmetric allocation, which
        stays until the group ends) are kept until the heaps change; one in a registered
        buffer asks the driver each time (its allocation may have been freed and made
        again). The search is linear in the heaps, which stay few (one per buffer size a
        job allocates symmetrically)."""
        if array is None or not self.heaps:
            return 0
        start, nbytes = array.data.ptr, array.nbytes
        known = self.places.get((start, nbytes))
        if known is not None:
            return known
        h = self.find(start, nbytes)
        heap = None if h is None else self.heaps[h]
        place = 0 if heap is None else ((h + 1) << HEAP_SHIFT) | (start - heap.ptr)
        if heap is not None and heap.buffer_id is not None:     # registered: asked each time
            # freed and allocated again since it was registered: staged
            return place if _Driver.buffer_id(start) == heap.buffer_id else 0
        if len(self.places) >= 4096:
            self.places.clear()
        self.places[(start, nbytes)] = place
        return place

    # -- errors --------------------------------------------------------------------------

    def error(self):
        """(kind, step, peer) the kernel reported, or None: read from mapped host memory.
        (ERROR_CLOSED, -1, rank) once the memory is closed."""
        words = self.words
        if words is None:
            return ERROR_CLOSED, -1, self.rank
        if words[ERROR_KIND_WORD] == ERROR_NONE:
            return None
        return (int(words[ERROR_KIND_WORD]), int(words[ERROR_STEP_WORD]),
                int(words[ERROR_PEER_WORD]))

    def raise_abort(self, peers: bool) -> None:
        """Set this rank's abort word (and every peer's, with ``peers``): a kernel of this
        group still waiting stops at its next poll. Written from a stream of its own, which a
        running kernel does not block."""
        cupy = self.cupy
        runtime = cupy.cuda.runtime
        word = np.array([self.rank + 1], np.uint64)
        stream = cupy.cuda.Stream(non_blocking=True)
        targets = self.peer_flags if peers else [self.flags_ptr]
        for base in targets:
            runtime.memcpyAsync(base + 8 * ABORT_WORD, word.ctypes.data, 8, 1, stream.ptr)
        stream.synchronize()

    # -- closing -------------------------------------------------------------------------

    def _release(self, mapped, own):
        runtime = self.cupy.cuda.runtime
        for r, ptr in enumerate(mapped):
            if r != self.rank:
                runtime.ipcCloseMemHandle(ptr)
        if own:
            runtime.free(own)

    def close(self, abort_peers: bool = False):
        """Free everything (once). A kernel of this rank still waiting is stopped first; with
        ``abort_peers`` (this rank gave up a call) the peers' kernels too, instead of each
        spinning to its own deadline."""
        runtime = self.cupy.cuda.runtime
        if not self.flags_ptr:
            return
        try:
            with self.cupy.cuda.Device(self.transport.device):
                self.raise_abort(abort_peers)
                runtime.deviceSynchronize()
                self._release(self.peer_data, self.data_ptr)
                self._release(self.peer_inbox, self.inbox_ptr)
                self._release(self.peer_lines, self.lines_ptr)
                for heap in self.heaps:
                    if heap is not None:
                        for q in heap.opened:
                            runtime.ipcCloseMemHandle(q)
                        if heap.owned:
                            runtime.free(heap.ptr)
                self.heaps, self.places = [], {}
                self.data_ptr = self.inbox_ptr = self.lines_ptr = 0
                self.peer_data, self.peer_inbox, self.peer_lines = [], [], []
                for ptr in self._opened:
                    runtime.ipcCloseMemHandle(ptr)
                self._opened = []
                if self.flags_ptr:
                    runtime.free(self.flags_ptr)
                    self.flags_ptr = 0
                if self._error_host:
                    self.words = None
                    runtime.freeHost(self._error_host)
                    self._error_host = 0
        except Exception:          # closing after a failed call: the process frees it all
            pass


def _all_gather(transport, blob: bytes, what: str = "peer memory",
                timeout: float | None = None) -> list:
    """Every rank's ``blob`` (all of one length) through the group's NCCL communicator,
    waited for at most ``timeout`` seconds (the transport's own when None): past it the
    communicator is aborted and CollectiveTimeout names ``what`` and this rank.

    The blob's copy to the device, the all_gather and the copy back all run on one stream of
    their own, in that order. The copy to the device once ran on the caller's current stream
    and the all_gather on this one, unordered: behind long work queued by the caller (a
    bench's 256 MiB fills) the all_gather read the send buffer before the blob reached it,
    and the ranks opened stale handles (cudaErrorInvalidValue on 4 x H100; a stale handle of
    an allocation already open maps the wrong memory)."""
    cupy = transport.xp
    n = len(blob)
    with cupy.cuda.Device(transport.device):
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            send = cupy.asarray(np.frombuffer(blob, np.uint8))
            recv = cupy.empty(n * transport.size, np.uint8)
            transport.comm.allGather(send.data.ptr, recv.data.ptr, n, _NCCL_UINT8, stream.ptr)
            limit = transport.timeout if timeout is None else timeout
            try:
                transport.synchronize(limit, what)
            except CollectiveTimeout:
                raise CollectiveTimeout(
                    f"{what} on rank {transport.rank}: an exchange among every rank of the "
                    f"group (over NCCL, growing or opening peer memory) waited {limit} s for "
                    f"some rank that did not make this call; the NCCL communicator was "
                    f"aborted") from None
            out = recv.get().tobytes()
    return [out[r * n:(r + 1) * n] for r in range(transport.size)]


def reachable(transport) -> tuple[bool, str]:
    """Whether every rank of ``transport``'s group is on this host with peer access to every
    other rank's GPU; the same answer on every rank (collective: every rank must call it)."""
    cupy = transport.xp
    runtime = cupy.cuda.runtime
    bus = runtime.deviceGetPCIBusId(transport.device).encode()[:16].ljust(16, b"\0")
    infos = _all_gather(transport, _host_digest() + bus)
    verdicts = []
    for r, info in enumerate(infos):
        host, theirs = info[:16], info[16:].rstrip(b"\0").decode()
        if host != infos[0][:16]:
            verdicts.append(f"rank {r} is on another host")
            continue
        if r == transport.rank:
            continue
        try:
            device = runtime.deviceGetByPCIBusId(theirs)
            ok = runtime.deviceCanAccessPeer(transport.device, device)
        except Exception:
            ok = False
        if not ok:
            verdicts.append(f"rank {transport.rank} has no peer access to rank {r}'s GPU")
    # every rank's verdict, so all decide alike
    flag = b"\1" if verdicts else b"\0"
    if any(v == b"\1" for v in _all_gather(transport, flag)):
        return False, "; ".join(verdicts) or "another rank has no peer access"
    return True, f"{transport.size} GPUs of one host with peer access"


def open_peer_memory(transport):
    """(PeerMemory or None, why)."""
    ok, why = reachable(transport)
    if not ok:
        return None, why
    return PeerMemory(transport), why
