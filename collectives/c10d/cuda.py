"""The backend's CUDA calls: streams as ProcessGroupNCCL keeps them, and the repeat path.

An asynchronous collective on CUDA tensors (``async_op=True``; every call DDP and FSDP make
from C++) runs on the group's own communication stream (one per process group and GPU), as
NCCL's backend runs every collective:

- at the call, the communication stream waits (an event) for the caller's current stream,
  so the collective starts after the work that produced its tensors, and the caller's
  stream goes on without it: compute queued next (the rest of a backward pass) overlaps it;
- the collective, and every copy the call makes, are enqueued on the communication stream;
  the host never waits;
- ``Work.wait()`` makes the waiting thread's current stream wait for the collective's
  event; its Future (``get_future``) is torch's CUDA-aware one, completed on the
  communication stream, so that whoever waits on it or reads its value is ordered after the
  collective;
- the caller's tensors are marked used by the communication stream (``record_stream``), so
  memory the caller frees before ``wait()`` is not handed to new tensors until the
  collective is done;
- under CUDA graph capture the same events make the communication stream join the
  capture, and ``wait()`` joins it back, so the captured graph holds the collective.

A synchronous collective (``async_op=False``) runs on the caller's current stream itself:
torch waits for it at once, so the communication stream could overlap nothing, and its two
cross-stream hops (there and back) would be most of a small call's time on the GPU. What
the caller sees is the same: work queued on its stream after the call runs after the
collective. (NCCL's backend takes the communication stream for these too.)

The repeat path: a call on plain tensors (dense, contiguous, on this rank's GPU, of a dtype
the GPU group takes) goes straight to the GPU group's ``prepare``, whose own repeat path
(the peer-memory lane) launches a call shape it has seen before without planning in Python.
Views of the tensors are kept by address: a view is only an address, a size and a dtype,
and holds no tensor. Anything else (lists of several tensors, uneven splits, sparse
tensors, other devices) takes the full path, which checks it and raises what is wrong
before anything moves.
"""
from __future__ import annotations

import itertools
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import tensors
from ..ops import ReduceOp
from .work import WorkBase, torch_seconds

_DONE_EVENTS = 256      # done events reused in turn: a Work older than this many calls waits
                        # for a later call's end (ordered after its own, never before)
_VIEWS_KEPT = 512
_STREAMS_KEPT = 64      # callers' streams with a CuPy wrapper kept
# torch's all_reduce option that the full path refuses (absent from some torch versions)
_SPARSE_INDICES = hasattr(dist.AllreduceOptions, "sparseIndices")


class CudaWork(WorkBase):
    """torch's Work of one collective enqueued on a stream of this GPU (see the module
    docstring): ``wait`` orders the current stream after it; ``is_completed`` asks the GPU;
    ``get_future`` is torch's CUDA-aware Future of ``result``. ``stream``: the raw stream it
    was enqueued on."""

    def __init__(self, operation: str, result, event, calls: "CudaCalls", stream: int):
        super().__init__()
        self._operation, self._result, self._event, self._calls = operation, result, event, calls
        self._stream = stream
        self._future = None

    def wait(self, timeout=timedelta(0)) -> bool:
        calls = self._calls
        current = torch._C._cuda_getCurrentRawStream(calls.device)
        if current != self._stream:     # on its own stream it is ordered already
            calls.runtime.streamWaitEvent(current, self._event.ptr, 0)
        return True

    def get_future(self):
        if self._future is None:
            calls = self._calls
            future = torch.futures.Future(devices=[calls.torch_device])
            # completed with the call's stream current, so that its event is recorded
            # there (torch.cuda.stream() costs several times the rest)
            caller = torch._C._cuda_getCurrentStream(calls.device)
            torch._C._cuda_setStream(*calls.torch_ids(self._stream))
            try:
                future.set_result(self._result)
            finally:
                torch._C._cuda_setStream(*caller)
            self._future = future
        return self._future

    def is_completed(self) -> bool:
        return self._event.done

    def is_success(self) -> bool:
        return self.is_completed()

    def exception(self):
        return None

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<collectives.c10d.CudaWork {self._operation} {state}>"


class CudaCalls:
    """The CUDA calls of one process group on its GPU group ``group`` (see the module
    docstring)."""

    def __init__(self, group, ops: dict):
        cupy = group.xp
        self.group = group
        self.cupy = cupy
        self.runtime = cupy.cuda.runtime
        self.device = group.transport.device
        self.torch_device = torch.device("cuda", self.device)
        with cupy.cuda.Device(self.device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self._start = cupy.cuda.Event(disable_timing=True)
            self._done = itertools.cycle([cupy.cuda.Event(disable_timing=True)
                                          for _ in range(_DONE_EVENTS)])
        self.torch_stream = torch.cuda.ExternalStream(self.stream.ptr, device=self.torch_device)
        self.stream_ids = (self.torch_stream.stream_id, self.torch_stream.device_index,
                           self.torch_stream.device_type)
        self._start_ptr, self._stream_ptr = self._start.ptr, self.stream.ptr
        self._timeout = (None, None)    # torch's last timeout option, in seconds
        self._callers: dict = {}        # callers' raw streams -> CuPy ExternalStream
        self._ops = ops                 # torch's reduce op kinds -> ours (calls._OPS)
        self._by_code: dict = {}
        self._views: dict = {}
        self._dtypes = dict(tensors._cuda_dtypes(torch))
        if tensors._BFLOAT16 is not None:
            self._dtypes[torch.bfloat16] = tensors._BFLOAT16

    # -- streams ------------------------------------------------------------------------------

    def enter(self, opts):
        """The CuPy stream a call with torch's options ``opts`` runs on (see the module
        docstring), ordered after the caller's current stream: the communication stream
        where the call is asynchronous, else the caller's stream itself."""
        runtime = self.runtime
        caller = torch._C._cuda_getCurrentRawStream(self.device)
        if getattr(opts, "asyncOp", True):
            runtime.eventRecord(self._start_ptr, caller)
            runtime.streamWaitEvent(self._stream_ptr, self._start_ptr, 0)
            return self.stream
        stream = self._callers.get(caller)
        if stream is None:
            if len(self._callers) >= _STREAMS_KEPT:
                self._callers.clear()
            stream = self._callers[caller] = self.cupy.cuda.ExternalStream(caller, self.device)
        return stream

    def scope(self, stream):
        """``with``: this GPU and ``stream`` as CuPy's current ones."""
        return _Scope(self, stream)

    def finish(self, operation, result, stream, tensors_) -> CudaWork:
        """The Work of what was just enqueued on ``stream`` (``enter``'s); the caller's
        ``tensors_`` are marked used by the communication stream where they went there."""
        event = next(self._done)
        self.runtime.eventRecord(event.ptr, stream.ptr)
        if stream is self.stream:
            torch_stream = self.torch_stream
            for t in tensors_:
                t.record_stream(torch_stream)
        return CudaWork(operation, result, event, self, stream.ptr)

    def torch_ids(self, raw: int):
        """torch's ids of the raw stream ``raw`` of this GPU (torch.cuda's set/get)."""
        if raw == self._stream_ptr:
            return self.stream_ids
        stream = torch.cuda.ExternalStream(raw, device=self.torch_device)
        return stream.stream_id, stream.device_index, stream.device_type

    def seconds(self, opts):
        """torch's per-call timeout option in seconds (None: the group's), parsed once."""
        timeout = getattr(opts, "timeout", None)
        last, seconds = self._timeout
        if timeout != last:
            seconds = torch_seconds(timeout)
            self._timeout = (timeout, seconds)
        return seconds

    # -- the repeat path ----------------------------------------------------------------------

    def view(self, t):
        """A flat CuPy view of a plain tensor on this GPU, else None."""
        if not isinstance(t, torch.Tensor) or not t.is_cuda or t.layout is not torch.strided \
                or not t.is_contiguous() or t.get_device() != self.device:
            return None
        dtype = self._dtypes.get(t.dtype)
        n = t.numel()
        if dtype is None or n == 0:
            return None
        ptr = t.data_ptr()
        key = (ptr, n, dtype)
        view = self._views.get(key)
        if view is None:
            if len(self._views) >= _VIEWS_KEPT:
                self._views.clear()
            cupy = self.cupy
            memory = cupy.cuda.UnownedMemory(ptr, n * dtype.itemsize, None, self.device)
            view = self._views[key] = cupy.ndarray((n,), dtype, cupy.cuda.MemoryPointer(memory, 0))
        return view

    def _op(self, opts):
        """Our op of torch's, once the full path has parsed that kind (calls._OPS); by its
        number, which hashes faster than torch's enum."""
        kind = opts.reduceOp.op
        code = int(kind)
        op = self._by_code.get(code)
        if op is None:
            op = self._ops.get(kind)
            if op is not None:
                self._by_code[code] = op
        return op

    def _run(self, operation, collective, result, keep, opts, input=None, output=None,
             op=ReduceOp.SUM, root=0):
        run = self.group.prepare(collective, input=input, output=output, root=root, op=op,
                                 timeout=self.seconds(opts))
        stream = self.enter(opts)
        if self.runtime.getDevice() != self.device:
            with _Scope(self, stream):
                run()
        else:
            stream.__enter__()
            try:
                run()
            finally:
                stream.__exit__(None, None, None)
        return self.finish(operation, result, stream, keep)

    def all_reduce(self, tensors_, opts):
        if type(tensors_) is not list or len(tensors_) != 1 or \
                (_SPARSE_INDICES and opts.sparseIndices is not None):
            return None
        t = tensors_[0]
        view, op = self.view(t), self._op(opts)
        if view is None or op is None:
            return None
        return self._run("all_reduce", "all_reduce", tensors_, tensors_, opts, output=view,
                         op=op)

    def broadcast(self, tensors_, opts):
        if type(tensors_) is not list or len(tensors_) != 1 or opts.rootTensor != 0:
            return None
        view = self.view(tensors_[0])
        root = opts.rootRank
        if view is None or not 0 <= root < self.group.size:
            return None
        return self._run("broadcast", "broadcast", tensors_, tensors_, opts, output=view,
                         root=root)

    def reduce_scatter_single(self, output, input, opts):
        out, buf, op = self.view(output), self.view(input), self._op(opts)
        if out is None or buf is None or op is None:
            return None
        return self._run("reduce_scatter_single", "reduce_scatter", [output], (output, input),
                         opts, input=buf, output=out, op=op)

    def all_gather_single(self, output, input, opts):
        out, buf = self.view(output), self.view(input)
        if out is None or buf is None:
            return None
        return self._run("all_gather_single", "all_gather", [output], (output, input), opts,
                         input=buf, output=out)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts):
        if len(output_split_sizes) or len(input_split_sizes):
            return None
        out, buf = self.view(output), self.view(input)
        if out is None or buf is None:
            return None
        return self._run("all_to_all_single", "all_to_all", [output], (output, input), opts,
                         input=buf, output=out)


class _Scope:
    """``with``: the group's GPU and ``stream`` as CuPy's current ones."""
    __slots__ = ("_calls", "_stream", "_device")

    def __init__(self, calls, stream):
        self._calls, self._stream = calls, stream
        self._device = None

    def __enter__(self):
        calls = self._calls
        if calls.runtime.getDevice() != calls.device:
            self._device = calls.cupy.cuda.Device(calls.device)
            self._device.__enter__()
        self._stream.__enter__()
        return self

    def __exit__(self, *exc):
        self._stream.__exit__(*exc)
        if self._device is not None:
            self._device.__exit__(*exc)
            self._device = None
        return False
