"""MPI's own collectives (``MPITransport.native``): the benchmark's baseline, on the same
flat numpy buffers as the transport's point-to-point.

Reductions need a real MPI datatype: float16/bfloat16 have none in the MPI standard, so
``supports`` says False for reducing them; data movement (gather, all_to_all, ...) moves any
dtype as bytes. They carry no signature (see ``transports/mpi.py``).
"""
from __future__ import annotations

import functools

import numpy as np

from ..ops import REDUCING, ReduceOp
from .mpi import _as_bytes, _mpi


def _reduce_types():
    """numpy dtype -> MPI datatype for reductions (only types MPI can reduce)."""
    MPI = _mpi()
    table = {
        np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
        np.dtype(np.int8): MPI.INT8_T, np.dtype(np.int16): MPI.INT16_T,
        np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
        np.dtype(np.uint8): MPI.UINT8_T, np.dtype(np.uint16): MPI.UINT16_T,
        np.dtype(np.uint32): MPI.UINT32_T, np.dtype(np.uint64): MPI.UINT64_T,
        np.dtype(np.bool_): MPI.C_BOOL,
        np.dtype(np.complex64): MPI.C_FLOAT_COMPLEX, np.dtype(np.complex128): MPI.C_DOUBLE_COMPLEX,
    }
    return {k: v for k, v in table.items() if v != MPI.DATATYPE_NULL}


def _op_table():
    """(dtype kind, ReduceOp) -> MPI.Op. bool follows the package's meaning of each op
    (SUM = or, PRODUCT = and, MIN = and, MAX = or), which on 0/1 values are MPI's logical ops."""
    MPI = _mpi()
    table = {}
    for kind in ("f", "i", "u", "c"):
        table[kind, ReduceOp.SUM] = MPI.SUM
        table[kind, ReduceOp.PRODUCT] = MPI.PROD
    for kind in ("f", "i", "u"):          # MPI defines no MIN/MAX on complex
        table[kind, ReduceOp.MIN] = MPI.MIN
        table[kind, ReduceOp.MAX] = MPI.MAX
    for kind in ("i", "u"):               # bitwise ops are for integers only
        table[kind, ReduceOp.BAND] = MPI.BAND
        table[kind, ReduceOp.BOR] = MPI.BOR
        table[kind, ReduceOp.BXOR] = MPI.BXOR
    for op, mpi_op in ((ReduceOp.SUM, MPI.LOR), (ReduceOp.PRODUCT, MPI.LAND),
                       (ReduceOp.MIN, MPI.LAND), (ReduceOp.MAX, MPI.LOR),
                       (ReduceOp.BAND, MPI.LAND), (ReduceOp.BOR, MPI.LOR),
                       (ReduceOp.BXOR, MPI.LXOR)):
        table["b", op] = mpi_op
    return table


@functools.lru_cache(maxsize=256)
def _displacements(counts: tuple, scale: int) -> tuple:
    """(counts, displacements) in units of ``scale``-byte items, for the v-collectives."""
    scaled = tuple(c * scale for c in counts)
    displs, offset = [], 0
    for c in scaled:
        displs.append(offset)
        offset += c
    return scaled, tuple(displs)


MOVING = ("all_gather", "all_to_all", "broadcast", "gather", "scatter", "barrier")


class MPINative:
    """MPI's own collectives on flat numpy arrays (see transports/base.py for the interface)."""

    def __init__(self, comm):
        self.comm = comm
        self._types = _reduce_types()
        self._ops = _op_table()

    def supports(self, collective, dtype, op=ReduceOp.SUM) -> bool:
        dtype = np.dtype(dtype)
        if collective in MOVING:
            return True
        if collective not in REDUCING:
            return False
        return dtype in self._types and (dtype.kind, ReduceOp.parse(op)) in self._ops

    def _typed(self, buf):
        return [buf, self._types[buf.dtype]]

    def _op(self, dtype, op):
        return self._ops[np.dtype(dtype).kind, ReduceOp.parse(op)]

    def all_reduce(self, sendbuf, recvbuf, op):
        MPI = _mpi()
        send = MPI.IN_PLACE if _same(sendbuf, recvbuf) else self._typed(sendbuf)
        self.comm.Allreduce(send, self._typed(recvbuf), self._op(recvbuf.dtype, op))

    def reduce_scatter(self, sendbuf, recvbuf, counts, op):
        self.comm.Reduce_scatter(self._typed(sendbuf), self._typed(recvbuf),
                                 list(counts), self._op(recvbuf.dtype, op))

    def reduce(self, sendbuf, recvbuf, root, op):
        recv = self._typed(recvbuf) if recvbuf is not None else None
        # MPI refuses aliased buffers: the root reducing in place says so with IN_PLACE.
        send = _mpi().IN_PLACE if _same(sendbuf, recvbuf) else self._typed(sendbuf)
        self.comm.Reduce(send, recv, self._op(sendbuf.dtype, op), root)

    def all_gather(self, sendbuf, recvbuf, counts):
        MPI = _mpi()
        sizes, displs = _displacements(tuple(counts), recvbuf.itemsize)
        self.comm.Allgatherv([_as_bytes(sendbuf), MPI.BYTE],
                             [_as_bytes(recvbuf), sizes, displs, MPI.BYTE])

    def all_to_all(self, sendbuf, recvbuf, send_counts, recv_counts):
        MPI = _mpi()
        item = (sendbuf if sendbuf is not None else recvbuf).itemsize
        s_sizes, s_displs = _displacements(tuple(send_counts), item)
        r_sizes, r_displs = _displacements(tuple(recv_counts), item)
        self.comm.Alltoallv([_as_bytes(sendbuf), s_sizes, s_displs, MPI.BYTE],
                            [_as_bytes(recvbuf), r_sizes, r_displs, MPI.BYTE])

    def broadcast(self, buf, root):
        self.comm.Bcast([_as_bytes(buf), _mpi().BYTE], root)

    def gather(self, sendbuf, recvbuf, counts, root):
        MPI = _mpi()
        recv = None
        if recvbuf is not None and self.comm.Get_rank() == root:
            sizes, displs = _displacements(tuple(counts), recvbuf.itemsize)
            recv = [_as_bytes(recvbuf), sizes, displs, MPI.BYTE]
        self.comm.Gatherv([_as_bytes(sendbuf), MPI.BYTE], recv, root)

    def scatter(self, sendbuf, recvbuf, counts, root):
        MPI = _mpi()
        send = None
        if sendbuf is not None and self.comm.Get_rank() == root:
            sizes, displs = _displacements(tuple(counts), sendbuf.itemsize)
            send = [_as_bytes(sendbuf), sizes, displs, MPI.BYTE]
        self.comm.Scatterv(send, [_as_bytes(recvbuf), MPI.BYTE], root)

    def barrier(self):
        self.comm.Barrier()


def _same(a, b) -> bool:
    return a is b or (a is not None and b is not None and a.size == b.size and a.size > 0
                      and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
