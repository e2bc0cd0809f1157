"""The pipelined trees (collectives/algorithms/pipelined_tree.py): tree_pipelined and
double_binary_tree for all_reduce, reduce and broadcast.

The generic schedule tests run them at the default chunk count, which is one or two chunks at
their counts (<= 1000 elements); here they run cut into many chunks, uneven ones included,
against numpy references; the trees have the shape NCCL's have; and the plan as the
executors run it (the step walk, priced by the cost replay) overlaps chunks at different
levels of the tree: about (fill + C) chunk-times, which the whole-vector tree is not."""
import math

import numpy as np
import pytest

from collectives.algorithms import choose, cost, pipelined_tree
from collectives.algorithms.cost import Params, formula, predict_bytes
from collectives.algorithms.pipelined_tree import (binary_tree, chunk_count, dual_binary_tree,
                                                   rooted_dual_trees)
from collectives.algorithms.schedule import build_plan, buffer_sizes, plan_args
from collectives.algorithms.simulate import execute_all, reference, run
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp

ALGORITHMS = ("tree_pipelined", "double_binary_tree")
COLLECTIVES = ("all_reduce", "reduce", "broadcast")
MIB = 1 << 20


@pytest.fixture(autouse=True)
def no_tuning_file(monkeypatch):
    monkeypatch.delenv(cost.ENV_TUNING, raising=False)


# --- the trees ----------------------------------------------------------------------------------

def _depth(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


@pytest.mark.parametrize("p", list(range(1, 70)) + [100, 1024])
def test_trees_are_binary_log_deep_and_complementary(p):
    first, second = binary_tree(p), dual_binary_tree(p)
    for tree in (first, second):
        assert sum(v == tree.root for v in range(p)) == 1 and tree.parent[tree.root] == -1
        assert all(len(kids) <= 2 for kids in tree.children)
        assert max(tree.depth) == tree.height[tree.root] == _depth(p)
        for v in range(p):
            assert all(tree.parent[u] == v for u in tree.children[v])
    assert first.root == 0 and len(first.children[0]) == min(1, p - 1)
    assert all(not first.children[v] for v in range(1, p, 2))      # odd ranks are leaves
    leaf = [[not t.children[v] for t in (first, second)] for v in range(p)]
    if p > 2:
        # a leaf in one tree, inner in the other: every rank, but for odd p rank 0 (inner
        # in both)
        mixed = [v for v in range(p) if leaf[v][0] != leaf[v][1]]
        assert mixed == list(range(p)) if p % 2 == 0 else list(range(1, p))
    a, b = rooted_dual_trees(p)
    assert a.root == b.root == 0 and a.height[0] == b.height[0] == _depth(p)
    if p > 1:
        assert len(a.children[0]) == len(b.children[0]) == 1
    leaf = [[not t.children[v] for t in (a, b)] for v in range(1, p)]
    assert sum(x and y for x, y in leaf) <= 1 and not any(not x and not y for x, y in leaf)


def test_chunk_count_weighs_fill_against_alpha():
    params = cost.DEFAULTS["mpi"]
    assert chunk_count(10**6, 0, 3) == 1                 # nothing to overlap
    assert chunk_count(1, 5, 3) == 1 and chunk_count(0, 5, 3) == 1
    assert chunk_count(40, 5, 3, Params(alpha=1e-9, beta=1.0, gamma=0.0)) == 40   # at most n
    small, large = chunk_count(10**5, 5, 3), chunk_count(10**7, 5, 3)
    assert 1 <= small < large
    assert math.isclose(large / small, 10, rel_tol=0.1)    # grows as sqrt(n)
    # sqrt(fill·load·n·β/α), β per 4-byte element
    n = 1 << 22
    assert chunk_count(n, 5, 3) == round(math.sqrt(5 * 3 * n * 4 * params.beta / params.alpha))
    cheaper_messages = Params(alpha=params.alpha / 100, beta=params.beta, gamma=params.gamma)
    assert chunk_count(n, 5, 3, cheaper_messages) == pytest.approx(10 * chunk_count(n, 5, 3),
                                                                 rel=0.01)


# --- results, cut into many chunks ----------------------------------------------------------------

def _run_chunked(collective, algorithm, p, count, root, chunks, seed=0):
    """Every rank's buffers after the plans built with ``chunks`` ran in the simulator."""
    rng = np.random.default_rng(seed)
    data = [rng.integers(0, 2**63, count, dtype=np.uint64, endpoint=True) for _ in range(p)]
    plans, buffers = [], []
    for rank in range(p):
        plan = build_plan(collective, algorithm, rank, p,
                          *plan_args(collective, p, count, root), chunks)
        n_in, n_out = buffer_sizes(collective, rank, p, count, root)
        if collective == "reduce":
            bufs = {"input": data[rank].copy(), "output": np.full(n_out, 7, np.uint64)}
        else:                       # all_reduce and broadcast work in output
            bufs = {"output": data[rank].copy() if collective == "all_reduce" or rank == root
                    else np.full(n_out, 7, np.uint64)}
        bufs["scratch"] = np.full(plan.scratch, 9, np.uint64)
        plans.append(plan)
        buffers.append(bufs)
    execute_all(plans, buffers, reducer(ReduceOp.SUM, np.dtype(np.uint64)))
    return plans, buffers, data


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_many_chunks_give_the_reference_result(collective, algorithm):
    for p in (1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 33):
        roots = sorted({0, p // 2, p - 1}) if collective != "all_reduce" else [0]
        for count in sorted({0, 1, p - 1, 7 * p + 3, 1000}):
            for chunks in (2, 3, 7, 64):
                for root in roots:
                    _, buffers, data = _run_chunked(collective, algorithm, p, count, root,
                                                    chunks, seed=p * 100 + count)
                    want = reference(collective, data, root=root)
                    for rank in range(p):
                        if want[rank] is None:          # a reduce's non-root: untouched
                            assert (buffers[rank]["output"] == 7).all()
                            continue
                        assert np.array_equal(buffers[rank]["output"], want[rank]), \
                            (collective, algorithm, p, count, chunks, root, rank)
                        if collective == "reduce":      # input read-only
                            assert np.array_equal(buffers[rank]["input"], data[rank])


@pytest.mark.parametrize("p", [64, 100, pytest.param(1024, marks=pytest.mark.slow)])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_many_chunks_at_large_world_sizes(collective, algorithm, p):
    root = 0 if collective == "all_reduce" else p - 5
    count = 3 * p + 11
    _, buffers, data = _run_chunked(collective, algorithm, p, count, root, 9, seed=p)
    want = reference(collective, data, root=root)
    for rank in range(p):
        if want[rank] is not None:
            assert np.array_equal(buffers[rank]["output"], want[rank]), (p, rank)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("p", [2, 3, 6, 8, 11])
def test_all_reduce_float32_sum_is_bitwise_identical_on_every_rank(algorithm, p):
    rng = np.random.default_rng(p)
    # mixed magnitudes make float addition order-sensitive: every rank must hold the bits of
    # the root that reduced its part
    arrays = [(rng.standard_normal(100_003) * 10.0 ** rng.integers(-6, 6, 100_003))
              .astype(np.float32) for _ in range(p)]
    outs = run("all_reduce", algorithm, arrays, op=ReduceOp.SUM)
    plan = build_plan("all_reduce", algorithm, 0, p, 100_003)
    assert len(plan.steps) > 4           # the default count cuts 100003 elements into chunks
    for out in outs[1:]:
        assert out.tobytes() == outs[0].tobytes()
    stacked = np.stack(arrays).astype(np.float64)
    error = np.abs(outs[0] - stacked.sum(axis=0))
    assert (error <= 1e-6 * np.abs(stacked).sum(axis=0) + 1e-30).all()


# --- the plan overlaps chunks at different levels -------------------------------------------------

def _steps_of_a_pipeline(algorithm, collective, p, chunks):
    """Slots of the pipeline: chunks + fill."""
    height = _depth(p)
    fill = {"all_reduce": 2 * height - 1, "reduce": height - 1, "broadcast": height - 1}
    return chunks + fill[collective]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("p", [2, 3, 5, 8, 13, 16, 33])
def test_the_critical_path_is_fill_plus_chunks_steps(algorithm, p):
    """With latency alone (α per message, messages of a step at once), the replay of the
    plans takes exactly (fill + C)·α: chunk c leaves a level while chunk c+1 arrives there.
    A rank itself takes part in at most that many steps."""
    chunks, latency = 40, Params(alpha=1e-6, beta=0.0, gamma=0.0, ports=8)
    for collective in COLLECTIVES:
        args = plan_args(collective, p, 10_000, p // 2)
        plans = [build_plan(collective, algorithm, r, p, *args, chunks) for r in range(p)]
        slots = _steps_of_a_pipeline(algorithm, collective, p, chunks)
        assert cost.replay(plans, 4, latency) == pytest.approx(slots * latency.alpha)
        assert max(len(plan.steps) for plan in plans) <= slots


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_inner_rank_moves_chunks_up_and_down_in_one_step(algorithm):
    """Rank 2 of 8 (inner in binary_tree: parent 4, children 1 and 3): once the pipeline is
    full, one step receives a chunk from its children, sends its partial sum up, receives a
    result from its parent (a chunk further along), and sends a result down."""
    p, count, chunks = 8, 64 * 100, 64
    plan = build_plan("all_reduce", algorithm, 2, p, count, chunks)
    full = plan.steps[len(plan.steps) // 2]
    up = [s.region for s in full.sends if s.peer == 4]
    down = [r.region for r in full.recvs if r.peer == 4]
    assert len(up) == len(down) == 1
    assert down[0].buffer == up[0].buffer == "output" and down[0].end <= up[0].offset
    assert [r.region.buffer for r in full.recvs if r.peer == 3] == ["scratch"]
    assert [s.region.buffer for s in full.sends if s.peer == 3] == ["output"]


def _chunk_time(algorithm, collective, p, count, chunks, params, itemsize=4):
    """One slot of the busiest rank with ports enough for all its messages."""
    _, parts, phases = pipelined_tree.shape(algorithm, collective, p, count)
    messages = max(m for _, m, _ in phases)
    return params.alpha + messages * count / (parts * chunks) * itemsize * params.beta


def _overlaps(algorithm, collective, p, count, chunks, params):
    """Whether the replay of the step walk takes about (fill + chunks) chunk-times (within
    10%), where a tree that moved whole vectors level by level takes about fill·chunks."""
    if algorithm == "tree":
        plans = [build_plan(collective, "tree", r, p, *plan_args(collective, p, count, 0))
                 for r in range(p)]
    else:
        plans = [build_plan(collective, algorithm, r, p, *plan_args(collective, p, count, 0),
                            chunks) for r in range(p)]
    predicted = cost.replay(plans, 4, params)
    shape_of = "tree_pipelined" if algorithm == "tree" else algorithm
    bound = _steps_of_a_pipeline(shape_of, collective, p, chunks) * \
        _chunk_time(shape_of, collective, p, count, chunks, params)
    return predicted <= 1.1 * bound, predicted, bound


BANDWIDTH = Params(alpha=1e-6, beta=1e-9, gamma=0.0, ports=4)     # a step's messages at once


@pytest.mark.parametrize("collective", COLLECTIVES)
@pytest.mark.parametrize("p", [4, 8, 16, 32])
def test_the_lowered_plan_overlaps_chunks_and_the_whole_vector_tree_does_not(collective, p):
    count, chunks = 1 << 22, 64
    for algorithm in ALGORITHMS:
        ok, predicted, bound = _overlaps(algorithm, collective, p, count, chunks, BANDWIDTH)
        assert ok, (algorithm, predicted, bound)
    if collective == "all_reduce" or p >= 8:
        # at p = 4 a binomial broadcast's two whole-vector rounds cost what a binary tree's
        # two chunks per step cost: no gap to tell
        ok, predicted, bound = _overlaps("tree", collective, p, count, chunks, BANDWIDTH)
        assert not ok, (predicted, bound)


@pytest.mark.parametrize("p", [8, 16, 32])
def test_default_chunking_beats_the_whole_vector_tree_at_large_sizes(p):
    """With the host transports' defaults, at 16 MiB: the pipelined binary tree takes at most
    0.6 of the binomial tree's time, the double binary tree at most 0.37, and it is within
    1.25x of the ring (whose bandwidth it matches; the fill and the γ of its reductions
    differ)."""
    params = cost.DEFAULTS["mpi"]
    tree = predict_bytes("all_reduce", "tree", p, 16 * MIB, params)
    pipelined = predict_bytes("all_reduce", "tree_pipelined", p, 16 * MIB, params)
    double = predict_bytes("all_reduce", "double_binary_tree", p, 16 * MIB, params)
    ring = predict_bytes("all_reduce", "ring", p, 16 * MIB, params)
    assert pipelined <= tree * 0.6 and double <= tree * 0.37 and double <= 1.25 * ring


# --- the model's closed form and auto -----------------------------------------------------------

@pytest.mark.parametrize("transport", ["mpi", "socket", "nccl"])
def test_closed_form_tracks_the_replay(transport):
    """What ``estimate`` uses past 64 ranks: each slot priced at its busiest rank. Within 10%
    of the replay from 1 MiB with the multi-port defaults (where the pipeline is full), within
    45% below (the fill's slots are lighter than the busiest)."""
    params = cost.DEFAULTS[transport]
    for algorithm in ALGORITHMS:
        for collective in COLLECTIVES:
            for p in (4, 5, 8, 13, 16, 24, 32):
                for nbytes in (64 << 10, MIB, 16 * MIB):
                    closed = formula(collective, algorithm, p, nbytes, params)
                    counted = predict_bytes(collective, algorithm, p, nbytes, params)
                    tol = 0.1 if nbytes >= MIB and transport == "mpi" else 0.45
                    assert closed == pytest.approx(counted, rel=tol), \
                        (algorithm, collective, p, nbytes)


def test_auto_takes_a_pipelined_tree_where_the_model_prices_it_cheapest():
    assert choose("broadcast", 8, 16 * MIB, "mpi") == "double_binary_tree"
    assert choose("reduce", 16, 16 * MIB, "mpi") == "double_binary_tree"
    assert choose("all_reduce", 4, 256 * MIB, "mpi") == "double_binary_tree"
    # past the counted range: the closed form, at once
    assert cost.estimate("all_reduce", "double_binary_tree", 1024, 64 * MIB,
                         cost.DEFAULTS["mpi"]) == formula("all_reduce", "double_binary_tree",
                                                          1024, 64 * MIB, cost.DEFAULTS["mpi"])
    # and the pipelined trees stay out of the way where latency decides
    assert choose("all_reduce", 8, 4096, "mpi") not in ALGORITHMS
