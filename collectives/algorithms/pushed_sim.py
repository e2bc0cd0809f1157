"""The pushed-form simulator: the peer-memory protocol run on the CPU. Every rank's push
program (``pushed.lower``: the instructions the CUDA kernel runs) and the special kernels
(``two_shot_in_place``, ``pipelined_reduce_scatter``, ``copies_around``), each on several
workers (the GPU's thread blocks), interleaved in a random order over numpy arrays and flag
words, so the ordering the flags give is checked without a GPU. docs/peer-memory.md explains
the protocol; ``kernels/peer_protocol.py`` defines it.

Workers are generators; each yields whenever it waits for a flag or has moved a piece of
data, and a seeded scheduler picks which runnable worker goes next. Data moves in small
pieces with yields between them, so a missing barrier or flag shows as a wrong result (or as
a read of a poisoned value: staging memory starts as NaN/garbage). ``deadline`` bounds every
wait in scheduler turns: a rank that never arrives ends the call on the others with the peer
named (``Stuck``), as the GPU kernel's timeout does.

``verify`` and ``prove`` check a schedule in its pushed form against numpy, as ``simulate``
checks it in the form the host executors run:

    >>> from collectives.algorithms import pushed_sim
    >>> pushed_sim.verify("all_reduce", "ring", 4, 10, eager=4)    # None, or AssertionError
"""
from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np

from ..errors import CollectiveError, CollectiveTimeout
from ..kernels import peer_protocol
from ..kernels.peer_protocol import (
    ARRIVE, BARRIER, CALLER_OUTPUT, COPY, EPOCH, INBOX, INPUT, INSTRUCTIONS, KIND, OUTPUT, PUSH,
    REDUCE, REDUCE_LL, REDUCE_N, SCRATCH, SEND, SEND_LL, SENDS_ON, STEP, TAKE, TAKE_LL,
    TAKE_REDUCE, chain_operands, decode_line_operand, decode_operand, epoch, in_place_epoch)
from . import pushed
from .schedule import ROOTED, buffer_sizes, build_plan, plan_args


_SENDS = (PUSH, SEND, SEND_LL)      # what a REDUCE_N with SENDS_ON sends its result on with

# what ``pipelined_reduce_scatter`` runs (executors/peer.py: pipelined)
PIPELINED = (("reduce_scatter", "direct"), ("all_reduce", "two_shot"))


def _copied(plan) -> bool:
    """Whether the copy engines run ``plan`` (executors/peer.py: copied): a direct all_gather
    or all_to_all of alike blocks."""
    if (plan.collective, plan.algorithm) == ("all_gather", "direct"):
        return len(set(plan.args[0])) == 1
    if (plan.collective, plan.algorithm) == ("all_to_all", "direct"):
        return len({n for row in plan.args[0] for n in row}) == 1
    return False


def _poison(dtype):
    """What staging memory of ``dtype`` holds before anything is written there: NaN, or for
    integers a pattern no test's data is likely to hold."""
    dtype = np.dtype(dtype)
    if dtype.kind in "fc":
        return np.nan
    return np.array(0x5A5A5A5A5A5A5A5A, np.uint64).astype(dtype)


class Stuck(CollectiveTimeout):
    """A wait passed its deadline (the GPU kernel's ``ERROR_TIMED_OUT``): who waited, at
    which plan step, for whom."""

    def __init__(self, rank, step, peer, what):
        super().__init__(f"rank {rank} step {step + 1}: still waiting for rank {peer} ({what})")
        self.rank, self.step, self.peer = rank, step, peer


class InPlace(NamedTuple):
    """A call's input where the call is made in place: the contents its caller put in the
    output buffer before the call (copied in at the call's start, as the caller's stream
    does before the kernel)."""
    contents: np.ndarray


class CalledOtherwise(CollectiveError):
    """A rank running a call in place (``two_shot_in_place``) found a peer that did not (the
    kernel's ``ERROR_CALLED_OTHERWISE``)."""

    def __init__(self, rank, peer):
        super().__init__(f"rank {rank}: rank {peer} did not run this all_reduce in place")
        self.rank, self.peer = rank, peer


class Group:
    """Flags and staging memory of ``size`` ranks, kept across calls (as the GPU's are):
    ``workers`` per rank, ``staging`` elements of ``dtype`` in each staging area, poisoned
    (``_poison``); ``seed`` orders the workers' turns."""

    def __init__(self, size, workers, staging=1 << 16, seed=0, align=1,
                 period=peer_protocol.LINE_PERIOD, dtype=np.float64):
        self.size, self.workers, self.align = size, workers, align
        self.period = period           # of the lines' flags (peer_protocol.line_flag)
        self.epoch = [0] * size
        self.delivered = np.zeros((size, size, workers), np.int64)   # [dst, src, worker]
        self.sent = np.zeros((size, size), np.int64)                 # [rank, peer]
        self.received = np.zeros((size, size), np.int64)
        self.calls = [0] * size
        self.random = random.Random(seed)
        # staging output and scratch, poisoned so reading what nobody wrote is visible
        def poisoned():
            return np.full(staging, _poison(dtype), dtype)
        self.out = [poisoned() for _ in range(size)]
        self.scratch = [poisoned() for _ in range(size)]
        self.inbox = [[poisoned() for _ in (0, 1)] for _ in range(size)]
        # messages in lines have an inbox of their own (data and flag of each line)
        self.lines = [[poisoned() for _ in (0, 1)] for _ in range(size)]
        self.line_flags = [[np.zeros(staging, np.int64) for _ in (0, 1)] for _ in range(size)]
        # where each rank's output receives land, as its latest epoch says: its staging
        # output, or its caller's output where that is symmetric (``lower(symmetric=)``)
        self.landing = list(self.out)
        # per rank: the call number + 1 of the latest call in which it takes eager messages
        # straight into its output (its first epoch's DIRECT word; pushed._direct)
        self.direct = [0] * size
        # every worker of such a rank says so before its first send (the kernel's EPOCH);
        # False: only the first, as the kernel did before (a test shows what that breaks)
        self.every_worker_says = True
        # per rank: the call number + 1 of its latest call run in place (the kernel's MODE
        # word, written before its epoch); and the in-place protocol's two waits, which a
        # test turns off one at a time to show what each protects
        self.mode = [0] * size
        self.finished = [[] for _ in range(size)]     # per rank: in-place results, in order
        self.in_place_waits = {"epochs": True, "delivered": True}
        # ``pipelined_reduce_scatter``'s waits, turned off one at a time by a test (the last
        # two in all_reduces only; "read" and "staged" in the copy engines' all_gathers)
        self.pipelined_waits = {"epochs": True, "chunks": True, "reduced": True, "read": True,
                                "staged": True}

    def run(self, calls, reduce=np.add, *, piece=3, deadline=100000, absent=(), eager=0,
            lines=0, seeded=False, symmetric=(), direct=False, in_place=(), pipelined=None,
            copied=False, gathers=False):
        """Several calls, each a list ``[(plan, input, output)]`` of one entry per rank
        (arrays float64 or None). A rank starts its next call when it has finished the
        previous one, whatever the others do (as kernels on one stream). Ranks in ``absent``
        never start (a dead rank). ``seeded``: all_reduce and broadcast calls that pass an
        input run the program that reads it instead of copying it into output first. Ranks in
        ``symmetric`` pass outputs their peers write directly (symmetric memory); ``direct``:
        eager messages too where the receiver takes them so (``pushed.lower(direct=)``).
        A call made in place may pass ``InPlace(contents)`` as its input: the contents are
        copied into its output at the call's start (as the caller's stream does before the
        kernel); ranks in ``in_place`` run such two_shot all_reduces as
        ``two_shot_in_place`` does (their outputs symmetric), the others the program.
        ``pipelined`` (chunks, pushers) or (chunks, pushers, copy_engines): every rank runs
        direct reduce_scatters and two_shot all_reduces as ``pipelined_reduce_scatter``
        does, its first ``pushers`` workers pushing and the others reducing; with
        ``copy_engines`` the all_reduces' gather is the copy engines' (``_copied_gather``).
        ``copied`` (a number of chunks): direct all_gathers and all_to_alls of alike blocks
        run as the copy engines' do (``_copied``); ``gathers`` (with ``pipelined``): those
        ``copied`` leaves run as ``pipelined_reduce_scatter``'s all_gather and all_to_all
        (kinds 3, 4: ``_pipelined``'s ``moves``), peers pushing straight into the outputs
        of the ranks in ``symmetric``."""
        barriers = [[0] * self.workers for _ in range(self.size)]
        running = []
        for rank in range(self.size):
            if rank in absent:
                continue
            mine = [call[rank] for call in calls]
            for w in range(self.workers):
                running.append(self._worker(rank, w, mine, reduce, piece, barriers, deadline,
                                            eager, lines, seeded, rank in symmetric,
                                            direct, rank in in_place, pipelined, copied,
                                            gathers))
        while running:
            worker = self.random.choice(running)
            try:
                next(worker)
            except StopIteration:
                running.remove(worker)

    @staticmethod
    def _until(ready, deadline, rank, step, peer, what):
        """Yield (let others run) until ``ready()``; Stuck after ``deadline`` turns."""
        waited = 0
        while not ready():
            waited += 1
            if waited > deadline:
                raise Stuck(rank, step, peer, what)
            yield

    def _barrier(self, rank, w, barriers, step, deadline):
        barriers[rank][w] += 1
        mark = barriers[rank][w]
        yield from self._until(lambda: min(barriers[rank]) >= mark, deadline, rank, step, rank,
                               "its own workers")

    def _worker(self, rank, w, calls, reduce, piece, barriers, deadline, eager, lines,
                seeded, symmetric, direct, in_place, pipelined, copied, gathers):
        for plan, input, output in calls:
            if isinstance(input, InPlace):        # what the caller's stream put there first
                if w == 0:
                    output[:] = input.contents
                yield from self._barrier(rank, w, barriers, -1, deadline)
                input = None
            if in_place and input is None and plan.collective == "all_reduce" and \
                    plan.algorithm == "two_shot":
                yield from self._in_place(rank, w, plan.args[0], output, reduce, piece,
                                          deadline)
                sends = recvs = [int(q != rank) for q in range(self.size)]
                finished = output
            elif copied and _copied(plan):      # (before the pipelined kernel, as executed)
                yield from self._copied(rank, w, plan, input, output, piece, deadline,
                                        barriers, copied)
                sends = recvs = [(copied + 1) * (q != rank) for q in range(self.size)]
                finished = None
            elif pipelined and ((plan.collective, plan.algorithm) in PIPELINED or
                                gathers and _copied(plan)):
                chunks, pushers, *copy_engines = pipelined
                gather = plan.collective == "all_reduce"
                moves = plan.collective if plan.collective in ("all_gather", "all_to_all") \
                    else None
                by_copies = gather and bool(copy_engines) and copy_engines[0]
                count = plan.args[0] // self.size if gather else \
                    plan.args[0][0][0] if moves == "all_to_all" else plan.args[0][rank]
                yield from self._pipelined(rank, w, count, output if input is None else input,
                                           output, reduce, piece, deadline, chunks, pushers,
                                           gather, barriers if by_copies else None, moves,
                                           symmetric)
                sends = recvs = [((2 * chunks + 1) if gather else chunks) * (q != rank)
                                 for q in range(self.size)]
                finished = None
            else:
                program = pushed.lower(plan, eager, lines, seeded and input is not None and
                                       plan.collective in ("all_reduce", "broadcast"),
                                       symmetric, direct)
                yield from self._call(rank, w, program, input, output, reduce, piece,
                                      barriers, deadline)
                sends, recvs = program.sends, program.recvs
                finished = None
            # the kernel's end: bookkeeping once every worker is done, before the next call
            yield from self._barrier(rank, w, barriers, -1, deadline)
            if w == 0:
                self.sent[rank] += sends
                self.received[rank] += recvs
                self.calls[rank] += 1
                if finished is not None:      # what the caller reads once the call is done
                    self.finished[rank].append(finished.copy())
            yield from self._barrier(rank, w, barriers, -1, deadline)

    def _in_place(self, rank, w, count, buffer, reduce, piece, deadline):
        """``two_shot_in_place`` (kernels/cuda_peer.cu) on worker ``w`` of ``rank``: its
        MODE word and epoch; then, once every peer's epoch of this call is there and says the
        peer runs in place too, this worker's share of the rank's block read on every rank,
        reduced in rank order and written back on every rank, piece by piece; then its
        delivered word to every peer, and a wait for the same worker of every peer."""
        call, size = self.calls[rank], self.size
        epoch = in_place_epoch(call)

        def wait(ready, peer, what):
            return self._until(ready, deadline, rank, 0, peer, what)

        if w == 0:
            self.landing[rank] = buffer
            self.mode[rank] = call + 1
            self.epoch[rank] = epoch
        buffers = [None] * size
        for q in range(size):
            if q == rank:
                buffers[q] = buffer
                continue
            if self.in_place_waits["epochs"]:
                yield from wait(lambda: self.epoch[q] >= epoch, q, "its epoch")
                if self.mode[q] != call + 1:
                    raise CalledOtherwise(rank, q)
            buffers[q] = self.landing[q]
        # this rank's block in 16-byte units (alike on every rank), this worker's share
        units = -(-count // self.align)
        lo = min(count, units * rank // size * self.align)
        hi = min(count, units * (rank + 1) // size * self.align)
        a0, b0 = pushed.share(hi - lo, w, self.workers, self.align)
        for a in range(lo + a0, lo + b0, piece):
            b = min(lo + b0, a + piece)
            values = []
            for q in range(size):               # every load of the piece, then the stores
                values.append(buffers[q][a:b].copy())
                yield
            acc = values[0]
            for value in values[1:]:
                acc = reduce(acc, value)
            for q in range(size):
                buffers[q][a:b] = acc
                yield
        for q in range(size):
            if q != rank:
                self.delivered[q, rank, w] = self.sent[rank, q] + 1
        if self.in_place_waits["delivered"]:
            for q in range(size):
                if q != rank:
                    target = self.received[rank, q] + 1
                    yield from wait(lambda: self.delivered[rank, q, w] >= target, q,
                                    "its block")

    def _pipelined(self, rank, w, count, input, output, reduce, piece, deadline, chunks,
                   pushers, gather=False, barriers=None, moves=None, symmetric=False):
        """``pipelined_reduce_scatter`` (kernels/cuda_peer.cu) on worker ``w`` of ``rank``:
        worker 0's epoch; a pusher (w < pushers) waits for every peer's epoch of this call,
        then pushes its share of chunk after chunk of every peer's block into that peer's
        scratch slot for this rank (direct.reduce_scatter's: peers in rank order, itself
        skipped), its delivered word to each peer numbering the chunks pushed; a reducer
        waits for chunk k from every pusher of every peer, then reduces its share of it in
        rank order into output.

        ``gather`` (a two_shot all_reduce of ``count`` elements per rank's block): the slots
        lie at the staging memory's start, where programs stage their outputs (here the
        staging output, ``out``), the reduced block after them; a reducer stores its share
        of chunk k there too and numbers it in its own delivered word (``chunks`` + k + 1);
        then every worker, its pushes or reductions done, reads its share of each peer's
        chunk k once every reducer of that peer has said so, into the peer's block of
        output, says it has read everything (2 ``chunks`` + 1) and waits until the same
        worker of every peer has. With ``barriers`` (the rank's, ``_barrier``) the copy
        engines gather instead: ``_copied_gather``.

        ``moves`` ("all_gather" or "all_to_all": kinds 3, 4, of p blocks of ``count``): the
        slots lie at the staging memory's start too, and nothing is reduced. Worker 0 says
        where peers' pushes into this rank's output land (``landing``: the output where it
        is ``symmetric``, else its staging output's slots) before its epoch; a pusher, after
        each peer's epoch, reads where that peer takes them, and pushes this rank's block for
        it (an all_gather's whole input, an all_to_all's block q) chunk by chunk there: into
        its output at this rank's block, or into its slot for this rank; the other workers
        copy instead of reducing (``_copy_chunks``)."""
        call, size = self.calls[rank], self.size
        area = self.out if gather or moves else self.scratch
        reduced_at = (size - 1) * count
        epoch = in_place_epoch(call)

        def wait(ready, step, peer, what):
            return self._until(ready, deadline, rank, step, peer, what)

        def chunk_share(k, me, of):            # 16-byte units alike on every rank
            units = -(-count // self.align)
            c0, c1 = units * k // chunks, units * (k + 1) // chunks
            lo = min(count, (c0 + (c1 - c0) * me // of) * self.align)
            hi = min(count, (c0 + (c1 - c0) * (me + 1) // of) * self.align)
            return lo, hi

        if w == 0:
            if moves:                          # its PLACE word, before the epoch
                self.landing[rank] = output if symmetric else self.out[rank]
            self.epoch[rank] = epoch
        if w < pushers:
            into = {}                          # per peer: where this rank's block goes
            for q in range(size):
                if q == rank:
                    continue
                if self.pipelined_waits["epochs"]:
                    yield from wait(lambda: self.epoch[q] >= epoch, 0, q, "its epoch")
                slot = (rank if rank < q else rank - 1) * count
                into[q] = (area[q], slot)
                if moves and self.landing[q] is not self.out[q]:    # its symmetric output
                    into[q] = (self.landing[q], rank * count)
            for k in range(chunks):
                lo, hi = chunk_share(k, w, pushers)
                for s in range(1, size):
                    q = (rank + s) % size
                    theirs, at = into[q]
                    frm = 0 if moves == "all_gather" else q * count
                    for a in range(lo, hi, piece):
                        b = min(hi, a + piece)
                        theirs[at + a:at + b] = input[frm + a:frm + b]
                        yield
                for q in range(size):
                    if q != rank:
                        self.delivered[q, rank, w] = self.sent[rank, q] + k + 1
        elif moves:
            yield from self._copy_chunks(rank, w, count, input, output, piece, wait, chunks,
                                         pushers, chunk_share, moves,
                                         None if symmetric else area[rank])
        else:
            yield from self._reduce_chunks(rank, w, count, input, output, reduce, piece, wait,
                                           chunks, pushers, chunk_share, area[rank], gather,
                                           reduced_at)
        if gather and barriers is not None:
            yield from self._copied_gather(rank, w, count, output, piece, wait, chunks,
                                           pushers, reduced_at, barriers, deadline)
        elif gather:
            yield from self._gather(rank, w, count, output, piece, wait, chunks, pushers,
                                    chunk_share, reduced_at)

    def _pushed(self, rank, k, pushers, wait):
        """Until every pusher of every peer has said chunk ``k`` (``_pipelined``'s reducers'
        and copiers' wait before each chunk)."""
        if not self.pipelined_waits["chunks"]:
            return
        for q in range(self.size):
            for j in range(pushers if q != rank else 0):
                target = self.received[rank, q] + k + 1
                yield from wait(lambda: self.delivered[rank, q, j] >= target, 1, q,
                                "its chunk")

    def _reduce_chunks(self, rank, w, count, input, output, reduce, piece, wait, chunks,
                       pushers, chunk_share, scratch, gather, reduced_at):
        """A reducer's part of ``_pipelined``."""
        size = self.size
        blocks = [input[rank * count:(rank + 1) * count] if q == rank else
                  scratch[(q if q < rank else q - 1) * count:][:count] for q in range(size)]
        for k in range(chunks):
            yield from self._pushed(rank, k, pushers, wait)
            lo, hi = chunk_share(k, w - pushers, self.workers - pushers)
            for a in range(lo, hi, piece):
                b = min(hi, a + piece)
                values = []
                for q in range(size):
                    values.append(blocks[q][a:b].copy())
                    yield
                acc = values[0]
                for value in values[1:]:
                    acc = reduce(acc, value)
                if gather:
                    output[rank * count + a:rank * count + b] = acc
                    scratch[reduced_at + a:reduced_at + b] = acc
                else:
                    output[a:b] = acc
                yield
            if gather:
                for q in range(size):
                    if q != rank:
                        self.delivered[q, rank, w] = self.sent[rank, q] + chunks + k + 1

    def _copy_chunks(self, rank, w, count, input, output, piece, wait, chunks, pushers,
                     chunk_share, moves, staged):
        """A copier's part of ``_pipelined`` in an all_gather or all_to_all (where reducers
        reduce): for chunk after chunk, once every pusher of every peer has said it, its
        share of the chunk of every block of output in rank order: each peer's out of its
        slot in ``staged`` (this rank's staging output; None where the output is symmetric
        and the peers pushed into it), this rank's own from its input."""
        size = self.size
        own = 0 if moves == "all_gather" else rank * count
        for k in range(chunks):
            yield from self._pushed(rank, k, pushers, wait)
            lo, hi = chunk_share(k, w - pushers, self.workers - pushers)
            for q in range(size):
                if q != rank and staged is None:
                    continue
                src, at = (input, own) if q == rank else (staged, (q - (q > rank)) * count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    output[q * count + a:q * count + b] = src[at + a:at + b]
                    yield

    def _gather(self, rank, w, count, output, piece, wait, chunks, pushers, chunk_share,
                reduced_at):
        """Every worker's second part in a pipelined all_reduce (``_pipelined``)."""
        size = self.size
        for k in range(chunks):
            for q in range(size):
                if q == rank or not self.pipelined_waits["reduced"]:
                    continue
                for j in range(pushers, self.workers):
                    target = self.received[rank, q] + chunks + k + 1
                    yield from wait(lambda: self.delivered[rank, q, j] >= target, 2, q,
                                    "its reduced chunk")
            lo, hi = chunk_share(k, w, self.workers)
            for s in range(1, size):
                q = (rank + s) % size
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    output[q * count + a:q * count + b] = \
                        self.out[q][reduced_at + a:reduced_at + b]
                    yield
        for q in range(size):
            if q != rank:
                self.delivered[q, rank, w] = self.sent[rank, q] + 2 * chunks + 1
        for q in range(size):
            if q != rank and self.pipelined_waits["read"]:
                target = self.received[rank, q] + 2 * chunks + 1
                yield from wait(lambda: self.delivered[rank, q, w] >= target, 2, q,
                                "its reads")

    def _copied_gather(self, rank, w, count, output, piece, wait, chunks, pushers,
                       reduced_at, barriers, deadline):
        """The copy engines' gather of a pipelined all_reduce (``gather`` 2, then
        ``copies_around``'s end): worker 0 waits until every reducer of every peer has said
        its last chunk, and the first launch ends (a barrier of the rank's workers); then
        the copies, one piece at a time like any worker's, each peer's reduced block into
        its place in output; then the second launch (after the copies, on the stream: a
        barrier again), whose one worker says it has read everything and waits until every
        peer has."""
        size = self.size
        if w == 0:
            for q in range(size):
                if q == rank or not self.pipelined_waits["reduced"]:
                    continue
                for j in range(pushers, self.workers):
                    target = self.received[rank, q] + 2 * chunks
                    yield from wait(lambda: self.delivered[rank, q, j] >= target, 2, q,
                                    "its reduced block")
        yield from self._barrier(rank, w, barriers, 2, deadline)
        if w == 0:
            for s in range(1, size):
                q = (rank + s) % size
                for a in range(0, count, piece):
                    b = min(count, a + piece)
                    output[q * count + a:q * count + b] = \
                        self.out[q][reduced_at + a:reduced_at + b]
                    yield
        yield from self._barrier(rank, w, barriers, 2, deadline)
        if w != 0:
            return
        yield from self._copies_end(rank, 2 * chunks + 1, 2, deadline)

    def _copied(self, rank, w, plan, input, output, piece, deadline, barriers, chunks):
        """A direct all_gather or all_to_all as the copy engines run it (``copies_around``
        beside the caller's stream, the executor's waits and copies on it, then its end):
        workers 1.. are the first launch's blocks, worker 0 the caller's stream. The rank's
        epoch; the blocks copy their share of chunk after chunk of every piece of the input
        (an all_gather's whole input; an all_to_all's block for each peer, into the slot of
        the peer's rank order with this rank skipped) into the rank's staging memory
        (``out``), saying each chunk to every peer (message k + 1), then their share of the
        rank's own block from its input into the output; the stream, for each chunk, waits
        until every block of every peer has said it and copies the chunk of each peer's
        block for this rank out of that peer's staging memory, a piece at a time; then (the
        side stream joined: a barrier) it says it has read everything (message chunks + 1)
        and waits until every peer has."""
        size, workers = self.size, self.workers
        all_to_all = plan.collective == "all_to_all"
        count = plan.args[0][0][0] if all_to_all else plan.args[0][rank]
        bounds = [(count * k // chunks, count * (k + 1) // chunks) for k in range(chunks)]
        if all_to_all:      # (from the input, into staging) per peer; this rank's slot there
            pieces = [(q * count, (q - (q > rank)) * count) for q in range(size) if q != rank]
            def slot(q): return (rank - (rank > q)) * count
        else:
            pieces = [(0, 0)]
            def slot(q): return 0
        own = rank * count if all_to_all else 0
        if w == 0:
            self.epoch[rank] = in_place_epoch(self.calls[rank])
            for k, (lo, hi) in enumerate(bounds):
                for q in range(size):
                    if q == rank or not self.pipelined_waits["staged"]:
                        continue
                    for j in range(1, workers):
                        target = self.received[rank, q] + k + 1
                        yield from self._until(lambda: self.delivered[rank, q, j] >= target,
                                               deadline, rank, 0, q, "its staged input")
                for s in range(1, size):
                    q = (rank + s) % size
                    for a in range(lo, hi, piece):
                        b = min(hi, a + piece)
                        output[q * count + a:q * count + b] = self.out[q][slot(q) + a:
                                                                         slot(q) + b]
                        yield
        else:
            for k, (lo, hi) in enumerate(bounds):
                mine = lo + (hi - lo) * (w - 1) // (workers - 1)
                end = lo + (hi - lo) * w // (workers - 1)
                for src, dst in pieces:
                    for a in range(mine, end, piece):
                        b = min(end, a + piece)
                        self.out[rank][dst + a:dst + b] = input[src + a:src + b]
                        yield
                for q in range(size):
                    if q != rank:
                        self.delivered[q, rank, w] = self.sent[rank, q] + k + 1
            mine = count * (w - 1) // (workers - 1)
            end = count * w // (workers - 1)
            for a in range(mine, end, piece):
                b = min(end, a + piece)
                output[rank * count + a:rank * count + b] = input[own + a:own + b]
                yield
        yield from self._barrier(rank, w, barriers, 1, deadline)
        if w != 0:
            return
        yield from self._copies_end(rank, chunks + 1, 1, deadline)

    def _copies_end(self, rank, message, step, deadline):
        """``copies_around``'s end (mode 1, one worker): says ``message`` to every peer (in
        its word 0), then waits until every peer has said it, so no peer reads this rank's
        staging memory any more."""
        for q in range(self.size):
            if q != rank:
                self.delivered[q, rank, 0] = self.sent[rank, q] + message
        for q in range(self.size):
            if q != rank and self.pipelined_waits["read"]:
                target = self.received[rank, q] + message
                yield from self._until(lambda: self.delivered[rank, q, 0] >= target,
                                       deadline, rank, step, q, "its reads")

    def _call(self, rank, w, program, input, output, reduce, piece, barriers, deadline):
        workers = self.workers
        call = self.calls[rank]

        def share(count):                    # as the kernel's: alike for alike counts
            return pushed.share(count, w, workers, self.align)
        mine = {INPUT: input, CALLER_OUTPUT: output, SCRATCH: self.scratch[rank],
                OUTPUT: self.out[rank] if program.output_staged else output,
                INBOX: self.inbox[rank][call & 1]}     # (a REDUCE_N operand only)

        def wait(ready, step, peer, what):
            return self._until(ready, deadline, rank, step, peer, what)

        flag = peer_protocol.line_flag(call, self.period)
        half = peer_protocol.scrubs(call, self.period)
        if half is not None:               # each worker its share, all before any epoch
            scrubbed = self.line_flags[rank][half]
            lo, hi = share(scrubbed.size)
            scrubbed[lo:hi] = 0
            yield
            yield from self._barrier(rank, w, barriers, -1, deadline)

        # the peers this worker synchronized with in this call (waited for their epoch of
        # it, or for a message they sent in it): what they said at their first epoch is seen
        synced = set()

        def posted(row):
            """What a send waits for: (whether it may write now, what it waits for)."""
            send = INSTRUCTIONS[int(row[KIND])].read(row)
            peer = send.peer
            if send.kind == PUSH:          # the receive posted (the peer's epoch of its step)
                target = epoch(call, send.their_step)
                return (lambda: self.epoch[peer] >= target), "its receive to be posted"
            if send.kind == SEND and send.output_at >= 0:   # it may land in the peer's
                if peer in synced:                          # output: the peer says so at
                    return (lambda: True), "this call"      # its first epoch, every worker
                target = epoch(call, 0)                     # of it before its first send
                return (lambda: self.epoch[peer] >= target), "this call"
            # eager: the slot's half was last used two calls ago, so the peer must have
            # started the previous call (then it is done with the one before)
            target = epoch(call - 1, 0) if call >= 2 else 0
            return (lambda: self.epoch[peer] >= target), "the previous call"

        code = program.code
        for at, row in enumerate(code):
            kind = INSTRUCTIONS[int(row[KIND])]
            x = kind.read(row)
            step = x.step
            if kind == BARRIER:              # a block barrier orders nothing here: a worker
                if x.grid:                   # is one sequence
                    yield from self._barrier(rank, w, barriers, step, deadline)
            elif kind == EPOCH:
                if w == 0 or (x.direct and self.every_worker_says):   # where output lands
                    self.landing[rank] = mine[OUTPUT]
                    if x.direct:             # eager messages straight into output
                        self.direct[rank] = call + 1
                if w == 0:                   # then the epoch
                    self.epoch[rank] = epoch(call, x.published)
            elif kind == PUSH:
                peer = x.peer
                ready, what = posted(row)
                yield from wait(ready, step, peer, what)
                synced.add(peer)
                theirs = {OUTPUT: self.landing[peer], SCRATCH: self.scratch[peer]}[x.dst_buffer]
                src, so, do = mine[x.src_buffer], x.src_offset, x.dst_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    theirs[do + a:do + b] = src[so + a:so + b]
                    yield
                self.delivered[peer, rank, w] = self.sent[rank, peer] + x.message + 1
            elif kind == SEND_LL:
                peer, slot = x.peer, x.slot
                ready, what = posted(row)
                yield from wait(ready, step, peer, what)
                theirs = self.lines[peer][call & 1]
                flags = self.line_flags[peer][call & 1]
                src, so = mine[x.src_buffer], x.src_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    theirs[slot + a:slot + b] = src[so + a:so + b]
                    flags[slot + a:slot + b] = flag      # data and flag land together
                    yield
            elif kind == TAKE_LL:
                slot, dst, do = x.slot, mine[x.dst_buffer], x.dst_offset
                inbox = self.lines[rank][call & 1]
                flags = self.line_flags[rank][call & 1]
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):          # each piece as soon as it is there
                    b = min(hi, a + piece)
                    yield from wait(lambda: (flags[slot + a:slot + b] == flag).all(), step,
                                    x.peer, "its message")
                    dst[do + a:do + b] = inbox[slot + a:slot + b]
            elif kind == SEND:
                peer, slot, output_at = x.peer, x.slot, x.output_at
                ready, what = posted(row)
                yield from wait(ready, step, peer, what)
                if output_at >= 0:
                    synced.add(peer)
                theirs = self.inbox[peer][call & 1]
                if output_at >= 0 and self.direct[peer] == call + 1:    # into its output
                    theirs, slot = self.landing[peer], output_at
                src, so = mine[x.src_buffer], x.src_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    theirs[slot + a:slot + b] = src[so + a:so + b]
                    yield
                self.delivered[peer, rank, w] = self.sent[rank, peer] + x.message + 1
            elif kind == TAKE:
                peer = x.peer
                target = self.received[rank, peer] + x.message + 1
                yield from wait(lambda: self.delivered[rank, peer, w] >= target, step, peer,
                                "its message")
                synced.add(peer)
                if x.direct:                 # written where it belongs by its sender
                    continue
                inbox = self.inbox[rank][call & 1]
                slot, dst, do = x.slot, mine[x.dst_buffer], x.dst_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    dst[do + a:do + b] = inbox[slot + a:slot + b]
                    yield
            elif kind == ARRIVE:
                peer = x.peer
                target = self.received[rank, peer] + x.message + 1
                yield from wait(lambda: self.delivered[rank, peer, w] >= target, step, peer,
                                "its message")
                synced.add(peer)
            elif kind in (REDUCE_LL, TAKE_REDUCE):
                peer, slot, first = x.peer, x.slot, x.first
                kb, ko = x.keep_buffer, x.keep_offset
                dst, do = mine[x.dst_buffer], x.dst_offset
                other, oo = mine[x.other_buffer], x.other_offset
                inbox = (self.lines if kind == REDUCE_LL else self.inbox)[rank][call & 1]
                flags = self.line_flags[rank][call & 1]
                lo, hi = share(x.count)
                if kind == TAKE_REDUCE:
                    target = self.received[rank, peer] + x.message + 1
                    yield from wait(lambda: self.delivered[rank, peer, w] >= target, step, peer,
                                    "its message")
                    synced.add(peer)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    if kind == REDUCE_LL:
                        yield from wait(lambda: (flags[slot + a:slot + b] == flag).all(),
                                        step, peer, "its message")
                    line, value = inbox[slot + a:slot + b].copy(), other[oo + a:oo + b]
                    dst[do + a:do + b] = reduce(line, value) if first else reduce(value, line)
                    if kb >= 0:
                        mine[kb][ko + a:ko + b] = line
                    yield
            elif kind == COPY:
                dst, do, src, so = mine[x.dst_buffer], x.dst_offset, mine[x.src_buffer], \
                    x.src_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    dst[do + a:do + b] = src[so + a:so + b]
                    yield
            elif kind == REDUCE_N:            # one pass: every operand read, then dst written
                # (SENDS_ON: the kernel waits as the sends that follow wait, then sends the
                # results on in the same pass; here the waits come first, then the chain,
                # then the sends, which this worker's order makes the same)
                if x.operands & SENDS_ON:
                    batch = at + 1
                    if batch == len(code) or code[batch][KIND] not in _SENDS:
                        raise ValueError(f"rank {rank}: row {at} (REDUCE_N, step {step + 1}) "
                                         f"sends its result on, but no send follows it")
                    while batch < len(code) and (code[batch][KIND], code[batch][STEP]) == \
                            (code[at + 1][KIND], code[at + 1][STEP]):
                        ready, what = posted(code[batch])
                        yield from wait(ready, step,
                                        INSTRUCTIONS[int(code[batch][KIND])].read(
                                            code[batch]).peer, what)
                        batch += 1
                dst, do = mine[x.dst_buffer], x.dst_offset
                inbox = self.lines[rank][call & 1]
                flags = self.line_flags[rank][call & 1]
                xs = [decode_operand(v) + (None,) if v >= 0 else
                      (None,) + decode_line_operand(v) for v in chain_operands(row)]
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    values = []
                    for xb, xo, peer in xs:     # a message in lines: each piece once there
                        if xb is None:
                            yield from wait(lambda: (flags[xo + a:xo + b] == flag).all(),
                                            step, peer, "its message")
                            values.append(inbox[xo + a:xo + b].copy())
                        else:
                            values.append(mine[xb][xo + a:xo + b].copy())
                    acc = values[0]
                    for value in values[1:]:
                        acc = reduce(acc, value)
                    dst[do + a:do + b] = acc
                    yield
            elif kind == REDUCE:
                dst, do = mine[x.dst_buffer], x.dst_offset
                xa, ao, xb, bo = mine[x.a_buffer], x.a_offset, mine[x.b_buffer], x.b_offset
                lo, hi = share(x.count)
                for a in range(lo, hi, piece):
                    b = min(hi, a + piece)
                    dst[do + a:do + b] = reduce(xa[ao + a:ao + b], xb[bo + a:bo + b])
                    yield


# ---------------------------------------------------------------------------------------------
# Verifying a schedule in its pushed form


def _calls(collective, algorithm, size, counts, root, rng, calls):
    """``calls`` calls of one collective with fresh data: (entries for ``Group.run``, every
    rank's input, every rank's output) each. An all_reduce or broadcast is called out of
    place on even calls (input passed: the executor's seeded program reads it) and in place
    on odd ones (output holds the data, no input), as the group calls the peer executor."""
    args = plan_args(collective, size, counts, root) if counts is not None else ()
    plans = [build_plan(collective, algorithm, r, size, *args) for r in range(size)]
    poison = _poison(np.uint64)
    out = []
    for call in range(calls):
        entries, inputs, outputs = [], [], []
        for r, plan in enumerate(plans):
            n_in, n_out = buffer_sizes(collective, r, size, counts, root) \
                if counts is not None else (0, 0)
            data = rng.integers(0, 2**63, max(n_in, 0), dtype=np.uint64, endpoint=True)
            output = np.full(n_out, poison, np.uint64)
            if collective in ("all_reduce", "broadcast") and call % 2:
                output[...] = data
                entries.append((plan, None, output))
            else:
                entries.append((plan, data, output))
            inputs.append(data)
            outputs.append(output)
        out.append((entries, inputs, outputs))
    return out


def verify(collective: str, algorithm: str, size: int, counts, root: int = 0, seed: int = 0,
           *, eager: int = 0, lines: int = 0, symmetric=(), direct: bool = False,
           workers: int = 3, calls: int = 2, piece: int = 3, deadline: int = 100000) -> None:
    """Prove one algorithm at one world size and counts in its pushed form: every rank's
    program as ``pushed.lower`` makes it for the peer executor (messages of at most
    ``eager`` elements eager, of at most ``lines`` in flagged lines; ranks in ``symmetric``
    pass outputs their peers write directly; ``direct``: eager messages land there too), run
    on ``workers`` workers per rank interleaved at random (``seed``), over ``calls``
    consecutive calls that reuse the staging memory and the flags, each against numpy
    (``simulate.reference``): random 64-bit words reduced with a wrapping SUM, so a missing
    or doubled contribution changes the result (up to 2**-64), as ``simulate.verify``'s.

    Raises AssertionError where a rank ends a call with a wrong result, ``Stuck`` (a
    CollectiveTimeout) where a wait never ends (a flag no peer sets: ``deadline`` scheduler
    turns), ValueError for a plan the lowering refuses."""
    from .simulate import reference
    rng = np.random.default_rng(seed)
    group = Group(size, workers, seed=seed, dtype=np.uint64)
    made = _calls(collective, algorithm, size, counts, root, rng, calls)
    group.run([entries for entries, _, _ in made], piece=piece, deadline=deadline,
              eager=eager, lines=lines, seeded=True, symmetric=symmetric, direct=direct)
    if collective == "barrier":
        return
    whole = collective in ("all_reduce", "broadcast", "reduce")
    for call, (_, inputs, outputs) in enumerate(made):
        arrays = inputs
        if collective == "scatter":
            arrays = [a if r == root else np.zeros(0, np.uint64) for r, a in enumerate(inputs)]
        want = reference(collective, arrays, root=root, counts=None if whole else counts)
        for rank, (got, wanted) in enumerate(zip(outputs, want)):
            if wanted is not None and not np.array_equal(got, wanted):
                at_root = f", root {root}" if collective in ROOTED else ""
                raise AssertionError(
                    f"{collective} ({algorithm}) in its pushed form at world size {size}, "
                    f"counts {counts!r}{at_root}, eager {eager}, lines {lines}: rank {rank} "
                    f"holds a wrong result after call {call + 1}")
