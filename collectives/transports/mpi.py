"""The MPI transport: mpi4py point-to-point under any MPI (MPICH wheel, Open MPI wheel or system).

Rank and size come from ``MPI.COMM_WORLD`` (run under ``mpiexec``). Every buffer travels as raw
bytes (``[uint8 view, MPI.BYTE]``), so every dtype moves, bfloat16 included, and a receive
checks that the message had exactly the bytes it expected (a smaller message is a
CollectiveError naming the sender, not silent garbage; a larger one is MPI_ERR_TRUNCATE, also
reported with the sender). ``wait_all`` without a timeout is one ``Waitall``; with one it
polls ``Testall`` (MPI has no timed wait): it spins first, then yields the CPU, then sleeps
with a growing backoff capped at ``_MAX_SLEEP``, so latency stays low and oversubscribed runs
still make progress. On timeout the pending receives are cancelled and the error names this
rank, the peers still pending and the tag.

``native`` runs MPI's own collectives on the same buffers (the benchmark baseline;
``transports/mpi_native.py``). ``subgroup(ranks)`` builds a real sub-communicator with
``Create_group`` (only the members call it), so ``native`` works inside subgroups too.

Mismatched calls (float32 against int32, SUM against MAX, all_reduce against broadcast) send
messages of the right length, which MPI would match: each rank would reduce the other's bytes
as its own and return garbage. So a collective's messages carry its signature
(``collectives.signature``) folded into the tag: the group's tag with its top
``signature_width`` bits (8) replaced by ``fold(signature)``. A receive then never matches
another call's message, and the calls that no longer match wait: a wait that has not finished
after ``_PROBE_AFTER`` looks (``Iprobe``, every ``_PROBE_EVERY`` and once more at the timeout)
for a message with this call's tag and other signature bits, and on finding one raises
``CallMismatch`` naming the sender and both calls. A rank that leaves a call over a mismatch
(of signatures or sizes) sends every other rank a *notice* (the top bits all ones, its error
as text): their waits find it the same way and raise too, so no rank of the call is left
waiting for the one that left. The fast path pays the tag's two operations; a wait that needs
more than 5 ms pays an ``Iprobe`` (one per signature value when anything unreceived is
there at all). User point-to-point and internal exchanges carry no signature: their tags are
the group's as given.

Cost per message: one mpi4py call plus a numpy view; the collective algorithms themselves
are the host executor's job.

Limits: a signed collective's tag repeats every 2**(bits - 9) calls (bits: those MPI_TAG_UB
gives, at most 32: 2**20 calls on MPICH, 2**14 on Open MPI over UCX), where messages that no
rank received (those of a failed call) match again. Two calls alike in 8 bits (1 in 254) are
not told apart; the other call is named as the nearest call whose signature has its bits. A
rank that finished its part of a mismatched call before its peers saw the mismatch (a sender
only, its sends buffered) returns: its peers raise, no output holds another call's bytes.
MPI's own collectives (``native``) carry no signature.
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

from ..errors import CollectiveError, CollectiveTimeout, TransportError
from ..signature import NONE as NO_SIGNATURE, CallMismatch, fold, folded_mismatch
from .base import ANY_SOURCE, Request, Transport

# Variables an MPI launcher sets in every rank it starts (MPICH/Hydra, Intel MPI, Open MPI,
# PMIx, MVAPICH): any of them means mpiexec/mpirun (or srun with PMI) started this process.
LAUNCHER_VARIABLES = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                      "OMPI_COMM_WORLD_SIZE", "HYDI_CONTROL_FD", "MPI_LOCALRANKID",
                      "MV2_COMM_WORLD_RANK")


def launched() -> bool:
    """Whether an MPI launcher started this process (asks the environment, imports no MPI)."""
    return any(name in os.environ for name in LAUNCHER_VARIABLES)


_SPIN_POLLS = 200          # Testall polls before the first yield: most steps finish here
_YIELD_SECONDS = 1.0       # then yield the CPU (sleep(0)) until this long has passed: large
                           # messages progress only while someone polls (see _mpi_exec.pyx)
_MAX_SLEEP = 2e-4          # then sleep, doubling from 20 µs up to this (short: no progress while asleep)
_PROBE_AFTER = 5e-3        # a signed call's wait first looks for other calls' messages after this
_PROBE_EVERY = 5e-3        # and again this often: a healthy wait rarely lasts this long, and
                           # a look costs one Iprobe where nothing unreceived is there

_GROUP_TAG_BITS = 32       # the most bits a group's tags use (group.TAG_BITS)
_SIGNATURE_BITS = 8        # of them, the top ones carry a collective's signature
_FEWEST_SEQUENCE_BITS = 12     # what a tiny MPI_TAG_UB leaves the sequence, taken from the signature
_NOTICE_BYTES = 4096       # the most of an error's text a notice carries


def _mpi():
    if "mpi4py.MPI" not in sys.modules:
        _yield_when_oversubscribed()
    from mpi4py import MPI
    return MPI


def _yield_when_oversubscribed():
    """More ranks than cores (the 2-core CI, ``mpiexec -n 8`` on a laptop): ask the MPI
    library to yield while it waits, before MPI_Init reads its settings. Without this MPICH
    spins through whole scheduler slices and its own collectives (the baseline) slow down
    several-fold. The user's own settings win (setdefault)."""
    size = next((os.environ[k] for k in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
                 if os.environ.get(k, "").isdigit()), None)
    if size is not None and int(size) > (os.cpu_count() or 1):
        os.environ.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")      # MPICH
        os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")      # Open MPI


def available() -> tuple[bool, str]:
    try:
        MPI = _mpi()
    except ImportError as exc:
        return False, f"mpi4py is not importable ({exc}); pip install mpi4py mpich"
    except Exception as exc:      # mpi4py present but no MPI library found / init failed
        return False, f"mpi4py cannot load an MPI library: {exc}"
    return True, library_name(MPI)


def library_name(MPI=None) -> str:
    """The first line of MPI_Get_library_version, e.g. 'MPICH Version: 5.0.2'."""
    MPI = MPI or _mpi()
    # Open MPI 4.1 ends the string with a NUL, which would show in tables and plot titles
    first = MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]
    return " ".join(first.split())


def create(rank=None, world_size=None, store=None, timeout: float = 1800.0) -> "MPITransport":
    """The world transport. ``rank``/``world_size`` as for world_rank_and_size."""
    world_rank_and_size(rank, world_size)
    return MPITransport(_mpi().COMM_WORLD, timeout=timeout)


def world_rank_and_size(rank=None, world_size=None, who="mpi transport") -> tuple[int, int]:
    """MPI.COMM_WORLD's rank and size. ``rank``/``world_size`` may be None or -1 (take
    MPI's); when given they must agree with MPI's, since mpiexec, not the caller, decides
    them."""
    comm = _mpi().COMM_WORLD
    for name, given, actual in (("rank", rank, comm.Get_rank()),
                                ("world_size", world_size, comm.Get_size())):
        if given is not None and given != -1 and int(given) != actual:
            raise ValueError(f"{who} on rank {comm.Get_rank()}: {name}={given} was given but "
                             f"MPI says {actual} (mpiexec started {comm.Get_size()} ranks; "
                             f"under mpiexec the launcher decides rank and size: leave "
                             f"{name} out)")
    return comm.Get_rank(), comm.Get_size()


class MPIRequest(Request):
    """One pending Isend/Irecv. ``source`` is the sender of a completed receive; ``wire`` the
    MPI tag (``tag`` with the call's ``signature`` folded in)."""
    __slots__ = ("handle", "peer", "kind", "tag", "nbytes", "source", "cancelled", "wire",
                 "signature")

    def __init__(self, handle, peer, kind, tag, nbytes, wire, signature):
        self.handle, self.peer, self.kind, self.tag, self.nbytes = handle, peer, kind, tag, nbytes
        self.wire, self.signature = wire, signature
        self.source = None if peer == ANY_SOURCE else peer
        self.cancelled = False

    def test(self) -> bool:
        if self.cancelled:
            raise _cancelled(self)
        if self.handle is None:
            return True
        status = _mpi().Status()
        if not self.handle.Test(status):
            return False
        _check_received(self, status, rank=None)
        self.handle = None
        return True


def _as_bytes(buf):
    """A flat uint8 view: the one MPI buffer spec that works for every dtype."""
    if buf.dtype != np.uint8:
        buf = buf.reshape(-1).view(np.uint8)
    return buf


def _cancelled(req):
    who = "any rank" if req.peer == ANY_SOURCE else f"rank {req.peer}"
    return CollectiveError(f"{req.kind} with {who} (tag {req.tag}) was cancelled after a "
                           f"timeout or error; it will never complete")


def _check_received(req, status, rank):
    if req.kind != "recv":
        return
    got = status.Get_count(_mpi().BYTE)
    req.source = status.Get_source()
    if got != req.nbytes:
        raise CollectiveError(
            f"rank {rank}: message from rank {req.source} (tag {req.tag}) has {got} bytes but "
            f"the receive expects {req.nbytes}: {_what_mismatched(req)}")


def _what_mismatched(req) -> str:
    """A message of a signed call has that call's signature: only its size can differ."""
    if req.signature == NO_SIGNATURE:
        return "the ranks called mismatched operations or sizes"
    return "the ranks called mismatched sizes"


class MPITransport(Transport):
    name = "mpi"
    xp = np
    offers = frozenset({"mpi_comm"})    # plans run in C where the compiled executor is built

    def __init__(self, comm, *, timeout: float = 1800.0, world_ranks=None):
        MPI = _mpi()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.timeout = timeout
        # global (COMM_WORLD) rank of each member, for error messages and the facade
        self.world_ranks = list(range(self.size)) if world_ranks is None else list(world_ranks)
        self._MPI = MPI
        self.max_tag = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        # the signature's place in a collective's tag: the top bits of those MPI_TAG_UB gives
        # (every one of them: a TAG_UB one short of a power of two leaves one bit unused)
        bits = min(_GROUP_TAG_BITS, (self.max_tag + 1).bit_length() - 1)
        width = min(_SIGNATURE_BITS, bits - _FEWEST_SEQUENCE_BITS)
        self.signature_width = width if width >= 2 else 0      # 2 values are reserved
        self.carries_signatures = self.signature_width > 0
        self.signature_shift = bits - self.signature_width
        self._low = (1 << self.signature_shift) - 1        # the group tag's bits kept
        self._notice = (1 << self.signature_width) - 1     # the top bits of a notice's tag
        self._marks = {NO_SIGNATURE: 0}                    # signature -> its bits in place
        self._notices = []                                 # (request, payload) still sending
        self._subgroups = []
        from .mpi_native import MPINative      # it imports this module
        self.native = MPINative(comm)

    # -- tags ------------------------------------------------------------------------------

    def signature_mark(self, signature) -> int:
        """The signature's bits in their place in a wire tag (0: none). A message of ``tag``
        goes out as ``tag & (2**signature_shift - 1) | mark`` (as ``tag`` where 0)."""
        mark = self._marks.get(signature)
        if mark is None:
            mark = fold(signature, self.signature_width) << self.signature_shift \
                if self.signature_width else 0
            self._marks[signature] = mark
        return mark

    def group_tag(self, wire: int) -> int:
        """A wire tag with any signature taken off: the group's tag for point-to-point (even)
        tags, its low bits (the sequence number's, below ``signature_shift``) for a
        collective's."""
        return wire & self._low if wire & 1 else wire

    # -- point to point --------------------------------------------------------------------

    def isend(self, buf, peer, tag, signature=NO_SIGNATURE):
        if not 0 <= peer < self.size:
            self.check_peer(peer, "send")
        data = _as_bytes(buf)
        mark = self._marks.get(signature)
        if mark is None:
            mark = self.signature_mark(signature)
        wire = (tag & self._low) | mark if mark else tag
        try:
            handle = self.comm.Isend([data, self._MPI.BYTE], peer, wire)
        except self._MPI.Exception as exc:
            raise TransportError(f"rank {self.rank}: send to rank {peer} (tag {tag}) failed: "
                                 f"{exc}") from exc
        return MPIRequest(handle, peer, "send", tag, data.nbytes, wire, signature)

    def irecv(self, buf, peer, tag, signature=NO_SIGNATURE):
        if peer != ANY_SOURCE and not 0 <= peer < self.size:
            self.check_peer(peer, "recv")
        data = _as_bytes(buf)
        source = self._MPI.ANY_SOURCE if peer == ANY_SOURCE else peer
        mark = self._marks.get(signature)
        if mark is None:
            mark = self.signature_mark(signature)
        wire = (tag & self._low) | mark if mark else tag
        try:
            handle = self.comm.Irecv([data, self._MPI.BYTE], source, wire)
        except self._MPI.Exception as exc:
            raise TransportError(f"rank {self.rank}: receive from rank {peer} (tag {tag}) "
                                 f"failed: {exc}") from exc
        return MPIRequest(handle, peer, "recv", tag, data.nbytes, wire, signature)

    def wait_all(self, requests, timeout=None):
        MPI = self._MPI
        for req in requests:
            if req.cancelled:
                raise _cancelled(req)
        requests = [r for r in requests if r.handle is not None]
        if not requests:
            return
        handles = [r.handle for r in requests]
        statuses = [MPI.Status() for _ in handles]
        # a collective's requests all carry its signature: its waits look for other calls'
        signed = requests[0] if self._marks.get(requests[0].signature) else None
        try:
            if timeout is None and signed is None:
                MPI.Request.Waitall(handles, statuses)
            elif not self._poll(handles, statuses, timeout, signed):
                self._timed_out(requests, timeout)
        except MPI.Exception as exc:
            self._failed(requests, statuses, exc)
        for req in requests:
            req.handle = None
        for req, status in zip(requests, statuses):
            try:
                _check_received(req, status, self.rank)
            except CollectiveError as exc:
                self.notify(req.tag, req.signature, str(exc))
                raise

    def _poll(self, handles, statuses, timeout, signed) -> bool:
        """Testall until done (True) or ``timeout`` (None: none) has passed (False); a signed
        call's wait raises CallMismatch on finding another call's message or a notice."""
        testall = self._MPI.Request.Testall
        for _ in range(_SPIN_POLLS):
            if testall(handles, statuses):
                return True
        start = time.monotonic()
        deadline = start + timeout if timeout is not None else float("inf")
        yield_until = start + _YIELD_SECONDS
        look_at = start + _PROBE_AFTER if signed is not None else float("inf")
        pause = 2e-5
        while True:
            if testall(handles, statuses):
                return True
            now = time.monotonic()
            if now >= look_at:
                self._look_for_other_calls(signed)
                look_at = now + _PROBE_EVERY
            if now >= deadline:
                if signed is not None:      # a mismatch says more than the timeout would
                    self._look_for_other_calls(signed)
                return False
            if now < yield_until:
                time.sleep(0)
            else:
                time.sleep(min(pause, deadline - now))
                pause = min(pause * 2, _MAX_SLEEP)

    def _look_for_other_calls(self, req):
        """Raise CallMismatch where a message of ``req``'s call (its tag) with other signature
        bits has arrived: another call's, or a notice."""
        MPI, comm = self._MPI, self.comm
        if not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG):
            return                  # the usual case: nothing unreceived at all
        status = MPI.Status()
        base, shift = req.wire & self._low, self.signature_shift
        mine = req.wire >> shift
        for value in range(1 << self.signature_width):
            if value != mine and comm.Iprobe(MPI.ANY_SOURCE, base | value << shift, status):
                raise self.other_call(status.Get_source(), status.Get_tag(), req.tag,
                                      req.signature)

    def other_call(self, source: int, wire: int, tag: int, signature) -> CallMismatch:
        """The error for a message from ``source`` with MPI tag ``wire`` that has arrived in
        the call of ``tag`` and ``signature`` with other signature bits. A notice is received
        and says what its sender saw; another call's message stays where it is, and every
        other rank gets a notice."""
        MPI = self._MPI
        value = wire >> self.signature_shift
        if value == self._notice:
            status = MPI.Status()
            self.comm.Probe(source, wire, status)
            text = np.empty(status.Get_count(MPI.BYTE), np.uint8)
            self.comm.Recv([text, MPI.BYTE], source, wire)
            return CallMismatch(f"rank {self.rank}: rank {source} left this call (tag {tag}): "
                                f"{text.tobytes().decode(errors='replace')}")
        error = folded_mismatch(self.rank, source, tag, signature, value,
                                self.signature_width, self.size)
        self.notify(tag, signature, str(error))
        return error

    def notify(self, tag: int, signature, text: str) -> None:
        """Tell every other rank that this rank leaves the call of ``tag`` and ``signature``
        over a mismatch (``text``): a rank still waiting in it raises instead of waiting for
        this one until its timeout. Unsigned calls send nothing."""
        if not self.signature_mark(signature):
            return
        MPI = self._MPI
        wire = (tag & self._low) | self._notice << self.signature_shift
        payload = np.frombuffer(text.encode()[:_NOTICE_BYTES], np.uint8).copy()
        sending = [(req, data) for req, data in self._notices if not req.Test()]
        for peer in range(self.size):
            if peer != self.rank:
                sending.append((self.comm.Isend([payload, MPI.BYTE], peer, wire), payload))
        self._notices = sending         # buffers stay alive until MPI has sent them

    def _timed_out(self, requests, timeout):
        """Raise, leaving every request pending: a later wait may still complete it."""
        pending = [r for r in requests if not r.handle.Get_status()] or requests
        peers = ", ".join(sorted({("any rank" if r.peer == ANY_SOURCE else f"rank {r.peer}")
                                  + f" ({r.kind})" for r in pending}))
        tags = sorted({r.tag for r in pending})
        raise CollectiveTimeout(f"rank {self.rank}: still waiting after {timeout:.3g} s on "
                                f"{peers}, tag {', '.join(map(str, tags))}")

    def cancel(self, requests):
        """Receives are cancelled, so a late message cannot land in a buffer given up on;
        sends are released to finish on their own (cancelling sends is deprecated in MPI 4)."""
        for req in requests:
            if req.handle is None or req.cancelled:
                continue
            try:
                if req.kind == "recv":
                    req.handle.Cancel()
                    req.handle.Wait()
                else:
                    req.handle.Free()
            except self._MPI.Exception:
                pass
            req.handle, req.cancelled = None, True

    def _failed(self, requests, statuses, exc):
        MPI = self._MPI
        for req in requests:
            req.handle = None
        culprits = []
        for req, status in zip(requests, statuses):
            code = status.Get_error()
            if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                culprits.append((req, status, code))
        if not culprits and exc.Get_error_class() != MPI.ERR_IN_STATUS:
            culprits = [(r, s, exc.Get_error_class()) for r, s in zip(requests, statuses)
                        if r.kind == "recv"][:1]
        for req, status, code in culprits:
            if MPI.Get_error_class(code) == MPI.ERR_TRUNCATE:
                source = status.Get_source()
                source = req.peer if source in (MPI.ANY_SOURCE, MPI.UNDEFINED) or source < 0 \
                    else source
                error = CollectiveError(
                    f"rank {self.rank}: message from rank {source} (tag {req.tag}) is larger "
                    f"than the {req.nbytes}-byte receive: {_what_mismatched(req)}")
                self.notify(req.tag, req.signature, str(error))
                raise error from exc
        peers = ", ".join(f"rank {r.peer} ({r.kind})" for r, _, _ in culprits) or "unknown peer"
        raise TransportError(f"rank {self.rank}: MPI failed on {peers}: {exc}") from exc

    # -- groups ------------------------------------------------------------------------------

    def subgroup(self, ranks):
        """A transport over a real sub-communicator of ``ranks`` (ranks of this transport, in
        the new group's rank order). Only members call this (MPI_Comm_create_group); a
        non-member gets None without communicating."""
        ranks = [int(r) for r in ranks]
        if len(set(ranks)) != len(ranks) or any(not 0 <= r < self.size for r in ranks):
            raise ValueError(f"subgroup on rank {self.rank}: ranks {ranks} must be distinct and "
                             f"within 0..{self.size - 1}")
        if self.rank not in ranks:
            return None
        group = self.comm.Get_group().Incl(ranks)
        try:
            comm = self.comm.Create_group(group, tag=_SUBGROUP_TAG)
        finally:
            group.Free()
        sub = MPITransport(comm, timeout=self.timeout,
                           world_ranks=[self.world_ranks[r] for r in ranks])
        self._subgroups.append(sub)
        return sub

    def abort(self, reason: str, code: int = 1) -> None:
        """Tear the whole job down: MPI cannot wake peers blocked in other processes.
        ``code`` becomes mpiexec's exit status."""
        self._MPI.COMM_WORLD.Abort(code)

    def guard_exit(self, leaving, started) -> None:
        """Make this process's exit end the job instead of hanging in MPI_Finalize (see
        ``mpi_exit.ExitGuard``). ``leaving()`` says how the process is leaving: (exit code or
        None when not known, the error it leaves after or None); ``started(transport, tag)``
        whether this rank has started the collective of that wire tag on that transport (None:
        not known). Every rank calls this at the same point (it creates a communicator once
        per process); later calls, after a new init_process_group, point the guard at the new
        transport."""
        from .mpi_exit import guard
        guard(self, leaving, started)

    def close(self) -> None:
        self._release()
        for req, payload in self._notices:      # notices nobody received: MPI may drop them
            try:
                req.Free()
            except self._MPI.Exception:
                pass
            _FREED_NOTICES.append(payload)     # MPI may still read a freed send's buffer
        self._notices = []
        for sub in self._subgroups:
            sub.close()
        self._subgroups = []
        MPI = self._MPI
        if self.comm not in (MPI.COMM_WORLD, MPI.COMM_SELF) and not MPI.Is_finalized() \
                and self.comm != MPI.COMM_NULL:
            self.comm.Free()


_SUBGROUP_TAG = 12345
_FREED_NOTICES = []
