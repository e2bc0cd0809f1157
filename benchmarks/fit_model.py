"""Fit the cost model's parameters to measured runs, for ``auto``'s choices.

    python benchmarks/fit_model.py --transport nccl run4.json run2.json
    python benchmarks/fit_model.py --transport mpi run8.json=tuning.json --fields ports,local_alpha

``calibrate`` measures α, β and γ with a ping-pong and a reduction loop; the shape terms
(``ports``, the β curve, ``link_beta``, ``local_alpha``, ...) describe how a machine behaves
when many messages and kernels run in one collective, which no ping-pong shows. This script
takes ``bench.py --json`` runs that measured every algorithm and searches the parameters
(coordinate descent over a grid of multiples around the start, a few rounds) for those with
which ``auto``'s pick is as close as possible to the measured best: it minimizes the summed
log regret (log of pick time / best time over every row, identical schedules merged as in
``model_check.py``), then the median model error. It prints the start and the result and, with
``--out``, writes the result as the transport's entry of a tuning file.

It fits to the runs it is given, so judge it on a run it was not fitted to (``model_check.py``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from collectives import tuning_file  # noqa: E402
from collectives.algorithms import capabilities, cost  # noqa: E402
from model_check import load_run, merge_identical  # noqa: E402

SCALES = (0.25, 0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0, 4.0)
GRIDS = {"ports": (1, 2, 3, 4, 7), "local_alpha": (0.0, 1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 4e-5),
         "beta_knee": (0.0, 4 << 20, 16 << 20, 64 << 20, 256 << 20)}
LINK_SHARES = (0.5, 0.7, 1.0, 1.4, 2.0)    # link_beta candidates, in multiples of β
FIELDS = {"nccl": ("alpha", "beta", "beta_small", "beta_knee", "gamma", "ports", "local_alpha",
                   "link_beta"),
          "mpi": ("ports", "local_alpha"),
          "socket": ("ports", "local_alpha", "link_beta")}


def rows_of(files, transport):
    """[(collective, p, size, itemsize, {algorithm: seconds}, run's params)] of every
    (file, tuning file or None); a run's params are its own calibrated α, β, γ."""
    out = []
    for path, tuning in files:
        base = tuning_file.load_params(transport, tuning or "")
        _, itemsize, table, _ = load_run(path)
        for (collective, p, size), measured in table.items():
            names = [a for a in measured if a in capabilities().get(collective, ())]
            if len(names) >= 2:
                merged = merge_identical(collective, p, size, itemsize,
                                         {a: measured[a] for a in names})
                out.append((collective, p, size, itemsize, merged, base))
    return out


def score(rows, shape):
    """(summed log regret, worst ratio, median |log model error|) on ``rows`` with the
    parameters in ``shape`` (a dict) replacing each run's own."""
    regret, worst, errors = 0.0, 1.0, []
    for collective, p, size, itemsize, measured, base in rows:
        params = dataclasses.replace(base, **shape)
        pick, predicted = cost.cheapest(collective, p, size, candidates=sorted(measured),
                                        params=params, itemsize=itemsize)
        ratio = measured[pick] / min(measured.values())
        regret += math.log(ratio)
        worst = max(worst, ratio)
        errors.append(abs(math.log(measured[pick] / predicted)))
    return regret, worst, statistics.median(errors) if errors else 0.0


def candidates(field, value, beta):
    if field == "link_beta":
        return [0.0] + [beta * f for f in LINK_SHARES]
    grid = GRIDS.get(field)
    if grid is not None:
        return sorted(set(grid) | {value})
    return [value * f for f in SCALES] if value else [0.0]


def fit(rows, start, fields, rounds=3):
    """Coordinate descent from ``start`` (Params) over ``fields``: the fitted dict of them."""
    best = {field: getattr(start, field) for field in fields}
    best_score = score(rows, best)
    for _ in range(rounds):
        improved = False
        for field in fields:
            for value in candidates(field, best[field], start.beta):
                trial = dict(best, **{field: int(value) if field == "ports" else value})
                try:
                    s = score(rows, trial)
                except ValueError:
                    continue
                if (round(s[0], 6), s[2]) < (round(best_score[0], 6), best_score[2]):
                    best, best_score, improved = trial, s, True
        if not improved:
            break
    return best, best_score


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="RESULTS.json, or RESULTS.json=TUNING.json: that "
                                             "run's own calibrated α, β, γ (else the defaults)")
    ap.add_argument("--transport", required=True, choices=sorted(FIELDS))
    ap.add_argument("--fields", help="comma-separated parameters to fit (default: per transport)")
    ap.add_argument("--out", help="write the fitted parameters into this tuning file")
    args = ap.parse_args(argv)
    files = [tuple(a.split("=", 1)) if "=" in a else (a, None) for a in args.files]
    start = tuning_file.load_params(args.transport, files[0][1] or "")
    fields = args.fields.split(",") if args.fields else FIELDS[args.transport]
    rows = rows_of(files, args.transport)
    before = score(rows, {})
    fitted, after = fit(rows, start, fields)
    for label, shape, (regret, worst, error) in (("start", {}, before), ("fitted", fitted, after)):
        print(f"{label:>6}: regret {regret:.3f}, worst auto/best {worst:.2f}, median model "
              f"error x{math.exp(error):.2f}" + (f": {shape}" if shape else ""))
    if args.out:
        tuning_file.save_params(args.out, args.transport, dataclasses.replace(start, **fitted))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
