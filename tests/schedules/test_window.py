"""windowed: independent consecutive steps merged so their transfers are in flight together.

Layers: (1) schedules: every registered algorithm of every collective, windowed at several
windows, simulated against the numpy reference (also with a different window on every rank);
the merge rule itself on hand-made steps, one forbidden overlap at a time; the all_to_all
ring collapsing and the ring all_reduce chain left alone. (2) the facade on the local
transport with COLLECTIVES_WINDOW=4 gives the bits of window 1. (3) under ``mpiexec -n 4``
(this file is the worker) the compiled executor runs windowed plans, including merged steps
of more requests than its stack holds, with the bits of the plain plans.
"""
import os
import sys

import numpy as np
import pytest

from collectives.algorithms import capabilities, simulate
from collectives.algorithms.schedule import (Copy, Matrix, Plan, Recv, Reduce, Region, Send,
                                             Step, build_plan, plan_args)
from collectives.algorithms.transforms import segmented, windowed

from compiled_worker import launch_skip_reason
from mpiexec import mpirun
from repo import ROOT
SIZES = (2, 3, 4, 5, 7, 8)
WINDOWS = (2, 3, 8, 64)
CASES = [(c, a) for c, algs in capabilities().items() for a in algs]


def _uneven(size, salt=0):
    """Block counts that differ and include zeros."""
    return tuple((i * 7 + 3 + salt) % 5 for i in range(size))


def count_cases(collective, size):
    if collective == "barrier":
        return [None]
    if collective in ("all_reduce", "broadcast", "reduce"):
        return sorted({0, 1, size - 1, size + 1, 37})
    if collective == "all_to_all":
        return [Matrix(_uneven(size, row) for row in range(size)),
                Matrix(((3,) * size,) * size),
                Matrix(((0,) * size,) * size)]
    return [_uneven(size), (size + 1,) * size, (0,) * size]


def roots(collective, size):
    return sorted({0, size - 1}) if collective in ("broadcast", "reduce", "gather", "scatter") \
        else [0]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_windowed_plans_give_the_plain_results(collective, algorithm, monkeypatch):
    """simulate.verify on windowed plans: random 64-bit words, wrapping SUM, exact compare.
    The last window differs per rank (1 on some): the other end of a message need not merge
    alike."""
    plain = simulate.build_plan
    for size in SIZES:
        for window in WINDOWS + ("per rank",):
            def build(c, name, rank, p, *args, window=window):
                w = 1 + rank % 4 if window == "per rank" else window
                return windowed(plain(c, name, rank, p, *args), w)
            monkeypatch.setattr(simulate, "build_plan", build)
            for counts in count_cases(collective, size):
                for root in roots(collective, size):
                    simulate.verify(collective, algorithm, size, counts, root=root, seed=size)


def _plans(collective, algorithm, size, counts, window):
    return [windowed(build_plan(collective, algorithm, r, size,
                                *plan_args(collective, size, counts, 0)), window)
            for r in range(size)]


def test_all_to_all_ring_collapses_to_one_step():
    for size in range(2, 10):
        counts = Matrix(((4,) * size,) * size)
        for plan in _plans("all_to_all", "ring", size, counts, max(2, size - 1)):
            assert len(plan.steps) == 1
            step = plan.steps[0]
            assert len(step.sends) == len(step.recvs) == size - 1
            assert step.local == (Copy(Region("input", plan.rank * 4, 4),
                                       Region("output", plan.rank * 4, 4)),)
        # a window of 2: the local copy rides free, then two exchanges per step
        for plan in _plans("all_to_all", "ring", size, counts, 2):
            assert len(plan.steps) == (size - 1 + 1) // 2
            assert max(len(s.sends) for s in plan.steps) == min(2, size - 1)


def test_merged_step_keeps_each_peers_messages_in_plan_order():
    size = 6
    counts = Matrix(_uneven(size, row) for row in range(size))
    plain = build_plan("all_to_all", "ring", 2, size, counts)
    merged = windowed(plain, 64)
    assert [s for step in plain.steps for s in step.sends] == list(merged.steps[0].sends)
    assert [r for step in plain.steps for r in step.recvs] == list(merged.steps[0].recvs)


def test_ring_all_reduce_chain_is_not_merged():
    """Every ring step sends what the previous one reduced (and lands in the same scratch):
    nothing may merge, whatever the window."""
    for size in (3, 5, 8):
        for plan in _plans("all_reduce", "ring", size, 10 * size, 64):
            assert len(plan.steps) == 2 * (size - 1)
            assert plan is build_plan("all_reduce", "ring", plan.rank, size, 10 * size)
    # the ring all_gather forwards what it just received: only the first local copy joins
    for size in (3, 5, 8):
        for plan in _plans("all_gather", "ring", size, (4,) * size, 64):
            assert len(plan.steps) == size - 1


def _plan(*steps):
    return Plan("all_to_all", "test", 0, 4, tuple(steps), 0)


def out(offset, count=4):
    return Region("output", offset, count)


def inp(offset, count=4):
    return Region("input", offset, count)


# (earlier step, later step, may they merge?)
RULE_CASES = {
    "independent exchanges": (Step((Send(1, inp(0)),), (Recv(1, out(0)),)),
                              Step((Send(2, inp(4)),), (Recv(2, out(4)),)), True),
    "same source read by both sends": (Step((Send(1, inp(0)),)),
                                       Step((Send(2, inp(0)),)), True),
    "touching end to end": (Step(recvs=(Recv(1, out(0)),)),
                            Step(recvs=(Recv(2, out(4)),)), True),
    "empty region inside a written one": (Step(recvs=(Recv(1, out(0, 8)),)),
                                          Step((Send(2, out(2, 0)),)), True),
    "later receive overwrites what the earlier send reads": (
        Step((Send(1, out(0)),)), Step(recvs=(Recv(2, out(2)),)), False),
    "two receives into one region": (Step(recvs=(Recv(1, out(0)),)),
                                     Step(recvs=(Recv(2, out(3)),)), False),
    "later receive into what the earlier local op reads": (
        Step(recvs=(Recv(1, out(0)),), local=(Copy(out(8), out(12)),)),
        Step(recvs=(Recv(2, out(8)),)), False),
    "later receive into what the earlier local op writes": (
        Step(recvs=(Recv(1, out(0)),), local=(Copy(inp(0), out(12)),)),
        Step(recvs=(Recv(2, out(14)),)), False),
    "later send of what the earlier receive writes": (
        Step(recvs=(Recv(1, out(0)),)), Step((Send(2, out(1)),)), False),
    "later send of what the earlier local op writes": (
        Step(local=(Reduce(out(8), out(8), inp(0)),)), Step((Send(2, out(8)),)), False),
    "later send of what the earlier local op only reads": (
        Step(recvs=(Recv(1, out(0)),), local=(Reduce(out(8), out(8), inp(0)),)),
        Step((Send(2, inp(0)),)), True),
    "other buffer at the same offsets": (Step(recvs=(Recv(1, out(0)),)),
                                         Step((Send(2, inp(0)),), (Recv(2, Region("scratch", 0, 4)),)),
                                         True),
}


@pytest.mark.parametrize("name", sorted(RULE_CASES))
def test_merge_rule(name):
    first, second, merges = RULE_CASES[name]
    result = windowed(_plan(first, second), 8)
    if merges:
        assert len(result.steps) == 1
        merged = result.steps[0]
        assert merged.sends == first.sends + second.sends
        assert merged.recvs == first.recvs + second.recvs
        assert merged.local == first.local + second.local
    else:
        assert result.steps == (first, second)


def test_rule_holds_against_every_earlier_member_not_just_the_last():
    a = Step((Send(1, out(0)),))                  # reads output[0:4]
    b = Step((Send(2, inp(0)),), (Recv(2, out(8)),))
    c = Step(recvs=(Recv(3, out(1)),))            # would overwrite what a sends
    result = windowed(_plan(a, b, c), 8)
    assert [len(s.sends) + len(s.recvs) for s in result.steps] == [3, 1]


def test_window_counts_only_steps_that_move_data():
    moving = [Step((Send(1, inp(4 * k)),), (Recv(1, out(4 * k)),)) for k in range(6)]
    local = Step(local=(Copy(inp(100), out(100)),))
    plan = _plan(local, *moving[:3], local, *moving[3:])
    assert [len(s.sends) for s in windowed(plan, 3).steps] == [3, 3]
    assert [len(s.sends) for s in windowed(plan, 2).steps] == [2, 2, 2]
    assert [len(s.local) for s in windowed(plan, 2).steps] == [1, 1, 0]


def test_window_of_one_or_less_and_barriers_are_untouched_and_results_are_cached():
    plan = build_plan("all_to_all", "ring", 1, 4, Matrix(((2,) * 4,) * 4))
    assert windowed(plan, 1) is plan and windowed(plan, 0) is plan and windowed(plan, -3) is plan
    assert windowed(plan, 4) is windowed(plan, 4)
    assert windowed(plan, np.int64(4)) is windowed(plan, 4)
    for algorithm in capabilities()["barrier"]:
        barrier = build_plan("barrier", algorithm, 0, 8)
        assert windowed(barrier, 64) is barrier
    for bad in (2.0, "4", True, None):
        with pytest.raises(TypeError, match="windowed"):
            windowed(plan, bad)


def test_window_setting_parses_the_environment_variable():
    from collectives.group import window_setting
    assert window_setting(None) == 1 and window_setting("") == 1 and window_setting(" 4 ") == 4
    with pytest.raises(ValueError, match="COLLECTIVES_WINDOW"):
        window_setting("four")
    with pytest.raises(ValueError, match="COLLECTIVES_WINDOW"):
        window_setting("0")


# ---------------------------------------------------------------------------------------------
# The facade on the local transport


def _facade_calls(rank, algorithm_of):
    """Every collective through the facade, uneven where the facade allows; float32 data so
    that a changed reduction order would change bits. Returns the outputs in call order."""
    import collectives as dist
    size = dist.get_world_size()
    rng = np.random.default_rng(100 + rank)
    data = lambda n: rng.standard_normal(n).astype(np.float32)  # noqa: E731
    results = []
    for count in (0, 1, 2 * size + 3, 1000):
        t = data(count)
        dist.all_reduce(t, algorithm=algorithm_of("all_reduce"))
        results.append(t)
        t = data(count)
        dist.broadcast(t, src=size - 1, algorithm=algorithm_of("broadcast"))
        results.append(t)
        t = data(count)
        dist.reduce(t, dst=size - 1, algorithm=algorithm_of("reduce"))
        results.append(t)
    sizes = _uneven(size)
    outs = [np.zeros(n, np.float32) for n in sizes]
    dist.all_gather(outs, data(sizes[rank]), algorithm=algorithm_of("all_gather"))
    results.extend(outs)
    out = np.zeros(sizes[rank], np.float32)
    dist.reduce_scatter(out, [data(n) for n in sizes], algorithm=algorithm_of("reduce_scatter"))
    results.append(out)
    # rank r sends (r + j) % 4 elements to rank j, so rank j receives (r + j) % 4 from r
    sends = recvs = [(rank + j) % 4 for j in range(size)]
    out = np.zeros(sum(recvs), np.float32)
    dist.all_to_all_single(out, data(sum(sends)), output_split_sizes=recvs,
                           input_split_sizes=sends, algorithm=algorithm_of("all_to_all"))
    results.append(out)
    t = data(7)
    gathered = [np.zeros(7, np.float32) for _ in range(size)] if rank == 0 else None
    dist.gather(t, gathered, dst=0, algorithm=algorithm_of("gather"))
    results.extend(gathered or [])
    out = np.zeros(5, np.float32)
    dist.scatter(out, [data(5) for _ in range(size)] if rank == size - 1 else None, src=size - 1,
                 algorithm=algorithm_of("scatter"))
    results.append(out)
    dist.barrier(algorithm=algorithm_of("barrier"))
    return results


def _facade_job(rank, pick):
    algorithms = capabilities()
    return _facade_calls(rank, lambda c: algorithms[c][pick % len(algorithms[c])])


def test_facade_on_local_transport_window_4_gives_the_bits_of_window_1(monkeypatch):
    from collectives import call as call_module    # where a call shape windows its plan
    from collectives.testing import spawn_local
    calls = []
    real = call_module.windowed

    def counting(plan, window):
        calls.append(window)
        return real(plan, window)

    monkeypatch.setattr(call_module, "windowed", counting)
    rounds = max(len(a) for a in capabilities().values())
    for size in (4, 5):
        for pick in range(rounds):
            monkeypatch.setenv("COLLECTIVES_WINDOW", "1")
            plain = spawn_local(size, _facade_job, pick)
            assert not calls
            monkeypatch.setenv("COLLECTIVES_WINDOW", "4")
            merged = spawn_local(size, _facade_job, pick)
            assert calls and set(calls) == {4}
            calls.clear()
            for rank in range(size):
                a, b = plain[rank], merged[rank]
                assert len(a) == len(b)
                for x, y in zip(a, b):
                    assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), (size, pick, rank)


# ---------------------------------------------------------------------------------------------
# The compiled executor under mpiexec


def test_compiled_executor_runs_windowed_plans_under_mpiexec():
    reason = launch_skip_reason()
    if reason:
        pytest.skip(reason)
    result = mpirun(4, os.path.abspath(__file__), timeout=120)
    out = result.stdout
    skipped = [line for line in out.splitlines() if line.startswith("SKIP ")]
    if skipped:
        pytest.skip(skipped[0][5:])
    assert result.returncode == 0, out + result.stderr
    lines = out.splitlines()
    assert lines[-1] == "done", out + result.stderr
    assert "ok compiled windowed == compiled plain" in lines, out
    assert "ok wide merged steps" in lines, out


def _worker():
    from compiled_worker import compiled_world
    started = compiled_world()
    if started is None:
        return 0
    comm, rank, size = started
    from collectives import transports
    from collectives.executors import host
    from collectives.group import ProcessGroup
    from collectives.kernels.reduce import reducer
    from collectives.ops import ReduceOp
    world = transports.create("mpi", rank=rank, world_size=size, timeout=60)
    group = ProcessGroup(world, backend="mpi")
    problems = []

    # every collective x algorithm through the group, compiled executor, window 1 vs 8
    for collective, algorithm in CASES:
        if collective == "barrier":
            continue
        for root in roots(collective, size):
            results = []
            for window in (1, 8):
                group.window = window
                rng = np.random.default_rng(7 * size + rank)
                inp, out = _mpi_call(collective, rank, size, rng, root)
                counts = (_uneven(size) if collective in
                          ("reduce_scatter", "all_gather", "gather", "scatter") else None)
                group.prepare(collective, input=inp, output=out, counts=counts, root=root,
                              algorithm=algorithm, timeout=30)()
                results.append(out)
            if results[0] is not None and results[0].tobytes() != results[1].tobytes():
                problems.append(f"rank {rank}: {collective}/{algorithm} root {root}: "
                                f"windowed differs")
    group.window = 1
    _report(comm, rank, "compiled windowed == compiled plain", problems)

    # merged steps wider than the C stack of requests: all_to_all ring cut into segments
    problems = []
    n = 40
    counts = Matrix(((n,) * size,) * size)
    plan = build_plan("all_to_all", "ring", rank, size, counts)
    wide = windowed(segmented(plan, 4), 64)
    widest = max(len(s.sends) + len(s.recvs) for s in wide.steps)
    if widest <= 16:
        problems.append(f"rank {rank}: widest merged step has only {widest} requests")
    data = (np.arange(n * size, dtype=np.float64) + 1000 * rank)
    outs = []
    for execute, p in ((group.execute, wide), (host.execute, plan)):
        out = np.zeros(n * size)
        execute(p, world, {"input": data, "output": out}, reducer(ReduceOp.SUM, out.dtype),
                tag=(1 << 20) + 3, timeout=30, operation="all_to_all", dtype=out.dtype)
        outs.append(out)
    want = np.concatenate([np.arange(rank * n, (rank + 1) * n) + 1000.0 * src
                           for src in range(size)])
    for label, out in zip(("compiled wide", "host plain"), outs):
        if not np.array_equal(out, want):
            problems.append(f"rank {rank}: {label} all_to_all wrong")
    _report(comm, rank, "wide merged steps", problems)
    comm.Barrier()
    if rank == 0:
        print("done", flush=True)
    return 0


def _mpi_call(collective, rank, size, rng, root):
    data = lambda k: rng.standard_normal(k).astype(np.float32)  # noqa: E731
    counts, n = _uneven(size), 23
    if collective == "all_reduce":
        return data(n), np.zeros(n, np.float32)
    if collective == "broadcast":
        return None, data(n) if rank == root else np.zeros(n, np.float32)
    if collective == "reduce":
        return data(n), np.zeros(n, np.float32) if rank == root else None
    if collective == "reduce_scatter":
        return data(sum(counts)), np.zeros(counts[rank], np.float32)
    if collective == "all_gather":
        return data(counts[rank]), np.zeros(sum(counts), np.float32)
    if collective == "gather":
        return data(counts[rank]), np.zeros(sum(counts), np.float32) if rank == root else None
    if collective == "scatter":
        return (data(sum(counts)) if rank == root else None), np.zeros(counts[rank], np.float32)
    if collective == "all_to_all":
        return data(n * size), np.zeros(n * size, np.float32)
    raise ValueError(collective)


def _report(comm, rank, name, problems):
    gathered = comm.allgather(problems[:10])
    if rank == 0:
        merged = [p for part in gathered for p in part]
        print("\n".join(merged) if merged else f"ok {name}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(_worker())
