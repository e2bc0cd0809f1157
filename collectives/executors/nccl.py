"""The NCCL executor: a whole plan enqueued on CUDA streams, no host synchronization.

It interprets a lowered program (``algorithms.lowered``) and decides nothing about order
itself: what may be cut, fused or overlapped was decided at lowering, once per cached plan,
by the hazard rules (``algorithms.hazards``). Each POST becomes one NCCL group
(``groupStart``, its ``recv`` and ``send`` calls, ``groupEnd``), each local op a copy or a
CuPy kernel. Nothing waits on the host: ``execute`` returns once everything is enqueued, and
the results are ordered on the caller's current CuPy stream (see
``collectives.transports.nccl`` for what completes when).

Two modes:

* **in order** (no message larger than ``segment_bytes``, or segmentation off):
  ``lowered.chained(lowered.stepwise(plan))`` on the caller's stream. A step's transfers are
  one NCCL group; its waits are stream order; its local ops are copies, kernels, and, for a
  run of reductions through one accumulator (a ``Chain``: the direct all_reduce's p-1
  reductions), one fused kernel (``kernels.cuda.chain_kernel``). Fewest launches; this is
  what small messages want.
* **pipelined** (any larger message): ``lowered.two_streams(plan, segment)``. Each message
  is cut into ``ceil(bytes / segment_bytes)`` segments by its own size (so both ends cut it
  alike), sent in rounds (segment k of every message of the step in round k,
  ``transforms.rounds``); a local op is cut by the same rule, so segment k of a reduction
  reads exactly segment k of its landing zone, when cutting cannot reorder a dependency
  (``hazards.splittable``); otherwise each op runs whole after the step's last round.
  Transfers run on the transport's private communication stream, kernels on the caller's
  stream, and CUDA events order them: each instruction names the latest instruction of the
  other stream whose regions conflict with its own (``hazards.conflict``), and the executor
  waits for that one's event. So the reduction of segment k overlaps the transfer of segment
  k+1, and a send waits only for the kernels that wrote what it sends. Both ends of a pair
  must hold the same messages in each step (rounds interleave a step's messages to one peer
  piece by piece): plans here are never windowed. ``tests/local/test_nccl_executor_fake.py`` checks
  this ordering on the CPU with streams as queues run in random dependency-respecting orders.

**Graph replay** (``COLLECTIVES_NCCL_GRAPH=1``, in-order plans only): the host work of a call
(a Python NCCL group per step, a CuPy kernel launch per reduction) dominates small
collectives. A call whose plan, buffers (pointers and sizes), dtype, reduction and
stream were all seen before is captured once as a CUDA graph (stream capture; NCCL >= 2.9
supports send/recv under capture) on its second occurrence and replayed from then on: one
graph launch per call. Every rank captures and replays the same calls in the same order, as
NCCL requires of any call. Capture needs a non-default stream; where it is the legacy default
stream, or capture fails, the call runs as usual (and that key is never tried again).
Graphs are kept per transport and key (at most ``GRAPH_CACHE`` of them, least recently used
dropped). Two rules NCCL imposes: (1) whether an NCCL call is captured must be the same on
every rank taking part, so ranks must make the same calls with the same buffers (pointer
reuse that differs between ranks, or a capture that fails on one rank only, breaks this);
(2) since NCCL 2.26 ``ncclCommDestroy``/``ncclCommAbort`` wait until every graph that captured
work of the communicator is destroyed, so ``drop_graphs(transport)`` must run before the
communicator goes (``NcclTransport.close`` does it; a graph kept alive there hangs the
process for ever).

Why reductions overlap transfers only in pipelined mode: in a ring (one-way or
bidirectional) the block reduced in step k is the block sent in step k+1, and the landing
zone the reduction of step k reads is written by the receive of step k+1; the whole-block
reduction of step k therefore cannot overlap the transfer of step k+1 without cutting the
blocks (the pipelined mode: segment j of step k+1 waits only for the reduction of segment j
of step k). The two halves of a bidirectional ring are independent, but each step is one
NCCL group covering both directions, so they share its dependencies.

NCCL point-to-point bandwidth grows with message size (fewer, larger messages fill more
channels), so segments trade transfer bandwidth for overlap. By default the plans of
collectives that reduce are pipelined in 64 MiB segments when a message is larger than that:
large enough that each segment keeps NCCL's bandwidth, so the overlap of reductions with
transfers gains more than the segments cost; smaller segments lose bandwidth faster than
overlap wins it (BENCHMARKS.md §3). Collectives without reductions (all_gather, all_to_all,
...) have nothing to overlap and stay whole.
``COLLECTIVES_NCCL_SEGMENT_BYTES`` sets the size for every plan (0 = never segment).

Limits: the NCCL calls of one plan are issued from one host thread; every rank must issue its
plans in the same order (NCCL requires it of any communicator). ``timeout`` is not enforced
here (nothing is waited for); ``NcclTransport.synchronize(timeout)`` enforces it.
"""
from __future__ import annotations

import weakref

import numpy as np

from .. import settings
from ..algorithms import lowered
from ..algorithms.lowered import COMM, LOCAL, POST, Chain
from ..algorithms.schedule import Copy, Plan
from ..errors import TransportError
from ..ops import REDUCING
from ..transports.nccl import MEMCPY_D2D, NCCL_UINT8

ENV_SEGMENT = settings.NCCL_SEGMENT_BYTES.name
ENV_GRAPH = settings.NCCL_GRAPH.name
GRAPH_CACHE = 256                   # captured graphs kept per process
DEFAULT_SEGMENT_BYTES = 64 << 20   # for plans that reduce (see above; BENCHMARKS.md §3)


# The default segment size goes by the collective (ops.REDUCING), never by one rank's plan:
# both ends of a message must cut it alike, and in a tree all_reduce the leaves' plans hold no
# reduction while their parents' do (deciding per plan, leaves sent whole 256 MiB messages into
# 64 MiB receives: wrong data on 4 GPUs).


def segment_bytes(plan: Plan | None = None) -> int:
    """The segment size for ``plan``: $COLLECTIVES_NCCL_SEGMENT_BYTES for every plan when set,
    else DEFAULT_SEGMENT_BYTES for the collectives that reduce and 0 (whole messages) for the
    others; the same on every rank of a call."""
    value = settings.NCCL_SEGMENT_BYTES()
    if value is None:
        reduces = plan is None or plan.collective in REDUCING
        return DEFAULT_SEGMENT_BYTES if reduces else 0
    return value


def graphs_enabled() -> bool:
    return settings.NCCL_GRAPH()


class _Graphs:
    """Captured plans: key -> [graph or None, times seen, plan]; LRU order."""

    def __init__(self):
        from collections import OrderedDict
        self.entries = OrderedDict()
        self.failures = []        # (plan name, why) of captures that failed, for reports

    def run(self, key, plan, run, cupy):
        """Replay, capture or run ``plan``; True if handled here. ``key`` holds ``id(plan)``
        (hashing a plan's steps on every call would cost more than the lookup saves); the
        entry keeps the plan itself, so an id reused by another plan is not mistaken."""
        entry = self.entries.get(key)
        if entry is None or entry[2] is not plan:
            self.entries[key] = [None, 1, plan]
            if len(self.entries) > GRAPH_CACHE:
                self.entries.popitem(last=False)
            return False
        self.entries.move_to_end(key)
        graph, seen, _ = entry
        stream = cupy.cuda.get_current_stream()
        if graph is not None:
            graph.launch(stream)
            return True
        if seen != 1 or stream.ptr == 0:
            return False          # uncapturable (failed before, or legacy default stream)
        entry[1] = 2
        try:
            stream.begin_capture()
        except Exception as exc:
            self.failures.append((run.name, f"begin_capture: {type(exc).__name__}: {exc}"))
            return False
        try:
            run.in_order(plan)
        except Exception as exc:
            try:
                stream.end_capture()
            except Exception:
                pass
            self.failures.append((run.name, f"capture: {type(exc).__name__}: {exc}"))
            if isinstance(exc, TransportError):
                raise
            return False
        try:
            graph = stream.end_capture()
        except Exception as exc:      # an invalidated capture says so here
            self.failures.append((run.name, f"end_capture: {type(exc).__name__}: {exc}"))
            return False
        entry[0] = graph
        graph.launch(stream)
        return True


# Each transport's captured graphs: the executor's state, kept here by transport (never on
# it), and dropped before its communicator goes through ``before_close``.
_GRAPHS = weakref.WeakKeyDictionary()


def graph_cache(transport) -> _Graphs:
    """The captured graphs of ``transport`` (created on first use)."""
    cache = _GRAPHS.get(transport)
    if cache is None:
        cache = _GRAPHS[transport] = _Graphs()
        transport.before_close(lambda: drop_graphs(transport))
    return cache


def drop_graphs(transport) -> int:
    """Destroy every graph captured on ``transport``'s communicator; how many there were.
    Must precede ``ncclCommDestroy``/``ncclCommAbort``, which wait for them (see above)."""
    cache = _GRAPHS.get(transport)
    if cache is None:
        return 0
    count = sum(1 for entry in cache.entries.values() if entry[0] is not None)
    cache.entries.clear()        # the last references: CuPy destroys graph and exec here
    import gc
    gc.collect()
    return count


def execute(plan: Plan, transport, buffers: dict, reduce=None, *, tag: int = 0,
            timeout: float | None = None, operation: str | None = None, dtype=None,
            op=None, segment: int | None = None) -> None:
    """Enqueue ``plan`` over device ``buffers`` on the current CuPy stream.

    ``op`` (the ReduceOp) selects the CUDA kernel; without it ``reduce`` (the group's host
    reducer) is called as is: numpy ufuncs dispatch to CuPy. ``segment`` overrides
    ``COLLECTIVES_NCCL_SEGMENT_BYTES``.
    """
    import cupy

    arrays = {k: v for k, v in buffers.items() if v is not None}
    if dtype is None:
        dtype = next(iter(arrays.values())).dtype
    dtype = np.dtype(dtype)
    if plan.scratch and "scratch" not in arrays:
        arrays["scratch"] = transport.scratch(plan.scratch, dtype)
    kernel = _device_reducer(reduce, op, dtype)
    name = f"{operation or plan.collective} ({plan.algorithm}) on rank {plan.rank}"
    run = _Run(transport, arrays, dtype.itemsize, kernel, name, cupy)
    if op is not None and reduce is not None:
        run.fuse = (op, dtype)
    limit = segment_bytes(plan) if segment is None else segment
    if limit <= 0 or lowered.largest_message(plan) * dtype.itemsize <= limit:
        if graphs_enabled():
            key = (id(plan), tuple((k, a.data.ptr, a.size) for k, a in arrays.items()),
                   dtype.str, op, id(kernel) if op is None else None,
                   cupy.cuda.get_current_stream().ptr)
            if graph_cache(transport).run(key, plan, run, cupy):
                return
        run.in_order(plan)
    else:
        # a segment below one element still cuts: into one-element pieces
        run.pipelined(lowered.two_streams(plan, max(1, limit // dtype.itemsize)))


def _device_reducer(reduce, op, dtype):
    if reduce is None:
        return None
    if op is None:
        return reduce
    from ..kernels.cuda import reduce_kernel
    return reduce_kernel(op, dtype)


class _Run:
    """One plan's enqueueing state."""

    def __init__(self, transport, arrays, itemsize, kernel, name, cupy):
        self.transport = transport
        self.comm = transport.comm
        self.arrays = arrays
        self.itemsize = itemsize
        self.kernel = kernel
        self.name = name
        self.cupy = cupy
        self.nccl = transport.nccl
        self.base = {k: (a.data.ptr, a.size) for k, a in arrays.items()}
        self.fuse = None          # (op, dtype): chains of reductions run as one kernel

    # -- addressing --------------------------------------------------------------------------

    def ptr(self, region) -> int:
        base, size = self.base[region.buffer]
        if region.end > size:      # a schedule bug must never become a wild device write
            raise ValueError(f"{self.name}: region {region} overruns {region.buffer} "
                             f"({size} elements)")
        return base + region.offset * self.itemsize

    def view(self, region):
        return self.arrays[region.buffer][region.offset:region.end]

    # -- the two primitives ------------------------------------------------------------------

    def transfer(self, sends, recvs, stream_ptr, index, total):
        nccl, comm = self.nccl, self.comm
        try:
            nccl.groupStart()
            try:
                for r in recvs:
                    comm.recv(self.ptr(r.region), r.region.count * self.itemsize, NCCL_UINT8,
                              r.peer, stream_ptr)
                for s in sends:
                    comm.send(self.ptr(s.region), s.region.count * self.itemsize, NCCL_UINT8,
                              s.peer, stream_ptr)
            finally:
                nccl.groupEnd()
        except nccl.NcclError as exc:
            raise TransportError(f"{self.name}, step {index + 1} of {total}: NCCL failed: "
                                 f"{exc}") from exc

    def local(self, op, stream):
        if isinstance(op, Copy):
            self.cupy.cuda.runtime.memcpyAsync(self.ptr(op.dst), self.ptr(op.src),
                                               op.dst.count * self.itemsize, MEMCPY_D2D, stream.ptr)
        else:
            with stream:
                self.kernel(self.view(op.dst), self.view(op.a), self.view(op.b))

    # -- in order: one stream ------------------------------------------------------------------

    def chain(self, chain, stream):
        """A ``lowered.Chain`` of reductions in one kernel launch."""
        from ..kernels.cuda import chain_kernel
        apply = chain_kernel(*self.fuse, len(chain.ops), chain.writes)
        with stream:
            apply([self.view(d) for d in chain.dsts], self.view(chain.a),
                  [self.view(b) for b in chain.bs])

    def in_order(self, plan):
        """``lowered.chained(lowered.stepwise(plan))`` on the caller's stream: a step's
        transfers as one NCCL group, its waits left to stream order, its local ops as copies,
        kernels and fused chain kernels (op by op where no fused kernel exists)."""
        stream = self.cupy.cuda.get_current_stream()
        total = len(plan.steps)
        for kind, index, what in lowered.chained(lowered.stepwise(plan)).code:
            if kind is POST:
                self.transfer(what[1], what[0], stream.ptr, index, total)
            elif kind is LOCAL:
                for op in what:
                    if op.__class__ is not Chain:
                        self.local(op, stream)
                    elif self.fuse:
                        self.chain(op, stream)
                    else:
                        for one in op.ops:
                            self.local(one, stream)

    # -- pipelined: transfers on the comm stream, kernels on the caller's ------------------------

    def pipelined(self, program):
        """A ``lowered.two_streams`` program: each instruction waits for the event of the one
        it names, runs on its stream, and records an event if a later one waits for it."""
        compute = self.cupy.cuda.get_current_stream()
        comm = self.transport.comm_stream()
        total = len(program.plan.steps)
        events = {}
        for number, (kind, index, what, where, after, record) in enumerate(program.code):
            stream = comm if where is COMM else compute
            if after >= 0:
                stream.wait_event(events[after])
            if kind is POST:
                self.transfer(what[1], what[0], stream.ptr, index, total)
            elif kind is LOCAL:
                for op in what:
                    self.local(op, stream)
            if record:
                events[number] = stream.record()
