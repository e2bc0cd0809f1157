"""Sparse COO all_reduce, as gloo does it: a SUM of every rank's nonzeros. Shared by the
facade (``collectives.all_reduce``) and the torch backend (``collectives.c10d``).

The ranks' nonzeros differ in number, so each rank's indices and values are all-gathered
(all-gather-v, after a small all_gather of the counts), then every rank adds them up
(``coalesce``) and copies the sum into the caller's tensor. torch is looked up in
``sys.modules``: a sparse tensor can only exist once it was imported.

Limits: SUM only (gloo's too); COO only (CSR/CSC are a TypeError from ``tensors.flat``);
the result's nonzeros are coalesced, whatever the input's were.
"""
from __future__ import annotations

import sys

from . import tensors, work as _work
from .ops import ReduceOp


def all_reduce(pg, tensor, op, timeout, operation: str = "all_reduce"):
    """Validate and prepare the SUM of ``tensor`` (a sparse COO torch tensor) over ``pg``;
    returns ``run()``, which gathers and writes the sum into ``tensor``. The counts are
    exchanged now, synchronously, as one small all_gather of ``pg`` (the collective after it
    is this one's first gather, on every rank alike)."""
    if ReduceOp.parse(op) != ReduceOp.SUM:
        raise ValueError(f"{operation} on rank {pg.rank}: sparse tensors reduce with "
                         f"ReduceOp.SUM only, got ReduceOp.{ReduceOp.parse(op).name}")
    torch = sys.modules["torch"]
    local = tensor.detach().coalesce()
    dense_shape = tuple(local.values().shape[1:])
    # (nonzero, dimension) rows, so that the ranks' blocks concatenate into one index list
    indices = tensors.flat(local.indices().t().contiguous(), operation, pg.rank, "indices")
    values = tensors.flat(local.values().contiguous(), operation, pg.rank, "values")
    counts = pg.xp.empty(2 * pg.size, dtype="int64")
    mine = pg.xp.asarray([indices.size, values.size], dtype="int64")
    _work.call(pg, pg.prepare("all_gather", input=mine, output=counts, timeout=timeout),
               False, [])
    counts = counts.reshape(pg.size, 2).tolist()
    # torch owns the gathered buffers (any dtype, any device); the collectives fill them
    # through flat views.
    index_total = torch.empty(sum(c[0] for c in counts), dtype=torch.int64,
                              device=local.device)
    value_total = torch.empty(sum(c[1] for c in counts), dtype=local.dtype, device=local.device)
    all_indices = tensors.flat(index_total, operation, pg.rank, "indices")
    all_values = tensors.flat(value_total, operation, pg.rank, "values")
    gather_indices = pg.prepare("all_gather", input=indices, output=all_indices,
                                counts=[c[0] for c in counts], timeout=timeout)
    gather_values = pg.prepare("all_gather", input=values, output=all_values,
                               counts=[c[1] for c in counts], timeout=timeout)

    def run():
        gather_indices()
        gather_values()
        total = torch.sparse_coo_tensor(index_total.reshape(-1, local.sparse_dim()).t(),
                                        value_total.reshape(-1, *dense_shape), local.shape)
        with torch.no_grad():         # a sparse detach() would not share the nonzeros
            tensor.copy_(total.coalesce())
    return run
