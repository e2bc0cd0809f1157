"""Lowered programs (``algorithms.lowered``) against the plans they come from, for every
collective x algorithm at a few world sizes: the step walk is the step semantics; the
overlapped program posts each peer's messages in plan order, waits for every request exactly
once and only after posting it, and runs no op before every posted transfer it conflicts
with has been waited for. (That the programs give the right bits on real transports is
test_segmented.py's and test_local_collectives.py's.)"""
import numpy as np
import pytest

from collectives.algorithms import capabilities, hazards
from collectives.algorithms.hazards import extends_chain
from collectives.algorithms.lowered import (COMM, COMPUTE, LOCAL, POST, WAIT, Chain, chained,
                                            overlapped, stepwise, two_streams)
from collectives.algorithms.schedule import (Copy, Reduce, Region, buffer_sizes, build_plan,
                                             plan_args)
from collectives.algorithms.simulate import execute_all, reference
from collectives.algorithms.transforms import in_rounds, segmented
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp

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


# -- chained: fusable runs of reductions as one op -------------------------------------------------

def _chained_stepwise(plan):
    return chained(stepwise(plan))


def _sim_buffers(collective, size, counts, plans, dtype, seed):
    rng = np.random.default_rng(seed)
    out, arrays = [], []
    for rank in range(size):
        n_in, n_out = buffer_sizes(collective, rank, size, counts, 0)
        if collective in ("all_reduce", "broadcast", "reduce"):
            n_in = counts
        data = (rng.integers(0, 2**63, n_in, dtype=np.uint64, endpoint=True) if dtype == np.uint64
                else rng.standard_normal(n_in).astype(dtype))
        arrays.append(data)
        if collective in ("all_reduce", "broadcast"):
            inp, outp = None, data.copy()
        else:
            inp, outp = data.copy(), np.zeros(n_out, dtype)
        out.append({"input": inp, "output": outp, "scratch": np.zeros(plans[rank].scratch, dtype)})
    return arrays, out


def _sim_counts(collective, size, count):
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count
    if collective == "all_to_all":
        from collectives.algorithms.schedule import Matrix
        return Matrix(tuple(count + (r + c) % 3 for c in range(size)) for r in range(size))
    return tuple(count + r % 2 for r in range(size))


REDUCING_CASES = [(c, a) for c, a in CASES if c in ("all_reduce", "reduce_scatter", "reduce")]


@pytest.mark.parametrize("collective,algorithm", REDUCING_CASES)
def test_chains_never_change_results(collective, algorithm):
    """The simulator runs a Chain as a fused kernel would (every operand loaded before
    anything is stored), so a chain the rule should not have allowed shows here: exact
    (wrapping 64-bit) results against the reference, and float32 bits equal to the unchained
    program's, step walk and overlapped walk of segmented plans alike."""
    fused = 0
    for size in (2, 3, 4, 5, 8):
        for count in (1, 7, 100):
            counts = _sim_counts(collective, size, count)
            plans = [build_plan(collective, algorithm, r, size,
                                *plan_args(collective, size, counts, 0)) for r in range(size)]
            fused += sum(isinstance(op, Chain) for p in plans
                         for kind, _, what in chained(stepwise(p)).code if kind is LOCAL
                         for op in what)
            arrays, buffers = _sim_buffers(collective, size, counts, plans, np.uint64, count)
            execute_all(plans, buffers, reducer(ReduceOp.SUM, np.dtype(np.uint64)),
                        lowering=_chained_stepwise)
            want = reference(collective, arrays, root=0, counts=counts)
            for rank in range(size):
                if want[rank] is not None:
                    assert np.array_equal(buffers[rank]["output"], want[rank]), \
                        (size, count, rank)
            reduce = reducer(ReduceOp.SUM, np.dtype(np.float32))
            cut = [segmented(p, 8) for p in plans]
            for lowering, run in ((stepwise, plans), (_chained_stepwise, plans),
                                  (lambda p: chained(overlapped(p)), cut)):
                _, got = _sim_buffers(collective, size, counts, plans, np.float32, count)
                execute_all(run, got, reduce, lowering=lowering)
                if lowering is stepwise:
                    plain = got
                    continue
                for rank in range(size):
                    assert np.array_equal(got[rank]["output"].view(np.uint32),
                                          plain[rank]["output"].view(np.uint32)), \
                        (size, count, rank)
    if algorithm == "direct":
        assert fused > 0            # the direct reductions are chains: fusion is exercised


def _regions_of(plan):
    for step in plan.steps:
        for t in step.sends + step.recvs:
            yield t.region
        for op in step.local:
            yield from op


@pytest.mark.parametrize("collective,algorithm", REDUCING_CASES)
def test_fused_chains_mean_their_ops_on_any_data(collective, algorithm):
    """Each LOCAL instruction of a chained program, run with a fused kernel's semantics on
    random data in every buffer (not only the states the plan would reach), gives the bits
    of running its ops one by one."""
    rng = np.random.default_rng(3)
    for p in (2, 3, 4, 5, 8):
        for count in (1, 7, 1000):
            counts = _sim_counts(collective, p, count)
            for rank in range(p):
                plan = build_plan(collective, algorithm, rank, p,
                                  *plan_args(collective, p, counts, 0))
                sizes = {}
                for r in _regions_of(plan):
                    sizes[r.buffer] = max(sizes.get(r.buffer, 0), r.end)
                plain, fused = stepwise(plan).code, chained(stepwise(plan)).code
                for (kind, _, ops), (_, _, runs) in zip(plain, fused):
                    if kind is not LOCAL:
                        continue
                    assert [op for run in runs
                            for op in (run.ops if isinstance(run, Chain) else (run,))] == list(ops)
                    base = {b: rng.standard_normal(n).astype(np.float32) for b, n in sizes.items()}
                    want = {b: a.copy() for b, a in base.items()}
                    got = {b: a.copy() for b, a in base.items()}
                    _run_ops(want, ops)
                    _run_ops(got, runs)
                    for b in base:
                        assert np.array_equal(got[b].view(np.uint32), want[b].view(np.uint32)), \
                            (collective, algorithm, p, count, rank, b)


def _run_ops(arrays, ops):
    """Copies and reductions one by one; a Chain as a fused kernel runs it."""
    def view(r):
        return arrays[r.buffer][r.offset:r.end]
    for op in ops:
        if isinstance(op, Copy):
            view(op.dst)[...] = view(op.src)
        elif isinstance(op, Reduce):
            np.add(view(op.a), view(op.b), out=view(op.dst))
        else:
            acc, operands, stores = view(op.a).copy(), [view(b).copy() for b in op.bs], {}
            for i, b in enumerate(operands):
                acc = (acc + b).astype(np.float32)
                stores[i] = acc.copy()
            for dst, after in zip(op.dsts, op.writes):
                view(dst)[...] = stores[after]


def _r(buffer, offset, count=4):
    return Region(buffer, offset, count)


def test_chain_rule_edge_cases():
    acc, b1, b2 = _r("output", 0), _r("scratch", 0), _r("scratch", 4)
    first = Reduce(acc, acc, b1)
    assert extends_chain([first], Reduce(acc, acc, b2))                # accumulate in place
    assert extends_chain([Reduce(_r("output", 8), acc, b1)], Reduce(acc, _r("output", 8), b2))
    assert not extends_chain([first], Reduce(acc, _r("output", 4), b2))   # a is not the acc
    assert not extends_chain([first], Reduce(_r("output", 0, 2), acc, _r("scratch", 4, 2)))
    assert not extends_chain([first], Reduce(acc, acc, acc))           # b is an earlier dst
    assert not extends_chain([first], Reduce(acc, acc, _r("output", 2)))   # b meets the acc
    # a destination read or written at other indices than its own: not one thread per element
    assert not extends_chain([first], Reduce(_r("scratch", 2), acc, b2))
    assert not extends_chain([Reduce(acc, _r("output", 2), b1)],
                             Reduce(acc, acc, b2))                     # dst half over first a
    assert not extends_chain([Copy(b1, acc)], Reduce(acc, acc, b2))    # copies are never fused


def test_chained_groups_runs_and_caches():
    from collectives.algorithms.schedule import Plan, Step
    acc = _r("output", 0)
    ops = tuple(Reduce(acc, acc, _r("scratch", 4 * i)) for i in range(5))
    step = Step(local=(Copy(_r("input", 0), acc),) + ops + (Copy(acc, _r("output", 4)),))
    plan = Plan("all_reduce", "test", 0, 1, (step,), 20)
    program = stepwise(plan)
    got = chained(program).code[0][2]
    assert isinstance(got[0], Copy) and isinstance(got[2], Copy)
    assert got[1] == Chain(ops, (acc,), (4,)) == Chain.of(ops)
    assert got[1].a == acc and got[1].bs == tuple(op.b for op in ops)
    assert chained(program) is chained(program)
    short = chained(program, 2).code[0][2]
    assert [len(op.ops) if isinstance(op, Chain) else 1 for op in short] == [1, 2, 2, 1, 1]
    assert all(not isinstance(op, Chain) for op in chained(program, 1).code[0][2])
    with pytest.raises(ValueError, match="longest"):
        chained(program, 0)
    two = Chain.of((Reduce(_r("output", 8), acc, _r("scratch", 0)),
                    Reduce(acc, _r("output", 8), _r("scratch", 4)),
                    Reduce(_r("output", 8), acc, _r("scratch", 8))))
    assert two.dsts == (_r("output", 8), acc) and two.writes == (2, 1)


def test_host_executor_runs_chained_programs(monkeypatch):
    """Any lowering runs anywhere: the host executor (on real threads) runs a Chain op by op."""
    import threading
    import types
    from collectives.executors import host
    from collectives.transports.local import LocalTransport, LocalWorld
    monkeypatch.setattr(host, "lowered", types.SimpleNamespace(
        stepwise=_chained_stepwise, overlapped=overlapped))
    size, count = 4, 9
    arrays = [np.arange(count, dtype=np.int64) * (r + 1) for r in range(size)]
    outs = [a.copy() for a in arrays]
    plans = [build_plan("all_reduce", "direct", r, size, count) for r in range(size)]
    assert any(isinstance(op, Chain) for kind, _, what in _chained_stepwise(plans[0]).code
               if kind is LOCAL for op in what)
    world, errors = LocalWorld(size), []

    def rank_main(rank):
        try:
            host.execute(plans[rank], LocalTransport(world, rank), {"output": outs[rank]},
                         reducer(ReduceOp.SUM, np.dtype(np.int64)), timeout=20.0)
        except Exception as exc:        # reported below
            errors.append((rank, exc))
            world.abort(str(exc))
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    for out in outs:
        assert np.array_equal(out, sum(arrays))


def test_the_simulator_catches_a_chain_the_rule_should_refuse(monkeypatch):
    """No schedule today makes a run the rule must refuse, so hand-made ones: a ``b`` that
    reads an earlier destination of the run, whole or in part. Chained under the rule they
    give the step walk's bits; with the rule loosened, the simulator's fused semantics give
    other bits (so the tests above would see it). (An element read at one index and written
    at another races between a kernel's threads, which a sequential simulator cannot show:
    test_chain_rule_edge_cases guards that part of the rule.)"""
    from collectives.algorithms import lowered as lowering
    from collectives.algorithms.schedule import Plan, Step
    acc, b1 = _r("output", 0), _r("scratch", 0)
    runs = [(Reduce(acc, acc, b1), Reduce(acc, acc, acc)),
            (Reduce(acc, acc, b1), Reduce(acc, acc, _r("output", 2)))]

    def results(local):
        plan = Plan("all_reduce", "test", 0, 1, (Step(local=local),), 8)
        out = []
        for lowering_ in (stepwise, _chained_stepwise):
            buffers = [{"output": np.arange(1.0, 7.0), "scratch": np.arange(10.0, 18.0)}]
            execute_all([plan], buffers, reducer(ReduceOp.SUM, np.dtype(np.float64)),
                        lowering=lowering_)
            out.append(buffers[0]["output"])
        return out

    for local in runs:
        plain, fused = results(local)
        assert np.array_equal(plain, fused)
    monkeypatch.setattr(lowering.hazards, "extends_chain", lambda run, op: op.a == run[-1].dst)
    for local in runs:
        plain, fused = results(local)
        assert not np.array_equal(plain, fused), local


# -- two streams: transfers and local ops ordered by events ---------------------------------------

@pytest.mark.parametrize("collective,algorithm", CASES)
def test_two_streams_order_every_conflict(collective, algorithm):
    """The rounds' transfers on COMM and their ops on COMPUTE, in plan order; following the
    waits (and stream order, transitively), every instruction starts after each earlier
    instruction of the other stream it conflicts with; events are recorded exactly where
    waited for; the caller's stream waits for the last transfer."""
    for size in (2, 3, 5):
        for max_count in (1, 2, 5, 1000):
            for rank in range(size):
                plan = _plan(collective, algorithm, rank, size)
                program = two_streams(plan, max_count)
                assert two_streams(plan, max_count) is program      # cached on the plan
                code = program.code
                assert code[0][:5] == (WAIT, 0, (), COMPUTE, -1) and code[0].record
                assert code[1][:5] == (WAIT, 0, (), COMM, 0)
                flat = in_rounds(plan, max_count)
                posts = [i.what for i in code if i.kind is POST]
                assert posts == [(s.recvs, s.sends) for s in flat.steps if s.sends or s.recvs]
                assert [op for i in code if i.kind is LOCAL for op in i.what] == \
                    [op for s in flat.steps for op in s.local]
                assert all(i.stream == (COMM if i.kind is POST else COMPUTE)
                           for i in code[2:] if i.kind is not WAIT)
                assert {n for n, i in enumerate(code) if i.record} == \
                    {i.after for i in code if i.after >= 0}
                if posts:
                    last = max(n for n, i in enumerate(code) if i.kind is POST)
                    assert code[-1][:5] == (WAIT, len(plan.steps) - 1, (), COMPUTE, last)
                _check_stream_order(code, (collective, algorithm, size, max_count, rank))


def _check_stream_order(code, where):
    position = {}                   # instruction -> its place in its stream
    known = {}                      # instruction -> {stream: last place known done at start}
    latest = {COMM: None, COMPUTE: None}
    placed = {COMM: [], COMPUTE: []}
    for n, (kind, _, what, stream, after, _) in enumerate(code):
        other = COMPUTE if stream == COMM else COMM
        previous = latest[stream]
        state = dict(known[previous]) if previous is not None else {COMM: -1, COMPUTE: -1}
        if previous is not None:
            state[stream] = position[previous]
        if after >= 0:
            assert code[after].stream == other, where
            for s in (COMM, COMPUTE):
                state[s] = max(state[s], known[after][s])
            state[other] = max(state[other], position[after])
        accessed = _accessed(kind, what)
        for m in placed[other]:
            if accessed and _accessed(code[m].kind, code[m].what) and \
                    hazards.conflict(_accessed(code[m].kind, code[m].what), accessed):
                assert position[m] <= state[other], (where, n, m)
        position[n], known[n], latest[stream] = len(placed[stream]), state, n
        placed[stream].append(n)


def _accessed(kind, what):
    if kind is POST:
        return tuple(s.region for s in what[1]), tuple(r.region for r in what[0])
    if kind is LOCAL:
        return hazards.access(what[0])
    return None


def test_two_streams_refuses_a_count_below_one():
    with pytest.raises(ValueError, match="max_count"):
        two_streams(_plan("all_reduce", "ring", 0, 2), 0)
