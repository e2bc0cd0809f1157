"""How the bench times a row, injected per backend, and how its ranks agree on the result.

A row is measured as nccl-tests and OSU do: after the warm-up, ``batches`` times over, the
ranks meet at a barrier and each rank times ``calls`` back-to-back calls (the whole path a
user pays, ``group.prepare(...)()``); a batch's time per call is its elapsed time / calls.
The ranks' batch times are combined with a max (outside the timed region), so a batch lasts
as long as its slowest rank; p50 and p99 are taken over batches (pooled over rounds).

Clocks: ``HostClock`` (``time.perf_counter``) for the CPU backends, whose calls return when
the data has moved; ``CudaEvents`` for NCCL and peer memory, whose calls only enqueue work on
a stream: events recorded on that stream around the batch, the end event waited for.

Coordination (``barrier``, ``max_each``, ``sum``), never inside a timed region: ``GroupHost``
runs the group's own collectives (the native library's where it has one), ``MpiHost`` uses
``MPI.COMM_WORLD`` (GPU jobs under mpiexec), ``StoreHost`` the rendezvous store (GPU jobs
under collectives.run or torchrun).
"""
from __future__ import annotations

import json
import time

import numpy as np

from ..ops import ReduceOp

BATCHES = 5            # batches per row and round on the CPU: p50/p99 over these
STORE_PREFIX = "collectives/bench_nccl"


class HostClock:
    """Seconds by the host's clock: for calls that return when they are done."""

    def once(self, call) -> float:
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    def batch(self, call, calls: int) -> float:
        start = time.perf_counter()
        for _ in range(calls):
            call()
        return (time.perf_counter() - start) / calls

    def settle(self):
        """Nothing queued on a host clock: calls have finished when they return."""


class CudaEvents:
    """Seconds between CUDA events on the current stream: for calls that enqueue GPU work."""

    def __init__(self, cupy):
        self.cupy = cupy

    def _stream(self):
        return self.cupy.cuda.get_current_stream()

    def settle(self):
        self._stream().synchronize()

    def once(self, call) -> float:
        self.settle()
        start = time.perf_counter()
        call()
        self.settle()
        return time.perf_counter() - start

    def batch(self, call, calls: int) -> float:
        stream = self._stream()
        start = stream.record()
        for _ in range(calls):
            call()
        end = stream.record()
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end) / 1e3 / calls


def timed(cupy, fn, iters, reps, warmup=2):
    """p50 over ``reps`` of (event time of ``iters`` back-to-back calls) / iters, in seconds:
    the GPU timing as one function, for tools that time a call outside the bench."""
    clock = CudaEvents(cupy)
    for _ in range(warmup):
        fn()
    clock.settle()
    return float(np.median([clock.batch(fn, iters) for _ in range(reps)]))


def split(total: int, batches: int) -> tuple[int, int]:
    """(calls per batch, batches) for about ``total`` timed calls in at most ``batches``."""
    total = max(1, int(total))
    batches = max(1, min(batches, total))
    return total // batches, batches


class GroupHost:
    """Coordination through the group's own collectives (CPU backends)."""

    def __init__(self, group):
        self.group = group

    def _helper(self):
        return "native" if self.group.transport.native is not None else "ring"

    def barrier(self):
        native = self.group.transport.native is not None
        self.group.prepare("barrier", algorithm="native" if native else None)()

    def max_each(self, values) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(values)
        self.group.prepare("all_reduce", input=values, output=out, op=ReduceOp.MAX,
                           algorithm=self._helper())()
        return out

    def sum(self, value: int) -> int:
        out = np.empty(1, np.int64)
        self.group.prepare("all_reduce", input=np.array([value], np.int64), output=out,
                           op=ReduceOp.SUM, algorithm=self._helper())()
        return int(out[0])


class MpiHost:
    """Coordination through ``MPI.COMM_WORLD`` (GPU jobs under mpiexec)."""

    def __init__(self, comm=None):
        from mpi4py import MPI
        self.mpi = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self):
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return self.comm.allreduce(value, op=self.mpi.MAX)

    def max_each(self, values) -> np.ndarray:
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(values)
        self.comm.Allreduce(values, out, op=self.mpi.MAX)
        return out

    def sum(self, value: int) -> int:
        return self.comm.allreduce(value)

    def close(self):
        pass


class StoreHost:
    """Coordination through the rendezvous store (GPU jobs under a launcher).

    Each call is one round with its own keys, so every rank must make the same calls in the
    same order (the benchmark does). ``barrier``: a per-round counter; the last rank to
    arrive sets the round's release key that all wait on. ``max``/``max_each``/``sum``: every
    rank sets its values under ``<round>/<rank>`` and reads all of them (exact: floats travel
    as JSON, which round-trips them). Cost: about ``size + 3`` store round trips per call, a
    few per benchmark row. Keys of a finished round are deleted one round later (once every
    rank has provably left it). ``close``: rank 0 waits until every rank has finished with the
    store, so a store served by rank 0 (torchrun without its agent store) outlives the others'
    last reads.
    """

    def __init__(self, store, rank: int, size: int, timeout: float = 300.0,
                 prefix: str = STORE_PREFIX):
        self.store, self.rank, self.size = store, rank, size
        self.timeout, self.prefix = timeout, prefix
        self.round = 0
        self._mine = []            # keys this rank set in the previous round

    def _next(self) -> str:
        self.round += 1
        return f"{self.prefix}/{self.round}"

    def _forget_previous(self, keys):
        """Called once every rank has entered this round: none still reads the previous."""
        for key in self._mine:
            self.store.delete_key(key)
        self._mine = keys

    def barrier(self):
        base = self._next()
        release = f"{base}/release"
        if self.store.add(f"{base}/arrived", 1) == self.size:
            self.store.set(release, b"1")
        self.store.wait([release], timeout=self.timeout)
        # one rank (0) deletes the counter and release key of a finished barrier round
        self._forget_previous([f"{base}/arrived", release] if self.rank == 0 else [])

    def gather(self, value):
        """Every rank's ``value`` (a float or a list of floats), in rank order."""
        base = self._next()
        mine = f"{base}/{self.rank}"
        self.store.set(mine, json.dumps(value).encode())
        keys = [f"{base}/{r}" for r in range(self.size)]
        self.store.wait(keys, timeout=self.timeout)
        values = [json.loads(self.store.get(k)) for k in keys]
        self._forget_previous([mine])
        return values

    def max(self, value: float) -> float:
        return max(self.gather(float(value)))

    def max_each(self, values) -> np.ndarray:
        mine = [float(v) for v in np.asarray(values, dtype=np.float64)]
        return np.max(np.array(self.gather(mine), dtype=np.float64), axis=0)

    def sum(self, value: int) -> int:
        return int(sum(self.gather(int(value))))

    def close(self):
        left = f"{self.prefix}/left"
        if self.store.add(left, 1) == self.size:
            self.store.set(f"{left}/all", b"1")
        if self.rank == 0:
            self.store.wait([f"{left}/all"], timeout=self.timeout)
