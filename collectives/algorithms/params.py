"""The cost model's parameters as data: ``Params`` (α, β, γ and the shape terms) and each
transport's defaults, with the reasons behind them. A machine's own parameters live in its
tuning file, which ``collectives.tuning_file`` reads and writes (``bench.py --calibrate``,
see ``collectives.calibration``): this module does no I/O. Every rank must see the same
parameters, or ranks may choose different algorithms for one call and deadlock: a job's
ranks must share one tuning file."""
from __future__ import annotations

import math
from dataclasses import dataclass


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

    def describe(self) -> str:
        """``alpha 40.00 us, 1/beta 1.2 GB/s, 1/gamma 5 GB/s``: the classic three as the
        bench and ``tune show`` print them."""
        def rate(seconds_per_byte):
            return f"{1e-9 / seconds_per_byte:.3g} GB/s" if seconds_per_byte else "unbounded"
        return (f"alpha {self.alpha * 1e6:.2f} us, 1/beta {rate(self.beta)}, "
                f"1/gamma {rate(self.gamma)}")


SHAPE_FIELDS = ("ports", "link_beta", "beta_small", "beta_knee", "gamma_shared_bytes",
                "local_alpha", "spill_bytes", "spill_factor")


# Defaults, used until a transport is calibrated (``python -m collectives.bench --calibrate``).
# Each value and the runs it was fitted to or judged on: BENCHMARKS.md §4 ("The runs the
# model's defaults were fitted to"); the comments say what each term stands for.
DEFAULTS = {
    # mpi4py over shared memory, driven by the Python host executor: α is MPI's own per
    # message cost plus the executor's per-step Python (request objects, Waitall), which is
    # the larger part; β one core's copy bandwidth through the MPI library's shared-memory
    # channel; γ a numpy float32 add on one thread.
    "mpi": Params(alpha=5e-6, beta=1 / 5e9, gamma=1 / 5e9),     # shape: below
    # Python TCP over loopback; α: two syscalls, a frame header and the selector loop per
    # message (a ping-pong's; a step inside a collective costs more: below).
    "socket": Params(alpha=4e-5, beta=1 / 3.5e9, gamma=1 / 5e9),   # shape: below
    # Threads of one process: α is a hand-off through a condition variable under the GIL;
    # the copy is one memcpy, but it holds the GIL.
    "local": Params(alpha=1.5e-5, beta=1 / 8e9, gamma=1 / 5e9),
    # NCCL send/recv in a group call, with the transport's 64 KiB NVLink p2p chunks, fitted
    # (benchmarks/fit_model.py) to runs of every algorithm on 2 and 4 GPUs (BENCHMARKS.md §3):
    # α is a step's group call; a GPU drives up to three peers at once, which share its link
    # (``link_beta``); γ an elementwise kernel; ``local_alpha``: each reduction or copy is a
    # CuPy kernel launched from Python, which is what makes the direct algorithms' p - 1
    # reductions expensive here.
    "nccl": Params(alpha=2e-5, beta=1 / 335e9, gamma=1 / 1e12, ports=3, link_beta=1 / 239e9,
                   local_alpha=3e-5),
    # The same groups where plans run on peer memory (executors/peer.py: one kernel per call;
    # the peer executor's ``model_name``): α is one further step inside the kernel (a flag
    # at system scope), not a group call; β the NVLink rate, each of a GPU's peers at once at
    # that rate; γ small, because a received block is reduced in the pass that reads it, so
    # a reduction costs little beyond its bytes' transfer; ``local_alpha`` small, because
    # local operations run in the same kernel. Not fitted: set from the peer-memory runs and
    # judged on every stored one (BENCHMARKS.md §4, "Untuned auto on GPU peer memory"),
    # where the send/recv parameters above misjudge which schedule wins.
    "nccl_peer": Params(alpha=2e-6, beta=1 / 333e9, gamma=1e-13, ports=3,
                        link_beta=1 / 333e9, local_alpha=1e-6),
}
# Ranks of one host stream reductions of operands past the cache from memory bandwidth that
# they all share, so a large reduction costs about γ·p per byte (BENCHMARKS.md §1, the large
# reduce_scatter on 8 ranks); the knee lies between the last-level cache's share per rank
# and a few times that.
HOST_SHARED_BYTES = 16 * 2**20
# Shape of the shared-memory MPI (benchmarks/fit_model.py on 8-rank runs of every algorithm,
# each with its own calibrated α, β, γ): a rank runs several transfers at once, sharing its
# copy bandwidth (the direct algorithms post p - 1), and each local operation costs a fixed
# amount on top of its bytes (visible in the direct all_reduce's p - 1 reductions). With one
# port the model misranks the direct and bidirectional schedules.
DEFAULTS["mpi"] = Params(5e-6, 1 / 5e9, 1 / 5e9, ports=4, gamma_shared_bytes=HOST_SHARED_BYTES,
                         local_alpha=2e-6)
# Socket (4-rank runs, BENCHMARKS.md §2). α: a step inside a collective costs about twice the
# ping-pong's, for the two thread hand-offs per message through the progress thread. Spill:
# Linux caps a TCP send buffer at tcp_wmem's maximum (4 MiB), so the caller's own sendmsg
# pushes at most that much; the rest of a larger message waits for the receiver to drain and
# goes through the progress thread at about half the rate. That is why the ring's p - 1
# messages of n/p beat recursive doubling's n/4 + n/2 on large messages.
SOCKET_SPILL_BYTES = 4 * 2**20
# ports 3: the progress thread moves a step's messages to its p - 1 peers together (the
# direct algorithms); local_alpha: each reduction or copy is a numpy call on a rank that
# shares the host's cores with the other ranks' progress threads (benchmarks/fit_model.py on
# the TCP runs, judged with the shared-memory path as well).
DEFAULTS["socket"] = Params(8e-5, 1 / 3.5e9, 1 / 5e9, ports=3,
                            gamma_shared_bytes=HOST_SHARED_BYTES, local_alpha=4e-5,
                            spill_bytes=SOCKET_SPILL_BYTES, spill_factor=2.0)
# Transports without defaults of their own (tests' fakes, future ones) get the MPI numbers.
FALLBACK_TRANSPORT = "mpi"


def default_params(transport: str) -> Params:
    return DEFAULTS.get(transport, DEFAULTS[FALLBACK_TRANSPORT])


# Between hosts, for the two-level model (``cost.replay``'s ``inter``: ``DEFAULTS`` price the
# messages inside a host and every local operation, these the messages between hosts). α is
# the transport's own per-message cost plus the network's latency; β one host's network link,
# which the host's ranks share (``ports``: the host's rails, one NIC each); γ unused (local
# operations are priced inside the host). Assumed links, not fitted: no two-host run has been
# measured yet; a job on other links passes its own (bench/hierarchy.py takes them as
# arguments).
INTER_HOST_DEFAULTS = {
    # The socket transport between hosts on 10 GbE: the socket step's α (the intra default's)
    # plus a kernel TCP round trip across a switch; 1.1 GB/s of payload on 10 Gb/s.
    "socket": Params(alpha=1e-4, beta=1 / 1.1e9, gamma=1 / 5e9),
    # MPI between hosts on 100 Gb/s InfiniBand (EDR): the executor's α (the intra default's)
    # plus the fabric's few microseconds; about 11 GB/s of payload per host.
    "mpi": Params(alpha=8e-6, beta=1 / 11e9, gamma=1 / 5e9),
}


def inter_host_params(transport: str) -> Params:
    """The links between hosts ``transport`` is assumed to run on (``INTER_HOST_DEFAULTS``;
    MPI's for transports without their own)."""
    return INTER_HOST_DEFAULTS.get(transport, INTER_HOST_DEFAULTS[FALLBACK_TRANSPORT])


# Names whose home is ``collectives.tuning_file`` (the one reader and writer of the tuning
# file), answered here too for code that imports them from this module.
_MOVED = {"ENV_TUNING": "ENV_TUNING", "read_tuning": "read", "write_tuning": "write",
          "load_params": "load_params", "save_params": "save_params"}


def __getattr__(name):
    if name in _MOVED:
        from .. import tuning_file
        return getattr(tuning_file, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
