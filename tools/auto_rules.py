"""How ways of settling a tie in ``--tune`` would have done in a later run: run A's records
turned into decisions by each rule, each size judged in run B by the chosen algorithm's own
row (its median over B's rounds) over the best row of B (geometric mean, worst, sizes within
1.10).

* model: a tie (no algorithm beats the runner-up by more than the noise of a median) goes to
  the model's pick among the tied;
* current: ``fit.decisions_from_records`` as it is (round by round, then the winner at the
  nearest decided size, then the model), its noise ``fit.tie_noise`` (the interquartile
  range of a row's rounds, scaled to five rounds' spread: one slow round does not widen it);
* median: always the least median of A;
* spread: as current, but with the spread (max - min) of a row's rounds itself as the noise
  (``fit.run_noise``, what the bench prints).

The model's parameters are the tuning file's (the ones run A's ``--tune`` broke ties with).

    python tools/auto_rules.py A.json TUNING_A.json B.json [A.json TUNING_A.json B.json ...]
"""
from __future__ import annotations

import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from collectives import tuning_file  # noqa: E402
from collectives.bench import fit  # noqa: E402


def records(path):
    with open(path) as f:
        return json.load(f)["records"]


def medians(rows):
    """{(collective, bytes): {algorithm: median over rounds, µs}} of a run's candidate rows."""
    out = {}
    for r in rows:
        name = r["algorithm"]
        if ":" in name or name in ("native", "auto") or r.get("wrong"):
            continue
        out.setdefault((r["collective"], r["size"]), {})[name] = \
            statistics.median(r["round_p50_us"])
    return out


def decide(rows, params, rule):
    """{(collective, bytes): algorithm} from run A's rows by ``rule``."""
    if rule == "median":
        return {key: min(m, key=m.get) for key, m in medians(rows).items()}
    if rule == "spread":
        quartiles, fit.tie_noise = fit.tie_noise, fit.run_noise
        try:
            return decide(rows, params, "current")
        finally:
            fit.tie_noise = quartiles
    table = fit.decisions_from_records(
        rows, params, ties=() if rule == "model" else fit.TIE_STEPS)
    return {(collective, row["bytes"]): row["algorithm"]
            for (collective, _), listed in table.items() for row in listed}


def judge(run_a, tuning_path, run_b):
    with open(tuning_path) as f:
        transport = next(iter(json.load(f)))
    params = tuning_file.load_params(transport, tuning_path)
    a, measured = records(run_a), medians(records(run_b))
    print(f"{run_a} ({os.path.basename(tuning_path)}) -> {run_b}")
    for rule in ("model", "current", "median", "spread"):
        ratios = [measured[key][name] / min(measured[key].values())
                  for key, name in sorted(decide(a, params, rule).items()) if key in measured]
        mean = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"  {rule:8s} geometric mean {mean:.3f}, worst {max(ratios):.2f}, "
              f"{sum(v <= 1.10 for v in ratios)}/{len(ratios)} sizes within 1.10")


def main(argv):
    if len(argv) < 3 or len(argv) % 3:
        sys.exit(__doc__)
    for run_a, tuning_path, run_b in zip(argv[::3], argv[1::3], argv[2::3]):
        judge(run_a, tuning_path, run_b)


if __name__ == "__main__":
    main(sys.argv[1:])
