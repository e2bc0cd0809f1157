"""``import collectives as dist`` keeps its names now that the facade's bodies live in
``collectives.facade``, and every public function of the facade is documented as torch's are
(a summary line, Args when it takes any, Returns)."""
import inspect
import types

import collectives
from collectives import state

# dir(collectives) before the bodies moved, less submodules (what is imported eagerly may
# change) and the standard-library names the old module imported for itself (os, sys,
# importlib, timedelta), which were never API.
PUBLIC_BEFORE = """
    Backend CollectiveError CollectiveTimeout DebugLevel Future GroupMember LOCAL P2POp
    ProcessGroup ReduceOp TIMED_OUT TransportError Work all_gather all_gather_coalesced
    all_gather_into_tensor all_gather_object all_reduce all_reduce_coalesced all_to_all
    all_to_all_single annotations barrier batch_isend_irecv broadcast broadcast_object_list
    destroy_process_group gather gather_object get_backend get_debug_level get_global_rank
    get_group_rank get_process_group_ranks get_rank get_world_size group init_process_group
    irecv is_available is_gloo_available is_initialized is_mpi_available is_nccl_available
    is_torchelastic_launched isend monitored_barrier new_group new_subgroups
    new_subgroups_by_enumeration recv reduce reduce_op reduce_scatter reduce_scatter_tensor
    scatter scatter_object_list send set_debug_level set_debug_level_from_env spawn_local
""".split()
# private names that tests of the exit paths and of the backend choice reach through the facade
PRIVATE_KEPT = ["_abort_nccl_if_failing", "_backend_name", "_nccl_at_exit"]


def _public():
    return {name for name in dir(collectives) if not name.startswith("_")
            and not isinstance(getattr(collectives, name), types.ModuleType)}


def test_the_facade_exposes_the_same_names():
    assert _public() == set(PUBLIC_BEFORE)
    assert set(collectives.__all__) <= set(PUBLIC_BEFORE)
    for name in PRIVATE_KEPT:
        assert hasattr(collectives, name), name


def test_group_is_the_group_namespace_not_the_module():
    # ``collectives.group`` was torch's ``dist.group`` (group.WORLD) before the move, even
    # though a submodule of that name exists
    assert collectives.group is state.group
    assert hasattr(collectives.group, "WORLD")


def _functions():
    for name in collectives.__all__:
        obj = getattr(collectives, name)
        if isinstance(obj, types.FunctionType):
            yield name, obj


def test_every_public_function_has_a_torch_style_docstring():
    missing = []
    for name, fn in _functions():
        doc = inspect.getdoc(fn) or ""
        takes_arguments = bool(inspect.signature(fn).parameters)
        if not doc or "Returns:" not in doc or (takes_arguments and "Args:" not in doc):
            missing.append(name)
    assert not missing, f"without a summary, Args and Returns: {missing}"
