"""Segmented plans (``transforms.segmented``) and the host executor's overlapped mode.

Layer 1: the transform itself (how many pieces, proportional bounds, reductions cut to meet
their landing zones, nothing cut below the threshold, the cache) and, in the simulator, every
collective x algorithm at a few world sizes and counts giving the same bits as the plain plan.
Layer 2: the overlapped executor (``segment_bytes`` set on a local transport) against the
plain one on real threads, for every collective x algorithm. Small counts with tiny segments
keep it fast while still cutting every message into several pieces.
"""
import threading

import numpy as np
import pytest

from collectives.algorithms import capabilities
from collectives.algorithms.hazards import pieces_of_at_least as segment_pieces
from collectives.algorithms.schedule import (Copy, Reduce, Region, build_plan, buffer_sizes,
                                             plan_args)
from collectives.algorithms import hazards
from collectives.algorithms.transforms import in_rounds, rounds, segmented
from collectives.algorithms.lowered import overlapped
from collectives.algorithms.simulate import execute_all
from collectives.executors import host
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp
from collectives.transports.local import LocalTransport, LocalWorld

CASES = [(c, a) for c, algs in sorted(capabilities().items()) for a in algs]


def _counts(collective, size, n):
    if collective in ("all_reduce", "broadcast", "reduce"):
        return n
    if collective == "all_to_all":
        return tuple(tuple((n + i + 2 * j) % 7 + n for j in range(size)) for i in range(size))
    if collective == "barrier":
        return None
    return tuple(n + (i % 3) for i in range(size))     # uneven blocks


def _plans(collective, algorithm, size, counts, max_count=None):
    args = plan_args(collective, size, counts)
    plans = [build_plan(collective, algorithm, r, size, *args) for r in range(size)]
    return plans if max_count is None else [segmented(p, max_count) for p in plans]


def _buffers(collective, size, counts, plans, seed):
    rng = np.random.default_rng(seed)
    out = []
    for rank in range(size):
        if collective == "barrier":
            out.append({"scratch": np.zeros(plans[rank].scratch, np.uint8)})
            continue
        n_in, n_out = buffer_sizes(collective, rank, size, counts)
        data = rng.integers(-8, 8, max(n_in, n_out)).astype(np.float64)
        if collective in ("all_reduce", "broadcast"):
            out.append({"input": None, "output": data[:n_out].copy()})
        else:
            out.append({"input": data[:n_in].copy(), "output": np.zeros(n_out)})
        out[-1]["scratch"] = np.zeros(plans[rank].scratch)
    return out


# -- the transform ------------------------------------------------------------------------------

def test_piece_counts_and_threshold():
    assert segment_pieces(10, 4) == 2          # 5 + 5: pieces hold max .. 2*max-1
    assert segment_pieces(7, 4) == 1           # below 2 * max: not cut
    assert segment_pieces(0, 4) == 1
    assert segment_pieces(4096, 1000) == 4
    with pytest.raises(ValueError):
        segmented(build_plan("all_reduce", "ring", 0, 2, 10), 0)


def test_small_plans_are_returned_as_they_are():
    plan = build_plan("all_reduce", "ring", 0, 4, 64)
    assert segmented(plan, 1000) is plan


def test_ring_all_reduce_is_cut_and_aligned():
    count, size, max_count = 4003, 3, 100
    plan = build_plan("all_reduce", "ring", 1, size, count)
    cut = segmented(plan, max_count)
    assert cut is segmented(plan, max_count)          # cached
    assert len(cut.steps) == len(plan.steps) and cut.scratch == plan.scratch
    for old, new in zip(plan.steps, cut.steps):
        for before, after in ((old.sends, new.sends), (old.recvs, new.recvs)):
            pieces = [after[i:i + segment_pieces(t.region.count, max_count)]
                      for i, t in enumerate(before)]
            total = 0
            for t in before:
                n = segment_pieces(t.region.count, max_count)
                group = after[total:total + n]
                total += n
                assert n > 1 and all(g.peer == t.peer for g in group)
                # consecutive, covering, each max .. 2*max-1 elements
                assert group[0].region.offset == t.region.offset
                assert group[-1].region.end == t.region.end
                assert all(a.region.end == b.region.offset for a, b in zip(group, group[1:]))
                assert all(max_count <= g.region.count < 2 * max_count for g in group)
            assert total == len(after) and pieces
        # every reduction piece reads exactly one receive piece
        landing = {r.region for r in new.recvs}
        reduces = [op for op in new.local if isinstance(op, Reduce)]
        assert len(reduces) == len(new.recvs) if old.local else not reduces
        for op in reduces:
            assert op.b in landing and op.dst == op.a and op.dst.count == op.b.count


def test_partially_overlapping_ops_are_not_cut():
    from collectives.algorithms.schedule import Plan, Step
    shift = Copy(Region("output", 0, 50), Region("output", 10, 50))
    plan = Plan("x", "y", 0, 1, (Step(local=(shift,)),), 0)
    assert segmented(plan, 10) is plan
    same = Reduce(Region("output", 0, 50), Region("output", 0, 50), Region("scratch", 0, 50))
    cut = segmented(Plan("x", "y", 0, 1, (Step(local=(same,)),), 50), 10)
    assert [op.dst.count for op in cut.steps[0].local] == [10] * 5


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_simulated_results_equal_unsegmented(collective, algorithm):
    reduce = reducer(ReduceOp.SUM, np.dtype(np.float64))
    for size, n, max_count in ((2, 40, 3), (3, 31, 4), (5, 23, 2)):
        counts = _counts(collective, size, n)
        plain = _plans(collective, algorithm, size, counts)
        cut = _plans(collective, algorithm, size, counts, max_count)
        assert sum(p.messages for p in cut) >= sum(p.messages for p in plain)
        want = _buffers(collective, size, counts, plain, seed=size)
        got = _buffers(collective, size, counts, cut, seed=size)
        overlapped_got = _buffers(collective, size, counts, cut, seed=size)
        execute_all(plain, want, reduce)
        execute_all(cut, got, reduce)
        # the program the host executor runs on segmented plans, simulated
        execute_all(cut, overlapped_got, reduce, lowering=overlapped)
        for rank in range(size):
            if collective != "barrier":
                np.testing.assert_array_equal(got[rank]["output"], want[rank]["output"])
                np.testing.assert_array_equal(overlapped_got[rank]["output"],
                                              want[rank]["output"])


# -- rounds: each message cut by its own size (NCCL's pipelined mode) ----------------------------

def test_rounds_hold_piece_k_of_every_message():
    from collectives.algorithms.schedule import Recv, Send, Step
    out, land = Region("output", 0, 4), Region("scratch", 0, 4)
    step = Step(sends=(Send(1, Region("input", 0, 10)),), recvs=(Recv(1, land),),
                local=(Reduce(out, out, land),))
    got = rounds(step, 3)
    # the send in ceil(10 / 3) = 4 pieces, the receive and its reduction in 2, cut alike
    assert [[s.region for s in r.sends] for r in got] == \
        [[hazards.cut(Region("input", 0, 10), k, 4)] for k in range(4)]
    assert [[t.region for t in r.recvs] for r in got] == [[land.sub(0, 2)], [land.sub(2, 2)],
                                                           [], []]
    assert [r.local for r in got] == [(Reduce(out.sub(0, 2), out.sub(0, 2), land.sub(0, 2)),),
                                      (Reduce(out.sub(2, 2), out.sub(2, 2), land.sub(2, 2)),),
                                      (), ()]
    assert rounds(step, 10) == (step,)
    # an op over half of what is received cannot be cut alike: it runs whole, last
    half = Step(recvs=(Recv(1, land),), local=(Copy(land.sub(0, 2), out.sub(0, 2)),))
    assert not hazards.splittable(half)
    got = rounds(half, 1)
    assert [len(r.recvs) for r in got] == [1] * 4
    assert [r.local for r in got] == [()] * 3 + [half.local]
    # local ops alone still run every piece; empty pieces and empty rounds are left out
    copies = Step(local=(Copy(Region("input", 0, 5), out.sub(0, 5)),
                         Copy(Region("input", 5, 0), out.sub(5, 0))))
    assert [r.local for r in rounds(copies, 2)] == [
        (Copy(Region("input", 0, 1), out.sub(0, 1)),), (Copy(Region("input", 1, 2),
                                                              out.sub(1, 2)),),
        (Copy(Region("input", 3, 2), out.sub(3, 2)),)]
    with pytest.raises(ValueError, match="max_count"):
        rounds(step, 0)
    with pytest.raises(ValueError, match="max_count"):
        in_rounds(build_plan("all_reduce", "ring", 0, 2, 10), 0)


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_simulated_rounds_equal_plain(collective, algorithm):
    """Both ends cut every message alike (the simulator raises on a size mismatch) and the
    rounds mean what the steps meant."""
    reduce = reducer(ReduceOp.SUM, np.dtype(np.float64))
    for size, n, max_count in ((2, 40, 3), (3, 31, 4), (5, 23, 1)):
        counts = _counts(collective, size, n)
        plain = _plans(collective, algorithm, size, counts)
        cut = [in_rounds(p, max_count) for p in plain]
        assert in_rounds(plain[0], max_count) is cut[0]            # cached on the plan
        want = _buffers(collective, size, counts, plain, seed=size)
        got = _buffers(collective, size, counts, cut, seed=size)
        execute_all(plain, want, reduce)
        execute_all(cut, got, reduce)
        for rank in range(size):
            if collective != "barrier":
                np.testing.assert_array_equal(got[rank]["output"], want[rank]["output"])


# -- the overlapped executor on real threads ------------------------------------------------------

def _run_local(plans, buffers, segment_bytes):
    size = len(plans)
    world = LocalWorld(size)
    reduce = reducer(ReduceOp.SUM, np.dtype(np.float64))
    errors = []

    def rank_main(rank):
        transport = LocalTransport(world, rank)
        transport.segment_bytes = segment_bytes
        b = buffers[rank]
        try:
            host.execute(plans[rank], transport, b, reduce, tag=7, timeout=20.0,
                          dtype=b["scratch"].dtype)
        except Exception as exc:            # reported below, with the rank
            errors.append((rank, exc))
            world.abort(f"rank {rank}: {exc}")

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


@pytest.mark.parametrize("collective,algorithm", [c for c in CASES if c[0] != "barrier"])
def test_overlapped_executor_equals_plain(collective, algorithm):
    # (barrier moves one byte per message: nothing to cut)
    for size, n in ((2, 37), (3, 41), (4, 53)):
        counts = _counts(collective, size, n)
        plans = _plans(collective, algorithm, size, counts)
        want = _buffers(collective, size, counts, plans, seed=n)
        got = _buffers(collective, size, counts, plans, seed=n)
        _run_local(plans, want, None)
        _run_local(plans, got, 3 * 8)       # 3 float64 per segment: every message is cut
        assert any(segmented(p, 3) is not p for p in plans)
        for rank in range(size):
            np.testing.assert_array_equal(got[rank]["output"], want[rank]["output"])


# -- over real sockets (the transport the mode is for) -------------------------------------------

def _socket_cases(transport, count):
    """Every algorithm of the three bandwidth collectives, plain then with 64-byte segments
    (so a ~1000-element message becomes ~60 pieces): both results, per case."""
    from collectives.algorithms.schedule import plan_args as args_of
    size, rank = transport.size, transport.rank
    reduce = reducer(ReduceOp.SUM, np.dtype(np.float32))
    results, tag = [], 100
    for collective in ("all_reduce", "reduce_scatter", "all_gather"):
        counts = count if collective == "all_reduce" else tuple(count // size + i % 2
                                                                for i in range(size))
        n_in, n_out = buffer_sizes(collective, rank, size, counts)
        for algorithm in sorted(capabilities()[collective]):
            plan = build_plan(collective, algorithm, rank, size, *args_of(collective, size, counts))
            pair = []
            for segment in (None, 64):
                transport.segment_bytes = segment
                data = (np.arange(max(n_in, n_out), dtype=np.float32) % 97) * (rank + 1)
                b = ({"output": data[:n_out].copy()} if collective == "all_reduce" else
                     {"input": data[:n_in].copy(), "output": np.zeros(n_out, np.float32)})
                host.execute(plan, transport, b, reduce, tag=tag, timeout=30.0,
                              dtype=np.dtype(np.float32))
                tag += 1
                pair.append(b["output"])
            results.append((collective, algorithm, pair[0], pair[1]))
    return results


def test_socket_segmented_equals_plain():
    from socket_ranks import ok, run_ranks
    for size in (2, 3):
        for rank_results in ok(run_ranks(size, _socket_cases, 1001), size):
            for collective, algorithm, plain, cut in rank_results:
                assert plain.size and np.array_equal(plain, cut), (size, collective, algorithm)
