"""Recursive-doubling schedules: properties the generic schedule test cannot see — round
counts, which all_reduce variant runs on which side of the threshold and how much it sends,
bitwise agreement between ranks on floats, and buffers a schedule must never write."""
import numpy as np
import pytest

from collectives.algorithms import recursive_doubling as rd
from collectives.algorithms.schedule import Copy, Reduce, build_plan
from collectives.algorithms.simulate import reference, run

NAME = "recursive_doubling"


def plans(collective, size, *args):
    return [build_plan(collective, NAME, rank, size, *args) for rank in range(size)]


def comm_rounds(plan):
    """Steps that move data between ranks (local-only steps are copies)."""
    return sum(1 for step in plan.steps if step.sends or step.recvs)


def elements_sent(plan):
    return sum(s.region.count for step in plan.steps for s in step.sends)


def floor_pof2(p):
    return 1 << (p.bit_length() - 1)


@pytest.mark.parametrize("size", [2, 3, 4, 5, 6, 7, 8, 12, 16, 33])
def test_all_reduce_small_counts_take_log_p_rounds_plus_two_for_folding(size):
    pof2 = floor_pof2(size)
    lg = pof2.bit_length() - 1
    count = rd.RABENSEIFNER_MIN_BLOCK * pof2 - 1          # just below the threshold
    rounds = [len(p.steps) for p in plans("all_reduce", size, count)]
    rem = size - pof2
    for rank, n in enumerate(rounds):
        if rank < 2 * rem:
            assert n == (2 if rank % 2 else lg + 2), (rank, rounds)
        else:
            assert n == lg, (rank, rounds)
    # Recursive doubling exchanges the whole vector every round.
    assert elements_sent(plans("all_reduce", size, count)[-1]) == lg * count


@pytest.mark.parametrize("size", [2, 4, 8, 16, 32])
def test_all_reduce_above_threshold_is_rabenseifner_and_sends_2n_p_minus_1_over_p(size):
    count = rd.RABENSEIFNER_MIN_BLOCK * size * 10          # divisible by size
    lg = size.bit_length() - 1
    for plan in plans("all_reduce", size, count):
        assert len(plan.steps) == 2 * lg
        assert elements_sent(plan) == 2 * count * (size - 1) // size
        assert plan.scratch == count // 2                  # landing area: the first half
    first = rd.RABENSEIFNER_MIN_BLOCK * size             # exactly at the threshold
    assert all(len(p.steps) == 2 * lg for p in plans("all_reduce", size, first))


@pytest.mark.parametrize("size", [5, 6, 12, 100])
def test_rabenseifner_with_folding_sends_about_2n_per_survivor(size):
    count = rd.RABENSEIFNER_MIN_BLOCK * size * 3 + 7      # uneven blocks
    pof2 = floor_pof2(size)
    rem = size - pof2
    for rank, plan in enumerate(plans("all_reduce", size, count)):
        sent = elements_sent(plan)
        if rank < 2 * rem and rank % 2:
            assert sent == count                           # hands its vector to its partner
        else:
            core = 2 * count * (pof2 - 1) / pof2
            extra = count if rank < 2 * rem else 0         # sends the result back
            # 2(p'-1) blocks go out, each within one element of n/p'.
            assert abs(sent - core - extra) <= 2 * (pof2 - 1), (rank, sent, core)


@pytest.mark.parametrize("size", [5, 6, 8, 12])
@pytest.mark.parametrize("count", [3, 17, 1000, 4099])
def test_all_reduce_float32_sum_bitwise_identical_on_every_rank(size, count):
    rng = np.random.default_rng(size * 7919 + count)
    arrays = [rng.standard_normal(count).astype(np.float32) * np.float32(10.0 ** rng.integers(-3, 4))
              for _ in range(size)]
    outs = run("all_reduce", NAME, arrays, op="sum")
    for rank, out in enumerate(outs[1:], 1):
        assert np.array_equal(out.view(np.uint32), outs[0].view(np.uint32)), rank
    want = reference("all_reduce", arrays)[0]
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("size", [3, 6, 8])
def test_all_reduce_min_agrees_on_signed_zeros(size):
    # np.minimum(0.0, -0.0) depends on operand order; every pair must use the same order.
    arrays = [np.array([0.0, -0.0, 0.0, -0.0] * 5, np.float32) * (1 if r % 2 else -1)
              for r in range(size)]
    outs = run("all_reduce", NAME, arrays, op="min")
    for out in outs[1:]:
        assert np.array_equal(out.view(np.uint32), outs[0].view(np.uint32))


@pytest.mark.parametrize("size,rounds", [(7, 3), (5, 3), (6, 3), (8, 3), (9, 4), (100, 7)])
def test_all_gather_takes_ceil_log2_p_rounds(size, rounds):
    counts = tuple((3 * r) % 5 + 1 for r in range(size))
    for plan in plans("all_gather", size, counts):
        assert comm_rounds(plan) == rounds
        assert len(plan.steps) == rounds                   # rotation rides on the last round


def test_bruck_all_gather_at_7_ranks_is_correct_with_uneven_and_empty_blocks():
    arrays = [np.arange(n, dtype=np.int64) + 100 * r for r, n in enumerate([0, 3, 1, 0, 5, 2, 4])]
    outs = run("all_gather", NAME, arrays)
    for out in outs:
        assert np.array_equal(out, np.concatenate(arrays))


@pytest.mark.parametrize("size", [2, 5, 7, 8, 13])
def test_bruck_all_to_all_sends_one_message_per_round(size):
    counts = tuple(tuple((i + 2 * j) % 4 + 1 for j in range(size)) for i in range(size))
    rounds = (size - 1).bit_length()
    for plan in plans("all_to_all", size, counts):
        comm = [s for s in plan.steps if s.sends or s.recvs]
        assert len(comm) == rounds
        assert all(len(s.sends) == 1 and len(s.recvs) == 1 for s in comm)


@pytest.mark.parametrize("size", [1, 2, 5, 8, 13])
def test_barrier_is_dissemination(size):
    rounds = (size - 1).bit_length()
    for rank, plan in enumerate(plans("barrier", size)):
        assert len(plan.steps) == rounds
        for k, step in enumerate(plan.steps):
            assert [s.peer for s in step.sends] == [(rank + 2 ** k) % size]
            assert [r.peer for r in step.recvs] == [(rank - 2 ** k) % size]


def writes(plan):
    """Every region a plan writes: receive targets and local destinations."""
    for step in plan.steps:
        yield from (r.region for r in step.recvs)
        yield from (op.dst for op in step.local if isinstance(op, (Copy, Reduce)))


@pytest.mark.parametrize("size", [2, 3, 5, 8, 12])
@pytest.mark.parametrize("root", [0, 1, -1])
def test_reduce_never_writes_output_of_non_roots(size, root):
    root %= size
    for count in (1, size, 40 * size + 3):
        for rank, plan in enumerate(plans("reduce", size, count, root)):
            buffers = {region.buffer for region in writes(plan)}
            assert "input" not in buffers
            if rank != root:
                assert "output" not in buffers, (rank, count)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_to_all", "gather",
                                        "scatter"])
def test_input_is_read_only(collective):
    size = 6
    for root in (0, 4):
        if collective == "all_to_all":
            args = (tuple(tuple(i + j for j in range(size)) for i in range(size)),)
        elif collective in ("gather", "scatter"):
            args = (tuple(range(size)), root)
        else:
            args = (tuple(range(size)),)
        for plan in plans(collective, size, *args):
            assert all(region.buffer != "input" for region in writes(plan))


@pytest.mark.parametrize("size", [4, 6, 8])
def test_broadcast_switches_from_binomial_tree_to_scatter_all_gather(size):
    lg = (size - 1).bit_length()
    small = plans("broadcast", size, rd.BROADCAST_SCATTER_MIN_BLOCK * size - 1, 0)
    # Binomial tree: the root sends the whole vector to lg p children, nobody sends more.
    assert [s.sends[0].peer for s in small[0].steps] == [2 ** k for k in reversed(range(lg))]
    count = rd.BROADCAST_SCATTER_MIN_BLOCK * size * 4
    large = plans("broadcast", size, count, 0)
    for plan in large:
        # Scatter then all-gather: no rank sends much more than 2n(p-1)/p... except the root,
        # whose scatter sends (p-1)/p of the vector.
        assert elements_sent(plan) <= 2 * count
    assert elements_sent(large[0]) >= count * (size - 1) // size


def _overlap(a, b):
    return a.buffer == b.buffer and a.count and b.count and a.offset < b.end and b.offset < a.end


@pytest.mark.parametrize("collective", ["all_reduce", "reduce_scatter", "all_gather",
                                        "all_to_all", "broadcast", "reduce", "gather", "scatter"])
def test_no_receive_overlaps_another_transfer_of_its_step(collective):
    # The simulator copies at match time and cannot see this race; a real transport can.
    for size in (2, 3, 5, 6, 7, 8, 12, 13):
        for total in (size - 1, 20 * size + 3):
            if collective in ("all_reduce", "broadcast", "reduce"):
                counts = total
            elif collective == "all_to_all":
                counts = tuple(tuple((i + j + total) % 4 for j in range(size)) for i in range(size))
            else:
                counts = tuple((total + r) % 5 for r in range(size))
            args = (counts, size // 2) if collective in ("broadcast", "reduce", "gather",
                                                         "scatter") else (counts,)
            for plan in plans(collective, size, *args):
                for step in plan.steps:
                    recvs = [r.region for r in step.recvs]
                    others = [s.region for s in step.sends] + recvs
                    for i, region in enumerate(recvs):
                        assert not any(_overlap(region, other) for other in others
                                       if other is not recvs[i]), (size, plan.rank, step)
