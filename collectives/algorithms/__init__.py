"""Pure schedules: which steps each rank performs, for each collective and algorithm.

No I/O and no transport here. ``CAPABILITIES`` is the table of what exists; asking for
anything else is a ValueError that lists the valid names.
"""
from __future__ import annotations

from . import ring  # noqa: F401  (each module registers its schedules)
from . import tree  # noqa: F401
from . import recursive_doubling  # noqa: F401
from .schedule import COLLECTIVES, REGISTRY, Plan, build_plan

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
    """``auto``: latency-bound sizes take log-p algorithms, bandwidth-bound ones the ring.
    Simple thresholds; the cost model (cost.py) refines this where it is calibrated."""
    have = capabilities()[collective]
    small = nbytes < 64 * 1024 or size <= 2 and nbytes < 1024 * 1024
    preference = {
        "all_reduce": ("recursive_doubling", "tree", "ring") if small else ("ring", "recursive_doubling"),
        "reduce_scatter": ("recursive_doubling", "ring") if small else ("ring", "recursive_doubling"),
        "all_gather": ("recursive_doubling", "ring") if small else ("ring", "recursive_doubling"),
        "all_to_all": ("recursive_doubling", "ring") if small else ("ring",),
        "broadcast": ("tree",) if small else ("recursive_doubling", "ring", "tree"),
        "reduce": ("tree",) if small else ("recursive_doubling", "ring", "tree"),
        "gather": ("tree",),
        "scatter": ("tree",),
        "barrier": ("recursive_doubling", "tree", "ring"),
    }[collective]
    for name in preference + tuple(have):
        if name in have:
            return name
    raise ValueError(f"{collective} has no algorithm registered")


__all__ = ["AUTO", "NATIVE", "Plan", "build_plan", "capabilities", "check_algorithm", "choose"]
