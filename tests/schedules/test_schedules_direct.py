"""Direct (one-shot) schedules: what the generic schedule tests cannot see — one step of p-1
messages each way, scratch sizes, an input never written, bitwise agreement between ranks on
floats reduced in rank order, the counted cost against hand-computed α-β-γ values, ``auto``'s
choice on constructed parameters, and in-place / out-of-place calls on the local transport."""
from datetime import timedelta

import numpy as np
import pytest

import collectives as dist
from collectives.algorithms import cost
from collectives.algorithms.cost import Params, predict
from collectives.algorithms.schedule import Copy, Matrix, Reduce, build_plan, partition
from collectives.algorithms.simulate import reference, run, verify

NAME = "direct"
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
SIZES = list(range(1, 10)) + [16, 33]


def counts_for(p):
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 37, 1000})


def uneven(total, p):
    """Per-rank counts summing to about ``total``, uneven and with zero blocks."""
    return tuple((total + 3 * i) % 7 if i % 4 != 1 else 0 for i in range(p))


def matrix(total, p):
    """An alltoallv matrix: uneven per-pair counts, zero blocks included."""
    return Matrix(tuple((total + 3 * i + j) % 5 if (i + j) % 3 else 0 for j in range(p))
                  for i in range(p))


def args_for(collective, p, total):
    if collective == "all_reduce":
        return total
    if collective == "all_to_all":
        return matrix(total, p)
    return uneven(total, p)


def plans(collective, size, args):
    return [build_plan(collective, NAME, rank, size, args) for rank in range(size)]


# --- correctness in the simulator --------------------------------------------------------------

@pytest.mark.parametrize("collective", COLLECTIVES)
def test_simulated_results_are_exact(collective):
    for p in SIZES:
        for total in counts_for(p):
            verify(collective, NAME, p, args_for(collective, p, total))
            if collective != "all_reduce":           # even blocks too
                even = tuple(b.count for b in partition(total, p))
                verify(collective, NAME, p,
                       Matrix((even,) * p) if collective == "all_to_all" else even)


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("p", [2, 3, 5, 8, 16, 33])
def test_one_step_with_p_minus_1_messages_each_way(collective, p):
    args = {"all_reduce": 40, "all_to_all": Matrix(((2,) * p,) * p)}.get(collective, (3,) * p)
    for plan in plans(collective, p, args):
        assert len(plan.steps) == 1
        step = plan.steps[0]
        assert sorted(s.peer for s in step.sends) == [r for r in range(p) if r != plan.rank]
        assert sorted(r.peer for r in step.recvs) == [r for r in range(p) if r != plan.rank]
        # shifted order: the k-th message goes to rank + k and comes from rank - k
        assert [s.peer for s in step.sends] == [(plan.rank + k) % p for k in range(1, p)]
        assert [r.peer for r in step.recvs] == [(plan.rank - k) % p for k in range(1, p)]


def test_scratch_sizes():
    p = 6
    for plan in plans("all_reduce", p, 40):
        assert plan.scratch == (p - 1) * 40
    counts = (3, 0, 5, 1, 2, 4)
    for plan in plans("reduce_scatter", p, counts):
        assert plan.scratch == (p - 1) * counts[plan.rank]
    for collective, args in (("all_gather", counts), ("all_to_all", matrix(7, p))):
        assert all(plan.scratch == 0 for plan in plans(collective, p, args))


def test_size_one_and_empty_calls():
    assert build_plan("all_reduce", NAME, 0, 1, 10).steps == ()
    for collective, args in (("reduce_scatter", (4,)), ("all_gather", (4,)),
                             ("all_to_all", Matrix(((4,),)))):
        (step,) = build_plan(collective, NAME, 0, 1, args).steps
        assert not (step.sends or step.recvs) and len(step.local) == 1
        assert isinstance(step.local[0], Copy)
    # nothing to move at all: no steps on any rank
    for collective, args in (("all_reduce", 0), ("reduce_scatter", (0,) * 5),
                             ("all_gather", (0,) * 5), ("all_to_all", Matrix(((0,) * 5,) * 5))):
        assert all(plan.steps == () for plan in plans(collective, 5, args)), collective


def test_zero_blocks_send_nothing():
    p = 5
    counts = (3, 0, 2, 0, 1)
    for plan in plans("all_gather", p, counts):
        (step,) = plan.steps
        assert all(s.region.count for s in step.sends) and all(r.region.count for r in step.recvs)
        assert sorted(r.peer for r in step.recvs) == [r for r in (0, 2, 4) if r != plan.rank]
        assert len(step.sends) == (0 if counts[plan.rank] == 0 else p - 1)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_input_is_never_written(collective):
    p = 7
    for plan in plans(collective, p, args_for(collective, p, 37)):
        for step in plan.steps:
            written = [r.region for r in step.recvs] + [op.dst for op in step.local]
            assert all(region.buffer != "input" for region in written)


def test_all_reduce_reduces_in_rank_order_without_copies():
    """Rank r's chain reads rank 0's vector first and its own at position r; no Copy."""
    p = 5
    for plan in plans("all_reduce", p, 12):
        (step,) = plan.steps
        assert len(step.local) == p - 1 and all(isinstance(op, Reduce) for op in step.local)
        assert step.local[-1].dst.buffer == "output"
        vector_of = {r.peer: r.region for r in step.recvs}
        vector_of[plan.rank] = step.sends[0].region          # its own, in output
        assert step.local[0].a == vector_of[0]
        # the k-th reduction brings in rank k's vector, onto the running sum of ranks < k
        for k, op in enumerate(step.local, start=1):
            assert op.b == vector_of[k]
            if k > 1:
                assert op.a == step.local[k - 2].dst


# --- determinism: floats whose sum depends on the order -------------------------------------------

@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 13])
def test_all_reduce_and_reduce_scatter_bits_agree_on_every_rank(p):
    rng = np.random.default_rng(p)
    n = 301
    arrays = [(rng.standard_normal(n) * 10.0 ** rng.integers(-4, 5, n)).astype(np.float32)
              for _ in range(p)]
    outs = run("all_reduce", NAME, arrays)
    want = reference("all_reduce", arrays)[0]        # ((x0 + x1) + x2) + ... in rank order
    for rank, out in enumerate(outs):
        assert out.tobytes() == want.tobytes(), f"rank {rank} differs"
    counts = uneven(n, p)
    blocks = [(rng.standard_normal(sum(counts)) * 10.0 ** rng.integers(-4, 5, sum(counts)))
              .astype(np.float32) for _ in range(p)]
    got = run("reduce_scatter", NAME, blocks, counts=counts)
    for rank, (g, w) in enumerate(zip(got, reference("reduce_scatter", blocks, counts=counts))):
        assert g.tobytes() == w.tobytes(), f"reduce_scatter rank {rank} differs"


# --- the counted cost ---------------------------------------------------------------------------

A, B, G = 1e-5, 1e-9, 2e-9


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8, 12])
def test_counted_cost_with_p_minus_1_ports(p):
    """All p-1 messages at once, sharing the link: α + (p-1)·mβ for messages of m bytes, then
    the local work: p-1 reductions (all_reduce, reduce_scatter) or one copy at γ/2."""
    params = Params(A, B, G, ports=p - 1)
    n = 4 * 96 * p                       # bytes, divisible by p
    block = n // p
    count = n // 4
    assert predict("all_reduce", NAME, p, count, params=params) == \
        pytest.approx(A + (p - 1) * n * B + (p - 1) * n * G, rel=1e-12)
    even = (count // p,) * p
    assert predict("reduce_scatter", NAME, p, even, params=params) == \
        pytest.approx(A + (p - 1) * block * B + (p - 1) * block * G, rel=1e-12)
    assert predict("all_gather", NAME, p, even, params=params) == \
        pytest.approx(A + (p - 1) * block * B + 0.5 * G * block, rel=1e-12)
    assert predict("all_to_all", NAME, p, Matrix((even,) * p), params=params) == \
        pytest.approx(A + (p - 1) * block * B + 0.5 * G * block, rel=1e-12)


def test_counted_cost_with_one_port():
    """Two ranks: one exchange each way, α + nβ + nγ. More ranks: the one-port replay never
    beats the p-1 serialized messages, (p-1)(α + nβ) + (p-1)nγ."""
    params = Params(A, B, G)
    n = 4000
    assert predict("all_reduce", NAME, 2, n // 4, params=params) == \
        pytest.approx(A + n * B + n * G, rel=1e-12)
    for p in (3, 4, 8):
        bound = (p - 1) * (A + n * B) + (p - 1) * n * G
        assert predict("all_reduce", NAME, p, n // 4, params=params) >= bound * (1 - 1e-12)


def test_local_alpha_is_paid_per_reduction():
    p = 4
    base = Params(A, B, G, ports=p - 1)
    launch = Params(A, B, G, ports=p - 1, local_alpha=7e-6)
    assert predict("all_reduce", NAME, p, 100, params=launch) - \
        predict("all_reduce", NAME, p, 100, params=base) == pytest.approx((p - 1) * 7e-6)


def test_auto_picks_direct_where_latency_dominates_and_every_peer_runs_at_once():
    p = 8
    switch = Params(alpha=2e-5, beta=1 / 300e9, gamma=1 / 1e12, ports=p - 1)
    for collective in COLLECTIVES:
        assert cost.cheapest(collective, p, 4096, params=switch)[0] == NAME, collective
    # one port, large messages: p-1 serialized full-vector messages lose to the ring's n/p ones
    one_port = Params(alpha=5e-6, beta=1 / 5e9, gamma=1 / 5e9)
    for collective in COLLECTIVES:
        assert cost.cheapest(collective, p, 64 << 20, params=one_port)[0] != NAME, collective
    # and with all ports but a large all_reduce: (p-1)nβ against the ring's 2((p-1)/p)nβ
    assert cost.cheapest("all_reduce", p, 256 << 20, params=switch)[0] != NAME


def test_estimate_prices_direct_at_infinity_beyond_the_counted_range():
    assert cost.estimate("all_reduce", NAME, cost.COUNTED_MAX_SIZE + 1, 4096,
                         Params(A, B, G)) == float("inf")


# --- real data on the local transport: in place and out of place ------------------------------

def _local_job(rank, p, cases):
    pg = dist.GroupMember.WORLD
    out = []
    for collective, counts, arrays, in_place in cases:
        mine = arrays[rank].copy()
        kw = dict(algorithm=NAME)
        if collective == "all_reduce":
            if in_place:
                pg.prepare(collective, output=mine, **kw)()
                out.append(mine)
            else:
                result = np.zeros_like(mine)
                pg.prepare(collective, input=mine, output=result, **kw)()
                assert np.array_equal(mine, arrays[rank])        # input untouched
                out.append(result)
            continue
        if collective == "all_to_all":
            result = mine if in_place else np.zeros(sum(row[rank] for row in counts), mine.dtype)
            pg.prepare(collective, input=mine, output=result, counts=counts, **kw)()
            out.append(result)
            continue
        offsets = np.cumsum((0,) + counts)
        if collective == "reduce_scatter":
            result = mine[offsets[rank]:offsets[rank + 1]] if in_place \
                else np.zeros(counts[rank], mine.dtype)
            pg.prepare(collective, input=mine, output=result, counts=counts, **kw)()
            out.append(result.copy())
            continue
        result = np.zeros(sum(counts), mine.dtype)                # all_gather
        source = mine
        if in_place:
            result[offsets[rank]:offsets[rank + 1]] = mine
            source = result[offsets[rank]:offsets[rank + 1]]
        pg.prepare(collective, input=source, output=result, counts=counts, **kw)()
        out.append(result)
    return out


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_local_transport_in_place_and_out_of_place(p):
    rng = np.random.default_rng(10 + p)
    cases, wants = [], []
    for collective in COLLECTIVES:
        for total in (0, 1, p + 1, 37):
            for in_place in (False, True):
                if collective == "all_to_all":
                    counts = Matrix(((total % 4,) * p,) * p) if in_place else matrix(total, p)
                    sizes = [sum(row) for row in counts]
                elif collective == "all_reduce":
                    counts, sizes = total, [total] * p
                else:
                    counts = uneven(total, p)
                    sizes = [sum(counts)] * p if collective == "reduce_scatter" else list(counts)
                arrays = [rng.standard_normal(n).astype(np.float32) for n in sizes]
                cases.append((collective, counts, arrays, in_place))
                wants.append(reference(collective, arrays,
                                       counts=None if collective == "all_reduce" else counts))
    results = dist.spawn_local(p, _local_job, p, cases, timeout=timedelta(seconds=60))
    for index, (collective, counts, _, in_place) in enumerate(cases):
        for rank in range(p):
            got, want = results[rank][index], wants[index][rank]
            assert got.tobytes() == want.tobytes(), \
                f"{collective} p={p} counts={counts} in_place={in_place}: rank {rank} differs"
