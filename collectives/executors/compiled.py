"""Glue for the compiled MPI executor (``_mpi_exec.pyx``): flattens a plan's lowered program
(``algorithms.lowered``: the step walk, or any other lowering) into integer arrays once
(cached on the plan), maps dtypes and ops to the codes the C loops know, and
falls back to the host executor for what the C side does not do (complex, longdouble,
messages of 2 GiB or more) or where the extension is not built. float16 and bfloat16 reduce in
C (float32 arithmetic, one rounding, F16C where the CPU has it) with the numpy twin's bits.

Scratch: up to ``KEEP_SCRATCH_BYTES`` (1 MiB) one spare per plan and dtype; larger scratch from
``scratch_pool``, which keeps at most ``COLLECTIVES_SCRATCH_CACHE`` bytes (default 256M; 0:
allocate per call) in all, least recently used dropped first. A fresh large array is mmap'd
and page-faulted on every call, which costs more than the reduction that uses it
(Rabenseifner's half-vector scratch on large all_reduces).

``status()`` says whether it is in use and, if not, why (``python -m collectives info``).
"""
from __future__ import annotations

import ctypes
import heapq
import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

from .. import settings
from ..algorithms import lowered
from ..algorithms.lowered import POST, WAIT, Chain
from ..algorithms.schedule import Copy
from ..errors import CollectiveError, CollectiveTimeout, TransportError
from ..kernels.reduce import BFLOAT16
from ..ops import ReduceOp
from . import host

_DTYPES = {np.dtype(t): code for code, t in enumerate(
    (np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
     np.uint8, np.uint16, np.uint32, np.uint64, np.float16))}
if BFLOAT16 is not None:
    _DTYPES[BFLOAT16] = 11
_BOOL_OPS = {ReduceOp.SUM: ReduceOp.BOR, ReduceOp.PRODUCT: ReduceOp.BAND,
             ReduceOp.MIN: ReduceOp.BAND, ReduceOp.MAX: ReduceOp.BOR}
_BUFFER_IDS = {"input": 0, "output": 1, "scratch": 2}
_MAX_MESSAGE = 2**31 - 1            # MPI int counts, in bytes


def _load():
    """Import the extension after making libmpi's symbols global (mpi4py loads it RTLD_LOCAL,
    and the extension leaves MPI symbols to be resolved from the library already loaded)."""
    if not settings.COMPILED():
        return None, "disabled by COLLECTIVES_COMPILED=0"
    try:
        from mpi4py import MPI
    except Exception as exc:  # noqa: BLE001
        return None, f"mpi4py unusable: {exc}"
    for line in open("/proc/self/maps") if os.path.exists("/proc/self/maps") else ():
        path = line.split()[-1]
        if "libmpi" in os.path.basename(path) and ".so" in path:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            break
    try:
        from . import _mpi_exec
    except ImportError as exc:
        return None, f"extension not built ({exc}); reinstall with Cython and an MPI compiler"
    library = MPI.Get_library_version()
    if _mpi_exec.BUILT_FOR not in library:
        return None, (f"built against {_mpi_exec.BUILT_FOR} headers but running on "
                      f"{library.splitlines()[0].strip()}; rebuild to use it")
    return _mpi_exec, f"in use (built for {_mpi_exec.BUILT_FOR})"


_module, _why = None, None


def status() -> str:
    global _module, _why
    if _why is None:
        _module, _why = _load()
    return _why


def available() -> bool:
    status()
    return _module is not None


def _flatten(program):
    """A lowered program as a ``FlatProgram`` (C arrays), built once per program and kept on
    its plan (keyed by the program's identity: a program is itself cached on its plan)."""
    plan = program.plan
    cache = plan.__dict__.get("_flat")
    if cache is None:
        cache = {}
        object.__setattr__(plan, "_flat", cache)
    held = cache.get(id(program))
    if held is None or held[0] is not program:
        held = cache[id(program)] = (program, _module.FlatProgram(*_tables(program)))
    return held[1]


def _region(region):
    return _BUFFER_IDS[region.buffer], region.offset


def _tables(program):
    """(code, xfers, waits, ops, slots, gather): the rows ``_mpi_exec`` interprets. Requests
    get the lowest free slot when posted and give it back when waited for, so the step walk
    uses slots 0..k-1 for a step of k transfers and waits on them in place; a wait whose slots
    are not consecutive is gathered (``gather``: the most such a wait holds). A program that
    waits for a request it never posted, twice, or never is a ValueError."""
    plan = program.plan
    code, xfers, waits, ops = [], [], [], []
    free, requests, waited = [], [], set()     # free slots (a heap); number -> wait row
    slots = gather = 0

    def bad(step, what):
        return ValueError(f"compiled executor: {plan.collective} ({plan.algorithm}) on rank "
                          f"{plan.rank}: the program {what} (step {step + 1} of "
                          f"{len(plan.steps)})")

    for kind, step, what in program.code:
        if kind is POST:
            first = len(xfers)
            for is_recv, transfers in ((1, what[0]), (0, what[1])):
                for t in transfers:
                    if free:
                        slot = heapq.heappop(free)
                    else:
                        slot, slots = slots, slots + 1
                    requests.append((slot, is_recv, t.peer, t.region.count))
                    xfers.append((is_recv, t.peer, *_region(t.region), t.region.count, slot))
            if len(xfers) > first:
                code.append((0, step, first, len(xfers) - first, -1))
        elif kind is WAIT:
            numbers = range(what.start, what.stop, what.step or 1) if isinstance(what, slice) \
                else what
            first = len(waits)
            for number in numbers:
                if not 0 <= number < len(requests):
                    raise bad(step, f"waits for request {number}, which it has not posted")
                if number in waited:
                    raise bad(step, f"waits for request {number} twice")
                waited.add(number)
                waits.append(requests[number])
            held = [row[0] for row in waits[first:]]
            if not held:
                continue
            consecutive = held == list(range(held[0], held[0] + len(held)))
            if not consecutive:
                gather = max(gather, len(held))
            code.append((1, step, first, len(held), held[0] if consecutive else -1))
            for slot in held:
                heapq.heappush(free, slot)
        else:
            first = len(ops)
            for op in _one_by_one(what):
                if isinstance(op, Copy):
                    ops.append((0, *_region(op.dst), *_region(op.src), 0, 0, op.dst.count))
                else:
                    ops.append((1, *_region(op.dst), *_region(op.a), *_region(op.b),
                                op.dst.count))
            if len(ops) > first:
                code.append((2, step, first, len(ops) - first, -1))
    if len(waited) != len(requests):
        never = min(set(range(len(requests))) - waited)
        raise bad(len(plan.steps) - 1, f"never waits for request {never}")
    return code, xfers, waits, ops, slots, gather


def _one_by_one(local):
    """A LOCAL instruction's ops with each fused run (``Chain``, from ``lowered.chained``)
    taken op by op: the C loop has no fused kernel, and op by op gives a chain's bits."""
    for op in local:
        if isinstance(op, Chain):
            yield from op.ops
        else:
            yield op


# Scratch up to this size is kept between calls (one spare per plan and dtype, no accounting):
# allocating it is a visible part of a small collective.
KEEP_SCRATCH_BYTES = 1 << 20


_parse_bytes = settings.byte_size


class ScratchPool:
    """Larger scratch, kept between calls up to ``cap`` bytes in all (LRU by size).

    A fresh large ``np.empty`` comes from mmap: the kernel zeroes and maps every page on first
    touch, on every call (Rabenseifner's all_reduce needs n/2 of scratch: 32 MiB at 64 MiB).
    Buffers are bytes keyed by size, so plans of one size share them; a buffer in use is out of
    the pool, so concurrent callers never share one. ``cap`` 0 keeps nothing (every call
    allocates); a buffer larger than ``cap`` is never kept. The default cap
    is 256 MiB, or ``COLLECTIVES_SCRATCH_CACHE`` (bytes; K/M/G suffixes) read at import."""

    def __init__(self, cap):
        self.cap = cap
        self.held = 0
        self._free = OrderedDict()       # nbytes -> [buffers], least recently given first
        self._lock = threading.Lock()

    def take(self, nbytes):
        with self._lock:
            buffers = self._free.get(nbytes)
            if buffers:
                self.held -= nbytes
                buffer = buffers.pop()
                if not buffers:
                    del self._free[nbytes]
                return buffer
        return np.empty(nbytes, np.uint8)

    def give(self, buffer):
        nbytes = buffer.nbytes
        if nbytes > self.cap:
            return
        with self._lock:
            self._free.setdefault(nbytes, []).append(buffer)
            self._free.move_to_end(nbytes)
            self.held += nbytes
            while self.held > self.cap:
                size, buffers = next(iter(self._free.items()))
                buffers.pop(0)
                self.held -= size
                if not buffers:
                    del self._free[size]

    def clear(self):
        with self._lock:
            self._free.clear()
            self.held = 0


def _scratch_cap():
    try:
        return settings.SCRATCH_CACHE()
    except ValueError as exc:
        warnings.warn(f"{exc}; keeping the default 256 MiB", RuntimeWarning, stacklevel=2)
        return settings.SCRATCH_CACHE.default


scratch_pool = ScratchPool(_scratch_cap())


class _Compiled:
    """What one (plan, dtype) needs on every call, worked out on the first."""
    __slots__ = ("flat", "code", "itemsize", "ops", "scratch", "spare", "host")

    def __init__(self, plan, dtype, lowering):
        self.flat = _flatten(lowering(plan))
        self.code = _DTYPES.get(dtype)
        self.itemsize = dtype.itemsize
        # op codes as the C loops know them; AVG is SUM there (the group divides afterwards)
        self.ops = {op: int(ReduceOp.SUM if op == ReduceOp.AVG else op) for op in ReduceOp}
        if dtype == np.bool_:
            self.code = _DTYPES[np.dtype(np.uint8)]
            self.ops.update({op: int(alias) for op, alias in _BOOL_OPS.items()})
        self.host = self.code is None or self.flat.largest * dtype.itemsize > _MAX_MESSAGE
        self.scratch = plan.scratch
        self.spare = [] if plan.scratch * dtype.itemsize <= KEEP_SCRATCH_BYTES else None


def _compiled(plan, dtype, lowering, cache):
    table = getattr(plan, cache, None)
    if table is None:
        table = {}
        object.__setattr__(plan, cache, table)
    entry = table.get(dtype)
    if entry is None:
        entry = table[dtype] = _Compiled(plan, np.dtype(dtype), lowering)
    return entry


def make_executor(comm, lowering=lowered.stepwise):
    """An ``execute`` with host.execute's signature, bound to ``comm``, that runs
    ``lowering(plan)`` (the step walk by default; any lowering of ``algorithms.lowered``);
    None if unavailable.

    Per call it costs a dict lookup on the plan, a spare scratch array taken and given back
    (thread-safe: list pop/append, or the pool's lock for large scratch; a concurrent user of
    the same plan allocates its own), for a signed call (``signature``: the transport folds
    it into the tag) a dict lookup and the tag's two operations, and the C call."""
    if not available():
        return None
    run = _module.execute
    # one table of entries per lowering on each plan, so that a call looks up only its dtype
    cache = "_compiled" if lowering is lowered.stepwise else \
        f"_compiled_{lowering.__module__}.{lowering.__qualname__}"
    signs = {}          # signature -> how the transport of ``comm`` tags it (_signing)

    def execute(plan, transport, buffers, reduce=None, *, tag=0, timeout=None,
                operation=None, dtype=None, op=ReduceOp.SUM, signature=None):
        if dtype is None:
            dtype = next(a.dtype for a in buffers.values() if a is not None)
        entry = _compiled(plan, dtype, lowering, cache)
        if entry.host:
            return host.execute(plan, transport, buffers, reduce, tag=tag, timeout=timeout,
                                operation=operation, dtype=dtype,
                                **({} if signature is None else {"signature": signature}))
        if signature is None:
            signing = None
        else:
            try:                # a subscript, not .get: no method call on a signed call
                signing = signs[signature]
            except KeyError:
                signing = signs[signature] = _signing(transport, signature)
        scratch = None
        if entry.scratch:
            spare = entry.spare
            if spare is None:           # large: from the bounded pool, as bytes
                scratch = scratch_pool.take(entry.scratch * entry.itemsize).view(dtype)
            else:
                try:
                    scratch = spare.pop()
                except IndexError:
                    scratch = np.empty(entry.scratch, dtype)
        code = entry.ops.get(op)
        if code is None:
            code = entry.ops[ReduceOp.parse(op)]
        failure = run(entry.flat, comm, buffers.get("input"), buffers.get("output"), scratch,
                      entry.itemsize, entry.code, code, tag,
                      -1.0 if timeout is None else timeout, signing)
        if scratch is not None:
            if entry.spare is not None:
                entry.spare.append(scratch)
            else:
                scratch_pool.give(scratch.base)
        if failure is not None:
            _raise(plan, operation, failure, timeout, transport, tag, signature)
    return execute


def _signing(transport, signature):
    """How the transport tags ``signature`` (a ``Signing``), or None where it carries none."""
    mark = transport.signature_mark(signature)
    if not mark:
        return None
    return _module.Signing(mark, transport.signature_shift, transport.signature_width)


def _raise(plan, operation, failure, timeout, transport, tag, signature):
    step, kind, peer, detail, expected = failure
    rank = transport.rank
    where = (f"{operation or plan.collective} ({plan.algorithm}) on rank {rank}, step "
             f"{step + 1} of {len(plan.steps)}")
    if kind == "timeout":
        peers = sorted({t.peer for t in plan.steps[step].recvs + plan.steps[step].sends})
        raise CollectiveTimeout(f"{where}: still waiting after {timeout:.3g} s on rank(s) "
                                f"{', '.join(map(str, peers))}, tag {tag}")
    if kind == "foreign":
        error = transport.other_call(peer, detail, tag, signature)
        raise type(error)(f"{where}: {error}")
    # a message of a signed call has that call's signature: only its size can differ
    what = "operations or sizes" if signature is None else "sizes"
    if kind == "size":
        error = CollectiveError(f"{where}: message from rank {peer} has {detail} bytes but the "
                                f"receive expects {expected}: the ranks called mismatched "
                                f"{what}")
    elif kind == "mpi" and detail == _module.ERR_TRUNCATE:
        error = CollectiveError(f"{where}: message from rank {peer} is larger than the "
                                f"{expected}-byte receive: the ranks called mismatched {what}")
    else:
        raise TransportError(f"{where}: MPI error class {detail} talking to rank {peer}")
    if signature is not None:
        transport.notify(tag, signature, str(error))
    raise error
