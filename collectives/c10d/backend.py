"""ProcessGroupCollectives: a torch process group whose collectives run on our groups, made
by torch through ``create_backend``."""
from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import sparse, tensors, transports, work as _work
from ..group import ProcessGroup
from ..state import seconds as _seconds, setup_seconds as _setup_seconds
from ..transports.subgroup import SubgroupTransport
from .calls import (_OPS, BACKEND, GPU_TRANSPORT, LANE_ID, TRANSPORT, _Checks, _in_order,
                    _on_device, _tensors_in)
from .cuda import CudaCalls
from .stores import _TorchStore
from .work import Work, _Completions, in_callback

_group_ids = itertools.count(1)


class ProcessGroupCollectives(_Checks, dist.ProcessGroup):
    """A torch process group whose collectives run on our algorithms (see the module
    docstring). Made by torch through :func:`create_backend`; ``group`` is ours."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, *, group_name: str = "",
                 global_ranks=None):
        super().__init__(rank, size)      # (store, rank, size) makes no Python subclass in torch 2.13
        self._group_name, self._group_desc = group_name, ""
        limit = _seconds(timeout, f"{BACKEND} process group on rank {rank}")
        self._store = _TorchStore(store, limit)
        transport = transports.create(TRANSPORT, rank=rank, world_size=size,
                                      store=self._store, timeout=_setup_seconds(limit))
        group_id = next(_group_ids)
        ranks = list(global_ranks) if global_ranks else None
        self._main = ProcessGroup(transport, backend=BACKEND, timeout=limit, group_id=group_id,
                                  ranks=ranks, name=group_name)
        # Collectives called from Future callbacks (PowerSGD's) run on this lane: the same
        # ranks and connections, tags of their own. Callbacks run in the same order on every
        # rank, but where they run (in the thread that registers one on a finished Future,
        # else on the completion thread) and so when, relative to this rank's other calls,
        # differs from rank to rank: on the main group's one sequence of calls they would
        # pair with other calls.
        self._lane = ProcessGroup(SubgroupTransport(transport, range(size), LANE_ID),
                                  backend=BACKEND, timeout=limit, group_id=group_id,
                                  ranks=ranks, name=f"{group_name} callbacks")
        self._completions = _Completions(f"collectives-c10d-rank{rank}-group{group_id}")
        # CUDA tensors run on a group over the NCCL transport, made at the first call that
        # brings them (every rank makes that call, in the same place of its sequence, so the
        # communicator's creation is collective as NCCL needs), on that tensor's GPU.
        self._gpu = None
        self._cuda = None                   # its calls' streams and repeat path (CudaCalls)
        self._gpu_args = dict(backend=BACKEND, timeout=limit, group_id=group_id, ranks=ranks,
                              name=f"{group_name} cuda")
        self._routed = threading.local()    # .group: the GPU group during a call on CUDA

    @property
    def group(self) -> ProcessGroup:
        """Our group that this thread's call runs on: the GPU group while a call on CUDA
        tensors is made; else the callback lane inside a callback of one of our Futures,
        else the main group."""
        routed = getattr(self._routed, "group", None)
        if routed is not None:
            return routed
        return self._lane if in_callback() else self._main

    def _gpu_group(self, device, operation) -> ProcessGroup:
        """The group of this rank's GPU ``device`` (made at its first call)."""
        if self._gpu is not None:
            mine = self._gpu.transport.device
            if device.index != mine:
                raise ValueError(f"{self._where(operation)}: the tensors are on {device}, but "
                                 f"this process group runs on cuda:{mine} (one GPU per rank, "
                                 f"the one of its first CUDA call); call "
                                 f"torch.cuda.set_device once, before any collective")
            return self._gpu
        usable, why = transports.available(GPU_TRANSPORT)
        if not usable:
            raise RuntimeError(f"{self._where(operation)}: the tensors are on {device}, and "
                               f"the {BACKEND} backend runs CUDA tensors on its "
                               f"{GPU_TRANSPORT} transport, which is not usable here: {why}")
        transport = transports.module(GPU_TRANSPORT).create(
            rank=self._main.rank, world_size=self._main.size, store=self._store,
            timeout=_setup_seconds(self._main.timeout), device=device.index)
        try:
            gpu = ProcessGroup(transport, **self._gpu_args)
            self._cuda = CudaCalls(gpu, _OPS)
        except BaseException:
            transport.close()       # every rank fails alike; a later call starts anew
            raise
        self._gpu = gpu
        return gpu

    def _device(self, operation, items):
        """The CUDA device of a call's tensors, or None for CPU tensors (and calls with none);
        tensors on more than one device are a ValueError, before anything moves."""
        devices = set()
        for t in _tensors_in(items):
            devices.add(t.device)
        cuda = [d for d in devices if d.type == "cuda"]
        if not cuda:
            return None
        if len(devices) > 1:
            names = ", ".join(sorted(str(d) for d in devices))
            raise ValueError(f"{self._where(operation)}: the tensors of one call must be on "
                             f"one device, got {names}")
        device = cuda[0]
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        return device

    def getBackendName(self) -> str:        # noqa: N802  (torch's names, called from C++)
        return BACKEND

    # torch's ProcessGroup keeps its name in its C++ backends, which a Python group has none
    # of: without these, resolving the group by name (functional collectives, DTensor, FSDP2)
    # fails with "ProcessGroup name not set".
    def setGroupName(self, name: str) -> None:     # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:                 # noqa: N802
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:     # noqa: N802
        self._group_desc = desc

    def getGroupDesc(self) -> str:                 # noqa: N802
        return self._group_desc

    def __repr__(self):
        return f"ProcessGroupCollectives(rank={self.group.rank}, size={self.group.size})"

    # -- running ------------------------------------------------------------------------------

    def _launch(self, operation, run, result, opts=None) -> Work:
        """The end of every collective: run now when torch waits at once (errors raise
        here) or when a Future callback calls it (its lane has no worker: callbacks run one
        at a time), else queue it on the group's worker and hand back a Work."""
        group = self.group
        if group is self._gpu and group is not None:
            # Enqueued now, from this thread, on the stream _on_device chose and entered: the
            # host never waits (cuda.CudaCalls).
            run()
            return self._cuda.finish(operation, result, *self._routed.cuda)
        if group is self._lane or (opts is not None and not getattr(opts, "asyncOp", True)):
            _work.call(group, run, False, result)
            return Work(operation, result)
        return Work(operation, result, _work.call(group, run, True, result), self._completions)

    # -- collectives --------------------------------------------------------------------------

    @_on_device("broadcast", CudaCalls.broadcast)
    def broadcast(self, tensors_, opts=_c10d.BroadcastOptions()):
        """Args: tensors_ (one tensor: the data on the root, the output elsewhere), opts
        (rootRank: a group rank). Returns: Work of ``tensors_``."""
        buf = self._flat(self._single(tensors_, "broadcast"), "broadcast")
        run = self.group.prepare("broadcast", output=buf, root=self._root(opts, "broadcast"),
                                 timeout=self._timeout(opts))
        return self._launch("broadcast", run, tensors_, opts)

    @_on_device("all_reduce", CudaCalls.all_reduce)
    def allreduce(self, tensors_, opts=_c10d.AllreduceOptions()):
        """Args: tensors_ (one tensor, reduced in place), opts (reduceOp). Returns: Work of
        ``tensors_``."""
        if isinstance(tensors_, torch.Tensor):
            tensors_ = [tensors_]
        if getattr(opts, "sparseIndices", None) is not None:
            raise TypeError(f"{self._where('all_reduce')}: all_reduce with sparseIndices is "
                            f"not supported (sparse COO tensors are)")
        tensor = self._single(tensors_, "all_reduce")
        if tensors.is_sparse_coo(tensor):
            run = sparse.all_reduce(self.group, tensor, self._op(opts, "all_reduce"),
                                    self._timeout(opts))
            return self._launch("all_reduce", run, tensors_, opts)
        buf = self._flat(tensor, "all_reduce")
        run = self.group.prepare("all_reduce", output=buf, op=self._op(opts, "all_reduce"),
                                 timeout=self._timeout(opts))
        return self._launch("all_reduce", run, tensors_, opts)

    @_on_device("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors_, opts=_c10d.AllreduceCoalescedOptions()):
        """Args: tensors_ (any number, reduced in place; one all_reduce per dtype over their
        concatenation), opts (reduceOp). Returns: Work of ``tensors_``."""
        views = self._flats(tensors_, "all_reduce_coalesced", "tensors")
        op, limit = self._op(opts, "all_reduce_coalesced"), self._timeout(opts)
        runs = []
        for dtype in dict.fromkeys(v.dtype for v in views):
            same = [v for v in views if v.dtype == dtype]
            whole = tensors.concatenate(same, same[0])
            run = self.group.prepare("all_reduce", output=whole, op=op, timeout=limit)
            runs.append(_work.then(run, tensors.split_into, whole, same))
        return self._launch("all_reduce_coalesced", _in_order(runs), tensors_, opts)

    @_on_device("reduce")
    def reduce(self, tensors_, opts=_c10d.ReduceOptions()):
        """Args: tensors_ (one tensor; the result lands in it on the root only), opts
        (rootRank, reduceOp). Returns: Work of ``tensors_``."""
        buf = self._flat(self._single(tensors_, "reduce"), "reduce")
        root = self._root(opts, "reduce")
        run = self.group.prepare("reduce", input=buf,
                                 output=buf if self.group.rank == root else None, root=root,
                                 op=self._op(opts, "reduce"), timeout=self._timeout(opts))
        return self._launch("reduce", run, tensors_, opts)

    def _all_gather_run(self, outs, inp, opts, operation):
        """One all_gather into the list ``outs`` (sizes may differ: all-gather-v)."""
        views = self._flats(outs, operation, "output_tensors", self.group.size)
        buf = self._flat(inp, operation, "input_tensor")
        self._same_dtype(operation, buf, views, "output_tensors")
        sizes = [v.size for v in views]
        whole = tensors.empty(buf, sum(sizes))
        counts = None if all(s == buf.size for s in sizes) else sizes
        run = self.group.prepare("all_gather", input=buf, output=whole, counts=counts,
                                 timeout=self._timeout(opts))
        return _work.then(run, tensors.split_into, whole, views)

    @_on_device("all_gather")
    def allgather(self, output_tensors, input_tensors, opts=_c10d.AllgatherOptions()):
        """Args: output_tensors ([[one tensor per rank]]), input_tensors ([this rank's]).
        Returns: Work of ``output_tensors``."""
        outs = self._single(output_tensors, "all_gather", "output_tensors")
        inp = self._single(input_tensors, "all_gather", "input_tensors")
        run = self._all_gather_run(outs, inp, opts, "all_gather")
        return self._launch("all_gather", run, output_tensors, opts)

    @_on_device("all_gather_coalesced")
    def allgather_coalesced(self, output_lists, input_tensors, opts=_c10d.AllgatherOptions()):
        """Args: output_lists (one list per rank, each one tensor per input, as torch and
        gloo take them), input_tensors. Returns: Work of ``output_lists``."""
        size = self.size()
        if len(output_lists) != size or any(len(outs) != len(input_tensors)
                                            for outs in output_lists):
            raise ValueError(f"{self._where('all_gather_coalesced')}: output_lists must hold "
                             f"{size} lists (one per rank) of {len(input_tensors)} tensors "
                             f"(one per input), got {[len(o) for o in output_lists]}")
        runs = [self._all_gather_run([outs[i] for outs in output_lists], inp, opts,
                                     "all_gather_coalesced")
                for i, inp in enumerate(input_tensors)]
        return self._launch("all_gather_coalesced", _in_order(runs), output_lists, opts)

    def _gather_into_run(self, output, input, opts, operation):
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        return self.group.prepare("all_gather", input=buf, output=out,
                                  timeout=self._timeout(opts))

    @_on_device("all_gather_single", CudaCalls.all_gather_single)
    def all_gather_single(self, output, input, opts=_c10d.AllgatherOptions()):
        """Args: output (size x the input's elements, rank r's block at r), input.
        Returns: Work of ``[output]``."""
        run = self._gather_into_run(output, input, opts, "all_gather_single")
        return self._launch("all_gather_single", run, [output], opts)

    _allgather_base = all_gather_single

    @_on_device("all_gather_single_coalesced")
    def all_gather_single_coalesced(self, outputs, inputs, opts=_c10d.AllgatherOptions()):
        """Args: outputs, inputs (pairs, as all_gather_single's). Returns: Work of
        ``outputs``."""
        self._pairs(outputs, inputs, "all_gather_single_coalesced")
        runs = [self._gather_into_run(o, i, opts, "all_gather_single_coalesced")
                for o, i in zip(outputs, inputs)]
        return self._launch("all_gather_single_coalesced", _in_order(runs), list(outputs), opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=_c10d.GatherOptions()):
        """Args: output_tensors ([[one tensor per rank]] on the root, [] elsewhere),
        input_tensors ([this rank's]), opts (rootRank). Returns: Work of
        ``output_tensors``."""
        root = self._root(opts, "gather")
        buf = self._flat(self._single(input_tensors, "gather", "input_tensors"), "gather")
        views = self._rooted(output_tensors, root, buf, "gather", "output_tensors")
        whole = tensors.empty(buf, buf.size * self.group.size) if views is not None else None
        run = self.group.prepare("gather", input=buf, output=whole, root=root,
                                 timeout=self._timeout(opts))
        if whole is not None:
            run = _work.then(run, tensors.split_into, whole, views)
        return self._launch("gather", run, output_tensors, opts)

    @_on_device("scatter")
    def scatter(self, output_tensors, input_tensors, opts=_c10d.ScatterOptions()):
        """Args: output_tensors ([this rank's block]), input_tensors ([[one tensor per rank]]
        on the root, [] elsewhere), opts (rootRank). Returns: Work of ``output_tensors``."""
        root = self._root(opts, "scatter")
        out = self._flat(self._single(output_tensors, "scatter", "output_tensors"), "scatter")
        views = self._rooted(input_tensors, root, out, "scatter", "input_tensors")
        whole = tensors.concatenate(views, out) if views is not None else None
        run = self.group.prepare("scatter", input=whole, output=out, root=root,
                                 timeout=self._timeout(opts))
        return self._launch("scatter", run, output_tensors, opts)

    @_on_device("reduce_scatter")
    def reduce_scatter(self, output_tensors, input_tensors, opts=_c10d.ReduceScatterOptions()):
        """Args: output_tensors ([this rank's block]), input_tensors ([[one tensor per rank]];
        sizes may differ), opts (reduceOp). Returns: Work of ``output_tensors``."""
        out = self._flat(self._single(output_tensors, "reduce_scatter", "output_tensors"),
                         "reduce_scatter")
        views = self._flats(self._single(input_tensors, "reduce_scatter", "input_tensors"),
                            "reduce_scatter", "input_tensors", self.group.size)
        self._same_dtype("reduce_scatter", out, views, "input_tensors")
        sizes = [v.size for v in views]
        whole = tensors.concatenate(views, out)
        run = self.group.prepare("reduce_scatter", input=whole, output=out,
                                 counts=None if all(s == out.size for s in sizes) else sizes,
                                 op=self._op(opts, "reduce_scatter"),
                                 timeout=self._timeout(opts))
        return self._launch("reduce_scatter", run, output_tensors, opts)

    def _scatter_from_run(self, output, input, opts, operation):
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        return self.group.prepare("reduce_scatter", input=buf, output=out,
                                  op=self._op(opts, operation), timeout=self._timeout(opts))

    @_on_device("reduce_scatter_single", CudaCalls.reduce_scatter_single)
    def reduce_scatter_single(self, output, input, opts=_c10d.ReduceScatterOptions()):
        """Args: output (this rank's block), input (size blocks), opts (reduceOp).
        Returns: Work of ``[output]``."""
        run = self._scatter_from_run(output, input, opts, "reduce_scatter_single")
        return self._launch("reduce_scatter_single", run, [output], opts)

    _reduce_scatter_base = reduce_scatter_single

    @_on_device("reduce_scatter_single_coalesced")
    def reduce_scatter_single_coalesced(self, outputs, inputs,
                                        opts=_c10d.ReduceScatterOptions()):
        """Args: outputs, inputs (pairs, as reduce_scatter_single's). Returns: Work of
        ``outputs``."""
        self._pairs(outputs, inputs, "reduce_scatter_single_coalesced")
        runs = [self._scatter_from_run(o, i, opts, "reduce_scatter_single_coalesced")
                for o, i in zip(outputs, inputs)]
        return self._launch("reduce_scatter_single_coalesced", _in_order(runs), list(outputs),
                            opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    @_on_device("all_to_all")
    def alltoall(self, output_tensors, input_tensors, opts=_c10d.AllToAllOptions()):
        """Args: output_tensors (block j comes from rank j), input_tensors (block j goes to
        rank j); sizes may differ (all-to-all-v). Returns: Work of ``output_tensors``."""
        p = self.group.size
        outs = self._flats(output_tensors, "all_to_all", "output_tensors", p)
        ins = self._flats(input_tensors, "all_to_all", "input_tensors", p)
        self._same_dtype("all_to_all", outs[0], ins, "input_tensors")
        self._same_dtype("all_to_all", outs[0], outs, "output_tensors")
        sends, recvs = [v.size for v in ins], [v.size for v in outs]
        counts = None
        if len(set(sends + recvs)) > 1:
            counts = self._all_to_all_counts(sends, recvs, "all_to_all")
        whole_in = tensors.concatenate(ins, outs[0])
        whole_out = tensors.empty(outs[0], sum(recvs))
        run = self.group.prepare("all_to_all", input=whole_in, output=whole_out, counts=counts,
                                 timeout=self._timeout(opts))
        return self._launch("all_to_all", _work.then(run, tensors.split_into, whole_out, outs),
                            output_tensors, opts)

    @_on_device("all_to_all_single", CudaCalls.all_to_all_single)
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes,
                          opts=_c10d.AllToAllOptions()):
        """Args: output, input, output_split_sizes / input_split_sizes (rows of dim 0 per
        rank; empty: an even split). Returns: Work of ``[output]``."""
        operation = "all_to_all_single"
        out = self._flat(output, operation, "output")
        buf = self._flat(input, operation, "input")
        counts = None
        if len(output_split_sizes) or len(input_split_sizes):
            sends = self._splits(input_split_sizes, buf.size, tensors.rows(input),
                                 "input_split_sizes")
            recvs = self._splits(output_split_sizes, out.size, tensors.rows(output),
                                 "output_split_sizes")
            counts = self._all_to_all_counts(sends, recvs, operation)
        run = self.group.prepare("all_to_all", input=buf, output=out, counts=counts,
                                 timeout=self._timeout(opts))
        return self._launch(operation, run, [output], opts)

    alltoall_base = all_to_all_single

    def _all_to_all_counts(self, sends, recvs, operation):
        """The full matrix counts[i][j] (i sends to j) our schedules need on every rank
        (ProcessGroup.all_to_all_matrix: one small collective, run now)."""
        group = self.group
        return group.all_to_all_matrix(sends, recvs, operation,
                                       lambda run: _work.call(group, run, False, []))

    def barrier(self, opts=_c10d.BarrierOptions()):
        """Args: opts (device_ids are ignored). Returns: Work of ``[]``. A barrier of the
        ranks' hosts (CPU group); where this group runs CUDA tensors, each rank first waits
        for the GPU work queued on its current stream, as NCCL's barrier does."""
        gpu, calls = self._gpu, self._cuda
        if gpu is not None and self.group is not self._lane:
            # the communication stream's work, then the caller's
            with calls.scope(calls.enter(None)):
                gpu.transport.synchronize(self._timeout(opts) or gpu.timeout,
                                          operation="barrier")
        run = self.group.prepare("barrier", timeout=self._timeout(opts))
        return self._launch("barrier", run, [], opts)

    # -- point-to-point -----------------------------------------------------------------------
    # Straight onto the transport in the group's user-tag space, without draining queued
    # collectives first: torch's p2p is independent of pending async collectives, and a rank
    # whose send waited for its own queued all_reduce could deadlock with a peer that receives
    # before it reduces.

    def _p2p(self, kind, tensors_, peer, tag):
        operation = kind
        # matched by tag, never by order: no lane; CUDA tensors on the GPU group
        group = self._gpu if self.group is self._gpu else self._main
        buf = self._flat(self._single(tensors_, operation), operation)
        if peer is None and group is self._gpu:
            raise ValueError(f"{self._where('recv')}: a receive from any source is not "
                             f"possible on CUDA tensors ({GPU_TRANSPORT} matches messages by "
                             f"sender); name the sender")
        if peer is not None:
            peer = int(peer)
            if not 0 <= peer < group.size or peer == group.rank:
                raise ValueError(f"{self._where(operation)}: peer {peer} must be another rank "
                                 f"of the group (0..{group.size - 1})")
        wire_tag = group.p2p_tag(tag, operation)
        transport = group.transport
        if kind == "send":
            request = transport.isend(buf, peer, wire_tag)
        else:
            request = transport.irecv(buf, -1 if peer is None else peer, wire_tag)
        # GPU transfers are issued and completed (the host waits) on the caller's stream,
        # whichever thread waits for them
        scope = transport.call_scope(list(tensors_))
        work = Work(operation, list(tensors_),
                    _work.Work(list(tensors_), requests=[request], transport=transport),
                    scope=scope)
        if kind == "recv":
            def record():
                source = getattr(request, "source", None) if peer is None else peer
                work.source_rank_value = None if source is None or source < 0 else source
            work._ours._on_done = record
        return work

    @_on_device("send", stream=False)
    def send(self, tensors_, dstRank, tag=0):       # noqa: N803  (torch's names)
        """Args: tensors_ (one tensor), dstRank (a group rank), tag. Returns: Work."""
        return self._p2p("send", tensors_, dstRank, tag)

    @_on_device("recv", stream=False)
    def recv(self, tensors_, srcRank, tag=0):       # noqa: N803
        """Args: tensors_ (one tensor, written), srcRank (a group rank), tag. Returns:
        Work."""
        return self._p2p("recv", tensors_, srcRank, tag)

    @_on_device("recv", stream=False)
    def recv_anysource(self, tensors_, tag=0):
        """Args: tensors_ (one tensor, written), tag. Returns: Work whose
        ``_source_rank()`` is the sender's group rank once complete."""
        return self._p2p("recv", tensors_, None, tag)

    # -- life ---------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Finish queued work and its Futures, then close the connections
        (destroy_process_group)."""
        _work.stop(self._main)
        self._completions.stop()
        self._main.transport.close()
        if self._gpu is not None:
            self._gpu.transport.close()

    def abort(self) -> None:
        """Fail every pending and later operation of the group, on every rank."""
        for group in (self._main, self._gpu):
            abort = getattr(group.transport, "abort", None) if group is not None else None
            if abort is not None:
                abort(f"{BACKEND} process group aborted on rank {self._main.rank}")


def create_backend(options, backend_options=None) -> ProcessGroupCollectives:
    """torch's creator of the backend (the extended API): one of our groups per torch
    process group, meeting through ``options.store``."""
    return ProcessGroupCollectives(options.store, options.group_rank, options.group_size,
                                   options.timeout, group_name=str(options.group_id),
                                   global_ranks=list(options.global_ranks_in_group) or None)
