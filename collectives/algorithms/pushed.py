"""Plans lowered for peer memory: every rank writes its messages straight into the receiving
rank's memory (a *push*), and ranks order themselves with flags instead of messages.

Pure: the program is a table of integers in the protocol's instruction set
(``kernels/peer_protocol.py``; docs/peer-memory.md explains the protocol: epochs, rendezvous
and eager messages, flagged lines, the flag words); here it is only built, row by row by
column name. The peer-memory executor runs it on the GPU,
``collectives/algorithms/pushed_sim.py`` on the CPU.

What the lowering decides, per rank and call:

* How each message travels: rendezvous (``PUSH``/``ARRIVE``), eagerly into the receiver's
  inbox (``lower(plan, eager)``: messages of at most ``eager`` elements, ``SEND``/``TAKE``) or
  in flagged lines (at most ``lines``, ``SEND_LL``/``TAKE_LL``); inbox slots are laid out
  alike on both sides from the receiver's plan. A rank publishes an epoch only where some
  sender waits for it: its first step and steps with a rendezvous receive.
* Where regions live: a receive writes into the receiver's memory, so every region any
  receive lands in must be in memory other ranks can write (the group's staging buffers).
  ``scratch`` always lives there; ``output`` lives there on a rank where some rendezvous
  receive lands in output (``staged``), and then its values are copied in at the start where
  the plan reads output before writing it, and copied out to the caller's output region by
  region after its last write; unless the caller's output is symmetric (``symmetric``).
  ``input`` is never written by receives. Each rank works out every other rank's placement
  from its plan, so a sender knows where to write.
* Barriers only where accesses conflict (``_Barriers``, ``hazards.ordering``): each worker
  moves its share of every message and op (``share``, a function of the count only), so a
  conflict on one region made alike needs a block barrier, one across shares a grid barrier.
  A ring's steps on equal chunks need no grid barrier at all.
* Fusions: a receive whose first use is a reduction is reduced straight out of the inbox
  (``REDUCE_LL``, ``TAKE_REDUCE``); a chain of reductions runs as one ``REDUCE_N``
  (``_chains``), reading eager messages out of the inbox (``_inbox_runs``) and sending its
  result on in the same pass (``_send_on``); eager messages land straight in a symmetric
  output where the receiver says so (``_direct``).

``lower(seeded=True)``: an all_reduce or broadcast called out of place reads input wherever
its plan reads output not yet written, instead of the group copying input to output first.
"""
from __future__ import annotations

# The instruction set, the buffers a row names and the operand encodings are the protocol's
# (kernels/peer_protocol.py, docs/peer-memory.md); named here as everywhere.
from ..kernels.peer_protocol import (  # noqa: F401 (re-exported)
    ARRIVE, BARRIER, BUFFER_BITS, CALLER_OUTPUT, COPY, EPOCH, FOLD, INBOX, INPUT, INSTRUCTIONS,
    KIND, LINE_PEER_BITS, LINE_PERIOD, OUTPUT, PUSH, REDUCE, REDUCE_LL, REDUCE_N, SCRATCH, SEND,
    SEND_LL, SENDS_ON, SENDS_ON_MAX, SLOT_ALIGN, STEP, STEP_BITS, TAKE, TAKE_LL, TAKE_REDUCE, WIDTH,
    buffer_operand, chain_operands, decode_line_operand, decode_operand, in_place_epoch,
    line_flag, line_operand, scrubs)

# The lowering itself (pushed_lowering: one rank's rows in named steps; pushed_passes: the
# analyses and passes it uses), its program and encodings answered here.
from .pushed_lowering import (  # noqa: F401
    _BUFFER, Program, _regions, inbox_operand, lower_rank, operand, staged)
from .pushed_passes import _chains, _direct, _inbox_runs, _send_on  # noqa: F401
from .schedule import Plan, build_plan


def plans_of(plan: Plan) -> list:
    """Every rank's plan of the call ``plan`` belongs to (``plan`` itself for its rank)."""
    if not plan.args and plan.collective != "barrier":
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {plan.rank}: the plan "
                         f"was built by hand, so the other ranks' plans (where each message "
                         f"lands) cannot be derived; build it with build_plan")
    return [plan if r == plan.rank else
            build_plan(plan.collective, plan.algorithm, r, plan.size, *plan.args)
            for r in range(plan.size)]


def lower(plan: Plan, eager: int = 0, lines: int = 0, seeded: bool = False,
          symmetric: bool = False, direct: bool = False) -> Program:
    """The push program of ``plan`` (cached on it); messages of at most ``eager`` elements go
    eagerly, those of at most ``lines`` elements in flagged lines (``SEND_LL``); every rank of
    the call must pass the same values. ``seeded`` (this rank's choice): output starts as a
    copy of input, as an all_reduce or broadcast called out of place needs. The program
    makes no such copy: it reads input wherever the plan reads output it has not written
    yet, and copies at the end only what the plan never writes. ``symmetric`` (this rank's
    choice): the caller's output lies in memory every peer has mapped (a symmetric buffer),
    so receives land in it directly: no staging, no copies in or out. Its senders learn
    where with each of its epochs (the output's place in its symmetric memory, ``PUSH``).
    ``direct`` (every rank alike): eager messages after the first step may land in such an
    output straight from their senders (``_direct``)."""
    lines = min(lines, eager)
    return plan.derived("_pushed", (eager, lines, seeded, symmetric, direct),
                        lambda: _lower(plan, eager, lines, seeded, symmetric, direct))


def _lower(plan, eager, lines, seeded, symmetric, direct):
    """The push program of ``plan``, uncached: every rank's plan checked, then lowered
    (``pushed_lowering``)."""
    plans = plans_of(plan)
    _check(plan, plans)
    return lower_rank(plan, plans, eager, lines, seeded, symmetric, direct)


def _check(plan, plans):
    """A ValueError where some plan of the call cannot run on peer memory."""
    longest = max(len(other.steps) for other in plans)
    if longest >= (1 << STEP_BITS) - 1:
        # the step would spill into the call number and order one call's steps wrongly (the
        # last value is in_place_epoch's)
        raise ValueError(f"{plan.collective} ({plan.algorithm}) on rank {plan.rank}: a plan of "
                         f"{longest} steps does not fit the peer-memory epoch "
                         f"(at most {(1 << STEP_BITS) - 2} steps)")
    for other in plans:
        for step in other.steps:
            for r in step.recvs:
                if r.region.buffer == "input":
                    raise ValueError(f"{plan.collective} ({plan.algorithm}): rank {other.rank} "
                                     f"receives into its input, which peers cannot write")


def reads_input(plan: Plan) -> bool:
    """Whether any step of ``plan`` touches its input buffer."""
    return any(region.buffer == "input" for step in plan.steps for region in _regions(step))


def share(count: int, worker: int, workers: int, align: int = 1) -> tuple[int, int]:
    """The [start, end) of ``count`` elements that worker ``worker`` of ``workers`` moves,
    boundaries at multiples of ``align`` (the kernel's: 16 bytes). It depends only on the
    count, so two regions of one count split alike (what ``_Barriers`` relies on)."""
    units = -(-count // align)
    return (min(count, units * worker // workers * align),
            min(count, units * (worker + 1) // workers * align))

