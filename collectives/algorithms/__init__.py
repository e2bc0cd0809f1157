"""Pure schedules: which steps each rank performs, for each collective and algorithm.

No I/O and no transport here. ``CAPABILITIES`` is the table of what exists; asking for
anything else is a ValueError that lists the valid names.
"""
from __future__ import annotations

import functools
import logging
import sys

from . import ring  # noqa: F401  (each module registers its schedules)
from . import tree  # noqa: F401
from . import recursive_doubling  # noqa: F401
from . import ring_bidirectional  # noqa: F401
from . import direct  # noqa: F401
from . import cost
from .schedule import COLLECTIVES, REGISTRY, Plan, build_plan
from .. import settings

ENV_DEBUG = settings.DEBUG.name     # the same variable collectives.debug reads

AUTO = "auto"
NATIVE = "native"


def capabilities() -> dict[str, tuple[str, ...]]:
    """collective -> the algorithm names implemented for it (sorted)."""
    return {c: tuple(sorted(REGISTRY.get(c, {}))) for c in COLLECTIVES}


def check_algorithm(collective: str, name: str, *, native_available: bool = False) -> None:
    """Raise ValueError unless ``name`` is an algorithm ``collective`` has."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    valid = list(capabilities()[collective]) + [AUTO] + ([NATIVE] if native_available else [])
    if name not in valid:
        raise ValueError(f"{collective} has no algorithm {name!r}; valid: {', '.join(valid)}")


def choose(collective: str, size: int, nbytes: int, transport: str = "") -> str:
    """The model's choice: the registered algorithm with the least predicted time (cost.py's
    α-β-γ model, with ``transport``'s parameters from the tuning file or its defaults, times
    the measured ratios an older ``bench.py --tune`` run left in that file: measured.py). A
    pure function of its arguments and the tuning file (``COLLECTIVES_TUNING`` as it is now).
    Groups do not call this per call: their ``auto`` is a look-up in the decision table
    (``collectives/tuning.py``), which falls back to the model for what nothing measured.
    ``nbytes`` follows ``cost.uniform_counts``' convention (what the process group passes).
    Under ``COLLECTIVES_DEBUG=INFO`` (or DETAIL) each choice is logged with its prediction."""
    ranked = _ranked(collective, size, nbytes, transport, settings.TUNING())
    if settings.DEBUG() != "OFF":
        _log_choice(collective, size, nbytes, transport, ranked)
    return ranked[0][1]


@functools.lru_cache(maxsize=16384)
def _ranked(collective, size, nbytes, transport, tuning):
    """Cached per call shape: every collective call goes through ``choose``. ``tuning`` (the
    file's path) is part of the key so that pointing the variable elsewhere takes effect."""
    candidates = capabilities().get(collective)
    if candidates is None:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if not candidates:
        raise ValueError(f"{collective} has no algorithm registered")
    params = cost.load_params(transport, tuning or "")
    corrections = cost.load_corrections(transport, tuning or "")
    return tuple(cost.ranking(collective, size, nbytes, params, candidates,
                              corrections=corrections))


def _log_choice(collective, size, nbytes, transport, ranked):
    log = logging.getLogger("collectives")
    if not log.isEnabledFor(logging.INFO):
        log.setLevel(logging.INFO)      # the variable asks for these messages
    if not (log.handlers or logging.getLogger().handlers):
        # nobody configured logging (Python's last resort shows warnings only): use stderr
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
        log.addHandler(handler)
    (best_time, best), rest = ranked[0], ranked[1:]
    text = (f"auto: {collective} of {nbytes} bytes on {size} ranks ({transport or 'default'} "
            f"parameters) -> {best}, predicted {_seconds(best_time)}")
    if rest:
        text += f"; runner-up {rest[0][1]} {_seconds(rest[0][0])}"
    if settings.DEBUG() == "DETAIL" and len(rest) > 1:
        text += "; others " + ", ".join(f"{name} {_seconds(t)}" for t, name in rest[1:])
    log.info(text)


def _seconds(value: float) -> str:
    return f"{value * 1e6:.1f} us" if value < 1e-3 else f"{value * 1e3:.3f} ms"


__all__ = ["AUTO", "NATIVE", "Plan", "build_plan", "capabilities", "check_algorithm", "choose"]
