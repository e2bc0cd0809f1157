"""torch's Work and Future over our operations, and the thread that completes a group's
Futures in call order."""
from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch.distributed as dist
from torch.futures import Future as _TorchFuture


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


def torch_seconds(timeout) -> float | None:
    """A timeout in torch's conventions as seconds, None where it sets none of its own: zero
    (Work.wait's default, also from C++) and negative ones (the options' unset, -1 ms). What
    is left reaches the group or our Work.wait, which apply the package's timeout rule (a
    huge value is no deadline)."""
    if timeout is None:
        return None
    limit = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return limit if limit > 0 else None


class WorkBase(dist._Work):
    """What each of our Works answers alike, given ``wait``, ``_operation``, ``_result`` and
    ``source_rank_value`` (the sender's group rank of a completed receive from any source)."""

    source_rank_value = None

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


class Work(WorkBase):
    """torch's Work over one of our operations: ``wait`` (raising the operation's error),
    ``get_future`` (a ``torch.futures.Future`` of ``result()``, as gloo's), ``is_completed``,
    ``is_success``, ``exception``, ``result``, ``synchronize``, ``source_rank`` (any-source
    receives: the sender's group rank).

    ``ours`` is our Work (collectives.work), None for an operation done at the call; a
    collective's Future is completed by its group's completion thread (``completions``), a
    receive's or send's by whoever waits for it (or, once ``get_future`` is asked for, by a
    thread of its own: nothing else would drive the transfer), inside ``scope`` (the GPU
    transport's call scope: the caller's stream) where given. A collective on CUDA tensors
    has a ``cuda.CudaWork`` instead."""

    def __init__(self, operation: str, result, ours=None, completions=None, *, scope=None):
        super().__init__()
        self._operation = operation
        self._result = result
        self._ours = ours
        self._completions = completions
        self._future = Future()
        self._scope = scope
        self._lock = threading.Lock()
        self._claimed = False               # whoever sets the Future claims it first
        self._driven = False
        self.source_rank_value = None
        if ours is None:
            self._claimed = True
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
            return True
        self._wait_ours(torch_seconds(timeout))
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

    def __repr__(self):
        state = "completed" if self.is_completed() else "pending"
        return f"<collectives.c10d.Work {self._operation} {state}>"


# -- the process group ------------------------------------------------------------------------
