"""The pushed-form simulator: the peer-memory protocol run on the CPU. Every rank's push
program (``pushed.lower``: the instructions the CUDA kernel runs) and the special kernels
(``two_shot_in_place``, ``pipelined_reduce_scatter``, ``copies_around``), each on several
workers (the GPU's thread blocks), interleaved in a random order over numpy arrays and flag
words, so the ordering the flags give is checked without a GPU. docs/peer-memory.md explains
the protocol; ``kernels/peer_protocol.py`` defines it. Here: the group (flags, staging memory,
the scheduler) and the program interpreter (``_Program``: a step per instruction kind); the
special kernels are ``pushed_sim_kernels.py``'s (``Kernels``, a part of ``Group``).

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

from ..errors import CollectiveTimeout
from ..kernels import peer_protocol
from ..kernels.peer_protocol import (
    ARRIVE, BARRIER, CALLER_OUTPUT, COPY, EPOCH, INBOX, INPUT, INSTRUCTIONS, KIND, OUTPUT, PUSH,
    REDUCE, REDUCE_LL, REDUCE_N, SCRATCH, SEND, SEND_LL, SENDS_ON, STEP, TAKE, TAKE_LL,
    TAKE_REDUCE, chain_operands, decode_line_operand, decode_operand, epoch)
from . import pushed
from .pushed_sim_kernels import PIPELINED, CalledOtherwise, Kernels, by_copy_engines
from .schedule import ROOTED, buffer_sizes, build_plan, plan_args

__all__ = ["PIPELINED", "CalledOtherwise", "CollectiveTimeout", "Group", "InPlace", "Stuck",
           "verify"]


_SENDS = (PUSH, SEND, SEND_LL)      # what a REDUCE_N with SENDS_ON sends its result on with


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


class Group(Kernels):
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
        run as the copy engines' do (``by_copy_engines``); ``gathers`` (with ``pipelined``):
        those ``copied`` leaves run as ``pipelined_reduce_scatter``'s all_gather and
        all_to_all (kinds 3, 4: ``_pipelined``'s ``moves``), peers pushing straight into the
        outputs of the ranks in ``symmetric``."""
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
            elif copied and by_copy_engines(plan):   # (before the pipelined kernel, as run)
                yield from self._copied(rank, w, plan, input, output, piece, deadline,
                                        barriers, copied)
                sends = recvs = [(copied + 1) * (q != rank) for q in range(self.size)]
                finished = None
            elif pipelined and ((plan.collective, plan.algorithm) in PIPELINED or
                                gathers and by_copy_engines(plan)):
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

    def _call(self, rank, w, program, input, output, reduce, piece, barriers, deadline):
        """``program`` on worker ``w`` of ``rank`` (the kernel's interpreter loop): the line
        flags' scrub where this call does it, then row after row, each by its kind's
        ``_Program`` step."""
        run = _Program(self, rank, w, program, input, output, reduce, piece, barriers,
                       deadline)
        yield from run.scrub()
        for at, row in enumerate(program.code):
            kind = INSTRUCTIONS[int(row[KIND])]
            yield from _Program.STEPS[kind](run, at, kind.read(row)) or ()   # (None: no yield)


class _Program:
    """One worker's run of one program (``Group._call``): what its rows share (the rank's
    buffers by number, this call's line flag, the peers synchronized with), and a step per
    instruction kind (``STEPS``), each a generator that yields as the worker waits or moves a
    piece, or None for a kind that never waits."""

    def __init__(self, group, rank, w, program, input, output, reduce, piece, barriers,
                 deadline):
        self.group, self.rank, self.w, self.code = group, rank, w, program.code
        self.reduce, self.piece = reduce, piece
        self.barriers, self.deadline = barriers, deadline
        self.call = call = group.calls[rank]
        self.mine = {INPUT: input, CALLER_OUTPUT: output, SCRATCH: group.scratch[rank],
                     OUTPUT: group.out[rank] if program.output_staged else output,
                     INBOX: group.inbox[rank][call & 1]}     # (a REDUCE_N operand only)
        self.flag = peer_protocol.line_flag(call, group.period)
        # the peers this worker synchronized with in this call (waited for their epoch of
        # it, or for a message they sent in it): what they said at their first epoch is seen
        self.synced = set()

    def share(self, count):                  # as the kernel's: alike for alike counts
        return pushed.share(count, self.w, self.group.workers, self.group.align)

    def wait(self, ready, step, peer, what):
        return self.group._until(ready, self.deadline, self.rank, step, peer, what)

    def pieces(self, count):
        """This worker's share of ``count`` elements, piece by piece: (a, b) each."""
        lo, hi = self.share(count)
        for a in range(lo, hi, self.piece):
            yield a, min(hi, a + self.piece)

    def scrub(self):
        """The line flags' half this call zeroes, each worker its share, all before any
        epoch (``peer_protocol.scrubs``)."""
        group, rank = self.group, self.rank
        half = peer_protocol.scrubs(self.call, group.period)
        if half is not None:
            scrubbed = group.line_flags[rank][half]
            lo, hi = self.share(scrubbed.size)
            scrubbed[lo:hi] = 0
            yield
            yield from group._barrier(rank, self.w, self.barriers, -1, self.deadline)

    def posted(self, row):
        """What a send waits for: (whether it may write now, what it waits for)."""
        group, call = self.group, self.call
        send = INSTRUCTIONS[int(row[KIND])].read(row)
        peer = send.peer
        if send.kind == PUSH:              # the receive posted (the peer's epoch of its step)
            target = epoch(call, send.their_step)
            return (lambda: group.epoch[peer] >= target), "its receive to be posted"
        if send.kind == SEND and send.output_at >= 0:   # it may land in the peer's
            if peer in self.synced:                     # output: the peer says so at
                return (lambda: True), "this call"      # its first epoch, every worker
            target = epoch(call, 0)                     # of it before its first send
            return (lambda: group.epoch[peer] >= target), "this call"
        # eager: the slot's half was last used two calls ago, so the peer must have
        # started the previous call (then it is done with the one before)
        target = epoch(call - 1, 0) if call >= 2 else 0
        return (lambda: group.epoch[peer] >= target), "the previous call"

    def arrived(self, x):
        """Until message ``x.message`` of this call from ``x.peer`` is delivered."""
        group, rank, w, peer = self.group, self.rank, self.w, x.peer
        target = group.received[rank, peer] + x.message + 1
        yield from self.wait(lambda: group.delivered[rank, peer, w] >= target, x.step, peer,
                             "its message")
        self.synced.add(peer)

    def barrier(self, at, x):                # a block barrier orders nothing here: a worker
        if x.grid:                           # is one sequence
            yield from self.group._barrier(self.rank, self.w, self.barriers, x.step,
                                           self.deadline)

    def publish(self, at, x):
        group, rank, mine = self.group, self.rank, self.mine
        if self.w == 0 or (x.direct and group.every_worker_says):   # where output lands
            group.landing[rank] = mine[OUTPUT]
            if x.direct:                     # eager messages straight into output
                group.direct[rank] = self.call + 1
        if self.w == 0:                      # then the epoch
            group.epoch[rank] = epoch(self.call, x.published)

    def push(self, at, x):
        group, rank, peer = self.group, self.rank, x.peer
        ready, what = self.posted(self.code[at])
        yield from self.wait(ready, x.step, peer, what)
        self.synced.add(peer)
        theirs = {OUTPUT: group.landing[peer], SCRATCH: group.scratch[peer]}[x.dst_buffer]
        src, so, do = self.mine[x.src_buffer], x.src_offset, x.dst_offset
        for a, b in self.pieces(x.count):
            theirs[do + a:do + b] = src[so + a:so + b]
            yield
        group.delivered[peer, rank, self.w] = group.sent[rank, peer] + x.message + 1

    def send_ll(self, at, x):
        group, peer, slot, flag = self.group, x.peer, x.slot, self.flag
        ready, what = self.posted(self.code[at])
        yield from self.wait(ready, x.step, peer, what)
        theirs = group.lines[peer][self.call & 1]
        flags = group.line_flags[peer][self.call & 1]
        src, so = self.mine[x.src_buffer], x.src_offset
        for a, b in self.pieces(x.count):
            theirs[slot + a:slot + b] = src[so + a:so + b]
            flags[slot + a:slot + b] = flag      # data and flag land together
            yield

    def take_ll(self, at, x):
        group, rank, flag = self.group, self.rank, self.flag
        slot, dst, do = x.slot, self.mine[x.dst_buffer], x.dst_offset
        inbox = group.lines[rank][self.call & 1]
        flags = group.line_flags[rank][self.call & 1]
        for a, b in self.pieces(x.count):      # each piece as soon as it is there
            yield from self.wait(lambda: (flags[slot + a:slot + b] == flag).all(), x.step,
                                 x.peer, "its message")
            dst[do + a:do + b] = inbox[slot + a:slot + b]

    def send(self, at, x):
        group, rank, peer, slot, output_at = self.group, self.rank, x.peer, x.slot, x.output_at
        ready, what = self.posted(self.code[at])
        yield from self.wait(ready, x.step, peer, what)
        if output_at >= 0:
            self.synced.add(peer)
        theirs = group.inbox[peer][self.call & 1]
        if output_at >= 0 and group.direct[peer] == self.call + 1:    # into its output
            theirs, slot = group.landing[peer], output_at
        src, so = self.mine[x.src_buffer], x.src_offset
        for a, b in self.pieces(x.count):
            theirs[slot + a:slot + b] = src[so + a:so + b]
            yield
        group.delivered[peer, rank, self.w] = group.sent[rank, peer] + x.message + 1

    def take(self, at, x):
        yield from self.arrived(x)
        if x.direct:                         # written where it belongs by its sender
            return
        inbox = self.group.inbox[self.rank][self.call & 1]
        slot, dst, do = x.slot, self.mine[x.dst_buffer], x.dst_offset
        for a, b in self.pieces(x.count):
            dst[do + a:do + b] = inbox[slot + a:slot + b]
            yield

    def arrive(self, at, x):
        yield from self.arrived(x)

    def reduce_in(self, at, x):
        """REDUCE_LL (each piece once its line flags are there) and TAKE_REDUCE (once the
        message is delivered): the message reduced with ``other`` into ``dst``."""
        group, rank, mine, flag = self.group, self.rank, self.mine, self.flag
        in_lines = x.kind == REDUCE_LL
        peer, slot, first = x.peer, x.slot, x.first
        kb, ko = x.keep_buffer, x.keep_offset
        dst, do = mine[x.dst_buffer], x.dst_offset
        other, oo = mine[x.other_buffer], x.other_offset
        inbox = (group.lines if in_lines else group.inbox)[rank][self.call & 1]
        flags = group.line_flags[rank][self.call & 1]
        if not in_lines:
            yield from self.arrived(x)
        for a, b in self.pieces(x.count):
            if in_lines:
                yield from self.wait(lambda: (flags[slot + a:slot + b] == flag).all(),
                                     x.step, peer, "its message")
            line, value = inbox[slot + a:slot + b].copy(), other[oo + a:oo + b]
            dst[do + a:do + b] = \
                self.reduce(line, value) if first else self.reduce(value, line)
            if kb >= 0:
                mine[kb][ko + a:ko + b] = line
            yield

    def copy(self, at, x):
        mine = self.mine
        dst, do, src, so = mine[x.dst_buffer], x.dst_offset, mine[x.src_buffer], x.src_offset
        for a, b in self.pieces(x.count):
            dst[do + a:do + b] = src[so + a:so + b]
            yield

    def reduce_n(self, at, x):
        """One pass: every operand read, then dst written. (SENDS_ON: the kernel waits as
        the sends that follow wait, then sends the results on in the same pass; here the
        waits come first, then the chain, then the sends, which this worker's order makes
        the same.)"""
        group, rank, mine, flag, code, step = \
            self.group, self.rank, self.mine, self.flag, self.code, x.step
        if x.operands & SENDS_ON:
            batch = at + 1
            if batch == len(code) or code[batch][KIND] not in _SENDS:
                raise ValueError(f"rank {rank}: row {at} (REDUCE_N, step {step + 1}) "
                                 f"sends its result on, but no send follows it")
            while batch < len(code) and (code[batch][KIND], code[batch][STEP]) == \
                    (code[at + 1][KIND], code[at + 1][STEP]):
                ready, what = self.posted(code[batch])
                yield from self.wait(ready, step, INSTRUCTIONS[int(code[batch][KIND])].read(
                    code[batch]).peer, what)
                batch += 1
        dst, do = mine[x.dst_buffer], x.dst_offset
        inbox = group.lines[rank][self.call & 1]
        flags = group.line_flags[rank][self.call & 1]
        xs = [decode_operand(v) + (None,) if v >= 0 else
              (None,) + decode_line_operand(v) for v in chain_operands(code[at])]
        for a, b in self.pieces(x.count):
            values = []
            for xb, xo, peer in xs:         # a message in lines: each piece once there
                if xb is None:
                    yield from self.wait(lambda: (flags[xo + a:xo + b] == flag).all(), step,
                                         peer, "its message")
                    values.append(inbox[xo + a:xo + b].copy())
                else:
                    values.append(mine[xb][xo + a:xo + b].copy())
            acc = values[0]
            for value in values[1:]:
                acc = self.reduce(acc, value)
            dst[do + a:do + b] = acc
            yield

    def reduce_two(self, at, x):
        mine = self.mine
        dst, do = mine[x.dst_buffer], x.dst_offset
        xa, ao, xb, bo = mine[x.a_buffer], x.a_offset, mine[x.b_buffer], x.b_offset
        for a, b in self.pieces(x.count):
            dst[do + a:do + b] = self.reduce(xa[ao + a:ao + b], xb[bo + a:bo + b])
            yield

    STEPS = {BARRIER: barrier, EPOCH: publish, PUSH: push, SEND_LL: send_ll, TAKE_LL: take_ll,
             SEND: send, TAKE: take, ARRIVE: arrive, REDUCE_LL: reduce_in,
             TAKE_REDUCE: reduce_in, COPY: copy, REDUCE_N: reduce_n, REDUCE: reduce_two}


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
