"""read_input_first: out-of-place all_reduce without the input -> output copy.

Every all_reduce schedule, transformed, must give exactly the untransformed result when
output starts as garbage, at many world sizes and counts; where a transform is impossible
it must say so (None), never produce a wrong plan."""
import numpy as np
import pytest

from collectives.algorithms import capabilities
from collectives.algorithms.schedule import Copy, build_plan
from collectives.algorithms.simulate import execute_all, reference
from collectives.algorithms.hazards import Ranges
from collectives.algorithms.transforms import read_input_first
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp

ALGORITHMS = capabilities()["all_reduce"]


def run_transformed(algorithm, size, count, seed=0):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(0, 2**63, count, dtype=np.uint64) for _ in range(size)]
    plans, buffers = [], []
    for rank in range(size):
        plan = read_input_first(build_plan("all_reduce", algorithm, rank, size, count), count)
        if plan is None:
            return None, None
        plans.append(plan)
        garbage = rng.integers(0, 2**63, count, dtype=np.uint64)    # output is not pre-filled
        buffers.append({"input": inputs[rank].copy(), "output": garbage,
                        "scratch": np.empty(plan.scratch, np.uint64)})
    execute_all(plans, buffers, reducer(ReduceOp.SUM, np.uint64))
    for rank in range(size):
        assert np.array_equal(buffers[rank]["input"], inputs[rank]), "input must stay read-only"
    return [b["output"] for b in buffers], reference("all_reduce", inputs)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_transformed_all_reduce_is_exact_without_the_copy(algorithm):
    for size in list(range(1, 10)) + [13, 16]:
        for count in sorted({0, 1, size - 1, size, size + 1, 37, 1000}):
            got, want = run_transformed(algorithm, size, count, seed=size * 1000 + count)
            assert got is not None, f"{algorithm} at p={size}, n={count}: no transform"
            for rank, (g, w) in enumerate(zip(got, want)):
                assert np.array_equal(g, w), (algorithm, size, count, rank)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_no_whole_copy_is_left(algorithm):
    """The point of the transform: no Copy of the whole vector from input remains."""
    size, count = 8, 1 << 12
    for rank in range(size):
        plan = read_input_first(build_plan("all_reduce", algorithm, rank, size, count), count)
        copied = sum(op.dst.count for step in plan.steps for op in step.local
                     if isinstance(op, Copy) and op.src.buffer == "input")
        assert copied < count, (algorithm, rank, copied)


def test_written_intervals_merge_and_report_gaps():
    w = Ranges()
    w.add(10, 20)
    w.add(30, 40)
    w.add(18, 31)
    assert (w.starts, w.ends) == ([10], [40])
    assert w.covered(0, 50) == 30 and w.covered(12, 15) == 3 and w.covered(0, 10) == 0
    assert list(w.gaps(0, 50)) == [(0, 10), (40, 50)]
    w.add(0, 5)
    assert list(w.gaps(0, 50)) == [(5, 10), (40, 50)]
