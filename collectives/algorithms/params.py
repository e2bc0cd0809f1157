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
    # The same groups where plans run on peer memory (executors/peer.py: one kernel per call;
    # the nccl transport's ``model_name``). α: 2.0 µs a further step (ring all_reduce at 4
    # KiB on 4 x H100, BENCHMARKS.md §6); β: 333 GB/s per message, each of a GPU's peers at
    # once at that rate (its NVLinks: the bench's plain-copy ceiling moved 342 GB/s of bus
    # bandwidth); γ: a received block is reduced in the pass that reads it, so a reduction
    # costs little beyond its bytes' transfer; local_alpha 1 µs per local operation. Not
    # fitted: set from those measurements and judged on every stored 4 x H100 peer-memory run
    # (sessions 12, 14, 15, 16: untuned auto's worst size 1.01-1.09 of the best measured
    # algorithm, against 1.32-1.38 with the send/recv model above) and the 2-GPU ones (1.20-
    # 1.32, the same as with it).
    "nccl_peer": Params(alpha=2e-6, beta=1 / 333e9, gamma=1e-13, ports=3,
                        link_beta=1 / 333e9, local_alpha=1e-6),
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


# Names whose home is ``collectives.tuning_file`` (the one reader and writer of the tuning
# file), answered here too for code that imports them from this module.
_MOVED = {"ENV_TUNING": "ENV_TUNING", "read_tuning": "read", "write_tuning": "write",
          "load_params": "load_params", "save_params": "save_params"}


def __getattr__(name):
    if name in _MOVED:
        from .. import tuning_file
        return getattr(tuning_file, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
