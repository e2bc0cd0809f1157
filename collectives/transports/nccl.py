"""The NCCL transport: one CuPy ``NcclCommunicator`` per group, one GPU per rank.

Every operation is **stream-ordered and asynchronous**. A collective (any algorithm, native
included) is enqueued on the caller's current CuPy stream (``cupy.cuda.get_current_stream()``;
for torch CUDA tensors the facade makes torch's current stream CuPy's current stream) and the
call returns as soon as it is enqueued. So:

* ``Work.wait()`` / returning from a synchronous call means: *ordered on the stream*. Any
  later kernel on that stream sees the result; the host does not (yet).
* The facade enqueues on torch's current stream when a buffer is a torch CUDA tensor, else on
  CuPy's current stream, both read in the calling thread when the call is made, on this rank's
  GPU (``call_scope``): an ``async_op=True`` collective, which the group's worker thread runs
  later, still lands on the caller's device and stream.
* Host completion: ``cupy.cuda.get_current_stream().synchronize()`` (or ``torch.cuda.
  synchronize()``), or ``transport.synchronize(timeout)``, which polls the stream, raises
  ``CollectiveTimeout`` after ``timeout`` seconds (aborting the communicator, since a hung
  NCCL kernel never returns on its own) and reports NCCL's asynchronous errors.
* ``isend``/``irecv`` (the generic point-to-point contract) are batched: they are issued
  together, in one NCCL group, when one of them is waited on, so a rank may post a send
  before the matching receive without deadlocking; ``wait``/``wait_all`` synchronize the host.

The device of a rank: ``LOCAL_RANK`` (our launcher, torchrun) or the local rank under
mpiexec (``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``, ``PMI_LOCAL_RANK``), modulo the
visible device count; else the global rank modulo it. The NCCL unique id travels through the
store, or through MPI (mpi4py ``bcast``) when there is no store (``init_process_group("nccl")``
under mpiexec). The store must belong to this
job alone (a fresh file or port per launch): nothing in a store tells one job's id from an
earlier job's. Two guards make a reused store less dangerous: the key names the world size
(a 2-rank job never reads a 4-rank job's id), and rank 0 deletes the id once the
communicator exists (every rank has joined, so every rank has read it), so a job that got
that far leaves no id behind. An id left by a job that crashed before that point is still
read by the next job of the same size on the same store: NCCL then hangs in init.

Shutdown: ``close()`` waits (bounded) for the stream, destroys the CUDA graphs captured on
this communicator (NCCL >= 2.26 ``ncclCommDestroy`` and ``ncclCommAbort`` wait for every such
graph to be destroyed: a cached graph left alive hangs the process in ``close`` for ever),
then destroys the communicator, or aborts it when the GPU work did not finish.

Point-to-point bandwidth: NCCL cuts each send/recv into chunks of ``NCCL_P2P_NVL_CHUNKSIZE``
bytes (default 512 KiB) over NVLink. With that default a large send moves markedly less
over NVLink than with 64 KiB chunks, and our schedules, made of send/recv, inherit it
(BENCHMARKS.md has the p2p sweep). So ``create`` sets ``NCCL_P2P_NVL_CHUNKSIZE`` to
$COLLECTIVES_NCCL_P2P_CHUNKSIZE (default 65536; ``0`` leaves NCCL's default) unless it is
already set. NCCL reads it once per process, at its first communicator: a process that
created an NCCL communicator before ours (torch's, say) keeps the value it started with. It
changes NCCL's send/recv only (torch's, and ``native``'s grouped send/recv, included); NCCL's
collective kernels do not cut by it.

``native`` exposes NCCL's own collectives (allReduce, reduceScatter, allGather, broadcast,
reduce; all_to_all, gather and scatter as grouped send/recv; uneven reduce_scatter and
all_gather as grouped reduce/broadcast). Plans run through ``collectives.executors.nccl``.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

from .. import settings
from ..auth import job_secret, secret_hint, sign, signed_value
from ..errors import CollectiveTimeout, TransportError
from ..kernels.reduce import BFLOAT16
from ..ops import ReduceOp
from .base import Request, Transport

LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                        "PMI_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
_UID_KEY = "collectives/nccl/unique_id"
_STREAMS_KEPT = 64                # CuPy wrappers of torch streams kept (torch pools its own)
_UID_BYTES = 128                  # NCCL_UNIQUE_ID_BYTES
NCCL_UINT8 = 1                    # ncclUint8: data movement goes as bytes, whatever the dtype
MEMCPY_D2D = 3                    # cudaMemcpyDeviceToDevice

# numpy dtype -> ncclDataType_t, for reductions (data movement always goes as bytes)
_NCCL_TYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
               np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
               np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8}
_BFLOAT16_TYPE, _BFLOAT16_SINCE = 9, 21000       # ncclBfloat16 exists from NCCL 2.10
_NCCL_OPS = {ReduceOp.SUM: 0, ReduceOp.PRODUCT: 1, ReduceOp.MAX: 2, ReduceOp.MIN: 3}
# bool travels as uint8 0/1: or = max, and = min (torch's NCCL backend does the same)
_BOOL_OPS = {ReduceOp.SUM: 2, ReduceOp.MAX: 2, ReduceOp.BOR: 2,
             ReduceOp.PRODUCT: 3, ReduceOp.MIN: 3, ReduceOp.BAND: 3}


def available() -> tuple[bool, str]:
    """(usable, why): CuPy importable, its NCCL bindings present, at least one GPU visible.
    Never raises, whatever is missing."""
    try:
        import cupy
    except Exception as exc:           # ImportError, or a CUDA library that fails to load
        return False, f"cupy is not importable ({type(exc).__name__}: {exc}); install the " \
                      f"cuda12 or cuda13 extra"
    try:
        from cupy.cuda import nccl
        if not getattr(nccl, "available", False):
            return False, "this CuPy was built without NCCL"
        version = nccl.get_version()
    except Exception as exc:
        return False, f"cupy.cuda.nccl is not usable ({type(exc).__name__}: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"no CUDA device ({type(exc).__name__}: {exc})"
    if count < 1:
        return False, "no CUDA device is visible"
    return True, f"{count} GPU(s), NCCL {version}, CuPy {cupy.__version__}"


def local_rank(rank: int) -> int:
    for name in LOCAL_RANK_VARIABLES:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"{name}={value!r} is not an integer") from None
    return rank


def create(rank: int, world_size: int, store=None, timeout: float = 1800.0,
           device: int | None = None) -> "NcclTransport":
    """``device``: this rank's GPU; by default the local rank's (see the module notes). The
    torch backend passes the GPU of the tensors that bring a group to CUDA."""
    import cupy
    from cupy.cuda import nccl

    if not (isinstance(rank, int) and isinstance(world_size, int) and 0 <= rank < world_size):
        raise ValueError(f"nccl: rank {rank!r} is out of range for world size {world_size!r}")
    if device is None:
        device = local_rank(rank) % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    _tune_point_to_point()
    uid = _exchange_unique_id(rank, world_size, store, timeout, nccl)
    try:
        comm = _communicator(nccl, world_size, uid, rank)
    except nccl.NcclError as exc:
        raise TransportError(f"nccl: rank {rank} could not join the communicator of "
                             f"{world_size} ranks on GPU {device}: {exc}") from exc
    _forget_unique_id(rank, world_size, store)
    transport = NcclTransport(comm, rank, world_size, device, timeout)
    # GPUs of one host may run plans in peer memory (executors.peer decides, collectively)
    transport.offers = frozenset({"stream", "peer_memory"})
    return transport


def _tune_point_to_point() -> None:
    """Smaller NVLink p2p chunks before NCCL's first communicator (see the module notes)."""
    chunk = settings.NCCL_P2P_CHUNKSIZE()
    if chunk > 0:
        os.environ.setdefault("NCCL_P2P_NVL_CHUNKSIZE", str(chunk))


def _flatten(buffers):
    for b in buffers:
        if isinstance(b, (list, tuple)):
            yield from _flatten(b)
        else:
            yield b


def _communicator(nccl, world_size, uid, rank):
    """CuPy 14 takes the unique id as bytes, older CuPy as a tuple of signed chars; a wrong
    type fails while converting the argument, before NCCL is called, so retrying is safe."""
    try:
        return nccl.NcclCommunicator(world_size, bytes(b & 0xFF for b in uid), rank)
    except TypeError:
        return nccl.NcclCommunicator(world_size, tuple(b - 256 if b > 127 else b for b in uid), rank)


def _uid_key(world_size: int) -> str:
    return f"{_UID_KEY}/{world_size}"


def _forget_unique_id(rank, world_size, store) -> None:
    """Rank 0, once the communicator exists: no later job may read this id."""
    if store is None or rank != 0 or world_size == 1:
        return
    try:
        store.delete_key(_uid_key(world_size))
    except Exception:          # a store without delete (or gone): only the guard is lost
        pass


def _exchange_unique_id(rank, world_size, store, timeout, nccl) -> tuple:
    """Rank 0 makes the id; the others read it from the store or receive it through MPI."""
    if world_size == 1:
        return nccl.get_unique_id()
    if store is not None:
        # The id says where rank 0's NCCL listens: signed with the job secret, so that whoever
        # may write an unauthenticated store (torch's TCPStore) cannot send the ranks elsewhere.
        key, secret = _uid_key(world_size), job_secret()
        if rank == 0:
            uid = nccl.get_unique_id()
            store.set(key, sign(secret, key, bytes(b & 0xFF for b in uid)))
            return uid
        raw = store.get(key)
        uid = signed_value(secret, key, raw)
        if uid is None:
            raise TransportError(f"nccl on rank {rank}: the NCCL unique id under {key!r} in "
                                 f"the store failed authentication: it was not written by "
                                 f"rank 0 of this job, or the ranks hold different secrets "
                                 f"({secret_hint()})")
        if len(uid) != _UID_BYTES:
            raise TransportError(f"nccl on rank {rank}: the store holds {len(uid)} bytes under "
                                 f"{key!r}, not a {_UID_BYTES}-byte NCCL unique id")
        return uid
    try:
        from mpi4py import MPI
    except ImportError:
        raise ValueError(f"nccl on rank {rank}: no store was given and mpi4py is missing, so "
                         f"the NCCL unique id cannot travel; pass a store (init_method) or "
                         f"run under mpiexec with mpi4py") from None
    world = MPI.COMM_WORLD
    if world.Get_size() != world_size:
        raise ValueError(f"nccl on rank {rank}: without a store the id goes through "
                         f"MPI.COMM_WORLD, whose size {world.Get_size()} is not the world size "
                         f"{world_size}")
    return world.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)


class NcclTransport(Transport):
    name = "nccl"
    max_tag = None          # NCCL has no tags: a pair's messages match in posting order
    offers = frozenset({"stream"})

    def __init__(self, comm, rank, size, device, timeout=1800.0):
        import cupy
        from cupy.cuda import nccl
        self.comm = comm
        self.nccl = nccl
        self.xp = cupy
        self.rank = rank
        self.size = size
        self.device = device
        self.timeout = timeout
        self.version = nccl.get_version()
        self._comm_stream = None
        self._scratch: dict = {}
        self._streams: dict = {}          # torch's raw stream -> its CuPy ExternalStream
        self._pending: list = []
        self._aborted = False
        self.native = NcclNative(self)

    @property
    def aborted(self) -> bool:
        """Whether the communicator was aborted (a timeout, an error, ``abort``) rather than
        destroyed in order: peers may still wait for this rank's part."""
        return self._aborted

    # -- what the executor needs ---------------------------------------------------------

    def _callers_stream(self, buffers):
        """The stream the caller's tensors are ordered on: torch's current stream when any
        buffer is a torch CUDA tensor, else CuPy's current stream (both are per thread)."""
        cupy = self.xp
        torch = sys.modules.get("torch")
        if torch is not None and any(isinstance(b, torch.Tensor) and b.is_cuda
                                     for b in _flatten(buffers)):
            # the raw handle, and one CuPy wrapper per stream: torch.cuda.current_stream and
            # a new ExternalStream at every call cost more than the rest of the launch
            raw = torch._C._cuda_getCurrentRawStream(self.device)
            stream = self._streams.get(raw)
            if stream is None:
                if len(self._streams) >= _STREAMS_KEPT:
                    self._streams.clear()
                stream = self._streams[raw] = cupy.cuda.ExternalStream(raw, self.device)
            return stream
        return cupy.cuda.get_current_stream()

    def call_scope(self, buffers):
        """This rank's GPU and the caller's stream (``_callers_stream``), read now, in the
        caller's thread."""
        cupy = self.xp
        stream = self._callers_stream(buffers)
        device = cupy.cuda.Device(self.device)

        @contextlib.contextmanager
        def scope():
            with device, stream:
                yield
        return scope

    def enqueued(self, buffers):
        """An event recorded now on the call's stream (we are inside its scope); a wait
        orders the waiting thread's current stream after it, the host never blocks."""
        cupy = self.xp
        event = cupy.cuda.Event(disable_timing=True)
        event.record()

        def order_after():
            with cupy.cuda.Device(self.device):
                self._callers_stream(buffers).wait_event(event)
        return (lambda: event.done), order_after

    def comm_stream(self):
        """The private stream transfers run on when a plan is pipelined."""
        if self._comm_stream is None:
            self._comm_stream = self.xp.cuda.Stream(non_blocking=True)
        return self._comm_stream

    def scratch(self, count: int, dtype):
        """Working space, kept between calls (allocation would break graph capture and costs
        a pool lookup each time). One per (stream, dtype): work on one stream is ordered."""
        stream = self.xp.cuda.get_current_stream().ptr
        key = (stream, np.dtype(dtype).str)
        buf = self._scratch.get(key)
        if buf is None or buf.size < count:
            buf = self.xp.empty(count, dtype=dtype)
            self._scratch[key] = buf
        return buf[:count]

    # -- host completion -----------------------------------------------------------------

    def synchronize(self, timeout: float | None = None, operation: str = "synchronize"):
        """Wait on the host for everything enqueued on the current stream; check NCCL."""
        stream = self.xp.cuda.get_current_stream()
        event = stream.record()
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 1e-5
        while not event.done:
            self._check_async(operation)
            if deadline is not None and time.monotonic() > deadline:
                self._abort()
                raise CollectiveTimeout(f"{operation} on rank {self.rank}: the GPU work did "
                                        f"not finish within {timeout} s; the NCCL "
                                        f"communicator was aborted")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        self._check_async(operation)

    def _check_async(self, operation):
        try:
            self.comm.check_async_error()
        except self.nccl.NcclError as exc:
            raise TransportError(f"{operation} on rank {self.rank}: NCCL reported {exc}") from exc
        self.check_errors(operation)      # what device work of an executor reported

    # -- generic point-to-point (batched into one group at the first wait) ----------------

    def isend(self, buf, peer, tag=0):
        self.check_peer(peer, "send")
        return self._post("send", buf, peer)

    def irecv(self, buf, peer, tag=0):
        self.check_peer(peer, "recv")
        return self._post("recv", buf, peer)

    def _post(self, kind, buf, peer):
        if not isinstance(buf, self.xp.ndarray):
            raise TypeError(f"{kind} on rank {self.rank}: the nccl backend moves CuPy/CUDA "
                            f"arrays, got {type(buf).__name__}")
        request = _NcclRequest(self, kind, buf, peer)
        self._pending.append(request)
        return request

    def flush(self):
        """Issue every posted isend/irecv in one NCCL group on the current stream."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        stream = self.xp.cuda.get_current_stream().ptr
        self.nccl.groupStart()
        try:
            for req in pending:
                call = self.comm.send if req.kind == "send" else self.comm.recv
                call(req.buf.data.ptr, req.buf.nbytes, NCCL_UINT8, req.peer, stream)
        finally:
            self.nccl.groupEnd()
        for req in pending:
            req.issued = True

    def wait_all(self, requests, timeout=None):
        """A timeout aborts the communicator (NCCL cannot withdraw a posted receive, and the
        stream would wait behind it for ever): every later wait raises, none succeeds
        without its data."""
        if self._aborted and requests:
            raise TransportError(f"{requests[0].kind} with rank {requests[0].peer} on rank "
                                 f"{self.rank}: the NCCL communicator was aborted (after a "
                                 f"timeout or an error); this transfer will never complete")
        self.flush()
        if requests:
            self.synchronize(timeout, operation=f"{requests[0].kind} with rank {requests[0].peer}")
        for req in requests:
            req.completed = True

    @property
    def mpi_running(self) -> bool:
        """Whether MPI is initialized in this process (mpiexec, the unique id through MPI, or
        the program's own mpi4py): then MPI_Finalize at exit waits for every rank."""
        MPI = sys.modules.get("mpi4py.MPI")
        return MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized()

    def abort(self, reason: str, code: int = 1) -> None:
        """End this rank's part of the job now: ncclCommAbort (peers blocked on this rank in
        NCCL calls are left to the launcher, which stops them once this process exits), and
        MPI_Abort where MPI runs, since MPI_Finalize would wait for those peers."""
        self._abort()
        if self.mpi_running:
            sys.modules["mpi4py.MPI"].COMM_WORLD.Abort(code)

    def _abort(self):
        """ncclCommAbort, after the graphs that hold the communicator (NCCL waits for them)."""
        if self.comm is None or self._aborted:
            return
        self._aborted = True
        self._release()                # captured graphs hold the communicator
        self.comm.abort()

    def close(self, timeout: float = 10.0):
        """Finish (at most ``timeout`` s), drop captured graphs, destroy the communicator.
        Unfinished work or an NCCL error aborts it instead: destroy would wait for kernels
        that may never end. Posted but never waited isend/irecv are discarded."""
        if self.comm is None:
            return
        if self._aborted:
            self.comm = None
            return
        self._pending = []
        finished = False
        try:
            self.synchronize(timeout=timeout, operation="close")
            finished = True
        except CollectiveTimeout:
            pass                      # synchronize aborted the communicator already
        except Exception:
            self._abort()
        if finished:
            self._release()
            self.comm.destroy()
        self.comm = None
        self._comm_stream = None
        self._scratch.clear()


class _NcclRequest(Request):
    def __init__(self, transport, kind, buf, peer):
        self.transport, self.kind, self.buf, self.peer = transport, kind, buf, peer
        self.issued = False
        self.completed = False

    def test(self) -> bool:
        if self.completed:
            return True
        self.transport.flush()
        return False

    def wait(self, timeout=None):
        if not self.completed:
            self.transport.wait_all([self], timeout)


def _offsets(counts) -> list[int]:
    """Element offsets of consecutive blocks (plain ints: they become device pointers)."""
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


class NcclNative:
    """NCCL's own collectives through CuPy, on the current stream, on flat CuPy arrays."""

    def __init__(self, transport: NcclTransport):
        self.t = transport
        self._barrier_buf = None

    # -- capabilities ------------------------------------------------------------------------

    def _type(self, dtype):
        dtype = np.dtype(dtype)
        if dtype == BFLOAT16 and BFLOAT16 is not None:
            return _BFLOAT16_TYPE if self.t.version >= _BFLOAT16_SINCE else None
        if dtype == np.bool_:
            return NCCL_UINT8
        return _NCCL_TYPES.get(dtype)

    def _reduction(self, dtype, op):
        """(ncclDataType, ncclRedOp, element multiplier) or None when NCCL cannot."""
        dtype = np.dtype(dtype)
        op = ReduceOp.parse(op)
        if dtype == np.bool_:
            return (NCCL_UINT8, _BOOL_OPS[op], 1) if op in _BOOL_OPS else None
        if dtype.kind == "c":       # a complex sum is a sum of its float parts
            part = _NCCL_TYPES.get(np.dtype(f"f{dtype.itemsize // 2}"))
            return (part, 0, 2) if op == ReduceOp.SUM and part is not None else None
        kind = self._type(dtype)
        if kind is None or op not in _NCCL_OPS:
            return None
        return kind, _NCCL_OPS[op], 1

    def supports(self, collective, dtype, op=ReduceOp.SUM) -> bool:
        if collective in ("all_reduce", "reduce_scatter", "reduce"):
            return self._reduction(dtype, op) is not None
        return True                 # data movement goes as bytes: every dtype

    # -- helpers -------------------------------------------------------------------------------

    @property
    def _stream(self):
        return self.t.xp.cuda.get_current_stream().ptr

    @staticmethod
    def _ptr(array, offset_elems=0):
        return array.data.ptr + offset_elems * array.itemsize

    def _group(self, calls):
        nccl = self.t.nccl
        nccl.groupStart()
        try:
            for call in calls:
                call()
        finally:
            nccl.groupEnd()

    def _copy(self, dst_ptr, src_ptr, nbytes):
        if nbytes and dst_ptr != src_ptr:
            self.t.xp.cuda.runtime.memcpyAsync(dst_ptr, src_ptr, nbytes, MEMCPY_D2D, self._stream)

    # -- collectives ---------------------------------------------------------------------------

    def all_reduce(self, sendbuf, recvbuf, op):
        kind, nop, mult = self._reduction(recvbuf.dtype, op)
        self.t.comm.allReduce(sendbuf.data.ptr, recvbuf.data.ptr, recvbuf.size * mult, kind,
                              nop, self._stream)

    def reduce(self, sendbuf, recvbuf, root, op):
        kind, nop, mult = self._reduction(sendbuf.dtype, op)
        out = recvbuf.data.ptr if recvbuf is not None else 0
        self.t.comm.reduce(sendbuf.data.ptr, out, sendbuf.size * mult, kind, nop, root,
                           self._stream)

    def broadcast(self, buf, root):
        self.t.comm.broadcast(buf.data.ptr, buf.data.ptr, buf.nbytes, NCCL_UINT8, root,
                              self._stream)

    def reduce_scatter(self, sendbuf, recvbuf, counts, op):
        kind, nop, mult = self._reduction(sendbuf.dtype, op)
        comm, stream = self.t.comm, self._stream
        if len(set(counts)) == 1:
            comm.reduceScatter(sendbuf.data.ptr, recvbuf.data.ptr, counts[0] * mult, kind, nop,
                               stream)
            return
        offsets = _offsets(counts)
        me = self.t.rank
        self._group([
            (lambda i=i: comm.reduce(self._ptr(sendbuf, offsets[i]),
                                     recvbuf.data.ptr if i == me else 0,
                                     counts[i] * mult, kind, nop, i, stream))
            for i in range(self.t.size) if counts[i]])

    def all_gather(self, sendbuf, recvbuf, counts):
        comm, stream = self.t.comm, self._stream
        item = recvbuf.itemsize
        if len(set(counts)) == 1:
            comm.allGather(sendbuf.data.ptr, recvbuf.data.ptr, counts[0] * item, NCCL_UINT8, stream)
            return
        offsets = _offsets(counts)
        self._group([
            (lambda i=i: comm.broadcast(sendbuf.data.ptr, self._ptr(recvbuf, offsets[i]),
                                        counts[i] * item, NCCL_UINT8, i, stream))
            for i in range(self.t.size) if counts[i]])

    def all_to_all(self, sendbuf, recvbuf, send_counts, recv_counts):
        comm, stream, me = self.t.comm, self._stream, self.t.rank
        item = sendbuf.itemsize
        s_off = _offsets(send_counts)
        r_off = _offsets(recv_counts)
        calls = []
        for peer in range(self.t.size):
            if peer == me:
                continue
            if recv_counts[peer]:
                calls.append(lambda p=peer: comm.recv(self._ptr(recvbuf, r_off[p]),
                                                      recv_counts[p] * item, NCCL_UINT8, p, stream))
            if send_counts[peer]:
                calls.append(lambda p=peer: comm.send(self._ptr(sendbuf, s_off[p]),
                                                      send_counts[p] * item, NCCL_UINT8, p, stream))
        self._copy(self._ptr(recvbuf, r_off[me]), self._ptr(sendbuf, s_off[me]),
                   send_counts[me] * item)
        self._group(calls)

    def gather(self, sendbuf, recvbuf, counts, root):
        comm, stream, me = self.t.comm, self._stream, self.t.rank
        item = sendbuf.itemsize
        if me != root:
            if counts[me]:
                self._group([lambda: comm.send(sendbuf.data.ptr, counts[me] * item, NCCL_UINT8,
                                               root, stream)])
            return
        offsets = _offsets(counts)
        self._copy(self._ptr(recvbuf, offsets[me]), sendbuf.data.ptr, counts[me] * item)
        self._group([(lambda p=p: comm.recv(self._ptr(recvbuf, offsets[p]), counts[p] * item,
                                            NCCL_UINT8, p, stream))
                     for p in range(self.t.size) if p != me and counts[p]])

    def scatter(self, sendbuf, recvbuf, counts, root):
        comm, stream, me = self.t.comm, self._stream, self.t.rank
        item = recvbuf.itemsize
        if me != root:
            if counts[me]:
                self._group([lambda: comm.recv(recvbuf.data.ptr, counts[me] * item, NCCL_UINT8,
                                               root, stream)])
            return
        offsets = _offsets(counts)
        self._copy(recvbuf.data.ptr, self._ptr(sendbuf, offsets[me]), counts[me] * item)
        self._group([(lambda p=p: comm.send(self._ptr(sendbuf, offsets[p]), counts[p] * item,
                                            NCCL_UINT8, p, stream))
                     for p in range(self.t.size) if p != me and counts[p]])

    def barrier(self):
        if self._barrier_buf is None:
            self._barrier_buf = self.t.xp.zeros(1, dtype=np.int32)
        buf = self._barrier_buf
        self.t.comm.allReduce(buf.data.ptr, buf.data.ptr, 1, 2, 0, self._stream)
        self.t.synchronize(self.t.timeout, operation="barrier")
