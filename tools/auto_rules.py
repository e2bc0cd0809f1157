"""How two ways of settling a tie in ``--tune`` would have done in a later run: run A's tuning
file against run B's records, each size judged by the chosen algorithm's own row in B (its
median over B's rounds) over the best row of B.

* model-in-ties: what ``tuning.decisions_from_records`` writes (the least median of A where it
  beats the runner-up by more than the threshold, else the model's pick among those within it);
* median-best: always the least median of A;
* paired: in a tie, the least median of A where it was faster than every other tied
  candidate in enough of A's rounds (each round's rows ran interleaved, so a round compares
  like with like: a sign test, one-sided p <= 0.05), else the model's pick.

    python tools/auto_rules.py A.json TUNING_A.json B.json [A.json TUNING_A.json B.json ...]
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


def rounds(path):
    """{(collective, bytes): {algorithm: [per-round p50, µs]}} of a bench run's rows."""
    with open(path) as f:
        records = json.load(f)["records"]
    return {(r["collective"], r["size"], r["algorithm"]): r["round_p50_us"] for r in records}


def choices(run_a, path):
    """{(collective, bytes): (the file's choice, A's least median, the paired rule's)}."""
    with open(path) as f:
        entry = next(iter(json.load(f).values()))
    per_round = rounds(run_a)
    out = {}
    for collective, by_size in entry["decisions"].items():
        for rows in by_size.values():
            for row in rows:
                m, chosen = row["median_us"], row["algorithm"]
                best = min(m, key=m.get)
                paired = chosen
                if row["by"] == "model":
                    tied = [n for n in m if m[n] <= m[best] * (1 + row["threshold"])]
                    mine = per_round[collective, row["bytes"], best]
                    if all(beats(mine, per_round[collective, row["bytes"], n])
                           for n in tied if n != best):
                        paired = best
                out[collective, row["bytes"]] = (chosen, best, paired)
    return out


def beats(a, b) -> bool:
    """Whether times ``a`` beat ``b`` round by round in a one-sided sign test at p <= 0.05."""
    n = min(len(a), len(b))
    wins = sum(x < y for x, y in zip(a, b))
    tail = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n
    return n >= 5 and tail <= 0.05


def judge(run_a, tuning, run):
    picked, measured = choices(run_a, tuning), medians(run)
    ratios = {"model-in-ties": [], "median-best": [], "paired": []}
    for key, (model, best, paired) in sorted(picked.items()):
        if key in measured:
            floor = min(measured[key].values())
            ratios["model-in-ties"].append(measured[key][model] / floor)
            ratios["median-best"].append(measured[key][best] / floor)
            ratios["paired"].append(measured[key][paired] / floor)
    print(f"{tuning} -> {run}")
    for rule, values in ratios.items():
        mean = math.exp(sum(map(math.log, values)) / len(values))
        print(f"  {rule:14s} geometric mean {mean:.3f}, worst {max(values):.2f}, "
              f"{sum(v <= 1.10 for v in values)}/{len(values)} sizes within 1.10")


def main(argv):
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__)
    for run_a, tuning, run in zip(argv[::3], argv[1::3], argv[2::3]):
        judge(run_a, tuning, run)


if __name__ == "__main__":
    main(sys.argv[1:])
