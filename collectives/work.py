"""Work and Future: handles of asynchronous operations, shaped like torch's.

Asynchronous collectives run on one worker thread per process group, in submission order
(the order their tags were assigned in), so collectives of one group never overtake each
other; a synchronous call first drains its group's queue. Point-to-point Work wraps
transport requests instead and is completed by whoever waits on it.

On a GPU transport (one whose ``call_scope`` names a device and stream) an asynchronous
collective is enqueued at the call, from the caller's thread, on the caller's current stream,
as NCCL's own backend does: a worker thread would lack the device's context, and the host
need not wait to enqueue. Its Work holds a CUDA event recorded after it; ``wait()`` makes the
waiting thread's current stream wait for that event (the host does not block), and
``is_completed()`` asks the GPU. Tensors freed by the caller right after the call are safe:
the caching allocators hand their memory out again only in that stream's order.

Limits: the worker thread and the caller may use the transport at the same time (an
``isend`` posted while an async collective runs); the local transport is thread-safe, other
transports must be too (MPI: MPI_THREAD_MULTIPLE) for such overlap.
"""
from __future__ import annotations

import queue
import threading
import weakref

from .errors import CollectiveTimeout
from .state import seconds


class Future:
    """A torch.futures.Future look-alike: wait(), value(), then(), done(),
    add_done_callback(). ``drive`` completes the future when someone waits (p2p requests)."""

    def __init__(self, drive=None):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._value = None
        self._exception = None
        self._callbacks = []
        self._drive = drive

    def _set(self, value=None, exception=None):
        with self._lock:
            if self._event.is_set():
                return
            self._value, self._exception = value, exception
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self):
        if not self._event.is_set() and self._drive is not None:
            self._drive()
        self._event.wait()
        if self._exception is not None:
            raise self._exception
        return self._value

    def value(self):
        return self.wait()

    def add_done_callback(self, callback) -> None:
        with self._lock:
            if not self._event.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def then(self, callback) -> "Future":
        """A future of ``callback(self)``, run when this one completes."""
        following = Future(drive=self._drive_quietly)

        def chain(done):
            try:
                following._set(callback(done))
            except Exception as exc:  # the callback's failure belongs to the new future
                following._set(exception=exc)
        self.add_done_callback(chain)
        return following

    def _drive_quietly(self):
        try:
            self.wait()
        except Exception:
            pass


class Work:
    """The handle ``async_op=True`` returns. ``wait`` raises the operation's error."""

    def __init__(self, result=(), *, requests=None, transport=None, on_done=None,
                 enqueued=None):
        self._result = list(result)
        self._requests = requests          # p2p: transport requests completed by wait()
        self._transport = transport
        self._on_done = on_done            # p2p: e.g. record the sender of an any-source recv
        self._enqueued = enqueued          # GPU: (GPU finished?, order the current stream)
        self._future = Future(drive=self._drive if requests is not None else None)
        self._lock = threading.Lock()
        if enqueued is not None:
            self._future._set(self._result)

    # called by the worker (collectives) or by wait() (p2p)
    def _finish(self, exception=None):
        self._future._set(self._result, exception)

    def _drive(self, timeout=None):
        with self._lock:
            if self._future.done():
                return
            try:
                self._transport.wait_all(self._requests, timeout)
                if self._on_done is not None:
                    self._on_done()
            except CollectiveTimeout:
                raise                      # still pending; a later wait may succeed
            except Exception as exc:
                self._finish(exc)
                return
            self._finish()

    def wait(self, timeout=None) -> bool:
        limit = seconds(timeout, "Work.wait")
        if self._enqueued is not None:
            self._enqueued[1]()            # the waiting stream, not the host, waits
            return True
        if self._requests is not None:
            self._drive(limit)
        elif not self._future._event.wait(limit):
            raise CollectiveTimeout(f"Work.wait: the operation did not finish within {limit} s")
        if self._future._exception is not None:
            raise self._future._exception
        return True

    def is_completed(self) -> bool:
        if self._enqueued is not None:
            return self._enqueued[0]()
        if not self._future.done() and self._requests is not None:
            if all(request.test() for request in self._requests):
                self._drive()
        return self._future.done()

    def is_success(self) -> bool:
        return self.is_completed() and self._future._exception is None

    def exception(self):
        return self._future._exception if self._future.done() else None

    def result(self):
        self.wait()
        return self._result

    def get_future(self) -> Future:
        return self._future

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self):
        state = "completed" if self._future.done() else "pending"
        return f"<collectives.Work {state}>"


class _Worker:
    """One thread running a group's asynchronous operations in order."""

    def __init__(self, name):
        self._jobs = queue.SimpleQueue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.ident = self._thread.ident
    def submit(self, run, work: Work) -> None:
        with self._cond:
            self._pending += 1
        self._jobs.put((run, work))

    def _loop(self):
        while True:
            job = self._jobs.get()
            if job is None:
                return
            run, work = job
            try:
                run()
                work._finish()
            except BaseException as exc:   # delivered to whoever waits on the Work
                work._finish(exc)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def drain(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._pending == 0)

    def stop(self) -> None:
        self.drain()
        self._jobs.put(None)
        self._thread.join()


_workers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_workers_lock = threading.Lock()


def submit(pg, run, result) -> Work:
    """Queue ``run`` on ``pg``'s worker; returns its Work."""
    with _workers_lock:
        worker = _workers.get(pg)
        if worker is None:
            worker = _workers[pg] = _Worker(f"collectives-rank{pg.rank}-group{pg.group_id}")
            pg.async_thread = worker.ident
    work = Work(result)
    worker.submit(run, work)
    return work


def drain(pg) -> None:
    """Wait until every asynchronous operation queued on ``pg`` has finished."""
    with _workers_lock:
        worker = _workers.get(pg)
    if worker is not None:
        worker.drain()


def stop(pg) -> None:
    with _workers_lock:
        worker = _workers.pop(pg, None)
    if worker is not None:
        worker.stop()


def then(run, finish, *args):
    """``run``, then ``finish(*args)`` (copying a gathered buffer into the caller's tensors) in
    the same call, so that a queued collective's Work completes only after both."""
    def run_and_finish():
        run()
        finish(*args)
    return run_and_finish


def call(pg, run, async_op: bool, result):
    """The end of every facade collective: run now, or queue and return Work. On a GPU
    transport it runs now in any case, inside the transport's ``call_scope`` (the caller's
    GPU and stream): enqueued there, with Work that orders a waiting stream after it."""
    scope = pg.transport.call_scope(result)
    if scope is None and async_op:
        return submit(pg, run, result)
    drain(pg)
    if scope is None:
        run()
        return None
    with scope():
        run()
        if async_op:
            return Work(result, enqueued=pg.transport.enqueued(result))
    return None
