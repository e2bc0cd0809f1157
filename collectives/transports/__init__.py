"""Transports by backend name. Each backend module is imported only when asked for, and
exposes ``available() -> (bool, reason)`` and ``create(rank, world_size, store, timeout) ->
Transport``. ``gloo`` is an alias of ``socket`` so unmodified gloo scripts run."""
from __future__ import annotations

import importlib

BACKENDS = {
    "mpi": "collectives.transports.mpi",
    "socket": "collectives.transports.socket",
    "nccl": "collectives.transports.nccl",
}
ALIASES = {"gloo": "socket"}


def canonical(backend: str) -> str:
    name = str(backend).lower()
    name = ALIASES.get(name, name)
    if name not in BACKENDS:
        known = sorted(set(BACKENDS) | set(ALIASES))
        raise ValueError(f"unknown backend {backend!r}; known backends: {', '.join(known)}")
    return name


def module(backend: str):
    return importlib.import_module(BACKENDS[canonical(backend)])


def available(backend: str) -> tuple[bool, str]:
    """Whether ``backend`` can run here, and if not, why (a missing package, no GPU...)."""
    try:
        return module(backend).available()
    except ImportError as exc:
        return False, f"cannot import its module: {exc}"


def create(backend: str, *, rank: int, world_size: int, store=None, timeout: float = 1800.0):
    mod = module(backend)
    ok, why = mod.available()
    if not ok:
        raise RuntimeError(f"backend {canonical(backend)!r} is not usable here: {why}")
    return mod.create(rank=rank, world_size=world_size, store=store, timeout=timeout)
