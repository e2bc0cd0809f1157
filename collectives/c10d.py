"""The torch backend "collectives": torch.distributed, DDP and the rest of torch's stack on
our algorithms.

``import collectives.c10d`` registers the backend with torch (devices cpu and cuda); then,
unchanged,

    torch.distributed.init_process_group("collectives")

makes every torch process group of the job a :class:`ProcessGroupCollectives`: a Python
``torch.distributed.ProcessGroup`` over our groups (``collectives.group``), whose ranks meet
through the store torch hands the backend. CPU tensors run on the socket transport; CUDA
tensors on the NCCL transport (our schedules as NCCL send/recv, ``executors.nccl``), whose
communicator is made at the group's first call on CUDA tensors, on their GPU, its unique id
passed through the same store. Each method is torch's, shaped as ``distributed_c10d.py``
is: route by device -> validate -> one ``prepare`` of our group -> a Work. The algorithm is
chosen as the facade chooses it: ``auto`` (the group's decision table) unless
``COLLECTIVES_ALGORITHM=all_reduce=ring,...`` names one.

torch makes a Python process group the whole group (``_new_process_group_helper`` stops at
the first backend that is a ProcessGroup), so ``"cpu:gloo,cuda:collectives"`` runs CPU
tensors on ours too; ``"collectives"`` and ``"cpu:collectives,cuda:collectives"`` are the
same group.

How torch reaches the methods: ``torch.distributed``'s Python functions call them by name
(``allreduce``, ``all_gather_single``, ``reduce_scatter_single``, ``all_to_all_single``,
``reduce``, ``gather``, ``scatter``, ``recv_anysource`` ...; FSDP2 on CPU goes this way);
C++ callers (DDP's reducer, ``_broadcast_coalesced``, the parameter check, the functional
collectives under DTensor) reach only what torch 2.13's trampoline (``PyProcessGroup``)
forwards to Python: allreduce, allreduce_coalesced, allgather, all_gather_single_coalesced,
all_to_all_single, broadcast, reduce_scatter, reduce_scatter_single_coalesced, barrier, send,
recv, and the group's name, which a Python group must keep itself. The older names
(``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``,
``allgather_into_tensor_coalesced``, ``reduce_scatter_tensor_coalesced``) are aliases.

Work (CUDA): as NCCL's backend, a collective is enqueued at the call, in the caller's thread,
on torch's current stream (made CuPy's current stream for the call, so that the copies a
call makes are ordered there too), and the host does not wait; its Work is complete at once
and its Future is torch's CUDA-aware one: ``wait()``, ``get_future().wait()`` and callbacks
order the waiting thread's current stream after the collective (``is_completed`` asks the
GPU). Send and receive are issued together at the first wait (one NCCL group), on the stream
current at the call, and the host waits for them.

Work (CPU): a synchronous call (torch's ``async_op=False``) runs in the caller's thread and
raises there; an asynchronous one runs on the group's worker thread in call order
(``collectives.work``). Its torch Future (``Future``) is completed by one thread per group,
in that order, not by the worker: DDP comm hooks such as PowerSGD wait for a second
collective inside a Future callback, which on the worker thread would wait for itself.
Collectives called inside such callbacks run at once, on a lane of the group with tags of its
own: callbacks run in the same order on every rank, but not at the same place among the
rank's other calls (see ``ProcessGroupCollectives.group``).

Rendezvous under our launcher (``python -m collectives.run``): its store server holds
MASTER_PORT and speaks our authenticated protocol, which torch's TCPStore cannot, so torch's
``env://`` would fail there; this module wraps torch's ``env://`` handler to hand torch that
store (as a ``torch.distributed.Store``) when ``COLLECTIVES_USE_AGENT_STORE`` is set, and
leaves every other case (torchrun, a plain MASTER_ADDR/MASTER_PORT) to torch.

Limits: one GPU per rank (the first CUDA call's; tensors of one call on one device); CUDA
tensors need CuPy with NCCL (the ``cuda12``/``cuda13`` extra: without it such a call is a
RuntimeError naming it); one tensor per call where torch's signature takes a list of one per
device; no PREMUL_SUM; dense (strided) tensors, and sparse COO for all_reduce (SUM, as
gloo: ``collectives.sparse``); no receive from any source on CUDA tensors (NCCL matches by
sender); ``monitored_barrier`` is gloo's alone in torch.
"""
from __future__ import annotations

import functools
import importlib
import itertools
import os
import queue
import threading
from datetime import timedelta
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d
from torch.futures import Future as _TorchFuture

from . import settings, sparse, tensors, transports, work as _work
from .group import ProcessGroup
from .ops import ReduceOp
from .state import seconds as _seconds
from .store import Store, TCPStore
from .transports.subgroup import SubgroupTransport

# torch.distributed.rendezvous is also the name of a function there: take the module itself
_torch_rendezvous = importlib.import_module("torch.distributed.rendezvous")

__all__ = ["BACKEND", "ProcessGroupCollectives", "Work", "create_backend"]

BACKEND = "collectives"
TRANSPORT = "socket"
GPU_TRANSPORT = "nccl"              # CUDA tensors' transport (made at a group's first)
# the callback lane's tags: a group id of the socket mesh's own (subgroup.GROUP_SHIFT above)
LANE_ID = 1
# torch's "no deadline" for a store wait (its waits take a timedelta, never None)
_NO_DEADLINE = timedelta(days=365)
_group_ids = itertools.count(1)


# -- stores -----------------------------------------------------------------------------------


class _TorchStore(Store):
    """Our store interface (what the socket transport's rendezvous calls) over a torch store.
    ``underlying_store`` leads the transport to the master's host (torch's TCPStore has
    ``host``), so each rank listens on the interface that routes there."""

    def __init__(self, store, timeout):
        super().__init__(timeout)
        self.underlying_store = store

    def _set(self, key, value):
        self.underlying_store.set(key, value)

    def _get(self, key, timeout):
        if self._wait([key], timeout):
            return None
        return self.underlying_store.get(key)

    def _add(self, key, amount):
        return self.underlying_store.add(key, amount)

    def _wait(self, keys, timeout):
        limit = _NO_DEADLINE if timeout is None else timedelta(seconds=timeout)
        try:
            self.underlying_store.wait(keys, limit)
        except dist.DistStoreError:
            return [k for k in keys if not self.underlying_store.check([k])]
        return []

    def _compare_set(self, key, expected, desired):
        return self.underlying_store.compare_set(key, expected, desired)

    def _delete(self, key):
        return self.underlying_store.delete_key(key)

    def _num_keys(self):
        return self.underlying_store.num_keys()

    def _check(self, keys):
        return self.underlying_store.check(keys)


class _LauncherStore(dist.Store):
    """torch's store interface over our launcher's store server (``collectives.store``)."""

    def __init__(self, store: Store):
        super().__init__()
        self._store = store
        self.host = getattr(store, "host", None)     # where the transport should listen

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key):
        return self._store.get(key)

    def add(self, key, value):
        return self._store.add(key, value)

    def compare_set(self, key, expected_value, desired_value):
        return self._store.compare_set(key, expected_value, desired_value)

    def wait(self, keys, timeout=None):
        self._store.wait(keys, None if timeout is None or timeout == timedelta(0) else timeout)

    def check(self, keys):
        return self._store.check(keys)

    def delete_key(self, key):
        return self._store.delete_key(key)

    def num_keys(self):
        return self._store.num_keys()

    # the names torch's C++ side looks these up by
    deleteKey = delete_key          # noqa: N815
    getNumKeys = num_keys           # noqa: N815


_torch_env_handler = _torch_rendezvous._rendezvous_handlers["env"]
_launcher_stores: list[_LauncherStore] = []


def _under_our_launcher() -> bool:
    return settings.USE_AGENT_STORE()


def _env_rendezvous(url, timeout=timedelta(minutes=30), **kwargs):
    """torch's ``env://``, except under our launcher: there the store is the launcher's."""
    if not _under_our_launcher():
        yield from _torch_env_handler(url, timeout=timeout, **kwargs)
        return
    query = dict(pair.split("=", 1) for pair in filter(None, urlparse(url).query.split("&")))
    try:
        rank = int(query.get("rank", os.environ.get("RANK", "")))
        world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "")))
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"env:// rendezvous under collectives.run: RANK, WORLD_SIZE, "
                         f"MASTER_ADDR and MASTER_PORT must be set ({exc})") from None
    store = _LauncherStore(TCPStore(host, port, world_size, is_master=False, timeout=timeout,
                                    wait_for_workers=False))
    # torch keeps only the C++ half of a Python store; without its Python half the methods
    # above are gone ("pure virtual function"), so it lives as long as the process
    _launcher_stores.append(store)
    yield store, rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


# -- Work -------------------------------------------------------------------------------------


_callbacks = threading.local()      # .depth: how many Future callbacks this thread is inside


def in_callback() -> bool:
    """Whether this thread is running a callback of one of our Futures (``Future``)."""
    return getattr(_callbacks, "depth", 0) > 0


def _run_callback(callback, future):
    _callbacks.depth = getattr(_callbacks, "depth", 0) + 1
    try:
        return callback(future)
    finally:
        _callbacks.depth -= 1


class Future(_TorchFuture):
    """The torch Future of our Works, whose callbacks (``then``, ``add_done_callback``, and
    theirs in turn: ``then`` returns one of these) run marked as callbacks, so that the
    collectives they call go to the group's callback lane (ProcessGroupCollectives.group)."""

    def then(self, callback):
        chained = Future()

        def run(done):
            try:
                value = _run_callback(callback, done)
            except BaseException as exc:      # the callback's error belongs to ``chained``
                chained.set_exception(exc)
                return
            chained.set_result(value)
        super().add_done_callback(run)
        return chained

    def add_done_callback(self, callback):
        super().add_done_callback(lambda done: _run_callback(callback, done))


class _Completions:
    """The thread that completes one group's torch Futures, in the order its operations
    finished: the group's call order, the same on every rank, so that callbacks registered
    before completion run in the same order on every rank."""

    def __init__(self, name):
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job()

    def submit(self, job) -> None:
        self._jobs.put(job)

    def is_current(self) -> bool:
        return threading.current_thread() is self._thread

    def stop(self) -> None:
        self._jobs.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()


def _wait_limit(timeout):
    """torch's Work.wait takes a timedelta; zero (its default, also from C++) is no limit."""
    limit = _seconds(timeout)
    return None if limit is None or limit <= 0 else limit


class Work(dist._Work):
    """torch's Work over one of our operations: ``wait`` (raising the operation's error),
    ``get_future`` (a ``torch.futures.Future`` of ``result()``, as gloo's), ``is_completed``,
    ``is_success``, ``exception``, ``result``, ``synchronize``, ``source_rank`` (any-source
    receives: the sender's group rank).

    ``ours`` is our Work (collectives.work), None for an operation done at the call; a
    collective's Future is completed by its group's completion thread (``completions``), a
    receive's or send's by whoever waits for it (or, once ``get_future`` is asked for, by a
    thread of its own: nothing else would drive the transfer), inside ``scope`` (the GPU
    transport's call scope: the caller's stream) where given.

    A collective on CUDA tensors was enqueued at the call: its ``future`` is torch's
    CUDA-aware Future, already set on the stream it ran on, so that ``wait()`` (and the
    Future's ``wait``, ``value`` and callbacks) orders the current stream after it, as
    NCCL's backend does; ``done`` (a CUDA event recorded after it) tells
    ``is_completed``."""

    def __init__(self, operation: str, result, ours=None, completions=None, *, future=None,
                 done=None, scope=None):
        super().__init__()
        self._operation = operation
        self._result = result
        self._ours = ours
        self._completions = completions
        self._future = Future() if future is None else future
        self._done = done
        self._scope = scope
        self._lock = threading.Lock()
        self._claimed = False               # whoever sets the Future claims it first
        self._driven = False
        self.source_rank_value = None
        if ours is None:
            self._claimed = True
            if future is None:
                self._future.set_result(result)
        elif ours._requests is None:
            ours.get_future().add_done_callback(lambda _: completions.submit(self._complete))

    def _complete(self):
        """Set the Future from our Work's outcome, once (its callbacks run here)."""
        with self._lock:
            if self._claimed or not self._ours.get_future().done():
                return
            self._claimed = True
        error = self._ours.exception()
        if error is None:
            self._future.set_result(self._result)
        else:
            self._future.set_exception(error)

    def _drive(self):
        try:
            self._wait_ours(None)
        except Exception:       # noqa: BLE001  (delivered through the Future)
            pass
        self._complete()

    def _wait_ours(self, limit):
        if self._scope is None:
            self._ours.wait(limit)
            return
        with self._scope():
            self._ours.wait(limit)

    def wait(self, timeout=timedelta(0)) -> bool:
        if self._ours is None:
            if self._done is not None:
                self._future.wait()         # the current stream waits for the collective
            return True
        self._wait_ours(_wait_limit(timeout))
        if self._ours._requests is not None or (self._completions is not None
                                                and self._completions.is_current()):
            # p2p, or a Future callback waiting for another operation whose completion is
            # queued behind it on this very thread: complete it now
            self._complete()
        # Future.value() is valid once wait() returns, so wait until it is set (its
        # callbacks may still be running: they are not part of the operation).
        self._future.wait()
        return True

    def get_future(self) -> Future:
        if self._ours is not None and self._ours._requests is not None:
            with self._lock:
                drive, self._driven = not self._driven and not self._claimed, True
            if drive:
                threading.Thread(target=self._drive, daemon=True,
                                 name=f"collectives-c10d-{self._operation}").start()
        return self._future

    def is_completed(self) -> bool:
        if self._done is not None:
            return self._done.query()
        if self._ours is None:
            return True
        if self._scope is None:
            return self._ours.is_completed()
        with self._scope():
            return self._ours.is_completed()

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        return None if self._ours is None else self._ours.exception()

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def source_rank(self) -> int:
        if self.source_rank_value is None:
            raise ValueError(f"{self._operation}: source_rank is known only for a completed "
                             f"receive from any source")
        return self.source_rank_value

    _source_rank = source_rank

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<collectives.c10d.Work {self._operation} {state}>"


# -- the process group ------------------------------------------------------------------------


def _then(run, finish, *args):
    def run_and_finish():
        run()
        finish(*args)
    return run_and_finish


def _in_order(runs):
    def run_all():
        for run in runs:
            run()
    return run_all


def _tensors_in(items):
    """The torch tensors of a call's arguments (lists of them, lists of lists)."""
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _tensors_in(item)


def _on_device(operation):
    """Route a collective by its tensors' device: CPU tensors run on the socket group (the
    callback lane inside a callback), CUDA tensors on the GPU group, inside its call scope
    (this rank's GPU, torch's current stream as CuPy's), so that every copy the call makes
    and the collective itself are ordered after the work that produced the tensors."""
    def wrap(method):
        @functools.wraps(method)
        def routed(self, *args, **kwargs):
            device = self._device(operation, (args, list(kwargs.values())))
            if device is None:
                return method(self, *args, **kwargs)
            group = self._gpu_group(device, operation)
            outer, self._routed.group = getattr(self._routed, "group", None), group
            try:
                with group.transport.call_scope(list(_tensors_in(args)))():
                    return method(self, *args, **kwargs)
            finally:
                self._routed.group = outer
        return routed
    return wrap


class ProcessGroupCollectives(dist.ProcessGroup):
    """A torch process group whose collectives run on our algorithms (see the module
    docstring). Made by torch through :func:`create_backend`; ``group`` is ours."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, *, group_name: str = "",
                 global_ranks=None):
        super().__init__(rank, size)      # (store, rank, size) makes no Python subclass in torch 2.13
        self._group_name, self._group_desc = group_name, ""
        limit = _seconds(timeout)
        self._store = _TorchStore(store, limit)
        transport = transports.create(TRANSPORT, rank=rank, world_size=size,
                                      store=self._store, timeout=limit)
        group_id = next(_group_ids)
        ranks = list(global_ranks) if global_ranks else None
        self._main = ProcessGroup(transport, backend=BACKEND, timeout=limit, group_id=group_id,
                                  ranks=ranks, name=group_name)
        # Collectives called from Future callbacks (PowerSGD's) run on this lane: the same
        # ranks and connections, tags of their own. Callbacks run in the same order on every
        # rank, but where they run (in the thread that registers one on a finished Future,
        # else on the completion thread) and so when, relative to this rank's other calls,
        # differs from rank to rank: on the main group's one sequence of calls they would
        # pair with other calls.
        self._lane = ProcessGroup(SubgroupTransport(transport, range(size), LANE_ID),
                                  backend=BACKEND, timeout=limit, group_id=group_id,
                                  ranks=ranks, name=f"{group_name} callbacks")
        self._completions = _Completions(f"collectives-c10d-rank{rank}-group{group_id}")
        # CUDA tensors run on a group over the NCCL transport, made at the first call that
        # brings them (every rank makes that call, in the same place of its sequence, so the
        # communicator's creation is collective as NCCL needs), on that tensor's GPU.
        self._gpu = None
        self._gpu_args = dict(backend=BACKEND, timeout=limit, group_id=group_id, ranks=ranks,
                              name=f"{group_name} cuda")
        self._routed = threading.local()    # .group: the GPU group during a call on CUDA

    @property
    def group(self) -> ProcessGroup:
        """Our group that this thread's call runs on: the GPU group while a call on CUDA
        tensors is made; else the callback lane inside a callback of one of our Futures,
        else the main group."""
        routed = getattr(self._routed, "group", None)
        if routed is not None:
            return routed
        return self._lane if in_callback() else self._main

    def _gpu_group(self, device, operation) -> ProcessGroup:
        """The group of this rank's GPU ``device`` (made at its first call)."""
        if self._gpu is not None:
            mine = self._gpu.transport.device
            if device.index != mine:
                raise ValueError(f"{self._where(operation)}: the tensors are on {device}, but "
                                 f"this process group runs on cuda:{mine} (one GPU per rank, "
                                 f"the one of its first CUDA call); call "
                                 f"torch.cuda.set_device once, before any collective")
            return self._gpu
        usable, why = transports.available(GPU_TRANSPORT)
        if not usable:
            raise RuntimeError(f"{self._where(operation)}: the tensors are on {device}, and "
                               f"the {BACKEND} backend runs CUDA tensors on its "
                               f"{GPU_TRANSPORT} transport, which is not usable here: {why}")
        transport = transports.module(GPU_TRANSPORT).create(
            rank=self._main.rank, world_size=self._main.size, store=self._store,
            timeout=self._main.timeout, device=device.index)
        try:
            self._gpu = ProcessGroup(transport, **self._gpu_args)
        except BaseException:
            transport.close()       # every rank fails alike; a later call starts anew
            raise
        return self._gpu

    def _device(self, operation, items):
        """The CUDA device of a call's tensors, or None for CPU tensors (and calls with none);
        tensors on more than one device are a ValueError, before anything moves."""
        devices = set()
        for t in _tensors_in(items):
            devices.add(t.device)
        cuda = [d for d in devices if d.type == "cuda"]
        if not cuda:
            return None
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            raise ValueError(f"{self._where(operation)}: the tensors of one call must be on "
                             f"one device, got {names}")
        device = cuda[0]
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def getBackendName(self) -> str:        # noqa: N802  (torch's names, called from C++)
        return BACKEND

    # torch's ProcessGroup keeps its name in its C++ backends, which a Python group has none
    # of: without these, resolving the group by name (functional collectives, DTensor, FSDP2)
    # fails with "ProcessGroup name not set".
    def setGroupName(self, name: str) -> None:     # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:                 # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:     # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:                 # noqa: N802
        return self._group_desc

    def __repr__(self):
        return f"ProcessGroupCollectives(rank={self.group.rank}, size={self.group.size})"

    # -- validation ---------------------------------------------------------------------------

    def _where(self, operation) -> str:
        return f"{operation} on rank {self.group.rank}"

    def _flat(self, tensor, operation, name="tensor"):
        """A flat view of a tensor (zero copy): numpy for CPU, CuPy for CUDA tensors, which
        ``_on_device`` sent to the GPU group; anything else raises first."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self._where(operation)}: {name} must be a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if tensor.device.type not in ("cpu", "cuda"):
            raise TypeError(f"{self._where(operation)}: {name} is on {tensor.device}; the "
                            f"{BACKEND} torch backend takes CPU and CUDA tensors")
        if tensor.layout != torch.strided:
            raise TypeError(f"{self._where(operation)}: {name} has layout {tensor.layout}; "
                            f"only dense tensors are supported")
        return tensors.flat(tensor, operation, self.group.rank, name)

    def _flats(self, items, operation, name, length=None):
        if not isinstance(items, (list, tuple)):
            raise TypeError(f"{self._where(operation)}: {name} must be a list of tensors, got "
                            f"{type(items).__name__}")
        if length is not None and len(items) != length:
            raise ValueError(f"{self._where(operation)}: {name} must hold {length} tensors (one "
                             f"per rank of the group), got {len(items)}")
        return [self._flat(t, operation, f"{name}[{i}]") for i, t in enumerate(items)]

    def _single(self, items, operation, name="tensors"):
        """torch passes a list of one tensor per device; this backend has one device."""
        if not isinstance(items, (list, tuple)) or len(items) != 1:
            got = len(items) if isinstance(items, (list, tuple)) else type(items).__name__
            raise ValueError(f"{self._where(operation)}: {name} must be a list of exactly one "
                             f"tensor (the {BACKEND} backend has one device per rank), got {got}")
        return items[0]

    def _same_dtype(self, operation, like, views, name):
        for i, view in enumerate(views):
            if view.dtype != like.dtype:
                raise TypeError(f"{self._where(operation)}: {name}[{i}] has dtype {view.dtype}, "
                                f"the tensor {like.dtype}; they must match")

    def _root(self, opts, operation):
        root = int(opts.rootRank)
        if not 0 <= root < self.group.size:
            raise ValueError(f"{self._where(operation)}: root rank {root} is out of range for a "
                             f"group of size {self.group.size}")
        if getattr(opts, "rootTensor", 0) != 0:
            raise ValueError(f"{self._where(operation)}: rootTensor must be 0 (one tensor per "
                             f"rank), got {opts.rootTensor}")
        return root

    def _op(self, opts, operation):
        kind = getattr(opts.reduceOp, "op", opts.reduceOp)
        if kind == dist.ReduceOp.PREMUL_SUM:
            raise ValueError(f"{self._where(operation)}: ReduceOp.PREMUL_SUM is not supported "
                             f"by the {BACKEND} backend; scale the tensor and use SUM")
        return ReduceOp.parse(kind)

    @staticmethod
    def _timeout(opts):
        """The call's own timeout (torch's opts.timeout), else None: the group's."""
        limit = _seconds(getattr(opts, "timeout", None))
        return limit if limit is not None and limit > 0 else None

    # -- running ------------------------------------------------------------------------------

    def _launch(self, operation, run, result, opts=None) -> Work:
        """The end of every collective: run now when torch waits at once (errors raise
        here) or when a Future callback calls it (its lane has no worker: callbacks run one
        at a time), else queue it on the group's worker and hand back a Work."""
        group = self.group
        if group is self._gpu and group is not None:
            # Enqueued now, on the caller's current stream (the transport's call scope), as
            # NCCL's own backend does: the host never waits, and the Work is complete at once
            # with a CUDA-aware Future (torch's), whose wait() orders the waiting thread's
            # current stream after the collective.
            _work.call(group, run, False, result)
            device = torch.device("cuda", group.transport.device)
            future = _TorchFuture(devices=[device])
            future.set_result(result)
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(device))
            return Work(operation, result, future=future, done=done)
        if group is self._lane or (opts is not None and not getattr(opts, "asyncOp", True)):
            _work.call(group, run, False, result)
            return Work(operation, result)
        return Work(operation, result, _work.call(group, run, True, result), self._completions)

    # -- collectives --------------------------------------------------------------------------

    @_on_device("broadcast")
    def broadcast(self, tensors_, opts=_c10d.BroadcastOptions()):
        """Args: tensors_ (one tensor: the data on the root, the output elsewhere), opts
        (rootRank: a group rank). Returns: Work of ``tensors_``."""
        buf = self._flat(self._single(tensors_, "broadcast"), "broadcast")
        run = self.group.prepare("broadcast", output=buf, root=self._root(opts, "broadcast"),
                                 timeout=self._timeout(opts))
        return self._launch("broadcast", run, tensors_, opts)

    @_on_device("all_reduce")
    def allreduce(self, tensors_, opts=_c10d.AllreduceOptions()):
        """Args: tensors_ (one tensor, reduced in place), opts (reduceOp). Returns: Work of
        ``tensors_``."""
        if isinstance(tensors_, torch.Tensor):
            tensors_ = [tensors_]
        if getattr(opts, "sparseIndices", None) is not None:
            raise TypeError(f"{self._where('all_reduce')}: all_reduce with sparseIndices is "
                            f"not supported (sparse COO tensors are)")
        tensor = self._single(tensors_, "all_reduce")
        if tensors.is_sparse_coo(tensor):
            run = sparse.all_reduce(self.group, tensor, self._op(opts, "all_reduce"),
                                    self._timeout(opts))
            return self._launch("all_reduce", run, tensors_, opts)
        buf = self._flat(tensor, "all_reduce")
        run = self.group.prepare("all_reduce", output=buf, op=self._op(opts, "all_reduce"),
                                 timeout=self._timeout(opts))
        return self._launch("all_reduce", run, tensors_, opts)

    @_on_device("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors_, opts=_c10d.AllreduceCoalescedOptions()):
        """Args: tensors_ (any number, reduced in place; one all_reduce per dtype over their
        concatenation), opts (reduceOp). Returns: Work of ``tensors_``."""
        views = self._flats(tensors_, "all_reduce_coalesced", "tensors")
        op, limit = self._op(opts, "all_reduce_coalesced"), self._timeout(opts)
        runs = []
        for dtype in dict.fromkeys(v.dtype for v in views):
            same = [v for v in views if v.dtype == dtype]
            whole = tensors.concatenate(same, same[0])
            run = self.group.prepare("all_reduce", output=whole, op=op, timeout=limit)
            runs.append(_then(run, tensors.split_into, whole, same))
        return self._launch("all_reduce_coalesced", _in_order(runs), tensors_, opts)

    @_on_device("reduce")
    def reduce(self, tensors_, opts=_c10d.ReduceOptions()):
        """Args: tensors_ (one tensor; the result lands in it on the root only), opts
        (rootRank, reduceOp). Returns: Work of ``tensors_``."""
        buf = self._flat(self._single(tensors_, "reduce"), "reduce")
        root = self._root(opts, "reduce")
        run = self.group.prepare("reduce", input=buf,
                                 output=buf if self.group.rank == root else None, root=root,
                                 op=self._op(opts, "reduce"), timeout=self._timeout(opts))
        return self._launch("reduce", run, tensors_, opts)

    def _all_gather_run(self, outs, inp, opts, operation):
        """One all_gather into the list ``outs`` (sizes may differ: all-gather-v)."""
        views = self._flats(outs, operation, "output_tensors", self.group.size)
        buf = self._flat(inp, operation, "input_tensor")
        self._same_dtype(operation, buf, views, "output_tensors")
        sizes = [v.size for v in views]
        whole = tensors.empty(buf, sum(sizes))
        counts = None if all(s == buf.size for s in sizes) else sizes
        run = self.group.prepare("all_gather", input=buf, output=whole, counts=counts,
                                 timeout=self._timeout(opts))
        return _then(run, tensors.split_into, whole, views)

    @_on_device("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=_c10d.AllgatherOptions()):
        """Args: output_tensors ([[one tensor per rank]]), input_tensors ([this rank's]).
        Returns: Work of ``output_tensors``."""
        outs = self._single(output_tensors, "all_gather", "output_tensors")
        inp = self._single(input_tensors, "all_gather", "input_tensors")
        run = self._all_gather_run(outs, inp, opts, "all_gather")
        return self._launch("all_gather", run, output_tensors, opts)

    @_on_device("all_gather_coalesced")
    def allgather_coalesced(self, output_lists, input_tensors, opts=_c10d.AllgatherOptions()):
        """Args: output_lists (one list per rank, each one tensor per input, as torch and
        gloo take them), input_tensors. Returns: Work of ``output_lists``."""
        size = self.size()
        if len(output_lists) != size or any(len(outs) != len(input_tensors)
                                            for outs in output_lists):
            raise ValueError(f"{self._where('all_gather_coalesced')}: output_lists must hold "
                             f"{size} lists (one per rank) of {len(input_tensors)} tensors "
                             f"(one per input), got {[len(o) for o in output_lists]}")
        runs = [self._all_gather_run([outs[i] for outs in output_lists], inp, opts,
                                     "all_gather_coalesced")
                for i, inp in enumerate(input_tensors)]
        return self._launch("all_gather_coalesced", _in_order(runs), output_lists, opts)

    def _gather_into_run(self, output, input, opts, operation):
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        return self.group.prepare("all_gather", input=buf, output=out,
                                  timeout=self._timeout(opts))

    @_on_device("all_gather_single")
    def all_gather_single(self, output, input, opts=_c10d.AllgatherOptions()):
        """Args: output (size x the input's elements, rank r's block at r), input.
        Returns: Work of ``[output]``."""
        run = self._gather_into_run(output, input, opts, "all_gather_single")
        return self._launch("all_gather_single", run, [output], opts)

    _allgather_base = all_gather_single

    @_on_device("all_gather_single_coalesced")
    def all_gather_single_coalesced(self, outputs, inputs, opts=_c10d.AllgatherOptions()):
        """Args: outputs, inputs (pairs, as all_gather_single's). Returns: Work of
        ``outputs``."""
        self._pairs(outputs, inputs, "all_gather_single_coalesced")
        runs = [self._gather_into_run(o, i, opts, "all_gather_single_coalesced")
                for o, i in zip(outputs, inputs)]
        return self._launch("all_gather_single_coalesced", _in_order(runs), list(outputs), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _pairs(self, outputs, inputs, operation):
        if not isinstance(outputs, (list, tuple)) or not isinstance(inputs, (list, tuple)) \
                or len(outputs) != len(inputs):
            raise ValueError(f"{self._where(operation)}: outputs and inputs must be lists of "
                             f"equal length")

    @_on_device("gather")
    def gather(self, output_tensors, input_tensors, opts=_c10d.GatherOptions()):
        """Args: output_tensors ([[one tensor per rank]] on the root, [] elsewhere),
        input_tensors ([this rank's]), opts (rootRank). Returns: Work of
        ``output_tensors``."""
        root = self._root(opts, "gather")
        buf = self._flat(self._single(input_tensors, "gather", "input_tensors"), "gather")
        views = self._rooted(output_tensors, root, buf, "gather", "output_tensors")
        whole = tensors.empty(buf, buf.size * self.group.size) if views is not None else None
        run = self.group.prepare("gather", input=buf, output=whole, root=root,
                                 timeout=self._timeout(opts))
        if whole is not None:
            run = _then(run, tensors.split_into, whole, views)
        return self._launch("gather", run, output_tensors, opts)

    @_on_device("scatter")
    def scatter(self, output_tensors, input_tensors, opts=_c10d.ScatterOptions()):
        """Args: output_tensors ([this rank's block]), input_tensors ([[one tensor per rank]]
        on the root, [] elsewhere), opts (rootRank). Returns: Work of ``output_tensors``."""
        root = self._root(opts, "scatter")
        out = self._flat(self._single(output_tensors, "scatter", "output_tensors"), "scatter")
        views = self._rooted(input_tensors, root, out, "scatter", "input_tensors")
        whole = tensors.concatenate(views, out) if views is not None else None
        run = self.group.prepare("scatter", input=whole, output=out, root=root,
                                 timeout=self._timeout(opts))
        return self._launch("scatter", run, output_tensors, opts)

    def _rooted(self, lists, root, like, operation, name):
        """gather's outputs / scatter's inputs: one list of one tensor per rank on the root,
        each like ``like``; nothing elsewhere. Returns the root's views, else None."""
        if self.group.rank != root:
            if lists and any(len(entry) for entry in lists):
                raise ValueError(f"{self._where(operation)}: {name} must be empty on ranks "
                                 f"other than the root ({root})")
            return None
        views = self._flats(self._single(lists, operation, name), operation, name,
                            self.group.size)
        for i, view in enumerate(views):
            if view.size != like.size or view.dtype != like.dtype:
                raise ValueError(f"{self._where(operation)}: {name}[{i}] has {view.size} "
                                 f"{view.dtype} elements; each must match the tensor "
                                 f"({like.size} {like.dtype})")
        return views

    @_on_device("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=_c10d.ReduceScatterOptions()):
        """Args: output_tensors ([this rank's block]), input_tensors ([[one tensor per rank]];
        sizes may differ), opts (reduceOp). Returns: Work of ``output_tensors``."""
        out = self._flat(self._single(output_tensors, "reduce_scatter", "output_tensors"),
                         "reduce_scatter")
        views = self._flats(self._single(input_tensors, "reduce_scatter", "input_tensors"),
                            "reduce_scatter", "input_tensors", self.group.size)
        self._same_dtype("reduce_scatter", out, views, "input_tensors")
        sizes = [v.size for v in views]
        whole = tensors.concatenate(views, out)
        run = self.group.prepare("reduce_scatter", input=whole, output=out,
                                 counts=None if all(s == out.size for s in sizes) else sizes,
                                 op=self._op(opts, "reduce_scatter"),
                                 timeout=self._timeout(opts))
        return self._launch("reduce_scatter", run, output_tensors, opts)

    def _scatter_from_run(self, output, input, opts, operation):
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        return self.group.prepare("reduce_scatter", input=buf, output=out,
                                  op=self._op(opts, operation), timeout=self._timeout(opts))

    @_on_device("reduce_scatter_single")
    def reduce_scatter_single(self, output, input, opts=_c10d.ReduceScatterOptions()):
        """Args: output (this rank's block), input (size blocks), opts (reduceOp).
        Returns: Work of ``[output]``."""
        run = self._scatter_from_run(output, input, opts, "reduce_scatter_single")
        return self._launch("reduce_scatter_single", run, [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    @_on_device("reduce_scatter_single_coalesced")
    def reduce_scatter_single_coalesced(self, outputs, inputs,
                                        opts=_c10d.ReduceScatterOptions()):
        """Args: outputs, inputs (pairs, as reduce_scatter_single's). Returns: Work of
        ``outputs``."""
        self._pairs(outputs, inputs, "reduce_scatter_single_coalesced")
        runs = [self._scatter_from_run(o, i, opts, "reduce_scatter_single_coalesced")
                for o, i in zip(outputs, inputs)]
        return self._launch("reduce_scatter_single_coalesced", _in_order(runs), list(outputs),
                            opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_on_device("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=_c10d.AllToAllOptions()):
        """Args: output_tensors (block j comes from rank j), input_tensors (block j goes to
        rank j); sizes may differ (all-to-all-v). Returns: Work of ``output_tensors``."""
        p = self.group.size
        outs = self._flats(output_tensors, "all_to_all", "output_tensors", p)
        ins = self._flats(input_tensors, "all_to_all", "input_tensors", p)
        self._same_dtype("all_to_all", outs[0], ins, "input_tensors")
        self._same_dtype("all_to_all", outs[0], outs, "output_tensors")
        sends, recvs = [v.size for v in ins], [v.size for v in outs]
        counts = None
        if len(set(sends + recvs)) > 1:
            counts = self._all_to_all_counts(sends, recvs, "all_to_all")
        whole_in = tensors.concatenate(ins, outs[0])
        whole_out = tensors.empty(outs[0], sum(recvs))
        run = self.group.prepare("all_to_all", input=whole_in, output=whole_out, counts=counts,
                                 timeout=self._timeout(opts))
        return self._launch("all_to_all", _then(run, tensors.split_into, whole_out, outs),
                            output_tensors, opts)

    @_on_device("all_to_all_single")
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=_c10d.AllToAllOptions()):
        """Args: output, input, output_split_sizes / input_split_sizes (rows of dim 0 per
        rank; empty: an even split). Returns: Work of ``[output]``."""
        operation = "all_to_all_single"
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        counts = None
        if len(output_split_sizes) or len(input_split_sizes):
            sends = self._splits(input_split_sizes, buf.size, tensors.rows(input),
                                 "input_split_sizes")
            recvs = self._splits(output_split_sizes, out.size, tensors.rows(output),
                                 "output_split_sizes")
            counts = self._all_to_all_counts(sends, recvs, operation)
        run = self.group.prepare("all_to_all", input=buf, output=out, counts=counts,
                                 timeout=self._timeout(opts))
        return self._launch(operation, run, [output], opts)

    alltoall_base = all_to_all_single

    def _splits(self, sizes, total, per_row, name):
        p = self.group.size
        if not len(sizes):
            if total % p:
                raise ValueError(f"{self._where('all_to_all_single')}: {total} elements do not "
                                 f"split evenly over {p} ranks; give {name}")
            return [total // p] * p
        sizes = [int(s) for s in sizes]
        if len(sizes) != p or any(s < 0 for s in sizes) or sum(sizes) * per_row != total:
            raise ValueError(f"{self._where('all_to_all_single')}: {name} {sizes} must be {p} "
                             f"non-negative row counts adding up to the tensor's rows")
        return [s * per_row for s in sizes]

    def _all_to_all_counts(self, sends, recvs, operation):
        """The full matrix counts[i][j] (i sends to j) our schedules need on every rank
        (ProcessGroup.all_to_all_matrix: one small collective, run now)."""
        group = self.group
        return group.all_to_all_matrix(sends, recvs, operation,
                                       lambda run: _work.call(group, run, False, []))

    def barrier(self, opts=_c10d.BarrierOptions()):
        """Args: opts (device_ids are ignored). Returns: Work of ``[]``. A barrier of the
        ranks' hosts (CPU group); where this group runs CUDA tensors, each rank first waits
        for the GPU work queued on its current stream, as NCCL's barrier does."""
        gpu = self._gpu
        if gpu is not None and self.group is not self._lane:
            device = gpu.transport.device
            stream = torch.cuda.current_stream(device)
            with gpu.xp.cuda.Device(device), gpu.xp.cuda.ExternalStream(stream.cuda_stream,
                                                                        device):
                gpu.transport.synchronize(self._timeout(opts) or gpu.timeout,
                                          operation="barrier")
        run = self.group.prepare("barrier", timeout=self._timeout(opts))
        return self._launch("barrier", run, [], opts)

    # -- point-to-point -----------------------------------------------------------------------
    # Straight onto the transport in the group's user-tag space, without draining queued
    # collectives first: torch's p2p is independent of pending async collectives, and a rank
    # whose send waited for its own queued all_reduce could deadlock with a peer that receives
    # before it reduces.

    def _p2p(self, kind, tensors_, peer, tag):
        operation = kind
        # matched by tag, never by order: no lane; CUDA tensors on the GPU group
        group = self._gpu if self.group is self._gpu else self._main
        buf = self._flat(self._single(tensors_, operation), operation)
        if peer is None and group is self._gpu:
            raise ValueError(f"{self._where('recv')}: a receive from any source is not "
                             f"possible on CUDA tensors ({GPU_TRANSPORT} matches messages by "
                             f"sender); name the sender")
        if peer is not None:
            peer = int(peer)
            if not 0 <= peer < group.size or peer == group.rank:
                raise ValueError(f"{self._where(operation)}: peer {peer} must be another rank "
                                 f"of the group (0..{group.size - 1})")
        wire_tag = group.p2p_tag(tag, operation)
        transport = group.transport
        if kind == "send":
            request = transport.isend(buf, peer, wire_tag)
        else:
            request = transport.irecv(buf, -1 if peer is None else peer, wire_tag)
        # GPU transfers are issued and completed (the host waits) on the caller's stream,
        # whichever thread waits for them
        scope = transport.call_scope(list(tensors_))
        work = Work(operation, list(tensors_),
                    _work.Work(list(tensors_), requests=[request], transport=transport),
                    scope=scope)
        if kind == "recv":
            def record():
                source = getattr(request, "source", None) if peer is None else peer
                work.source_rank_value = None if source is None or source < 0 else source
            work._ours._on_done = record
        return work

    @_on_device("send")
    def send(self, tensors_, dstRank, tag=0):       # noqa: N803  (torch's names)
        """Args: tensors_ (one tensor), dstRank (a group rank), tag. Returns: Work."""
        return self._p2p("send", tensors_, dstRank, tag)

    @_on_device("recv")
    def recv(self, tensors_, srcRank, tag=0):       # noqa: N803
        """Args: tensors_ (one tensor, written), srcRank (a group rank), tag. Returns:
        Work."""
        return self._p2p("recv", tensors_, srcRank, tag)

    @_on_device("recv")
    def recv_anysource(self, tensors_, tag=0):
        """Args: tensors_ (one tensor, written), tag. Returns: Work whose
        ``_source_rank()`` is the sender's group rank once complete."""
        return self._p2p("recv", tensors_, None, tag)

    # -- life ---------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work and its Futures, then close the connections
        (destroy_process_group)."""
        _work.stop(self._main)
        self._completions.stop()
        self._main.transport.close()
        if self._gpu is not None:
            self._gpu.transport.close()

    def abort(self) -> None:
        """Fail every pending and later operation of the group, on every rank."""
        for group in (self._main, self._gpu):
            abort = getattr(group.transport, "abort", None) if group is not None else None
            if abort is not None:
                abort(f"{BACKEND} process group aborted on rank {self._main.rank}")


def create_backend(options, backend_options=None) -> ProcessGroupCollectives:
    """torch's creator of the backend (the extended API): one of our groups per torch
    process group, meeting through ``options.store``."""
    return ProcessGroupCollectives(options.store, options.group_rank, options.group_size,
                                   options.timeout, group_name=str(options.group_id),
                                   global_ranks=list(options.global_ranks_in_group) or None)


def _register() -> None:
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                      devices=["cpu", "cuda"])
    _torch_rendezvous._rendezvous_handlers["env"] = _env_rendezvous


_register()
