"""Pure schedules: which steps each rank performs, for each collective and algorithm.

No I/O and no transport here. ``CAPABILITIES`` is the table of what exists; asking for
anything else is a ValueError that lists the valid names.
"""
from __future__ import annotations

from . import ring  # noqa: F401  (each module registers its schedules)
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


__all__ = ["AUTO", "NATIVE", "Plan", "build_plan", "capabilities", "check_algorithm"]
