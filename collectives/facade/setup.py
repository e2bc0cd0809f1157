"""Joining and leaving the job: backends, init_process_group, destroy_process_group, and
what a rank does when it dies (abort the job, not leave the others waiting)."""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time as _time
import traceback as _traceback
from datetime import timedelta

from .. import settings, state, transports, work as _work
from ..group import ProcessGroup
from ..state import GroupMember, seconds as _seconds, setup_seconds as _setup_seconds
from ..transports import mpi as _mpi_transport
from ..transports.mpi_exit import ABORT_GRACE_SECONDS

LOCAL = "local"


class Backend(str):
    """A backend name: ``Backend("GLOO") == "gloo"``; unknown names and non-strings (None
    included) are a ValueError, as in torch."""
    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"
    SOCKET = "socket"
    LOCAL = LOCAL

    def __new__(cls, name):
        if not isinstance(name, str):
            raise ValueError(f"Backend constructor parameter must be string-ish, got "
                             f"{type(name).__name__}")
        value = name.lower()
        if value not in (cls.UNDEFINED, LOCAL):
            transports.canonical(value)          # raises, listing the known backends
        return super().__new__(cls, value)


def is_available() -> bool:
    """Whether the package is usable: always True (its backends say for themselves).

    Returns:
        True.
    """
    return True


def is_initialized() -> bool:
    """Whether this rank has a default process group (init_process_group ran).

    Returns:
        bool.
    """
    return state.current() is not None


def is_torchelastic_launched() -> bool:
    """Whether torchelastic (torchrun) started this process.

    Returns:
        bool: TORCHELASTIC_RUN_ID is set.
    """
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def is_mpi_available() -> bool:
    """Whether the ``mpi`` backend can run here (mpi4py imports).

    Returns:
        bool.
    """
    return transports.available("mpi")[0]


def is_nccl_available() -> bool:
    """Whether the ``nccl`` backend can run here (CuPy with NCCL, a GPU).

    Returns:
        bool.
    """
    return transports.available("nccl")[0]


def is_gloo_available() -> bool:
    """Whether the ``socket`` backend (``gloo`` is its alias) can run here.

    Returns:
        bool.
    """
    return transports.available("socket")[0]


def _launched_by_mpi() -> bool:
    return _mpi_transport.launched() and importlib.util.find_spec("mpi4py") is not None


def _backend_name(backend, init_method, store) -> str:
    """torch's "cpu:gloo,cuda:nccl" form picks the CPU entry; None picks mpi under mpiexec."""
    if backend is None or str(backend).lower() == Backend.UNDEFINED:
        direct = init_method is None and store is None
        return Backend.MPI if direct and _launched_by_mpi() else Backend.SOCKET
    name = str(backend).lower()
    if ":" in name:
        pairs = dict(item.split(":", 1) for item in name.split(",") if ":" in item)
        name = pairs.get("cpu") or next(iter(pairs.values()))
    return Backend(name.strip())


_DEFAULT_TIMEOUT = timedelta(minutes=30)          # torch's default for gloo


def init_process_group(backend=None, init_method=None, timeout=_DEFAULT_TIMEOUT,
                       world_size=-1, rank=-1, store=None, group_name="", pg_options=None,
                       device_id=None):
    """Initialize the default process group: join the job.

    ``local``: ``store`` is the LocalWorld; mpi: rank and size come from MPI; socket/nccl:
    rendezvous through ``init_method`` / ``store`` / the environment, except nccl under
    mpiexec with none of them (no MASTER_ADDR): then rank and size come from MPI and the NCCL
    unique id travels through MPI.COMM_WORLD. A store the rendezvous made is closed by
    destroy_process_group, so a job may init again on the same MASTER_PORT.

    Args:
        backend (str or Backend, optional): mpi, socket (gloo), nccl or local; torch's
            "cpu:gloo,cuda:nccl" picks the CPU entry; None: mpi under mpiexec, else socket.
        init_method (str, optional): a URL: env://, tcp://host:port or file://path.
        timeout (timedelta or seconds, optional): bounds the wait for every rank to arrive
            and each collective of the default group (30 minutes, as in torch; None too);
            inf, ``timedelta.max`` or any huge value: no deadline; NaN or negative:
            ValueError, before this rank contacts any other.
        world_size (int, optional): number of ranks; -1: from the environment or MPI.
        rank (int, optional): this process's rank; -1: from the environment or MPI.
        store (Store, optional): a store all ranks reach; for ``local``, the LocalWorld.
        group_name (str, optional): the default group's name in messages.
        pg_options, device_id: accepted for torch's signature.

    Returns:
        None.
    """
    if state.current() is not None:
        raise ValueError("trying to initialize the default process group twice!")
    if timeout is None:                 # torch's None: the default timeout
        timeout = _DEFAULT_TIMEOUT
    limit = _seconds(timeout, "init_process_group")
    setup = _setup_seconds(limit)
    name = _backend_name(backend, init_method, store)
    made = None
    if name == LOCAL:
        transport = _local_transport(store, rank, world_size)
    elif name == Backend.MPI:
        transport = transports.create("mpi", rank=rank, world_size=world_size, timeout=setup)
        _abort_job_on_uncaught_exception(transport)
        _end_job_when_a_rank_leaves(transport)
    elif name == Backend.NCCL and init_method is None and store is None and _mpi_rendezvous():
        from ..transports.mpi import world_rank_and_size
        rank, world_size = world_rank_and_size(rank, world_size, "init_process_group('nccl')")
        transport = transports.create(name, rank=rank, world_size=world_size, timeout=setup)
    else:
        from ..rendezvous import arrive, rendezvous
        made = store is None
        store, rank, world_size = rendezvous(init_method, rank, world_size, limit, store)
        try:
            arrive(store, rank, world_size, limit)
            transport = transports.create(name, rank=rank, world_size=world_size, store=store,
                                          timeout=setup)
        except BaseException:
            if made:
                store.close()
            raise
    if name == Backend.NCCL:
        _abort_job_on_uncaught_exception(transport, "its NCCL communicator")
        _abort_communicator_at_failed_exit(transport)
    if name != LOCAL:
        _watch_failing_exit()
    pg = ProcessGroup(transport, backend=name, timeout=limit, group_id=0, name=group_name)
    world = state.World(name, transport, pg, thread_local=name == LOCAL, timeout=limit)
    world.store = store if made else None
    state.install(world)


def _mpi_rendezvous() -> bool:
    """Started by mpiexec, and not told of a store server: under mpiexec nothing sets
    MASTER_ADDR, and MPI knows rank and size (what README's Launching section promises)."""
    return _launched_by_mpi() and not os.environ.get("MASTER_ADDR")


_previous_excepthook = None


def _abort_job_on_uncaught_exception(transport, what="the MPI job"):
    """Under MPI a rank that dies of an exception would leave the others blocked (and
    MPI_Finalize waiting) until their timeouts: print the traceback, name the rank, and abort
    the whole job at once (what ``python -m mpi4py`` does). On nccl the transport's abort is
    ncclCommAbort (and MPI_Abort where MPI runs in this process): a communicator left alive
    made the exiting process wait on peers blocked in NCCL calls, so a launcher never saw it
    fail and never stopped the others. Undone by destroy_process_group."""
    global _previous_excepthook
    _restore_excepthook()             # a second init replaces the hook, never stacks it
    previous = _previous_excepthook = sys.excepthook

    def hook(kind, value, tb):
        if previous is not sys.__excepthook__:
            previous(kind, value, tb)
            report = ""
        else:
            report = "".join(_traceback.format_exception(kind, value, tb))
        # One write, then a moment for mpiexec to forward it: the abort kills every rank, and
        # output still in flight was lost at times (a traceback cut after its first line).
        scope = what
        if getattr(transport, "mpi_running", False):
            scope += " and the MPI job"
        sys.stderr.write(report + f"collectives: rank {transport.rank} of {transport.size} "
                         f"raised an uncaught {kind.__name__}; aborting {scope}\n")
        sys.stderr.flush()
        _time.sleep(ABORT_GRACE_SECONDS)
        transport.abort(f"uncaught {kind.__name__} on rank {transport.rank}")
    sys.excepthook = hook


def _restore_excepthook():
    global _previous_excepthook
    if _previous_excepthook is not None:
        sys.excepthook, _previous_excepthook = _previous_excepthook, None


_nccl_at_exit = []                    # the nccl transport of the current world, if any


def _abort_communicator_at_failed_exit(transport):
    """A process leaving with a non-zero status (sys.exit(1) after an error) would otherwise
    destroy its NCCL communicator at interpreter exit, which can wait for ever on peers
    blocked in NCCL calls: abort it instead, so the launcher sees the exit and stops the
    rest. A clean exit keeps the usual teardown."""
    state.observe_exit()
    if not _nccl_at_exit:
        import atexit
        atexit.register(_abort_nccl_if_failing)
    _nccl_at_exit[:] = [transport]


def _abort_nccl_if_failing():
    code, _ = state.exit_status()
    for transport in _nccl_at_exit:
        if code not in (None, 0) and getattr(transport, "comm", None) is not None:
            transport.abort(f"rank {transport.rank} is exiting with code {code}", code)


# A failing exit closes the socket transport at once: no peer's goodbye is awaited (peers
# that fail because of this exit never send one).
FAILING_EXIT_CLOSE_SECONDS = 0.2
# The most a failing exit waits for the abort and close: an interrupt that struck inside the
# socket transport just as it took its lock (a Condition's __enter__) leaves the lock held for
# good, and anything that takes it waits for ever.
_FAILING_EXIT_ABORT_SECONDS = 0.5
# Bounds the word to the launcher's store at a failing exit (it answers at once, or is gone).
_TELL_LAUNCHER_SECONDS = 5.0
_failing_exit_watched = []


def _watch_failing_exit():
    """At an exit with a failing status (an uncaught exception, Ctrl-C, sys.exit(3)), before
    the socket transport's goodbyes (atexit runs the hooks registered last first): tell
    ``collectives.run`` which rank leaves and with what code, before any peer can fail
    because of it, so the launcher names this rank and not a consequence that ended sooner;
    then abort the socket transport (every peer learns who left and why, instead of reading
    a goodbye as a clean close) and close it without waiting for the peers' goodbyes. A
    clean exit keeps the goodbyes; mpi and nccl have their own exit paths."""
    state.observe_exit()
    if not _failing_exit_watched:
        import atexit
        atexit.register(_at_failing_exit)
        _failing_exit_watched.append(True)


def _at_failing_exit():
    world = state.current()
    code, error = state.exit_status()
    if world is None or world.thread_local or not code:
        return
    if world.store is not None and settings.USE_AGENT_STORE():
        try:
            from ..run import tell_launcher
            world.store.set_timeout(_TELL_LAUNCHER_SECONDS)
            tell_launcher(world.store, world.default.rank, code)
        except Exception:              # a launcher gone: nobody to tell
            pass
    transport = world.transport
    if transport.name != "socket":
        return
    why = f"exiting with code {code}" + ("" if error is None else
                                         f" after {type(error).__name__}")
    aborting = threading.Thread(target=_abort_and_close, args=(transport, why),
                                name="collectives-failing-exit", daemon=True)
    try:
        aborting.start()
    except RuntimeError:               # no thread this late: the transport's own close
        return
    aborting.join(_FAILING_EXIT_ABORT_SECONDS)


def _abort_and_close(transport, why):
    try:
        transport.abort(why)
        transport.close(timeout=FAILING_EXIT_CLOSE_SECONDS)
    except Exception:
        pass


def _end_job_when_a_rank_leaves(transport):
    """Under MPI, MPI_Finalize at exit waits for every rank, so a rank that leaves while the
    others are blocked on it (sys.exit(1) after a timeout, a plain return) would wait as long
    as they do. The transport's exit guard ends the job instead; it needs this process's exit
    status, which Python shows no atexit hook (see state.exit_status). Stays after
    destroy_process_group: the exit can hang just the same."""
    state.observe_exit()
    transport.guard_exit(state.exit_status, state.started_collective)


def _local_transport(world, rank, world_size):
    from ..transports.local import LocalWorld
    if not isinstance(world, LocalWorld):
        raise ValueError("init_process_group('local') needs store=<a LocalWorld>; "
                         "collectives.spawn_local(world_size, fn) makes one and starts the ranks")
    if world_size not in (-1, None) and world_size != world.size:
        raise ValueError(f"init_process_group: world_size={world_size} but the LocalWorld has "
                         f"{world.size} ranks")
    if not isinstance(rank, int) or not 0 <= rank < world.size:
        raise ValueError(f"init_process_group('local'): rank {rank!r} is out of range for "
                         f"world size {world.size}")
    return world.transport(rank)


# What a call on a destroyed group says (state.resolve raises it before touching a transport).
_DESTROYED_WORLD = ("this group belongs to a process group that was destroyed "
                    "(destroy_process_group); create it again with new_group after "
                    "init_process_group")
_DESTROYED_DEFAULT = ("this group is the default group of a process group that was destroyed "
                      "(destroy_process_group); pass group=None (or group.WORLD) for the "
                      "current one")
_DESTROYED_GROUP = ("this group was destroyed (destroy_process_group(group)); create it again "
                    "with new_group")


def destroy_process_group(group=None) -> None:
    """Finish pending async work and release ``group``.

    Args:
        group (ProcessGroup, optional): the group to release; None (or the default group)
            releases every group and ends the job for this rank.

    Returns:
        None.
    """
    world = state.world()
    if group is None or group is world.default:
        for pg in world.groups:
            _work.stop(pg)
            pg.destroyed = _DESTROYED_DEFAULT if pg is world.default else _DESTROYED_WORLD
        for pg in world.groups[1:]:
            if pg.transport is not world.transport:
                pg.transport.close()
        world.transport.close()
        if world.store is not None:
            world.store.close()           # a store server releases its port
        state.uninstall(world)
        _restore_excepthook()
        _nccl_at_exit.clear()
    elif group is not GroupMember.NON_GROUP_MEMBER and group in world.groups:
        _work.stop(group)
        world.groups.remove(group)
        group.destroyed = _DESTROYED_GROUP


def get_backend(group=None) -> Backend:
    """The backend of ``group``.

    Args:
        group (ProcessGroup, optional): a group this rank is a member of; None is the default
            group.

    Returns:
        Backend: the backend's name, lower case.
    """
    world = state.world()
    pg = state.resolve(group, "get_backend")
    if pg is None:
        raise ValueError(f"get_backend on rank {world.default.rank}: Invalid process group "
                         f"specified (this rank is not a member of the group)")
    return Backend(world.backend)
