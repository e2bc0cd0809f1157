"""Who is the default process group: the facade's one piece of global state.

Real backends (mpi, socket, nccl) run one rank per process, so the default group is
process-wide, as in torch. The ``local`` backend runs every rank as a thread of one process,
so its default group lives in thread-local storage: each thread sees only its own rank.
Also here: resolving a ``group=`` argument (None / WORLD / a subgroup / NON_GROUP_MEMBER),
translating torch's global ``src``/``dst`` ranks into group ranks, and how this process is
leaving (its exit status, which the MPI backend needs at exit).
"""
from __future__ import annotations

import functools
import sys
import threading

import numpy as np

from .store.base import _FOREVER_S, timeout_seconds

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
        self.store = None                 # the store the rendezvous made: destroy closes it
        self.groups = [default]           # groups this rank is a member of
        self.next_group_id = 1            # every rank calls new_group in the same order


_process_world: World | None = None
_last_process_world: World | None = None    # kept after destroy_process_group, for the exit
_thread = threading.local()


def current() -> World | None:
    return getattr(_thread, "world", None) or _process_world


def install(world: World) -> None:
    global _process_world, _last_process_world
    if world.thread_local:
        _thread.world = world
    else:
        _process_world = _last_process_world = world


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
    forget_exit()                 # a collective after sys.exit(): that SystemExit was caught
    if group_arg is None:
        return found.default
    if group_arg is NON_GROUP_MEMBER:
        return None
    if not hasattr(group_arg, "prepare") or not hasattr(group_arg, "ranks"):
        raise TypeError(f"{operation} on rank {found.default.rank}: group must be a process "
                        f"group from init_process_group / "
                        f"new_group, got {type(group_arg).__name__}")
    destroyed = getattr(group_arg, "destroyed", None)
    if destroyed is not None:     # its transport is closed: any byte sent would mislead peers
        raise ValueError(f"{operation} on rank {found.default.rank}: {destroyed}")
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


def seconds(timeout, operation: str = "timeout") -> float | None:
    """A timeout (a timedelta, as torch passes, or seconds) as seconds; None: no deadline.

    The stores' rule (``store.base.timeout_seconds``), so that a value means one thing on
    every rank and in every layer: None, inf, ``timedelta.max`` and any finite value too large
    for a lock's or socket's wait are no deadline; NaN and negative values are ValueError,
    other types TypeError, naming ``operation``, raised before anything moves.
    """
    return timeout_seconds(timeout, operation)


def setup_seconds(limit: float | None) -> float:
    """``limit`` (from ``seconds``) as a transport's set-up bound: set-ups add it to clocks
    and give it to sockets, so no deadline is the stores' "forever" (about 31 years), a number
    each of them takes."""
    return _FOREVER_S if limit is None else limit


# -- how this process is leaving --------------------------------------------------------------
# Python passes no exit status to atexit hooks and calls no hook for SystemExit, yet the MPI
# backend needs it at exit: a rank that leaves with an error must abort the job rather than wait
# in MPI_Finalize for peers that may be blocked on it, while a rank that leaves with 0 must wait
# for busy peers. An uncaught exception leaves sys.last_value behind (exit status 1); sys.exit(),
# the way scripts, argparse and click leave with a status, is observed. ``raise SystemExit(n)``
# and the exit() builtin are not seen: such an exit counts as unknown.

_original_exit = None
_exit_call = None            # the SystemExit of the last sys.exit() on the main thread


def observe_exit() -> None:
    """Keep the SystemExit of every sys.exit() called on the main thread (in other threads it
    ends only the thread). Installed once; stays for the life of the process."""
    global _original_exit
    if _original_exit is not None:
        return
    original = _original_exit = sys.exit

    @functools.wraps(original)
    def exit(status=None):        # noqa: A001  (sys.exit's own name, seen in tracebacks)
        global _exit_call
        try:
            original(status)
        except SystemExit as exc:
            if threading.current_thread() is threading.main_thread():
                _exit_call = exc
            raise
    sys.exit = exit


def forget_exit() -> None:
    """The program went on after a sys.exit() (a test runner or a try block caught it)."""
    global _exit_call
    if _exit_call is not None:
        _exit_call = None


def exit_status():
    """(exit code, the error this process leaves after) as far as it can be known at exit:
    an uncaught exception is code 1 after it; a sys.exit(status) gives Python's code for that
    status, after the exception being handled when it was called (or None); otherwise
    (None, None)."""
    uncaught = getattr(sys, "last_value", None)
    if uncaught is not None:          # Python ends a KeyboardInterrupt by SIGINT: 128 + 2
        return (130 if isinstance(uncaught, KeyboardInterrupt) else 1), uncaught
    call = _exit_call
    if call is None:
        return None, None
    code = call.code
    if code is None:
        code = 0
    elif isinstance(code, int):
        code = int(code)              # sys.exit(True) is 1
    else:                             # sys.exit("message") prints it and exits 1
        code = 1
    return code, call.__context__


def started_collective(transport, tag: int) -> bool | None:
    """Whether this process has started the collective of wire tag ``tag`` on the group that
    runs over ``transport`` (every rank numbers a group's collectives alike); None when no
    group of the current or last process-wide world runs over it."""
    found = _process_world or _last_process_world
    for pg in found.groups if found is not None else ():
        sequence = getattr(pg, "_sequence", None)
        if pg.transport is transport and sequence is not None:
            limit = pg.max_user_tag
            return (tag >> 1) <= (sequence % (limit + 1) if limit is not None else sequence)
    return None
