"""The tuning file: its one reader and its one writer.

``bench.py --calibrate FILE`` and ``bench.py --tune FILE`` write it; a group's decision table
(``collectives/tuning.py``) reads the file named by ``COLLECTIVES_TUNING``. It is JSON::

    {transport: {"alpha": .., "beta": .., "gamma": ..,       the cost model's Params
                 shape terms (params.SHAPE_FIELDS),          where they differ from the defaults
                 "decisions": {collective: {"<world size>": [row, ...]}},   bench.py --tune
                 "measured": {collective: {"<world size>": {algorithm: [[bytes, ratio]]}}},
                 "inter": {"alpha": .., "beta": .., "gamma": .., "ports": ..}}}

``inter`` (optional) is the links between hosts as the two-level model reads them (a group
with a topology of several hosts: ``algorithms/two_level.py``): α per message, β of one
host's link, ``ports`` its rails; without it ``params.INTER_HOST_DEFAULTS`` (assumed links).
Rewriting the entry's own parameters keeps it: it was measured on another link.

A row of ``decisions`` is ``{"bytes", "algorithm", "by", "median_us", "noise", "rounds",
"threshold"}`` (``tuning.py`` says what each means); ``measured`` holds measured / predicted
ratios (``algorithms/measured.py``), which the decision table reads for a collective and
world size that ``decisions`` does not list. Both are relative to the parameters of the same
entry, so rewriting the parameters drops the ratios.

Everything here that reads checks what it read and raises ValueError naming the file and the
place: a rank that silently ignored a malformed file would choose differently from the
others and deadlock. Writes are atomic (a rank reading the file while it is rewritten sees
the old file or the new one). The schedules, the parameters as data and the model live in
``algorithms/``, which does no I/O.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict

from . import settings
from .algorithms import capabilities
from .algorithms.measured import KEY as RATIOS
from .algorithms.measured import NONE as NO_CORRECTIONS
from .algorithms.measured import Corrections
from .algorithms.params import SHAPE_FIELDS, Params, default_params, inter_host_params
from .algorithms.schedule import COLLECTIVES, auto_names

ENV_TUNING = settings.TUNING.name
DECISIONS = "decisions"
INTER = "inter"


def where(path: str) -> str:
    """How messages name the file: ``COLLECTIVES_TUNING=path``."""
    return f"{ENV_TUNING}={path}"


# ---------------------------------------------------------------------------------------------
# The file as a whole


def read(path: str) -> dict:
    """The file at ``path`` as {transport: entry}; ValueError where it cannot be read or is
    not a JSON object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"{where(path)}: cannot read the tuning file: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where(path)}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{where(path)}: expected an object {{transport: {{alpha, beta, "
                         f"gamma}}}}, got {type(data).__name__}")
    return data


def write(path: str, data: dict) -> None:
    """Replace the file at ``path`` with ``data`` atomically."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def entry(path: str, transport: str) -> dict:
    """``transport``'s entry of the file at ``path`` ({} where there is no path or no entry)."""
    if not path:
        return {}
    found = read(path).get(transport)
    if found is None:
        return {}
    if not isinstance(found, dict):
        raise ValueError(f"{where(path)}: entry {transport!r} must be an object")
    return found


# ---------------------------------------------------------------------------------------------
# Parsing one entry


def params_of(found: dict, transport: str, path: str = "") -> Params:
    """The entry's α, β, γ; its shape terms where it has them, else ``transport``'s defaults
    (files that leave them out)."""
    default = default_params(transport)
    try:
        shape = {name: found.get(name, getattr(default, name)) for name in SHAPE_FIELDS}
        shape = {name: (int(v) if name == "ports" else float(v)) for name, v in shape.items()}
        return Params(float(found["alpha"]), float(found["beta"]), float(found["gamma"]),
                      **shape)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{where(path)}: entry {transport!r} needs numbers alpha, beta, "
                         f"gamma >= 0 ({exc})") from exc


def ratios_of(raw, place: str) -> dict:
    """An entry's ``measured`` table as {(collective, world size): {algorithm: [(bytes,
    ratio)]}}, sorted by size; anything else is a ValueError that says where (``place``)."""
    if not isinstance(raw, dict):
        raise ValueError(f"{place}: expected {{collective: {{world size: {{algorithm: "
                         f"[[bytes, ratio], ...]}}}}}}, got {type(raw).__name__}")
    table = {}
    for collective, by_size in raw.items():
        if collective not in COLLECTIVES or not isinstance(by_size, dict):
            raise ValueError(f"{place}: {collective!r} is not a collective with a table of "
                             f"world sizes (known: {', '.join(COLLECTIVES)})")
        for size, algorithms in by_size.items():
            if not str(size).isdigit() or int(size) < 1 or not isinstance(algorithms, dict):
                raise ValueError(f"{place}: {collective} world size {size!r} must be a "
                                 f"positive integer with a table of algorithms")
            table[collective, int(size)] = {
                name: _ratio_points(points, f"{place}: {collective} p={size} {name}")
                for name, points in algorithms.items()}
    return table


def _ratio_points(points, place):
    try:
        pairs = sorted((int(n), float(r)) for n, r in points)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{place}: expected [[bytes, ratio], ...] ({exc})") from exc
    for n, r in pairs:
        if n < 1 or not (math.isfinite(r) and r > 0):
            raise ValueError(f"{place}: point [{n}, {r}] needs bytes >= 1 and a finite "
                             f"ratio > 0")
    if len({n for n, _ in pairs}) != len(pairs):
        raise ValueError(f"{place}: a size appears twice")
    return pairs


def decision_rows(listed, collective: str, place: str) -> list:
    """One (collective, world size)'s ``decisions`` rows as [(bytes, algorithm, row)] sorted
    by size; ValueError, saying where, for a malformed row, a repeated size, or an algorithm
    ``auto`` may not run (registered without ``auto=True``)."""
    if not isinstance(listed, list):
        raise ValueError(f"{place}: expected a list of rows {{bytes, algorithm, ...}}")
    valid = set(auto_names(collective))
    out, seen = [], set()
    for row in listed:
        try:
            nbytes, name = int(row["bytes"]), row["algorithm"]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{place}: row {row!r} needs bytes and algorithm ({exc})") from None
        if name in capabilities()[collective] and name not in valid:
            raise ValueError(f"{place}: row {row!r}: {name!r} is registered without "
                             f"auto=True, so auto may not run it; register it with "
                             f"@algorithm({collective!r}, {name!r}, auto=True) or drop the row")
        if nbytes < 0 or name not in valid or nbytes in seen:
            raise ValueError(f"{place}: row {row!r}: bytes must be >= 0, appear once, and "
                             f"algorithm one of {', '.join(sorted(valid))}")
        seen.add(nbytes)
        out.append((nbytes, name, row))
    return sorted(out, key=lambda item: item[0])


def validate(found: dict, path: str = "") -> None:
    """Raise ValueError, naming the file and the place, where the entry's decisions or ratios
    are malformed (without pricing anything)."""
    rows = found.get(DECISIONS, {})
    if not isinstance(rows, dict):
        raise ValueError(f"{where(path)}: {DECISIONS!r} must be {{collective: {{world size: "
                         f"[rows]}}}}")
    for collective, sizes in rows.items():
        if collective not in COLLECTIVES or not isinstance(sizes, dict):
            raise ValueError(f"{where(path)}: {DECISIONS!r}: {collective!r} is not a "
                             f"collective with a table of world sizes (known: "
                             f"{', '.join(COLLECTIVES)})")
        for p, listed in sizes.items():
            if not str(p).isdigit() or int(p) < 1:
                raise ValueError(f"{where(path)}: {DECISIONS!r}: {collective} world size "
                                 f"{p!r} must be a positive integer")
            decision_rows(listed, collective, f"{where(path)}: {collective} p={p}")
    if RATIOS in found:
        ratios_of(found[RATIOS], f"{where(path)}: {RATIOS!r}")
    if INTER in found:
        inter_of(found, path)


# ---------------------------------------------------------------------------------------------
# What the model reads


def load_params(transport: str, path: str | None = None, model: str | None = None) -> Params:
    """The parameters for ``transport``: from the tuning file (``path``, else the file named by
    ``COLLECTIVES_TUNING``) when it has an entry for it, else the defaults of ``model``
    (where a transport's groups run plans on another medium: ``nccl_peer``), else of
    ``transport``. A named file that cannot be read is a ValueError: silently falling back
    could make ranks disagree."""
    path = settings.TUNING() if path is None else path
    found = read(path).get(transport) if path else None
    if found is not None:
        return params_of(found, transport, path)
    return default_params(model or transport)


def inter_of(found: dict, path: str = "") -> Params:
    """An entry's ``inter`` as Params: α, β, γ required, ``ports`` (rails per host) 1 where
    not given; ValueError naming the file otherwise."""
    raw = found.get(INTER)
    try:
        if not isinstance(raw, dict):
            raise TypeError(f"expected an object, got {type(raw).__name__}")
        values = [float(raw[k]) for k in ("alpha", "beta", "gamma")]
        ports = int(raw.get("ports", 1))
        if any(not math.isfinite(v) or v < 0 for v in values) or ports < 1:
            raise ValueError("every number must be finite and >= 0, ports >= 1")
        return Params(*values, ports=ports)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where(path)}: {INTER!r} needs numbers alpha, beta, gamma >= 0 "
                         f"and an integer ports >= 1 ({exc})") from None


def load_inter_params(transport: str, path: str | None = None) -> Params:
    """The links between hosts for ``transport``: the tuning file's ``inter`` in its entry
    (``path``, else ``COLLECTIVES_TUNING``), else ``params.inter_host_params``."""
    path = settings.TUNING() if path is None else path
    found = entry(path, transport)
    if INTER in found:
        return inter_of(found, path)
    return inter_host_params(transport)


def load_corrections(transport: str, path: str | None = None) -> Corrections:
    """``transport``'s measured ratios (``path``, else ``COLLECTIVES_TUNING``); none where the
    file or its entry has none."""
    path = settings.TUNING() if path is None else path
    found = entry(path, transport)
    if RATIOS not in found:
        return NO_CORRECTIONS
    return Corrections(ratios_of(found[RATIOS], f"{where(path)}: {transport!r} {RATIOS!r}"))


# ---------------------------------------------------------------------------------------------
# Writing (bench.py --calibrate, --tune)


def save_params(path: str, transport: str, params: Params) -> None:
    """Write (or replace) ``transport``'s parameters in the file at ``path``. Replacing them
    drops the entry's measured ratios and decisions: they were relative to the parameters it
    held."""
    data = read(path) if os.path.exists(path) else {}
    # α, β, γ always; a shape term only where it differs from the transport's default, which
    # is what loading fills in for a missing one
    default = asdict(default_params(transport))
    old = data.get(transport) if isinstance(data.get(transport), dict) else {}
    data[transport] = {name: value for name, value in asdict(params).items()
                       if name not in SHAPE_FIELDS or value != default[name]}
    if INTER in old:                    # the links between hosts: measured apart, kept
        data[transport][INTER] = old[INTER]
    write(path, data)


def save_inter_params(path: str, transport: str, inter: Params) -> None:
    """Write (or replace) ``transport``'s links between hosts (``inter``: α, β, γ, ports) in
    the file at ``path``, keeping the rest of its entry; an entry made here for the first
    time takes ``transport``'s default parameters inside a host."""
    data = read(path) if os.path.exists(path) else {}
    if not isinstance(data.get(transport), dict):
        save_params(path, transport, default_params(transport))
        data = read(path)
    data[transport][INTER] = {"alpha": inter.alpha, "beta": inter.beta, "gamma": inter.gamma,
                              "ports": inter.ports}
    inter_of(data[transport], path)                              # what we write, we can read
    write(path, data)


def _kept(path: str, transport: str, params: Params) -> dict:
    """The entry at ``path`` for ``transport`` where its parameters are ``params`` (what was
    measured against them still holds), else {}."""
    if not os.path.exists(path):
        return {}
    found = read(path).get(transport)
    if isinstance(found, dict) and load_params(transport, path) == params:
        return found
    return {}


def save_ratios(path: str, transport: str, params: Params, table: dict) -> None:
    """Merge a ratio table (``measured.from_rows``) into ``transport``'s entry: the
    (collective, world size) pairs it measured replace the file's, others stay. The entry's
    parameters become ``params``; if they differ from what it held, its ratios go.
    The entry keeps nothing else (its decisions go, as when its parameters are rewritten)."""
    kept = _kept(path, transport, params)
    merged = {c: dict(sizes) for c, sizes in kept.get(RATIOS, {}).items()}
    for (collective, p), algorithms in table.items():
        merged.setdefault(collective, {})[str(p)] = {
            name: [[n, round(r, 6)] for n, r in points] for name, points in algorithms.items()}
    ratios_of(merged, f"{path}: {transport!r} {RATIOS!r}")      # what we write, we can read
    _rewrite(path, transport, params, {RATIOS: merged})


def save_decisions(path: str, transport: str, params: Params, decisions: dict) -> None:
    """Merge ``decisions`` ({(collective, world size): [row]},
    ``bench.fit.decisions_from_records``) into ``transport``'s entry: the pairs measured
    replace the file's, others stay. The entry's parameters become ``params`` (the model the
    ties were broken with); its ratios stay only where those are the parameters it held."""
    old = {}
    if os.path.exists(path):
        found = read(path).get(transport)
        old = found if isinstance(found, dict) else {}
    merged = {c: dict(sizes) for c, sizes in old.get(DECISIONS, {}).items()}
    for (collective, p), rows in decisions.items():
        merged.setdefault(collective, {})[str(p)] = rows
    validate({DECISIONS: merged}, path)                          # what we write, we can read
    kept = {RATIOS: old[RATIOS]} if RATIOS in old and _kept(path, transport, params) else {}
    _rewrite(path, transport, params, {**kept, DECISIONS: merged})


def _rewrite(path: str, transport: str, params: Params, tables: dict) -> None:
    """``transport``'s entry as ``params`` plus ``tables`` (its ``decisions`` and
    ``measured`` where given), one atomic write."""
    save_params(path, transport, params)
    data = read(path)
    data[transport].update({key: value for key, value in tables.items()
                            if key in (DECISIONS, RATIOS)})
    write(path, data)
