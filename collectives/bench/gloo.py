"""The socket backend's baseline: torch's gloo in the same processes.

The socket transport has no library collectives of its own, so the baseline ("native") is
torch's gloo backend in the same processes, when torch is importable: a second, independent
job (``torch.distributed.init_process_group("gloo")`` with its own TCPStore on a port rank 0
picks and broadcasts) running the same collectives on torch tensors that share memory with
the bench's numpy buffers (``torch.from_numpy``, no copies). ``GlooBaseline`` is attached as
the transport's ``native`` object for the bench's process group only, so rows named
``native`` are gloo's; records say so in ``native_name``. Without torch there is no baseline
column, and the bench says why.

Limits: gloo's reduce_scatter and all_gather here take equal blocks only (the bench's calls
always have them); bfloat16 and bool reductions are not offered to gloo.
"""
from __future__ import annotations

import os
from datetime import timedelta

import numpy as np

from ..ops import ReduceOp


def gloo_baseline(group, timeout: float):
    """(GlooBaseline, None) joined on every rank, or (None, why) when torch is missing. A
    collective call: every rank of ``group`` calls it."""
    try:
        import torch
        import torch.distributed as tdist
    except ImportError as exc:
        return None, f"torch is not importable ({exc}), so there is no gloo to compare with"
    if not tdist.is_available() or not tdist.is_gloo_available():
        return None, "this torch build has no gloo backend"
    # rank 0 opens torch's store on a free port and tells the others through our broadcast;
    # on the launcher's master address where there is one (ranks on other hosts reach it)
    store = None
    port = np.zeros(1, np.int64)
    host = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    if group.rank == 0:
        store = tdist.TCPStore(host, 0, group.size, is_master=True,
                               timeout=timedelta(seconds=timeout), wait_for_workers=False)
        port[0] = store.port
    group.prepare("broadcast", output=port, root=0, algorithm="ring")()
    if store is None:
        store = tdist.TCPStore(host, int(port[0]), group.size, is_master=False,
                               timeout=timedelta(seconds=timeout))
    tdist.init_process_group("gloo", store=store, rank=group.rank, world_size=group.size,
                             timeout=timedelta(seconds=timeout))
    return GlooBaseline(torch, tdist, store), None


class GlooBaseline:
    """torch gloo collectives on numpy buffers (zero-copy torch views), in the shape of a
    transport's ``native`` object (see ``transports.base``)."""
    name = "gloo"
    COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast",
                   "barrier")

    def __init__(self, torch, tdist, store):
        self.torch, self.dist, self.store = torch, tdist, store
        self.ops = {ReduceOp.SUM: tdist.ReduceOp.SUM, ReduceOp.PRODUCT: tdist.ReduceOp.PRODUCT,
                    ReduceOp.MIN: tdist.ReduceOp.MIN, ReduceOp.MAX: tdist.ReduceOp.MAX,
                    ReduceOp.BAND: tdist.ReduceOp.BAND, ReduceOp.BOR: tdist.ReduceOp.BOR,
                    ReduceOp.BXOR: tdist.ReduceOp.BXOR}
        # the *_single names replace the deprecated *_into_tensor / *_tensor ones
        self._all_gather = getattr(tdist, "all_gather_single", None) or \
            tdist.all_gather_into_tensor
        self._reduce_scatter = getattr(tdist, "reduce_scatter_single", None) or \
            tdist.reduce_scatter_tensor

    def supports(self, collective, dtype, op=ReduceOp.SUM) -> bool:
        dtype = np.dtype(dtype)
        if collective not in self.COLLECTIVES or dtype.kind not in "biuf" or dtype.name not in (
                "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32",
                "float64"):
            return False           # ml_dtypes' bfloat16 has no torch.from_numpy
        if collective in ("all_reduce", "reduce_scatter"):
            if op not in self.ops or dtype.kind == "b":
                return False
            if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dtype.kind == "f":
                return False
        return True

    def _t(self, array):
        return self.torch.from_numpy(array)

    def all_reduce(self, sendbuf, recvbuf, op):
        if sendbuf is not recvbuf:
            recvbuf[...] = sendbuf          # gloo reduces in place, as our schedules do
        self.dist.all_reduce(self._t(recvbuf), self.ops[op])

    def reduce_scatter(self, sendbuf, recvbuf, counts, op):
        _equal_blocks("reduce_scatter", counts)
        self._reduce_scatter(self._t(recvbuf), self._t(sendbuf), self.ops[op])

    def all_gather(self, sendbuf, recvbuf, counts):
        _equal_blocks("all_gather", counts)
        self._all_gather(self._t(recvbuf), self._t(sendbuf))

    def all_to_all(self, sendbuf, recvbuf, send_counts, recv_counts):
        self.dist.all_to_all_single(self._t(recvbuf), self._t(sendbuf),
                                    output_split_sizes=list(recv_counts),
                                    input_split_sizes=list(send_counts))

    def broadcast(self, buf, root):
        self.dist.broadcast(self._t(buf), src=root)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def _equal_blocks(collective, counts):
    if len(set(counts)) > 1:
        raise ValueError(f"{collective} (gloo baseline): uneven blocks {tuple(counts)} are not "
                         f"supported here")
