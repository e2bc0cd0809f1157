"""collectives: collective algorithms behind a torch.distributed-shaped facade.

``import collectives as dist`` runs code written for ``torch.distributed``: the same function
names, parameters, defaults, ``Work`` handles and error types. Each collective here is thin:
adapt the buffers to flat views (``tensors``), let the ProcessGroup validate the call and
assign its tag (``group.prepare``), then run it now or queue it on the group's worker
(``work``). Extensions beyond torch are keyword-only: ``algorithm="ring" | "tree" |
"recursive_doubling" | "native" | "auto"``.

Backends: ``mpi`` (under mpiexec), ``socket`` (``gloo`` is its alias), ``nccl``, and
``local`` (ranks are threads of one process; see ``spawn_local``).
"""
from __future__ import annotations

import importlib.util
import os
import sys
import time as _time
import traceback as _traceback
from datetime import timedelta

from . import sparse, state, tensors, transports, work as _work
from . import tensors as _tensors     # for functions whose torch parameter is named "tensors"
from .debug import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .errors import TIMED_OUT, CollectiveError, CollectiveTimeout, TransportError
from .group import ProcessGroup
from .ops import ReduceOp, check_complex as _check_complex
from .state import GroupMember, group, seconds as _seconds
from .transports import mpi as _mpi_transport
from .work import Future, Work

__all__ = [
    "Backend", "CollectiveError", "CollectiveTimeout", "DebugLevel", "Future", "GroupMember",
    "P2POp", "ProcessGroup", "ReduceOp", "TransportError", "Work", "all_gather",
    "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object", "all_reduce",
    "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier",
    "batch_isend_irecv", "broadcast", "broadcast_object_list", "destroy_process_group",
    "gather", "gather_object", "get_backend", "get_debug_level", "get_global_rank",
    "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
    "init_process_group",
    "irecv", "is_available", "is_gloo_available", "is_initialized", "is_mpi_available",
    "is_nccl_available", "is_torchelastic_launched", "isend", "monitored_barrier",
    "new_group", "new_subgroups", "new_subgroups_by_enumeration", "recv", "reduce",
    "reduce_op", "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list",
    "send", "set_debug_level", "set_debug_level_from_env", "spawn_local",
]

reduce_op = ReduceOp      # torch's deprecated alias

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


# -- setup --------------------------------------------------------------------------------


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return state.current() is not None


def is_torchelastic_launched() -> bool:
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def is_mpi_available() -> bool:
    return transports.available("mpi")[0]


def is_nccl_available() -> bool:
    return transports.available("nccl")[0]


def is_gloo_available() -> bool:
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


def init_process_group(backend=None, init_method=None, timeout=timedelta(minutes=30),
                       world_size=-1, rank=-1, store=None, group_name="", pg_options=None,
                       device_id=None):
    """Join the job. ``local``: ``store`` is the LocalWorld; mpi: rank and size come from MPI;
    socket/nccl: rendezvous through ``init_method`` / ``store`` / the environment, except
    nccl under mpiexec with none of them (no MASTER_ADDR): then rank and size come from MPI
    and the NCCL unique id travels through MPI.COMM_WORLD. A store the rendezvous made is
    closed by destroy_process_group, so a job may init again on the same MASTER_PORT.
    ``timeout`` (30 minutes by default, as in torch) bounds the wait for every rank to arrive
    (logged meanwhile: see rendezvous) and each collective of the default group."""
    if state.current() is not None:
        raise ValueError("trying to initialize the default process group twice!")
    name, limit = _backend_name(backend, init_method, store), _seconds(timeout)
    made = None
    if name == LOCAL:
        transport = _local_transport(store, rank, world_size)
    elif name == Backend.MPI:
        transport = transports.create("mpi", rank=rank, world_size=world_size, timeout=limit)
        _abort_job_on_uncaught_exception(transport)
        _end_job_when_a_rank_leaves(transport)
    elif name == Backend.NCCL and init_method is None and store is None and _mpi_rendezvous():
        from .transports.mpi import world_rank_and_size
        rank, world_size = world_rank_and_size(rank, world_size, "init_process_group('nccl')")
        transport = transports.create(name, rank=rank, world_size=world_size, timeout=limit)
    else:
        from .rendezvous import arrive, rendezvous
        made = store is None
        store, rank, world_size = rendezvous(init_method, rank, world_size, limit, store)
        try:
            arrive(store, rank, world_size, limit)
            transport = transports.create(name, rank=rank, world_size=world_size, store=store,
                                          timeout=limit)
        except BaseException:
            if made:
                store.close()
            raise
    if name == Backend.NCCL:
        _abort_job_on_uncaught_exception(transport, "its NCCL communicator")
        _abort_communicator_at_failed_exit(transport)
    pg = ProcessGroup(transport, backend=name, timeout=limit, group_id=0, name=group_name)
    world = state.World(name, transport, pg, thread_local=name == LOCAL, timeout=limit)
    world.store = store if made else None
    state.install(world)


def _mpi_rendezvous() -> bool:
    """Started by mpiexec, and not told of a store server: under mpiexec nothing sets
    MASTER_ADDR, and MPI knows rank and size (what README's Launching section promises)."""
    return _launched_by_mpi() and not os.environ.get("MASTER_ADDR")


_previous_excepthook = None
_ABORT_GRACE_SECONDS = 0.2


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
        _time.sleep(_ABORT_GRACE_SECONDS)
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


def _end_job_when_a_rank_leaves(transport):
    """Under MPI, MPI_Finalize at exit waits for every rank, so a rank that leaves while the
    others are blocked on it (sys.exit(1) after a timeout, a plain return) would wait as long
    as they do. The transport's exit guard ends the job instead; it needs this process's exit
    status, which Python shows no atexit hook (see state.exit_status). Stays after
    destroy_process_group: the exit can hang just the same."""
    state.observe_exit()
    transport.guard_exit(state.exit_status, state.started_collective)


def _local_transport(world, rank, world_size):
    from .transports.local import LocalWorld
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


def destroy_process_group(group=None) -> None:
    """Finish pending async work and release ``group`` (default: everything)."""
    world = state.world()
    if group is None or group is world.default:
        for pg in world.groups:
            _work.stop(pg)
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


def get_backend(group=None) -> Backend:
    """The backend of ``group`` (default: the default group).

    Args:
        group: a process group this rank is a member of.

    Returns:
        The backend's name, lower case (a ``Backend``).
    """
    world = state.world()
    pg = state.resolve(group, "get_backend")
    if pg is None:
        raise ValueError(f"get_backend on rank {world.default.rank}: Invalid process group "
                         f"specified (this rank is not a member of the group)")
    return Backend(world.backend)


def get_rank(group=None) -> int:
    pg = state.resolve(group, "get_rank")
    return -1 if pg is None else pg.rank


def get_world_size(group=None) -> int:
    pg = state.resolve(group, "get_world_size")
    return -1 if pg is None else pg.size


def get_process_group_ranks(group) -> list[int]:
    pg = state.resolve(group, "get_process_group_ranks")
    if pg is None:
        raise ValueError("get_process_group_ranks: this rank is not a member of the group")
    return list(pg.ranks)


def get_global_rank(group, group_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if not isinstance(group_rank, int) or not 0 <= group_rank < len(ranks):
        raise ValueError(f"get_global_rank: group rank {group_rank!r} is not in the group "
                         f"(size {len(ranks)})")
    return ranks[group_rank]


def get_group_rank(group, global_rank: int) -> int:
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"get_group_rank: global rank {global_rank!r} is not part of the "
                         f"group (ranks {ranks})")
    return ranks.index(global_rank)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None):
    """A subgroup of the default group. Every rank must call it, in the same order;
    non-members get GroupMember.NON_GROUP_MEMBER."""
    world = state.world()
    size = world.default.size
    ranks = list(range(size)) if ranks is None else sorted(int(r) for r in ranks)
    for r in ranks:
        if not 0 <= r < size:
            raise ValueError(f"new_group on rank {world.default.rank}: Rank {r} is out of "
                             f"range: ranks {ranks} must be distinct ranks within "
                             f"0..{size - 1}")
    if not ranks or len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group on rank {world.default.rank}: ranks {ranks} must be "
                         f"distinct ranks within 0..{size - 1}")
    group_id = world.next_group_id
    world.next_group_id += 1
    if world.default.rank not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    transport = _subgroup_transport(world.transport, ranks, group_id)
    limit = world.timeout if timeout is None else _seconds(timeout)
    pg = ProcessGroup(transport, backend=world.backend, timeout=limit, group_id=group_id,
                      ranks=ranks, name=group_desc or f"group{group_id}")
    world.groups.append(pg)
    return pg


def _subgroup_transport(parent, ranks, group_id):
    from .transports.subgroup import SubgroupTransport
    make = getattr(parent, "subgroup", None)
    return make(ranks) if make is not None else SubgroupTransport(parent, ranks, group_id)


def new_subgroups(group_size=None, group=None, timeout=None, backend=None, pg_options=None,
                  group_desc=None):
    """Split ``group``'s ranks (default: the world) into consecutive subgroups of
    ``group_size`` ranks. Every rank of the world calls it, as for new_group; a rank outside
    ``group`` cannot know its ranks, so it gets a ValueError (in torch it fails too).

    Args:
        group_size: ranks per subgroup; default the launcher's LOCAL_WORLD_SIZE, else the
            size of ``group``. Must divide the size of ``group``.
        group: the process group to split (default: the default group).
        timeout, backend, pg_options, group_desc: as for new_group.

    Returns:
        (this rank's subgroup, every subgroup in order).
    """
    pg = state.resolve(group, "new_subgroups")
    if pg is None:
        raise ValueError(f"new_subgroups on rank {get_rank()}: this rank is not a member of "
                         f"the group to split; only its members know its ranks")
    ranks = list(pg.ranks)
    if group_size is None:
        group_size = int(os.environ.get("LOCAL_WORLD_SIZE", len(ranks)))
    if group_size <= 0 or len(ranks) % group_size:
        raise ValueError(f"new_subgroups on rank {get_rank()}: group_size {group_size} must be "
                         f"positive and divide the group's size {len(ranks)}")
    return new_subgroups_by_enumeration(
        [ranks[start:start + group_size] for start in range(0, len(ranks), group_size)],
        timeout=timeout, backend=backend, pg_options=pg_options, group_desc=group_desc)


def new_subgroups_by_enumeration(ranks_per_subgroup_list, timeout=None, backend=None,
                                 pg_options=None, group_desc=None):
    """One subgroup per list of global ranks; the lists must not overlap, and need not cover
    the world. Every rank of the world calls it with the same lists. Checked whole before any
    subgroup is made, so a bad list is the same ValueError on every rank.

    Args:
        ranks_per_subgroup_list: a list of lists of global ranks.
        timeout, backend, pg_options, group_desc: as for new_group.

    Returns:
        (this rank's subgroup, or None if it is in none; every subgroup in order, with
        GroupMember.NON_GROUP_MEMBER for those this rank is not in).
    """
    world = state.world()
    me, size = world.default.rank, world.default.size
    if not ranks_per_subgroup_list:
        raise ValueError(f"new_subgroups_by_enumeration on rank {me}: The arg "
                         f"'ranks_per_subgroup_list' cannot be empty")
    seen = {}
    for ranks in ranks_per_subgroup_list:
        for r in ranks:
            if not 0 <= int(r) < size:
                raise ValueError(f"new_subgroups_by_enumeration on rank {me}: Rank {r} is "
                                 f"out of range of the world size {size}")
            if r in seen:
                raise ValueError(f"new_subgroups_by_enumeration on rank {me}: Rank {r} has "
                                 f"appeared in both subgroup {seen[r]} and {list(ranks)}")
            seen[r] = list(ranks)
    subgroups, mine = [], None
    for ranks in ranks_per_subgroup_list:
        pg = new_group(list(ranks), timeout=timeout, backend=backend, pg_options=pg_options,
                       group_desc=group_desc)
        subgroups.append(pg)
        if pg is not GroupMember.NON_GROUP_MEMBER:
            mine = pg
    return mine, subgroups


# -- collectives --------------------------------------------------------------------------


def _group(group, operation):
    return state.resolve(group, operation)


def _call_timeout(timeout):
    """The keyword-only ``timeout=`` of every collective (seconds or a timedelta) bounds that
    call's waits instead of the group's timeout; None keeps the group's."""
    return None if timeout is None else _seconds(timeout)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None,
              *, algorithm=None, timeout=None):
    pg = _group(group, "broadcast")
    if pg is None:
        return None
    root = state.group_rank(pg, src, group_src, "broadcast", "src")
    buf = tensors.flat(tensor, "broadcast", pg.rank)
    run = pg.prepare("broadcast", output=buf, root=root, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [tensor])


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False,
               *, algorithm=None, timeout=None):
    pg = _group(group, "all_reduce")
    if pg is None:
        return None
    if tensors.is_sparse_coo(tensor):
        run = sparse.all_reduce(pg, tensor, op, _call_timeout(timeout))
        return _work.call(pg, run, async_op, [tensor])
    buf = tensors.flat(tensor, "all_reduce", pg.rank)
    _check_complex(op, buf.dtype, "all_reduce", pg.rank)
    run = pg.prepare("all_reduce", output=buf, op=op, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [tensor])


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, *,
                         algorithm=None, timeout=None):
    """all_reduce of several tensors of one dtype as one collective over their concatenation
    (deprecated in torch, still exported there).

    Args:
        tensors: a tensor or a list of tensors of one dtype, reduced in place.
        op, group, async_op: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None (None too on a rank outside ``group``).
    """
    pg = _group(group, "all_reduce_coalesced")
    if pg is None:
        return None
    operation = "all_reduce_coalesced"
    items = [tensors] if _tensors.is_torch(tensors) else tensors
    if not isinstance(items, (list, tuple)) or not items:
        raise TypeError(f"{operation} on rank {pg.rank}: tensors must be a tensor or a "
                        f"non-empty list of tensors")
    for i, t in enumerate(items):
        _check_complex(op, _tensors.flat(t, operation, pg.rank, f"tensors[{i}]").dtype,
                       operation, pg.rank)
    views = _real_views(items, operation, pg, "tensors")
    _check_outputs(operation, pg, views)
    whole = _tensors.concatenate(views, views[0])
    run = pg.prepare("all_reduce", output=whole, op=op, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, _then(run, _tensors.split_into, whole, views), async_op, list(items))


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None, *,
           algorithm=None, timeout=None):
    """The result lands in ``tensor`` on ``dst`` only; other ranks' tensors stay untouched."""
    pg = _group(group, "reduce")
    if pg is None:
        return None
    root = state.group_rank(pg, dst, group_dst, "reduce", "dst")
    buf = tensors.flat(tensor, "reduce", pg.rank)
    run = pg.prepare("reduce", input=buf, output=buf if pg.rank == root else None,
                     root=root, op=op, algorithm=algorithm, timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [tensor])


def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm=None, timeout=None):
    """Differently sized entries of ``tensor_list`` make this an all-gather-v."""
    pg = _group(group, "all_gather")
    if pg is None:
        return None
    outs = tensors.flat_list(tensor_list, "all_gather", pg.rank, "tensor_list", pg.size)
    buf = tensors.flat(tensor, "all_gather", pg.rank)
    _check_same_dtype("all_gather", pg, buf, outs)
    _check_outputs("all_gather", pg, outs)
    whole = tensors.empty(buf, sum(o.size for o in outs))
    run = pg.prepare("all_gather", input=buf, output=whole, counts=[o.size for o in outs],
                     algorithm=algorithm, timeout=_call_timeout(timeout))
    return _work.call(pg, _then(run, tensors.split_into, whole, outs), async_op, tensor_list)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False, *,
                         algorithm=None, timeout=None):
    """all_gather of several tensors as one collective over their concatenation (deprecated
    in torch, still exported there).

    Args:
        output_tensor_lists: one list per rank of the group, each holding one tensor per
            entry of ``input_tensor_list``, of that entry's size and dtype.
        input_tensor_list: this rank's tensors, of one dtype.
        group, async_op: as for all_gather.

    Returns:
        A Work if ``async_op``, else None (None too on a rank outside ``group``).
    """
    operation = "all_gather_coalesced"
    pg = _group(group, operation)
    if pg is None:
        return None
    ins = _real_views(input_tensor_list, operation, pg, "input_tensor_list")
    if not isinstance(output_tensor_lists, (list, tuple)):
        raise TypeError(f"{operation} on rank {pg.rank}: output_tensor_lists must be a list "
                        f"of lists of tensors, got {type(output_tensor_lists).__name__}")
    if len(output_tensor_lists) != pg.size:
        raise ValueError(f"{operation} on rank {pg.rank}: output_tensor_lists must hold "
                         f"{pg.size} lists (one per rank of the group), got "
                         f"{len(output_tensor_lists)}")
    outs = []
    for r, items in enumerate(output_tensor_lists):
        name = f"output_tensor_lists[{r}]"
        views = _real_views(items, operation, pg, name, len(ins))
        for i, (view, given) in enumerate(zip(views, ins)):
            if view.size != given.size or view.dtype != given.dtype:
                raise ValueError(f"{operation} on rank {pg.rank}: {name}[{i}] has {view.size} "
                                 f"{view.dtype} elements; input_tensor_list[{i}] has "
                                 f"{given.size} {given.dtype}")
        outs.extend(views)
    _check_outputs(operation, pg, outs)
    if not ins:
        return _work.call(pg, lambda: None, async_op, [])
    whole_in = tensors.concatenate(ins, ins[0])
    whole = tensors.empty(ins[0], whole_in.size * pg.size)
    run = pg.prepare("all_gather", input=whole_in, output=whole, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, _then(run, tensors.split_into, whole, outs), async_op,
                      [t for items in output_tensor_lists for t in items])


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           algorithm=None, timeout=None):
    pg = _group(group, "all_gather_into_tensor")
    if pg is None:
        return None
    out = tensors.flat(output_tensor, "all_gather_into_tensor", pg.rank, "output_tensor")
    buf = tensors.flat(input_tensor, "all_gather_into_tensor", pg.rank, "input_tensor")
    run = pg.prepare("all_gather", input=buf, output=out, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [output_tensor])


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, *,
           algorithm=None, timeout=None):
    """``gather_list`` (one tensor per rank, each the size of ``tensor``) only on ``dst``."""
    pg = _group(group, "gather")
    if pg is None:
        return None
    root = state.group_rank(pg, dst, group_dst, "gather", "dst")
    buf = tensors.flat(tensor, "gather", pg.rank)
    outs, whole = _rooted_list("gather", pg, root, gather_list, "gather_list", buf)
    run = pg.prepare("gather", input=buf, output=whole, root=root, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    finish = _then(run, tensors.split_into, whole, outs) if whole is not None else run
    return _work.call(pg, finish, async_op, list(gather_list or []))


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, *,
            algorithm=None, timeout=None):
    """``scatter_list`` (one tensor per rank, each the size of ``tensor``) only on ``src``."""
    pg = _group(group, "scatter")
    if pg is None:
        return None
    root = state.group_rank(pg, src, group_src, "scatter", "src")
    out = tensors.flat(tensor, "scatter", pg.rank)
    ins, _ = _rooted_list("scatter", pg, root, scatter_list, "scatter_list", out)
    whole = tensors.concatenate(ins, out) if pg.rank == root else None
    run = pg.prepare("scatter", input=whole, output=out, root=root, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [tensor])


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, *,
                   algorithm=None, timeout=None):
    """Differently sized entries of ``input_list`` make this an uneven reduce-scatter."""
    pg = _group(group, "reduce_scatter")
    if pg is None:
        return None
    out = tensors.flat(output, "reduce_scatter", pg.rank, "output")
    ins = tensors.flat_list(input_list, "reduce_scatter", pg.rank, "input_list", pg.size)
    _check_same_dtype("reduce_scatter", pg, out, ins)
    whole = tensors.concatenate(ins, out)
    run = pg.prepare("reduce_scatter", input=whole, output=out, counts=[i.size for i in ins],
                     op=op, algorithm=algorithm, timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [output])


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm=None, timeout=None):
    pg = _group(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    out = tensors.flat(output, "reduce_scatter_tensor", pg.rank, "output")
    buf = tensors.flat(input, "reduce_scatter_tensor", pg.rank, "input")
    run = pg.prepare("reduce_scatter", input=buf, output=out, op=op, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [output])


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, *,
               algorithm=None, timeout=None):
    """Entry j of ``input_tensor_list`` goes to rank j; sizes may differ (all-to-all-v)."""
    pg = _group(group, "all_to_all")
    if pg is None:
        return None
    outs = tensors.flat_list(output_tensor_list, "all_to_all", pg.rank, "output_tensor_list",
                             pg.size)
    ins = tensors.flat_list(input_tensor_list, "all_to_all", pg.rank, "input_tensor_list",
                            pg.size)
    _check_same_dtype("all_to_all", pg, outs[0] if outs else None, ins)
    _check_outputs("all_to_all", pg, outs)
    like = (ins or outs)[0]
    counts = _all_to_all_counts(pg, [i.size for i in ins], [o.size for o in outs], algorithm)
    whole_in = tensors.concatenate(ins, like)
    whole_out = tensors.empty(like, sum(o.size for o in outs))
    run = pg.prepare("all_to_all", input=whole_in, output=whole_out, counts=counts,
                     algorithm=algorithm, timeout=_call_timeout(timeout))
    finish = _then(run, tensors.split_into, whole_out, outs)
    return _work.call(pg, finish, async_op, output_tensor_list)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, algorithm=None, timeout=None):
    """Split sizes count rows of dim 0, as in torch; without them the split is even."""
    pg = _group(group, "all_to_all_single")
    if pg is None:
        return None
    out = tensors.flat(output, "all_to_all_single", pg.rank, "output")
    buf = tensors.flat(input, "all_to_all_single", pg.rank, "input")
    counts = None
    if output_split_sizes is not None or input_split_sizes is not None:
        sends = _splits(pg, input_split_sizes, buf.size, tensors.rows(input), "input_split_sizes")
        recvs = _splits(pg, output_split_sizes, out.size, tensors.rows(output),
                        "output_split_sizes")
        counts = _all_to_all_counts(pg, sends, recvs, algorithm)
    run = pg.prepare("all_to_all", input=buf, output=out, counts=counts, algorithm=algorithm,
                     timeout=_call_timeout(timeout))
    return _work.call(pg, run, async_op, [output])


def barrier(group=None, async_op=False, device_ids=None, *, algorithm=None, timeout=None):
    pg = _group(group, "barrier")
    if pg is None:
        return None
    run = pg.prepare("barrier", algorithm=algorithm, timeout=_call_timeout(timeout))
    return _work.call(pg, _timed_out_words(run, "barrier", pg), async_op, [])


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that fails with CollectiveTimeout after ``timeout`` instead of hanging."""
    pg = _group(group, "monitored_barrier")
    if pg is None:
        return None
    run = pg.prepare("barrier", timeout=_seconds(timeout))
    return _work.call(pg, _timed_out_words(run, "monitored_barrier", pg), False, [])


def _timed_out_words(run, operation, pg):
    """A barrier's timeout says TIMED_OUT, torch's words (gloo's "Timed out waiting ...",
    which code and torch's tests match), before the executor's account of where it waited
    (the host executor's says them already; the compiled and NCCL ones do not)."""
    def run_or_time_out():
        started = _time.monotonic()
        try:
            run()
        except CollectiveTimeout as exc:
            if TIMED_OUT in str(exc):
                raise
            raise CollectiveTimeout(f"{operation} on rank {pg.rank}: {TIMED_OUT} after "
                                    f"{_time.monotonic() - started:.3g} s; {exc}") from exc
    return run_or_time_out


# -- helpers of the list-shaped collectives -----------------------------------------------


def _then(run, finish, *args):
    def run_and_finish():
        run()
        finish(*args)
    return run_and_finish


def _real_views(items, operation, pg, name, length=None):
    """Flat views of a list of tensors of one dtype, complex ones as (re, im) pairs of reals:
    as in torch's coalesced collectives, a complex tensor and its element type (complex64
    and float32) may be mixed."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{operation} on rank {pg.rank}: {name} must be a list of tensors, "
                        f"got {type(items).__name__}")
    if length is not None and len(items) != length:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} must hold {length} tensors, "
                         f"got {len(items)}")
    views = [tensors.as_real(tensors.flat(t, operation, pg.rank, f"{name}[{i}]"))
             for i, t in enumerate(items)]
    for i, view in enumerate(views[1:], 1):
        if view.dtype != views[0].dtype:
            raise TypeError(f"{operation} on rank {pg.rank}: {name} mixes dtypes "
                            f"({items[0].dtype} and {items[i].dtype} at index {i})")
    return views


def _check_outputs(operation, pg, outs):
    for i, view in enumerate(outs):
        if not tensors.writeable(view):
            raise ValueError(f"{operation} on rank {pg.rank}: output tensor {i} is read-only")


def _check_same_dtype(operation, pg, one, many):
    for i, view in enumerate(many):
        if one is not None and view.dtype != one.dtype:
            raise TypeError(f"{operation} on rank {pg.rank}: input and output dtypes differ "
                            f"({view.dtype} at index {i} vs {one.dtype})")


def _rooted_list(operation, pg, root, items, name, like):
    """gather_list / scatter_list: required on the root (one per rank, each like ``like``),
    forbidden elsewhere, as in torch. Returns (views, a flat buffer for gather's output)."""
    if pg.rank != root:
        if items:
            raise ValueError(f"{operation} on rank {pg.rank}: {name} must not be given on "
                             f"ranks other than the root ({root})")
        return [], None
    if items is None:
        raise ValueError(f"{operation} on rank {pg.rank}: {name} is required on the root")
    views = tensors.flat_list(items, operation, pg.rank, name, pg.size)
    for i, view in enumerate(views):
        if view.size != like.size or view.dtype != like.dtype:
            raise ValueError(f"{operation} on rank {pg.rank}: {name}[{i}] has {view.size} "
                             f"{view.dtype} elements; each entry must match the tensor "
                             f"({like.size} {like.dtype})")
    if operation == "gather":
        _check_outputs(operation, pg, views)
    return views, tensors.empty(like, like.size * pg.size)


def _splits(pg, sizes, total, per_row, name):
    if sizes is None:
        if total % pg.size:
            raise ValueError(f"all_to_all_single on rank {pg.rank}: {total} elements do not "
                             f"split evenly over {pg.size} ranks; give {name}")
        return [total // pg.size] * pg.size
    sizes = [int(s) for s in sizes]
    if len(sizes) != pg.size or any(s < 0 for s in sizes) or sum(sizes) * per_row != total:
        raise ValueError(f"all_to_all_single on rank {pg.rank}: {name} {sizes} must be "
                         f"{pg.size} non-negative row counts adding up to the tensor's rows")
    return [s * per_row for s in sizes]


def _all_to_all_counts(pg, sends, recvs, algorithm):
    """The full matrix counts[i][j] (i sends to j): ProcessGroup.all_to_all_matrix. MPI's
    native all-to-all needs only this rank's row and column."""
    p, me = pg.size, pg.rank
    if (algorithm or pg.overrides.get("all_to_all")) == "native":
        matrix = [[0] * p for _ in range(p)]
        matrix[me] = list(sends)
        for i in range(p):
            matrix[i][me] = recvs[i]
        return matrix
    return pg.all_to_all_matrix(sends, recvs, "all_to_all",
                                lambda run: _work.call(pg, run, False, []))


from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send  # noqa: E402
from .objects import (all_gather_object, broadcast_object_list, gather_object,  # noqa: E402
                      scatter_object_list)
from .testing import spawn_local  # noqa: E402
