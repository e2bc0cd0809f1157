"""Measured corrections: ``auto``'s predictions anchored to a bench run on this machine.

The α-β-γ model (cost.py) ranks schedules by their shape; on the lent hosts its choice missed
the measured best by up to 1.44x (BENCHMARKS.md §4): no three-parameter model sees every
cache, protocol switch and scheduler effect of a machine. ``bench.py --tune FILE`` therefore
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
relative to the α, β, γ of the same entry, so recalibrating (``cost.save_params``) drops
them. Every rank must read the same file, as for the parameters: a job's ranks then pick alike.

In the tuning file: ``{transport: {"alpha": .., ..., "measured": {collective: {"<world size>":
{algorithm: [[bytes, ratio], ...]}}}}}``.
"""
from __future__ import annotations

import bisect
import math
import os
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
# Reading


def load(transport: str, path: str | None = None) -> Corrections:
    """``transport``'s corrections from the tuning file (``path``, else ``COLLECTIVES_TUNING``);
    none where the file or its entry has none. Malformed tables are a ValueError naming the
    file: a rank that silently ignored them would pick differently from the others."""
    from .. import settings
    from .cost import ENV_TUNING, read_tuning
    path = settings.TUNING() if path is None else path
    if not path:
        return NONE
    entry = read_tuning(path).get(transport)
    if not isinstance(entry, dict) or KEY not in entry:
        return NONE
    return Corrections(parse(entry[KEY], f"{ENV_TUNING}={path}: {transport!r} {KEY!r}"))


def parse(raw, where: str) -> dict:
    """The file's nested lists as {(collective, world size): {algorithm: [(bytes, ratio)]}},
    sorted by size; anything else is a ValueError that says where."""
    from .schedule import COLLECTIVES
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected {{collective: {{world size: {{algorithm: "
                         f"[[bytes, ratio], ...]}}}}}}, got {type(raw).__name__}")
    table = {}
    for collective, by_size in raw.items():
        if collective not in COLLECTIVES or not isinstance(by_size, dict):
            raise ValueError(f"{where}: {collective!r} is not a collective with a table of "
                             f"world sizes (known: {', '.join(COLLECTIVES)})")
        for size, algorithms in by_size.items():
            if not str(size).isdigit() or int(size) < 1 or not isinstance(algorithms, dict):
                raise ValueError(f"{where}: {collective} world size {size!r} must be a "
                                 f"positive integer with a table of algorithms")
            curves = {}
            for name, points in algorithms.items():
                curves[name] = _points(points, f"{where}: {collective} p={size} {name}")
            table[collective, int(size)] = curves
    return table


def _points(points, where):
    try:
        pairs = sorted((int(n), float(r)) for n, r in points)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: expected [[bytes, ratio], ...] ({exc})") from exc
    for n, r in pairs:
        if n < 1 or not (math.isfinite(r) and r > 0):
            raise ValueError(f"{where}: point [{n}, {r}] needs bytes >= 1 and a finite "
                             f"ratio > 0")
    if len({n for n, _ in pairs}) != len(pairs):
        raise ValueError(f"{where}: a size appears twice")
    return pairs


# ---------------------------------------------------------------------------------------------
# Writing (bench.py --tune)


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


def save(path: str, transport: str, params, table: dict) -> None:
    """Merge ``table`` into ``transport``'s entry of the tuning file at ``path`` (atomically):
    the (collective, world size) pairs it measured replace the file's, others stay. The
    entry's α, β, γ become ``params`` (the ratios are relative to them); if they differ from
    what the entry held, its older ratios go (they were relative to the old ones)."""
    from . import cost
    kept = {}
    if os.path.exists(path):
        entry = cost.read_tuning(path).get(transport)
        if isinstance(entry, dict) and cost.load_params(transport, path) == params:
            kept = entry.get(KEY, {})
    merged = {c: dict(sizes) for c, sizes in kept.items()}
    for (collective, p), algorithms in table.items():
        merged.setdefault(collective, {})[str(p)] = {
            name: [[n, round(r, 6)] for n, r in points] for name, points in algorithms.items()}
    parse(merged, f"{path}: {transport!r} {KEY!r}")      # what we write, we can read back
    cost.save_params(path, transport, params)          # rewrites the entry without ratios
    data = cost.read_tuning(path)
    data[transport][KEY] = merged
    cost.write_tuning(path, data)
