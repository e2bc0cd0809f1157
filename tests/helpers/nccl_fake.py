"""A CPU stand-in for the slice of CuPy and NCCL the NCCL executor and transport use.

Why: the GPU path is stream-ordered; its bugs are missing or wrong cross-stream dependencies,
which an eager mock (every call executed at once) can never show. Here a stream is a queue,
an event a marker, and nothing runs when it is enqueued. ``World.drain`` then executes the
queued work of every rank in a random order that respects only what CUDA and NCCL guarantee:

* the operations of one stream run in order;
* ``stream.wait_event(e)`` blocks that stream until the ``record`` that made ``e`` has run;
* an NCCL group (``groupStart`` ... ``groupEnd``) is one operation of its stream: it starts
  when it reaches the head of the stream, its sends and receives match those of the peer in
  FIFO order per (sender, receiver) pair, each match copies the bytes at some random later
  moment while other streams keep running, and the group completes once all its parts did.

A race the executor leaves open (a kernel that overwrites a region before the send that
reads it, a send that reads before the kernel that writes it) therefore shows up as wrong
data under some seeds; a missing match shows up as a deadlock (``RuntimeError``).

Use: ``world = World(size); modules = world.modules()`` and put ``modules`` into
``sys.modules`` (pytest's monkeypatch), then ``with world.on(rank): ...`` around each rank's
host calls, then ``world.drain(seed)``. Memory is numpy: ``FakeArray.np`` is the host view.
Graph capture: ``begin_capture``/``end_capture`` record a stream's operations; ``launch``
replays them. Like NCCL >= 2.26, ``Comm.destroy``/``abort`` refuse (here: raise instead of
hanging) while a graph captured on that rank is still alive.
Limits: one process, no real concurrency inside a kernel (each kernel or copy is atomic).

``ThreadedWorld``: the same, for ranks that are threads (the facade over thread-local
worlds): each thread has its own rank and open NCCL group, and execution is serialized.
Arrays look like CuPy's to the facade (``flags`` without ``writeable``, ``reshape(-1)``);
``cupy.asnumpy`` waits for the current stream, as CuPy's synchronous copy does.
"""
from __future__ import annotations

import collections
import contextlib
import random
import threading
import time
import types
import weakref

import numpy as np


class NcclError(Exception):
    pass


class _Memory:
    """One address space for all ranks: every allocation gets its own numpy bytes."""

    def __init__(self):
        self.next = 1 << 20
        self.blocks = []           # (base, nbytes, uint8 array)

    def allocate(self, nbytes):
        base = self.next
        self.next += max(nbytes, 1) + 4096
        raw = np.zeros(max(nbytes, 1), np.uint8)
        self.blocks.append((base, nbytes, raw))
        return base, raw

    def bytes_at(self, ptr, nbytes):
        for base, size, raw in self.blocks:
            if base <= ptr and ptr + nbytes <= base + size:
                return raw[ptr - base:ptr - base + nbytes]
        raise RuntimeError(f"fake device: {nbytes} bytes at {ptr:#x} are not allocated")


class _Data:
    def __init__(self, ptr):
        self.ptr = ptr


class _Flags:
    """CuPy's flags: no ``writeable`` (device arrays always are)."""
    c_contiguous = True
    f_contiguous = True
    owndata = True


class FakeArray:
    """A flat device array: numpy memory, a device address, slicing as views."""
    ndim = 1
    flags = _Flags()

    def __init__(self, np_view, ptr):
        self.np = np_view
        self.data = _Data(ptr)

    @property
    def shape(self):
        return (self.np.size,)

    def reshape(self, *shape):
        if shape not in ((-1,), ((-1,),), (self.np.size,)):
            raise TypeError("fake arrays are flat")
        return self

    @property
    def size(self):
        return self.np.size

    @property
    def dtype(self):
        return self.np.dtype

    @property
    def itemsize(self):
        return self.np.itemsize

    @property
    def nbytes(self):
        return self.np.nbytes

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("fake arrays slice contiguously only")
        start, _, _ = key.indices(self.np.size)
        return FakeArray(self.np[key], self.data.ptr + start * self.np.itemsize)

    def __setitem__(self, key, value):          # host-side fill (test set-up only)
        self.np[key] = value


class Event:
    """``done`` is what the host sees: asking runs whatever queued work can run (all ranks,
    as if they were other processes), so host polling (``synchronize``) ends."""

    def __init__(self, world=None):
        self.world, self._done = world, False

    @property
    def done(self):
        if not self._done and self.world is not None:
            self.world.drain(partial=True)
        return self._done

    @done.setter
    def done(self, value):
        self._done = value

    def record(self, stream=None):
        """CuPy's Event.record: on ``stream``, else the current stream."""
        (stream or self.world.current_stream()).record(self)


class Stream:
    def __init__(self, world, rank, ptr):
        self.world, self.rank, self.ptr = world, rank, ptr
        self.queue = collections.deque()

    def record(self, event=None):
        event = event or Event(self.world)
        self.queue.append(("record", event))
        return event

    def wait_event(self, event):
        self.queue.append(("wait", event))

    def enqueue(self, fn):
        self.queue.append(("run", fn))

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("fake cuda: the legacy default stream cannot be captured")
        self.captured, self.queue = self.queue, collections.deque()

    def end_capture(self):
        ops, self.queue = list(self.queue), self.captured
        return Graph(self.world, self.rank, ops)

    def __enter__(self):
        self.world.current[self.world.rank].append(self)
        return self

    def __exit__(self, *exc):
        self.world.current[self.world.rank].pop()


class Graph:
    """A captured stream: its operations, replayed (fresh NCCL groups) on each launch."""

    def __init__(self, world, rank, ops):
        self.world, self.rank, self.ops = world, rank, ops
        world.graphs.add(self)

    def launch(self, stream):
        for kind, item in self.ops:
            if kind == "group":
                item = _Group(item.rank, item.parts)
            elif kind == "record":
                item = Event(self.world)
            stream.queue.append((kind, item))


class _Group:
    """One NCCL group on one stream: its parts and how many are still unmatched."""

    def __init__(self, rank, parts):
        self.rank, self.parts = rank, parts     # [(kind, peer, ptr, nbytes)]
        self.left = len(parts)
        self.posted = False


class Comm:
    def __init__(self, world, rank):
        self.world, self.rank = world, rank
        self.destroyed = False

    def send(self, ptr, nbytes, dtype, peer, stream):
        self.world.group_part(self.rank, ("send", peer, ptr, nbytes), stream)

    def recv(self, ptr, nbytes, dtype, peer, stream):
        self.world.group_part(self.rank, ("recv", peer, ptr, nbytes), stream)

    def check_async_error(self):
        pass

    def _release(self, what):
        # NCCL >= 2.26 waits in destroy/abort until every graph holding the comm is gone
        if self.world.live_graphs(self.rank):
            raise RuntimeError(f"fake nccl: {what} on rank {self.rank} with "
                               f"{self.world.live_graphs(self.rank)} live graphs would hang")
        self.destroyed = True

    def abort(self):
        self._release("ncclCommAbort")

    def destroy(self):
        self._release("ncclCommDestroy")


class World:
    def __init__(self, size):
        self.size = size
        self.memory = _Memory()
        self.rank = 0
        self.streams = []
        self.defaults = [self._stream(r, ptr=0) for r in range(size)]
        self.current = [[] for _ in range(size)]
        self.group = None                        # (rank, stream ptr, parts) while open
        self.depth = 0
        self.sends = collections.defaultdict(collections.deque)
        self.recvs = collections.defaultdict(collections.deque)
        self.graphs = weakref.WeakSet()          # a graph lives while anyone holds it

    def live_graphs(self, rank):
        return sum(1 for g in list(self.graphs) if g.rank == rank)

    def _stream(self, rank, ptr=None):
        stream = Stream(self, rank, ptr if ptr is not None else 1000 + len(self.streams))
        self.streams.append(stream)
        return stream

    def on(self, rank):
        world = self

        class _On:
            def __enter__(self):
                world.rank = rank

            def __exit__(self, *exc):
                pass
        return _On()

    # -- the cupy surface --------------------------------------------------------------------

    def current_stream(self):
        stack = self.current[self.rank]
        return stack[-1] if stack else self.defaults[self.rank]

    def stream_of(self, ptr):
        if ptr == 0:
            return self.defaults[self.rank]
        for s in self.streams:
            if s.ptr == ptr and s.rank == self.rank:
                return s
        raise RuntimeError(f"fake cuda: rank {self.rank} has no stream {ptr}")

    def empty(self, count, dtype):
        dtype = np.dtype(dtype)
        base, raw = self.memory.allocate(count * dtype.itemsize)
        return FakeArray(raw[:count * dtype.itemsize].view(dtype), base)

    def asarray(self, host):
        host = np.ascontiguousarray(host).reshape(-1)
        out = self.empty(host.size, host.dtype)
        out.np[...] = host
        return out

    def asnumpy(self, array, stream=None):
        """A host copy once the current stream has run up to here (CuPy's synchronous get)."""
        event = self.current_stream().record()
        while not event.done:
            time.sleep(1e-4)
        return array.np.copy()

    def memcpy_async(self, dst, src, nbytes, kind, stream_ptr):
        memory = self.memory

        def copy():
            memory.bytes_at(dst, nbytes)[...] = memory.bytes_at(src, nbytes).copy()
        self.stream_of(stream_ptr).enqueue(copy)

    def launch(self, fn):
        """A kernel on the current stream: ``fn`` runs when the stream gets there."""
        self.current_stream().enqueue(fn)

    # -- the nccl surface --------------------------------------------------------------------

    def group_start(self):
        self.depth += 1

    def group_end(self):
        self.depth -= 1
        if self.depth == 0 and self.group is not None:
            rank, ptr, parts = self.group
            self.group = None
            stream = self.stream_of(ptr)
            stream.queue.append(("group", _Group(rank, parts)))

    def group_part(self, rank, part, stream_ptr):
        if self.depth == 0:                 # a lone call is a group of one
            self.group_start()
            self.group_part(rank, part, stream_ptr)
            self.group_end()
            return
        if self.group is None:
            self.group = (rank, stream_ptr, [])
        elif self.group[0] != rank or self.group[1] != stream_ptr:
            raise RuntimeError("fake nccl: one group spans ranks or streams")
        self.group[2].append(part)

    def modules(self):
        """{module name: fake module} for sys.modules."""
        world = self
        nccl = types.ModuleType("cupy.cuda.nccl")
        nccl.available = True
        nccl.NcclError = NcclError
        nccl.get_version = lambda: 22809
        nccl.groupStart = world.group_start
        nccl.groupEnd = world.group_end
        runtime = types.SimpleNamespace(
            memcpyAsync=world.memcpy_async, getDeviceCount=lambda: world.size)
        cuda = types.ModuleType("cupy.cuda")
        cuda.nccl = nccl
        cuda.runtime = runtime
        cuda.get_current_stream = world.current_stream
        cuda.Stream = lambda non_blocking=False: world._stream(world.rank)
        cuda.Device = _Device
        cuda.Event = lambda disable_timing=False: Event(world)
        cupy = types.ModuleType("cupy")
        cupy.cuda = cuda
        cupy.ndarray = FakeArray
        cupy.empty = lambda count, dtype=np.float64: world.empty(count, dtype)
        cupy.zeros = lambda count, dtype=np.float64: world.empty(count, dtype)
        cupy.asarray = world.asarray
        cupy.asnumpy = world.asnumpy
        cupy.__version__ = "fake"
        return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl}

    # -- execution ---------------------------------------------------------------------------

    def drain(self, seed=0, limit=10_000_000, partial=False):
        """Run every queued operation of every rank in a random order CUDA/NCCL allow.
        ``partial``: stop quietly where nothing can run (other ranks have not enqueued yet)."""
        rng = random.Random(seed)
        sends, recvs = self.sends, self.recvs    # (src, dst) -> [(group, part)], FIFO
        for _ in range(limit):
            actions = []
            for stream in self.streams:
                if not stream.queue:
                    continue
                kind, item = stream.queue[0]
                if kind == "wait" and not item._done:
                    continue
                if kind == "group" and item.posted and item.left:
                    continue
                actions.append(stream)
            pairs = [key for key in sends if sends[key] and recvs.get(key)]
            if not actions and not pairs:
                stuck = [s for s in self.streams if s.queue]
                if stuck and not partial:
                    raise RuntimeError(
                        f"fake cuda: deadlock; stuck streams (rank, head): "
                        f"{[(s.rank, s.queue[0][0]) for s in stuck][:8]}")
                return
            choice = rng.randrange(len(actions) + len(pairs))
            if choice >= len(actions):
                self._match(*pairs[choice - len(actions)], sends, recvs)
                continue
            stream = actions[choice]
            kind, item = stream.queue[0]
            if kind == "group" and not item.posted:
                item.posted = True
                for part in item.parts:
                    what, peer, _, _ = part
                    key = (item.rank, peer) if what == "send" else (peer, item.rank)
                    (sends if what == "send" else recvs)[key].append((item, part))
                if item.left:
                    continue
            stream.queue.popleft()
            if kind == "record":
                item.done = True
            elif kind == "run":
                item()
        raise RuntimeError("fake cuda: too many operations")

    def _match(self, src, dst, sends, recvs):
        (sgroup, spart), (rgroup, rpart) = sends[(src, dst)].popleft(), recvs[(src, dst)].popleft()
        if spart[3] != rpart[3]:
            raise RuntimeError(f"fake nccl: rank {src} sends {spart[3]} bytes to rank {dst}, "
                               f"which receives {rpart[3]}")
        self.memory.bytes_at(rpart[2], rpart[3])[...] = \
            self.memory.bytes_at(spart[2], spart[3]).copy()
        sgroup.left -= 1
        rgroup.left -= 1


class _Device(contextlib.nullcontext):
    """``cupy.cuda.Device(i)``: one device per rank here, so making it current does nothing."""

    def __init__(self, device=0):
        super().__init__()
        self.id = device

    def use(self):
        pass


class ThreadedWorld(World):
    """A World whose ranks are threads (see the module notes)."""

    def __init__(self, size):
        self._local = threading.local()
        self._lock = threading.RLock()
        super().__init__(size)

    def _mine(name, default):         # noqa: N805  (a property factory, used below)
        return property(lambda self: getattr(self._local, name, default),
                        lambda self, value: setattr(self._local, name, value))

    rank = _mine("rank", 0)
    group = _mine("group", None)
    depth = _mine("depth", 0)
    del _mine

    def drain(self, *args, **kwargs):
        with self._lock:
            return super().drain(*args, **kwargs)

    def empty(self, count, dtype):
        with self._lock:
            return super().empty(count, dtype)

    def _stream(self, rank, ptr=None):
        with self._lock:
            return super()._stream(rank, ptr)

    def group_end(self):
        with self._lock:
            super().group_end()
