"""Would ``auto`` pick well on this run? The cost model checked against measured times.

    python benchmarks/model_check.py                       # every run in benchmarks/results
    python benchmarks/model_check.py run.json              # your own bench --json output
    python benchmarks/model_check.py run.json=tuning.json  # ... with that run's tuning file
    python benchmarks/model_check.py --quiet run.json      # worst ratios only

For each results file (``bench.py --json``: ``records``; ``bench.py --backend nccl --json``:
``rows``) and each (collective, size) it asks the cost model *as it is now* what ``auto``
would choose among the algorithms that the run measured (``cost.cheapest`` with the transport's
parameters and measured ratios: the tuning file given after ``=``, else the transport's
defaults), then divides
that choice's measured p50 time by the best measured algorithm's: 1.00 means auto would have
picked the fastest schedule, 1.25 that its pick is 25% slower than the best. The table also
shows the model's error for the pick (measured / predicted) and, where auto's choice among
*all* registered algorithms is one the run did not measure, that name in brackets: such a
row cannot be judged from this file. Closing lines: the worst ratio per file and per
collective (the target: every ratio within 1.10).

Nothing is measured here and no device is needed: it only reads JSON and runs the model.
Rows of baselines (``native``), of ``auto`` itself and the nccl bench's ``:ceiling`` and
``:graph`` variants are not candidates. Algorithms whose plans are identical at a row's world
size and size (ring, direct and recursive doubling all_to_all at p = 2, say) are one schedule:
they share the median of their measured times, since any difference between them is noise. Where a file holds the same row twice, the median
counts. Sizes are bytes as bench reports them (``cost.uniform_counts``' convention); float32.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from collectives import tuning_file  # noqa: E402
from collectives.algorithms import capabilities, cost  # noqa: E402

RESULTS = os.path.join(HERE, "results")
# runs whose groups read a tuning file (calibrated α, β, γ), and that file, by path in RESULTS
KNOWN_TUNING = {f"cost_model_fit/mpi_8ranks_64core_{k}.json":
                f"cost_model_fit/tuning_mpi_8ranks_64core_{k}.json"
                for k in ("direct", "all_1", "all_2")}
KNOWN_TUNING.update({
    "mpi_8ranks_64core_openmpi/B.json": "mpi_8ranks_64core_openmpi/tuning.json",
    "tune_mpi_8ranks_64core/B.json": "tune_mpi_8ranks_64core/tuning.json",
    "tune_socket_2core/2ranks_B.json": "tune_socket_2core/tuning_2ranks.json",
    "tune_socket_2core/4ranks_B.json": "tune_socket_2core/tuning_4ranks.json",
})
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}


def load_run(path):
    """(transport, itemsize, {(collective, world_size, size): {algorithm: p50 seconds}},
    model: whose default parameters the run's groups ranked with: ``nccl_peer`` for an nccl
    run on peer memory, else the transport)."""
    with open(path) as f:
        data = json.load(f)
    meta = data.get("meta", {})
    rows = data.get("records") or data.get("rows") or []
    transport = meta.get("backend") or ("nccl" if "gpu" in meta or "nccl" in meta else "mpi")
    dtype = meta.get("config", {}).get("dtype") or meta.get("dtype") or "float32"
    times = defaultdict(lambda: defaultdict(list))
    for r in rows:
        name = r["algorithm"]
        if name == "native" or name.startswith("auto") or ":" in name:
            continue
        seconds = r["time_p50_us"] * 1e-6 if "time_p50_us" in r else r["time_us"] * 1e-6
        key = (r["collective"], int(r.get("world_size") or meta["world_size"]), int(r["size"]))
        times[key][name].append(seconds)
    table = {k: {a: statistics.median(v) for a, v in algs.items()} for k, algs in times.items()}
    peer = str(meta.get("executor", "")).startswith("peer-memory")
    return transport, ITEMSIZE.get(dtype, 4), table, "nccl_peer" if peer else transport


def same_schedule(collective, p, size, itemsize, algorithms):
    """Groups of ``algorithms`` whose plans are identical on every rank at this call (e.g. ring,
    direct and recursive doubling are one exchange at p = 2): to the machine they are one
    schedule, so a difference in their measured times is noise, not a better choice."""
    from collectives.algorithms.schedule import build_plan, plan_args
    args = plan_args(collective, p, cost._hashable(cost.uniform_counts(collective, p, size,
                                                                        itemsize)), 0)
    groups = {}
    for name in algorithms:
        steps = tuple(build_plan(collective, name, rank, p, *args).steps for rank in range(p))
        groups.setdefault(steps, []).append(name)
    return list(groups.values())


def merge_identical(collective, p, size, itemsize, measured):
    """``measured`` with the algorithms of one schedule sharing the median of their times."""
    merged = dict(measured)
    for group in same_schedule(collective, p, size, itemsize, sorted(measured)):
        if len(group) > 1:
            shared = statistics.median(measured[a] for a in group)
            merged.update({a: shared for a in group})
    return merged


def check(path, tuning=None):
    """[(collective, world_size, size, best, best seconds, pick, ratio, model error, overall
    pick)] for one results file, in file order of collectives and rising size."""
    transport, itemsize, table, model = load_run(path)
    params = tuning_file.load_params(transport, tuning or "", model)
    corrections = tuning_file.load_corrections(transport, tuning or "")
    out = []
    for (collective, p, size), times in table.items():
        candidates = sorted(a for a in times if a in capabilities().get(collective, ()))
        if len(candidates) < 2:
            continue
        times = merge_identical(collective, p, size, itemsize,
                                {a: times[a] for a in candidates})
        pick, predicted = cost.cheapest(collective, p, size, transport, candidates,
                                        params=params, itemsize=itemsize,
                                        corrections=corrections)
        overall, _ = cost.cheapest(collective, p, size, transport, params=params,
                                   itemsize=itemsize, corrections=corrections)
        best_t, best = min((times[a], a) for a in candidates)
        out.append((collective, p, size, best, best_t, pick, times[pick] / best_t,
                    times[pick] / predicted if predicted > 0 else float("nan"), overall))
    order = list(dict.fromkeys(r[0] for r in out))
    return transport, params, sorted(out, key=lambda r: (order.index(r[0]), r[1], r[2]))


def size_label(n):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def report(path, tuning=None, quiet=False, stream=sys.stdout):
    transport, params, rows = check(path, tuning)
    write = stream.write
    write(f"== {os.path.relpath(path)} ({transport}; {params}"
          f"{'; tuning ' + os.path.basename(tuning) if tuning else ''})\n")
    if not rows:
        write("   no (collective, size) with two measured algorithms\n")
        return None
    if not quiet:
        write(f"   {'collective':<15}{'p':>3} {'size':>6}  {'best':<19}{'best µs':>10}  "
              f"{'auto picks':<19}{'auto/best':>9}{'meas/pred':>10}\n")
        for collective, p, size, best, best_t, pick, ratio, error, overall in rows:
            flag = " <" if ratio > 1.10 else ""
            other = f" [{overall}]" if overall != pick else ""
            write(f"   {collective:<15}{p:>3} {size_label(size):>6}  {best:<19}"
                  f"{best_t * 1e6:>10.1f}  {pick:<19}{ratio:>9.2f}{error:>10.2f}{flag}{other}\n")
    worst = max(rows, key=lambda r: r[6])
    per_collective = {}
    for r in rows:
        if r[6] >= per_collective.get(r[0], (0,))[0]:
            per_collective[r[0]] = (r[6], size_label(r[2]))
    write(f"   worst auto/best {worst[6]:.2f} ({worst[0]} {size_label(worst[2])}); per collective: "
          + ", ".join(f"{c} {v:.2f} ({s})" for c, (v, s) in per_collective.items()) + "\n")
    return worst[6], per_collective


def default_files():
    """Every bench run under ``results/`` (folders included; tuning files and DDP runs left
    out), each with the tuning file it read (``KNOWN_TUNING``)."""
    out = []
    for f in sorted(glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True)):
        name = os.path.relpath(f, RESULTS).replace(os.sep, "/")
        base = os.path.basename(f)
        if base.startswith(("tuning", "ddp")):
            continue
        tuning = KNOWN_TUNING.get(name)
        out.append((f, os.path.join(RESULTS, tuning) if tuning else None))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", help="RESULTS.json or RESULTS.json=TUNING.json")
    parser.add_argument("--quiet", action="store_true", help="worst ratios only")
    args = parser.parse_args(argv)
    files = [tuple(a.split("=", 1)) if "=" in a else (a, None) for a in args.files]
    for path, tuning in files or default_files():
        report(path, tuning, args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
