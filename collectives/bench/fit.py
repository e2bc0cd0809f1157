"""Fitting a tuning file: a bench run's records -> the decisions ``bench.py --tune`` writes.

Offline, never at call time: the bench's ``--tune`` and ``tools/auto_rules.py`` call it; the
run-time side (``collectives/tuning.py``'s ``DecisionTable``) only reads what it wrote, through
``collectives/tuning_file.py``. Here: the run's noise (``run_noise``, what the bench prints;
``tie_noise``, what ties are judged by), the round-by-round sign test (``faster_in_rounds``)
and the rule that picks each size's winner (``decisions_from_records``).
"""
from __future__ import annotations

import math
from statistics import median, quantiles

from ..algorithms import cost
from ..algorithms.schedule import auto_names

CANDIDATE_EXCLUDED = ("native", "auto")


def _row_times(row) -> list[float]:
    """A bench row's per-round times in µs (one value without rounds)."""
    if row.get("round_p50_us"):
        return [float(t) for t in row["round_p50_us"]]
    if "time_p50_us" in row:
        return [float(row["time_p50_us"])]
    return [float(row["time_s"]) * 1e6]


SPREAD_OVER_ROUNDS = "spread over rounds"


def run_noise(records) -> tuple[float, str]:
    """(the run's noise as a fraction, how it was measured): the median over rows of one
    schedule's spread over rounds ((max - min) / median of its round p50s); without rounds,
    the median gap between auto's row and its choice's own row (one schedule measured
    twice); without either, 0 (every measured difference counts)."""
    spreads = [(max(t) - min(t)) / median(t) for t in map(_row_times, records)
               if len(t) > 1 and median(t) > 0]
    if spreads:
        return median(spreads), SPREAD_OVER_ROUNDS
    gaps = []
    for auto in (r for r in records if r.get("algorithm") == "auto"):
        twin = next((r for r in records if r.get("algorithm") == auto.get("chosen")
                     and r["collective"] == auto["collective"] and r["size"] == auto["size"]
                     and r.get("world_size") == auto.get("world_size")), None)
        if twin:
            a, b = median(_row_times(auto)), median(_row_times(twin))
            if a > 0 and b > 0:
                gaps.append(abs(math.log(a / b)))
    if gaps:
        return math.expm1(median(gaps)), "auto row vs its choice's row"
    return 0.0, "none measured"


QUARTILES_OVER_ROUNDS = "quartiles over rounds"


def tie_noise(records) -> tuple[float, str]:
    """The run noise ``decisions_from_records`` judges ties by: as ``run_noise``, but each
    row's spread taken from the interquartile range of its rounds and scaled to the spread
    five rounds of normal noise have ((q3 - q1) / 1.349 standard deviations, times 2.326),
    so that one slow round does not widen every tie, nor do more rounds (the spread, max -
    min, grows with the number of rounds; the interquartile range does not). Judged with
    ``tools/auto_rules.py`` on the stored pairs of a tuning run and a later run, against the
    spread (BENCHMARKS.md §4). Rows of fewer than 4 rounds: ``run_noise``."""
    spreads = []
    for times in map(_row_times, records):
        if len(times) >= 4 and median(times) > 0:
            q1, _, q3 = quantiles(times, n=4, method="inclusive")
            spreads.append((q3 - q1) / 1.349 * 2.326 / median(times))
    if spreads:
        return median(spreads), QUARTILES_OVER_ROUNDS
    return run_noise(records)


def faster_in_rounds(mine, theirs, level: float = 0.05) -> bool:
    """Whether per-round times ``mine`` beat ``theirs`` round by round (round i of each ran
    in the same interleaved round, so machine drift cancels) in a one-sided sign test at
    ``level``: at least 5 rounds, and faster in so many that chance alone would give as many
    with probability at most ``level`` (5 of 5, 7 of 8, 9 of 10)."""
    n = min(len(mine), len(theirs))
    wins = sum(a < b for a, b in zip(mine, theirs))
    return n >= 5 and sum(math.comb(n, k) for k in range(wins, n + 1)) <= level * 2 ** n


TIE_STEPS = ("rounds", "neighbour")     # how a tie is settled before the model, in order


def decisions_from_records(records, params, itemsize: int = 4, *,
                           ties: tuple = TIE_STEPS) -> dict:
    """{(collective, world size): [row]} from a bench run's records: at each size the
    algorithm with the least median over rounds if it beats the runner-up by more than the
    threshold ("by": "measured"); else the same algorithm if it was faster than each one
    within the threshold round by round (``faster_in_rounds``; "by": "rounds"); else, of
    those within the threshold, the one decided ("measured" or "rounds") at the nearest size
    of the same collective, the smaller size first ("by": "neighbour"); else the model's pick
    among them ("by": "model"). Each row keeps every algorithm's median, the noise and the
    threshold. ``ties``: which of the two steps before the model run (``tools/auto_rules.py``
    replays earlier runs without them).
    Baselines (native), auto, labelled variants (``ring:graph``), schedules ``auto`` may not
    run (registered without ``auto=True``) and rows with wrong results are no candidates.

    The threshold compares medians over rounds, so it is the noise of a median: the run's
    noise (one schedule's spread over its rounds, ``tie_noise``) / sqrt(rounds). The spread
    itself (what one measurement may be off by) would let the model overrule large, repeated
    measured gaps where it cannot see the cause (oversubscribed cores), and one slow round
    would widen it for every size (``tie_noise``). The round-by-round comparison catches a
    steady gap below the threshold: a schedule faster in every round is faster, however
    small the gap. Which schedule is fastest changes slowly with the size, so a winner
    measured next door is better evidence than the model where the model is far off. Both
    steps were judged on later runs with ``tools/auto_rules.py`` (BENCHMARKS.md §4)."""
    noise, how = tie_noise(records)
    table: dict = {}
    for row in records:
        name, collective = row["algorithm"], row["collective"]
        if ":" in name or name in CANDIDATE_EXCLUDED or row.get("wrong") or \
                name not in auto_names(collective):
            continue
        key = (collective, int(row["world_size"]))
        at = table.setdefault(key, {}).setdefault(int(row["size"]), {})
        at.setdefault(name, []).extend(_row_times(row))     # in round order
    out = {}
    for (collective, p), by_size in table.items():
        rows, tied_at = [], {}      # the algorithms within the threshold, where the model chose
        for nbytes, times in sorted(by_size.items()):
            medians = {name: median(t) for name, t in times.items()}
            rounds = max(len(t) for t in times.values())
            order = sorted(medians, key=lambda n: (medians[n], n))
            best = order[0]
            margin = medians[order[1]] / medians[best] if len(order) > 1 and medians[best] > 0 \
                else math.inf
            threshold = noise / math.sqrt(rounds) \
                if how in (SPREAD_OVER_ROUNDS, QUARTILES_OVER_ROUNDS) else noise
            row = {"bytes": nbytes, "algorithm": best, "by": "measured",
                   "median_us": {n: round(medians[n], 3) for n in order},
                   "noise": round(noise, 4), "noise_from": how, "rounds": rounds,
                   "threshold": round(threshold, 4)}
            if margin - 1.0 <= threshold:
                tied = [n for n in order if medians[n] <= medians[best] * (1.0 + threshold)]
                if "rounds" in ties and all(faster_in_rounds(times[best], times[n])
                                            for n in tied[1:]):
                    row.update(by="rounds")
                else:
                    ranked = cost.ranking(collective, p, nbytes, params, tied, itemsize)
                    row.update(algorithm=ranked[0][1], by="model")
                    tied_at[nbytes] = tied
            rows.append(row)
        if "neighbour" in ties:
            rows = [_from_neighbours(row, rows, tied_at.get(row["bytes"])) for row in rows]
        out[collective, p] = rows
    return out


def _from_neighbours(row: dict, rows: list, tied) -> dict:
    """``row`` (where the model chose among ``tied``, else unchanged) with its tie given
    instead to the algorithm decided by measurement at the nearest size (the smaller on equal
    distance) where that one is among ``tied``."""
    if tied is None:
        return row
    decided = sorted((abs(math.log2(other["bytes"] / row["bytes"])), other["bytes"],
                      other["algorithm"]) for other in rows
                     if other["by"] in ("measured", "rounds") and other is not row)
    for _, nbytes, name in decided:
        if name in tied:
            return {**row, "algorithm": name, "by": "neighbour", "neighbour_bytes": nbytes}
    return row
