"""Which of torch's distributed tests run, and what is known about them on our backend.

ci: every test of ``DistributedTest._DistTestBase`` that passes on gloo at world size 3 on a
CPU-only machine (torch 2.13): collectives, p2p, groups, object collectives, DDP on CPU. The
rest of the suite (about 195 tests) skips on gloo there: CUDA, NCCL- or MPI-only features,
world size 4 or 8 — running them costs a fork each and compares nothing, so CI leaves them to
the full selection. Names are listed, not computed, so that a torch upgrade that renames or
drops a test shows up as "missing" instead of silently shrinking what CI compares.

quick: 30 of the ci selection, what CI runs on our backend alone (QUICK below).

full: every test of ``_DistTestBase`` (``None``: the runner lists the class).
"""

CI = [
    # collectives
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_product", "test_all_reduce_min", "test_all_reduce_max",
    "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_max_complex_unsupported",
    "test_sparse_all_reduce_sum",
    "test_reduce_sum", "test_reduce_product", "test_reduce_min", "test_reduce_max",
    "test_reduce_sum_twice",
    "test_broadcast",
    "test_all_gather", "test_all_gather_complex",
    "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_with_empty",
    "test_gather", "test_gather_checks",
    "test_scatter", "test_scatter_checks", "test_scatter_complex",
    "test_barrier", "test_barrier_timeout_full_group",
    # p2p
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source",
    "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    "test_send_recv_autograd_profiler", "test_send_recv_torch_profiler",
    "test_send_recv_with_tag_autograd_profiler", "test_send_recv_with_tag_torch_profiler",
    "test_send_recv_any_source_autograd_profiler", "test_send_recv_any_source_torch_profiler",
    "test_isend_autograd_profiler", "test_isend_torch_profiler",
    # groups (the full group: new_group() of every rank; torch's [1, 2] groups need 8 ranks)
    "test_get_rank", "test_get_backend", "test_Backend_enum_class",
    "test_get_rank_size_group", "test_get_rank_size_full_group",
    "test_destroy_group", "test_destroy_full_group",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_product",
    "test_all_reduce_full_group_min", "test_all_reduce_full_group_max",
    "test_all_reduce_coalesced_full_group_sum", "test_all_reduce_coalesced_full_group_product",
    "test_all_reduce_coalesced_full_group_min", "test_all_reduce_coalesced_full_group_max",
    "test_reduce_full_group_sum", "test_reduce_full_group_product",
    "test_reduce_full_group_min", "test_reduce_full_group_max",
    "test_broadcast_full_group", "test_all_gather_full_group",
    "test_all_gather_coalesced_full_group", "test_gather_full_group",
    "test_scatter_full_group", "test_barrier_full_group",
    # object collectives
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup",
    "test_scatter_object_list",
    # DDP on CPU
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph",
    "test_ddp_logging_data_cpu", "test_static_graph_api_cpu", "test_dump_DDP_relevant_env_vars",
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_get_future",
]

# What CI runs, on our backend alone (about 30 s on 2 cores; the gloo side of the comparison
# and the rest of CI are by hand, compare.py): every kind of collective once, the sparse
# all_reduce and the barrier timeout, p2p with tags and any source, groups, objects, and DDP
# (buckets, no_sync, a comm hook's then(), create_graph, static graph, get_future).
QUICK = [
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_max",
    "test_all_reduce_complex_unsupported_ops", "test_all_reduce_coalesced_sum",
    "test_sparse_all_reduce_sum", "test_reduce_sum", "test_broadcast", "test_all_gather",
    "test_all_gather_coalesced_simple", "test_gather", "test_scatter",
    "test_barrier_timeout_full_group",
    "test_send_recv_with_tag", "test_send_recv_any_source", "test_isend", "test_irecv",
    "test_batch_isend_irecv_gloo",
    "test_get_rank_size_full_group", "test_all_reduce_full_group_sum", "test_destroy_group",
    "test_all_gather_object_default_pg", "test_scatter_object_list",
    "test_DistributedDataParallelCPU", "test_accumulate_gradients_no_sync",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_ddp_create_graph",
    "test_static_graph_api_cpu", "test_get_future",
]

# Tests of what torch implements for gloo alone: they fail on any other backend by torch's
# design, not ours. Run (in full) but not compared.
_MONITORED = ("torch implements monitored_barrier for gloo alone: distributed_c10d raises "
              "'monitored_barrier is only implemented for GLOO backend' for any other")
GLOO_ONLY = {
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
    "test_monitored_barrier_gloo_rank_0_timeout": _MONITORED,
    "test_monitored_barrier_failure_order": _MONITORED,
    "test_monitored_barrier_wait_all_ranks": _MONITORED,
}

# Tests that pass on gloo and fail on ours for a gap of our backend (collectives/c10d.py) that
# this runner cannot fix: each is reported on every run, and CI stays green; a known failure
# that starts passing is reported too (remove it here then).
KNOWN_FAILURES: dict[str, str] = {}

# Bodies that test ``BACKEND == "gloo"`` (or "mpi") to mean "a CPU backend" and otherwise
# take the NCCL branch: in the ranks, after init, they see gloo's name (run.py).
BODY_AS_GLOO = {
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
}


def names(which):
    """The test names of a selection: "quick", "ci", "full" (None: every test of the class),
    or a file of names, one a line (# comments)."""
    if which == "ci":
        return list(CI)
    if which == "quick":
        return list(QUICK)
    if which == "full":
        return None
    with open(which) as f:
        return [ln.split("#")[0].strip() for ln in f if ln.split("#")[0].strip()]
