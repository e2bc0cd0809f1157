"""The sweep: collectives x sizes x algorithms, each row a record of one schema on every backend.

``sweep(group, config, bench)`` runs on every rank and *returns* the records (identical on
every rank). ``bench`` is the backend's side (``HostBench`` here for mpi, socket and local;
``nccl.GpuBench`` for GPUs): its clock and host coordination (``timing``), the rows it offers
at one (collective, size) (``entries``: one ``Entry`` per row, with the call to time and how
to check it) and how many calls to time. Everything else is shared: warm-up, the checks,
batches of back-to-back calls, rounds and their order, merging rounds, the model's columns
and the ratio to native.

Rounds: each (collective, size)'s rows run ``config.rounds`` times, interleaved, the order
rotated each round; a record pools its rounds' batches and keeps each round's p50
(``round_p50_us``): a drifting machine then slows all rows of a size alike, and the spread of
one row over its rounds is the run's noise (``report.run_noise``). With adaptive iterations a
round gets ``min_time / rounds`` seconds of calls, so more rounds cost no more time.

Record fields: collective, algorithm ("native" is the transport's library, named by
native_name: "gloo", an MPI library, "nccl"; labelled rows such as ``ring:sendrecv`` are
variants of a schedule), chosen (the algorithm ``auto`` ran, else the algorithm's schedule),
backend, world_size, size (bytes), count, dtype, op, iters (timed calls over all rounds),
time_p50_us, time_p99_us, algbw_gbs, busbw_gbs, ratio_to_native (busbw / native's, None
without a native row), predicted_us and model_error (None where the model does not price the
row), wrong; with rounds > 1 also rounds and round_p50_us. A backend may add fields (the GPU
rows' ratio_to_ceiling).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..algorithms import capabilities, cost, two_level
from ..algorithms.hierarchical import SUPPORTED as HIERARCHICAL
from ..algorithms.hierarchical import is_hierarchical, qualify
from ..ops import ReduceOp
from .cases import ALGORITHMS, BENCH_COLLECTIVES, BUS_FACTOR, REDUCING, Case, element_count, \
    format_size, parse_dtype
from .timing import BATCHES, GroupHost, HostClock, split


@dataclass
class Config:
    collectives: tuple = BENCH_COLLECTIVES
    algorithms: tuple = ALGORITHMS
    sizes: tuple = ()                     # bytes of the larger buffer of each call
    dtype: str = "float32"
    op: str = "sum"
    iters: int | None = None              # timed calls per row and round; None: adapt
    warmup: int = 2
    min_time: float = 0.25                # seconds of timed calls per row, over its rounds
    min_iters: int = 5
    max_iters: int = 1000
    rounds: int = 3                       # interleaved repetitions of each size's rows
    progress: bool = False
    extra: dict = field(default_factory=dict)


@dataclass
class Entry:
    """One row at one (collective, size): what to call and how to check it."""
    algorithm: str                        # the record's name: ring, auto, native, ring:graph
    call: Callable[[], None]
    chosen: str | None = None             # the schedule it runs (auto's pick; a variant's base)
    barrier: Callable[[], None] | None = None   # default: the backend's
    env: dict = field(default_factory=dict)     # settings in force while it runs
    poison: Callable[[], None] | None = None    # overwrite the output before a checked call
    wrong: Callable[[], int] | None = None      # wrong elements of the last call; None: unchecked
    check_last: bool = True               # False: calls feed on their own output (in place)
    priced: bool = True                   # the model predicts this row
    extra: dict = field(default_factory=dict)   # fields added to the record


@contextmanager
def settings_in_force(env: dict):
    """``env`` set for the duration (None removes a variable), then put back as it was."""
    saved = {name: os.environ.get(name) for name in env}
    try:
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = str(value)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def plan_rows(config: Config, group) -> list[tuple]:
    """(collective, size, algorithm) in run order; native first so ours print its ratio."""
    have = capabilities()
    native = group.transport.native
    dtype, op = parse_dtype(config.dtype), ReduceOp.parse(config.op)
    rows = []
    for collective in config.collectives:
        names = [a for a in config.algorithms if a in have[collective] or a == "auto"
                 or (is_hierarchical(a) and collective in HIERARCHICAL)]
        if "native" in config.algorithms and native is not None and native.supports(
                collective, dtype, op if collective in REDUCING else ReduceOp.SUM):
            names.insert(0, "native")
        for size in config.sizes:
            rows.extend((collective, size, name) for name in names)
    return rows


def _by_size(rows):
    """Consecutive rows of one (collective, size): [((collective, size), [algorithms])]."""
    groups = []
    for collective, nbytes, algorithm in rows:
        if groups and groups[-1][0] == (collective, nbytes):
            groups[-1][1].append(algorithm)
        else:
            groups.append(((collective, nbytes), [algorithm]))
    return groups


def sweep(group, config: Config, bench, on_record=None) -> list[dict]:
    """Every row of ``config`` on this rank (every rank calls this with the same config);
    returns the records, identical on every rank; ``on_record`` sees each on rank 0."""
    dtype, op = parse_dtype(config.dtype), ReduceOp.parse(config.op)
    p, rank = group.size, group.rank
    rows = plan_rows(config, group)
    rounds = max(1, int(config.rounds))
    records, native_busbw = [], {}
    progress = None
    if config.progress and rank == 0:
        from .report import Progress
        progress = Progress(len(rows) * rounds)
    params = group.table.params           # the model auto ranks with (its transport's)
    native = group.transport.native
    native_name = getattr(native, "name", None) or group.backend if native is not None else None
    with bench.running():
        bench.prepare()
        done = 0
        for (collective, nbytes), names in _by_size(rows):
            count = element_count(collective, nbytes, dtype.itemsize, p)
            entries = bench.entries(collective, count, dtype, op, names)
            runs = {e.algorithm: [] for e in entries}
            for r in range(rounds):
                for entry in entries[r % len(entries):] + entries[:r % len(entries)]:
                    if progress:
                        progress.update(done, f"{collective} {entry.algorithm} "
                                              f"{format_size(nbytes)}")
                    runs[entry.algorithm].append(measure(entry, bench, config, nbytes, rounds))
                    done += 1
            at_size = []
            for entry in entries:
                record = _record(group, entry, runs[entry.algorithm], collective, count, dtype,
                                 op)
                _add_model(record, entry, group, params, native_name)
                if entry.algorithm == "native":
                    native_busbw[collective, count] = record["busbw_gbs"]
                base = native_busbw.get((collective, count))
                record["ratio_to_native"] = (record["busbw_gbs"] / base) if base else None
                at_size.append(record)
            bench.annotate(at_size)
            for record in at_size:
                records.append(record)
                if on_record is not None and rank == 0:
                    if progress:
                        progress.clear()
                    on_record(record)
            bench.release()
    if progress:
        progress.finish()
    return records


def measure(entry: Entry, bench, config: Config, nbytes: int, rounds: int) -> dict:
    """One round of one row: warm-up (the first result checked, its time sizing the batches
    where iterations adapt), then batches of back-to-back calls, each after a barrier; the
    slowest rank's time per call in each batch, and the wrong elements summed over ranks."""
    clock, host = bench.clock, bench.host
    barrier = entry.barrier or host.barrier
    with settings_in_force(entry.env):
        if entry.poison:
            entry.poison()
        barrier()
        first = clock.once(entry.call)
        wrong = entry.wrong() if entry.wrong else 0
        for _ in range(max(0, config.warmup - 1)):
            entry.call()
        clock.settle()
        if config.iters is not None:
            calls, batches = split(config.iters, bench.batches(nbytes))
        else:
            slowest = float(host.max_each([first])[0])
            calls, batches = bench.iterations(nbytes, slowest, config, rounds)
        if entry.poison and entry.check_last:
            entry.poison()
        times = np.empty(batches)
        for b in range(batches):
            barrier()
            times[b] = clock.batch(entry.call, calls)
        if entry.wrong and entry.check_last:
            wrong += entry.wrong()
    return {"times": host.max_each(times), "wrong": host.sum(wrong), "iters": calls * batches}


def _record(group, entry, runs, collective, count, dtype, op) -> dict:
    """One record from a row's rounds: p50/p99 over all their batches, wrong summed."""
    p = group.size
    per_round = [run["times"] for run in runs]
    times = np.concatenate(per_round)
    p50, p99 = (float(x) for x in np.percentile(times, [50, 99]))
    nbytes = count * dtype.itemsize
    algbw = nbytes / p50 / 1e9
    record = {
        "collective": collective, "algorithm": entry.algorithm, "backend": group.backend,
        "world_size": p, "size": nbytes, "count": count, "dtype": dtype.name,
        "op": op.name.lower() if collective in REDUCING else "none",
        "iters": sum(run["iters"] for run in runs),
        "time_p50_us": p50 * 1e6, "time_p99_us": p99 * 1e6, "algbw_gbs": algbw,
        "busbw_gbs": algbw * BUS_FACTOR[collective](p),
        "wrong": sum(run["wrong"] for run in runs)}
    if len(runs) > 1:
        # each round's own p50: how far one row moves between its rounds in this run
        record["rounds"] = len(runs)
        record["round_p50_us"] = [float(np.percentile(t, 50)) * 1e6 for t in per_round]
    record.update(entry.extra)
    return record


def _add_model(record, entry, group, params, native_name):
    """The schedule the row ran, the model's prediction for it and measured/predicted."""
    record["native_name"] = native_name
    if entry.algorithm == "native":
        record.update(chosen="native", predicted_us=None, model_error=None)
        return
    chosen = qualify(entry.chosen or entry.algorithm, group.topology)
    record["chosen"] = chosen
    known = chosen in capabilities().get(record["collective"], ()) or is_hierarchical(chosen)
    if not entry.priced or not known:
        record.update(predicted_us=None, model_error=None)
        return
    itemsize = record["size"] // max(1, record["count"])
    inter = group.table.inter          # set where the group's topology has several hosts
    if inter is not None:              # the two-level model, as auto priced the row
        predicted = two_level.estimate(record["collective"], chosen, group.topology,
                                       record["size"], intra=params, inter=inter,
                                       itemsize=itemsize)
        if predicted is None:          # a flat schedule it has no form for at this scale
            record.update(predicted_us=None, model_error=None)
            return
        predicted *= 1e6
    else:
        predicted = cost.estimate(record["collective"], chosen, group.size, record["size"],
                                  params, itemsize) * 1e6
    record.update(predicted_us=predicted,
                  model_error=record["time_p50_us"] / predicted if predicted > 0 else None)


# ---------------------------------------------------------------------------------------------
# the CPU backends' side: host buffers, host clocks


def row_barrier(group, algorithm):
    """The barrier before each batch of a row. Over sockets the baseline (torch's gloo) is
    another library with threads of its own: each side's rows meet at that side's own
    barrier. gloo's barrier leaves the ranks tens of µs apart and its gloo_tcp_loop thread
    busy for a while after it, which slows our small calls made right after it while gloo's
    own rows time the same after either barrier (BENCHMARKS.md §2). Under MPI the native
    library is the transport itself."""
    if algorithm != "native" and group.transport.name == "socket":
        return lambda: group.prepare("barrier", algorithm=None)()
    return GroupHost(group).barrier


class HostBench:
    """mpi, socket and local: numpy buffers, the host's clock, the group's collectives."""

    def __init__(self, group):
        self.group = group
        self.clock = HostClock()
        self.host = GroupHost(group)

    def running(self):
        return nullcontext()

    def annotate(self, records):
        """Nothing to add: the CPU rows have the shared fields only."""

    def prepare(self):
        for _ in range(10):      # connections and lazy initialisation, before the first row
            self.host.barrier()
            self.host.max_each(np.zeros(1024))

    def batches(self, nbytes: int) -> int:
        return BATCHES

    def iterations(self, nbytes, slowest, config, rounds) -> tuple[int, int]:
        """About ``min_time`` seconds of calls per row, shared by its rounds."""
        total = config.min_time / rounds / max(slowest, 1e-7)
        total = min(config.max_iters, max(config.min_iters, total))
        return split(total, BATCHES)

    def entries(self, collective, count, dtype, op, names) -> list[Entry]:
        group = self.group
        case = Case(collective, group.rank, group.size, count, dtype, op)
        op_arg = op if collective in REDUCING else ReduceOp.SUM
        nbytes = count * dtype.itemsize
        out = []
        for name in names:
            def call(name=name):
                group.prepare(collective, input=case.input, output=case.output, op=op_arg,
                              algorithm=name)()
            chosen = group.resolve_algorithm(collective, "auto", nbytes) if name == "auto" \
                else None
            out.append(Entry(name, call, chosen=chosen, barrier=row_barrier(group, name),
                             poison=case.poison, wrong=case.wrong))
        return out

    def release(self):
        """Nothing to free: a size's buffers go with its entries."""


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


def bench_rank(group, config: Config, on_record=None, bench=None) -> list[dict]:
    """The sweep on this rank with its backend's side (``HostBench`` unless given)."""
    return sweep(group, config, bench or HostBench(group), on_record)


def run(groups, config: Config, on_record=None, make_bench=HostBench) -> list[dict]:
    """The sweep on every group of this process (threads when there are several); rank 0's
    records (or this process's, under MPI)."""
    return on_every_group(groups, lambda group: sweep(group, config, make_bench(group),
                                                      on_record))
