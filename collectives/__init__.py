"""collectives: collective algorithms behind a torch.distributed-shaped facade.

``import collectives as dist`` runs code written for ``torch.distributed``: the same function
names, parameters, defaults, ``Work`` handles and error types. Each collective here is thin:
adapt the buffers to flat views (``tensors``), let the ProcessGroup validate the call and
assign its tag (``group.prepare``), then run it now or queue it on the group's worker
(``work``). Extensions beyond torch are keyword-only: ``algorithm="ring" | "tree" |
"recursive_doubling" | "native" | "auto"``.

Backends: ``mpi`` (under mpiexec), ``socket`` (``gloo`` is its alias), ``nccl``, and
``local`` (ranks are threads of one process; see ``spawn_local``).

The bodies live in ``collectives.facade`` (setup, groups, collectives) and in ``p2p``,
``objects``, ``debug`` and ``testing``; this module only gathers their names.
"""
from __future__ import annotations

from .debug import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .errors import TIMED_OUT, CollectiveError, CollectiveTimeout, TransportError
from .facade.collectives import (all_gather, all_gather_coalesced, all_gather_into_tensor,
                                 all_reduce, all_reduce_coalesced, all_to_all,
                                 all_to_all_single, barrier, broadcast, gather,
                                 monitored_barrier, reduce, reduce_scatter,
                                 reduce_scatter_tensor, scatter)
from .facade.groups import (get_global_rank, get_group_rank, get_process_group_ranks, get_rank,
                            get_world_size, new_group, new_subgroups,
                            new_subgroups_by_enumeration)
from .facade.setup import (LOCAL, Backend, destroy_process_group, get_backend,
                           init_process_group, is_available, is_gloo_available, is_initialized,
                           is_mpi_available, is_nccl_available, is_torchelastic_launched)
# not API: reached by tests of the exit paths and of the backend choice
from .facade.setup import _abort_nccl_if_failing, _backend_name, _nccl_at_exit  # noqa: F401
from .group import ProcessGroup
from .objects import (all_gather_object, broadcast_object_list, gather_object,
                      scatter_object_list)
from .ops import ReduceOp
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
# after every import of the submodule collectives.group: ``group`` is torch's group namespace
from .state import GroupMember, group
from .testing import spawn_local
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
