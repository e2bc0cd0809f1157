"""Measured corrections: ``auto``'s predictions anchored to a bench run on this machine.

The α-β-γ model (cost.py) ranks schedules by their shape, and no three-parameter model sees
every cache, protocol switch and scheduler effect of a machine, so its choice can miss the
fastest schedule (BENCHMARKS.md §4). ``bench.py --tune FILE`` therefore
writes, next to α, β, γ in the tuning file, how far each measured row was from the model:
the ratio measured p50 / predicted, per transport, collective, world size, algorithm and
message size. ``auto`` multiplies each prediction by its ratio, so

- at a measured size the corrected prediction *is* the measured time, and ``auto`` picks the
  algorithm that measured fastest there;
- between measured sizes the ratio is interpolated geometrically in the message size (a
  straight line in log-log), and beyond the ends it holds the nearest end's ratio: the model
  still supplies the shape, the measurement its level;
- an algorithm the run did not measure takes the geometric mean of the measured algorithms'
  ratios at that size (the machine's offset from the model), so going unmeasured neither
  favours nor excludes it;
- a world size the run did not measure, or a collective, uses the model alone.

This is the role Open MPI's tuned dynamic rules and NCCL's tuner plugins play (a per-machine
table), but the model keeps answering between and beyond the measured points. The ratios are
relative to the α, β, γ of the same entry, so recalibrating (``tuning_file.save_params``)
drops them. Every rank must read the same file, as for the parameters: a job's ranks then pick
alike.

In the tuning file: ``{transport: {"alpha": .., ..., "measured": {collective: {"<world size>":
{algorithm: [[bytes, ratio], ...]}}}}}``; ``collectives.tuning_file`` reads and writes it
(this module does no I/O).
"""
from __future__ import annotations

import bisect
import math
from types import MappingProxyType

KEY = "measured"


class Corrections:
    """The measured ratios of one transport: ``factor(...)`` is what ``auto`` multiplies a
    prediction by. Immutable and hashable (by identity), so cached rankings can hold it."""

    def __init__(self, table=None):
        # {(collective, world size): {algorithm: (log sizes, log ratios)}}, sizes ascending
        curves = {}
        for (collective, p), algorithms in (table or {}).items():
            curves[collective, p] = MappingProxyType({
                name: (tuple(math.log(n) for n, _ in points),
                       tuple(math.log(r) for _, r in points))
                for name, points in algorithms.items() if points})
        self._curves = MappingProxyType(curves)

    def __bool__(self):
        return bool(self._curves)

    def factor(self, collective: str, size: int, algorithm: str, nbytes: int) -> float:
        """measured / predicted for this call shape: 1.0 where nothing was measured."""
        algorithms = self._curves.get((collective, size))
        if not algorithms:
            return 1.0
        x = math.log(max(int(nbytes), 1))
        own = algorithms.get(algorithm)
        if own is not None:
            return math.exp(_interpolate(own, x))
        logs = [_interpolate(curve, x) for curve in algorithms.values()]
        return math.exp(sum(logs) / len(logs))


NONE = Corrections()


def _interpolate(curve, x: float) -> float:
    xs, ys = curve
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        return ys[-1]
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


# ---------------------------------------------------------------------------------------------
# The ratios of one bench run (bench.py --tune)


def from_rows(rows, params, itemsize: int) -> dict:
    """The table for one bench run: each algorithm row's measured p50 over the model's
    ``estimate`` with ``params`` (the parameters that run used). Rows of baselines
    (``native``), of ``auto`` and labelled variants (``ring:ceiling``, ``ring:graph``, ...)
    and rows with wrong results are not measurements of a schedule and are left out; where a
    row appears twice (rounds), the larger ratio counts (the cautious one)."""
    from . import cost
    from .schedule import REGISTRY
    table = {}
    for row in rows:
        name, collective = row["algorithm"], row["collective"]
        if (":" in name or name not in REGISTRY.get(collective, {}) or row.get("wrong")):
            continue
        seconds = (row["time_p50_us"] * 1e-6 if "time_p50_us" in row else row["time_s"])
        p, nbytes = int(row["world_size"]), int(row["size"])
        predicted = cost.estimate(collective, name, p, nbytes, params, itemsize)
        if not (seconds > 0 and 0 < predicted < math.inf):
            continue
        curve = table.setdefault((collective, p), {}).setdefault(name, {})
        curve[nbytes] = max(curve.get(nbytes, 0.0), seconds / predicted)
    return {key: {name: sorted(curve.items()) for name, curve in algorithms.items()}
            for key, algorithms in table.items()}


# Names whose home is ``collectives.tuning_file`` (the one reader and writer of the tuning
# file), answered here too for code that imports them from this module.
_MOVED = {"load": "load_corrections", "save": "save_ratios", "parse": "ratios_of"}


def __getattr__(name):
    if name in _MOVED:
        from .. import tuning_file
        return getattr(tuning_file, _MOVED[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
