"""The benchmark suite: collectives x algorithms x sizes, checked, in nccl-tests' columns.

``bench_rank(group, config)`` runs on every rank and *returns* one record (a dict) per
(collective, size, algorithm); ``run(backend, config)`` makes the groups for a backend and
runs them (one per process under mpiexec, one thread per rank for ``local``); ``main`` is
the CLI (``benchmarks/bench.py``, ``python -m collectives.bench``).

Timing: before every iteration the ranks meet at a barrier (over sockets, each side's own:
ours before our rows, gloo's before gloo's; ``_row_barrier``); each rank times its own call
(``prepare(...)()``, the whole path a user pays); the per-iteration times are then combined
with an all_reduce MAX (outside the timed region), so an iteration lasts as long as its
slowest rank; p50 and p99 are taken over those. Iteration counts adapt to size: each row
runs for about ``min_time`` seconds (at least ``min_iters``), unless ``--iters`` fixes them.
``--rounds N`` runs each (collective, size)'s algorithms N times, interleaved and in a rotated
order each round, and pools the iterations of a row's rounds (its ``iters`` is their total,
``rounds`` says N): a drifting machine then slows all algorithms of a size alike.

Checking: every rank's input is a closed-form pattern of small integers (exact in every
float type for moderate world sizes), so the expected output of every collective is computed
locally. The first warm-up result and the last timed result are checked on every rank;
``wrong`` counts wrong elements summed over ranks. Bandwidths follow nccl-tests: algbw =
size / time, busbw = algbw x 2(p-1)/p for all_reduce and x (p-1)/p for reduce_scatter,
all_gather and all_to_all; ``size`` is the larger buffer of the call.

Backends: ``BACKENDS`` maps a name to a function ``(args) -> [(group, xp), ...]`` (the
groups this process drives); ``socket`` and ``nccl`` plug in there. ``socket`` run by hand
launches its own ``--world-size`` processes and compares against torch's gloo
(``bench_socket``).

The model: every row also carries the α-β-γ prediction (``cost.estimate`` with the transport's
parameters from ``cost.load_params``, i.e. ``COLLECTIVES_TUNING`` or the defaults) and
``model_error`` = measured / predicted. The ``auto`` row runs ``algorithm="auto"`` and names
the algorithm it chose; the summary gives auto's time relative to the best measured algorithm
at each size, and the time of its choice's own row relative to the best (auto's row and that
row run one schedule, so their quotient is the run's noise, shown too). ``--calibrate FILE``
fits α, β, γ on this transport first (``cost.calibrate``), saves them and runs the sweep with
them; ``--tune FILE`` afterwards stores the winner at each (collective, size) in that tuning
file, with the medians behind it (``tuning.decisions_from_records``): groups made with
``COLLECTIVES_TUNING=FILE`` put those in their decision table; ``--simulate P`` needs no transport: it prints
the model's table for P ranks and verifies the schedules at P in the simulator
(``bench_model``).

The header says what the numbers are of: the executor that runs the plans (the compiled MPI
executor, or the Python one and why: ``describe_executor``; a checkout that shadows an
installed copy with the extension is named, ``missing_extension_reason``) and how many ranks
of the job share this host's usable cores (``host_load``: under MPI the ranks of a
shared-memory split and the union of their affinity). More ranks than cores is warned about
in the header and again after the summary: the times are then of an oversubscribed machine.
``--json`` keeps both in "meta" (executor, ranks_on_host, cores_on_host, oversubscribed).
With no ``--backend`` and nothing to detect (no MPI launcher, no collectives.run/torchrun,
no mpi4py) the bench refuses with what it looked for and the three ways on, rather than
guessing a backend that needs a world size; such refusals, found before any group exists,
are printed by the launcher's rank 0 only.

Record fields (``--json`` "records", ``--csv`` columns): collective, algorithm ("native" is
the transport's library, named by native_name: "gloo", an MPI library, "nccl"), chosen (the
algorithm ``auto`` ran, else the algorithm), backend, world_size, size (bytes), count, dtype,
op, iters, time_p50_us, time_p99_us, algbw_gbs, busbw_gbs, ratio_to_native (busbw / native's,
None without a native row), predicted_us and model_error (None for native), wrong; with
``--rounds N`` > 1 also rounds and round_p50_us (each round's own p50, in JSON only: how far
a row moved between its rounds).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import settings, tuning
from .algorithms import capabilities, cost
from .ops import ReduceOp

BENCH_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ALGORITHMS = ("ring", "tree", "recursive_doubling", "auto", "native")
BUS_FACTOR = {
    "all_reduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "all_gather": lambda p: (p - 1) / p,
    "all_to_all": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}
REDUCING = ("all_reduce", "reduce_scatter")
DEFAULT_SIZES = "4K:16M"


@dataclass
class Config:
    collectives: tuple = BENCH_COLLECTIVES
    algorithms: tuple = ALGORITHMS
    sizes: tuple = ()                     # bytes of the larger buffer of each call
    dtype: str = "float32"
    op: str = "sum"
    iters: int | None = None              # None: adapt to size (min_time per row)
    warmup: int = 2
    min_time: float = 0.25
    min_iters: int = 5
    max_iters: int = 1000
    rounds: int = 1                       # interleaved repetitions of each size's algorithms
    progress: bool = False
    extra: dict = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# sizes and dtypes

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
          "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).upper() not in _UNITS:
        raise ValueError(f"bad size {text!r}: use bytes with an optional K, M or G suffix")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def parse_sizes(text: str) -> tuple:
    """``4K:16M`` (x4 steps), ``4K:16M:2`` (x2 steps), ``1M``, ``4K,64K``, or a mix."""
    sizes = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if ":" in part:
            bits = part.split(":")
            if len(bits) not in (2, 3):
                raise ValueError(f"bad size range {part!r}: use LOW:HIGH or LOW:HIGH:FACTOR")
            low, high = parse_size(bits[0]), parse_size(bits[1])
            factor = int(bits[2]) if len(bits) == 3 else 4
            if low < 1 or high < low or factor < 2:
                raise ValueError(f"bad size range {part!r}: need 1 <= LOW <= HIGH, FACTOR >= 2")
            size = low
            while size <= high:
                sizes.append(size)
                size *= factor
        else:
            sizes.append(parse_size(part))
    if not sizes:
        raise ValueError(f"no sizes in {text!r}")
    return tuple(sorted(set(sizes)))


def format_size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def parse_dtype(name: str) -> np.dtype:
    if name in ("bfloat16", "bf16"):
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(name)
    except TypeError:
        raise ValueError(f"unknown dtype {name!r}") from None


# ---------------------------------------------------------------------------------------------
# data whose result is known: small integer patterns

_PERIOD = 60          # every pattern repeats with this period in the element index


def _pattern(rank, k, op, dtype):
    """This rank's input value at element index ``k`` (an int array) for reducing ``op``."""
    if dtype == np.bool_:
        return (rank + k) % 3 == 0
    if op == ReduceOp.PRODUCT:
        return 1 + (rank + k) % 2
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return (rank * 3 + k) % 16
    return rank % 7 + 1 + k % 5


def _moved(rank, k, dtype, peer=0):
    """Values for data-movement collectives: differ by rank (and by destination ``peer``)."""
    values = (rank * 7 + peer * 3 + k) % 13 + 1
    return values % 2 == 1 if dtype == np.bool_ else values


_COMBINE = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PRODUCT: np.multiply,
            ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
            ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor}
_COMBINE_BOOL = {ReduceOp.SUM: np.logical_or, ReduceOp.PRODUCT: np.logical_and,
                 ReduceOp.MIN: np.logical_and, ReduceOp.MAX: np.logical_or,
                 ReduceOp.BAND: np.logical_and, ReduceOp.BOR: np.logical_or,
                 ReduceOp.BXOR: np.logical_xor}


def _reduced_period(size, op, dtype):
    """The reduction over all ranks of one period of the pattern (computed in float64/ints)."""
    k = np.arange(_PERIOD)
    wide = np.bool_ if dtype == np.bool_ else (np.int64 if dtype.kind in "iu" else np.float64)
    table = _COMBINE_BOOL if dtype == np.bool_ else _COMBINE
    acc = np.asarray(_pattern(0, k, op, dtype), dtype=wide)
    for r in range(1, size):
        acc = table[op](acc, np.asarray(_pattern(r, k, op, dtype), dtype=wide))
    if op == ReduceOp.AVG:
        acc = acc / size
    return acc.astype(dtype)


class Case:
    """Buffers and the expected result of one (collective, count, dtype, op) on one rank."""

    def __init__(self, collective, rank, size, count, dtype, op):
        self.collective, self.rank, self.size = collective, rank, size
        k = np.arange(count)
        block = count // size if collective != "all_reduce" else count
        if collective == "all_reduce":
            self.input = np.asarray(_pattern(rank, k, op, dtype)).astype(dtype)
            self.expected = _reduced_period(size, op, dtype)[k % _PERIOD]
        elif collective == "reduce_scatter":
            self.input = np.asarray(_pattern(rank, k, op, dtype)).astype(dtype)
            mine = np.arange(rank * block, (rank + 1) * block)
            self.expected = _reduced_period(size, op, dtype)[mine % _PERIOD]
        elif collective == "all_gather":
            kb = np.arange(block)
            self.input = np.asarray(_moved(rank, kb, dtype)).astype(dtype)
            self.expected = np.concatenate([np.asarray(_moved(r, kb, dtype)).astype(dtype)
                                            for r in range(size)])
        elif collective == "all_to_all":
            kb = np.arange(block)
            self.input = np.concatenate([np.asarray(_moved(rank, kb, dtype, peer=j)).astype(dtype)
                                         for j in range(size)])
            self.expected = np.concatenate([np.asarray(_moved(i, kb, dtype, peer=rank))
                                            .astype(dtype) for i in range(size)])
        else:
            raise ValueError(f"bench: collective {collective!r} is not benchmarked; choose from "
                             f"{', '.join(BENCH_COLLECTIVES)}")
        self.output = np.empty_like(self.expected)
        # exact for integer-valued patterns; AVG divides, and half floats round large sums
        self.exact = op != ReduceOp.AVG and dtype.itemsize >= 4 or dtype.kind in "iub"

    def wrong(self, output=None) -> int:
        got = self.output if output is None else output
        if self.exact or self.expected.dtype == np.bool_:
            return int(np.count_nonzero(got != self.expected))
        a, b = got.astype(np.float64), self.expected.astype(np.float64)
        return int(np.count_nonzero(~np.isclose(a, b, rtol=1e-2 if got.itemsize < 4 else 1e-5)))

    def poison(self):
        """Overwrite the output so a call that writes nothing cannot pass the check."""
        if self.output.dtype == np.bool_:
            self.output[...] = ~self.expected
        else:
            self.output[...] = self.expected + 1


def element_count(collective, nbytes, itemsize, size) -> int:
    """Elements of the larger buffer; a multiple of the world size where blocks are split."""
    count = max(1, nbytes // itemsize)
    if collective != "all_reduce":
        count = max(1, count // size) * size
    return count


# ---------------------------------------------------------------------------------------------
# one rank's benchmark


def _helper_algorithm(group):
    return "native" if group.transport.native is not None else "ring"


def _max_over_ranks(group, values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    group.prepare("all_reduce", input=values, output=out, op=ReduceOp.MAX,
                  algorithm=_helper_algorithm(group))()
    return out


def _sum_over_ranks(group, value: int) -> int:
    out = np.empty(1, np.int64)
    group.prepare("all_reduce", input=np.array([value], np.int64), output=out,
                  op=ReduceOp.SUM, algorithm=_helper_algorithm(group))()
    return int(out[0])


def _barrier(group):
    group.prepare("barrier", algorithm=_helper_algorithm(group)
                  if group.transport.native is not None else None)()


def _row_barrier(group, algorithm):
    """The barrier before each iteration of a row. Over sockets the baseline (torch's gloo)
    is another library with threads of its own: each side's rows meet at that side's own
    barrier. gloo's barrier leaves the ranks tens of µs apart and its gloo_tcp_loop thread
    busy for a while after it, which landed in our 4 KiB calls (0.62-0.73x gloo's time after
    gloo's barrier, 0.13-0.21x after ours; gloo's own rows measured the same after any
    barrier: BENCHMARKS.md §2). Under MPI the native library is the transport itself."""
    if algorithm != "native" and group.transport.name == "socket":
        return lambda: group.prepare("barrier", algorithm=None)()
    return lambda: _barrier(group)


def plan_rows(config: Config, group) -> list[tuple]:
    """(collective, size, algorithm) in run order; native first so ours print its ratio."""
    have = capabilities()
    native = group.transport.native
    dtype, op = parse_dtype(config.dtype), ReduceOp.parse(config.op)
    rows = []
    for collective in config.collectives:
        names = [a for a in config.algorithms if a in have[collective] or a == "auto"]
        if "native" in config.algorithms and native is not None and native.supports(
                collective, dtype, op if collective in REDUCING else ReduceOp.SUM):
            names.insert(0, "native")
        for size in config.sizes:
            rows.extend((collective, size, name) for name in names)
    return rows


def bench_rank(group, config: Config, on_record=None) -> list[dict]:
    """Run the sweep on this rank (every rank of ``group`` calls this with the same
    config); return the records (identical on every rank).

    With ``config.rounds`` > 1 each (collective, size)'s algorithms run that many times,
    interleaved, the order rotated each round; a row's times are all its rounds' iterations
    together. A machine whose speed drifts (other tenants, clocks) then slows every algorithm
    of a size alike instead of whichever ran during the slow spell, which is what decides
    close comparisons such as "is auto within 10% of the best"."""
    dtype, op = parse_dtype(config.dtype), ReduceOp.parse(config.op)
    p, rank = group.size, group.rank
    rows = plan_rows(config, group)
    rounds = max(1, int(config.rounds))
    records, native_busbw = [], {}
    progress = Progress(len(rows) * rounds) if config.progress and rank == 0 else None
    params = cost.load_params(group.transport.name)
    native = group.transport.native
    native_name = getattr(native, "name", None) or group.backend if native is not None else None
    for _ in range(10):      # connections and lazy initialisation, before the first row
        _barrier(group)
        _max_over_ranks(group, np.zeros(1024))
    done = 0
    for (collective, nbytes), names in _by_size(rows):
        count = element_count(collective, nbytes, dtype.itemsize, p)
        case = Case(collective, rank, p, count, dtype, op)   # one size's buffers at a time
        runs = {name: [] for name in names}
        for r in range(rounds):
            for algorithm in names[r % len(names):] + names[:r % len(names)]:
                if progress:
                    progress.update(done, f"{collective} {algorithm} {format_size(nbytes)}")
                runs[algorithm].append(_bench_row(group, case, collective, algorithm, count,
                                                  dtype, op, config))
                done += 1
        for algorithm in names:
            record = _merge_rounds(runs[algorithm])
            _add_model(record, group, params, native_name)
            if algorithm == "native":
                native_busbw[collective, count] = record["busbw_gbs"]
            base = native_busbw.get((collective, count))
            record["ratio_to_native"] = (record["busbw_gbs"] / base) if base else None
            records.append(record)
            if on_record is not None and rank == 0:
                if progress:
                    progress.clear()
                on_record(record)
        del case
    if progress:
        progress.finish()
    return records


def _by_size(rows):
    """Consecutive rows of one (collective, size): [((collective, size), [algorithms])]."""
    groups = []
    for collective, nbytes, algorithm in rows:
        if groups and groups[-1][0] == (collective, nbytes):
            groups[-1][1].append(algorithm)
        else:
            groups.append(((collective, nbytes), [algorithm]))
    return groups


def _merge_rounds(runs) -> dict:
    """One record from a row's rounds: p50/p99 over all their iterations, wrong summed."""
    record = dict(runs[0])
    per_round = [run.pop("times") for run in runs]
    times = np.concatenate(per_round)
    record.pop("times", None)
    p50, p99 = (float(x) for x in np.percentile(times, [50, 99]))
    algbw = record["size"] / p50 / 1e9
    record.update(iters=int(times.size), wrong=sum(run["wrong"] for run in runs),
                  time_p50_us=p50 * 1e6, time_p99_us=p99 * 1e6, algbw_gbs=algbw,
                  busbw_gbs=algbw * BUS_FACTOR[record["collective"]](record["world_size"]))
    if len(runs) > 1:
        # each round's own p50: how far one row moves between its rounds in this run
        record["rounds"] = len(runs)
        record["round_p50_us"] = [float(np.percentile(t, 50)) * 1e6 for t in per_round]
    return record


def _add_model(record, group, params, native_name):
    """The algorithm ``auto`` ran, the model's prediction for the row and measured/predicted."""
    collective, algorithm = record["collective"], record["algorithm"]
    itemsize = record["size"] // max(1, record["count"])
    record["native_name"] = native_name
    if algorithm == "native":
        record.update(chosen="native", predicted_us=None, model_error=None)
        return
    chosen = (group.resolve_algorithm(collective, "auto", record["size"])
              if algorithm == "auto" else algorithm)
    predicted = cost.estimate(collective, chosen, group.size, record["size"], params,
                              itemsize) * 1e6
    record.update(chosen=chosen, predicted_us=predicted,
                  model_error=record["time_p50_us"] / predicted if predicted > 0 else None)


def _bench_row(group, case, collective, algorithm, count, dtype, op, config) -> dict:
    p = group.size
    counts = None          # even blocks: the group derives counts from the buffers
    op_arg = op if collective in REDUCING else ReduceOp.SUM

    def call():
        group.prepare(collective, input=case.input, output=case.output, counts=counts,
                      op=op_arg, algorithm=algorithm)()

    barrier = _row_barrier(group, algorithm)
    # warm-up: the first result is checked, its time sizes the timed loop
    case.poison()
    barrier()
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    wrong = case.wrong()
    for _ in range(max(0, config.warmup - 1)):
        call()
    if config.iters is not None:
        iters = max(1, config.iters)
    else:
        slowest = float(_max_over_ranks(group, np.array([first]))[0])
        iters = int(min(config.max_iters, max(config.min_iters,
                                              config.min_time / max(slowest, 1e-7))))
    times = np.empty(iters)
    case.poison()
    for i in range(iters):
        barrier()
        start = time.perf_counter()
        call()
        times[i] = time.perf_counter() - start
    wrong += case.wrong()
    times = _max_over_ranks(group, times)
    wrong = _sum_over_ranks(group, wrong)
    p50, p99 = (float(x) for x in np.percentile(times, [50, 99]))
    nbytes = count * dtype.itemsize
    algbw = nbytes / p50 / 1e9
    return {
        "collective": collective, "algorithm": algorithm, "backend": group.backend,
        "world_size": p, "size": nbytes, "count": count, "dtype": dtype.name,
        "op": op.name.lower() if collective in REDUCING else "none", "iters": iters,
        "time_p50_us": p50 * 1e6, "time_p99_us": p99 * 1e6, "algbw_gbs": algbw,
        "busbw_gbs": algbw * BUS_FACTOR[collective](p), "wrong": wrong,
        "times": times,            # the slowest rank's seconds per iteration (merged, dropped)
    }


# ---------------------------------------------------------------------------------------------
# backends: name -> function(args) -> [(group, xp), ...] driven by this process


def _mpi_groups(args):
    from .group import ProcessGroup
    from .transports import create
    transport = create("mpi", rank=None, world_size=None, timeout=args.timeout)
    return [(ProcessGroup(transport, backend="mpi", timeout=args.timeout), transport.xp)]


def _local_groups(args):
    from .group import ProcessGroup
    from .transports.local import LocalWorld
    if not args.world_size or args.world_size < 1:
        raise ValueError("bench --backend local needs --world-size N (N >= 1)")
    world = LocalWorld(args.world_size)
    groups = [None] * args.world_size

    def make(rank):       # a thread per rank: making a group is collective (tables compared)
        groups[rank] = (ProcessGroup(world.transport(rank), backend="local",
                                     timeout=args.timeout), np)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(args.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(g is None for g in groups):
        raise RuntimeError("bench --backend local: a rank's group could not be made")
    return groups


BACKENDS = {"mpi": _mpi_groups, "local": _local_groups}


def _socket_groups(args):
    from .bench_socket import socket_groups
    return socket_groups(args)


BACKENDS["socket"] = _socket_groups


def _nccl_groups(args):
    from .bench_nccl import nccl_group
    return [nccl_group(args.timeout)]


BACKENDS["nccl"] = _nccl_groups      # main hands the whole run to bench_nccl (GPU timing)


# The variables an MPI launcher (mpiexec/mpirun of MPICH, Open MPI, PMIx) sets in each rank.
_MPI_LAUNCHER_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                      "MPI_LOCALRANKID")
_MPI_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


def default_backend() -> str:
    """mpi under mpiexec/mpirun, socket under collectives.run/torchrun (RANK and WORLD_SIZE
    set), else mpi when mpi4py is importable. With none of these there is no backend to
    guess (``local`` and ``socket`` need a world size): a ValueError saying what was looked
    for and what to do."""
    if any(k in os.environ for k in _MPI_LAUNCHER_VARS):
        return "mpi"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "socket"        # collectives.run or torchrun started us, not an MPI launcher
    try:
        import mpi4py  # noqa: F401
        return "mpi"
    except ImportError as exc:
        missing = exc
    raise ValueError(
        "no --backend given and none detected: this process was not started by mpiexec or "
        "mpirun, nor by collectives.run or torchrun (no RANK and WORLD_SIZE), and mpi4py is "
        f"not importable ({missing}). Either\n"
        "  install MPI support and run under mpiexec:\n"
        "    pip install mpi4py mpich && mpiexec -n 2 python benchmarks/bench.py\n"
        "  or run without MPI:\n"
        "    python benchmarks/bench.py --backend socket --world-size 2   (2 processes here; "
        "torch's gloo is the baseline when torch is installed)\n"
        "    python benchmarks/bench.py --backend local --world-size 2    (threads of this "
        "process, for checking schedules)")


def launch_rank() -> int:
    """This process's rank as its launcher numbered it, before any group exists (0 when no
    launcher started it): messages printed before the groups are made come from rank 0
    only, instead of once per rank."""
    for name in _MPI_RANK_VARS + ("RANK",):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


# ---------------------------------------------------------------------------------------------
# what runs here: the executor, and ranks against cores


def _package_dir() -> str:
    """The folder of the ``collectives`` package this process imported."""
    return os.path.dirname(os.path.abspath(__file__))


def _extension_in(package_dir: str) -> str | None:
    """The compiled MPI executor's extension file in the ``collectives`` folder
    ``package_dir``, or None."""
    from importlib.machinery import EXTENSION_SUFFIXES
    for suffix in EXTENSION_SUFFIXES:
        path = os.path.join(package_dir, "executors", "_mpi_exec" + suffix)
        if os.path.exists(path):
            return path
    return None


def missing_extension_reason(package_dir: str, search_path=None) -> str | None:
    """Why the package in ``package_dir`` has no compiled MPI executor, when the cause is
    where it was imported from; None when the extension is there, or when nothing better
    than ``compiled.status()`` can be said.

    The trap: after ``pip install .`` (not editable) the extension is built into the
    installed copy only, but Python run from the checkout (``python -m ...``, a script in
    its root) puts the checkout first on sys.path, so the source tree, which has no
    extension, shadows the installed package. ``search_path`` (default sys.path plus the
    site-packages folders) is searched for such another copy."""
    if _extension_in(package_dir):
        return None
    if search_path is None:
        import site
        search_path = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    here = os.path.realpath(package_dir)
    for entry in search_path:
        other = os.path.join(entry or os.getcwd(), "collectives")
        if os.path.realpath(other) != here and _extension_in(other):
            return (f"extension not built in {package_dir} (the source tree shadows the "
                    f"installed package at {other}, which has it: run pip install -e . in "
                    f"the checkout, or run from outside the checkout)")
    if os.path.exists(os.path.join(os.path.dirname(package_dir), "setup.py")):
        return (f"extension not built in {package_dir} (a source tree: pip install -e "
                f"\".[mpi]\" there builds it in place)")
    return None


def describe_executor(group, dtype=None, largest: int = 0) -> str:
    """Which executor runs this group's plans, and why not the compiled one where it could;
    with the run's ``dtype`` and ``largest`` size in bytes, also what the compiled executor
    hands to the Python one (complex and long double elements, messages of 2 GiB or more)."""
    transport = group.transport.name
    if transport == "nccl":
        return "NCCL executor (stream-ordered, on the GPU)"
    if transport != "mpi":
        return (f"Python host executor (the {transport} transport runs plans step by step "
                f"in Python; only mpi has a compiled executor)")
    from .executors import compiled, host
    # the group's choice (made once, from what the transport offers); a transport's own
    # ``execute`` where a group does not carry one
    execute = getattr(group, "execute", None) or getattr(group.transport, "execute", None)
    if execute is not None and execute is not host.execute:
        line = (f"compiled MPI executor (Cython, the whole plan in C), {compiled.status()}, "
                f"from {_package_dir()}")
        dtype = None if dtype is None else np.dtype(dtype)
        if dtype is not None and (dtype.kind == "c" or dtype.kind == "f" and dtype.itemsize > 8):
            line += f"; but {dtype} plans run in the Python host executor"
        elif largest >= 2**31:
            line += "; but messages of 2 GiB or more run in the Python host executor"
        return line
    why = compiled.status()
    if why.startswith("extension not built"):
        why = missing_extension_reason(_package_dir()) or why
    elif compiled.available():
        why = f"it loads ({why}), but this group did not select it"
    return f"Python host executor: the compiled MPI executor is not used here: {why}"


def usable_cores() -> set:
    """The cores this process may run on (its affinity), else all of the host's."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def host_load(group) -> tuple[int, int]:
    """(ranks of the job on this host, cores they may run on). Under MPI a collective call:
    every rank of ``group`` calls it; the cores are the union of the affinity of the ranks
    that share this host (a launcher that binds each rank to one core leaves each rank one,
    the host still has as many as there are ranks)."""
    transport = group.transport.name
    if transport == "mpi":
        from mpi4py import MPI
        node = group.transport.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            masks = node.allgather(sorted(usable_cores()))
            return node.Get_size(), len(set().union(*map(set, masks)))
        finally:
            node.Free()
    if transport == "socket":
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        return (int(local) if local.isdigit() else group.size), len(usable_cores())
    return group.size, len(usable_cores())        # local: every rank is a thread here


def oversubscription_warning(ranks: int, cores: int, backend: str) -> str | None:
    """The warning for more ranks than cores on one host; None when each rank has a core."""
    if ranks <= cores:
        return None
    how = {"mpi": f"mpiexec -n {cores}", "socket": f"--world-size {cores}",
           "local": f"--world-size {cores}"}.get(backend, f"{cores} ranks")
    advice = (f"use at most one rank per core ({how} here)" if cores > 1 else
              "run on a host that gives the job at least 2 cores")
    return (f"WARNING: {ranks} ranks on {cores} core{'s' if cores != 1 else ''} of this host: "
            f"oversubscribed, so ranks take turns on the cores and the times measure the "
            f"scheduler as much as the algorithms; ratios between algorithms and to native "
            f"are unreliable: {advice}")


def on_every_group(groups, fn):
    """``fn(group)`` for every group of this process (one thread per group when there are
    several, since they are ranks of one job); return rank 0's result."""
    if len(groups) == 1:
        return fn(groups[0][0])
    results, errors = {}, []

    def worker(group):
        try:
            results[group.rank] = fn(group)
        except BaseException as exc:
            errors.append(exc)
            abort = getattr(group.transport, "abort", None)
            if abort:
                abort(f"bench failed: {exc}")

    threads = [threading.Thread(target=worker, args=(g,), daemon=True) for g, _ in groups]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results[0]


def run(groups, config: Config, on_record=None) -> list[dict]:
    """Run ``bench_rank`` on every group of this process (threads when there are several);
    return rank 0's records (or this process's, under MPI)."""
    return on_every_group(groups, lambda group: bench_rank(group, config, on_record))


# ---------------------------------------------------------------------------------------------
# output

COLUMNS = [("size", 10), ("count", 10), ("dtype", 8), ("op", 5), ("algorithm", 18),
           ("p50_us", 11), ("p99_us", 11), ("algbw", 8), ("busbw", 8), ("vs_native", 9),
           ("model_us", 10), ("meas/mod", 8), ("wrong", 6)]
_SHORT = {"recursive_doubling": "rec_doubling",     # so "auto:<chosen>" fits its column
          "ring_bidirectional": "ring_bidir"}


def _algorithm_cell(r: dict) -> str:
    if r["algorithm"] == "auto" and r.get("chosen"):
        return "auto:" + _SHORT.get(r["chosen"], r["chosen"])
    if r["algorithm"] == "native" and r.get("native_name"):
        return "native:" + r["native_name"]
    return r["algorithm"]


def header(collective=None) -> str:
    line = " ".join(f"{name:>{width}}" for name, width in COLUMNS)
    rule = "#" + "-" * (len(line) - 1)
    title = f"# {collective}" if collective else ""
    return "\n".join(filter(None, [title, "#" + line[1:], rule]))


def format_record(r: dict) -> str:
    ratio = "" if r.get("ratio_to_native") is None else f"{r['ratio_to_native']:.2f}x"
    if r["algorithm"] == "native":
        ratio = "1.00x"
    predicted = "" if r.get("predicted_us") is None else f"{r['predicted_us']:.1f}"
    error = "" if r.get("model_error") is None else f"{r['model_error']:.2f}"
    cells = [format_size(r["size"]), r["count"], r["dtype"], r["op"], _algorithm_cell(r),
             f"{r['time_p50_us']:.1f}", f"{r['time_p99_us']:.1f}", f"{r['algbw_gbs']:.3f}",
             f"{r['busbw_gbs']:.3f}", ratio, predicted, error, r["wrong"]]
    return " ".join(f"{str(c):>{w}}" for c, (_, w) in zip(cells, COLUMNS))


def summarize(records: list[dict]) -> dict:
    """Per collective: the best algorithm at each size (ours and overall; ``auto`` is not a
    candidate, it runs one of ours), auto's time over the best measured algorithm's at that
    size (``auto_vs_best``, with the one auto chose), where ring and each log-p algorithm cross
    (which is faster over each run of sizes, and where it flips), and the spread of the
    model's error (measured / predicted) over the rows."""
    out = {}
    for collective in dict.fromkeys(r["collective"] for r in records):
        rows = [r for r in records if r["collective"] == collective]
        best = []
        for size in sorted({r["size"] for r in rows}):
            at = [r for r in rows if r["size"] == size]
            ours = [r for r in at if r["algorithm"] not in ("native", "auto")]
            top = max(ours, key=lambda r: r["busbw_gbs"]) if ours else None
            auto = next((r for r in at if r["algorithm"] == "auto"), None)
            candidates = [r for r in at if r["algorithm"] != "auto"] or at
            # the same schedule as auto's choice, measured as its own row (if it was)
            pick = next((r for r in ours if auto and r["algorithm"] == auto.get("chosen")),
                        None)
            best.append({"size": size, "best": top["algorithm"] if top else None,
                         "busbw_gbs": top["busbw_gbs"] if top else None,
                         "ratio_to_native": top.get("ratio_to_native") if top else None,
                         "overall": max(candidates, key=lambda r: r["busbw_gbs"])["algorithm"],
                         "auto_chose": auto.get("chosen") if auto else None,
                         "auto_vs_best": (auto["time_p50_us"] / top["time_p50_us"])
                         if auto and top else None,
                         "pick_vs_best": (pick["time_p50_us"] / top["time_p50_us"])
                         if pick and top else None,
                         "auto_vs_pick": (auto["time_p50_us"] / pick["time_p50_us"])
                         if pick else None})
        crossings = {}
        by = {(r["algorithm"], r["size"]): r["time_p50_us"] for r in rows}
        sizes = sorted({r["size"] for r in rows})
        for other in ("tree", "recursive_doubling"):
            common = [s for s in sizes if ("ring", s) in by and (other, s) in by]
            if common:
                crossings[other] = _crossing("ring", other, common, by)
        errors = sorted(r["model_error"] for r in rows if r.get("model_error"))
        model = ({"min": errors[0], "median": errors[len(errors) // 2], "max": errors[-1]}
                 if errors else None)
        out[collective] = {"best": best, "crossings": crossings, "model_error": model}
    return out


def _crossing(a, b, sizes, time_at) -> dict:
    """Which of ``a``/``b`` is faster over each run of sizes, and the sizes where that flips."""
    winners = [a if time_at[a, s] <= time_at[b, s] else b for s in sizes]
    runs, start = [], 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or winners[i] != winners[start]:
            span = format_size(sizes[start]) + ("" if i - 1 == start
                                                else f"-{format_size(sizes[i - 1])}")
            runs.append(f"{winners[start]} faster at {span}")
            start = i
    flips = [sizes[i] for i in range(1, len(sizes)) if winners[i] != winners[i - 1]]
    return {"winners": dict(zip(sizes, winners)), "crosses_at": flips,
            "text": "; ".join(runs) + (f" (crosses at {', '.join(map(format_size, flips))})"
                                       if flips else "")}


def format_summary(summary: dict) -> str:
    lines = ["", "# Summary: best of our algorithms at each size (busbw, ratio to native)"]
    for collective, info in summary.items():
        cells = []
        for b in info["best"]:
            ratio = "" if b["ratio_to_native"] is None else f" {b['ratio_to_native']:.2f}x"
            cells.append(f"{format_size(b['size'])}: {b['best']}{ratio}")
        lines.append(f"#  {collective}: " + "; ".join(cells))
        autos = [b for b in info["best"] if b.get("auto_vs_best") is not None]
        if autos:
            worst = max(b["auto_vs_best"] for b in autos)
            lines.append("#    auto time / best measured (auto's pick): " + "; ".join(
                f"{format_size(b['size'])}: {b['auto_vs_best']:.2f} ({b['auto_chose']}"
                f"{'' if b['auto_chose'] == b['best'] else ' vs ' + str(b['best'])})"
                for b in autos) + f"  -> worst {worst:.2f}"
                + (" (within 10%)" if worst <= 1.10 else " (NOT within 10%)"))
        picks = [b for b in autos if b.get("pick_vs_best") is not None]
        if picks:
            # the choice judged by its own row, and how far two rows of one schedule differ:
            # the auto row's ratio above mixes the two
            worst = max(b["pick_vs_best"] for b in picks)
            noise = [b["auto_vs_pick"] for b in picks]
            lines.append(f"#    auto's choice, by its own row / best measured: worst {worst:.2f}"
                         + (" (within 10%)" if worst <= 1.10 else " (NOT within 10%)")
                         + f"; auto row / that row {min(noise):.2f} .. {max(noise):.2f} "
                         "(one schedule measured twice: the run's noise)")
        for other, c in info["crossings"].items():
            lines.append(f"#    ring vs {other}: {c['text']}")
        if info.get("model_error"):
            m = info["model_error"]
            lines.append(f"#    model: measured/predicted {m['min']:.2f} .. {m['max']:.2f} "
                         f"(median {m['median']:.2f})")
    return "\n".join(lines)


def metadata(groups, config: Config) -> dict:
    group = groups[0][0]
    meta = {"backend": group.backend, "world_size": group.size, "host": platform.node(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "command": " ".join(sys.argv), "time": time.time(),
            "config": {k: v for k, v in asdict(config).items() if k != "extra"}}
    if group.backend == "mpi":
        from .transports.mpi import library_name
        meta["mpi_library"] = library_name()
    return meta


def write_json(path, meta, records, summary):
    with open(path, "w") as f:
        json.dump({"meta": meta, "records": records, "summary": summary}, f, indent=1)


CSV_FIELDS = ["collective", "algorithm", "backend", "world_size", "size", "count", "dtype",
              "op", "iters", "time_p50_us", "time_p99_us", "algbw_gbs", "busbw_gbs",
              "ratio_to_native", "chosen", "native_name", "predicted_us", "model_error",
              "wrong"]


def write_csv(path, records):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(records)


def check_plotting() -> str | None:
    """None when matplotlib can plot, else the message to show."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def write_plot(path, records, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    collectives = list(dict.fromkeys(r["collective"] for r in records))
    styles = {"native": "--", "auto": ":"}
    cols = min(2, len(collectives))
    rows = (len(collectives) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.5 * rows), squeeze=False)
    for ax, collective in zip(axes.flat, collectives):
        for algorithm in dict.fromkeys(r["algorithm"] for r in records
                                       if r["collective"] == collective):
            pts = sorted((r["size"], r["busbw_gbs"]) for r in records
                         if r["collective"] == collective and r["algorithm"] == algorithm)
            name = next((r.get("native_name") for r in records if r["algorithm"] == "native"),
                        None) if algorithm == "native" else None
            ax.plot([s for s, _ in pts], [b for _, b in pts], marker="o", markersize=3,
                    linestyle=styles.get(algorithm, "-"),
                    linewidth=2.2 if algorithm == "native" else 1.5,
                    color="black" if algorithm == "native" else None,
                    label=f"native ({name})" if name else algorithm)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(collective)
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        # plain numbers (0.05, 1.2), not 5x10^-2, on the log axis
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(
            lambda v, _: f"{v:g}" if f"{v:.1e}"[0] in "25" else ""))
        ax.tick_params(axis="y", which="minor", labelsize=7)
        ticks = sorted({r["size"] for r in records if r["collective"] == collective})
        ax.set_xticks(ticks)
        ax.set_xticklabels([format_size(t) for t in ticks], rotation=45)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(collectives):]:
        ax.set_visible(False)
    fig.suptitle(f"{meta['backend']}, {meta['world_size']} ranks, {records[0]['dtype']}"
                 + (f" ({meta['mpi_library']})" if meta.get("mpi_library") else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


class Progress:
    """A one-line bar on stderr, redrawn in place; cleared before each printed row."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream, self.start = total, stream or sys.stderr, time.monotonic()
        self.width = 0

    def update(self, done: int, label: str):
        frac = done / max(1, self.total)
        bar = "#" * int(24 * frac)
        elapsed = time.monotonic() - self.start
        line = f"[{bar:<24}] {done}/{self.total} {elapsed:5.0f}s  {label}"
        self.width = max(self.width, len(line))
        self.stream.write("\r" + line.ljust(self.width))
        self.stream.flush()

    def clear(self):
        self.stream.write("\r" + " " * self.width + "\r")
        self.stream.flush()

    def finish(self):
        self.clear()


# ---------------------------------------------------------------------------------------------
# CLI


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default, unless it has none (None/False) or says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and "default" not in text and \
                action.default not in (None, False, argparse.SUPPRESS):
            text += " (default: %(default)s)"
        return text


_EXAMPLES = """examples:
  mpiexec -n 4 python benchmarks/bench.py                        MPI: the default sweep
  mpiexec -n 4 python benchmarks/bench.py --sizes 1M --collectives all_reduce
  python benchmarks/bench.py --backend socket --world-size 2     no MPI: 2 processes, gloo baseline
  python benchmarks/bench.py --backend local --world-size 4      threads, for checking schedules
  python benchmarks/bench.py --simulate 4096                     the model's table, no transport

Use at most one rank per core: with more, the times measure the scheduler (the header and
the summary warn). Exits 1 when any result is wrong, 2 on bad arguments."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench.py", formatter_class=_HelpFormatter, epilog=_EXAMPLES,
        description="Benchmark ring / tree / recursive doubling against the transport's "
        "native collectives (run under mpiexec -n N for MPI). Every result is checked.")
    p.add_argument("--backend", choices=sorted(BACKENDS), default=None,
                   help="default: mpi under an MPI launcher or when mpi4py is available, socket "
                   "under collectives.run/torchrun; with neither, choose one. socket run by hand "
                   "launches --world-size local processes and compares with torch's gloo")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks for --backend local (required there), and processes that "
                   "--backend socket (default 2) or nccl (default: one per visible GPU) "
                   "launches when not started by a launcher")
    p.add_argument("--collectives", default=",".join(BENCH_COLLECTIVES),
                   help="comma-separated collectives to run, from "
                   + ", ".join(BENCH_COLLECTIVES))
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help="comma-separated algorithms (also any registered one, e.g. direct, "
                   "ring_bidirectional); those a collective lacks are skipped; native is the "
                   "transport's library, auto what algorithm=\"auto\" picks")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="bytes of each call's larger buffer: LOW:HIGH (x4 steps), "
                   "LOW:HIGH:FACTOR, a size, or a comma-separated list; K, M, G suffixes "
                   "(e.g. 4K:16M:2, 1M, 4K,64K)")
    p.add_argument("--dtype", default="float32",
                   help="element type: a numpy name (float16, float64, int32, ...) or bfloat16")
    p.add_argument("--op", default="sum", help="reduction op for all_reduce/reduce_scatter "
                   "(sum, avg, product, min, max, band, bor, bxor)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed iterations per row (default: adapt, --min-time per row)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed calls per row before timing; the first one's result is checked")
    p.add_argument("--min-time", type=float, default=0.25,
                   help="seconds per row when iterations adapt")
    p.add_argument("--rounds", type=int, default=1,
                   help="run each size's algorithms this many times, interleaved (order "
                   "rotated each round), and pool the iterations: comparisons between "
                   "algorithms then survive a machine whose speed drifts")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a stuck collective is an error")
    p.add_argument("--json", metavar="FILE",
                   help="write the records, the summary and the run's metadata (backend, "
                   "executor, ranks and cores of the host, ...) as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the records as CSV, one row each")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot busbw against size, one panel per collective, native dashed "
                   "(needs matplotlib)")
    p.add_argument("--calibrate", metavar="FILE",
                   help="fit the cost model's alpha, beta, gamma on this transport first, save "
                   "them to the tuning file FILE (read at run time through COLLECTIVES_TUNING) "
                   "and run the sweep with them")
    p.add_argument("--tuning", metavar="FILE",
                   help="the model's parameters from this tuning file (sets COLLECTIVES_TUNING)")
    p.add_argument("--tune", metavar="FILE",
                   help="after the sweep, store the winner at each (collective, size) in the "
                   "tuning file FILE: the least median over --rounds where it beats the "
                   "runner-up by more than the run's noise, else the model's pick, with the "
                   "medians behind it; groups made with COLLECTIVES_TUNING=FILE then have auto "
                   "run those (may be the --calibrate file; `python -m collectives tune show "
                   "FILE` prints it)")
    p.add_argument("--simulate", type=int, metavar="P",
                   help="no transport: print the model's predicted table for P ranks (the "
                   "--backend's parameters) and verify the schedules at P in the simulator")
    p.add_argument("--verify-seconds", type=float, default=60.0,
                   help="--simulate: time budget for verifying schedules")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--progress", action="store_true", help="a progress bar even if stderr "
                   "is not a terminal (default: only on a terminal)")
    return p


def parse_args(argv=None):
    """The parsed flags; ``backend`` stays None when not given (``main`` resolves it with
    ``default_backend``, which may refuse with a message)."""
    return build_parser().parse_args(argv)


def _names(text, valid, what):
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in valid]
    if bad or not names:
        raise ValueError(f"bench: unknown {what} {', '.join(bad) or '(none)'}; "
                         f"valid: {', '.join(valid)}")
    return names


def _registered() -> tuple:
    """Registered algorithms outside the default set (ring_bidirectional): runnable by name."""
    from .algorithms import capabilities
    names = {a for algs in capabilities().values() for a in algs}
    return tuple(sorted(names - set(ALGORITHMS)))


def _rounds(value) -> int:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"bench: --rounds must be a positive integer, got {value!r}")
    return value


def config_from_args(args) -> Config:
    parse_dtype(args.dtype)
    ReduceOp.parse(args.op)
    return Config(
        collectives=_names(args.collectives, BENCH_COLLECTIVES, "collective"),
        algorithms=_names(args.algorithms, ALGORITHMS + _registered(), "algorithm"),
        sizes=parse_sizes(args.sizes), dtype=args.dtype, op=args.op, iters=args.iters,
        warmup=args.warmup, min_time=args.min_time, rounds=_rounds(args.rounds),
        progress=(args.progress or sys.stderr.isatty()) and not args.no_progress)


def calibrate_groups(groups, path: str, timeout: float):
    """Fit α, β, γ on the groups' transport (a collective call), save them to ``path`` from
    rank 0, point this process (``COLLECTIVES_TUNING``) at the file and rebuild the groups'
    decision tables from it."""
    def one(group):
        params = cost.calibrate(group, timeout=timeout)
        if group.rank == 0:
            cost.save_params(path, group.transport.name, params)
        _barrier(group)            # the file exists before any rank reads it
        return params
    params = on_every_group(groups, one)
    os.environ[settings.TUNING.name] = path
    on_every_group(groups, lambda group: group.retable())
    return params


def tune(path: str, rows, transport: str, itemsize: int) -> None:
    """``--tune``: the run's winners into the tuning file, what the decision table reads
    (``tuning.decisions_from_records``: the least median over rounds where it beats the
    runner-up by more than the run's noise, else the model's pick), with the medians behind
    each. Rank 0 only, after the sweep."""
    params = cost.load_params(transport)
    decisions = tuning.decisions_from_records(rows, params, itemsize)
    tuning.save(path, transport, params, decisions)
    chosen = [row for table in decisions.values() for row in table]
    by_model = sum(row["by"] == "model" for row in chosen)
    noise = f"{chosen[0]['noise']:.1%} ({chosen[0]['noise_from']})" if chosen else "-"
    print(f"# tuned {transport}: {len(chosen)} decisions over {len(decisions)} (collective, "
          f"world size), {by_model} within the run's noise {noise} left to the model "
          f"-> {path}", flush=True)


def describe_params(params) -> str:
    def rate(seconds_per_byte):
        return f"{1e-9 / seconds_per_byte:.3g} GB/s" if seconds_per_byte else "unbounded"
    return (f"alpha {params.alpha * 1e6:.2f} us, 1/beta {rate(params.beta)}, "
            f"1/gamma {rate(params.gamma)}")


def comment(text: str, width: int = 100) -> str:
    """``text`` as '#' lines of at most ``width`` characters (paths are never split)."""
    import textwrap
    return textwrap.fill(text, width, initial_indent="# ", subsequent_indent="#   ",
                         break_long_words=False, break_on_hyphens=False)


def _refuse(message: str) -> int:
    """A bad argument or setup, found before any group exists: said once per job (by the
    launcher's rank 0, not by every rank of ``mpiexec -n 8``), exit status 2."""
    if launch_rank() == 0:
        print(f"bench: {message}", file=sys.stderr, flush=True)
    return 2


def _resolve_backend(args) -> str:
    if args.backend:
        return args.backend
    try:
        return default_backend()
    except ValueError:
        if args.simulate is not None:
            return "local"           # no transport runs: any backend's parameters will do
        raise


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    try:
        args.backend = _resolve_backend(args)
        config = config_from_args(args)
        if args.tuning:
            cost.load_params(args.backend, args.tuning)       # unreadable: say so now
            os.environ[settings.TUNING.name] = args.tuning
        if args.simulate is not None and (args.calibrate or args.tune):
            raise ValueError("--simulate runs no transport, so it cannot --calibrate or "
                             "--tune; give it a tuning file with --tuning FILE")
        if args.simulate is None and args.backend == "local" and (
                not args.world_size or args.world_size < 1):
            raise ValueError("--backend local needs --world-size N (N >= 1): its ranks are "
                             "N threads of this process")
    except ValueError as exc:
        return _refuse(str(exc))
    if args.plot and (problem := check_plotting()):
        return _refuse(problem)
    if args.simulate is not None:
        from .bench_model import simulate_main
        return simulate_main(args, config)
    if args.backend == "mpi":
        from .transports import available
        usable, why = available("mpi")
        if not usable:
            return _refuse(f"--backend mpi: {why}; or run without MPI: --backend socket "
                           f"--world-size 2, or --backend local --world-size 2")
    if args.backend == "socket":
        from . import bench_socket
        if not bench_socket.launched():
            try:
                return bench_socket.launch(argv, 2 if args.world_size is None
                                           else args.world_size)
            except ValueError as exc:
                return _refuse(str(exc))
    if args.backend == "nccl":           # stream-ordered GPU work: CUDA-event timing there
        from . import bench_nccl
        if not bench_nccl.launched():    # by hand: one rank per GPU under collectives.run
            try:
                return bench_nccl.self_launch(argv, args.world_size)
            except ValueError as exc:
                print(f"bench: {exc}", file=sys.stderr)
                return 2
        return bench_nccl.run_from_bench(args, BACKENDS["nccl"](args)[0][0])
    groups = BACKENDS[args.backend](args)
    leader = groups[0][0].rank == 0
    ranks_here, cores = host_load(groups[0][0])          # a collective call under MPI
    crowded = oversubscription_warning(ranks_here, cores, args.backend)
    if args.calibrate:
        fitted = calibrate_groups(groups, args.calibrate, args.timeout)
        if leader:
            print(f"# calibrated {groups[0][0].transport.name}: {describe_params(fitted)} "
                  f"-> {args.calibrate}", flush=True)
    meta = metadata(groups, config)
    meta.update(executor=describe_executor(groups[0][0], parse_dtype(config.dtype),
                                           max(config.sizes)), ranks_on_host=ranks_here,
                cores_on_host=cores, oversubscribed=crowded is not None)
    current = [None]

    def show(record):
        if record["collective"] != current[0]:
            print(("\n" if current[0] else "") + header(record["collective"]), flush=True)
            current[0] = record["collective"]
        print(format_record(record), flush=True)

    if leader:
        size = meta["world_size"]
        print(f"# collectives bench: backend {meta['backend']}, {size} rank"
              f"{'s' if size != 1 else ''}, "
              f"dtype {config.dtype}, op {config.op}"
              + (f", {meta['mpi_library']}" if meta.get("mpi_library") else ""), flush=True)
        print(comment(f"executor: {meta['executor']}"), flush=True)
        print(f"# host: {ranks_here} rank{'s' if ranks_here != 1 else ''} of this job on "
              f"{cores} usable core{'s' if cores != 1 else ''}", flush=True)
        if crowded:
            print(comment(crowded), flush=True)
        if args.backend == "mpi" and meta["world_size"] == 1 and not any(
                k in os.environ for k in _MPI_LAUNCHER_VARS):
            print(comment("1 rank: not started by mpiexec, so no rank has a peer; run "
                          "mpiexec -n N python benchmarks/bench.py"), flush=True)
        transport = groups[0][0].transport.name
        print(f"# model ({transport}): {describe_params(cost.load_params(transport))} from "
              f"{settings.TUNING() or 'the defaults'}", flush=True)
    records = run(groups, config, on_record=show)
    wrong = sum(r["wrong"] for r in records)
    if leader:
        summary = summarize(records)
        print(format_summary(summary))
        if crowded:                      # again here: the header has scrolled away by now
            print(comment(crowded), flush=True)
        if args.json:
            write_json(args.json, meta, records, summary)
        if args.csv:
            write_csv(args.csv, records)
        if args.plot:
            write_plot(args.plot, records, meta)
        if args.tune:
            tune(args.tune, records, groups[0][0].transport.name,
                 parse_dtype(config.dtype).itemsize)
        print(f"# {len(records)} rows, {wrong} wrong elements", flush=True)
        if wrong:
            print(f"bench: {wrong} wrong elements (rows with wrong > 0 above)", file=sys.stderr)
    for group, _ in groups:
        for owner in (group.transport.native, group.transport):   # gloo baseline first
            close = getattr(owner, "close", None)
            if close:
                close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
