"""Properties of the ring and tree schedules that the generic schedule test cannot see:
step and message counts (the latency each algorithm promises), buffers a rank must not
write, bitwise-identical results across ranks, and the ring broadcast's pipelining."""
import math

import numpy as np
import pytest

from collectives.algorithms import ring
from collectives.algorithms.schedule import Plan, Region, build_plan, plan_args, buffer_sizes
from collectives.algorithms.simulate import execute_all, reference, run
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
def test_ring_all_reduce_takes_2_p_minus_1_steps_and_messages(p):
    for rank in range(p):
        plan = build_plan("all_reduce", "ring", rank, p, 10 * p + 3)
        assert len(plan.steps) == 2 * (p - 1)
        assert plan.messages == 2 * (p - 1)
        assert {s.sends[0].peer for s in plan.steps} == {(rank + 1) % p}


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13, 16, 100])
def test_tree_all_reduce_takes_2_log_p_rounds_on_rank_0(p):
    plan = build_plan("all_reduce", "tree", 0, p, 1000)
    rounds = 2 * math.ceil(math.log2(p))
    assert len(plan.steps) == rounds
    assert [len(s.recvs) for s in plan.steps] == [1] * (rounds // 2) + [0] * (rounds // 2)
    assert [len(s.sends) for s in plan.steps] == [0] * (rounds // 2) + [1] * (rounds // 2)
    assert max(len(build_plan("all_reduce", "tree", r, p, 1000).steps) for r in range(p)) <= rounds


@pytest.mark.parametrize("collective", ["all_to_all", "all_gather", "reduce_scatter", "barrier"])
def test_tree_schedules_take_logarithmic_steps(collective):
    p = 100
    if collective == "all_to_all":
        args = (tuple(tuple(1 + (i + j) % 3 for j in range(p)) for i in range(p)),)
    elif collective == "barrier":
        args = ()
    else:
        args = (tuple(1 + i % 4 for i in range(p)),)
    longest = max(len(build_plan(collective, "tree", r, p, *args).steps) for r in range(p))
    assert longest <= 2 * math.ceil(math.log2(p)) + 1     # +1: a local copy/rearrange step


def test_ring_gather_root_receives_one_block_per_step():
    p, counts = 9, tuple(3 + i for i in range(9))
    root = 4
    plan = build_plan("gather", "ring", root, p, counts, root)
    received = [r.region.count for s in plan.steps for r in s.recvs]
    assert len(received) == p - 1 and max(received) <= max(counts)   # no accumulated messages
    for rank in range(p):
        sent = [s.region.count for step in build_plan("gather", "ring", rank, p, counts, root).steps
                for s in step.sends]
        assert all(n <= max(counts) for n in sent)


def _execute(collective, algorithm, p, counts, root, data):
    """Run plans over buffers we control; return the buffers after the run."""
    plans, buffers = [], []
    for rank in range(p):
        plan = build_plan(collective, algorithm, rank, p, *plan_args(collective, p, counts, root))
        n_in, n_out = buffer_sizes(collective, rank, p, counts, root)
        buffers.append({"input": data[rank].copy(), "output": np.full(n_out, -7, np.int64),
                        "scratch": np.full(plan.scratch, -9, np.int64)})
        plans.append(plan)
    execute_all(plans, buffers, reducer(ReduceOp.SUM, np.dtype(np.int64)))
    return buffers


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("collective", ["reduce", "gather"])
@pytest.mark.parametrize("p,root", [(1, 0), (2, 1), (5, 3), (8, 0), (13, 6)])
def test_non_root_outputs_untouched_and_inputs_read_only(collective, algorithm, p, root):
    rng = np.random.default_rng(p)
    counts = 17 if collective == "reduce" else tuple(1 + (5 * i) % 4 for i in range(p))
    sizes = [buffer_sizes(collective, r, p, counts, root)[0] for r in range(p)]
    data = [rng.integers(-1000, 1000, n) for n in sizes]
    buffers = _execute(collective, algorithm, p, counts, root, data)
    want = reference(collective, data, root=root, counts=counts)
    for rank in range(p):
        np.testing.assert_array_equal(buffers[rank]["input"], data[rank])
        if rank == root:
            np.testing.assert_array_equal(buffers[rank]["output"], want[root])
        else:
            assert (buffers[rank]["output"] == -7).all(), f"rank {rank} wrote its output"


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather", "all_to_all", "scatter"])
def test_inputs_are_read_only(collective, algorithm):
    p, root = 7, 3
    rng = np.random.default_rng(1)
    if collective == "all_to_all":
        counts = tuple(tuple((i + 2 * j) % 4 for j in range(p)) for i in range(p))
    else:
        counts = tuple(2 + i % 3 for i in range(p))
    sizes = [buffer_sizes(collective, r, p, counts, root)[0] for r in range(p)]
    if collective == "scatter":
        sizes = [sum(counts) if r == root else 0 for r in range(p)]
    data = [rng.integers(-1000, 1000, n) for n in sizes]
    buffers = _execute(collective, algorithm, p, counts, root, data)
    want = reference(collective, data, root=root, counts=counts)
    for rank in range(p):
        np.testing.assert_array_equal(buffers[rank]["input"], data[rank])
        np.testing.assert_array_equal(buffers[rank]["output"], want[rank])


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
@pytest.mark.parametrize("p", [3, 6, 8, 11])
def test_all_reduce_float32_sum_is_bitwise_identical_on_every_rank(algorithm, p):
    rng = np.random.default_rng(p)
    # mixed magnitudes make float addition order-sensitive, so any rank that summed in its
    # own order would differ in the last bits
    arrays = [(rng.standard_normal(257) * 10.0 ** rng.integers(-6, 6, 257)).astype(np.float32)
              for _ in range(p)]
    outs = run("all_reduce", algorithm, arrays, op=ReduceOp.SUM)
    for out in outs[1:]:
        assert out.tobytes() == outs[0].tobytes()
    np.testing.assert_allclose(outs[0], np.sum(np.stack(arrays).astype(np.float64), axis=0),
                               rtol=1e-4, atol=1e-3)


def _pipelined_broadcast(p, count, root, segments):
    plans = [Plan("broadcast", "ring", r, p, tuple(ring.broadcast(r, p, count, root, segments)), 0)
             for r in range(p)]
    rng = np.random.default_rng(0)
    data = rng.integers(0, 2**40, count)
    buffers = [{"output": data.copy() if r == root else np.zeros(count, np.int64),
                "scratch": np.zeros(0, np.int64)} for r in range(p)]
    execute_all(plans, buffers)
    return plans, buffers, data


@pytest.mark.parametrize("p,count,root,segments", [(2, 10, 1, 3), (5, 23, 2, 7), (9, 100, 8, 30),
                                                   (4, 5, 0, 5)])
def test_ring_broadcast_pipelines_segments(p, count, root, segments):
    plans, buffers, data = _pipelined_broadcast(p, count, root, segments)
    for b in buffers:
        np.testing.assert_array_equal(b["output"], data)
    for rank, plan in enumerate(plans):
        v = (rank - root) % p
        # middle ranks receive segment k while forwarding k-1: S+1 steps, not 2S
        assert len(plan.steps) == (segments + 1 if 0 < v < p - 1 else segments)
        if 0 < v < p - 1 and segments > 1:
            assert len(plan.steps[1].sends) == len(plan.steps[1].recvs) == 1


def test_ring_broadcast_segment_count():
    assert ring.segment_count(10**6, 2) == 1            # one hop: nothing to overlap
    assert ring.segment_count(0, 8) == 1
    assert ring.segment_count(50, 10**7) == 50          # never more segments than elements
    small, large = ring.segment_count(10**5, 8), ring.segment_count(10**7, 8)
    assert 1 <= small < large
    assert math.isclose(large / small, 10, rel_tol=0.1)  # grows as sqrt(n)


@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_barrier_messages_are_one_element_in_scratch(algorithm):
    p = 6
    for rank in range(p):
        plan = build_plan("barrier", algorithm, rank, p)
        regions = [t.region for s in plan.steps for t in s.sends + s.recvs]
        assert regions and all(r == Region("scratch", 0, 1) for r in regions)
