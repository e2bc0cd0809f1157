"""Leaving an MPI job: an exit hook that makes a rank's exit end the job instead of hanging.

mpi4py calls MPI_Finalize as the interpreter exits, and MPI_Finalize returns only once every
rank has called it (MPICH: a PMI barrier). A rank that leaves while a peer is blocked in a
collective on it -- after catching a timeout and calling sys.exit(1), or by a plain return
-- therefore waits there as long as the peer does: up to the peer's timeout, or forever for
a peer that never calls. So, before mpi4py's Finalize, every rank announces on a
communicator of its own that it is leaving and lets Finalize run only once every rank has;
while it waits it aborts the job where waiting cannot end well. ``MPITransport.guard_exit``
installs it.
"""
from __future__ import annotations

import atexit
import sys
import time

import numpy as np

_EXIT_TAG = 0
_EXIT_GRACE_SECONDS = 1.0    # a rank leaving with a non-zero code, or holding a peer's unreceived
                             # collective message, waits this long for the others to leave too
ABORT_GRACE_SECONDS = 0.2    # for mpiexec to forward the message before the abort kills every rank
_MAX_EXIT_PAUSE = 0.01       # between polls while waiting for peers that are still busy

_exit_guard = None           # one per process: MPI is initialized and finalized once


class ExitGuard:
    """At interpreter exit (an atexit hook, so before mpi4py's Finalize, a C-level exit
    function that runs after every atexit hook) this rank tells every other rank that it is
    leaving and waits until all have said the same, then lets Finalize run. While it waits:

    - leaving with a non-zero exit code (sys.exit(1) after a timeout, an uncaught exception
      after destroy_process_group): the others get ``_EXIT_GRACE_SECONDS`` to leave too (a
      job whose ranks all exit 2 ends with 2 and no abort), then it prints
      ``collectives: rank R of N is exiting with code C after <error>; aborting the MPI job``
      and aborts with that code;
    - leaving with code 0 or an unknown code (``raise SystemExit(n)`` is not seen): a peer
      that has not left and sent this rank a message of a collective this rank never
      started waits for it in vain: abort, naming both. Otherwise wait as MPI_Finalize
      would: the other ranks may be busy, and each leaves through this guard in turn. That
      includes a peer still inside a collective that failed on this rank (a size mismatch
      seen here, say): it sees its own error at its timeout, then leaves.

    Limits: a peer blocked only on receiving from this rank (a broadcast from it, say), or in
    MPI's own collectives (``native``), sends nothing to see; it fails at its own timeout
    (native collectives have none), and its exit then ends the job. ``os._exit`` and signals
    skip atexit: mpiexec (Hydra) ends the job itself when a rank exits without Finalize.
    """

    def __init__(self, transport, leaving, started):
        self.transport = transport
        self.leaving = leaving
        self.started = started
        self.MPI = transport._MPI
        self.comm = self.MPI.COMM_WORLD.Dup()    # collective: every rank, in init_process_group
        atexit.register(self.leave)

    def leave(self) -> None:
        MPI = self.MPI
        if MPI.Is_finalized() or self.comm == MPI.COMM_NULL:
            return
        rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        try:
            code, error = self.leaving()
            self._wait_for_peers(rank, size, code, error)
        except Exception as exc:       # never fail the exit; Finalize follows as it would have
            sys.stderr.write(f"collectives: rank {rank}: leaving the MPI job failed "
                             f"({type(exc).__name__}: {exc})\n")

    def _wait_for_peers(self, rank, size, code, error):
        MPI = self.MPI
        peers = [r for r in range(size) if r != rank]
        empty = np.empty(0, np.uint8)
        recvs = [self.comm.Irecv([empty, MPI.BYTE], peer, _EXIT_TAG) for peer in peers]
        sends = [self.comm.Isend([empty, MPI.BYTE], peer, _EXIT_TAG) for peer in peers]
        running = set(peers)
        comms = self._communicators()
        start = time.monotonic()
        stranded_since = None
        pause = 1e-4
        while True:
            done = MPI.Request.Testsome(recvs)
            for index in done or ():
                running.discard(peers[index])
            if not running:
                break
            now = time.monotonic()
            if code:
                if now - start >= _EXIT_GRACE_SECONDS:
                    self._abort(rank, size, code, error,
                                f"{_ranks(running)} {_has(running)} not finished")
            else:
                stranded = self._stranded(comms, running)
                if stranded is None:
                    stranded_since = None
                elif stranded_since is None:
                    stranded_since = now
                elif now - stranded_since >= _EXIT_GRACE_SECONDS:
                    peer, tag = stranded
                    self._abort(rank, size, code, error, None,
                                waiter=f"rank {peer} waits for it in a collective that rank "
                                       f"{rank} never called (tag {tag})")
            time.sleep(pause)
            pause = min(pause * 2, _MAX_EXIT_PAUSE)
        MPI.Request.Waitall(sends)      # every peer has posted its receive by now
        self._drop_unreceived(comms)
        self.comm.Free()

    def _drop_unreceived(self, comms):
        """Receive and drop every message still unreceived: one no rank receives now (a failed
        call's: another call's message, a notice, a send given up on). MPICH's MPI_Finalize
        fails on a communicator that holds one, skips the launcher's goodbye, and mpiexec
        kills the job. Every peer has left: what it sent here went out before its leaving."""
        MPI = self.MPI
        status = MPI.Status()
        for transport, _ in comms:
            while transport.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):
                stray = np.empty(status.Get_count(MPI.BYTE), np.uint8)
                transport.comm.Recv([stray, MPI.BYTE], status.Get_source(), status.Get_tag())

    def _communicators(self):
        """(transport, {world rank: rank in it}) of the world and every live subgroup."""
        found, todo = [], [self.transport]
        while todo:
            transport = todo.pop()
            if transport.comm != self.MPI.COMM_NULL:
                found.append((transport, {w: i for i, w in enumerate(transport.world_ranks)}))
            todo.extend(transport._subgroups)
        return found

    def _stranded(self, comms, running):
        """(peer, tag) of an unreceived message from a rank still running, of a collective
        (odd tags) that this rank never started, or None."""
        MPI = self.MPI
        status = MPI.Status()
        for transport, members in comms:
            if not transport.comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG):
                continue                # the usual case: nothing unreceived at all
            for peer in sorted(running):
                source = members.get(peer)
                if source is not None and transport.comm.Iprobe(source, MPI.ANY_TAG, status):
                    tag = transport.group_tag(status.Get_tag())     # the signature off
                    if tag & 1 and self.started(transport, tag) is False:
                        return peer, tag
        return None

    def _abort(self, rank, size, code, error, others, waiter=None):
        how = "" if code is None else f" with code {code}"
        if error is not None:
            first = (str(error).splitlines() or [""])[0]
            how += f" after {type(error).__name__}" + (f": {first}" if first else "")
        message = f"collectives: rank {rank} of {size} is exiting{how}"
        if waiter is not None:
            message += f" while {waiter}"
        message += "; aborting the MPI job" + (f" ({others})" if others else "")
        # One write, then a moment for mpiexec to forward it: the abort kills every rank.
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        time.sleep(ABORT_GRACE_SECONDS)
        self.transport.abort(message, code or 1)


def _ranks(ranks, most=8) -> str:
    ranks = sorted(ranks)
    text = ", ".join(map(str, ranks[:most])) + (f", ... ({len(ranks)} in all)"
                                                if len(ranks) > most else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {text}"


def _has(ranks) -> str:
    return "have" if len(ranks) > 1 else "has"


def guard(transport, leaving, started) -> None:
    """The process's ExitGuard, made on the first call, pointed at ``transport`` on later
    ones (a new init_process_group)."""
    global _exit_guard
    if _exit_guard is None:
        _exit_guard = ExitGuard(transport, leaving, started)
    else:
        _exit_guard.transport = transport
        _exit_guard.leaving, _exit_guard.started = leaving, started
