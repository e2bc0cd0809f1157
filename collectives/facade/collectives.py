"""The collectives, each as torch's: validate, then ``_issue``: one ``prepare`` of the group,
run now or queued on the group's worker (a Work)."""
from __future__ import annotations

from .. import sparse, state, tensors, work as _work
from .. import tensors as _tensors     # for functions whose torch parameter is named "tensors"
from ..ops import ReduceOp, check_complex as _check_complex
from .arguments import (_all_to_all_counts, _check_outputs, _check_same_dtype, _group, _issue,
                        _real_views, _rooted_list, _splits)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None,
              *, algorithm=None, timeout=None):
    """Broadcast ``tensor`` from ``src`` to every rank of the group.

    Args:
        tensor (Tensor or array): the data on ``src``, the output elsewhere.
        src (int): the source's global rank.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        async_op (bool, optional): return a Work instead of waiting.
        group_src (int, optional): the source's group rank, instead of ``src``.
        algorithm (str, optional, keyword-only): the schedule (ring, tree, ..., native, auto);
            None: the group's decision table.
        timeout (float or timedelta, optional, keyword-only): bounds this call's waits; None:
            the group's timeout.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "broadcast")
    if pg is None:
        return None
    root = state.group_rank(pg, src, group_src, "broadcast", "src")
    buf = tensors.flat(tensor, "broadcast", pg.rank)
    return _issue(pg, "broadcast", async_op, [tensor], output=buf, root=root,
                  algorithm=algorithm, timeout=timeout)


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False,
               *, algorithm=None, timeout=None):
    """Reduce ``tensor`` over every rank of the group, in place; every rank gets the result.

    Args:
        tensor (Tensor or array): input and output; a sparse COO tensor takes SUM.
        op (ReduceOp, optional): the element-wise reduction.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        async_op (bool, optional): return a Work instead of waiting.
        algorithm (str, optional, keyword-only): the schedule (ring, tree, ..., native, auto);
            None: the group's decision table.
        timeout (float or timedelta, optional, keyword-only): bounds this call's waits; None:
            the group's timeout.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "all_reduce")
    if pg is None:
        return None
    if tensors.is_sparse_coo(tensor):
        run = sparse.all_reduce(pg, tensor, op, timeout)
        return _work.call(pg, run, async_op, [tensor])
    buf = tensors.flat(tensor, "all_reduce", pg.rank)
    _check_complex(op, buf.dtype, "all_reduce", pg.rank)
    return _issue(pg, "all_reduce", async_op, [tensor], output=buf, op=op, algorithm=algorithm,
                  timeout=timeout)


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False, *,
                         algorithm=None, timeout=None):
    """all_reduce of several tensors of one dtype as one collective over their concatenation.

    Deprecated in torch, still exported there.

    Args:
        tensors (Tensor or list[Tensor]): reduced in place; one dtype (a complex tensor may be
            mixed with its element type).
        op, group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
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
    return _issue(pg, "all_reduce", async_op, list(items), split=(whole, views), output=whole,
                  op=op, algorithm=algorithm, timeout=timeout)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None, *,
           algorithm=None, timeout=None):
    """Reduce ``tensor`` over every rank of the group into ``tensor`` on ``dst``.

    Args:
        tensor (Tensor or array): the input; the result on ``dst``, untouched elsewhere.
        dst (int): the destination's global rank.
        op (ReduceOp, optional): the element-wise reduction.
        group (ProcessGroup, optional): the group to work on; None is the default group.
        async_op (bool, optional): return a Work instead of waiting.
        group_dst (int, optional): the destination's group rank, instead of ``dst``.
        algorithm (str, optional, keyword-only): the schedule (ring, tree, ..., native, auto);
            None: the group's decision table.
        timeout (float or timedelta, optional, keyword-only): bounds this call's waits; None:
            the group's timeout.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "reduce")
    if pg is None:
        return None
    root = state.group_rank(pg, dst, group_dst, "reduce", "dst")
    buf = tensors.flat(tensor, "reduce", pg.rank)
    return _issue(pg, "reduce", async_op, [tensor], input=buf,
                  output=buf if pg.rank == root else None, root=root, op=op,
                  algorithm=algorithm, timeout=timeout)


def all_gather(tensor_list, tensor, group=None, async_op=False, *, algorithm=None, timeout=None):
    """Gather every rank's ``tensor`` into ``tensor_list`` on every rank.

    Args:
        tensor_list (list[Tensor]): one output per rank, in group-rank order; differently sized
            entries make this an all-gather-v.
        tensor (Tensor or array): this rank's input.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "all_gather")
    if pg is None:
        return None
    outs = tensors.flat_list(tensor_list, "all_gather", pg.rank, "tensor_list", pg.size)
    buf = tensors.flat(tensor, "all_gather", pg.rank)
    _check_same_dtype("all_gather", pg, buf, outs)
    _check_outputs("all_gather", pg, outs)
    whole = tensors.empty(buf, sum(o.size for o in outs))
    return _issue(pg, "all_gather", async_op, tensor_list, split=(whole, outs), input=buf,
                  output=whole, counts=[o.size for o in outs], algorithm=algorithm,
                  timeout=timeout)


def all_gather_coalesced(output_tensor_lists, input_tensor_list, group=None, async_op=False, *,
                         algorithm=None, timeout=None):
    """all_gather of several tensors as one collective over their concatenation.

    Deprecated in torch, still exported there.

    Args:
        output_tensor_lists (list[list[Tensor]]): one list per rank of the group, each with one
            tensor per entry of ``input_tensor_list``, of its size and dtype.
        input_tensor_list (list[Tensor]): this rank's tensors, of one dtype.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
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
    return _issue(pg, "all_gather", async_op, [t for items in output_tensor_lists for t in items],
                  split=(whole, outs), input=whole_in, output=whole, algorithm=algorithm,
                  timeout=timeout)


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False, *,
                           algorithm=None, timeout=None):
    """Gather every rank's ``input_tensor`` into one tensor, rank r's block at r.

    Args:
        output_tensor (Tensor): group size times the input's elements.
        input_tensor (Tensor): this rank's input.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "all_gather_into_tensor")
    if pg is None:
        return None
    out = tensors.flat(output_tensor, "all_gather_into_tensor", pg.rank, "output_tensor")
    buf = tensors.flat(input_tensor, "all_gather_into_tensor", pg.rank, "input_tensor")
    return _issue(pg, "all_gather", async_op, [output_tensor], input=buf, output=out,
                  algorithm=algorithm, timeout=timeout)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None, *,
           algorithm=None, timeout=None):
    """Gather every rank's ``tensor`` into ``gather_list`` on ``dst``.

    Args:
        tensor (Tensor or array): this rank's input.
        gather_list (list[Tensor], optional): on ``dst`` only, one tensor per rank, each the
            size of ``tensor``.
        dst (int): the destination's global rank.
        group_dst (int, optional): the destination's group rank, instead of ``dst``.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "gather")
    if pg is None:
        return None
    root = state.group_rank(pg, dst, group_dst, "gather", "dst")
    buf = tensors.flat(tensor, "gather", pg.rank)
    outs, whole = _rooted_list("gather", pg, root, gather_list, "gather_list", buf)
    return _issue(pg, "gather", async_op, list(gather_list or []),
                  split=(whole, outs) if whole is not None else None, input=buf, output=whole,
                  root=root, algorithm=algorithm, timeout=timeout)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None, *,
            algorithm=None, timeout=None):
    """Scatter ``scatter_list`` from ``src``: rank i receives entry i in ``tensor``.

    Args:
        tensor (Tensor or array): this rank's output.
        scatter_list (list[Tensor], optional): on ``src`` only, one tensor per rank, each the
            size of ``tensor``.
        src (int): the source's global rank.
        group_src (int, optional): the source's group rank, instead of ``src``.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "scatter")
    if pg is None:
        return None
    root = state.group_rank(pg, src, group_src, "scatter", "src")
    out = tensors.flat(tensor, "scatter", pg.rank)
    ins, _ = _rooted_list("scatter", pg, root, scatter_list, "scatter_list", out)
    whole = tensors.concatenate(ins, out) if pg.rank == root else None
    return _issue(pg, "scatter", async_op, [tensor], input=whole, output=out, root=root,
                  algorithm=algorithm, timeout=timeout)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False, *,
                   algorithm=None, timeout=None):
    """Reduce ``input_list`` over the group; rank i gets the reduction of entry i in ``output``.

    Args:
        output (Tensor or array): this rank's block of the result.
        input_list (list[Tensor]): one entry per rank; differently sized entries make this an
            uneven reduce-scatter.
        op, group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "reduce_scatter")
    if pg is None:
        return None
    out = tensors.flat(output, "reduce_scatter", pg.rank, "output")
    ins = tensors.flat_list(input_list, "reduce_scatter", pg.rank, "input_list", pg.size)
    _check_same_dtype("reduce_scatter", pg, out, ins)
    whole = tensors.concatenate(ins, out)
    return _issue(pg, "reduce_scatter", async_op, [output], input=whole, output=out,
                  counts=[i.size for i in ins], op=op, algorithm=algorithm, timeout=timeout)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False, *,
                          algorithm=None, timeout=None):
    """Reduce ``input`` over the group; rank i gets block i of the result in ``output``.

    Args:
        output (Tensor): this rank's block.
        input (Tensor): group size times the output's elements.
        op, group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    out = tensors.flat(output, "reduce_scatter_tensor", pg.rank, "output")
    buf = tensors.flat(input, "reduce_scatter_tensor", pg.rank, "input")
    return _issue(pg, "reduce_scatter", async_op, [output], input=buf, output=out, op=op,
                  algorithm=algorithm, timeout=timeout)


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False, *,
               algorithm=None, timeout=None):
    """Exchange blocks: entry j of ``input_tensor_list`` goes to rank j.

    Args:
        output_tensor_list (list[Tensor]): entry j receives rank j's block for this rank.
        input_tensor_list (list[Tensor]): entry j goes to rank j; sizes may differ
            (all-to-all-v).
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
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
    return _issue(pg, "all_to_all", async_op, output_tensor_list, split=(whole_out, outs),
                  input=whole_in, output=whole_out, counts=counts, algorithm=algorithm,
                  timeout=timeout)


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False, *, algorithm=None, timeout=None):
    """Exchange blocks of one tensor: block j of ``input`` goes to rank j.

    Args:
        output (Tensor): the blocks received, in rank order.
        input (Tensor): the blocks to send, in rank order.
        output_split_sizes (list[int], optional): rows of dim 0 received from each rank; None:
            an even split.
        input_split_sizes (list[int], optional): rows of dim 0 sent to each rank; None: an even
            split.
        group, async_op, algorithm, timeout: as for all_reduce.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
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
    return _issue(pg, "all_to_all", async_op, [output], input=buf, output=out, counts=counts,
                  algorithm=algorithm, timeout=timeout)


def barrier(group=None, async_op=False, device_ids=None, *, algorithm=None, timeout=None):
    """Wait until every rank of the group has entered the barrier.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default group.
        async_op (bool, optional): return a Work instead of waiting.
        device_ids: accepted for torch's signature.
        algorithm (str, optional, keyword-only): the schedule (ring, tree, ..., native, auto);
            None: the group's decision table.
        timeout (float or timedelta, optional, keyword-only): bounds this call's waits; None:
            the group's timeout.

    Returns:
        A Work if ``async_op``, else None; None too on a rank outside ``group``.
    """
    pg = _group(group, "barrier")
    if pg is None:
        return None
    return _issue(pg, "barrier", async_op, [], algorithm=algorithm, timeout=timeout)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier that fails with CollectiveTimeout after ``timeout`` instead of hanging.

    Args:
        group (ProcessGroup, optional): the group to work on; None is the default group.
        timeout (float or timedelta, optional): None: the group's timeout.
        wait_all_ranks: accepted for torch's signature.

    Returns:
        None.
    """
    pg = _group(group, "monitored_barrier")
    if pg is None:
        return None
    return _issue(pg, "barrier", False, [], operation="monitored_barrier", timeout=timeout)
