"""The bench's command line: flags -> ``Config``, the backend's groups, the sweep, the report.

``main`` is ``benchmarks/bench.py``, ``python -m collectives.bench`` and ``collectives-bench``;
``run_groups`` is the part after the groups exist, shared by every backend (the GPU bench's
``run_from_bench`` enters there too). Exit status: 1 when any result is wrong, 2 on bad
arguments or setup (said once per job, by the launcher's rank 0).
"""
from __future__ import annotations

import argparse
import os
import sys

from .. import calibration, settings, tuning, tuning_file
from ..algorithms import capabilities
from ..ops import ReduceOp
from . import fit, report
from .backends import BACKENDS, default_backend, launch, launch_rank, under_launcher, under_mpi
from .cases import ALGORITHMS, BENCH_COLLECTIVES, DEFAULT_SIZES, parse_dtype, parse_sizes
from .machine import describe_executor, host_load, oversubscription_warning
from .report import comment
from .sweep import Config, HostBench, on_every_group, run


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
    _run_arguments(p)
    _sweep_arguments(p)
    _timing_arguments(p)
    _output_arguments(p)
    _model_arguments(p)
    _nccl_arguments(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--progress", action="store_true", help="a progress bar even if stderr "
                   "is not a terminal (default: only on a terminal)")
    return p


def _run_arguments(p: argparse.ArgumentParser) -> None:
    """Where the ranks run: the backend, how many ranks, their binding."""
    p.add_argument("--backend", choices=sorted(BACKENDS), default=None,
                   help="default: mpi under an MPI launcher or when mpi4py is available, socket "
                   "under collectives.run/torchrun; with neither, choose one. socket run by hand "
                   "launches --world-size local processes and compares with torch's gloo")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks for --backend local (required there), and processes that "
                   "--backend socket (default 2) or nccl (default: one per visible GPU) "
                   "launches when not started by a launcher")
    p.add_argument("--bind-to", choices=("none", "core"), default="none",
                   help="--backend socket run by hand: each process on one core (core: on "
                   "a machine with few cores our rows vary less between rounds and run "
                   "faster bound, while gloo, whose threads then share the core, runs "
                   "slower: ratios to gloo differ from unbound runs) or wherever the OS "
                   "puts them (none, as torchrun); under mpiexec or "
                   "a launcher, theirs decides (mpiexec --bind-to core, collectives.run "
                   "--bind-to core)")


def _sweep_arguments(p: argparse.ArgumentParser) -> None:
    """What the sweep runs: collectives, algorithms, sizes, element type, op."""
    p.add_argument("--collectives", default=",".join(BENCH_COLLECTIVES),
                   help="comma-separated collectives to run, from "
                   + ", ".join(BENCH_COLLECTIVES))
    p.add_argument("--algorithms", default=",".join(ALGORITHMS),
                   help="comma-separated algorithms (also any registered one, e.g. direct, "
                   "ring_bidirectional, and hierarchical:<intra>+<inter> on the group's "
                   "COLLECTIVES_TOPOLOGY); those a collective lacks are skipped; native is "
                   "the transport's library, auto what algorithm=\"auto\" picks")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help="bytes of each call's larger buffer: LOW:HIGH (x4 steps), "
                   "LOW:HIGH:FACTOR, a size, or a comma-separated list; K, M, G suffixes "
                   "(e.g. 4K:16M:2, 1M, 4K,64K)")
    p.add_argument("--dtype", default="float32",
                   help="element type: a numpy name (float16, float64, int32, ...) or bfloat16")
    p.add_argument("--op", default="sum", help="reduction op for all_reduce/reduce_scatter "
                   "(sum, avg, product, min, max, band, bor, bxor)")


def _timing_arguments(p: argparse.ArgumentParser) -> None:
    """How each row is timed."""
    p.add_argument("--iters", type=int, default=None,
                   help="timed calls per row and round, back to back in a few batches "
                   "(default: adapt, --min-time per row; on GPUs by size)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed calls per row before timing; the first one's result is checked")
    p.add_argument("--min-time", type=float, default=0.25,
                   help="seconds per row when iterations adapt")
    p.add_argument("--rounds", type=int, default=3,
                   help="run each size's rows this many times, interleaved (order rotated "
                   "each round), sharing --min-time, and pool their batches: comparisons "
                   "then survive a machine whose speed drifts, and the spread of one row over "
                   "its rounds is the run's noise, printed with the summary")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a stuck collective is an error")


def _output_arguments(p: argparse.ArgumentParser) -> None:
    """Where the records go besides the table."""
    p.add_argument("--json", metavar="FILE",
                   help="write the records, the summary and the run's metadata (backend, "
                   "executor, ranks and cores of the host, ...) as JSON")
    p.add_argument("--csv", metavar="FILE", help="write the records as CSV, one row each")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot busbw against size, one panel per collective, native dashed "
                   "(needs matplotlib)")


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """The cost model and the tuning file."""
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


def _nccl_arguments(p: argparse.ArgumentParser) -> None:
    """--backend nccl's extra rows."""
    p.add_argument("--segments", default="", metavar="SIZES",
                   help="--backend nccl: ring:seg=N rows, the send/recv executor pipelining "
                   "in N-byte segments (e.g. 16M,64M)")
    p.add_argument("--graph-max", default="16M", metavar="SIZE",
                   help="--backend nccl: <algorithm>:graph rows (captured once as a CUDA "
                   "graph, then replayed) up to this size; 0 for none")
    p.add_argument("--probe", default="", metavar="SIZES",
                   help="--backend nccl: first the raw p2p sweep at these sizes (e.g. 1M:1G)")


def parse_args(argv=None):
    """The parsed flags; ``backend`` stays None when not given (``main`` resolves it with
    ``default_backend``, which may refuse with a message)."""
    return build_parser().parse_args(argv)


def _hierarchical_name(name) -> bool:
    """``hierarchical:<intra>+<inter>`` (the group's topology added) or with ``@<hosts>``
    (no commas: ``@2x4``), valid for at least one collective."""
    from ..algorithms import hierarchical
    if not hierarchical.is_hierarchical(name):
        return False
    for collective in hierarchical.SUPPORTED:
        try:
            hierarchical.parse(collective, hierarchical.qualify(name, "1"))
            return True
        except ValueError:
            pass
    return False


def _names(text, valid, what):
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if n not in valid
           and not (what == "algorithm" and _hierarchical_name(n))]
    if bad or not names:
        raise ValueError(f"bench: unknown {what} {', '.join(bad) or '(none)'}; "
                         f"valid: {', '.join(valid)}")
    return names


def _registered() -> tuple:
    """Registered algorithms outside the default set (ring_bidirectional): runnable by name."""
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
        params = calibration.calibrate(group, timeout=timeout)
        if group.rank == 0:
            tuning_file.save_params(path, group.transport.name, params)
        HostBench(group).host.barrier()          # the file exists before any rank reads it
        return params
    params = on_every_group(groups, one)
    os.environ[settings.TUNING.name] = path
    on_every_group(groups, lambda group: group.retable())
    return params


def tune(path: str, rows, transport: str, itemsize: int, model: str | None = None) -> None:
    """``--tune``: the run's winners into the tuning file, what the decision table reads
    (``fit.decisions_from_records``: the least median over rounds where it beats the
    runner-up by more than the noise of a median, else the one faster round by round, else
    the winner at the nearest decided size, else the model's pick), with the medians
    behind each. Rank 0 only, after the sweep. ``model``: whose defaults the group ranks
    with where the file has no entry for ``transport`` (the group's executor's ``model_name``:
    ``nccl_peer`` on peer memory), the parameters saved beside the decisions."""
    params = tuning_file.load_params(transport, model=model)
    decisions = fit.decisions_from_records(rows, params, itemsize)
    tuning.save(path, transport, params, decisions)
    chosen = [row for table in decisions.values() for row in table]
    by_model = sum(row["by"] == "model" for row in chosen)
    by_rounds = sum(row["by"] == "rounds" for row in chosen)
    by_neighbour = sum(row["by"] == "neighbour" for row in chosen)
    noise = "-"
    if chosen:
        first = chosen[0]
        noise = f"{first['threshold']:.1%} (the run's noise {first['noise']:.1%}, " \
                f"{first['noise_from']}"
        noise += f", / sqrt({first['rounds']}))" if first["threshold"] != first["noise"] else ")"
    print(f"# tuned {transport}: {len(chosen)} decisions over {len(decisions)} (collective, "
          f"world size); within {noise} of the best, {by_rounds} decided round by round, "
          f"{by_neighbour} by the nearest decided size and {by_model} left to the model "
          f"-> {path}", flush=True)


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
            tuning_file.load_params(args.backend, args.tuning)       # unreadable: say so now
            os.environ[settings.TUNING.name] = args.tuning
        if args.simulate is not None and (args.calibrate or args.tune):
            raise ValueError("--simulate runs no transport, so it cannot --calibrate or "
                             "--tune; give it a tuning file with --tuning FILE")
        if args.simulate is None and args.backend == "local" and (
                not args.world_size or args.world_size < 1):
            raise ValueError("--backend local needs --world-size N (N >= 1): its ranks are "
                             "N threads of this process")
        for flag in ("segments", "probe"):
            if getattr(args, flag):
                parse_sizes(getattr(args, flag))
        if args.graph_max not in ("", "0"):
            parse_sizes(args.graph_max)
    except ValueError as exc:
        return _refuse(str(exc))
    if args.plot and (problem := report.check_plotting()):
        return _refuse(problem)
    if args.simulate is not None:
        from .model import simulate_main
        return simulate_main(args, config)
    if args.backend == "mpi":
        from ..transports import available
        usable, why = available("mpi")
        if not usable:
            return _refuse(f"--backend mpi: {why}; or run without MPI: --backend socket "
                           f"--world-size 2, or --backend local --world-size 2")
    if args.backend == "socket" and not under_launcher():
        try:
            return launch(argv, 2 if args.world_size is None else args.world_size,
                          args.bind_to)
        except ValueError as exc:
            return _refuse(f"--backend socket: {exc}")
    if args.backend == "nccl" and not (under_mpi() or under_launcher()):
        from .nccl import self_launch    # by hand: one rank per GPU under collectives.run
        try:
            return self_launch(argv, args.world_size)
        except ValueError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
    return run_groups(args, config, BACKENDS[args.backend](args))


def run_groups(args, config: Config, groups) -> int:
    """Header, sweep, summary and files for this process's ``groups`` of any backend; closes
    them. Returns the exit status (1 if any result was wrong)."""
    group = groups[0][0]
    leader = group.rank == 0
    gpu = group.transport.name == "nccl"
    make_bench, gpu_meta, extra = HostBench, {}, {}
    if gpu:
        from .nccl import GpuBench, describe_gpus, options_from, probe
        cupy = groups[0][1]
        options = options_from(args)
        options["baselines"] = "native" in config.algorithms
        make_bench = lambda g: GpuBench(g, cupy, options)    # noqa: E731
        host = group.bench_host
        gpu_meta = describe_gpus(group, cupy, host) if leader else {}
    ranks_here, cores, bound = host_load(group)   # a collective call (not for local)
    crowded = oversubscription_warning(ranks_here, cores, args.backend)
    if args.calibrate:
        fitted = calibrate_groups(groups, args.calibrate, args.timeout)
        if leader:
            print(f"# calibrated {group.transport.name}: {fitted.describe()} "
                  f"-> {args.calibrate}", flush=True)
    meta = report.metadata(groups, config)
    meta.update(gpu_meta)
    meta.update(executor=describe_executor(group, parse_dtype(config.dtype), max(config.sizes)),
                ranks_on_host=ranks_here, cores_on_host=cores, bound=bound,
                oversubscribed=crowded is not None)
    if leader:
        _print_header(args, config, meta, group, crowded, gpu)
    if gpu and args.probe:
        with cupy.cuda.Stream(non_blocking=True):
            extra["probe"] = probe(group, cupy, host, parse_sizes(args.probe))
    current = [None]

    def show(record):
        if record["collective"] != current[0]:
            print(("\n" if current[0] else "") + report.header(record["collective"]),
                  flush=True)
            current[0] = record["collective"]
        print(report.format_record(record), flush=True)

    benches = {}

    def bench_of(g):
        benches[g.rank] = make_bench(g)
        return benches[g.rank]
    records = run(groups, config, on_record=show, make_bench=bench_of)
    if gpu:
        extra["graph_capture_failures"] = benches[group.rank].close()
    wrong = sum(r["wrong"] for r in records)
    if leader:
        summary = report.summarize(records)
        print(report.format_summary(summary))
        if crowded:                      # again here: the header has scrolled away by now
            print(comment(crowded), flush=True)
        if extra.get("graph_capture_failures"):
            print(f"# graph capture failures: {extra['graph_capture_failures'][:3]}", flush=True)
        if args.json:
            report.write_json(args.json, meta, records, summary, extra)
        if args.csv:
            report.write_csv(args.csv, records)
        if args.plot:
            report.write_plot(args.plot, records, meta)
        if args.tune:
            tune(args.tune, records, group.transport.name, parse_dtype(config.dtype).itemsize,
                 group.executor.model_name)
        print(f"# {len(records)} rows, {wrong} wrong elements", flush=True)
        if wrong:
            print(f"bench: {wrong} wrong elements (rows with wrong > 0 above)", file=sys.stderr)
    for g, _ in groups:
        for owner in (g.transport.native, g.transport):   # gloo baseline first
            close = getattr(owner, "close", None)
            if close:
                close()
    if gpu:
        host.close()
    return 1 if wrong else 0


def _print_header(args, config, meta, group, crowded, gpu):
    size = meta["world_size"]
    print(f"# collectives bench: backend {meta['backend']}, {size} rank"
          f"{'s' if size != 1 else ''}, dtype {config.dtype}, op {config.op}"
          + (f", {meta['mpi_library']}" if meta.get("mpi_library") else ""), flush=True)
    if gpu:
        print(f"# gpus: {size} x {meta['gpu']}, NCCL {meta['nccl']}, CuPy {meta['cupy']}, "
              f"host sync {meta['host_sync']}", flush=True)
    print(comment(f"executor: {meta['executor']}"), flush=True)
    ranks_here, cores = meta["ranks_on_host"], meta["cores_on_host"]
    bound = ", each bound to one core" if meta.get("bound") else ""
    print(f"# host: {ranks_here} rank{'s' if ranks_here != 1 else ''} of this job on "
          f"{cores} usable core{'s' if cores != 1 else ''}{bound}", flush=True)
    if crowded:
        print(comment(crowded), flush=True)
    if args.backend == "mpi" and size == 1 and not under_mpi():
        print(comment("1 rank: not started by mpiexec, so no rank has a peer; run "
                      "mpiexec -n N python benchmarks/bench.py"), flush=True)
    transport = group.transport.name
    print(f"# model ({transport}): {tuning_file.load_params(transport).describe()} from "
          f"{settings.TUNING() or 'the defaults'}", flush=True)
    print(f"# timing: {config.rounds} round{'s' if config.rounds != 1 else ''} per row, "
          f"interleaved; each a few batches of back-to-back calls after a barrier, "
          f"{'CUDA events' if gpu else 'host clock'}; p50/p99 over batches", flush=True)
