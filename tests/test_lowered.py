"""Lowered programs (``algorithms.lowered``) against the plans they come from, for every
collective x algorithm at a few world sizes: the step walk is the step semantics; the
overlapped program posts each peer's messages in plan order, waits for every request exactly
once and only after posting it, and runs no op before every posted transfer it conflicts
with has been waited for. (That the programs give the right bits on real transports is
test_segmented.py's and test_local_collectives.py's.)"""
import pytest

from collectives.algorithms import capabilities, hazards
from collectives.algorithms.lowered import LOCAL, POST, WAIT, overlapped, stepwise
from collectives.algorithms.schedule import build_plan, plan_args
from collectives.algorithms.transforms import segmented

CASES = [(c, a) for c, algs in sorted(capabilities().items()) for a in algs]


def _plan(collective, algorithm, rank, size):
    counts = 37 if collective in ("all_reduce", "broadcast", "reduce") else \
        tuple(5 + r for r in range(size))
    if collective == "all_to_all":
        from collectives.algorithms.schedule import Matrix
        counts = Matrix(tuple(3 + (r + c) % 4 for c in range(size)) for r in range(size))
    return build_plan(collective, algorithm, rank, size,
                      *plan_args(collective, size, counts, size - 1))


def _posts(program):
    """(number, transfer, is_receive) of every post, in order."""
    out = []
    for kind, _, what in program.code:
        if kind is POST:
            for transfer in what[0]:
                out.append((len(out), transfer, True))
            for transfer in what[1]:
                out.append((len(out), transfer, False))
    return out


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("size", [2, 3, 5])
def test_stepwise_is_the_step_walk(collective, algorithm, size):
    for rank in range(size):
        plan = _plan(collective, algorithm, rank, size)
        program = stepwise(plan)
        assert stepwise(plan) is program                   # cached on the plan
        expected = []
        for index, step in enumerate(plan.steps):
            if step.sends or step.recvs:
                expected += [(POST, index), (WAIT, index)]
            if step.local:
                expected.append((LOCAL, index))
        assert [(k, i) for k, i, _ in program.code] == expected
        for kind, index, what in program.code:
            step = plan.steps[index]
            if kind is POST:
                assert what == (step.recvs, step.sends)
            elif kind is LOCAL:
                assert what == step.local


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("size,segment", [(2, 2), (3, 3), (5, 2)])
def test_overlapped_waits_for_every_conflict_and_keeps_peer_order(collective, algorithm, size,
                                                                   segment):
    for rank in range(size):
        plan = segmented(_plan(collective, algorithm, rank, size), segment)
        program = overlapped(plan)
        posts = _posts(program)
        assert program.requests == len(posts)
        # each peer's sends, and each peer's receives, in plan order
        for is_receive in (True, False):
            in_plan = [(t.peer, t.region) for s in plan.steps
                       for t in (s.recvs if is_receive else s.sends)]
            posted = [(t.peer, t.region) for _, t, r in posts if r == is_receive]
            for peer in {p for p, _ in in_plan}:
                assert [x for x in posted if x[0] == peer] == \
                    [x for x in in_plan if x[0] == peer]
        # replay: waits only for posted requests, each once; ops after their conflicts
        posted_so_far, waited, open_ = 0, set(), {}
        for kind, _, what in program.code:
            if kind is POST:
                for transfer in what[0] + what[1]:
                    open_[posted_so_far] = hazards.access(transfer)
                    posted_so_far += 1
            elif kind is WAIT:
                numbers = range(what.start, what.stop) if isinstance(what, slice) else what
                for n in numbers:
                    assert n < posted_so_far and n not in waited
                    waited.add(n)
                    open_.pop(n)
            else:
                for op in what:
                    accessed = hazards.access(op)
                    assert not any(hazards.conflict(t, accessed) for t in open_.values()), \
                        (collective, algorithm, rank, op)
        assert waited == set(range(len(posts)))
