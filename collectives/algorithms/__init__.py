"""Pure schedules: which steps each rank performs, for each collective and algorithm.

No I/O and no transport here. ``capabilities()`` is the table of what exists; ``ALIASES``
adds the names users look for (Open MPI's and the literature's: rabenseifner, bruck,
van_de_geijn, dissemination, binomial), each another name of the schedule that implements
it; asking for anything else is a ValueError that lists the valid names. Names of the form
``prefix:rest`` are schedules a *family* makes from others on demand (``schedule.FAMILIES``):
``hierarchical:<intra>+<inter>@<topology>`` (``hierarchical.py``) is accepted wherever a name
is, though ``capabilities()`` cannot list every one.

``auto`` chooses among fewer: ``auto_candidates()``, the package's own schedules and those
registered with ``@algorithm(collective, name, auto=True)``, each of the latter proven in the
simulator at the world size first. A schedule registered without ``auto=True`` runs only
where a call names it, so a half-finished experiment never runs in a plain call.
"""
from __future__ import annotations

import functools

from . import ring  # noqa: F401  (each module registers its schedules)
from . import tree  # noqa: F401
from . import recursive_doubling  # noqa: F401
from . import ring_bidirectional  # noqa: F401
from . import direct  # noqa: F401
from . import pipelined_tree  # noqa: F401
from . import hierarchical  # noqa: F401  (the family hierarchical:<intra>+<inter>@<topology>)
from . import cost
from .schedule import (COLLECTIVES, REGISTRY, Plan, auto_names, build_plan, is_family_name,
                       is_opted_in, record_package_schedules, schedule_function)

record_package_schedules()      # every schedule the modules above registered is the package's

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
    """collective -> the algorithm names implemented for it (sorted): every registered
    schedule, each of which runs where a call names it; with ``aliases``, the other names
    they answer to as well (``ALIASES``). ``auto`` chooses among ``auto_candidates()``."""
    table = {c: tuple(sorted(REGISTRY.get(c, {}))) for c in COLLECTIVES}
    if aliases:
        table = {c: names + tuple(sorted(a for a, name in ALIASES.get(c, {}).items()
                                         if name in names))
                 for c, names in table.items()}
    return table


def canonical(collective: str, name: str) -> str:
    """The registered schedule behind ``name`` (``name`` itself unless it is an alias); a
    family's name in its one canonical form (``hierarchical.canonical_name``)."""
    if hierarchical.is_hierarchical(name):
        return hierarchical.canonical_name(collective, name)
    return ALIASES.get(collective, {}).get(name, name)


def check_algorithm(collective: str, name: str, *, native_available: bool = False) -> None:
    """Raise ValueError unless ``name`` is an algorithm (or an alias of one) ``collective``
    has."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if is_family_name(name):
        schedule_function(collective, name)      # a ValueError saying what is wrong
        return
    names = capabilities()[collective]
    valid = list(names) + [AUTO] + ([NATIVE] if native_available else [])
    other = {a: n for a, n in ALIASES.get(collective, {}).items() if n in names}
    if name not in valid and name not in other:
        listed = valid + [f"{a} (= {n})" for a, n in sorted(other.items())]
        raise ValueError(f"{collective} has no algorithm {name!r}; valid: {', '.join(listed)}")


# A decision table also proves an opted-in schedule at each size class it would price it for,
# up to this many elements summed over the ranks' buffers (64-bit words in the simulator: 8
# MiB a buffer); larger classes rest on ``simulate.proving_cases``.
PROVE_MAX_ELEMENTS = 1 << 20


def auto_candidates(collective: str, size: int) -> tuple[str, ...]:
    """The schedules ``auto`` chooses among for ``collective`` on ``size`` ranks, sorted:
    the package's own (proven by its schedule tests) and those registered with
    ``auto=True``, each of the latter once the simulator has proven it at ``size`` ranks on
    the schedule tests' cases (``simulate.proving_cases``; once per schedule function and
    world size in a process). Raises ValueError, naming the schedule, the collective, the
    world size and what went wrong, where an opted-in schedule fails."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    names = auto_names(collective)
    for name in names:
        if is_opted_in(collective, name):
            prove_opted_in(collective, name, size)
    return names


def prove_opted_in(collective: str, name: str, size: int, counts=None) -> None:
    """Raise ValueError unless the opted-in schedule ``name`` gives every rank the right
    result at ``size`` ranks: on ``simulate.proving_cases``, or, with ``counts`` (the
    schedule's counts argument, hashable), on those at roots 0 and p-1. Results are kept
    per schedule function, world size and counts."""
    problem = _proof(collective, name, REGISTRY[collective][name], size, counts)
    if problem is not None:
        raise ValueError(
            f"{collective} schedule {name!r}, registered with auto=True, fails in the "
            f"simulator at world size {size}: {problem}. auto runs only schedules proven "
            f"correct at the group's world size: fix it, or register it without auto=True "
            f"(it still runs where a call names it)")


@functools.lru_cache(maxsize=4096)
def _proof(collective, name, fn, size, counts):
    """What ``simulate.prove`` found (None: correct); ``fn`` keys the cache, so a name
    registered again is proven again."""
    from . import simulate      # numpy and the reduction kernels: only where a proof is due
    if counts is None:
        cases = simulate.proving_cases(collective, size)
    else:
        cases = [(counts, root) for root in sorted({0, size - 1})]
    return simulate.prove(collective, name, size, cases)


__all__ = ["ALIASES", "AUTO", "NATIVE", "Plan", "auto_candidates", "build_plan", "canonical",
           "capabilities", "check_algorithm", "prove_opted_in"]


# ``choose`` (the model's choice under the tuning file named by COLLECTIVES_TUNING) reads the
# environment and the file, so it lives in ``collectives.tuning``; it and ENV_DEBUG are
# answered here too for code that imports them from this package.
def __getattr__(name):
    if name == "choose":
        from ..tuning import choose
        return choose
    if name == "ENV_DEBUG":
        from ..debug import ENV_DEBUG
        return ENV_DEBUG
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
