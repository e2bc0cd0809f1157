"""Plans lowered for peer memory: every rank writes its messages straight into the receiving
rank's memory (a *push*), and ranks order themselves with flags instead of messages.

Pure: the program is a table of integers that an executor runs; here it is only built (the
peer-memory executor runs it on the GPU; ``tests/schedules/peer_model.py`` runs it on the CPU,
every rank's workers interleaved at random over numpy arrays and flag words).

The protocol, per call and rank (``epoch`` and ``delivered`` live in each rank's flag words,
readable and writable by every rank of the group):

* At the start of its step j a rank publishes ``epoch = ((call + 1) << 24) | j`` (never 0, the
  flags' initial value) into every rank's flags, so waiters poll their own memory: everything
  of its steps before j is done, so the regions its step-j receives land in are free. It
  publishes only where some sender waits: its first step, and steps with a receive that is
  not eager (below).
* A send of step j waits until the receiving rank's epoch reaches the step of the matching
  receive (its k-th receive from this rank, as its k-th send to it: messages between a pair
  match in order, as everywhere), writes the data into the receiver's region, and then
  stores the message's number in the receiver's ``delivered`` word for this sender.
* A receive waits until ``delivered`` from its peer reaches the message's number.
* Local ops run after the step's receives have arrived (and after its sends have read what
  the ops overwrite).

A send completes when it is written, so this is message passing with rendezvous (a send
waits for its receive to be posted); every registered plan is deadlock-free under rendezvous
(``cost.replay`` matches that way and would report a deadlock). Call numbers and message
numbers only grow, so flags are never reset between calls.

Each rank's program runs on ``blocks`` workers at once (the GPU's thread blocks): each moves
its share of every message and op (``share``), and ``BARRIER`` makes all of them finish what
came before. The sender's workers each store their own ``delivered`` word, and a receive
waits for all of them. Barriers go where one worker may depend on another's share: before
each step (a send reads what earlier ops wrote), between a step's sends and local ops that
overwrite what the sends read, and between two local ops that conflict (``hazards``).

Small messages go *eagerly* (``lower(plan, eager)``: those of at most ``eager`` elements):
the sender does not wait for the receive to be posted, it writes into a slot of the
receiver's inbox (one slot per message of the call, laid out alike on both sides from the
receiver's plan) and the receiver copies the slot into its region when the message has
arrived (``TAKE``). Each step then costs one hop between GPUs instead of a round trip. Inboxes
alternate between two halves by call parity, at places that do not move between calls, so a
slot is written again only two calls later: the sender first waits until the receiver has
started the previous call (its epoch), which has almost always happened long before. Those of
at most ``lines`` elements travel in flagged lines (``SEND_LL``/``TAKE_LL``): 4 data bytes and
the call's flag in each 8-byte line, which the receiver polls itself, so they need neither a
delivered word nor a fence.

Where regions live: a receive writes into the receiver's memory, so every region any receive
lands in must be in memory other ranks can write (the group's staging buffers). ``scratch``
always lives there; ``output`` lives there on a rank where some receive lands in output (the
``placement``), and then its values are copied in at the start where the plan reads output
before writing it, and copied out to the caller's output at the end. ``input`` is never
written by receives and stays the caller's buffer. Each rank works out every other rank's
placement from its plan, so a sender knows where to write.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import hazards
from .schedule import Copy, Plan, buffer_sizes, build_plan

# Instruction kinds (column 0); column 1 is the plan step (-1: before the first, or after the
# last) for error messages; the rest by kind:
BARRIER = 0     # every worker of this rank has finished everything before it
EPOCH = 1       # publish epoch (call, step)                    [2]: step
PUSH = 2        # [2] peer [3] src buffer [4] src offset [5] dst buffer (peer's) [6] dst offset
                # [7] count [8] the peer's step to wait for [9] message number to that peer
ARRIVE = 3      # [2] peer [3] message number from that peer
COPY = 4        # [2] dst buffer [3] dst offset [4] src buffer [5] src offset [6] count
REDUCE = 5      # [2] dst buffer [3] dst offset [4] a buffer [5] a offset [6] b buffer
                # [7] b offset [8] count
SEND = 6        # eager: [2] peer [3] src buffer [4] src offset [5] slot in the peer's inbox
                # [6] count [7] message number to that peer
TAKE = 7        # [2] peer [3] message number from that peer [4] dst buffer [5] dst offset
                # [6] slot in this rank's inbox [7] count
SEND_LL = 8     # eager in lines of 4 data bytes + a 4-byte flag (NCCL's LL protocol): the
                # receiver polls the data itself, no delivered word, no fences; as SEND
TAKE_LL = 9     # as TAKE, each line waited for by the thread that copies it
WIDTH = 10
SLOT_ALIGN = 16  # elements: inbox slots start 16-byte aligned whatever the dtype

# Buffers (what the executor passes): the caller's input, the plan's output (the caller's or
# the staging copy), the staging scratch, and the caller's output (copy-out target).
INPUT, OUTPUT, SCRATCH, CALLER_OUTPUT = 0, 1, 2, 3
_BUFFER = {"input": INPUT, "output": OUTPUT, "scratch": SCRATCH}


class Program(NamedTuple):
    code: np.ndarray          # (n, WIDTH) int64
    output_staged: bool       # this rank's output lives in the staging memory
    staged_output: int        # elements of output the staging memory must hold (0 if not staged)
    scratch: int              # elements of scratch
    sends: tuple              # messages this rank sends to each peer in one call
    recvs: tuple              # messages it receives from each peer in one call
    largest: int              # elements of the largest message of any rank (for ``blocks``)
    scratch_at: int           # where scratch starts in every rank's staging memory, in
                              # elements (after the largest staged output of any rank)
    scratch_max: int          # the largest scratch of any rank (then the inboxes)
    inbox: int                # elements of one inbox half (the largest of any rank)


def plans_of(plan: Plan) -> list:
    """Every rank's plan of the call ``plan`` belongs to (``plan`` itself for its rank)."""
    if not plan.args and plan.collective != "barrier":
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {plan.rank}: the plan "
                         f"was built by hand, so the other ranks' plans (where each message "
                         f"lands) cannot be derived; build it with build_plan")
    return [plan if r == plan.rank else
            build_plan(plan.collective, plan.algorithm, r, plan.size, *plan.args)
            for r in range(plan.size)]


def lower(plan: Plan, eager: int = 0, lines: int = 0) -> Program:
    """The push program of ``plan`` (cached on it); messages of at most ``eager`` elements go
    eagerly, those of at most ``lines`` elements in flagged lines (``SEND_LL``); every rank of
    the call must pass the same values."""
    lines = min(lines, eager)
    return plan.derived("_pushed", (eager, lines),
                        lambda: _lower(plan, plans_of(plan), eager, lines))


def _output_count(plan):
    """Elements of the caller's output on ``plan``'s rank (what a staged output copies out)."""
    if plan.collective == "barrier":
        return 0
    return buffer_sizes(plan.collective, plan.rank, plan.size, *plan.args)[1]


def staged(plan: Plan) -> bool:
    """Whether some receive of ``plan`` lands in output (then output is staged)."""
    return any(r.region.buffer == "output" for step in plan.steps for r in step.recvs)


STEP_BITS = 24    # an epoch is (call + 1) << STEP_BITS | step


def _lower(plan, plans, eager, lines):
    rank, size = plan.rank, plan.size
    longest = max(len(other.steps) for other in plans)
    if longest >= 1 << STEP_BITS:
        # the step would spill into the call number and order one call's steps wrongly
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {rank}: a plan of "
                         f"{longest} steps does not fit the peer-memory epoch "
                         f"(at most {(1 << STEP_BITS) - 1} steps)")
    for other in plans:
        for step in other.steps:
            for r in step.recvs:
                if r.region.buffer == "input":
                    raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {other.rank} "
                                     f"receives into its input, which peers cannot write")
    # Where each receiver's k-th message from each sender lands, in which of its steps, and
    # its inbox slot if it goes eagerly (-1 if not).
    landing = {}                              # (src, dst) -> [(step, region, slot)]
    inboxes = []
    for other in plans:
        inbox = 0
        for index, step in enumerate(other.steps):
            for r in step.recvs:
                slot, count = -1, r.region.count
                if count <= eager:
                    slot = inbox
                    # a line slot holds 8 bytes per 4 bytes of data
                    room = 2 * -(-count // 4) * 4 if count <= lines else count
                    inbox += -(-room // SLOT_ALIGN) * SLOT_ALIGN
                landing.setdefault((r.peer, other.rank), []).append((index, r.region, slot))
        inboxes.append(inbox)
    # A rank publishes its epoch where some sender waits for it: at its first step (eager
    # senders wait for the previous call's) and where a receive is not eager.
    waited = {0} | {index for pairs in (p for (src, dst), p in landing.items() if dst == rank)
                    for index, _, slot in pairs if slot < 0}
    mine = {}                                 # (src, k) -> slot, for this rank's receives
    for (src, dst), pairs in landing.items():
        if dst == rank:
            for k, (_, _, slot) in enumerate(pairs):
                mine[src, k] = slot

    code = []
    emit = code.append
    out_staged = staged(plan)
    reads_first = _read_before_written(plan) if out_staged else []
    for lo, hi in reads_first:                # the caller's output values, staged
        emit((COPY, -1, OUTPUT, lo, CALLER_OUTPUT, lo, hi - lo))
    sent = [0] * size
    received = [0] * size
    for index, step in enumerate(plan.steps):
        if code:
            emit((BARRIER, index))
        if index in waited:
            emit((EPOCH, index, index))
        reads = []
        for s in step.sends:
            k = sent[s.peer]
            sent[s.peer] += 1
            pairs = landing.get((rank, s.peer), ())
            if k >= len(pairs):
                raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {rank} sends "
                                 f"message {k + 1} to rank {s.peer}, which receives only "
                                 f"{len(pairs)} from it")
            their_step, region, slot = pairs[k]
            if region.count != s.region.count:
                raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {rank} step "
                                 f"{index + 1} sends {s.region.count} elements to rank "
                                 f"{s.peer}, whose step {their_step + 1} receives "
                                 f"{region.count}")
            if slot >= 0:
                emit((SEND_LL if s.region.count <= lines else SEND, index, s.peer,
                      _BUFFER[s.region.buffer], s.region.offset, slot, s.region.count, k))
            else:
                emit((PUSH, index, s.peer, _BUFFER[s.region.buffer], s.region.offset,
                      _BUFFER[region.buffer], region.offset, s.region.count, their_step, k))
            reads.append(hazards.access(s))
        done = reads                       # accesses other workers may still be making
        for r in step.recvs:
            k = received[r.peer]
            received[r.peer] += 1
            slot = mine[r.peer, k]
            if slot >= 0:                  # each worker copies its share of the slot
                emit((TAKE_LL if r.region.count <= lines else TAKE, index, r.peer, k,
                      _BUFFER[r.region.buffer], r.region.offset, slot, r.region.count))
                done.append(hazards.access(r))
            else:                          # every worker of the sender wrote its share
                emit((ARRIVE, index, r.peer, k))
        for op in step.local:
            accessed = hazards.access(op)
            if any(hazards.conflict(accessed, other) for other in done):
                emit((BARRIER, index))
                done = []
            done.append(accessed)
            if isinstance(op, Copy):
                emit((COPY, index, _BUFFER[op.dst.buffer], op.dst.offset,
                      _BUFFER[op.src.buffer], op.src.offset, op.dst.count))
            else:
                emit((REDUCE, index, _BUFFER[op.dst.buffer], op.dst.offset,
                      _BUFFER[op.a.buffer], op.a.offset, _BUFFER[op.b.buffer], op.b.offset,
                      op.dst.count))
    if out_staged:
        emit((BARRIER, -1))
        for lo, hi in _written(plan):
            emit((COPY, -1, CALLER_OUTPUT, lo, OUTPUT, lo, hi - lo))
    for (src, dst), pairs in landing.items():
        if src == rank and len(pairs) != sent[dst]:
            raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {dst} receives "
                             f"{len(pairs)} messages from rank {rank}, which sends {sent[dst]}")

    table = np.zeros((len(code), WIDTH), np.int64)
    for i, row in enumerate(code):
        table[i, :len(row)] = row
    table.flags.writeable = False
    largest = max((t.region.count for other in plans for step in other.steps
                   for t in step.sends), default=0)
    outputs = [_staged_output(other) for other in plans]
    return Program(table, out_staged, outputs[rank], plan.scratch, tuple(sent), tuple(received),
                   largest, max(outputs), max(other.scratch for other in plans), max(inboxes))


def _staged_output(plan):
    if not staged(plan):
        return 0
    end = max((region.end for step in plan.steps for region in _regions(step)
               if region.buffer == "output"), default=0)
    return max(end, _output_count(plan))


def _regions(step):
    for t in step.sends + step.recvs:
        yield t.region
    for op in step.local:
        yield from op


def _read_before_written(plan):
    """Output ranges the plan reads before anything of the plan writes them (sorted)."""
    written, needed = hazards.Ranges(), hazards.Ranges()

    def read(region):
        if region.buffer == "output":
            for lo, hi in written.gaps(region.offset, region.end):
                needed.add(lo, hi)

    def write(region):
        if region.buffer == "output":
            written.add(region.offset, region.end)

    for step in plan.steps:
        for s in step.sends:
            read(s.region)
        for r in step.recvs:
            write(r.region)
        for op in step.local:
            reads, writes = hazards.access(op)
            for region in reads:
                read(region)
            for region in writes:
                write(region)
    return list(zip(needed.starts, needed.ends))


def _written(plan):
    written = hazards.Ranges()
    for step in plan.steps:
        for region in [r.region for r in step.recvs] + [op.dst for op in step.local]:
            if region.buffer == "output":
                written.add(region.offset, region.end)
    return list(zip(written.starts, written.ends))


def share(count: int, worker: int, workers: int) -> tuple[int, int]:
    """The [start, end) of ``count`` elements that worker ``worker`` of ``workers`` moves."""
    return count * worker // workers, count * (worker + 1) // workers
