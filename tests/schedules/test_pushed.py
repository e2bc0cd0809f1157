"""The peer-memory lowering (algorithms/pushed.py) and its flag protocol, on the CPU: every
registered schedule run by the pushed-form simulator (algorithms/pushed_sim.py: each rank's
program on several workers, interleaved at random, data moved in small pieces) against
numpy's answer, over consecutive calls that reuse the staging memory."""
import numpy as np
import pytest

from collectives.algorithms import capabilities, pushed, simulate
from collectives.algorithms.pushed_sim import CalledOtherwise, Group, InPlace, Stuck
from collectives.algorithms.schedule import (Matrix, Plan, Recv, Reduce, Region, Send, Step,
                                             buffer_sizes, build_plan, plan_args)
from collectives.algorithms.transforms import read_input_first
from collectives.kernels import peer_protocol

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


def _across_line_periods(period, seed):
    """Twelve all_reduce and all_gather calls, all in flagged lines, two large then two
    small in turn: a large call's tail lines are not written again until a later large call
    of the same parity, ``period`` calls on (the flags' wrap) for some of them."""
    group = Group(3, workers=2, seed=seed, period=period)
    calls = []
    for i in range(12):
        n = 40 if (i // 2) % 2 == 0 else 5
        collective, algorithm = ("all_reduce", "ring") if i % 3 else ("all_gather", "direct")
        counts = n if collective == "all_reduce" else (n, n, n)
        calls.append((collective, counts, _call(collective, algorithm, 3, counts, 0,
                                                seed * 100 + i)))
    group.run([c[2][0] for c in calls], eager=1 << 20, lines=1 << 20)
    for collective, counts, (_, inputs, outputs) in calls:
        _check(collective, 3, counts, 0, inputs, outputs)


@pytest.mark.parametrize("period", [4, 8])
def test_line_flags_wrap_without_a_stale_line_passing(period):
    """The lines' flag is the call modulo a period (plus one); each inbox half is zeroed
    once a period (peer_protocol.scrubs), so a line left a period ago never passes for this
    call's."""
    for seed in range(3):
        _across_line_periods(period, seed)


def test_line_flags_wrap_needs_the_zeroing(monkeypatch):
    """The calls above do meet stale lines: without the zeroing a result is wrong."""
    monkeypatch.setattr(peer_protocol, "scrubs", lambda call, period=pushed.LINE_PERIOD: None)
    with pytest.raises(AssertionError):
        for seed in range(3):
            _across_line_periods(4, seed)


def test_line_flag_and_scrubs():
    assert [pushed.line_flag(c, 4) for c in range(9)] == [1, 2, 3, 4, 1, 2, 3, 4, 1]
    assert [pushed.scrubs(c, 4) for c in range(8)] == [None, None, 1, 0, None, None, 1, 0]
    big = pushed.LINE_PERIOD
    assert pushed.line_flag((1 << 32) - 1) == big and pushed.line_flag(1 << 32) == 1
    assert 0 < pushed.line_flag(2 * big - 1) < 1 << 32     # fits the line's 32-bit half


def _seeded_call(collective, algorithm, p, counts, root, seed):
    """An out-of-place call whose output starts as garbage: the program must read input."""
    rng = np.random.default_rng(seed)
    entries, inputs, outputs = [], [], []
    for r in range(p):
        plan = build_plan(collective, algorithm, r, p, *plan_args(collective, p, counts, root))
        data = rng.integers(-50, 50, counts).astype(np.float64)
        out = np.full(counts, np.nan)
        entries.append((plan, data, out))
        inputs.append(data)
        outputs.append(out)
    return entries, inputs, outputs


@pytest.mark.parametrize("collective,algorithm",
                         [c for c in CASES if c[0] in ("all_reduce", "broadcast")])
@pytest.mark.parametrize("p,eager,lines", [(2, 0, 0), (3, 40, 40), (4, 1 << 20, 7), (8, 9, 9)])
def test_seeded_programs_read_input_and_shares_align(collective, algorithm, p, eager, lines):
    """Out of place, output not pre-filled: unwritten output is read from input and what the
    plan never writes copied at the end; workers' shares rounded as the kernel's (align)."""
    group = Group(p, workers=3, seed=p, align=4)
    for n in (1, 2 * p + 3, 64 * p + 5):
        calls = [_seeded_call(collective, algorithm, p, n, (n + 1) % p, seed)
                 for seed in range(3)]
        group.run([c[0] for c in calls], eager=eager, lines=lines, seeded=True)
        for _, inputs, outputs in calls:
            _check(collective, p, n, (n + 1) % p, inputs, outputs)


def _kinds(program):
    return [(int(row[0]), int(row[2])) for row in program.code]


def test_workers_meet_only_where_their_shares_differ():
    """Each worker's share of a region depends only on its count, so a ring all_reduce sent
    eagerly needs no grid barrier; recursive doubling (halves, then quarters of the vector)
    does. Rendezvous needs one before each epoch (every worker done with what the receive
    overwrites)."""
    plan = build_plan("all_reduce", "ring", 0, 4, 4096)
    for lines in (0, 4096):
        assert (pushed.BARRIER, 1) not in _kinds(pushed.lower(plan, 4096, lines))
    halving = build_plan("all_reduce", "recursive_doubling", 0, 4, 4096)
    assert (pushed.BARRIER, 1) in _kinds(pushed.lower(halving, 4096, 0))
    program = pushed.lower(plan, 0, 0)            # and one before the staged output's copy-out
    epochs = sum(1 for row in program.code if row[0] == pushed.EPOCH)
    assert _kinds(program).count((pushed.BARRIER, 1)) <= epochs + 1


def test_messages_in_lines_are_reduced_as_they_are_read():
    """A lone reduction of a message in lines reads it out of the inbox (REDUCE_LL); a chain
    of them (direct all_reduce: every vector folded into one, in rank order) is one REDUCE_N
    that polls each message's lines itself: no copy out of the inbox, no barrier between
    messages (4 GPUs at 4 KiB: 3 REDUCE_LL and 2 barriers, 7.6 of the kernel's 11.9 µs)."""
    ring = pushed.lower(build_plan("all_reduce", "ring", 0, 4, 1024), 1024, 1024, seeded=True)
    reduced = [row for row in ring.code if row[0] == pushed.REDUCE_LL]
    assert reduced and all(row[3] == -1 for row in reduced)   # not kept: nothing reads it
    for rank in range(4):
        plan = build_plan("all_reduce", "direct", rank, 4, 1024)
        program = pushed.lower(read_input_first(plan, 1024), 1024, 1024, seeded=True)
        kinds = [kind for kind, _ in _kinds(program)]
        assert kinds == [pushed.EPOCH] + [pushed.SEND_LL] * 3 + [pushed.REDUCE_N], rank
        assert not program.output_staged                     # input read, not copied
        row = program.code[-1]
        operands = pushed.chain_operands(row)
        peers = [pushed.decode_line_operand(x)[1] if x < 0 else rank for x in operands]
        assert peers == [0, 1, 2, 3] and operands[rank] == pushed.operand(
            Region("input", 0, 1024))


def test_eager_messages_are_reduced_straight_out_of_their_slots():
    """A chain reads eager messages (not in lines) out of the inbox after their ARRIVEs: no
    TAKE or TAKE_REDUCE each behind a barrier (two_shot at 4 MiB on 4 GPUs: three of each,
    6.5 of the kernel's 37 µs). The protocol model runs these programs in
    test_every_schedule_through_the_protocol (eager 1 MiB, lines 2), where dropping the
    ARRIVEs reads the inbox before the data lands."""
    for algorithm in ("direct", "two_shot"):
        for rank in range(4):
            plan = build_plan("all_reduce", algorithm, rank, 4, 4096)
            program = pushed.lower(read_input_first(plan, 4096), 1 << 20, 0, seeded=True)
            first = [(int(row[0]), row) for row in program.code if row[1] == 0]
            kinds = [kind for kind, _ in first]
            assert pushed.TAKE not in kinds and pushed.TAKE_REDUCE not in kinds, algorithm
            assert kinds.count(pushed.ARRIVE) == 3 and kinds.count(pushed.REDUCE_N) == 1
            row = next(row for kind, row in first if kind == pushed.REDUCE_N)
            assert kinds.index(pushed.ARRIVE) < kinds.index(pushed.REDUCE_N)
            buffers = [pushed.decode_operand(x)[0] for x in pushed.chain_operands(row)]
            assert buffers.count(pushed.INBOX) == 3 and pushed.INPUT in buffers, algorithm


def test_a_chain_sends_its_result_on_in_its_pass():
    """two_shot's reduction and the eager sends of the reduced block in the next step: one
    pass (SENDS_ON), no barrier between them (4 GPUs at 4 MiB: 2.8 µs of chain and a 0.9 µs
    barrier before 11.4 µs of sends that read the result back); in lines as well (1 MiB).
    Not plain sends after a chain that polls lines, nor where a send reads anything else
    (direct: no step after its chain)."""
    def rows(algorithm, rank, eager, lines):
        plan = build_plan("all_reduce", algorithm, rank, 4, 4096)
        return [tuple(int(x) for x in row) for row in
                pushed.lower(read_input_first(plan, 4096), eager, lines, seeded=True).code]

    for rank in range(4):
        code = rows("two_shot", rank, 1 << 20, 0)
        at = next(i for i, row in enumerate(code) if row[0] == pushed.REDUCE_N)
        assert code[at][5] == 4 | pushed.SENDS_ON and len(pushed.chain_operands(code[at])) == 4
        sends = code[at + 1:at + 4]
        assert [row[0] for row in sends] == [pushed.SEND] * 3            # no barrier between
        assert all(row[3:5] == code[at][2:4] and row[6] == code[at][4] for row in sends)
        assert code[at + 4][:2] != (pushed.SEND, sends[0][1])            # the whole batch
        polled = rows("two_shot", rank, 1 << 20, 1 << 20)        # polled, then sent in lines
        at = next(i for i, row in enumerate(polled) if row[0] == pushed.REDUCE_N)
        assert polled[at][5] & pushed.SENDS_ON and any(x < 0 for x in pushed.chain_operands(
            polled[at]))
        assert [row[0] for row in polled[at + 1:at + 4]] == [pushed.SEND_LL] * 3
        for row in rows("direct", rank, 1 << 20, 0):
            assert row[0] != pushed.REDUCE_N or not row[5] & pushed.SENDS_ON
    # a chain that polls lines, then plain sends of its result: the kernel's pass for plain
    # sends reads plain memory only, so they stay apart
    chain = (pushed.REDUCE_N, 0, pushed.OUTPUT, 0, 8, 2, pushed.line_operand(0, 1),
             pushed.operand(Region("input", 0, 8)))
    sends = [(pushed.SEND, 1, q, pushed.OUTPUT, 0, 16 * q, 8, 0) for q in (1, 2)]
    assert pushed._send_on([chain] + sends) == [chain] + sends
    plain = chain[:6] + (pushed.operand(Region("scratch", 0, 8)),) + chain[7:]
    assert pushed._send_on([plain] + sends)[0][5] == 2 | pushed.SENDS_ON


def test_a_chain_sends_its_result_on_after_the_epoch_of_rendezvous_sends():
    """Above the eager limit two_shot's second step posts its receives (a grid barrier, its
    epoch) before it pushes the reduced block: the chain moves after both into the pushes'
    pass, where nothing the epoch lets peers write meets it (4 GPUs at 1 GiB: the
    reduction's 0.4 ms of memory traffic, NVLink idle, between two 2.4 ms steps). A staged
    output's copy of the block out to the caller's output follows the pushes."""
    for symmetric in (False, True):
        for rank in range(4):
            plan = read_input_first(build_plan("all_reduce", "two_shot", rank, 4, 4096), 4096)
            code = [tuple(int(x) for x in row) for row in
                    pushed.lower(plan, 0, 0, seeded=True, symmetric=symmetric).code]
            at = next(i for i, row in enumerate(code) if row[0] == pushed.REDUCE_N)
            chain = code[at]
            assert chain[5] & pushed.SENDS_ON and code[at - 1][:3] == (pushed.EPOCH, 1, 1)
            pushes = code[at + 1:at + 4]
            assert [row[0] for row in pushes] == [pushed.PUSH] * 3
            assert all(row[3:5] == chain[2:4] and row[7] == chain[4] for row in pushes)
            after = code[at + 4]
            assert (after[0] == pushed.COPY and after[2] == pushed.CALLER_OUTPUT
                    and after[4:7] == chain[2:5]) != symmetric


def _slot(q, n):
    return Region("scratch", q * n, n)


def _sum_of_every_vector(rank, size, n, acc, total):
    """The first step of the research all_reduces below: every rank's output vector to every
    rank (rank q's into scratch slot q), summed in rank order through ``acc`` into
    ``total``."""
    out = Region("output", 0, n)
    xs = [out if q == rank else _slot(q, n) for q in range(size)]
    ops = [Reduce(acc, xs[0], xs[1])] + [Reduce(acc, acc, x) for x in xs[2:-1]]
    ops.append(Reduce(total, acc, xs[-1]))
    peers = [q for q in range(size) if q != rank]
    return Step(sends=tuple(Send(q, out) for q in peers),
                recvs=tuple(Recv(q, _slot(q, n)) for q in peers), local=tuple(ops))


def _sum_then_overwrite(rank, size, n):
    """Every vector to every rank, summed through a scratch accumulator into output; then
    each rank sends its sum to its left neighbour, which receives it where it received its
    right neighbour's vector in step 0: the chain reads that slot, so it must finish before
    the rank's epoch lets the neighbour write there, and cannot run in its sends' pass."""
    out = Region("output", 0, n)
    yield _sum_of_every_vector(rank, size, n, Region("scratch", size * n, n), out)
    right, left = (rank + 1) % size, (rank - 1) % size
    yield Step(sends=(Send(left, out),), recvs=(Recv(right, _slot(right, n)),))


def test_a_chain_does_not_pass_an_epoch_that_lets_peers_overwrite_what_it_reads(monkeypatch):
    """(A mutation that drops the check of the epoch's receives fails this.)"""
    from collectives.algorithms import schedule
    monkeypatch.setitem(schedule.REGISTRY["all_reduce"], "sum_then_overwrite",
                        _sum_then_overwrite)
    for p in (3, 4):
        for seed in range(3):
            group = Group(p, workers=2, seed=seed)
            calls = [_call("all_reduce", "sum_then_overwrite", p, 8, 0, seed * 10 + i)
                     for i in range(3)]
            group.run([c[0] for c in calls], eager=0, lines=0)
            for _, inputs, outputs in calls:
                _check("all_reduce", p, 8, 0, inputs, outputs)
        code = pushed.lower(build_plan("all_reduce", "sum_then_overwrite", 0, p, 8)).code
        assert all(row[0] != pushed.REDUCE_N or not row[5] & pushed.SENDS_ON for row in code)


def _sum_then_forward(rank, size, n):
    """An all_reduce written as research code would: every vector to every rank, summed in
    rank order through a scratch accumulator into output; then each rank forwards the
    vector it got from its right neighbour to its left one, which drops it in scratch. That
    vector is read outside the chain, so it must be taken out of the inbox; the others may
    be polled by the chain."""
    yield _sum_of_every_vector(rank, size, n, Region("scratch", (size + 1) * n, n),
                               Region("output", 0, n))
    right, left = (rank + 1) % size, (rank - 1) % size
    yield Step(sends=(Send(left, _slot(right, n)),),
               recvs=(Recv(right, Region("scratch", size * n, n)),))


def test_a_chain_polls_only_the_messages_nothing_else_reads(monkeypatch):
    from collectives.algorithms import schedule
    monkeypatch.setitem(schedule.REGISTRY["all_reduce"], "sum_then_forward", _sum_then_forward)
    for p in (3, 4):
        n = 8
        group = Group(p, workers=3, seed=p)
        calls = [_call("all_reduce", "sum_then_forward", p, n, 0, seed) for seed in range(3)]
        group.run([c[0] for c in calls], eager=1 << 20, lines=1 << 20)
        for _, inputs, outputs in calls:
            _check("all_reduce", p, n, 0, inputs, outputs)
        for rank in range(p):
            program = pushed.lower(build_plan("all_reduce", "sum_then_forward", rank, p, n),
                                   1 << 20, 1 << 20)
            kept = (rank + 1) % p
            taken = [int(row[2]) for row in program.code
                     if row[0] == pushed.TAKE_LL and row[1] == 0]
            assert taken == [kept]                  # copied out: sent on in step 1
            row = next(row for row in program.code if row[0] == pushed.REDUCE_N)
            polled = {pushed.decode_line_operand(x)[1] for x in pushed.chain_operands(row)
                      if x < 0}
            assert polled == set(range(p)) - {rank, kept}
            assert pushed.REDUCE_LL not in [int(row[0]) for row in program.code]


def test_which_messages_a_chain_may_poll():
    """``_inbox_runs`` on one step: a message the chain reads once and nothing else reads is
    polled; one read again later, read by an op before the chain, read twice by the chain,
    or landing in output is not."""
    s = [Region("scratch", 8 * k, 8) for k in range(6)]
    out = Region("output", 0, 8)

    def runs(ops, received, later=()):
        steps = (Step(recvs=tuple(Recv(1, r) for r in received), local=tuple(ops)),) + \
            ((Step(sends=tuple(Send(1, r) for r in later)),) if later else ())
        plan = Plan("all_reduce", "mine", 0, 2, steps, 64)
        in_lines = {r: (Recv(1, r), 16 * k, k) for k, r in enumerate(received)}
        return {first: sorted(x.offset for x in regions)
                for first, (_, regions) in pushed._inbox_runs(plan, 0, 0, in_lines).items()}
    chain = (Reduce(s[4], s[0], s[1]), Reduce(out, s[4], s[2]))
    assert runs(chain, s[:3]) == {0: [0, 8, 16]}
    assert runs(chain, s[:3], later=(s[1],)) == {0: [0, 16]}          # sent on later
    assert runs((Reduce(s[5], s[2], s[3]),) + chain, s[:3]) == {1: [0, 8]}  # read before
    twice = (Reduce(s[4], s[0], s[1]), Reduce(out, s[4], s[1]))
    assert runs(twice, s[:2]) == {0: [0]}
    landing_in_output = (Reduce(s[4], out, s[1]), Reduce(s[4], s[4], s[2]))
    assert runs(landing_in_output, [out, s[1], s[2]]) == {0: [8, 16]}
    assert runs(chain, []) == {}                    # nothing in lines: no such run


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


def test_blocks_follow_what_a_rank_sends_in_one_step_alike_on_every_rank():
    """A worker moves its share of every message of a step one after another, so the
    kernel's blocks come from a step's sum of messages, not its largest one: direct
    all_reduce on 4 ranks sends 3 whole vectors in its one step, ring one quarter per step.
    Every rank's program carries the same number (an uneven all_to_all included)."""
    n = 1000
    direct = [pushed.lower(build_plan("all_reduce", "direct", r, 4, n)) for r in range(4)]
    ring = [pushed.lower(build_plan("all_reduce", "ring", r, 4, n)) for r in range(4)]
    assert {p.busiest for p in direct} == {3 * n} and {p.largest for p in direct} == {n}
    assert {p.busiest for p in ring} == {n // 4}
    counts = Matrix(((0, 5, 6, 7), (9, 0, 0, 0), (1, 1, 0, 1), (0, 0, 2, 0)))
    programs = [pushed.lower(build_plan("all_to_all", "direct", r, 4, counts))
                for r in range(4)]
    assert {p.busiest for p in programs} == {5 + 6 + 7}     # rank 0's step
    assert {p.largest for p in programs} == {9}             # rank 1's one message


def test_messages_in_lines_have_an_inbox_of_their_own():
    """A line counts as arrived when its flag half holds the call's number. Plain data of an
    earlier call at the same bytes could hold that number (bfloat16 zeros and small integers
    did, on 2 GPUs: stale data taken for this call's lines), so line slots never share the
    inbox with other messages."""
    plan = build_plan("all_reduce", "ring", 0, 4, 4099)       # chunks of 1025 and 1024
    program = pushed.lower(plan, 4096, 1024)
    rows = {kind: [row for row in program.code if row[0] == kind]
            for kind in (pushed.SEND_LL, pushed.SEND)}
    assert rows[pushed.SEND_LL] and rows[pushed.SEND], "the plan mixes both kinds"
    for row in rows[pushed.SEND_LL]:         # slot, count: within the inbox of lines
        assert 0 <= row[5] and row[5] + 2 * row[6] <= program.line_inbox
    for row in rows[pushed.SEND]:
        assert 0 <= row[5] and row[5] + row[6] <= program.inbox


def test_staging_is_only_where_messages_land():
    plan = build_plan("reduce_scatter", "direct", 0, 4, (3, 3, 3, 3))
    program = pushed.lower(plan)
    assert not program.output_staged                 # receives land in scratch only
    plan = build_plan("all_gather", "ring", 0, 4, (3, 3, 3, 3))
    program = pushed.lower(plan)
    assert program.output_staged and program.staged_output == 12
    copies_out = [row for row in program.code
                  if row[0] == pushed.COPY and row[2] == pushed.CALLER_OUTPUT]
    assert sorted((int(r[3]), int(r[6])) for r in copies_out) == [(0, 3), (3, 3), (6, 3),
                                                                  (9, 3)]
    # each block copied out right after its last write, in the step that writes it (while
    # later messages still travel), not all after the plan
    steps = sorted(int(r[1]) for r in copies_out)
    assert steps[0] >= 0 and len(set(steps)) == len(plan.steps), steps


def test_a_plan_built_by_hand_is_refused_before_anything_moves():
    plan = Plan("all_reduce", "mine", 0, 2,
                (Step(sends=(Send(1, Region("output", 0, 4)),),
                      recvs=(Recv(1, Region("scratch", 0, 4)),)),), 4)
    with pytest.raises(ValueError, match="rank 0: the plan was built by hand"):
        pushed.lower(plan)


def test_share_covers_every_element_once():
    for count in (0, 1, 7, 64, 1001):
        for workers in (1, 3, 8):
            for align in (1, 4):
                spans = [pushed.share(count, w, workers, align) for w in range(workers)]
                assert spans[0][0] == 0 and spans[-1][1] == count
                assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
                assert all(lo % align == 0 for lo, _ in spans)


def test_a_plan_too_long_for_the_epoch_is_refused(monkeypatch):
    monkeypatch.setattr(pushed, "STEP_BITS", 2)        # 2 steps at most, instead of 2**24 - 2
    monkeypatch.setattr(peer_protocol, "STEP_BITS", 2)
    plan = build_plan("all_reduce", "ring", 0, 4, 64)  # 6 steps
    with pytest.raises(ValueError, match="does not fit the peer-memory epoch"):
        pushed.lower(plan)
    # 3 steps: the last step value is the in-place kernel's epoch (below every epoch of the
    # call's programs), so no program may use it
    plan = build_plan("all_reduce", "recursive_doubling", 0, 8, 64)
    assert len(plan.steps) == 3
    with pytest.raises(ValueError, match="does not fit the peer-memory epoch"):
        pushed.lower(plan)
    assert pushed.in_place_epoch(5) == (6 << 2) - 1


def test_a_chain_of_reductions_runs_as_one_pass():
    """direct's rank-order sum of p operands is one REDUCE_N where its messages wait for
    their receives, split into runs of at most FOLD operands (a last single reduction stays a
    REDUCE); the protocol
    model runs those programs in test_every_schedule_through_the_protocol."""
    for p in (3, 4, 8):
        for rank in (0, p // 2, p - 1):
            for algorithm in ("direct", "two_shot"):
                program = pushed.lower(build_plan("all_reduce", algorithm, rank, p, 1 << 12))
                kinds = [kind for kind, _ in _kinds(program)]
                passes = kinds.count(pushed.REDUCE_N) + kinds.count(pushed.REDUCE)
                assert passes == -(-(p - 1) // (pushed.FOLD - 1)), (algorithm, p, rank)
                assert pushed.REDUCE_N in kinds
    folded = [row for row in pushed.lower(build_plan("all_reduce", "direct", 2, 4, 64)).code
              if row[0] == pushed.REDUCE_N]
    # rank 2 sums scratch slots 0 and 1 (ranks 0, 1), its own output, slot 2 (rank 3)
    assert [pushed.decode_operand(x) for x in pushed.chain_operands(folded[0])] == \
        [(pushed.SCRATCH, 0), (pushed.SCRATCH, 64), (pushed.OUTPUT, 0), (pushed.SCRATCH, 128)]


def _reductions(*ops, later=()):
    """A one-rank plan of one step of local ``ops`` and a second step sending ``later``."""
    steps = (Step(local=tuple(ops)),) + ((Step(sends=tuple(Send(1, r) for r in later)),)
                                         if later else ())
    return Plan("all_reduce", "mine", 0, 2, steps, 64)


def test_a_chain_skips_only_results_nothing_reads():
    s = [Region("scratch", 8 * k, 8) for k in range(4)]
    out = Region("output", 0, 8)
    chain = (Reduce(s[0], s[0], s[1]), Reduce(out, s[0], s[2]), Reduce(out, out, s[3]))
    assert pushed._chains(_reductions(*chain), 0, 0, 3) == [(0, 3)]
    # the scratch result in between is sent later: it must be written, so no chain through it
    assert pushed._chains(_reductions(*chain, later=(s[0],)), 0, 0, 3) == [(1, 3)]
    # a result in between that lands in output is never skipped
    into_output = (Reduce(out, s[0], s[1]), Reduce(s[2], out, s[3]))
    assert pushed._chains(_reductions(*into_output), 0, 0, 2) == []
    # an operand that a result in between overwrites is read after it: no chain
    overwritten = (Reduce(s[1], s[0], s[2]), Reduce(out, s[1], s[1]))
    assert pushed._chains(_reductions(*overwritten), 0, 0, 2) == []
    # a destination overlapping an operand without being it: no chain
    shifted = (Reduce(s[0], s[0], s[1]), Reduce(Region("scratch", 12, 8), s[0], s[2]))
    assert pushed._chains(_reductions(*shifted), 0, 0, 2) == []
    # counts differ: no chain; and never more than FOLD operands in one
    assert pushed._chains(_reductions(Reduce(s[0], s[0], s[1]),
                                      Reduce(Region("output", 0, 4), Region("scratch", 0, 4),
                                             Region("scratch", 16, 4))), 0, 0, 2) == []
    long = [Reduce(out, out, Region("scratch", 8 * k, 8)) for k in range(10)]
    assert pushed._chains(_reductions(*long), 0, 0, 10) == [(0, pushed.FOLD - 1),
                                                           (pushed.FOLD - 1, 10)]


def test_grid_barriers_only_where_a_receive_or_the_copy_out_needs_one():
    """two_shot's second step receives into blocks its first step never touched (seeded: the
    sends read input) and its staged output is copied out block by block, as the blocks were
    written: no grid barrier at all. The ring's receives land, some steps later, where its
    earlier steps worked, so some of its epochs keep one."""
    for rank in range(4):
        program = pushed.lower(build_plan("all_reduce", "two_shot", rank, 4, 1 << 16),
                               seeded=True)
        assert program.output_staged and (pushed.BARRIER, 1) not in _kinds(program)
    ring = pushed.lower(build_plan("all_reduce", "ring", 0, 4, 1 << 16), seeded=True)
    assert (pushed.BARRIER, 1) in _kinds(ring)


def _fused(code):
    """[(sends, copies)]: each batch of a step's sends, and the COPY rows the kernel copies
    in the same batch (cuda_peer.cu, PUSH and SEND: the step's COPYs right after the batch,
    up to SENDS_ON_MAX rows with its last part; none after a chain that sends on)."""
    batches, i, n = [], 0, len(code)
    while i < n:
        row = code[i]
        if row[0] not in (pushed.PUSH, pushed.SEND):
            i += 1
            continue
        j = i + 1
        while j < n and code[j][0] == row[0] and code[j][1] == row[1]:
            j += 1
        reduced = i > 0 and code[i - 1][0] == pushed.REDUCE_N and \
            code[i - 1][5] & pushed.SENDS_ON
        last, f = (j - i - 1) % pushed.SENDS_ON_MAX + 1, 0
        while not reduced and j + f < n and code[j + f][0] == pushed.COPY and \
                code[j + f][1] == row[1] and last + f < pushed.SENDS_ON_MAX:
            f += 1
        batches.append((code[i:j], code[j:j + f]))
        i = j + f
    return batches


def _overlap(a, b):
    """Whether regions (buffer, offset, count) share an element."""
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2] and a[2] and b[2]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_copies_a_step_runs_beside_its_sends_touch_nothing_they_read(collective, algorithm):
    """The kernel copies a step's COPY rows that follow its sends with no barrier between in
    the same batch as the messages (a rank's own block beside its pushes): the lowering
    puts a barrier between accesses that conflict, so no such copy writes what a send of
    the batch reads, or what another such copy reads; checked on every rank's program of
    every schedule, seeded or not, symmetric or not, eager and lines or not. Some are
    fused (direct all_gather: the own block)."""
    fused = 0
    for p in (2, 3, 4, 5, 8):
        for n in (1, 2 * p + 3, 1000):
            counts = _counts(collective, p, n)
            args = plan_args(collective, p, counts, n % p)
            for rank in range(p):
                plan = build_plan(collective, algorithm, rank, p, *args)
                for seeded, symmetric, eager, lines in ((False, False, 0, 0),
                                                        (True, True, 3, 0),
                                                        (True, False, 1 << 20, 2)):
                    if not plan.args and collective != "barrier":
                        continue
                    program = pushed.lower(plan, eager, lines, seeded, symmetric)
                    for sends, copies in _fused(program.code.tolist()):
                        read = [(r[3], r[4], r[7] if r[0] == pushed.PUSH else r[6])
                                for r in sends]
                        for k, c in enumerate(copies):
                            fused += 1
                            others = read + [(x[4], x[5], x[6]) for x in copies if x is not c]
                            others += [(x[2], x[3], x[6]) for x in copies[:k]]
                            assert not any(_overlap((c[2], c[3], c[6]), x) for x in others), \
                                (p, n, rank, seeded, symmetric, sends, copies)
    if (collective, algorithm) == ("all_gather", "direct"):
        assert fused


@pytest.mark.parametrize("collective,algorithm",
                         [(c, a) for c, a in CASES if c in ("all_reduce", "all_gather",
                                                           "all_to_all", "broadcast")])
@pytest.mark.parametrize("p,symmetric", [(2, {0}), (3, {0, 1, 2}), (4, {1, 3})])
@pytest.mark.parametrize("eager,lines", [(0, 0), (1 << 20, 0), (1 << 20, 2)])
def test_symmetric_outputs_take_receives_directly(collective, algorithm, p, symmetric, eager,
                                                  lines):
    """Ranks whose output peers have mapped (symmetric memory) run unstaged programs; their
    senders write where each call's epochs say, ranks with staged outputs beside them; eager
    messages too, straight into the output where the receiver's first epoch says it takes
    them so (``pushed._direct``), into its inbox elsewhere."""
    group = Group(p, workers=3, seed=p)
    for n in (p - 1 or 1, 4 * p + 3):
        counts = _counts(collective, p, n)
        calls = [_call(collective, algorithm, p, counts, 0, seed, out_of_place=seed % 2)
                 for seed in range(3)]
        group.run([c[0] for c in calls], symmetric=symmetric, seeded=True, eager=eager,
                  lines=lines, direct=eager > 0)
        for _, inputs, outputs in calls:
            _check(collective, p, counts, 0, inputs, outputs)
    plan = build_plan("all_gather", "direct", 0, 4, (5, 5, 5, 5))
    assert pushed.lower(plan).output_staged
    unstaged = pushed.lower(plan, symmetric=True)
    assert not unstaged.output_staged
    assert not any(row[0] == pushed.COPY and row[2] == pushed.CALLER_OUTPUT
                   for row in unstaged.code)


def test_eager_messages_land_in_a_symmetric_output_directly_where_nothing_touches_it_first():
    """With ``direct`` (COLLECTIVES_PEER_DIRECT), a rank whose output is symmetric takes its
    eager messages after the first step into output from their senders directly (no copy out
    of the inbox: two_shot at 16 MiB on 4 GPUs, 4 µs of 93) where each is a TAKE and nothing
    of the call touches its region before: its TAKEs then only wait, its first epoch says
    so, and the SENDs to it carry where each lands. Not two_shot in place, whose first step
    sends the very blocks its second step receives; not a staged output; nothing of it
    without ``direct`` (the default)."""
    n = 4096
    for rank in range(4):
        seeded = read_input_first(build_plan("all_reduce", "two_shot", rank, 4, n), n)
        program = pushed.lower(seeded, 1 << 20, 0, seeded=True, symmetric=True, direct=True)
        code = [tuple(int(x) for x in row) for row in program.code]
        assert program.direct and code[0][:5] == (pushed.EPOCH, 0, 0, 1, 1)
        takes = [row for row in code if row[0] == pushed.TAKE]
        assert len(takes) == 3 and all(row[8] == 1 for row in takes)
        sends = [row for row in code if row[0] == pushed.SEND]
        chunk = n // 4
        assert [row[8] for row in sends] == [-1] * 3 + [rank * chunk] * 3   # output, step 2
        staged = pushed.lower(seeded, 1 << 20, 0, seeded=True, direct=True)
        assert not staged.direct and all(row[8] == 0 for row in staged.code
                                         if row[0] == pushed.TAKE)
        off = pushed.lower(seeded, 1 << 20, 0, seeded=True, symmetric=True)   # the default
        assert not off.direct and all(row[8] == -1 for row in off.code
                                      if row[0] == pushed.SEND)
        in_place = pushed.lower(build_plan("all_reduce", "two_shot", rank, 4, n), 1 << 20, 0,
                                symmetric=True, direct=True)
        assert not in_place.direct


def _sum_then_pass_on(rank, size, n):
    """An all_reduce in place: every vector to every rank (read out of output), summed into a
    scratch accumulator; then each rank sends its sum to its left neighbour, which receives
    it into output. Output is read in the first step, so a neighbour that wrote its sum
    there as soon as the call began could overwrite it before this rank has summed it."""
    acc = Region("scratch", size * n, n)
    yield _sum_of_every_vector(rank, size, n, acc, acc)
    yield Step(sends=(Send((rank - 1) % size, acc),),
               recvs=(Recv((rank + 1) % size, Region("output", 0, n)),))


def test_an_output_read_before_its_receive_is_not_taken_directly(monkeypatch):
    """(A mutation that lets a rank take eager messages into output directly although its
    call reads that output first fails this: the neighbour's sum lands before the rank has
    read its own vector.)"""
    from collectives.algorithms import schedule
    monkeypatch.setitem(schedule.REGISTRY["all_reduce"], "sum_then_pass_on", _sum_then_pass_on)
    for p in (3, 4):
        assert not pushed.lower(build_plan("all_reduce", "sum_then_pass_on", 0, p, 8),
                                1 << 20, 0, symmetric=True, direct=True).direct
        for seed in range(4):
            group = Group(p, workers=2, seed=seed)
            calls = [_call("all_reduce", "sum_then_pass_on", p, 8, 0, seed * 10 + i)
                     for i in range(3)]
            group.run([c[0] for c in calls], symmetric=set(range(p)), eager=1 << 20,
                      direct=True)
            for _, inputs, outputs in calls:
                _check("all_reduce", p, 8, 0, inputs, outputs)


def _direct_two_shot_runs(every_worker_says, seeds=20):
    """two_shot all_reduce on 4 ranks, every output symmetric, eager messages taken into
    them directly: how many of ``seeds`` interleavings gave every rank the right sum."""
    right = 0
    for seed in range(seeds):
        group = Group(4, workers=5, seed=seed)
        group.every_worker_says = every_worker_says
        calls = [_call("all_reduce", "two_shot", 4, 4 * 9 + 1, 0, seed * 10 + i,
                       out_of_place=True) for i in range(3)]
        group.run([c[0] for c in calls], symmetric={0, 1, 2, 3}, seeded=True, eager=1 << 20,
                  direct=True, piece=2)
        try:
            for _, inputs, outputs in calls:
                _check("all_reduce", 4, 4 * 9 + 1, 0, inputs, outputs)
            right += 1
        except AssertionError:
            pass
    return right


def test_a_send_after_a_message_from_its_receiver_takes_its_word_without_waiting():
    """two_shot's second step sends to ranks whose first step's messages it has taken: the
    kernel reads such a receiver's DIRECT word without waiting for its epoch (``synced``),
    which holds because every worker of the receiver writes the word before its first send.
    (Where only its first worker writes it, as before, another worker's message can arrive
    first: the sender then writes into the inbox of a rank that takes it from its output.)"""
    assert _direct_two_shot_runs(True) == 20
    assert _direct_two_shot_runs(False) < 20


# -- two_shot_in_place (kernels/cuda_peer.cu): the call in place on symmetric memory --------


def _in_place_calls(p, counts, seed):
    """Calls alternating the in-place kernel with programs of the same group: two_shot in
    place (each on a symmetric buffer of its own, poisoned), two_shot out of place into an
    ordinary output, ring in place. (calls, [(kind, want, outputs)])."""
    rng = np.random.default_rng(seed)
    calls, checks = [], []
    for i, n in enumerate(counts):
        data = [rng.integers(-50, 50, n).astype(np.float64) for _ in range(p)]
        want = np.sum(data, axis=0)
        plans = [build_plan("all_reduce", "two_shot", r, p, n) for r in range(p)]
        if i % 3 == 0:
            buffers = [np.full(n, np.nan) for _ in range(p)]
            calls.append([(plans[r], InPlace(data[r]), buffers[r]) for r in range(p)])
            checks.append(("in place", want, None))
        elif i % 3 == 1:
            outs = [np.full(n, -7.0) for _ in range(p)]
            calls.append([(plans[r], data[r], outs[r]) for r in range(p)])
            checks.append(("two_shot out of place", want, outs))
        else:
            outs = [d.copy() for d in data]
            calls.append([(build_plan("all_reduce", "ring", r, p, n), None, outs[r])
                          for r in range(p)])
            checks.append(("ring in place", want, outs))
    return calls, checks


def _run_in_place(p, counts, seed, workers=3, waits=None):
    group = Group(p, workers=workers, seed=seed, align=4)
    if waits:
        group.in_place_waits.update(waits)
    calls, checks = _in_place_calls(p, counts, seed)
    group.run(calls, symmetric=set(range(p)), in_place=set(range(p)), seeded=True,
              eager=4, lines=2, direct=True)
    wrong = []
    for r in range(p):
        finished = iter(group.finished[r])
        for i, (kind, want, outs) in enumerate(checks):
            got = next(finished) if outs is None else outs[r]
            if not np.array_equal(got, want):
                wrong.append(f"call {i} ({kind}) rank {r}")
    return wrong


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_two_shot_in_place_alternates_with_programs(p):
    """Every rank's buffer holds the sum after each in-place call, under random interleavings
    of workers and ranks, with program calls (eager and lines, out of place and in place)
    between them that reuse the same words: tallies, call numbers and epochs agree."""
    for seed in range(6):
        assert _run_in_place(p, (1, 37, 5, 1000, 3, 64, p - 1 or 1), seed) == [], seed


@pytest.mark.parametrize("wait", ["epochs", "delivered"])
def test_two_shot_in_place_needs_both_of_its_waits(wait):
    """Without the wait for each peer's epoch a rank reads a peer's buffer before the peer's
    contents are there; without the wait for every peer's delivered word a rank's call ends
    (its caller reads the buffer) while peers are still writing their blocks into it. Each
    gives wrong results in some interleaving (or reads the buffer of the call before)."""
    wrong = []
    for seed in range(12):
        try:
            wrong += _run_in_place(3, (200, 1, 1, 200), seed, waits={wait: False})
        except ValueError as exc:       # read a peer's buffer of the call before (its size)
            wrong.append(f"seed {seed}: {exc}")
    assert wrong


@pytest.mark.parametrize("theirs", ["two_shot in place", "all_gather"])
def test_a_rank_that_runs_the_program_is_named_before_the_buffer_changes(theirs):
    """Rank 0 runs the call in place; ranks 1 and 2 run a program: the same all_reduce on
    buffers that are not symmetric, or (calls that do not match) an all_gather whose
    rendezvous sends land in rank 0's output in their first step. Rank 0 stops at the first
    peer's epoch, naming it, before it reads or writes anything, and the peers' sends wait
    for an epoch of rank 0 that the in-place kernel never gives (``pushed.in_place_epoch``;
    with ``(call + 1) << STEP_BITS`` the all_gather wrote into rank 0's buffer in 7 of these
    40 interleavings), so rank 0's buffer keeps its contents."""
    n = 63
    data = [np.arange(n, dtype=np.float64) + 100 * r for r in range(3)]
    for seed in range(40):
        group = Group(3, workers=2, seed=seed)
        buffers = [np.full(n, np.nan) for _ in range(3)]
        calls = [[(build_plan("all_reduce", "two_shot", 0, 3, n), InPlace(data[0]),
                   buffers[0])]]
        for r in (1, 2):
            if theirs == "all_gather":
                calls[0].append((build_plan("all_gather", "direct", r, 3, (n // 3,) * 3),
                                 data[r][:n // 3], buffers[r]))
            else:
                calls[0].append((build_plan("all_reduce", "two_shot", r, 3, n),
                                 InPlace(data[r]), buffers[r]))
        with pytest.raises(CalledOtherwise) as raised:
            group.run(calls, symmetric={0}, in_place={0}, eager=0)   # rendezvous pushes
        assert raised.value.rank == 0 and raised.value.peer in (1, 2)
        np.testing.assert_array_equal(buffers[0], data[0])


# -- pipelined_reduce_scatter (kernels/cuda_peer.cu): pushes and reductions overlapped ------


KINDS = ("pipelined", "ring reduce_scatter", "direct all_reduce", "all_gather")


def _pipelined_calls(p, counts, seed, kinds=KINDS):
    """Calls alternating direct reduce_scatters (the pipelined kernel) with programs of the
    same group that use the same scratch slots and words: ring reduce_scatter, direct
    all_reduce (its receives reduced out of scratch), direct all_gather.
    (calls, [(kind, want per rank, outputs)])."""
    rng = np.random.default_rng(seed)
    calls, checks = [], []
    for i, n in enumerate(counts):
        data = [rng.integers(-50, 50, n * p).astype(np.float64) for _ in range(p)]
        total = np.sum(data, axis=0)
        kind = kinds[i % len(kinds)]
        if kind in ("pipelined", "ring reduce_scatter"):
            algorithm = "direct" if kind == "pipelined" else "ring"
            outs = [np.full(n, np.nan) for _ in range(p)]
            calls.append([(build_plan("reduce_scatter", algorithm, r, p, (n,) * p), data[r],
                           outs[r]) for r in range(p)])
            checks.append((kind, [total[r * n:(r + 1) * n] for r in range(p)], outs))
        elif kind in ("direct all_reduce", "pipelined all_reduce"):
            algorithm = "direct" if kind == "direct all_reduce" else "two_shot"
            outs = [np.full(n * p, np.nan) for _ in range(p)]
            calls.append([(build_plan("all_reduce", algorithm, r, p, n * p), data[r], outs[r])
                          for r in range(p)])
            checks.append((kind, [total] * p, outs))
        elif kind == "pipelined all_reduce in place":
            outs = [np.full(n * p, np.nan) for _ in range(p)]
            calls.append([(build_plan("all_reduce", "two_shot", r, p, n * p), InPlace(data[r]),
                           outs[r]) for r in range(p)])
            checks.append((kind, [total] * p, outs))
        elif kind in ("all_to_all", "ring all_to_all"):
            algorithm = "ring" if kind == "ring all_to_all" else "direct"
            outs = [np.full(n * p, np.nan) for _ in range(p)]
            calls.append([(build_plan("all_to_all", algorithm, r, p, ((n,) * p,) * p),
                           data[r], outs[r]) for r in range(p)])
            checks.append((kind, [np.concatenate([d[r * n:(r + 1) * n] for d in data])
                                  for r in range(p)], outs))
        else:                                  # "all_gather" (direct), "ring all_gather"
            algorithm = "ring" if kind == "ring all_gather" else "direct"
            outs = [np.full(n * p, np.nan) for _ in range(p)]
            calls.append([(build_plan("all_gather", algorithm, r, p, (n,) * p),
                           data[r][:n], outs[r]) for r in range(p)])
            checks.append((kind, [np.concatenate([d[:n] for d in data])] * p, outs))
    return calls, checks


def _run_pipelined(p, counts, seed, workers=4, chunks=3, pushers=2, waits=None, kinds=KINDS,
                   copy_engines=False, gathers=False, symmetric=()):
    """``copy_engines``: the all_reduces' gather and the direct all_gathers and all_to_alls
    are the copy engines' (those staged in ``chunks`` chunks); ``gathers``: else the
    pipelined kernel's (kinds 3, 4). Ranks in ``symmetric`` pass symmetric outputs."""
    group = Group(p, workers=workers, seed=seed, align=4, staging=1 << 14)
    if waits:
        group.pipelined_waits.update(waits)
    calls, checks = _pipelined_calls(p, counts, seed, kinds)
    group.run(calls, seeded=True, eager=4, lines=2, symmetric=symmetric, gathers=gathers,
              pipelined=(chunks, pushers, copy_engines), copied=chunks if copy_engines else 0)
    return [f"call {i} ({kind}) rank {r}" for i, (kind, want, outs) in enumerate(checks)
            for r in range(p) if not np.array_equal(outs[r], want[r])]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelined_reduce_scatter_alternates_with_programs(p):
    """Every rank's block holds the sum in rank order after each pipelined call, under random
    interleavings of ranks and workers (pushers and reducers), chunk counts that do and do
    not divide the blocks, with program calls between them that reuse the scratch slots,
    tallies, epochs and call numbers, and back to back."""
    for seed in range(5):
        for chunks, pushers in ((1, 1), (3, 2), (5, 3)):
            wrong = _run_pipelined(p, (40, 1, 9, 3, 37, 2, 5, 64), seed, chunks=chunks,
                                   pushers=pushers)
            assert wrong == [], (seed, chunks, pushers)
        assert _run_pipelined(p, (40, 40, 7, 40), seed, kinds=("pipelined",)) == [], seed


ALL_REDUCES = ("pipelined all_reduce", "all_gather", "pipelined",
               "pipelined all_reduce in place", "direct all_reduce", "ring reduce_scatter")


@pytest.mark.parametrize("copy_engines", [False, True], ids=["thread blocks", "copy engines"])
@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelined_all_reduce_alternates_with_programs(p, copy_engines):
    """two_shot all_reduces run by the same kernel (each rank's reduced block read by its
    peers straight into their outputs, chunk by chunk by thread blocks, or whole by the copy
    engines between the kernel's two launches), out of place and in place, every rank's
    output the sum in rank order, between programs that stage outputs where its slots and
    reduced block lie, reduce_scatters of the same kernel, and back to back."""
    for seed in range(5):
        for chunks, pushers in ((1, 1), (3, 2), (5, 3)):
            wrong = _run_pipelined(p, (40, 1, 9, 3, 37, 2, 5, 64, 12, 8, 33, 4), seed,
                                   chunks=chunks, pushers=pushers, kinds=ALL_REDUCES,
                                   copy_engines=copy_engines)
            assert wrong == [], (seed, chunks, pushers)
        assert _run_pipelined(p, (40, 40, 7, 40), seed, kinds=("pipelined all_reduce",),
                              copy_engines=copy_engines) == [], seed


@pytest.mark.parametrize("copy_engines", [False, True], ids=["thread blocks", "copy engines"])
@pytest.mark.parametrize("wait", ["reduced", "read"])
def test_pipelined_all_reduce_needs_both_of_its_waits(wait, copy_engines):
    """Without the wait for every reducer of a peer a rank reads that peer's reduced chunk
    (block) before it is there; without the wait for every peer's reads a rank's next call
    (an all_gather whose receives land where its reduced block lies) overwrites it while a
    slow peer still reads it. Each gives wrong results in some interleaving (fewer of them
    with the copy engines, whose copies run as one worker: 5 of the first 60 seeds)."""
    wrong = []
    for seed in range(30 if copy_engines else 12):
        wrong += _run_pipelined(3, (40, 40, 40, 40), seed, waits={wait: False},
                                kinds=("pipelined all_reduce", "ring all_gather"),
                                copy_engines=copy_engines)
    assert wrong


@pytest.mark.parametrize("wait", ["epochs", "chunks"])
def test_pipelined_reduce_scatter_needs_both_of_its_waits(wait):
    """Without the wait for each peer's epoch a pusher writes into a peer's scratch slot while
    the peer's call before (pipelined too) still reduces out of it; without the wait for
    every pusher's word a reducer reads a chunk before it is there. Each gives wrong results
    in some interleaving of back-to-back pipelined calls."""
    wrong = []
    for seed in range(12):
        wrong += _run_pipelined(3, (40, 40, 40, 40), seed, waits={wait: False},
                                kinds=("pipelined",))
    assert wrong


COPIED = ("all_gather", "pipelined all_reduce", "ring all_gather", "direct all_reduce",
          "all_to_all", "pipelined", "all_gather", "ring all_to_all", "all_to_all",
          "ring reduce_scatter", "pipelined all_reduce in place")


@pytest.mark.parametrize("p", [2, 3, 4])
def test_copy_engines_all_gather_and_all_to_all_alternate_with_programs(p):
    """Direct all_gathers and all_to_alls as the copy engines run them (each rank's input
    staged chunk by chunk beside the copies of every peer's block for it out of the peer's
    staging memory), every rank's output right, in 1, 3 and 5 chunks, between programs that
    stage into the same memory, the pipelined kernel's calls (its all_reduces gathered by
    the copy engines too), and back to back."""
    for seed in range(5):
        for chunks in (1, 3, 5):
            wrong = _run_pipelined(p, (40, 1, 9, 3, 37, 2, 5, 64, 12, 8, 33, 4, 20), seed,
                                   chunks=chunks, kinds=COPIED, copy_engines=True)
            assert wrong == [], (seed, chunks)
        for kind in ("all_gather", "all_to_all"):
            assert _run_pipelined(p, (40, 40, 7, 40), seed, kinds=(kind,),
                                  copy_engines=True) == [], (seed, kind)


@pytest.mark.parametrize("collective", ["all_gather", "all_to_all"])
@pytest.mark.parametrize("wait, before", [("staged", "direct all_reduce"),
                                          ("read", "ring all_gather")])
def test_copy_engines_all_gather_and_all_to_all_need_both_of_their_waits(wait, before,
                                                                          collective):
    """Without the wait for every peer's staged chunk a rank copies a peer's chunk before it
    is there (a peer still in its call before, or still staging); without the wait for
    every peer's reads a rank's next call (a ring all_gather receiving into its staging
    memory) overwrites the block a slow peer still copies. Each gives wrong results in some
    interleaving."""
    wrong = []
    for seed in range(30):
        wrong += _run_pipelined(3, (40, 40, 40, 40), seed, waits={wait: False},
                                kinds=(before, collective), copy_engines=True)
    assert wrong


# -- the pipelined kernel's direct all_gather and all_to_all (kinds 3, 4) -------------------


MOVES = ("all_gather", "ring all_gather", "all_to_all", "direct all_reduce", "all_to_all",
         "ring all_to_all", "all_gather", "ring reduce_scatter", "pipelined", "all_to_all",
         "pipelined all_reduce", "all_gather", "pipelined all_reduce in place")
MOVED_COUNTS = (40, 1, 9, 3, 37, 2, 5, 64, 12, 8, 33, 4, 20, 6)


def _moves_run(p, symmetric=()):
    """Every rank's output right in pipelined all_gathers and all_to_alls between programs
    and the kernel's other kinds (1, 3, 5 chunks), and back to back."""
    for seed in range(5):
        for chunks, pushers in ((1, 1), (3, 2), (5, 3)):
            wrong = _run_pipelined(p, MOVED_COUNTS, seed, chunks=chunks, pushers=pushers,
                                   kinds=MOVES, gathers=True, symmetric=symmetric)
            assert wrong == [], (seed, chunks, pushers, symmetric)
        for kind in ("all_gather", "all_to_all"):
            assert _run_pipelined(p, (40, 40, 7, 40), seed, kinds=(kind,), gathers=True,
                                  symmetric=symmetric) == [], (seed, kind, symmetric)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelined_all_gather_and_all_to_all_alternate_with_programs(p):
    """Direct all_gathers and all_to_alls run by the pipelined kernel (each rank's block
    pushed chunk by chunk into every peer's slot for it at the staging memory's start,
    copied out into the output beside the pushes), every rank's output right, between
    programs that stage outputs where the slots lie (ring all_gather and all_to_all, direct
    all_reduce, ring reduce_scatter), the kernel's reduce_scatters and all_reduces (out of
    place and in place), and back to back."""
    _moves_run(p)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_pipelined_all_gather_and_all_to_all_push_into_symmetric_outputs(p):
    """Where a rank's output is symmetric (its choice, said in the PLACE word before its
    epoch) peers push their blocks straight into it and it copies only its own; ranks with
    staged outputs beside it in the same call still take theirs in their slots: every
    output right, some ranks symmetric or all of them (the programs between them unstaged
    there too)."""
    for symmetric in ({0}, {1, 2} if p >= 3 else {1}, set(range(p))):
        _moves_run(p, symmetric)


@pytest.mark.parametrize("collective", ["all_gather", "all_to_all"])
@pytest.mark.parametrize("wait", ["epochs", "chunks"])
def test_pipelined_all_gather_and_all_to_all_need_their_waits(wait, collective):
    """Without the wait for each peer's epoch a pusher writes into a peer's slot while the
    peer's call before still copies out of it (or, where a peer's output is symmetric, it
    reads where the peer takes its block before the peer has said it: the place of the
    call before); without the wait for every pusher's word a copier reads a chunk before it
    is there. Each gives wrong results in some interleaving of back-to-back calls, outputs
    staged and one symmetric (one copier, behind three pushers: the pushers run ahead)."""
    for symmetric in ((), {1}):
        wrong = []
        for seed in range(8):
            wrong += _run_pipelined(3, (40,) * 8, seed, pushers=3, waits={wait: False},
                                    kinds=(collective,), gathers=True, symmetric=symmetric)
        assert wrong, symmetric
