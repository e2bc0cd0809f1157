"""The cost model prices the lowered programs the executors run (``cost.replay`` walks each
rank's ``lowered.stepwise(plan)``). Its predictions must be those of the replay that walked
``plan.steps`` before: that replay is kept below, verbatim, as the reference, and the two are
held equal (to the bit) over every registered collective x algorithm, world sizes 2-9 and 16,
small to past-the-cache sizes, even and uneven counts, and the nccl, mpi and socket default
parameters (ports, β's knee, shared memory bandwidth, spill and local launches all on)."""
import heapq

import pytest

from collectives.algorithms import cost
from collectives.algorithms.cost import DEFAULTS, Params
from collectives.algorithms.lowered import overlapped
from collectives.algorithms.schedule import (REGISTRY, ROOTED, Copy, Matrix, Plan, Recv, Reduce,
                                             Region, Send, Step, build_plan, plan_args)
from collectives.algorithms.transforms import segmented
from collectives.errors import CollectiveError

# ---------------------------------------------------------------------------------------------
# The replay over plan.steps as it was, verbatim (only renamed).


def _old_local_cost(step, itemsize, params, ranks) -> float:
    cost = 0.0
    for op in step.local:
        weight = 0.5 if isinstance(op, Copy) else 1.0
        nbytes = op.dst.count * itemsize
        cost += params.local_alpha + weight * params.gamma_at(nbytes, ranks) * nbytes
    return cost


def old_replay(plans, itemsize: int, params: Params) -> float:
    """Predicted seconds for ``plans`` (one per rank, in rank order): see the module text."""
    size = len(plans)
    alpha, ports = params.alpha, params.ports
    link = params.link_beta or params.beta
    step_of = [0] * size
    outstanding = [0] * size
    posted_at = [0.0] * size      # when the rank posted its current step
    step_end = [0.0] * size       # when the last transfer of its current step ended
    send_free = [[0.0] * ports for _ in range(size)]   # when each send port is free again
    recv_free = [[0.0] * ports for _ in range(size)]
    fan_out = [{}] * size         # the current step's sends / receives: {peer: messages}
    fan_in = [{}] * size
    finished = [None] * size
    sends: dict = {}              # (src, dst) -> [counts posted, not yet matched] (FIFO)
    recvs: dict = {}
    events = [(0.0, rank) for rank in range(size)]   # (time, rank): the rank posts its next step

    def complete(rank):
        step = plans[rank].steps[step_of[rank]]
        end = step_end[rank] + (_old_local_cost(step, itemsize, params, size) if step.local
                                else 0.0)
        step_of[rank] += 1
        heapq.heappush(events, (end, rank))

    def match(src, dst):
        s, r = sends.get((src, dst)), recvs.get((src, dst))
        while s and r:
            sent, into = s.pop(0), r.pop(0)
            if sent != into:
                raise CollectiveError(
                    f"{plans[src].collective} ({plans[src].algorithm}): rank {src} step "
                    f"{step_of[src] + 1} sends {sent} elements to rank {dst}, whose step "
                    f"{step_of[dst] + 1} receives {into}")
            out_port = min(range(ports), key=send_free[src].__getitem__)
            in_port = min(range(ports), key=recv_free[dst].__getitem__)
            start = max(posted_at[src], posted_at[dst], send_free[src][out_port],
                        recv_free[dst][in_port])
            nbytes = sent * itemsize
            beta = params.beta_at(nbytes)
            # messages to one peer share that pair's link (the bidirectional ring at p = 2);
            # messages running at once share the rank's link
            same = max(fan_out[src].get(dst, 1), fan_in[dst].get(src, 1))
            beta *= same
            together = min(ports, max(sum(fan_out[src].values()), sum(fan_in[dst].values())))
            if together > 1:
                beta = max(beta, together * link)
            end = start + alpha + beta * nbytes
            send_free[src][out_port] = recv_free[dst][in_port] = end
            for rank in (src, dst) if src != dst else (src,):
                if end > step_end[rank]:
                    step_end[rank] = end
                outstanding[rank] -= 1
                if outstanding[rank] == 0:
                    complete(rank)

    while events:
        now, rank = heapq.heappop(events)
        steps = plans[rank].steps
        # steps without transfers run back to back, no need to go through the queue
        while step_of[rank] < len(steps) and not (steps[step_of[rank]].sends or
                                                   steps[step_of[rank]].recvs):
            now += _old_local_cost(steps[step_of[rank]], itemsize, params, size)
            step_of[rank] += 1
        if step_of[rank] == len(steps):
            finished[rank] = now
            continue
        step = steps[step_of[rank]]
        posted_at[rank] = step_end[rank] = now
        outstanding[rank] = len(step.sends) + len(step.recvs)
        fan_out[rank], fan_in[rank] = {}, {}
        for s in step.sends:
            fan_out[rank][s.peer] = fan_out[rank].get(s.peer, 0) + 1
        for r in step.recvs:
            fan_in[rank][r.peer] = fan_in[rank].get(r.peer, 0) + 1
        for r in step.recvs:
            recvs.setdefault((r.peer, rank), []).append(r.region.count)
        for s in step.sends:
            sends.setdefault((rank, s.peer), []).append(s.region.count)
        for r in step.recvs:
            match(r.peer, rank)
        for s in step.sends:
            match(rank, s.peer)

    stuck = [r for r in range(size) if finished[r] is None]
    if stuck:
        first = stuck[0]
        raise CollectiveError(
            f"{plans[first].collective} ({plans[first].algorithm}) deadlocks at world size "
            f"{size}: {len(stuck)} ranks never finish; rank {first} waits in step "
            f"{step_of[first] + 1}")
    return max(finished, default=0.0)


# ---------------------------------------------------------------------------------------------

PARAMS = {name: DEFAULTS[name] for name in ("nccl", "mpi", "socket")}
SIZES = [2, 3, 4, 5, 6, 7, 8, 9, 16]
# elements of 4 bytes: one, a few KiB, past the socket's 4 MiB spill, past the 16 MiB of
# shared memory bandwidth
COUNTS = [1, 1000, 3 << 20, 5 << 20]


def _counts(collective, size, count, uneven):
    """The schedule's counts argument: ``count`` elements for the vector collectives (odd
    when uneven), p blocks (uneven: each a different size), an all_to_all matrix."""
    extra = (lambda i: (i * 7 + 3) % 5) if uneven else (lambda i: 0)
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count + (3 if uneven else 0)
    if collective in ("reduce_scatter", "all_gather", "gather", "scatter"):
        return tuple(max(1, count // size) + extra(i) for i in range(size))
    if collective == "all_to_all":
        return Matrix(tuple(max(1, count // size // size) + extra(i + 2 * j)
                            for j in range(size)) for i in range(size))
    return None


def _plans(collective, algorithm, size, count, uneven):
    counts = _counts(collective, size, count, uneven)
    root = size - 1 if collective in ROOTED else 0
    args = plan_args(collective, size, counts, root)
    return [build_plan(collective, algorithm, rank, size, *args) for rank in range(size)]


CASES = [(c, a) for c in sorted(REGISTRY) for a in sorted(REGISTRY[c])]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_replay_of_the_lowered_programs_predicts_what_the_step_replay_did(collective,
                                                                          algorithm):
    checked = 0
    for size in SIZES:
        for count in COUNTS if collective != "barrier" else [1]:
            for uneven in (False, True):
                plans = _plans(collective, algorithm, size, count, uneven)
                itemsize = 1 if collective == "barrier" else 4
                for name, params in PARAMS.items():
                    want = old_replay(plans, itemsize, params)
                    got = cost.replay(plans, itemsize, params)
                    assert got == want, (collective, algorithm, size, count, uneven, name)
                    checked += 1
    assert checked >= len(SIZES) * 3


def _plan(rank, steps, size=2):
    return Plan("all_gather", "handmade", rank, size, tuple(steps), 0)


def test_replay_errors_name_the_steps_as_before():
    """Deadlocks and size mismatches: the same messages as the step replay's."""
    data = Region("output", 0, 4)
    later = [_plan(0, [Step(local=(Copy(data, Region("output", 4, 4)),)),
                       Step(recvs=(Recv(1, data),))]),
             _plan(1, [Step(recvs=(Recv(0, data),))])]
    mismatched = [_plan(0, [Step(), Step(sends=(Send(1, data),))]),
                  _plan(1, [Step(recvs=(Recv(0, Region("output", 0, 5)),))])]
    for plans in (later, mismatched):
        with pytest.raises(CollectiveError) as want:
            old_replay(plans, 4, DEFAULTS["mpi"])
        with pytest.raises(CollectiveError) as got:
            cost.replay(plans, 4, DEFAULTS["mpi"])
        assert str(got.value) == str(want.value)


def test_replay_prices_other_lowerings_of_the_same_plans():
    """Any lowering can be priced. Rank 1 receives two segments from rank 0 (one port, and
    the pair's link shared by the two: each takes α + 2nβ, the second ends at twice that)
    and reduces each (nγ): the step walk reduces both after both have arrived, the
    overlapped program reduces the first while the second arrives."""
    seg = [Region("scratch", 0, 100), Region("scratch", 100, 100)]
    out = [Region("output", 0, 100), Region("output", 100, 100)]
    plans = [_plan(0, [Step(sends=(Send(1, out[0]), Send(1, out[1])))]),
             _plan(1, [Step(recvs=(Recv(0, seg[0]), Recv(0, seg[1])),
                            local=(Reduce(out[0], out[0], seg[0]),
                                   Reduce(out[1], out[1], seg[1])))])]
    params = Params(alpha=1.0, beta=0.01, gamma=0.02)
    assert cost.replay(plans, 1, params) == pytest.approx(2 * 3.0 + 2 * 2.0)
    assert cost.replay(plans, 1, params, lowering=overlapped) == pytest.approx(2 * 3.0 + 2.0)
    # a segmented ring all_reduce: the pipelined program is the cheaper one
    for size in (3, 5, 8):
        plans = [segmented(p, 1 << 16) for p in _plans("all_reduce", "ring", size, 1 << 20,
                                                      True)]
        assert cost.replay(plans, 4, DEFAULTS["mpi"], lowering=overlapped) < \
            cost.replay(plans, 4, DEFAULTS["mpi"])
