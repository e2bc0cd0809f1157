"""Pure schedules: which steps each rank performs, for each collective and algorithm.

No I/O and no transport here. ``capabilities()`` is the table of what exists; ``ALIASES``
adds the names users look for (Open MPI's and the literature's: rabenseifner, bruck,
van_de_geijn, dissemination, binomial), each another name of the schedule that implements
it; asking for anything else is a ValueError that lists the valid names.
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

# collective -> {name users look for: the registered schedule that implements it}. Each
# schedule's docstring says where it switches shape (Rabenseifner and van de Geijn from 16
# elements per block, below that recursive doubling and a binomial tree).
ALIASES = {
    "all_reduce": {"rabenseifner": "recursive_doubling"},
    "reduce": {"rabenseifner": "recursive_doubling", "binomial": "tree"},
    "all_to_all": {"bruck": "recursive_doubling"},
    "broadcast": {"van_de_geijn": "recursive_doubling", "binomial": "tree"},
    "gather": {"binomial": "tree"},
    "scatter": {"binomial": "tree"},
    "barrier": {"dissemination": "recursive_doubling"},
}


def capabilities(aliases: bool = False) -> dict[str, tuple[str, ...]]:
    """collective -> the algorithm names implemented for it (sorted); with ``aliases``, the
    other names they answer to as well (``ALIASES``). ``auto`` chooses among the former."""
    table = {c: tuple(sorted(REGISTRY.get(c, {}))) for c in COLLECTIVES}
    if aliases:
        table = {c: names + tuple(sorted(a for a, name in ALIASES.get(c, {}).items()
                                         if name in names))
                 for c, names in table.items()}
    return table


def canonical(collective: str, name: str) -> str:
    """The registered schedule behind ``name`` (``name`` itself unless it is an alias)."""
    return ALIASES.get(collective, {}).get(name, name)


def check_algorithm(collective: str, name: str, *, native_available: bool = False) -> None:
    """Raise ValueError unless ``name`` is an algorithm (or an alias of one) ``collective``
    has."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    names = capabilities()[collective]
    valid = list(names) + [AUTO] + ([NATIVE] if native_available else [])
    other = {a: n for a, n in ALIASES.get(collective, {}).items() if n in names}
    if name not in valid and name not in other:
        listed = valid + [f"{a} (= {n})" for a, n in sorted(other.items())]
        raise ValueError(f"{collective} has no algorithm {name!r}; valid: {', '.join(listed)}")


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
            f"parameters) -> {best}, predicted {cost.format_seconds(best_time)}")
    if rest:
        text += f"; runner-up {rest[0][1]} {cost.format_seconds(rest[0][0])}"
    if settings.DEBUG() == "DETAIL" and len(rest) > 1:
        text += "; others " + ", ".join(f"{name} {cost.format_seconds(t)}"
                                        for t, name in rest[1:])
    log.info(text)


__all__ = ["ALIASES", "AUTO", "NATIVE", "Plan", "build_plan", "canonical", "capabilities",
           "check_algorithm", "choose"]
