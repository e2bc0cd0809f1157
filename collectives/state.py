"""Who is the default process group: the facade's one piece of global state.

Real backends (mpi, socket, nccl) run one rank per process, so the default group is
process-wide, as in torch. The ``local`` backend runs every rank as a thread of one process,
so its default group lives in thread-local storage: each thread sees only its own rank.
Also here: resolving a ``group=`` argument (None / WORLD / a subgroup / NON_GROUP_MEMBER) and
translating torch's global ``src``/``dst`` ranks into group ranks.
"""
from __future__ import annotations

import threading
from datetime import timedelta

import numpy as np

NOT_INITIALIZED = ("Default process group has not been initialized, please make sure to call "
                   "init_process_group.")


class World:
    """One initialized job as this rank sees it: the default group and every subgroup."""

    def __init__(self, backend: str, transport, default, *, thread_local: bool, timeout: float):
        self.backend = backend            # the name the user asked for ("gloo" stays "gloo")
        self.transport = transport
        self.default = default
        self.thread_local = thread_local
        self.timeout = timeout
        self.groups = [default]           # groups this rank is a member of
        self.next_group_id = 1            # every rank calls new_group in the same order


_process_world: World | None = None
_thread = threading.local()


def current() -> World | None:
    return getattr(_thread, "world", None) or _process_world


def install(world: World) -> None:
    global _process_world
    if world.thread_local:
        _thread.world = world
    else:
        _process_world = world


def uninstall(world: World) -> None:
    global _process_world
    if getattr(_thread, "world", None) is world:
        _thread.world = None
    if _process_world is world:
        _process_world = None


def world() -> World:
    """The current world, or torch's ValueError when init_process_group was not called."""
    found = current()
    if found is None:
        raise ValueError(NOT_INITIALIZED)
    return found


class _NonGroupMember:
    """What new_group returns on ranks outside the group; collectives on it return None."""

    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


NON_GROUP_MEMBER = _NonGroupMember()


class _WorldAttribute(type):
    @property
    def WORLD(cls):          # noqa: N802  (torch's name)
        found = current()
        return None if found is None else found.default


class GroupMember(metaclass=_WorldAttribute):
    """``GroupMember.WORLD`` is the default group (None before init)."""
    NON_GROUP_MEMBER = NON_GROUP_MEMBER


class group(metaclass=_WorldAttribute):   # noqa: N801  (torch spells it dist.group.WORLD)
    """``group.WORLD`` is the default group (None before init)."""


def resolve(group_arg, operation: str):
    """The ProcessGroup a call runs on, or None when this rank is not a member."""
    found = world()
    if group_arg is None:
        return found.default
    if group_arg is NON_GROUP_MEMBER:
        return None
    if not hasattr(group_arg, "prepare") or not hasattr(group_arg, "ranks"):
        raise TypeError(f"{operation} on rank {found.default.rank}: group must be a process "
                        f"group from init_process_group / "
                        f"new_group, got {type(group_arg).__name__}")
    return group_arg


def group_rank(pg, global_rank, group_rank_arg, operation: str, name: str) -> int:
    """torch's ``src``/``dst`` are global ranks; ``group_src``/``group_dst`` are group ranks."""
    if global_rank is not None and group_rank_arg is not None:
        raise ValueError(f"{operation} on rank {pg.rank}: give {name} or group_{name}, not both")
    if group_rank_arg is not None:
        value = group_rank_arg
        if not _is_int(value) or not 0 <= value < pg.size:
            raise ValueError(f"{operation} on rank {pg.rank}: group_{name} {value!r} is out of "
                             f"range for a group of size {pg.size}")
        return int(value)
    value = 0 if global_rank is None else global_rank
    if not _is_int(value) or int(value) not in pg.ranks:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} {value!r} is not a rank of "
                         f"this group (global ranks {pg.ranks})")
    return pg.ranks.index(int(value))


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def seconds(timeout) -> float | None:
    """torch passes timedelta; plain numbers are seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout)
