"""The NCCL executor interprets lowered programs (``lowered.chained(lowered.stepwise(plan))``
in order, ``lowered.two_streams`` pipelined); before, it walked ``plan.steps`` itself. This
checks that it still enqueues exactly what the walker did: the same NCCL groups (peers,
pointers, bytes, stream), copies, kernels and fused chain kernels, in the same order, with
the same cross-stream waits (each named by the operation whose completion it waits for, so
events recorded that nobody waits for do not count), for every collective x algorithm at a
few world sizes, with and without fused reductions, in order and pipelined at several
segment sizes (including one below the element size), on plain and read-input-first plans
and, in order, windowed ones. ``LegacyRun`` below is the walker as it was, kept as the reference.
Every run is also drained on the fake (streams as queues in a random order CUDA allows) and
checked against the numpy reference, which exercises fused chains on the fake too.
"""
import sys

import numpy as np
import pytest

from collectives.algorithms import capabilities, hazards
from collectives.algorithms.schedule import (Copy, Matrix, Reduce, Send, buffer_sizes,
                                             build_plan, plan_args)
from collectives.algorithms.simulate import reference
from collectives.algorithms.transforms import read_input_first, windowed
from collectives.kernels.reduce import reducer
from collectives.ops import ReduceOp

from nccl_fake import Comm, Stream, World

CASES = [(c, a) for c, algs in sorted(capabilities().items()) if c != "barrier" for a in algs]
REDUCING = ("all_reduce", "reduce_scatter", "reduce")


# -- the walker as it was (the reference) -------------------------------------------------------


def legacy_execute(plan, transport, buffers, reduce=None, *, dtype, op=None, segment):
    import cupy
    from collectives.executors import nccl as executor

    arrays = {k: v for k, v in buffers.items() if v is not None}
    dtype = np.dtype(dtype)
    if plan.scratch and "scratch" not in arrays:
        arrays["scratch"] = transport.scratch(plan.scratch, dtype)
    kernel = None if reduce is None else reduce
    if reduce is not None and op is not None:
        from collectives.kernels.cuda import reduce_kernel
        kernel = reduce_kernel(op, dtype)
    run = LegacyRun(transport, arrays, dtype.itemsize, kernel, "legacy", cupy)
    if op is not None and reduce is not None:
        run.fuse = (op, dtype)
    limit = executor.segment_bytes(plan) if segment is None else segment
    biggest = max((max([s.region.count for s in st.sends] + [r.region.count for r in st.recvs],
                       default=0) for st in plan.steps), default=0) * dtype.itemsize
    if limit <= 0 or biggest <= limit:
        run.in_order(plan)
    else:
        run.pipelined(plan.steps, limit // dtype.itemsize)


def legacy_chains(local, longest=16):
    runs = []
    for op in local:
        run = runs[-1] if runs else None
        if run is not None and len(run) < longest and legacy_extends(run, op):
            run.append(op)
        else:
            runs.append([op])
    return runs


def legacy_extends(run, op):
    first, prev = run[0], run[-1]
    if not (isinstance(first, Reduce) and isinstance(op, Reduce) and op.a == prev.dst
            and op.dst.count == op.b.count == first.dst.count):
        return False
    dsts = [r.dst for r in run]
    if any(op.b.overlaps(d) for d in dsts):
        return False
    touched = [first.a] + [r.b for r in run] + dsts + [op.b]
    return all(d == t or not d.overlaps(t) for d in dsts + [op.dst] for t in touched + [op.dst])


class LegacyRun:
    def __init__(self, transport, arrays, itemsize, kernel, name, cupy):
        self.transport, self.comm, self.arrays = transport, transport.comm, arrays
        self.itemsize, self.kernel, self.name, self.cupy = itemsize, kernel, name, cupy
        self.nccl = transport.nccl
        self.base = {k: (a.data.ptr, a.size) for k, a in arrays.items()}
        self.fuse = None

    def ptr(self, region):
        return self.base[region.buffer][0] + region.offset * self.itemsize

    def view(self, region):
        return self.arrays[region.buffer][region.offset:region.end]

    def transfer(self, sends, recvs, stream_ptr, index, total):
        self.nccl.groupStart()
        for r in recvs:
            self.comm.recv(self.ptr(r.region), r.region.count * self.itemsize, 1, r.peer,
                           stream_ptr)
        for s in sends:
            self.comm.send(self.ptr(s.region), s.region.count * self.itemsize, 1, s.peer,
                           stream_ptr)
        self.nccl.groupEnd()

    def local(self, op, stream):
        if isinstance(op, Copy):
            self.cupy.cuda.runtime.memcpyAsync(self.ptr(op.dst), self.ptr(op.src),
                                               op.dst.count * self.itemsize, 3, stream.ptr)
        else:
            with stream:
                self.kernel(self.view(op.dst), self.view(op.a), self.view(op.b))

    def chain(self, ops, stream):
        from collectives.kernels.cuda import chain_kernel
        last = {}
        for i, op in enumerate(ops):
            last[op.dst] = i
        dsts = list(last)
        apply = chain_kernel(*self.fuse, len(ops), tuple(last[d] for d in dsts))
        with stream:
            apply([self.view(d) for d in dsts], self.view(ops[0].a),
                  [self.view(op.b) for op in ops])

    def in_order(self, plan):
        stream = self.cupy.cuda.get_current_stream()
        steps = plan.steps
        for index, step in enumerate(steps):
            if step.sends or step.recvs:
                self.transfer(step.sends, step.recvs, stream.ptr, index, len(steps))
            runs = legacy_chains(step.local) if self.fuse else [[op] for op in step.local]
            for ops in runs:
                if len(ops) == 1:
                    self.local(ops[0], stream)
                else:
                    self.chain(ops, stream)

    def pipelined(self, steps, segment_elems):
        compute = self.cupy.cuda.get_current_stream()
        comm_stream = self.transport.comm_stream()
        streams = {"comm": comm_stream, "compute": compute}
        history = {"comm": [], "compute": []}
        waited = {"comm": -1, "compute": -1}
        start = compute.record()
        comm_stream.wait_event(start)

        def enqueue(where, reads, writes, launch):
            other = "compute" if where == "comm" else "comm"
            past = history[other]
            for i in range(len(past) - 1, waited[where], -1):
                _, r, w = past[i]
                if hazards.conflict((r, w), (reads, writes)):
                    streams[where].wait_event(past[i][0])
                    waited[where] = i
                    break
            launch()
            history[where].append((streams[where].record(), reads, writes))

        total = len(steps)

        def pieces(count):
            return hazards.pieces_of_at_most(count, segment_elems)
        for index, step in enumerate(steps):
            moves = [(t, pieces(t.region.count)) for t in step.sends + step.recvs]
            split_local = hazards.splittable(step)
            cuts = [pieces(op[0].count) for op in step.local] if split_local else []
            rounds = max([n for _, n in moves] + cuts + [1])
            for k in range(rounds):
                sends = [type(t)(t.peer, hazards.cut(t.region, k, n)) for t, n in moves
                         if k < n and isinstance(t, Send)]
                recvs = [type(t)(t.peer, hazards.cut(t.region, k, n)) for t, n in moves
                         if k < n and not isinstance(t, Send)]
                sends = [t for t in sends if t.region.count]
                recvs = [t for t in recvs if t.region.count]
                if sends or recvs:
                    enqueue("comm", [t.region for t in sends], [t.region for t in recvs],
                            lambda s=sends, r=recvs: self.transfer(s, r, comm_stream.ptr,
                                                                   index, total))
                for op, n in zip(step.local, cuts):
                    if k >= n:
                        continue
                    piece = type(op)(*(hazards.cut(region, k, n) for region in op))
                    if piece[0].count:
                        enqueue("compute", *hazards.access(piece),
                                lambda p=piece: self.local(p, compute))
            if not split_local:
                for op in step.local:
                    enqueue("compute", *hazards.access(op), lambda p=op: self.local(p, compute))
        if history["comm"]:
            compute.wait_event(history["comm"][-1][0])


# -- a fake that records what is enqueued -------------------------------------------------------


class _RecordingStream(Stream):
    def record(self, event=None):
        event = super().record(event)
        event.after = self.world.last.get((self.rank, self.ptr))  # the operation it ends at
        return event

    def wait_event(self, event):
        self.world.log.append(("wait", self.rank, self.ptr, event.after))
        super().wait_event(event)


class Recorder(World):
    """``log``: every NCCL group, copy, kernel and chain kernel as it is enqueued, and every
    cross-stream wait as the log index of the operation whose completion it waits for."""

    def __init__(self, size):
        self.log, self.last = [], {}
        super().__init__(size)

    def _stream(self, rank, ptr=None):
        stream = _RecordingStream(self, rank, ptr if ptr is not None else 1000 + len(self.streams))
        self.streams.append(stream)
        return stream

    def note(self, *entry):
        self.log.append(entry)
        self.last[entry[1], entry[2]] = len(self.log) - 1

    def memcpy_async(self, dst, src, nbytes, kind, stream_ptr):
        self.note("memcpy", self.rank, stream_ptr, dst, src, nbytes)
        super().memcpy_async(dst, src, nbytes, kind, stream_ptr)

    def group_end(self):
        if self.depth == 1 and self.group is not None:
            self.note("nccl", self.rank, self.group[1], tuple(self.group[2]))
        super().group_end()


def _run(world, run_one, collective, algorithm, size, counts, plan_of, segment, fuse, seed,
         monkeypatch):
    """Every rank's plan through ``run_one`` on ``world``, drained, checked; the log."""
    for name, module in world.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    from collectives.kernels import cuda as kernels
    from collectives.transports.nccl import NcclTransport
    dtype = np.dtype(np.int64)
    host_reduce = reducer(ReduceOp.SUM, dtype)

    def kernel(dst, a, b):
        world.note("kernel", world.rank, world.current_stream().ptr, dst.data.ptr, a.data.ptr,
                   b.data.ptr, dst.size)
        world.launch(lambda: host_reduce(dst.np, a.np, b.np))

    def chain_kernel(op, dtype_, operands, writes):
        def apply(outputs, a, bs):
            world.note("chain", world.rank, world.current_stream().ptr, operands, writes,
                       tuple(o.data.ptr for o in outputs), a.data.ptr,
                       tuple(b.data.ptr for b in bs), a.size)

            def fused():                 # every operand loaded before anything is stored
                acc, loaded, stores = a.np.copy(), [b.np.copy() for b in bs], {}
                for i, b in enumerate(loaded):
                    host_reduce(acc, acc, b)
                    stores[i] = acc.copy()
                for out, after in zip(outputs, writes):
                    out.np[...] = stores[after]
            assert len(bs) == operands
            world.launch(fused)
        return apply

    monkeypatch.setattr(kernels, "reduce_kernel", lambda op, dtype_: kernel)
    monkeypatch.setattr(kernels, "chain_kernel", chain_kernel)
    rng = np.random.default_rng(seed)
    root = seed % size
    arrays, outputs = [], []
    for rank in range(size):
        n_in, _ = buffer_sizes(collective, rank, size, counts, root)
        if collective in ("all_reduce", "broadcast", "reduce"):
            n_in = counts
        arrays.append(rng.integers(-1000, 1000, n_in).astype(dtype))
    for rank in range(size):
        with world.on(rank):
            transport = NcclTransport(Comm(world, rank), rank, size, rank)
            plan = plan_of(build_plan(collective, algorithm, rank, size,
                                      *plan_args(collective, size, counts, root)))
            _, n_out = buffer_sizes(collective, rank, size, counts, root)
            if collective == "broadcast" or (collective == "all_reduce" and
                                             not _reads_input(plan)):
                inp, out = None, world.asarray(arrays[rank])
            else:
                inp = world.asarray(arrays[rank] if not (collective == "scatter" and rank != root)
                                    else np.empty(0, dtype))
                out = world.asarray(np.full(n_out, -7, dtype))
            outputs.append(out)
            run_one(plan, transport, {"input": inp, "output": out}, kernel, dtype=dtype,
                    op=ReduceOp.SUM if fuse else None, segment=segment)
    world.drain(seed)
    want = reference(collective, arrays, root=root, counts=counts)
    for rank in range(size):
        if want[rank] is not None:
            assert np.array_equal(outputs[rank].np, want[rank]), (collective, algorithm, rank)
    return world.log


def _reads_input(plan):
    return any(r.buffer == "input" for step in plan.steps for op in step.local for r in op) or \
        any(s.region.buffer == "input" for step in plan.steps for s in step.sends)


def _counts(collective, size, count):
    if collective in ("all_reduce", "broadcast", "reduce"):
        return count
    if collective == "all_to_all":
        return Matrix(tuple(count // 2 + (i * 7 + j * 3) % (count // 2 + 1) for j in range(size))
                      for i in range(size))
    return tuple(count + (i % 3) for i in range(size))


PLANS = {"plain": lambda plan: plan, "windowed": lambda plan: windowed(plan, 3)}


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_enqueues_what_the_step_walker_did(collective, algorithm, monkeypatch):
    from collectives.executors import nccl as executor
    monkeypatch.delenv(executor.ENV_SEGMENT, raising=False)
    monkeypatch.delenv(executor.ENV_GRAPH, raising=False)
    monkeypatch.setattr(executor, "DEFAULT_SEGMENT_BYTES", 64)
    plans = dict(PLANS)
    if collective == "all_reduce":
        plans["read_input_first"] = lambda plan: read_input_first(plan, plan_count) or plan
    kinds = set()
    for size in (2, 3, 5):
        for count in (1, 37):
            plan_count = count
            counts = _counts(collective, size, count)
            for name, plan_of in plans.items():
                for segment in ((0, None, 48, 200, 4) if count > 1 else (0, 4)):
                    if name == "windowed" and segment != 0:
                        continue         # windows may differ per rank: cut in rounds, a
                        # pair's messages would interleave differently at its two ends
                    for fuse in ((False, True) if collective in REDUCING else (False,)):
                        args = (collective, algorithm, size, counts, plan_of, segment, fuse,
                                size + count)
                        want = _run(Recorder(size), legacy_execute, *args, monkeypatch)
                        got = _run(Recorder(size), executor.execute, *args, monkeypatch)
                        assert got == want, (name, size, count, segment, fuse,
                                             _first_difference(got, want))
                        kinds.update(entry[0] for entry in got)
    assert {"nccl", "wait"} <= kinds            # transfers, and the pipelined mode's waits
    if (collective, algorithm) == ("all_reduce", "direct"):
        assert "chain" in kinds                 # fused chains are compared too


def _first_difference(got, want):
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return i, g, w
    return min(len(got), len(want)), len(got), len(want)
