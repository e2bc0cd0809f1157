"""How two ways of settling a tie in ``--tune`` would have done in a later run: run A's tuning
file against run B's records, each size judged by the chosen algorithm's own row in B (its
median over B's rounds) over the best row of B.

* model-in-ties: what ``tuning.decisions_from_records`` writes (the least median of A where it
  beats the runner-up by more than the threshold, else the model's pick among those within it);
* median-best: always the least median of A.

    python tools/auto_rules.py TUNING_A.json B.json [TUNING_A.json B.json ...]
"""
from __future__ import annotations

import json
import math
import statistics
import sys


def medians(path):
    """{(collective, bytes): {algorithm: median over rounds, µs}} of a bench run's rows."""
    with open(path) as f:
        records = json.load(f)["records"]
    out = {}
    for r in records:
        name = r["algorithm"]
        if ":" in name or name in ("native", "auto") or r.get("wrong"):
            continue
        out.setdefault((r["collective"], r["size"]), {})[name] = \
            statistics.median(r["round_p50_us"])
    return out


def choices(path):
    """{(collective, bytes): (the file's choice, A's least median)}."""
    with open(path) as f:
        entry = next(iter(json.load(f).values()))
    out = {}
    for collective, by_size in entry["decisions"].items():
        for rows in by_size.values():
            for row in rows:
                m = row["median_us"]
                out[collective, row["bytes"]] = (row["algorithm"], min(m, key=m.get))
    return out


def judge(tuning, run):
    picked, measured = choices(tuning), medians(run)
    ratios = {"model-in-ties": [], "median-best": []}
    for key, (model, best) in sorted(picked.items()):
        if key in measured:
            floor = min(measured[key].values())
            ratios["model-in-ties"].append(measured[key][model] / floor)
            ratios["median-best"].append(measured[key][best] / floor)
    print(f"{tuning} -> {run}")
    for rule, values in ratios.items():
        mean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"  {rule:14s} geometric mean {mean:.3f}, worst {max(values):.2f}, "
              f"{sum(v <= 1.10 for v in values)}/{len(values)} sizes within 1.10")


def main(argv):
    if len(argv) < 2 or len(argv) % 2:
        sys.exit(__doc__)
    for tuning, run in zip(argv[::2], argv[1::2]):
        judge(tuning, run)


if __name__ == "__main__":
    main(sys.argv[1:])
