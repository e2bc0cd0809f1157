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

Terms past the classic three, each measured in BENCHMARKS.md and off unless a transport's
defaults or its tuning file turn it on (``Params``' docstring has the formulas):

- ``ports`` (nccl: 2): a rank runs that many sends and receives at once; k messages of one
  step to k peers share its link (each no faster than k·β per byte), messages to one peer
  share that pair's link. The 4 x H200 p2p probe moved up to 1.7x more to two peers than to
  one at 4-64 MiB, the same at 256 MiB-1 GiB: with it the bidirectional ring wins where it
  measured fastest (16-256 MiB on 4 GPUs, all_to_all 1-256 MiB).
- ``beta_small``/``beta_knee`` (nccl: 144 GB/s for small messages, 335 GB/s for large,
  halfway at 60 MiB): NCCL send/recv's rate grows with the message (43 GB/s at 1 MiB, 355 GB/s
  at 1 GiB); fewer, larger messages (Rabenseifner) beat the ring at 1 GiB for that reason.
- ``gamma_shared_bytes`` (mpi, socket: 16 MiB): reductions of operands past the cache stream
  from memory bandwidth that all the host's ranks share: γ·p per byte. On 8 MPI ranks
  Rabenseifner's first 32 MiB reduction at 64 MiB took ~0.74 ns/B against ~0.05 for the
  ring's 8 MiB blocks (≈ 8 x the calibrated γ); the ring won reduce_scatter 1.84x there.
- ``local_alpha`` (nccl: 10 µs): each reduction or copy is a kernel launch; the bidirectional
  ring's extra reductions cost it the 16 MiB reduce_scatter on 4 GPUs.
- ``spill_bytes``/``spill_factor`` (socket: 4 MiB, 2x): the bytes of a message past Linux's
  4 MiB TCP send buffer (tcp_wmem's maximum) cannot leave in the caller's own sendmsg; they
  wait for the receiver to drain and go through the progress thread, at about half the rate.
  Two 4-rank runs (32- and 64-core hosts): ring steps of 4 MiB messages 2.6-3.6 GB/s, of 16 MiB
  ones 1.7-1.9 GB/s; so the ring's n/4-byte messages beat recursive doubling's n/4 + n/2 at
  16-64 MiB (reduce_scatter 1.40-1.58x, all_gather 1.25-1.64x), which the flat β could not see.
  Any spill point of 1-4 MiB and factor of 1.5-4 gives the same choices on both hosts.

``calibrate`` measures α, β, γ; the shape terms keep the transport's defaults (or what the
tuning file says): they were fitted offline from bench runs (``benchmarks/model_check.py``
replays a bench JSON through the model and shows what ``auto`` would pick).

At powers of two this reproduces the classic formulas (``formula``; the tests hold the two
together), and it stays right where formulas are silent or approximate: uneven blocks, folded
non-powers of two, Bruck's rotations, a schedule nobody wrote a formula for. The price is one
plan per rank and one pass over every transfer and local operation, 5-10 µs each in Python:
milliseconds at p = 8, seconds for the ring at p = 512. So ``predict`` is exact and can be
slow at scale, and ``estimate`` (what ``auto`` compares) switches to the closed form beyond
64 ranks or 50,000 operations where one exists. Both are cached; ``choose`` costs a dictionary
look-up (~1.5 µs) once a call shape has been seen.

Not modelled: contention inside the network (every pair of ranks has its own link), eager vs
rendezvous protocols, per-step software overhead apart from α (the socket default's α, 80 µs,
is the per-step cost inside a collective, twice the ping-pong's; ``calibrate`` measures the
ping-pong's), cache effects on γ, overlap of
reductions with transfers inside one step (the step walk does not overlap them; the
overlapped lowering, which the host executor runs for large messages on transports that move
data in the background, does, and ``replay(..., lowering=lowered.overlapped)`` prices it).

Parameters come per transport (``DEFAULTS``, or a tuning file named by ``COLLECTIVES_TUNING``
that ``calibrate`` + ``save_params`` write). Every rank must see the same parameters, or ranks
may choose different algorithms for one call and deadlock: ``calibrate`` broadcasts rank 0's
fit, and a job's ranks must share one tuning file. What no such model captures, a tuning run
can: ``bench.py --tune FILE`` stores each measured row's ratio to its prediction in the same
file, and ``ranking`` scales the predictions by them (``measured.py``).
"""
from __future__ import annotations

import collections
import functools
import heapq
import json
import math
import os
import time
from dataclasses import asdict, dataclass, replace

from .. import settings
from ..errors import CollectiveError
from .measured import NONE as NO_CORRECTIONS
from .measured import Corrections
from .measured import load as load_corrections
from .lowered import LOCAL, POST, stepwise
from .schedule import COLLECTIVES, REGISTRY, Copy, build_plan, partition, plan_args

ENV_TUNING = settings.TUNING.name


@dataclass(frozen=True)
class Params:
    """α: seconds per message; β: seconds per byte moved; γ: seconds per byte reduced
    (bytes of one operand; a copy costs γ/2 per byte). The terms past these three each
    default to "off", which is the classic one-port α-β-γ model:

    - ``ports``: how many sends and how many receives a rank runs at full speed at once
      (1: Thakur-Rabenseifner-Gropp's one port; NVLink/NVSwitch GPUs drive several peers).
      k messages of one rank's step that run together share its link: none of them moves
      faster than k·``link_beta`` seconds per byte (``link_beta`` 0: β itself).
    - ``beta_small``, ``beta_knee``: the per-byte cost of a message of m bytes is
      β(m) = β + (beta_small − β)·knee/(m + knee): ``beta_small`` for small messages, β for
      large ones, halfway at ``beta_knee`` bytes (0: β for every size).
    - ``gamma_shared_bytes``: a reduction whose operands are larger than this many bytes runs
      from memory while every rank of the host does the same, so it costs γ·p per byte
      instead of γ (0: off).
    - ``local_alpha``: fixed seconds per local operation (a reduction or copy): a kernel
      launch on a GPU (0: off).
    - ``spill_bytes``, ``spill_factor``: the bytes of one message past ``spill_bytes`` cost
      ``spill_factor`` times the per-byte cost of the bytes before them (a TCP send buffer
      that holds only so much; 0: off). Relative to β, so a calibrated β keeps the shape."""
    alpha: float
    beta: float
    gamma: float
    ports: int = 1
    link_beta: float = 0.0
    beta_small: float = 0.0
    beta_knee: float = 0.0
    gamma_shared_bytes: float = 0.0
    local_alpha: float = 0.0
    spill_bytes: float = 0.0
    spill_factor: float = 1.0

    def __post_init__(self):
        for name in ("alpha", "beta", "gamma", "link_beta", "beta_small", "beta_knee",
                     "gamma_shared_bytes", "local_alpha", "spill_bytes", "spill_factor"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"cost parameters: {name} must be a finite number >= 0, "
                                 f"got {value!r}")
        if not isinstance(self.ports, int) or isinstance(self.ports, bool) or self.ports < 1:
            raise ValueError(f"cost parameters: ports must be an integer >= 1, "
                             f"got {self.ports!r}")

    def beta_at(self, nbytes: float) -> float:
        """Seconds per byte of one message of ``nbytes`` bytes (its average over the
        message: the bytes past ``spill_bytes`` cost ``spill_factor`` times the rest)."""
        beta = self.beta
        if self.beta_knee > 0:
            beta += (self.beta_small - self.beta) * self.beta_knee / (nbytes + self.beta_knee)
        if 0 < self.spill_bytes < nbytes:
            beta *= 1.0 + (self.spill_factor - 1.0) * (nbytes - self.spill_bytes) / nbytes
        return beta

    def gamma_at(self, nbytes: float, ranks: int) -> float:
        """Seconds per byte of a reduction of ``nbytes``-byte operands on ``ranks`` ranks."""
        if 0 < self.gamma_shared_bytes < nbytes:
            return self.gamma * ranks
        return self.gamma


SHAPE_FIELDS = ("ports", "link_beta", "beta_small", "beta_knee", "gamma_shared_bytes",
                "local_alpha", "spill_bytes", "spill_factor")


# Defaults, used until a transport is calibrated (``python -m collectives.bench --calibrate``).
DEFAULTS = {
    # mpi4py over shared memory, driven by the Python host executor: MPI itself needs ~1 µs
    # per message, the executor's per-step Python (request objects, Waitall) ~4 µs more;
    # 5 GB/s is one core's copy bandwidth through MPICH's shared-memory channel (DESIGN.md:
    # the 2-core machine moves ~130 µs per MiB MPI_Allreduce); γ: numpy float32 add, one
    # thread, ~5 GB/s of output.
    "mpi": Params(alpha=5e-6, beta=1 / 5e9, gamma=1 / 5e9),     # shape: below
    # Python TCP over loopback (DESIGN.md: 3.3-4.2 GB/s); α: two syscalls, a frame header and
    # the selector loop per message, ~40 µs measured with gloo-like small messages.
    "socket": Params(alpha=4e-5, beta=1 / 3.5e9, gamma=1 / 5e9),   # shape: below
    # Threads of one process: a hand-off through a condition variable under the GIL is
    # ~10-20 µs; the copy is one memcpy (~1e10 B/s) but holds the GIL.
    "local": Params(alpha=1.5e-5, beta=1 / 8e9, gamma=1 / 5e9),
    # NCCL send/recv in a group call, with the transport's 64 KiB NVLink p2p chunks. Fitted
    # (benchmarks/fit_model.py) to the 4- and 2-GPU runs of every algorithm at 1 MiB-1 GiB on
    # H200s (BENCHMARKS.md §3, results/nccl_{4,2}xH200_direct*.json): α 20 µs per step's
    # group call (a lone 1 MiB send measured 19 µs); 335 GB/s per message, a GPU drives up to
    # three peers at once, together no faster than 239 GB/s each; γ: an elementwise kernel at
    # ~1 TB/s of output; local_alpha 30 µs: each reduction or copy is a CuPy kernel launched
    # from Python (direct's 1 MiB all_reduce: 26 µs of transfers + 3 reductions = 95 µs).
    # With these the median model error on those runs is x1.07 and auto's summed log regret
    # 0.91 over 32 rows (the defaults before the chunk change: 3.88).
    "nccl": Params(alpha=2e-5, beta=1 / 335e9, gamma=1 / 1e12, ports=3, link_beta=1 / 239e9,
                   local_alpha=3e-5),
}
# Ranks of one host stream reductions of operands past the cache from shared memory
# bandwidth: 8 MPI ranks (16-core host) reduced 32 MiB blocks at ~0.74 ns/B against
# ~0.05 ns/B for 8 MiB blocks, about γ·8 with the calibrated γ (BENCHMARKS.md §1, the
# 64 MiB reduce_scatter); the knee lies between 8 and 32 MiB.
HOST_SHARED_BYTES = 16 * 2**20
# Shape of the shared-memory MPI (fitted with benchmarks/fit_model.py to three 8-rank runs of
# every algorithm on a 64-core host, each with its own calibrated α, β, γ: results/
# mpi_8ranks_h200x4_64core_{direct,all_1,all_2}.json): a rank runs up to 4 transfers at once
# (the direct algorithms post 7), sharing its copy bandwidth, and each local operation costs
# 2 µs on top of its bytes (the direct all_reduce's 7 reductions). Summed log regret of auto
# over the 96 rows 5.5 against 7.2 with one port (an oracle that picks each row's winner
# from a repeat run scores 1.6 per 32 rows: the rest is run-to-run noise); neutral on the
# earlier 8-rank runs.
DEFAULTS["mpi"] = Params(5e-6, 1 / 5e9, 1 / 5e9, ports=4, gamma_shared_bytes=HOST_SHARED_BYTES,
                         local_alpha=2e-6)
# Socket, from the two 4-rank runs (benchmarks/results/socket_4ranks_h200x{2_32core_final,
# 4_64core}.json; fit in docs/notes/cost-model.md). α: a step inside a collective costs ~80 µs,
# twice the ping-pong's 40 µs (two thread hand-offs per message through the progress thread:
# 4 KiB recursive-doubling all_gather, 2 steps, 216-238 µs; ring all_reduce, 6 steps, 490-549
# µs). Spill: Linux caps a TCP send buffer at tcp_wmem's 4 MiB, so the caller's own sendmsg
# pushes at most that much; the rest of a larger message waits for the receiver to drain and
# goes through the progress thread at about half the rate (ring steps of 4 MiB messages ran at
# 2.6-3.6 GB/s, of 16 MiB messages at 1.7-1.9 GB/s). That is why the ring's p - 1 messages of
# n/p beat recursive doubling's n/4 + n/2 at 16-64 MiB on 4 ranks (reduce_scatter by 1.40-1.58x).
SOCKET_SPILL_BYTES = 4 * 2**20
# ports 3, local_alpha 40 µs (benchmarks/fit_model.py on the three TCP runs, the latest with
# the direct algorithms, results/socket_4ranks_h200x4_64core_tcp.json): the progress thread
# moves a step's messages to its p - 1 peers together (the direct algorithms), and each
# reduction or copy costs ~40 µs more than its bytes (a numpy call on a rank that shares the
# host's cores with the other ranks' progress threads). Summed log regret 1.00 against 2.25
# before over 39 rows; with the shared-memory path (same host, the default) 1.05 against 1.19.
DEFAULTS["socket"] = Params(8e-5, 1 / 3.5e9, 1 / 5e9, ports=3,
                            gamma_shared_bytes=HOST_SHARED_BYTES, local_alpha=4e-5,
                            spill_bytes=SOCKET_SPILL_BYTES, spill_factor=2.0)
# Transports without defaults of their own (tests' fakes, future ones) get the MPI numbers.
FALLBACK_TRANSPORT = "mpi"


def default_params(transport: str) -> Params:
    return DEFAULTS.get(transport, DEFAULTS[FALLBACK_TRANSPORT])


# ---------------------------------------------------------------------------------------------
# The tuning file: {transport: {"alpha": .., "beta": .., "gamma": .., shape terms,
#                               "measured": ratios (measured.py)}}


def read_tuning(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{ENV_TUNING}={path}: cannot read the tuning file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{ENV_TUNING}={path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{ENV_TUNING}={path}: expected an object {{transport: {{alpha, beta, "
                         f"gamma}}}}, got {type(data).__name__}")
    return data


def _params_from(entry, path: str, transport: str) -> Params:
    """α, β, γ from the entry; the shape terms (``SHAPE_FIELDS``) from the entry where it has
    them, else the transport's defaults (files written before those terms existed)."""
    default = default_params(transport)
    try:
        shape = {name: entry.get(name, getattr(default, name)) for name in SHAPE_FIELDS}
        shape = {name: (int(v) if name == "ports" else float(v)) for name, v in shape.items()}
        return Params(float(entry["alpha"]), float(entry["beta"]), float(entry["gamma"]),
                      **shape)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{ENV_TUNING}={path}: entry {transport!r} needs numbers alpha, beta, "
                         f"gamma >= 0 ({exc})") from exc


def load_params(transport: str, path: str | None = None) -> Params:
    """The parameters for ``transport``: from the tuning file (``path``, else the file named by
    ``COLLECTIVES_TUNING``) when it has an entry for it, else ``DEFAULTS``. A named file that
    cannot be read is a ValueError: silently falling back could make ranks disagree."""
    path = settings.TUNING() if path is None else path
    if path:
        entry = read_tuning(path).get(transport)
        if entry is not None:
            return _params_from(entry, path, transport)
    return default_params(transport)


def save_params(path: str, transport: str, params: Params) -> None:
    """Write (or replace) ``transport``'s entry in the tuning file at ``path``, atomically.
    Replacing drops the entry's measured ratios (``measured.py``): they were relative to the
    parameters it held."""
    data = read_tuning(path) if os.path.exists(path) else {}
    # α, β, γ always; a shape term only where it differs from the transport's default, which
    # is what loading fills in for a missing one (files stay readable by older versions)
    default = asdict(default_params(transport))
    data[transport] = {name: value for name, value in asdict(params).items()
                       if name not in SHAPE_FIELDS or value != default[name]}
    write_tuning(path, data)


def write_tuning(path: str, data: dict) -> None:
    """Replace the tuning file at ``path`` with ``data`` atomically (a rank reading it while
    it is rewritten sees the old file or the new one, never half of one)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


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


def replay(plans, itemsize: int, params: Params, lowering=stepwise) -> float:
    """Predicted seconds for ``plans`` (one per rank, in rank order): see the module text.

    Each rank's program is ``lowering(plan)`` (``algorithms.lowered``; by default the step
    walk, which the executors run): a POST posts its transfers at the rank's clock; a WAIT
    ends when the last of its requests has ended; a LOCAL costs its operations. After a WAIT
    the rank runs the local operations of the same step, then queues to post again."""
    size = len(plans)
    alpha, ports = params.alpha, params.ports
    link = params.link_beta or params.beta
    beta_at = params.beta_at
    programs = [lowering(plan).code for plan in plans]
    pc = [0] * size               # each rank's next instruction
    ended = [[] for _ in range(size)]   # per rank: request number -> when it ended (None: not yet)
    waiting = [None] * size       # the request numbers of the WAIT a rank stopped at
    left = [0] * size             # how many of them have not ended
    wait_end = [0.0] * size       # when the rank reached that WAIT, or a later end of its requests
    send_free = [[0.0] * ports for _ in range(size)]   # when each send port is free again
    recv_free = [[0.0] * ports for _ in range(size)]
    any_port = range(ports)
    finished = [None] * size
    # (src, dst) -> posted, not yet matched (FIFO): (count, request number, posted at, step,
    # messages of that POST to / from this peer, messages of that POST in all)
    sends: dict = {}
    recvs: dict = {}
    events = [(0.0, rank) for rank in range(size)]   # (time, rank): the rank posts next

    def complete(rank, end):
        """The rank's WAIT is over at ``end``: its step's local operations, then queue."""
        code, i = programs[rank], pc[rank]
        step = code[i][1]
        i += 1
        while i < len(code) and code[i][0] is LOCAL and code[i][1] == step:
            end += _local_cost(code[i][2], itemsize, params, size)
            i += 1
        pc[rank] = i
        heapq.heappush(events, (end, rank))

    def match(src, dst):
        s, r = sends.get((src, dst)), recvs.get((src, dst))
        while s and r:
            sent, into = s.popleft(), r.popleft()
            if sent[0] != into[0]:
                raise CollectiveError(
                    f"{plans[src].collective} ({plans[src].algorithm}): rank {src} step "
                    f"{sent[3] + 1} sends {sent[0]} elements to rank {dst}, whose step "
                    f"{into[3] + 1} receives {into[0]}")
            out_free, in_free = send_free[src], recv_free[dst]
            out_port = min(any_port, key=out_free.__getitem__)
            in_port = min(any_port, key=in_free.__getitem__)
            start = max(sent[2], into[2], out_free[out_port], in_free[in_port])
            nbytes = sent[0] * itemsize
            # messages to one peer share that pair's link (the bidirectional ring at p = 2);
            # messages running at once share the rank's link
            beta = beta_at(nbytes) * max(sent[4], into[4])
            together = min(ports, max(sent[5], into[5]))
            if together > 1:
                beta = max(beta, together * link)
            end = start + alpha + beta * nbytes
            out_free[out_port] = in_free[in_port] = end
            for rank, number in ((src, sent[1]), (dst, into[1])):
                ended[rank][number] = end
                wanted = waiting[rank]
                if wanted is not None and number in wanted:
                    if end > wait_end[rank]:
                        wait_end[rank] = end
                    left[rank] -= 1
                    if not left[rank]:
                        waiting[rank] = None
                        complete(rank, wait_end[rank])

    def post(rank, now, step, what):
        into, out = what
        mine = ended[rank]
        fan = _fan(into)
        for r in into:
            peer = r.peer
            queue = recvs.get((peer, rank))
            if queue is None:
                queue = recvs[(peer, rank)] = collections.deque()
            queue.append((r.region.count, len(mine), now, step, fan(peer), len(into)))
            mine.append(None)
        fan = _fan(out)
        for s in out:
            peer = s.peer
            queue = sends.get((rank, peer))
            if queue is None:
                queue = sends[(rank, peer)] = collections.deque()
            queue.append((s.region.count, len(mine), now, step, fan(peer), len(out)))
            mine.append(None)
        for r in into:
            match(r.peer, rank)
        for s in out:
            match(rank, s.peer)

    while events:
        now, rank = heapq.heappop(events)
        code = programs[rank]
        while pc[rank] < len(code):
            kind, step, what = code[pc[rank]]
            if kind is LOCAL:
                now += _local_cost(what, itemsize, params, size)
            elif kind is POST:
                post(rank, now, step, what)
            else:                 # WAIT: always the end of this turn
                numbers = range(what.start, what.stop) if what.__class__ is slice else what
                mine, end, pending = ended[rank], now, 0
                for number in numbers:
                    done = mine[number]
                    if done is None:
                        pending += 1
                    elif done > end:
                        end = done
                if pending:
                    waiting[rank], left[rank], wait_end[rank] = numbers, pending, end
                else:
                    complete(rank, end)
                break
            pc[rank] += 1
        else:
            finished[rank] = now

    stuck = [r for r in range(size) if finished[r] is None]
    if stuck:
        first = stuck[0]
        code = programs[first]
        raise CollectiveError(
            f"{plans[first].collective} ({plans[first].algorithm}) deadlocks at world size "
            f"{size}: {len(stuck)} ranks never finish; rank {first} waits in step "
            f"{code[min(pc[first], len(code) - 1)][1] + 1}")
    return max(finished, default=0.0)


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
def _predict(collective, algorithm, size, args, itemsize, params) -> float:
    plans = [build_plan(collective, algorithm, rank, size, *args) for rank in range(size)]
    return replay(plans, itemsize, params)


def predict(collective: str, algorithm: str, size: int, counts, root: int = 0,
            itemsize: int = 4, params: Params | None = None, *, transport: str = "") -> float:
    """Predicted seconds of ``algorithm`` for ``collective`` on ``size`` ranks; ``counts`` is
    the schedule's counts argument in elements (see ``schedule.plan_args``); ``params``
    default to ``load_params(transport)``. Cached by all of its arguments."""
    _check(collective, algorithm, size)
    params = load_params(transport) if params is None else params
    if collective == "barrier":
        itemsize = 1                      # barrier tokens are one uint8 each
    args = plan_args(collective, size, _hashable(counts), root)
    return _predict(collective, algorithm, size, args, itemsize, params)


def _check(collective, algorithm, size):
    if collective not in COLLECTIVES:
        raise ValueError(f"cost model: unknown collective {collective!r}; known: "
                         f"{', '.join(COLLECTIVES)}")
    if algorithm not in REGISTRY.get(collective, {}):
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
# replaying costs ~5-10 µs per transfer or local operation in Python, and ``auto`` must not
# stall a job for seconds on each new message size. Beyond COUNTED_MAX_SIZE ranks, or beyond
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
# (plus the local work).
COUNTED_ONLY = frozenset({"ring_bidirectional", "direct"})


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
# Closed forms (Thakur, Rabenseifner & Gropp, "Optimization of collective communication
# operations in MPICH", 2005), for the schedules as this package writes them


def formula(collective: str, algorithm: str, p: int, nbytes: float, params: Params,
            itemsize: int = 4, *, copies: bool = False) -> float | None:
    """Closed-form seconds, or None where this package has no formula for the pair.

    ``nbytes`` is n in the paper's sense: the whole vector (all_reduce, broadcast, reduce),
    all p blocks (reduce_scatter, all_gather, gather, scatter), one rank's send buffer
    (all_to_all). Exact for the schedules at powers of two with n divisible by p (data-moving
    schedules then differ from the counted model only by their local copies, γ/2 per byte);
    ``itemsize`` matters where a schedule switches shape at an element count.

    ``copies=True`` adds the local copies on the schedule's critical path (γ/2 per byte,
    ``copied_bytes``), which makes the closed form equal to the counted model wherever the
    tests say so; ``estimate`` uses it that way at large world sizes."""
    closed = _textbook(collective, algorithm, p, nbytes, params, itemsize)
    if closed is None or not copies:
        return closed
    return closed + 0.5 * params.gamma * copied_bytes(collective, algorithm, p, nbytes)


def copied_bytes(collective: str, algorithm: str, p: int, nbytes: float) -> float:
    """Bytes copied locally on the critical path of the schedule (n as in ``formula``),
    read off the schedules: the own block filed into the output (n/p), Bruck's rotation (n)
    and packing (the slots of every round), the tree all_to_all's rearrangement at its root.
    Exact at powers of two; an upper bound where Bruck's slots happen to lie back to back."""
    if p == 1:
        return 0.0
    block, lg = nbytes / p, math.ceil(math.log2(p))
    power = p & (p - 1) == 0
    if collective in ("all_gather", "gather", "scatter", "all_to_all") and algorithm == "ring":
        return block
    if algorithm == "recursive_doubling" and collective in ("gather", "scatter"):
        algorithm = "tree"            # the same schedules are registered under both names
    if algorithm == "recursive_doubling":
        if collective == "all_gather":
            return block if power else block + nbytes
        if collective == "all_to_all":
            return (_bruck_slots(p) + p) * block
    if algorithm == "tree":
        if collective in ("all_gather", "gather"):
            return block
        if collective in ("scatter", "reduce_scatter"):
            return max(1, lg - 1) * block       # own blocks along the way down
        if collective == "all_to_all":
            return (p + lg + (1 if p == 2 else 0)) * nbytes
    return 0.0


def _bruck_slots(p: int) -> int:
    """Blocks Bruck sends in all: round k sends the slots j < p that have bit k set."""
    return sum((p >> (k + 1) << k) + max(0, p % (2 << k) - (1 << k))
               for k in range(math.ceil(math.log2(p))))


def _textbook(collective, algorithm, p, nbytes, params, itemsize):
    a, b, g = params.alpha, params.beta, params.gamma
    n = float(nbytes)
    if p == 1:
        return None                   # only local copies, no formula to speak of
    lg = math.ceil(math.log2(p))
    frac = (p - 1) / p
    pof2 = 1 << (p.bit_length() - 1)
    power = pof2 == p
    count = -(-int(nbytes) // itemsize)
    # MPICH folding for non-powers of two: the extra ranks hand their vector over and get the
    # result back: 2α + 2nβ + nγ on top of the p'-rank algorithm.
    fold = 0.0 if power else 2 * a + 2 * n * b + n * g
    lgf, fracf = int(math.log2(pof2)), (pof2 - 1) / pof2
    if algorithm == "ring":
        if collective == "all_reduce":
            return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g
        if collective == "reduce_scatter":
            return (p - 1) * a + frac * n * (b + g)
        if collective in ("all_gather", "all_to_all", "gather", "scatter"):
            return (p - 1) * a + frac * n * b
        if collective == "reduce":
            return 2 * (p - 1) * a + 2 * frac * n * b + frac * n * g
        if collective == "broadcast":
            from .ring import segment_count
            s = segment_count(count, p)
            return (p + s - 2) * (a + (n / s) * b)
        if collective == "barrier":
            return (2 * p - 1) * (a + b)
    if algorithm == "recursive_doubling":
        from .recursive_doubling import BROADCAST_SCATTER_MIN_BLOCK, RABENSEIFNER_MIN_BLOCK
        if collective == "all_reduce":
            if count >= RABENSEIFNER_MIN_BLOCK * pof2:       # Rabenseifner
                return fold + 2 * lgf * a + 2 * fracf * n * b + fracf * n * g
            return fold + lgf * (a + n * b + n * g)
        if collective == "reduce_scatter":
            return fold + lgf * a + fracf * n * (b + g)
        if collective == "reduce":     # the folded ranks only hand their vector over
            fold = 0.0 if power else a + n * b + n * g
            return fold + 2 * lgf * a + 2 * fracf * n * b + fracf * n * g
        if collective in ("all_gather", "gather", "scatter"):
            return lg * a + frac * n * b
        if collective == "all_to_all":
            # Bruck: round k sends the slots j < p with bit k set, n/p bytes each
            return lg * a + _bruck_slots(p) * (n / p) * b
        if collective == "broadcast":
            if count >= BROADCAST_SCATTER_MIN_BLOCK * p:     # van de Geijn
                allgather = lg * a if power else (p - 1) * a
                return lg * a + allgather + 2 * frac * n * b
            return lg * (a + n * b)
        if collective == "barrier":
            return lg * (a + b)
    if algorithm == "tree":                                 # binomial trees, one-port
        if collective == "broadcast":
            return lg * (a + n * b)
        if collective == "reduce":
            return lg * (a + n * b + n * g)
        if collective in ("gather", "scatter"):
            return lg * a + frac * n * b
        if collective == "all_reduce":
            return 2 * lg * a + 2 * lg * n * b + lg * n * g
        if collective == "reduce_scatter":
            return 2 * lg * a + (lg + frac) * n * b + lg * n * g
        if collective == "all_gather":
            return 2 * lg * a + (lg + frac) * n * b
        if collective == "all_to_all":     # gather everything to rank 0, scatter it back
            return 2 * lg * a + 2 * (p - 1) * n * b
        if collective == "barrier":
            return 2 * lg * (a + b)
    return None


# ---------------------------------------------------------------------------------------------
# Choosing


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


def choose(collective: str, size: int, nbytes: int, transport: str = "", candidates=None, *,
           params: Params | None = None, itemsize: int = 4,
           corrections: Corrections | None = None) -> tuple[str, float]:
    """(name, predicted seconds) of the candidate with the least predicted time; candidates
    default to every registered algorithm of ``collective``; ``params`` and ``corrections``
    to the transport's from the tuning file (``COLLECTIVES_TUNING``), else its defaults."""
    if candidates is None:
        candidates = sorted(REGISTRY.get(collective, {}))
    candidates = list(candidates)
    if not candidates:
        raise ValueError(f"cost model: no candidate algorithms for {collective}")
    for name in candidates:
        _check(collective, name, size)
    params = load_params(transport) if params is None else params
    corrections = load_corrections(transport) if corrections is None else corrections
    seconds, name = ranking(collective, size, nbytes, params, candidates, itemsize,
                            corrections)[0]
    return name, seconds


# ---------------------------------------------------------------------------------------------
# Fitting and calibration


def _weighted_line(points, relative=True):
    """Least squares of t = c + k·n; c, k >= 0. ``relative`` minimizes relative residuals
    (each row divided by its t), so microsecond latencies are not drowned by millisecond
    transfers; otherwise plain residuals, so the largest sizes set the slope."""
    import numpy as np
    n = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    if np.any(t <= 0) or np.any(n < 0) or not np.all(np.isfinite(t)):
        raise ValueError("cost model fit: timings must be positive and finite, sizes >= 0")
    w = 1.0 / t if relative else np.full_like(t, 1.0 / np.mean(t))
    if len(set(n.tolist())) >= 2:
        design = np.stack([w, n * w], axis=1)
        (c, k), *_ = np.linalg.lstsq(design, t * w, rcond=None)
        if c >= 0 and k >= 0:
            return float(c), float(k)
    # one size only, or a negative coefficient: clip it to zero and refit the other alone
    k_only = float(np.sum(n * t * w * w) / np.sum((n * w) ** 2)) if np.any(n > 0) else 0.0
    c_only = float(np.sum(t * w * w) / np.sum(w * w))
    def misfit(c, k):
        return float(np.sum(((c + k * n - t) * w) ** 2))
    return (0.0, k_only) if misfit(0.0, k_only) <= misfit(c_only, 0.0) else (c_only, 0.0)


def fit(pingpong, reductions, default: Params | None = None) -> Params:
    """Parameters from timings. ``pingpong``: [(nbytes, one-way seconds)] (half round trips),
    fitted as α + β·n on relative residuals; ``reductions``: [(nbytes of one operand,
    seconds)] of dst = a op b, fitted as c + γ·n on plain residuals, so that the large
    reductions out of cache, where γ matters, set it (c, the call overhead, is dropped).
    A list that is empty takes its parameters from ``default`` (ValueError without one)."""
    pingpong, reductions = list(pingpong), list(reductions)
    if (not pingpong or not reductions) and default is None:
        raise ValueError("cost model fit: need ping-pong and reduction timings, or defaults")
    alpha, beta = _weighted_line(pingpong) if pingpong else (default.alpha, default.beta)
    gamma = _weighted_line(reductions, relative=False)[1] if reductions else default.gamma
    # the shape terms (ports, β's knee, shared memory bandwidth, local launches) are not
    # measured here: they stay the default's
    return replace(default, alpha=alpha, beta=beta, gamma=gamma) if default is not None \
        else Params(alpha, beta, gamma)


PINGPONG_BYTES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20)
# Reductions from 256 KiB up: smaller ones run from cache and would make γ look faster than
# the large blocks where γ matters.
REDUCE_BYTES = (256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def _synchronize(xp):
    cuda = getattr(xp, "cuda", None)
    if cuda is not None:          # cupy: time the kernels, not their launches
        cuda.Device().synchronize()


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def calibrate(group, *, repeats: int = 15, pingpong_bytes=PINGPONG_BYTES,
              reduce_bytes=REDUCE_BYTES, timeout: float = 60.0) -> Params:
    """Measure and fit this transport's parameters; a collective call (every rank of
    ``group`` must call it). Ranks 0 and 1 ping-pong over the group's transport (median of
    ``repeats`` round trips per size, halved), rank 0 times float32 SUM reductions with the
    executors' kernel, fits, and sends the result to every rank, so all ranks return the
    same Params. A group of one rank measures γ only; α and β stay the transport's defaults."""
    import numpy as np

    from ..kernels.reduce import reducer
    from ..ops import ReduceOp

    transport, rank, size = group.transport, group.rank, group.size
    xp = transport.xp
    tag = group.next_tag()
    default = load_params(transport.name)
    pingpong, reductions = [], []

    def exchange(requests):
        transport.wait_all(requests, timeout)

    if size > 1 and rank in (0, 1):
        peer = 1 - rank
        for nbytes in pingpong_bytes:
            buf = xp.zeros(nbytes, dtype=xp.uint8)
            trips = []
            for trip in range(repeats + 2):           # two warm-up trips
                _synchronize(xp)
                start = time.perf_counter()
                if rank == 0:
                    exchange([transport.isend(buf, peer, tag)])
                    exchange([transport.irecv(buf, peer, tag)])
                else:
                    exchange([transport.irecv(buf, peer, tag)])
                    exchange([transport.isend(buf, peer, tag)])
                _synchronize(xp)
                if trip >= 2:
                    trips.append(time.perf_counter() - start)
            pingpong.append((nbytes, _median(trips) / 2))
    if rank == 0:
        add = reducer(ReduceOp.SUM, np.float32)
        for nbytes in reduce_bytes:
            a = xp.ones(nbytes // 4, dtype=xp.float32)
            b = xp.ones(nbytes // 4, dtype=xp.float32)
            times = []
            for trial in range(repeats + 1):
                _synchronize(xp)
                start = time.perf_counter()
                add(a, a, b)
                _synchronize(xp)
                if trial:
                    times.append(time.perf_counter() - start)
            reductions.append((nbytes, _median(times)))
        fitted = fit(pingpong, reductions, default)
        values = xp.asarray(np.array([fitted.alpha, fitted.beta, fitted.gamma]))
        exchange([transport.isend(values, peer, tag) for peer in range(1, size)])
        return fitted
    values = xp.zeros(3, dtype=xp.float64)
    exchange([transport.irecv(values, 0, tag)])
    host = values.get() if hasattr(values, "get") else values
    alpha, beta, gamma = (float(v) for v in host)
    return replace(default, alpha=alpha, beta=beta, gamma=gamma)


def clear_caches() -> None:
    """Forget cached predictions (after registering a schedule or changing parameters)."""
    _predict.cache_clear()
    estimate.cache_clear()
