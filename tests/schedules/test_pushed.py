"""The peer-memory lowering (algorithms/pushed.py) and its flag protocol, on the CPU: every
registered schedule run by the protocol model (peer_model.py: each rank's program on
several workers, interleaved at random, data moved in small pieces) against numpy's answer,
over consecutive calls that reuse the staging memory."""
import numpy as np
import pytest

from collectives.algorithms import capabilities, pushed, simulate
from collectives.algorithms.schedule import (Matrix, Plan, Recv, Region, Send, Step,
                                             buffer_sizes, build_plan, plan_args)
from collectives.algorithms.transforms import read_input_first

from peer_model import Group, Stuck

CASES = [(c, a) for c, algos in capabilities().items() for a in algos]


def _counts(collective, p, n):
    if collective == "all_to_all":
        return Matrix(tuple(tuple((n + i + 2 * j) % 4 for j in range(p)) for i in range(p)))
    if collective in ("all_reduce", "broadcast", "reduce"):
        return n
    if collective == "barrier":
        return None
    return tuple((n + i) % 3 + (i % 2) for i in range(p))   # uneven, some zero


def _call(collective, algorithm, p, counts, root, seed, out_of_place=False):
    """One call: (entries for Group.run, inputs, outputs) with fresh data."""
    rng = np.random.default_rng(seed)
    entries, inputs, outputs = [], [], []
    args = plan_args(collective, p, counts, root)
    for r in range(p):
        plan = build_plan(collective, algorithm, r, p, *args)
        n_in, n_out = buffer_sizes(collective, r, p, counts, root) if counts is not None \
            else (0, 0)
        data = rng.integers(-50, 50, max(n_in, 0)).astype(np.float64)
        out = np.full(n_out, -7.0)
        inputs.append(data)
        if collective in ("all_reduce", "broadcast"):
            direct = read_input_first(plan, n_out) if out_of_place else None
            if direct is not None:
                entries.append((direct, data, out))
            else:
                out[...] = data
                entries.append((plan, None, out))
        else:
            entries.append((plan, data, out))
        outputs.append(out)
    return entries, inputs, outputs


def _check(collective, p, counts, root, inputs, outputs):
    if collective == "barrier":
        return
    arrays = inputs
    if collective == "scatter":
        arrays = [a if r == root else np.zeros(0) for r, a in enumerate(inputs)]
    want = simulate.reference(collective, arrays, root=root,
                              counts=None if collective in ("all_reduce", "broadcast", "reduce")
                              else counts)
    for r in range(p):
        if want[r] is None:
            continue
        np.testing.assert_array_equal(outputs[r], want[r], err_msg=f"rank {r}")


@pytest.mark.parametrize("collective,algorithm", CASES)
@pytest.mark.parametrize("p,eager,lines", [(1, 0, 0), (2, 3, 0), (3, 0, 0), (4, 1 << 20, 2),
                                           (5, 3, 3), (8, 0, 0), (8, 3, 1 << 20)])
def test_every_schedule_through_the_protocol(collective, algorithm, p, eager, lines):
    """eager and lines: no message, the small ones, all (lines applies within eager)"""
    group = Group(p, workers=3, seed=p)
    for n in (1, p - 1 or 1, 2 * p + 3):
        counts = _counts(collective, p, n)
        root = (n + 1) % p
        calls = [_call(collective, algorithm, p, counts, root, seed, out_of_place=seed % 2)
                 for seed in range(4)]
        group.run([c[0] for c in calls], eager=eager, lines=lines)
        for _, inputs, outputs in calls:
            _check(collective, p, counts, root, inputs, outputs)


@pytest.mark.parametrize("workers", [1, 2, 5])
def test_workers_and_interleavings(workers):
    for seed in range(4):
        group = Group(4, workers=workers, seed=seed)
        calls = [_call("all_reduce", a, 4, 37, 0, seed * 10 + i, out_of_place=i % 2)
                 for i, a in enumerate(["ring", "tree", "recursive_doubling", "direct",
                                        "ring_bidirectional"])]
        group.run([c[0] for c in calls], piece=2, eager=20 * (seed % 2),
                  lines=10 * (seed % 3))
        for _, inputs, outputs in calls:
            _check("all_reduce", 4, 37, 0, inputs, outputs)


def test_a_dead_rank_ends_the_call_naming_it():
    group = Group(3, workers=2)
    entries, _, _ = _call("all_reduce", "ring", 3, 12, 0, 0)
    with pytest.raises(Stuck, match="waiting for rank 2"):
        group.run([entries], absent={2}, deadline=2000)


def test_eager_messages_go_to_inbox_slots_and_others_wait_for_their_receive():
    plan = build_plan("all_reduce", "ring", 0, 4, 64)
    kinds = [int(row[0]) for row in pushed.lower(plan, 16).code]
    assert pushed.SEND in kinds and pushed.TAKE in kinds and pushed.PUSH not in kinds
    kinds = [int(row[0]) for row in pushed.lower(plan, 15).code]
    assert pushed.PUSH in kinds and pushed.ARRIVE in kinds and pushed.SEND not in kinds
    program = pushed.lower(plan, 16)
    slots = [int(row[5]) for row in program.code if row[0] == pushed.SEND]
    assert all(slot % pushed.SLOT_ALIGN == 0 for slot in slots)
    assert program.inbox == 6 * 16          # 2(p-1) messages of 16 elements


def test_staging_is_only_where_messages_land():
    plan = build_plan("reduce_scatter", "direct", 0, 4, (3, 3, 3, 3))
    program = pushed.lower(plan)
    assert not program.output_staged                 # receives land in scratch only
    plan = build_plan("all_gather", "ring", 0, 4, (3, 3, 3, 3))
    program = pushed.lower(plan)
    assert program.output_staged and program.staged_output == 12
    copies_out = [row for row in program.code if row[0] == pushed.COPY and row[1] == -1]
    assert copies_out, "the staged output is copied out to the caller's"


def test_a_plan_built_by_hand_is_refused_before_anything_moves():
    plan = Plan("all_reduce", "mine", 0, 2,
                (Step(sends=(Send(1, Region("output", 0, 4)),),
                      recvs=(Recv(1, Region("scratch", 0, 4)),)),), 4)
    with pytest.raises(ValueError, match="rank 0: the plan was built by hand"):
        pushed.lower(plan)


def test_share_covers_every_element_once():
    for count in (0, 1, 7, 64, 1001):
        for workers in (1, 3, 8):
            spans = [pushed.share(count, w, workers) for w in range(workers)]
            assert spans[0][0] == 0 and spans[-1][1] == count
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_a_plan_too_long_for_the_epoch_is_refused(monkeypatch):
    monkeypatch.setattr(pushed, "STEP_BITS", 2)        # 4 steps at most, instead of 2**24
    plan = build_plan("all_reduce", "ring", 0, 4, 64)  # 6 steps
    with pytest.raises(ValueError, match="does not fit the peer-memory epoch"):
        pushed.lower(plan)
