"""The α-β-γ cost model: predicted time of any registered schedule, and ``auto``'s choice.

A transfer of n bytes costs α + β·n; reducing n bytes costs γ·n; a local copy of n bytes
costs γ/2·n (a copy streams two operands where a reduction streams three, so copies are folded
into γ instead of carrying a fourth parameter). ``predict`` does not use hand formulas: it
builds every rank's plan and replays the program the executors run (``lowered.stepwise``:
post a step's transfers, wait for them, run its local operations), like the simulator
(rendezvous matching, FIFO per pair of ranks), with a clock per rank instead of data; so
what is priced is what runs (``replay`` prices any other lowering too):

- a rank posts a step when its previous step (transfers, then local operations) has ended;
- a transfer starts once both sides have posted it and both ports are free: every rank has
  one send port and one receive port (Thakur, Rabenseifner & Gropp, 2005: a rank sends one
  message and receives one message at a time, in both directions at once), so the sends of
  one step serialize (k messages cost kα + β·Σn) while a pairwise exchange costs α + β·n;
  transfers take a port in the order they become ready (first come, first served);
- a step ends when its last transfer ends, plus its local operations in order;
- the prediction is the latest final clock of any rank.

Terms past the classic three, each fitted to bench runs (BENCHMARKS.md §4 lists them) and off
unless a transport's defaults or its tuning file turn it on (``Params``' docstring has the
formulas; ``params.DEFAULTS`` which transports use them):

- ``ports``: a rank runs that many sends and receives at once; k messages of one step to k
  peers share its link (each no faster than k·β per byte), messages to one peer share that
  pair's link. NVLink GPUs move more to two peers at once than to one: without this term the
  model never sees why the bidirectional ring and the direct schedules win there.
- ``beta_small``/``beta_knee``: a per-byte rate that grows with the message (NCCL send/recv
  with large p2p chunks; no default uses it), under which fewer, larger messages
  (Rabenseifner) beat the ring on the largest messages.
- ``gamma_shared_bytes``: reductions of operands past the cache stream from memory bandwidth
  that all the host's ranks share: γ·p per byte. That is why the ring's small blocks beat
  Rabenseifner's half-vector first reduction on large reduce_scatters of many ranks.
- ``local_alpha``: a fixed cost per reduction or copy (a kernel launch on a GPU, a numpy call
  on a crowded host); it is what the bidirectional ring's and the direct schedules' extra
  reductions cost.
- ``spill_bytes``/``spill_factor``: the bytes of a message past Linux's TCP send buffer
  (tcp_wmem's maximum) cannot leave in the caller's own sendmsg; they wait for the receiver
  to drain and go through the progress thread, at about half the rate, so the ring's n/p-byte
  messages beat recursive doubling's n/4 + n/2 on large messages, which a flat β cannot see.
  The choices do not hinge on the exact spill point or factor.

α, β, γ are measured on a machine by ``collectives.calibration`` (a tool: ``bench.py
--calibrate``); the shape terms were fitted offline from bench runs. ``Params`` and the
defaults are in ``params.py``, the closed forms in ``formulas.py``; the tuning file is read
and written by ``collectives.tuning_file`` (this package does no I/O).

At powers of two this reproduces the classic formulas (``formula``; the tests hold the two
together), and it stays right where formulas are silent or approximate: uneven blocks, folded
non-powers of two, Bruck's rotations, a schedule nobody wrote a formula for. The price is one
plan per rank and one pass in Python over every transfer and local operation, which grows as
p² for the ring: cheap at a few ranks, seconds at hundreds. So ``predict`` is exact and can be
slow at scale, and ``estimate`` (what ``auto`` compares) switches to the closed form beyond
``COUNTED_MAX_SIZE`` ranks or ``COUNTED_WORK`` operations where one exists. Both are cached,
so a call shape is priced once.

Past one host, ``replay(..., hosts=, inter=)`` is the two-level model: messages between hosts
priced with the inter-host parameters (``params.INTER_HOST_DEFAULTS``) and sharing their
hosts' network links; ``two_level.py`` prices flat and hierarchical schedules with it.

Not modelled: contention inside the network (every pair of ranks has its own link, every
pair of hosts in the two-level model), eager vs
rendezvous protocols, per-step software overhead apart from α (the socket default's α is the
per-step cost inside a collective, larger than the ping-pong's that calibration measures),
cache effects on γ, overlap of reductions with transfers inside one step (the step walk does
not overlap them; the overlapped lowering, which the host executor runs for large messages on
transports that move data in the background, does, and ``replay(...,
lowering=lowered.overlapped)`` prices it).

Parameters come per transport, as arguments: ``DEFAULTS``, or what the decision table read
from the tuning file named by ``COLLECTIVES_TUNING`` (calibration writes it); a group whose
executor runs its plans on another medium than its transport's send/recv ranks with that
medium's defaults (``nccl_peer``: the executor's ``model_name``).
Every rank must see the same parameters, or ranks may choose different algorithms for one
call and deadlock: calibration broadcasts rank 0's fit, and a job's ranks must share one
tuning file. What no such model captures, a tuning run
can: ``bench.py --tune FILE`` stores each measured row's ratio to its prediction in the same
file, and ``ranking`` scales the predictions by them (``measured.py``).
"""
from __future__ import annotations

import collections
import functools
import math

from .formulas import copied_bytes, formula  # noqa: F401  (tests reach the closed forms here)
from .lowered import stepwise
from .measured import NONE as NO_CORRECTIONS
from .measured import Corrections
# The parameters, where the model's callers (the decision table, the bench) reach them.
from .params import (DEFAULTS, FALLBACK_TRANSPORT, HOST_SHARED_BYTES,  # noqa: F401
                     SHAPE_FIELDS, SOCKET_SPILL_BYTES, Params, default_params)
from .schedule import (COLLECTIVES, REGISTRY, Copy, auto_names, build_plan, is_family_name,
                       partition, plan_args, schedule_function)
from .replay_engine import Payload, Replay


# ---------------------------------------------------------------------------------------------
# Counted from the schedules: a timed replay of every rank's plan


def _local_cost(ops, itemsize, params, ranks) -> float:
    """Seconds of a run of local operations (one LOCAL instruction), in order."""
    cost = 0.0
    for op in ops:
        weight = 0.5 if isinstance(op, Copy) else 1.0
        nbytes = op.dst.count * itemsize
        cost += params.local_alpha + weight * params.gamma_at(nbytes, ranks) * nbytes
    return cost


def replay(plans, itemsize: int, params: Params, lowering=stepwise, *, hosts=None,
           inter: Params | None = None) -> float:
    """Predicted seconds for ``plans`` (one per rank, in rank order): see the module text.

    Each rank's program is ``lowering(plan)`` (``algorithms.lowered``; by default the step
    walk, which the executors run): a POST posts its transfers at the rank's clock; a WAIT
    ends when the last of its requests has ended; a LOCAL costs its operations. After a WAIT
    the rank runs the local operations of the same step, then queues to post again. The
    replay is ``replay_engine``'s (the simulator's too), carrying clocks (``_Clocks``).

    Two link classes: with ``hosts`` (rank -> host index) and ``inter``, a transfer between
    ranks of two hosts costs ``inter``'s α and β instead of ``params``' (which price the
    transfers inside a host and every local operation), and it also needs its hosts' network
    link: each host has ``inter.ports`` links out and as many in (rails), and a transfer holds
    one at each end for its β·n, not its α (latency overlaps; bytes share the link), so the
    ranks of a host that cross at once share its bandwidth."""
    clocks = _Clocks(len(plans), itemsize, params, hosts if inter is not None else None, inter)
    return max(Replay(plans, lowering, clocks).run(), default=0.0)


class _Clocks(Payload):
    """The cost model's payload: a clock per rank, a send and a receive port per rank (or
    ``ports`` of each), and with ``hosts`` each host's rails between hosts. The tag of a
    POST's receives (or sends): (when they were posted, how many go to (come from) each peer,
    how many in all)."""

    timed = True

    def __init__(self, size, itemsize, params, hosts, inter):
        self.itemsize, self.params, self.hosts, self.inter = itemsize, params, hosts, inter
        self.alpha, self.ports = params.alpha, params.ports
        self.link = params.link_beta or params.beta
        self.send_free = [[0.0] * params.ports for _ in range(size)]   # when each port is free
        self.recv_free = [[0.0] * params.ports for _ in range(size)]
        self.any_port = range(params.ports)
        self.sharing = size          # ranks whose reductions share one memory bandwidth
        if hosts is not None:
            self.rails = range(inter.ports)
            count = max(hosts, default=-1) + 1
            self.nic_out = [[0.0] * inter.ports for _ in range(count)]
            self.nic_in = [[0.0] * inter.ports for _ in range(count)]
            self.sharing = max(collections.Counter(hosts).values(), default=1)  # one host's

    def posted(self, rank, transfers, now):
        return now, _fan(transfers), len(transfers)

    def local(self, rank, ops, now):
        return now + _local_cost(ops, self.itemsize, self.params, self.sharing)

    def moved(self, src, dst, sent, into):
        (posted, fan_out, out_all), (taken, fan_in, in_all) = sent[3], into[3]
        out_free, in_free = self.send_free[src], self.recv_free[dst]
        out_port = min(self.any_port, key=out_free.__getitem__)
        in_port = min(self.any_port, key=in_free.__getitem__)
        start = max(posted, taken, out_free[out_port], in_free[in_port])
        nbytes = sent[0].region.count * self.itemsize
        hosts = self.hosts
        if hosts is not None and hosts[src] != hosts[dst]:
            # between hosts: the bytes hold a rail of each host's link, in arrival order
            outs, ins = self.nic_out[hosts[src]], self.nic_in[hosts[dst]]
            rail_out = min(self.rails, key=outs.__getitem__)
            rail_in = min(self.rails, key=ins.__getitem__)
            start = max(start, outs[rail_out], ins[rail_in])
            busy = self.inter.beta_at(nbytes) * nbytes
            outs[rail_out] = ins[rail_in] = start + busy
            end = start + self.inter.alpha + busy
        else:
            # messages to one peer share that pair's link (the bidirectional ring at
            # p = 2); messages running at once share the rank's link
            beta = self.params.beta_at(nbytes) * max(fan_out(dst), fan_in(src))
            together = min(self.ports, max(out_all, in_all))
            if together > 1:
                beta = max(beta, together * self.link)
            end = start + self.alpha + beta * nbytes
        out_free[out_port] = in_free[in_port] = end
        return end


def _one(peer) -> int:
    return 1


def _fan(transfers):
    """peer -> how many of ``transfers`` go to (come from) that peer."""
    if len(transfers) < 2:
        return _one
    fan: dict = {}
    for t in transfers:
        fan[t.peer] = fan.get(t.peer, 0) + 1
    return fan.__getitem__


@functools.lru_cache(maxsize=8192)
def _predict(collective, algorithm, size, args, itemsize, params, hosts=None,
             inter=None) -> float:
    plans = [build_plan(collective, algorithm, rank, size, *args) for rank in range(size)]
    return replay(plans, itemsize, params, hosts=hosts, inter=inter)


def predict(collective: str, algorithm: str, size: int, counts, root: int = 0,
            itemsize: int = 4, params: Params | None = None, *, transport: str = "",
            hosts=None, inter: Params | None = None) -> float:
    """Predicted seconds of ``algorithm`` for ``collective`` on ``size`` ranks; ``counts`` is
    the schedule's counts argument in elements (see ``schedule.plan_args``); ``params``
    default to ``transport``'s defaults (``default_params``; a machine's own come from
    ``tuning_file.load_params``). With ``hosts`` (rank -> host index, e.g. a Topology's
    ``host_map``) and ``inter``, the two-level model (``replay``): ``params`` inside a host,
    ``inter`` between hosts. Cached by all of its arguments."""
    _check(collective, algorithm, size)
    params = default_params(transport) if params is None else params
    if collective == "barrier":
        itemsize = 1                      # barrier tokens are one uint8 each
    args = plan_args(collective, size, _hashable(counts), root)
    if hosts is not None and inter is not None:
        hosts = tuple(hosts)
        if len(hosts) != size:
            raise ValueError(f"cost model: {collective} ({algorithm}): hosts name "
                             f"{len(hosts)} ranks' hosts, but the world has {size}")
        return _predict(collective, algorithm, size, args, itemsize, params, hosts, inter)
    return _predict(collective, algorithm, size, args, itemsize, params)


def _check(collective, algorithm, size):
    if collective not in COLLECTIVES:
        raise ValueError(f"cost model: unknown collective {collective!r}; known: "
                         f"{', '.join(COLLECTIVES)}")
    if is_family_name(algorithm):
        schedule_function(collective, algorithm)     # a ValueError saying what is wrong
    elif algorithm not in REGISTRY.get(collective, {}):
        raise ValueError(f"cost model: {collective} has no algorithm {algorithm!r}; valid: "
                         f"{', '.join(sorted(REGISTRY.get(collective, {})))}")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"cost model: world size must be a positive integer, got {size!r}")


def _hashable(counts):
    if counts is None or isinstance(counts, int):
        return counts
    return tuple(c if isinstance(c, int) else _hashable(c) for c in counts)


def uniform_counts(collective: str, size: int, nbytes: int, itemsize: int = 4):
    """The counts argument of a call whose size is ``nbytes`` as the process group reports it
    to ``auto``: the whole vector (all_reduce, broadcast, reduce), the whole input or output of
    p equal blocks (reduce_scatter, all_gather, gather), one rank's block (scatter), one rank's
    whole send buffer (all_to_all). Elements are ``itemsize`` bytes, rounded up."""
    count = -(-int(nbytes) // itemsize)
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count
    if collective in ("reduce_scatter", "all_gather", "gather"):
        return tuple(b.count for b in partition(count, size))
    if collective == "scatter":
        return (count,) * size
    if collective == "all_to_all":
        row = tuple(b.count for b in partition(count, size))
        return (row,) * size
    return None


def predict_bytes(collective: str, algorithm: str, size: int, nbytes: int,
                  params: Params, itemsize: int = 4) -> float:
    """``predict`` for a uniform call of ``nbytes`` (``uniform_counts``' convention)."""
    return predict(collective, algorithm, size, uniform_counts(collective, size, nbytes, itemsize),
                   0, itemsize, params)


# ``estimate`` (what ``auto`` compares) replays the schedules only where that is cheap:
# replaying walks every transfer and local operation of every rank in Python, and ``auto``
# must not stall a job for seconds on each new message size. Beyond COUNTED_MAX_SIZE ranks, or beyond
# COUNTED_WORK operations in all (rank 0's sends, receives and local operations times the
# world size), it takes the closed form where there is one.
COUNTED_MAX_SIZE = 64
COUNTED_WORK = 50_000
# Algorithms with no closed form: the replay's first-come-first-served ports chain the two
# directions of a bidirectional ring step (rank r's second send waits for a neighbour's
# receive port, and so on around the ring), so the counted time exceeds the one-port optimum
# of 2(α + (n/2p)β) per step by a factor that grows with p, and no formula reproduces it.
# Where counting is too dear, ``estimate`` prices them at infinity: ``auto`` skips them at
# scale (with one port the replay puts them above the one-way ring anyway: same β, more α;
# with two ports, as nccl has, they compete wherever the schedules are counted). The direct
# (one-shot) schedules likewise: one step of p-1 sends and p-1 receives per rank, which the
# greedy ports serve in matching order: up to ~2x (p = 8) above the ⌈(p-1)/k⌉(α + k·mβ)
# optimum once p-1 exceeds k = ports; with ports >= p-1 the replay is exactly α + (p-1)mβ
# (plus the local work). two_shot is two such steps (of n/p per message).
COUNTED_ONLY = frozenset({"ring_bidirectional", "direct", "two_shot"})


def counted_work(collective: str, algorithm: str, size: int, nbytes: int,
                 itemsize: int = 4) -> int:
    """About how many operations ``predict_bytes`` would replay (rank 0's times ``size``)."""
    args = plan_args(collective, size, uniform_counts(collective, size, nbytes, itemsize), 0)
    plan = build_plan(collective, algorithm, 0, size, *args)
    return size * sum(1 + len(s.sends) + len(s.recvs) + len(s.local) for s in plan.steps)


@functools.lru_cache(maxsize=8192)
def estimate(collective: str, algorithm: str, size: int, nbytes: int, params: Params,
             itemsize: int = 4) -> float:
    """Predicted seconds for a uniform call: counted from the schedules (``predict_bytes``)
    where that is cheap, else the closed form where there is one, else counted anyway."""
    closed = None
    if size > COUNTED_MAX_SIZE or counted_work(collective, algorithm, size, nbytes,
                                               itemsize) > COUNTED_WORK:
        total = nbytes * size if collective == "scatter" else nbytes    # formula's n
        closed = formula(collective, algorithm, size, total, params, itemsize, copies=True)
    if closed is not None:
        return closed
    if algorithm in COUNTED_ONLY and (size > COUNTED_MAX_SIZE or counted_work(
            collective, algorithm, size, nbytes, itemsize) > COUNTED_WORK):
        return math.inf
    return predict_bytes(collective, algorithm, size, nbytes, params, itemsize)


# ---------------------------------------------------------------------------------------------
# Choosing


def format_seconds(value: float) -> str:
    """A predicted time as ``auto``'s log and the decision table print it."""
    if not math.isfinite(value):
        return "inf"
    return f"{value * 1e6:.1f} us" if value < 1e-3 else f"{value * 1e3:.3f} ms"


def ranking(collective: str, size: int, nbytes: int, params: Params, candidates,
            itemsize: int = 4, corrections: Corrections = NO_CORRECTIONS
            ) -> list[tuple[float, str]]:
    """[(predicted seconds, name)] for every candidate, cheapest first: the model's estimate
    times the measured ratio where a tuning run left one (``measured.py``). Times equal to 12
    significant digits count as ties and go by name, so the order is a pure function of the
    arguments (every rank computes the same one)."""
    timed = [(estimate(collective, name, size, nbytes, params, itemsize)
              * corrections.factor(collective, size, name, nbytes), name)
             for name in candidates]
    return sorted(timed, key=lambda item: (float(f"{item[0]:.12g}"), item[1]))


def cheapest(collective: str, size: int, nbytes: int, transport: str = "", candidates=None, *,
             params: Params | None = None, itemsize: int = 4,
             corrections: Corrections | None = None) -> tuple[str, float]:
    """(name, predicted seconds) of the candidate with the least predicted time; candidates
    default to the algorithms ``auto`` may choose for ``collective`` (``auto_names``: the
    package's own and those registered with ``auto=True``); ``params`` to ``transport``'s
    defaults and ``corrections`` to none (a machine's own come from ``tuning_file``'s
    ``load_params`` and ``load_corrections``)."""
    if candidates is None:
        candidates = auto_names(collective)
    candidates = list(candidates)
    if not candidates:
        raise ValueError(f"cost model: no candidate algorithms for {collective}")
    for name in candidates:
        _check(collective, name, size)
    params = default_params(transport) if params is None else params
    corrections = NO_CORRECTIONS if corrections is None else corrections
    seconds, name = ranking(collective, size, nbytes, params, candidates, itemsize,
                            corrections)[0]
    return name, seconds



def clear_caches() -> None:
    """Forget cached predictions (after registering a schedule or changing parameters)."""
    _predict.cache_clear()
    estimate.cache_clear()


# Names whose home is ``collectives.tuning_file`` (the one reader and writer of the tuning
# file), answered here too for code that imports them from this module.
_MOVED = {"ENV_TUNING": "ENV_TUNING", "read_tuning": "read", "write_tuning": "write",
          "load_params": "load_params", "save_params": "save_params",
          "load_corrections": "load_corrections"}


def __getattr__(name):
    if name in _MOVED:
        from .. import tuning_file
        return getattr(tuning_file, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
