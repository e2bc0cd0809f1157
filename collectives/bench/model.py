"""``bench.py --simulate P``: the cost model's table at a world size no machine here has.

No transport is opened. For each collective x algorithm x size of the sweep, ``cost.estimate``
(the α-β-γ model with the backend's parameters: ``--tuning FILE``, else COLLECTIVES_TUNING,
else the defaults) predicts the time; busbw follows nccl-tests' factors; ``*`` marks the
predicted best of the listed algorithms at each size (what ``auto`` runs when these are all
the registered ones; name others with ``--algorithms``).

Then the schedules themselves are proved at P by the simulator (``simulate.verify``: every
rank's plan run in one process on random 64-bit words with a wrapping sum, so a lost or doubled
contribution shows) with small, uneven counts (all_reduce P+1 elements, one element per
block elsewhere). The simulator is pure Python and walks every transfer: the ring schedules
cost O(P²) transfers, ~50 s for the ring all_reduce at P = 1024 on this machine, so
verification runs cheapest first and starts a check only while its estimated time (from the
operation count) fits what is left of ``--verify-seconds`` (default 60); it names what it
skipped, with the estimate. Estimates are rough (the machine's load can double a check's
time), so the total may overrun the budget by one check.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

from .. import settings, tuning_file
from ..algorithms import capabilities, cost
from ..algorithms.schedule import build_plan, plan_args
from ..algorithms.simulate import verify
from .cases import BUS_FACTOR, element_count, format_size, parse_dtype

# Seconds per operation (transfer or local operation, summed over ranks) of the simulator on
# a 2-core machine: 8.4 M operations of the ring all_reduce at P = 1024 took 50 s.
SIMULATOR_SECONDS_PER_OP = 6e-6


def effective_sizes(collective: str, sizes, itemsize: int, p: int) -> list[tuple[int, list]]:
    """[(element count, the requested sizes that come to it)] in the order first requested:
    a size is rounded to whole elements and, where it is split into blocks, to at least one
    element per rank, so at large P several small sizes are one call (4K and 16K of float32
    at P = 4096 are both 4096 elements)."""
    merged: dict[int, list] = {}
    for size in sizes:
        merged.setdefault(element_count(collective, size, itemsize, p), []).append(size)
    return list(merged.items())


def predicted_rows(p: int, collectives, algorithms, sizes, params, itemsize: int = 4):
    """One record per (collective, effective size, algorithm) with the model's time and
    busbw; ``best`` marks the least predicted time at that size (ties by name, as ``auto``
    breaks them); ``requested``: the sizes asked for that come to this one
    (``effective_sizes``), so no call is listed twice."""
    have = capabilities()
    rows = []
    for collective in collectives:
        names = [a for a in algorithms if a in have[collective]]
        for count, requested in effective_sizes(collective, sizes, itemsize, p):
            nbytes = count * itemsize
            ranked = cost.ranking(collective, p, nbytes, params, names, itemsize)
            for seconds, name in sorted(ranked, key=lambda item: names.index(item[1])):
                algbw = nbytes / seconds / 1e9 if seconds > 0 else float("inf")
                rows.append({"collective": collective, "algorithm": name, "world_size": p,
                             "size": nbytes, "count": count, "predicted_us": seconds * 1e6,
                             "busbw_gbs": algbw * BUS_FACTOR[collective](p),
                             "best": name == ranked[0][1], "requested": requested})
    return rows


def format_duration(seconds: float) -> str:
    """A wall time in the unit that shows it: ``850 us``, ``12.3 ms``, ``4.56 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def verify_counts(collective: str, p: int):
    """Small counts that still exercise uneven and short blocks."""
    if collective == "all_reduce":
        return p + 1
    if collective in ("reduce_scatter", "all_gather"):
        return (1,) * p
    if collective == "all_to_all":
        return ((1,) * p,) * p
    raise ValueError(f"bench --simulate: no verification counts for {collective}")


def simulator_work(collective, algorithm, p, counts) -> int:
    """About how many operations the simulator walks: rank 0's plan's, times P."""
    plan = build_plan(collective, algorithm, 0, p, *plan_args(collective, p, counts, 0))
    return p * sum(1 + len(s.sends) + len(s.recvs) + len(s.local) for s in plan.steps)


def verify_all(p: int, collectives, algorithms, budget: float, out=None):
    """Verify every (collective, algorithm) at P, cheapest first, within ``budget`` seconds,
    reporting each to ``out`` (sys.stdout as it is at the call).
    Returns [{collective, algorithm, counts, seconds | estimate_s, status}]."""
    out = sys.stdout if out is None else out
    have = capabilities()
    jobs = []
    for collective in collectives:
        for name in (a for a in algorithms if a in have[collective]):
            counts = verify_counts(collective, p)
            work = simulator_work(collective, name, p, counts)
            jobs.append((work, collective, name, counts))
    results, spent = [], 0.0
    for work, collective, name, counts in sorted(jobs, key=lambda job: job[0]):
        estimate = work * SIMULATOR_SECONDS_PER_OP
        entry = {"collective": collective, "algorithm": name,
                 "counts": "P+1" if collective == "all_reduce" else "1 per block"}
        if spent + estimate > budget:
            entry.update(status="skipped", estimate_s=estimate)
            results.append(entry)
            print(f"#   {collective:15s} {name:19s} skipped: ~{format_duration(estimate)} in "
                  f"the simulator would pass --verify-seconds {budget:g}", file=out, flush=True)
            continue
        start = time.perf_counter()
        try:
            verify(collective, name, p, counts)
            entry["status"] = "ok"
        except Exception as exc:       # a wrong or deadlocking schedule: report, go on
            entry.update(status="FAILED", error=str(exc))
        entry["seconds"] = time.perf_counter() - start
        spent += entry["seconds"]
        results.append(entry)
        print(f"#   {collective:15s} {name:19s} {entry['status']:6s} "
              f"{format_duration(entry['seconds']):>9s}"
              + (f"  {entry['error']}" if entry.get("error") else ""), file=out, flush=True)
    return results


def format_rows(rows) -> str:
    lines = []
    for collective in dict.fromkeys(r["collective"] for r in rows):
        p = rows[0]["world_size"]
        lines += ["", f"# {collective}, {p} ranks (predicted; * = best of these)",
                  f"#{'size':>9} {'count':>11} {'algorithm':>19} {'model_us':>12} "
                  f"{'busbw':>9}  best", "#" + "-" * 68]
        rounded = {}
        for r in rows:
            if r["collective"] == collective:
                asked = [s for s in r.get("requested", ()) if s != r["size"]]
                if asked:
                    rounded[r["size"]] = asked
        why = "whole elements" if collective == "all_reduce" else \
            "whole elements, at least one per rank"
        for size, asked in rounded.items():
            lines.append(f"# {', '.join(map(format_size, asked))} -> {format_size(size)}: {why}")
        for r in (r for r in rows if r["collective"] == collective):
            lines.append(f"{format_size(r['size']):>10} {r['count']:>11} {r['algorithm']:>19} "
                         f"{r['predicted_us']:>12.1f} {r['busbw_gbs']:>9.3f}  "
                         f"{'*' if r['best'] else ''}")
    return "\n".join(lines)


def simulate_main(args, config) -> int:
    """The ``--simulate P`` mode of the bench CLI; returns the exit code."""
    p = args.simulate
    if p < 1:
        print(f"bench: --simulate needs P >= 1, got {p}", file=sys.stderr)
        return 2
    algorithms = [a for a in config.algorithms if a not in ("native", "auto")]
    itemsize = parse_dtype(config.dtype).itemsize
    params = tuning_file.load_params(args.backend)
    print(f"# collectives bench --simulate {p}: {args.backend} model, "
          f"{params.describe()} from {settings.TUNING() or 'the defaults'}"
          f", dtype {config.dtype}", flush=True)
    start = time.perf_counter()
    rows = predicted_rows(p, config.collectives, algorithms, config.sizes, params, itemsize)
    print(format_rows(rows), flush=True)
    print(f"\n# predicted in {format_duration(time.perf_counter() - start)}", flush=True)
    print(f"# verifying the schedules at P = {p} in the simulator (small counts):", flush=True)
    start = time.perf_counter()
    checks = verify_all(p, config.collectives, algorithms, args.verify_seconds)
    failed = [c for c in checks if c["status"] == "FAILED"]
    skipped = [c for c in checks if c["status"] == "skipped"]
    print(f"# verification took {format_duration(time.perf_counter() - start)}: "
          f"{sum(c['status'] == 'ok' for c in checks)} ok, {len(failed)} failed, "
          f"{len(skipped)} skipped", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": {"simulate": p, "backend": args.backend,
                                "params": asdict(params)},
                       "records": rows, "verification": checks}, f, indent=1)
    return 1 if failed else 0
