"""What the peer-memory workers (``peer_worker.py``, ``in_place_worker.py``,
``pipelined_worker.py``) share, each one rank under ``mpiexec``: their start
(``gpu_jobs.launch``'s arguments, a traceback before the job's limit, the pid for killing a
hung job, the nccl group), their graph capture, their test data, their tally of checks and
its ``RESULT`` line (``gpu_jobs.check_results``), and their exit from a group they failed on
purpose."""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from collectives.bench.nccl import nccl_group  # noqa: E402


def start(timeout: float = 60.0):
    """(group, cupy, args) for this rank: ``--pid-dir`` (this process's pid written there as
    ``pid.RANK``), ``--deadline`` (every thread's stack printed and the process ended then)
    and ``--job``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid-dir", default="")
    ap.add_argument("--deadline", type=float, default=200.0)
    ap.add_argument("--job", default="")
    args = ap.parse_args()
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    group, cupy = nccl_group(timeout=timeout)
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"pid.{group.rank}"), "w") as f:
            f.write(str(os.getpid()))
    return group, cupy, args


def capture(stream, call):
    """A CUDA graph of ``call()`` on ``stream``, captured after two calls made eagerly (the
    group's memory grown and the plan cached before capture, which cannot grow memory)."""
    with stream:
        for _ in range(2):
            call()
        stream.synchronize()
        stream.begin_capture()
        call()
        return stream.end_capture()


def replays(stream, call, src, times, seed, rank, size):
    """``call`` captured in a CUDA graph on ``stream`` (``capture``), then replayed ``times``
    times, each with new contents in ``src`` (this rank's of every rank's ``contents`` of case
    ``seed`` + the replay, set on the stream first); yields (replay, every rank's contents)
    once each replay has finished, for the caller to check what it wrote."""
    graph = capture(stream, call)
    with stream:
        for replay in range(times):
            parts = [contents(seed + replay, r, src.size, src.dtype) for r in range(size)]
            src.set(parts[rank], stream=stream)
            graph.launch(stream)
            stream.synchronize()
            yield replay, parts


def contents(seed, rank, count, dtype):
    """Rank ``rank``'s data of case ``seed``: random fractions for floating point (where the
    order of a sum shows), small integers otherwise (exact in every dtype the workers use)."""
    rng = np.random.default_rng(1000 * seed + rank)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(count).astype(dtype)
    return rng.integers(-3, 4, count).astype(dtype)


class Tally:
    """Checks run and failures of one rank."""

    def __init__(self, cupy, rank: int, size: int):
        self.cupy, self.rank, self.size = cupy, rank, size
        self.runs, self.failures = 0, []

    def check(self, label, got, want, bitwise: bool = False):
        """``got`` (a device array) equal to ``want``: by value, or bit for bit."""
        self.runs += 1
        got = self.cupy.asnumpy(got)
        same = got.tobytes() == np.ascontiguousarray(want).tobytes() if bitwise else \
            np.array_equal(got, want)
        if not same:
            bad = int((got != want).sum())
            self.failures.append(f"{label}: {bad} of {want.size} elements differ" if bad else
                                 f"{label}: equal values, other bits (signed zeros, NaNs)")

    def drained(self):
        """The device finishes everything queued: no kernel left spinning."""
        try:
            self.cupy.cuda.Device().synchronize()
            self.runs += 1
        except Exception as exc:      # noqa: BLE001
            self.failures.append(f"the device did not drain: {type(exc).__name__}: {exc}")

    def report(self):
        print("RESULT " + json.dumps({"rank": self.rank, "size": self.size, "runs": self.runs,
                                      "failures": [f[:200] for f in self.failures[:8]],
                                      "failed": len(self.failures)}), flush=True)


def peer_executor_of(group, tally):
    """The group's peer-memory executor, or None after reporting, as this rank's failure, why
    the group does not run on peer memory."""
    executor = group.executor.peer
    if executor is None:
        tally.failures.append(f"the group does not run on peer memory: "
                              f"{group.executor.peer_path}")
        tally.report()
    return executor


def leave_failed_group():
    """Exit after failing the group on purpose: it is not closed, and leaving without
    MPI_Finalize would be an "improper exit" that makes Open MPI kill the other ranks before
    they print their RESULT."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()
    os._exit(0)
