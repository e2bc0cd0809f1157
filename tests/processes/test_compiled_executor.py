"""The compiled MPI executor (``executors/_mpi_exec.pyx``) against its twin, the host executor.

Under ``mpiexec -n k`` (k = 1..4) this file runs itself as the worker: every registered
collective x algorithm (``capabilities()``) x dtype (bool, all ints, float16, bfloat16, float32,
float64, complex) x every op the dtype defines, uneven counts, roots 0 and p-1, through the
process group once with the compiled executor and once with the host executor, on the same
inputs; results must be bitwise equal. Floats are random bit patterns (NaN payloads, inf,
-0.0, subnormals). The one allowance is the one ``tests/local/test_kernels.py`` makes: float32/64
SUM/PRODUCT lanes that are NaN may differ in payload (numpy's own SIMD and scalar loops pick
different operands' NaN), so there only NaN-ness is compared. Then the faults: a timeout (one
rank waits for a peer that never sends) and a size mismatch (ranks disagree on counts), and,
at size 1, the float16 / bfloat16 C loops (AVX-512, F16C and the portable path) against numpy.
The C loop interprets any lowered program, not only the step walk the group runs: every
collective x algorithm cut into segments runs as the overlapped program (``lowered.overlapped``:
requests of several steps in flight, waits on slots that are not consecutive, more slots than
the stack holds) against the host executor, and the timeout and the mismatch again in that
form (every pending receive cancelled: a later message lands where it should). The tables the
C loop reads (request slots) are checked without MPI.
At size 3 every scratch goes through the bounded scratch pool with a tiny cap (reuse and
eviction on every call). The pool's own bookkeeping is tested without MPI.

Skipped (with the reason) when the extension is not built, or mpi4py / mpiexec are missing.
"""
import os
import sys

import numpy as np
import pytest

from compiled_worker import launch_skip_reason
from mpiexec import mpirun
from repo import ROOT


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_compiled_matches_host_under_mpiexec(n):
    reason = launch_skip_reason()
    if reason:
        pytest.skip(reason)
    result = mpirun(n, os.path.abspath(__file__), timeout=120)
    out = result.stdout
    skipped = [line for line in out.splitlines() if line.startswith("SKIP ")]
    if skipped:
        pytest.skip(skipped[0][5:])
    assert result.returncode == 0, out + result.stderr
    lines = out.splitlines()
    assert lines and lines[-1] == "done", out + result.stderr
    cases = int(next(line.split()[1] for line in lines if line.startswith("cases ")))
    compiled_cases = int(next(line.split()[1] for line in lines if line.startswith("in-C ")))
    assert cases > 1000 and compiled_cases > 0.8 * cases, out
    expected = {"ok timeout", "ok size mismatch", "ok overlapped timeout",
                "ok overlapped size mismatch"} if n > 1 else {"ok half kernels",
                                                              "ok signed zeros"}
    expected.add("ok overlapped == host")
    assert expected <= set(lines), out


def test_scratch_pool_reuses_and_stays_under_its_cap():
    from collectives.executors.compiled import ScratchPool
    pool = ScratchPool(cap=100)
    a = pool.take(40)
    assert a.nbytes == 40 and a.dtype == np.uint8 and pool.held == 0
    pool.give(a)
    assert pool.held == 40 and pool.take(40) is a and pool.held == 0
    b, c, d = pool.take(40), pool.take(40), pool.take(30)
    for buffer in (a, b, c):         # the third 40 goes over 100: the least recent goes
        pool.give(buffer)
    assert pool.held == 80
    pool.give(d)                      # 110 > 100: the oldest 40 is dropped
    assert pool.held == 70
    assert pool.take(30) is d and pool.take(40) is c and pool.held == 0
    pool.give(np.empty(101, np.uint8))   # larger than the cap: never kept
    assert pool.held == 0
    closed = ScratchPool(cap=0)
    closed.give(closed.take(10))
    assert closed.held == 0
    pool.give(a)
    pool.clear()
    assert pool.held == 0 and pool.take(40) is not a


def test_scratch_cap_parsing():
    from collectives.executors.compiled import _parse_bytes
    assert _parse_bytes("256M") == 256 << 20
    assert _parse_bytes("1GiB") == 1 << 30
    assert _parse_bytes("64k") == 64 << 10
    assert _parse_bytes("0") == 0
    assert _parse_bytes("4096") == 4096



def _program_plans():
    from collectives.algorithms import capabilities
    from collectives.algorithms.schedule import Matrix, build_plan, plan_args
    for collective, algorithms in sorted(capabilities().items()):
        for algorithm in algorithms:
            for size in (2, 3, 5):
                counts = (37 if collective in ("all_reduce", "broadcast", "reduce") else
                          Matrix(tuple(3 + (r + c) % 4 for c in range(size)) for r in range(size))
                          if collective == "all_to_all" else tuple(5 + r for r in range(size)))
                for rank in range(size):
                    yield build_plan(collective, algorithm, rank, size,
                                     *plan_args(collective, size, counts, size - 1))


def test_tables_of_the_step_walk_use_a_steps_width_of_slots_waited_in_place():
    """What the C loop reads, without MPI: the step walk's requests take slots 0..k-1 of a
    step of k transfers and every wait is on consecutive slots (no gathering), so a call
    needs the widest step's requests, as before programs; rows keep posting order."""
    from collectives.algorithms.lowered import stepwise
    from collectives.executors.compiled import _BUFFER_IDS, _tables
    for plan in _program_plans():
        code, xfers, waits, ops, slots, gather = _tables(stepwise(plan))
        assert slots == max([len(s.sends) + len(s.recvs) for s in plan.steps] + [0])
        assert gather == 0
        rows = [(r, t) for s in plan.steps for r, t in
                [(1, t) for t in s.recvs] + [(0, t) for t in s.sends]]
        assert [x[:5] for x in xfers] == [(r, t.peer, _BUFFER_IDS[t.region.buffer],
                                           t.region.offset, t.region.count) for r, t in rows]
        assert len(ops) == sum(len(s.local) for s in plan.steps)
        for kind, step, first, n, slot0 in code:
            if kind == 1:
                assert slot0 == 0 and [w[0] for w in waits[first:first + n]] == list(range(n))
            if kind == 0:
                assert [x[5] for x in xfers[first:first + n]] == list(range(n))


def test_tables_of_overlapped_programs_reuse_waited_slots():
    """Overlapped programs (segmented plans): a slot is never reused while its request is in
    flight, every request is waited for once, waits on scattered slots are gathered."""
    from collectives.algorithms.lowered import overlapped
    from collectives.algorithms.transforms import segmented
    from collectives.executors.compiled import _tables
    gathered = 0
    for plan in _program_plans():
        program = overlapped(segmented(plan, 2))
        code, xfers, waits, ops, slots, gather = _tables(program)
        busy, seen = set(), 0
        for kind, _, first, n, slot0 in code:
            if kind == 0:
                for row in xfers[first:first + n]:
                    assert row[5] not in busy and row[5] < slots
                    busy.add(row[5])
            elif kind == 1:
                held = [w[0] for w in waits[first:first + n]]
                assert set(held) <= busy
                assert (slot0 >= 0) == (held == list(range(held[0], held[0] + n)))
                gathered += slot0 < 0
                assert slot0 >= 0 or n <= gather
                busy -= set(held)
                seen += n
        assert not busy and seen == program.requests == len(xfers)
    assert gathered


def test_tables_run_fused_chains_op_by_op():
    """A program with reduction chains (``lowered.chained``; the direct all_reduce's p - 1
    reductions) flattens to the ops of its step walk, in order."""
    from collectives.algorithms.lowered import Chain, chained, stepwise
    from collectives.algorithms.schedule import build_plan
    from collectives.executors.compiled import _tables
    plan = build_plan("all_reduce", "direct", 0, 5, 40)
    fused = chained(stepwise(plan))
    assert any(isinstance(op, Chain) for _, _, what in fused.code if isinstance(what, tuple)
               for op in what)
    assert _tables(fused) == _tables(stepwise(plan))

def test_tables_refuse_programs_that_wait_wrongly():
    """A program waiting for a request it has not posted, waiting twice, or never waiting
    is a ValueError naming the plan and step, before anything runs."""
    from collectives.algorithms.lowered import LOCAL, POST, WAIT, Program, stepwise
    from collectives.algorithms.schedule import build_plan
    from collectives.executors.compiled import _tables
    plan = build_plan("all_reduce", "ring", 0, 2, 8)
    good = stepwise(plan)
    posts = [i for i in good.code if i[0] is POST]
    local = [i for i in good.code if i[0] is LOCAL]
    cases = {
        "has not posted": (posts[0], (WAIT, 0, (0, 5))),
        "twice": (posts[0], (WAIT, 0, (0, 1)), (WAIT, 0, (1,))),
        "never waits": (posts[0], (WAIT, 0, (1,)), *local),
    }
    for words, code in cases.items():
        with pytest.raises(ValueError, match=f"all_reduce \\(ring\\) on rank 0.*{words}"):
            _tables(Program(plan, code, 2))

# ---------------------------------------------------------------------------------------------
# The worker (run by mpiexec, not by pytest).

def _operand(rng, dtype, n):
    """n values of ``dtype``: random bits for floats (every kind of value), small ints, bools."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(-50, 50, n).astype(dtype)
    bits = rng.integers(0, 256, n * dtype.itemsize, dtype=np.uint8)
    out = bits.view(dtype).copy()
    lane = out.view(np.float32 if dtype.kind == "c" and dtype.itemsize == 8 else
                    np.float64 if dtype.kind == "c" else dtype)
    # half the lanes ordinary values, so that sums and products stay interesting
    lane[::2] = rng.standard_normal(lane[::2].size).astype(np.float32).astype(lane.dtype)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    picks = rng.integers(0, lane.size, max(1, lane.size // 20)) if lane.size else []
    lane[picks] = specials[rng.integers(0, specials.size, len(picks))].astype(lane.dtype)
    return out


def _differ(got, want, op, payload_free):
    """Indices where got and want differ (NaN payloads ignored where ``payload_free``)."""
    if got is None:
        return []
    uint = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.uint64}[got.itemsize]
    g, w = got.view(uint).reshape(-1), want.view(uint).reshape(-1)
    bad = g != w
    if payload_free:
        lanes = got.view(got.real.dtype).reshape(-1) if got.dtype.kind == "c" else got
        wanes = want.view(want.real.dtype).reshape(-1) if want.dtype.kind == "c" else want
        nan = np.isnan(lanes) & np.isnan(wanes)
        if got.dtype.kind == "c":
            nan = nan.reshape(-1, 2).any(1) if g.size != nan.size else nan
        bad &= ~nan
    return np.flatnonzero(bad)[:3].tolist()


def _call(collective, rank, size, rng, dtype, n, root):
    """(input, output) for one call: uneven counts, rank-dependent data."""
    counts = tuple(n + (i * 7 + 3) % 5 for i in range(size))
    if collective in ("all_reduce", "reduce", "broadcast"):
        data = _operand(rng, dtype, n)
        if collective == "broadcast":
            return None, data if rank == root else np.zeros(n, dtype)
        if collective == "reduce":
            return data, np.zeros(n, dtype) if rank == root else None
        return data, np.zeros(n, dtype)
    if collective == "reduce_scatter":
        return _operand(rng, dtype, sum(counts)), np.zeros(counts[rank], dtype)
    if collective == "all_gather":
        return _operand(rng, dtype, counts[rank]), np.zeros(sum(counts), dtype)
    if collective == "gather":
        return (_operand(rng, dtype, counts[rank]),
                np.zeros(sum(counts), dtype) if rank == root else None)
    if collective == "scatter":
        return (_operand(rng, dtype, sum(counts)) if rank == root else None,
                np.zeros(counts[rank], dtype))
    if collective == "all_to_all":
        return _operand(rng, dtype, n * size), np.zeros(n * size, dtype)
    raise ValueError(collective)


def _counts_arg(collective, n, size):
    if collective in ("reduce_scatter", "all_gather", "gather", "scatter"):
        return tuple(n + (i * 7 + 3) % 5 for i in range(size))
    return None


def _worker():
    from compiled_worker import compiled_world
    started = compiled_world()
    if started is None:
        return 0
    comm, rank, size = started
    from collectives import transports
    from collectives.algorithms import capabilities
    from collectives.algorithms.schedule import build_plan
    from collectives.errors import CollectiveError, CollectiveTimeout
    from collectives.executors import compiled
    from collectives.group import ProcessGroup
    from collectives.kernels.reduce import BFLOAT16, _SUPPORTED, dtype_kind
    from collectives.ops import ReduceOp
    if size == 3:
        # every scratch through the bounded pool, with a cap that evicts on nearly every call:
        # reused (stale) scratch must not change a bit
        compiled.KEEP_SCRATCH_BYTES = 0
        compiled.scratch_pool.cap = 256
    world = transports.create("mpi", rank=rank, world_size=size, timeout=60)
    group = ProcessGroup(world, backend="mpi")
    fast = group.execute
    from collectives.executors import host
    failures, cases, in_c = [], 0, 0
    dtypes = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
              np.uint32, np.uint64, np.float16, BFLOAT16, np.float32, np.float64,
              np.complex64, np.complex128]
    reducing = ("all_reduce", "reduce_scatter", "reduce")
    # roots matter to rooted collectives only; reduce, the slowest, keeps the non-zero one
    roots = {c: [0] for c in capabilities()}
    roots.update({c: sorted({0, size - 1}) for c in ("broadcast", "gather", "scatter")},
                 reduce=[size - 1])
    seed = 0
    for collective, algorithms in capabilities().items():
        for algorithm in algorithms:
            for dtype in map(np.dtype, dtypes):
                ops = (sorted(_SUPPORTED[dtype_kind(dtype)]) if collective in reducing
                       else [ReduceOp.SUM])
                sizes = (0, 1, 33) if collective == "all_reduce" and dtype.itemsize == 2 else (5,)
                for op in ops:
                    for n in sizes:
                        for root in roots[collective]:
                            seed += 1
                            if collective == "barrier":
                                for execute in (fast, host.execute):
                                    group.execute = execute
                                    group.prepare("barrier", algorithm=algorithm)()
                                continue
                            results = []
                            for execute in (fast, host.execute):
                                group.execute = execute
                                rng = np.random.default_rng(seed * 10 + rank)
                                inp, out = _call(collective, rank, size, rng, dtype, n, root)
                                with np.errstate(all="ignore"):
                                    group.prepare(collective, input=inp, output=out,
                                                  counts=_counts_arg(collective, n, size),
                                                  root=root, op=op, algorithm=algorithm,
                                                  timeout=30)()
                                results.append(out)
                            group.execute = fast
                            cases += 1
                            in_c += dtype in compiled._DTYPES or dtype == np.bool_
                            free = (dtype.kind in "fc" and dtype.itemsize >= 4
                                    and op in (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT))
                            bad = _differ(results[0], results[1], op, free)
                            if bad:
                                failures.append(
                                    f"rank {rank}: {collective}/{algorithm} {dtype.name} "
                                    f"{op.name} n={n} root={root}: compiled != host at {bad}: "
                                    f"{results[0][bad]} vs {results[1][bad]}")
    group.execute = fast

    def report(name, problems):
        flags = comm.allgather(problems)
        if rank == 0:
            merged = [p for part in flags for p in part]
            print("\n".join(merged) if merged else f"ok {name}", flush=True)
        return not any(flags)

    good = report("compiled == host", failures[:20])
    if rank == 0:
        print(f"cases {cases}\nin-C {in_c}", flush=True)
    good &= report("overlapped == host", _overlapped_cases(world, group, rank, size, root_of=roots))
    group.execute = fast

    if size == 1:
        good &= report("half kernels", _half_kernels(compiled))
        good &= report("signed zeros", _signed_zeros(compiled))
    else:
        good &= report("timeout", _timeout_case(world, fast, rank, size, comm,
                                                      CollectiveTimeout))
        good &= report("size mismatch", _mismatch_case(world, fast, rank, comm, CollectiveError,
                                                       CollectiveTimeout, build_plan))
        good &= report("overlapped timeout", _overlapped_timeout_case(world, rank, comm))
        good &= report("overlapped size mismatch", _overlapped_mismatch_case(world, rank, comm))
    comm.Barrier()
    if rank == 0:
        print("done", flush=True)
    return 0 if good else 1


def _timeout_case(world, execute, rank, size, comm, CollectiveTimeout):
    """Rank 0 runs an all_reduce alone: the C loop must give up at the deadline, cancel its
    receive, and raise CollectiveTimeout naming the step and peers."""
    from collectives.algorithms.schedule import build_plan
    import time
    problems = []
    if rank == 0:
        plan = build_plan("all_reduce", "ring", 0, size, 64)
        buf = np.ones(64, np.float32)
        start = time.monotonic()
        try:
            execute(plan, world, {"output": buf}, None, tag=(1 << 20) + 1, timeout=0.3,
                          operation="all_reduce", dtype=buf.dtype)
            problems.append("rank 0: no CollectiveTimeout")
        except CollectiveTimeout as exc:
            took = time.monotonic() - start
            if not (0.25 <= took < 5) or "step 1" not in str(exc) or "rank 0" not in str(exc):
                problems.append(f"rank 0: timeout after {took:.2f} s: {exc}")
    comm.Barrier()
    if rank == 1:   # the abandoned send: left unmatched, MPICH's finalize can kill the job
        comm.Recv(np.empty(64, np.float32), source=0, tag=(1 << 20) + 1)
    return problems


def _mismatch_case(world, execute, rank, comm, CollectiveError, CollectiveTimeout, build_plan):
    """Ranks 0 and 1 run all_gather with different counts: the short receive is a
    CollectiveError naming the sender and the byte count, the long one MPI's truncation,
    reported as a CollectiveError too (TransportError) - never garbage, never a hang."""
    problems = []
    if rank < 2:
        n = 8 if rank == 0 else 4
        plan = build_plan("all_gather", "ring", rank, 2, (n, n))
        inp, out = np.arange(n, dtype=np.int32), np.zeros(2 * n, np.int32)
        try:
            execute(plan, world, {"input": inp, "output": out}, None, tag=(1 << 20) + 3,
                          timeout=10, operation="all_gather", dtype=inp.dtype)
            problems.append(f"rank {rank}: mismatched counts went unnoticed")
        except CollectiveTimeout as exc:
            problems.append(f"rank {rank}: timed out instead of a size error: {exc}")
        except CollectiveError as exc:
            peer = 1 - rank
            if f"rank {peer}" not in str(exc):
                problems.append(f"rank {rank}: error does not name rank {peer}: {exc}")
    comm.Barrier()
    return problems


# The overlapped program in C: the same bits, the same failures

SEGMENT = 3          # elements per segment: every message of the cases above is cut


def _segmented(plan):
    from collectives.algorithms.transforms import segmented
    return plan.derived("_segmented", SEGMENT, lambda: segmented(plan, SEGMENT))


def _overlapped_executor(world):
    from collectives.algorithms import lowered
    from collectives.executors import compiled
    run = compiled.make_executor(world.comm, lowering=lowered.overlapped)

    def execute(plan, transport, buffers, reduce=None, **kw):
        return run(_segmented(plan), transport, buffers, reduce, **kw)
    return execute


def _overlapped_cases(world, group, rank, size, root_of):
    """Every collective x algorithm, segmented and run as the overlapped program by the C
    loop, against the host executor's step walk of the plain plan: the same bits."""
    from collectives.algorithms import capabilities
    from collectives.executors import host
    from collectives.kernels.reduce import BFLOAT16
    from collectives.ops import ReduceOp
    overlapped = _overlapped_executor(world)
    problems, seed = [], 10**6
    for collective, algorithms in capabilities().items():
        if collective == "barrier":
            continue
        for algorithm in algorithms:
            for dtype, op in ((np.float32, ReduceOp.SUM), (np.int64, ReduceOp.MAX),
                              (np.float16, ReduceOp.SUM), (BFLOAT16, ReduceOp.PRODUCT)):
                dtype = np.dtype(dtype)
                for root in root_of[collective]:
                    seed += 1
                    results = []
                    for execute in (overlapped, host.execute):
                        group.execute = execute
                        rng = np.random.default_rng(seed * 10 + rank)
                        inp, out = _call(collective, rank, size, rng, dtype, 7, root)
                        with np.errstate(all="ignore"):
                            group.prepare(collective, input=inp, output=out,
                                          counts=_counts_arg(collective, 7, size), root=root,
                                          op=op, algorithm=algorithm, timeout=30)()
                        results.append(out)
                    free = dtype.kind == "f" and dtype.itemsize >= 4 and op == ReduceOp.SUM
                    bad = _differ(results[0], results[1], op, free)
                    if bad:
                        problems.append(f"rank {rank}: {collective}/{algorithm} {dtype.name} "
                                        f"{op.name} root={root}: overlapped C != host at {bad}")
    return problems[:20]


def _drain(comm, source, tag, quiet=0.2):
    """Receive whatever ``source`` left unmatched on ``tag`` (sends a failed call gave up;
    left unmatched, MPICH's finalize can kill the job)."""
    import time
    from mpi4py import MPI
    status, last = MPI.Status(), time.monotonic()
    while time.monotonic() - last < quiet:
        if comm.Iprobe(source=source, tag=tag, status=status):
            comm.Recv(np.empty(status.Get_count(MPI.BYTE), np.uint8), source=source, tag=tag)
            last = time.monotonic()


def _overlapped_timeout_case(world, rank, comm):
    """Rank 0 runs a segmented all_reduce alone as the overlapped program: receives of several
    segments are in flight when the deadline passes. The C loop must raise CollectiveTimeout
    naming rank and step, and cancel every one of them: a message its ring predecessor sends
    afterwards on the same tag must land in rank 0's next receive, not in a forgotten one."""
    import time
    from collectives.algorithms.schedule import build_plan
    from collectives.errors import CollectiveTimeout
    problems, tag = [], (1 << 20) + 5
    if rank == 0:
        plan = build_plan("all_reduce", "ring", 0, comm.Get_size(), 64)
        buf = np.ones(64, np.float32)
        start = time.monotonic()
        try:
            _overlapped_executor(world)(plan, world, {"output": buf}, None, tag=tag,
                                        timeout=0.3, operation="all_reduce", dtype=buf.dtype)
            problems.append("rank 0: no CollectiveTimeout")
        except CollectiveTimeout as exc:
            took = time.monotonic() - start
            if not (0.25 <= took < 5) or "step 1 " not in str(exc) or "rank 0" not in str(exc) \
                    or "all_reduce (ring)" not in str(exc):
                problems.append(f"rank 0: timeout after {took:.2f} s: {exc}")
    comm.Barrier()
    size = comm.Get_size()
    if rank == 1:                   # the ring's successor: the sends rank 0 gave up
        _drain(comm, 0, tag)
    if rank == size - 1:            # the predecessor: what rank 0's receives were waiting for
        comm.Send(np.full(4, 7.0, np.float32), dest=0, tag=tag)
    elif rank == 0:
        got = np.zeros(4, np.float32)
        request, waited = comm.Irecv(got, source=size - 1, tag=tag), time.monotonic()
        while not request.Test() and time.monotonic() - waited < 10:
            time.sleep(0.001)
        if not np.array_equal(got, np.full(4, 7.0, np.float32)):
            request.Cancel()
            problems.append(f"rank 0: a receive of the timed-out call was left posted "
                            f"(the next message went elsewhere; got {got})")
    comm.Barrier()
    return problems


def _overlapped_mismatch_case(world, rank, comm):
    """Ranks 0 and 1 run a segmented all_gather with different counts as the overlapped
    program: a CollectiveError naming the peer (short or truncated message), never a hang.
    The counts are cut alike into different pieces (8: 4 + 4, 6: 3 + 3), so the first
    messages already disagree."""
    from collectives.algorithms.schedule import build_plan
    from collectives.errors import CollectiveError, CollectiveTimeout
    problems, tag = [], (1 << 20) + 7
    if rank < 2:
        n = 8 if rank == 0 else 6
        plan = build_plan("all_gather", "ring", rank, 2, (n, n))
        inp, out = np.arange(n, dtype=np.int32), np.zeros(2 * n, np.int32)
        try:
            _overlapped_executor(world)(plan, world, {"input": inp, "output": out}, None,
                                        tag=tag, timeout=10, operation="all_gather",
                                        dtype=inp.dtype)
            problems.append(f"rank {rank}: mismatched counts went unnoticed")
        except CollectiveTimeout as exc:
            problems.append(f"rank {rank}: timed out instead of a size error: {exc}")
        except CollectiveError as exc:
            if f"rank {1 - rank}" not in str(exc) or "all_gather (ring)" not in str(exc):
                problems.append(f"rank {rank}: error does not name rank {1 - rank}: {exc}")
        comm.Barrier()
        _drain(comm, 1 - rank, tag)
    else:
        comm.Barrier()
    comm.Barrier()
    return problems


def _signed_zeros(compiled):
    """float32/64 MIN and MAX in C on ties (0.0 vs -0.0) and NaNs: numpy's bits (b on ties).
    Random inputs almost never tie, so this is checked on purpose."""
    from collectives.ops import ReduceOp
    problems = []
    a = np.array([0.0, -0.0, 0.0, -0.0, np.nan, 1.0, -np.nan, 2.0] * 5)
    b = np.array([-0.0, 0.0, 0.0, -0.0, 1.0, np.nan, np.nan, 2.0] * 5)
    for code, dtype in ((0, np.float32), (1, np.float64)):
        x, y = a.astype(dtype), b.astype(dtype)
        for op, twin in ((ReduceOp.MIN, np.minimum), (ReduceOp.MAX, np.maximum)):
            got = np.empty_like(x)
            compiled._module.reduce_array(code, int(op), got, x, y)
            want = twin(x, y)
            bits = {4: np.uint32, 8: np.uint64}[x.itemsize]
            if not np.array_equal(got.view(bits), want.view(bits)):
                problems.append(f"{np.dtype(dtype).name} {op.name}: got {got[:8]}, numpy "
                                f"{want[:8]}")
    return problems


def _half_kernels(compiled):
    """float16 / bfloat16 in the executor's C loops, both the CPU-picked path (F16C where
    present, else F16C), at most F16C, and the portable scalar one, against the numpy twin on
    every bit pattern."""
    from collectives.kernels.reduce import BFLOAT16, reducer
    from collectives.ops import ReduceOp
    module = compiled._module
    problems = []
    rng = np.random.default_rng(7)
    every = np.arange(65536, dtype=np.uint16)
    other = rng.integers(0, 65536, every.size, dtype=np.uint16)
    for code, dtype in ((10, np.dtype(np.float16)), (11, BFLOAT16)):
        a, b = every.view(dtype), other.view(dtype)
        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
            want = np.empty_like(a)
            with np.errstate(all="ignore"):
                reducer(op, dtype)(want, a, b)
            for path in (-1, 1, 0):               # AVX-512, F16C / AVX2, portable C
                for length in (a.size, 23):       # the vector body and the scalar tail
                    got = np.empty_like(a[:length])
                    module.reduce_array(code, int(op), got, a[:length], b[:length], path)
                    inplace = a[:length].copy()
                    module.reduce_array(code, int(op), inplace, inplace, b[:length], path)
                    for result in (got, inplace):
                        bad = np.flatnonzero(result.view(np.uint16)
                                             != want[:length].view(np.uint16))
                        if bad.size:
                            i = bad[0]
                            problems.append(
                                f"{dtype.name} {op.name} path {path}: {bad.size} differ, "
                                f"first {hex(every[i])} op {hex(other[i])}: got "
                                f"{hex(result.view(np.uint16)[i])}, numpy "
                                f"{hex(want.view(np.uint16)[i])}")
    return problems


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(_worker())
