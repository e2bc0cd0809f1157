"""Plans lowered once into the program a host-style executor runs: post a transfer, wait for
some of the posted ones, run a local op. What may happen when is decided here, at lowering,
by the hazard rules (``hazards``); the executor only interprets, so one walker runs every mode.

Two lowerings, each cached on the plan:

``stepwise(plan)``: the step semantics exactly. Each step posts its receives, then its sends,
waits for all of them, then runs its local ops in order.

``overlapped(plan)``: for transports that move data in the background, usually over a
segmented plan (``transforms.segmented``). Each local op waits only for the posted transfers
it conflicts with (``hazards.conflict``: receives writing what it reads or writes, sends
reading what it writes), so the reduction of segment k runs while segments k+1.. still
arrive. The next step's transfers are posted, in order, as soon as nothing left in this step
conflicts with them (a ring's segment k goes on to the next rank right after its reduction,
as gloo's pipelined ring does). A receive waited for takes every earlier receive from its
peer along: some transports (local) match a receive to a message when it completes, not
when it is posted, so receives from one peer must complete in posting order. Each peer's
messages are posted in plan order, so they match as in the step walk; a step ends only when
all its own transfers are done.

A program is a tuple of instructions ``(kind, step, what)``: ``POST`` with ``(recvs, sends)``
(tuples of Recv/Send, posted receives first; requests are numbered in posting order),
``WAIT`` with the request numbers (a ``slice`` when they are consecutive), ``LOCAL`` with a
tuple of Copy/Reduce (or Chain) ops to run in order. ``step`` is the plan step the
instruction belongs to (for error messages). Consecutive posts and consecutive ops are one
instruction each, so an interpreter in Python pays its dispatch per step, not per message.

A pass over a program:

``chained(program)``: in each LOCAL instruction, runs of reductions through one accumulator
(dst_i = dst_(i-1) op b_i; the direct all_reduce's p-1 reductions) become one ``Chain`` op,
for executors that run such a run as one fused kernel (``hazards.extends_chain`` says which
runs may be fused). An executor without fusion runs a Chain op by op: same result.

And one lowering of another shape, for executors that order work on two streams:

``two_streams(plan, max_count)``: the plan's steps in rounds (``transforms.rounds``: each
message cut by its own size), transfers on a communication stream, local ops on a compute
stream, each instruction waiting for the latest instruction of the other stream it
conflicts with (see ``two_streams``).
"""
from __future__ import annotations

from typing import NamedTuple

from . import hazards
from .schedule import Plan, Reduce
from .transforms import rounds

POST, WAIT, LOCAL = "post", "wait", "local"
COMM, COMPUTE = "comm", "compute"           # the two streams of ``two_streams``
LONGEST_CHAIN = 16                          # reductions in one Chain (operands of one kernel)


class Program(NamedTuple):
    plan: Plan
    code: tuple
    requests: int           # how many transfers it posts


class Chain(NamedTuple):
    """Reductions ``ops`` (each Reduce's ``a`` the previous one's ``dst``) run as one: load
    ``a`` and every ``b``, carry each element through the ops in order, rounding after each
    as the ops would, and store each distinct destination once, with its value after op
    ``writes[i]``. ``dsts`` are the distinct destinations in order of first write. Made by
    ``Chain.of``; ``chained`` makes one only where ``hazards.extends_chain`` allows, so it
    means what its ops mean run one by one."""
    ops: tuple
    dsts: tuple
    writes: tuple

    @classmethod
    def of(cls, ops) -> "Chain":
        last = {}
        for i, op in enumerate(ops):
            last[op.dst] = i
        return cls(tuple(ops), tuple(last), tuple(last.values()))

    @property
    def a(self):
        return self.ops[0].a

    @property
    def bs(self) -> tuple:
        return tuple(op.b for op in self.ops)


def stepwise(plan: Plan) -> Program:
    """The step walk as a program (see the module)."""
    return plan.derived("_lowered", "stepwise", lambda: _stepwise(plan))


def overlapped(plan: Plan) -> Program:
    """Each op waiting only for what it conflicts with, later transfers posted early."""
    return plan.derived("_lowered", "overlapped", lambda: _overlapped(plan))


def _stepwise(plan):
    code, posted = [], 0
    for index, step in enumerate(plan.steps):
        if step.sends or step.recvs:
            first = posted
            code.append((POST, index, (step.recvs, step.sends)))
            posted += len(step.recvs) + len(step.sends)
            code.append((WAIT, index, slice(first, posted)))
        if step.local:
            code.append((LOCAL, index, step.local))
    return Program(plan, tuple(code), posted)


def _merged(code):
    """Consecutive posts, and consecutive local ops, of one step as one instruction."""
    out = []
    for kind, index, what in code:
        if out and out[-1][0] == kind == LOCAL and out[-1][1] == index:
            out[-1] = (LOCAL, index, out[-1][2] + what)
        elif out and out[-1][0] == kind == POST and out[-1][1] == index and \
                not out[-1][2][1]:              # receives only so far: posting order holds
            out[-1] = (POST, index, (out[-1][2][0] + what[0], what[1]))
        elif out and out[-1][0] == kind == POST and out[-1][1] == index and not what[0]:
            out[-1] = (POST, index, (out[-1][2][0], out[-1][2][1] + what[1]))
        else:
            out.append((kind, index, what))
    return out


def _overlapped(plan):
    code = []
    steps = plan.steps
    count = 0

    def post(transfer, is_receive, index):
        """Emit the post; the pending entry (number, access, is_receive, peer)."""
        nonlocal count
        code.append((POST, index, ((transfer,), ()) if is_receive else ((), (transfer,))))
        count += 1
        return count - 1, hazards.access(transfer), is_receive, transfer.peer

    early, early_recvs, early_sends = [], 0, 0      # the next step's transfers posted already
    for index, step in enumerate(steps):
        pending = early
        pending += [post(r, True, index) for r in step.recvs[early_recvs:]]
        pending += [post(s, False, index) for s in step.sends[early_sends:]]
        following = steps[index + 1] if index + 1 < len(steps) else None
        early, early_recvs, early_sends = [], 0, 0

        def look_ahead(remaining):
            nonlocal early_recvs, early_sends
            if following is None:
                return
            later = [e[1] for e in pending] + [hazards.access(op) for op in remaining]
            for transfers, is_receive in ((following.recvs, True), (following.sends, False)):
                done = early_recvs if is_receive else early_sends
                while done < len(transfers):
                    accessed = hazards.access(transfers[done])
                    if any(hazards.conflict(accessed, other) for other in later):
                        break
                    early.append(post(transfers[done], is_receive, index))
                    done += 1
                if is_receive:
                    early_recvs = done
                else:
                    early_sends = done

        local = step.local
        look_ahead(local)
        for j, op in enumerate(local):
            if pending:
                accessed = hazards.access(op)
                needed, rest, peers = [], [], set()
                for entry in reversed(pending):
                    _, transfer, is_receive, peer = entry
                    if (is_receive and (peer in peers or -1 in peers)) or \
                            hazards.conflict(transfer, accessed):
                        needed.append(entry)
                        if is_receive:
                            peers.add(peer)
                    else:
                        rest.append(entry)
                if needed:
                    code.append((WAIT, index, tuple(e[0] for e in reversed(needed))))
                    pending = rest[::-1]
            code.append((LOCAL, index, (op,)))
            if following is not None:
                look_ahead(local[j + 1:])
        if pending:
            code.append((WAIT, index, tuple(e[0] for e in pending)))
    return Program(plan, tuple(_merged(code)), count)


# -- chained: fusable runs of reductions as one op ------------------------------------------------


def chained(program: Program, longest: int = LONGEST_CHAIN) -> Program:
    """``program`` with fusable runs of Reduce ops, at most ``longest`` long, as ``Chain`` ops
    (see the module). Cached on the plan, per program and ``longest``."""
    if longest < 1:
        raise ValueError(f"chained: longest must be >= 1, got {longest}")
    cache = program.plan.derived("_chained", longest, dict)
    entry = cache.get(id(program))
    if entry is None or entry[0] is not program:      # a program built by hand may be gone
        entry = cache[id(program)] = (program, _chained(program, longest))
    return entry[1]


def _chained(program, longest):
    code = []
    for kind, index, what in program.code:
        if kind is LOCAL:
            what = tuple(run[0] if len(run) == 1 else Chain.of(run)
                         for run in _runs(what, longest))
        code.append((kind, index, what))
    return Program(program.plan, tuple(code), program.requests)


def _runs(local, longest):
    """``local`` (ops in order) cut into runs one fused kernel can do."""
    runs: list = []
    for op in local:
        run = runs[-1] if runs else None
        if run is not None and len(run) < longest and isinstance(op, Reduce) and \
                hazards.extends_chain(run, op):
            run.append(op)
        else:
            runs.append([op])
    return runs


# -- two streams: transfers and local ops ordered by events ------------------------------------


class Enqueued(NamedTuple):
    """One instruction of a two-stream program. ``kind``: POST (``what`` is ``(recvs,
    sends)``, one group of transfers), LOCAL (``what`` is a tuple of one Copy or Reduce) or
    WAIT (nothing to run: only ``after``); ``step``: the plan step it comes from;
    ``stream``: COMM or COMPUTE; ``after``: the number of the instruction of the other
    stream that must be done before this one starts, or -1; ``record``: whether a later
    instruction waits for this one (so an executor records an event after it)."""
    kind: str
    step: int
    what: tuple
    stream: str
    after: int
    record: bool


class Streams(NamedTuple):
    plan: Plan
    code: tuple             # of Enqueued


def two_streams(plan: Plan, max_count: int) -> Streams:
    """The plan as work on two streams, for executors whose transfers run on a stream of
    their own (NCCL's pipelined mode). Cached on the plan per ``max_count`` (elements).

    Each step is cut into ``transforms.rounds(step, max_count)``; each round's transfers are
    one POST on COMM, its local ops one LOCAL each on COMPUTE, in round order. The first
    instruction (a WAIT on COMPUTE) marks the caller's earlier work and the second makes COMM
    wait for it; the last (a WAIT on COMPUTE) waits for the last transfer, so the caller's
    stream sees everything. In between, an instruction waits for the latest instruction of
    the other stream whose access conflicts with its own (``hazards.conflict``: a transfer
    reads what it sends and writes what it receives), unless its stream already waited for
    that one or a later one: stream order then covers every earlier one. So the reduction of
    piece k overlaps round k+1's transfers, and a send waits only for the kernels that wrote
    what it sends."""
    if max_count < 1:
        raise ValueError(f"two_streams: max_count must be >= 1, got {max_count}")
    return plan.derived("_lowered", ("two_streams", max_count),
                        lambda: _two_streams(plan, max_count))


def _two_streams(plan, max_count):
    code = [[WAIT, 0, (), COMPUTE, -1, True], [WAIT, 0, (), COMM, 0, False]]
    history = {COMM: [], COMPUTE: []}       # (instruction number, access) in stream order
    waited = {COMM: -1, COMPUTE: -1}        # index into the *other* stream's history

    def enqueue(kind, index, what, where, accessed):
        other = COMPUTE if where is COMM else COMM
        past, after = history[other], -1
        for i in range(len(past) - 1, waited[where], -1):
            if hazards.conflict(past[i][1], accessed):
                after = past[i][0]
                code[after][5] = True
                waited[where] = i
                break
        history[where].append((len(code), accessed))
        code.append([kind, index, what, where, after, False])

    for index, step in enumerate(plan.steps):
        for round_ in rounds(step, max_count):
            if round_.sends or round_.recvs:
                enqueue(POST, index, (round_.recvs, round_.sends), COMM,
                        (tuple(s.region for s in round_.sends),
                         tuple(r.region for r in round_.recvs)))
            for op in round_.local:
                enqueue(LOCAL, index, (op,), COMPUTE, hazards.access(op))
    if history[COMM]:
        last = history[COMM][-1][0]
        code[last][5] = True
        code.append([WAIT, len(plan.steps) - 1, (), COMPUTE, last, False])
    return Streams(plan, tuple(Enqueued(*i) for i in code))


def largest_message(plan: Plan) -> int:
    """Elements of the plan's largest single transfer (cached on the plan): whether a
    pipelining executor cuts anything."""
    return plan.derived("_lowered", "largest", lambda: max(
        (t.region.count for step in plan.steps for t in step.sends + step.recvs), default=0))
