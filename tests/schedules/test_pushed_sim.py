"""The pushed-form simulator (algorithms/pushed_sim.py): every registered schedule, lowered
as the peer executor lowers it (``pushed.lower``: the program the CUDA kernel runs), run on
the CPU against numpy at world sizes 2..8; and a program with one instruction dropped is
caught, so a wrong lowering fails here, not on a GPU."""
import numpy as np
import pytest

from collectives.algorithms import capabilities, pushed, pushed_sim
from collectives.algorithms.schedule import Matrix
from collectives.kernels.peer_protocol import (
    COPY, INSTRUCTIONS, KIND, PUSH, REDUCE, REDUCE_LL, REDUCE_N, SEND, SEND_LL, TAKE, TAKE_LL,
    TAKE_REDUCE)

CASES = [(c, a) for c, algos in capabilities().items() for a in algos]
# (eager, lines, symmetric ranks, direct): rendezvous only; small messages eager; every
# message eager, the smallest in lines; the same with the even ranks' outputs symmetric and
# eager messages landing there directly
LOWERINGS = [(0, 0, False, False), (4, 0, False, False), (1 << 20, 2, False, False),
             (1 << 20, 2, True, True)]
# the instructions that move or reduce data (a dropped one must change a result or stall)
MOVES = frozenset({PUSH, SEND, SEND_LL, COPY, REDUCE, REDUCE_N, TAKE, TAKE_LL, TAKE_REDUCE,
                   REDUCE_LL})


def _counts(collective, p, total):
    """Counts of whole count ``total``: uneven per rank (some zero) where the collective
    takes one count per rank."""
    if collective == "barrier":
        return None
    if collective in ("all_reduce", "broadcast", "reduce"):
        return total
    if collective == "all_to_all":
        return Matrix(tuple(tuple((total + i + 2 * j) % 4 for j in range(p)) for i in range(p)))
    return tuple((total + i) % 3 + (i % 2) for i in range(p))


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_every_schedule_in_its_pushed_form_at_world_sizes_2_to_8(collective, algorithm):
    for p in range(2, 9):
        for total in (1, p + 1, 3 * p + 2):
            counts = _counts(collective, p, total)
            for eager, lines, symmetric, direct in LOWERINGS:
                pushed_sim.verify(collective, algorithm, p, counts, root=total % p, seed=p,
                                  eager=eager, lines=lines, direct=direct,
                                  symmetric=range(0, p, 2) if symmetric else ())


def _programs(collective, algorithm, p, counts, eager, lines):
    """{(rank, lowering arguments): program} of one verified run."""
    seen, original = {}, pushed.lower

    def recorded(plan, *args):
        program = original(plan, *args)
        seen.setdefault((plan.rank, args), program)
        return program
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pushed, "lower", recorded)
        pushed_sim.verify(collective, algorithm, p, counts, root=1, eager=eager, lines=lines)
    return seen


def _moves(program):
    """The rows of ``program`` that move or reduce a nonzero count of elements."""
    rows = []
    for at, row in enumerate(program.code):
        kind = INSTRUCTIONS[int(row[KIND])]
        if kind in MOVES and kind.read(row).count > 0:
            rows.append(at)
    return rows


@pytest.mark.parametrize("collective,algorithm", [c for c in CASES if c[0] != "barrier"])
@pytest.mark.parametrize("eager,lines", [(0, 0), (1 << 20, 2)])
def test_a_program_with_a_dropped_instruction_is_caught(collective, algorithm, eager, lines):
    """Rank by rank, the first, a middle and the last row that moves data dropped from its
    program (as ``pushed.lower`` would if it lost one): a wrong result, a wait that never
    ends or a program the simulator refuses, never a silent pass."""
    p, counts = 4, _counts(collective, 4, 7)
    original = pushed.lower
    dropped = 0
    for (rank, args), program in _programs(collective, algorithm, p, counts, eager,
                                           lines).items():
        rows = _moves(program)
        for at in sorted({rows[0], rows[len(rows) // 2], rows[-1]} if rows else ()):
            def broken(plan, *given, rank=rank, args=args, at=at):
                program = original(plan, *given)
                if (plan.rank, given) != (rank, args):
                    return program
                return program._replace(code=np.delete(program.code, at, axis=0))
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(pushed, "lower", broken)
                with pytest.raises((AssertionError, pushed_sim.Stuck, ValueError)):
                    pushed_sim.verify(collective, algorithm, p, counts, root=1, eager=eager,
                                      lines=lines, deadline=3000)
            dropped += 1
    assert dropped > 0


def test_a_wrong_result_names_the_rank_and_a_stall_the_peer_waited_for():
    original = pushed.lower

    def without_copies(plan, *args):       # rank 2 never copies its staged output out
        program = original(plan, *args)
        if plan.rank != 2:
            return program
        keep = [int(row[KIND]) != COPY for row in program.code]
        return program._replace(code=program.code[keep])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pushed, "lower", without_copies)
        with pytest.raises(AssertionError, match=r"pushed form .* rank 2 holds a wrong result"):
            pushed_sim.verify("all_reduce", "ring", 3, 12)

    def without_pushes(plan, *args):       # rank 1 never sends
        program = original(plan, *args)
        if plan.rank != 1:
            return program
        keep = [int(row[KIND]) != PUSH for row in program.code]
        return program._replace(code=program.code[keep])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pushed, "lower", without_pushes)
        with pytest.raises(pushed_sim.Stuck, match=r"still waiting for rank \d") as raised:
            pushed_sim.verify("all_reduce", "ring", 3, 12, deadline=2000)
    assert isinstance(raised.value, pushed_sim.CollectiveTimeout)
