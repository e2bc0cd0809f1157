"""How a call reaches our groups: the backend's names, the routing of a call by its tensors'
device (CPU tensors to the socket group, CUDA tensors to the GPU group), and the checks
every method makes before anything moves (``_Checks``, mixed into the process group)."""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from .. import tensors
from ..ops import ReduceOp
from .work import torch_seconds

BACKEND = "collectives"
TRANSPORT = "socket"
GPU_TRANSPORT = "nccl"              # CUDA tensors' transport (made at a group's first)
# the callback lane's tags: a group id of the socket mesh's own (subgroup.GROUP_SHIFT above)
LANE_ID = 1
_OPS: dict = {}                     # torch's reduce op kinds parsed once (every call has one)


def _in_order(runs):
    def run_all():
        for run in runs:
            run()
    return run_all


def _tensors_in(items):
    """The torch tensors of a call's arguments (lists of them, lists of lists)."""
    for item in items:
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            yield from _tensors_in(item)


def _on_device(operation, fast=None, *, stream=True):
    """Route a collective by its tensors' device: CPU tensors run on the socket group (the
    callback lane inside a callback), CUDA tensors on the GPU group. A CUDA call runs on the
    stream ``cuda.CudaCalls.enter`` gives it (with ``stream=False``, point-to-point, on the
    caller's stream), this rank's GPU current, so that every copy the call makes and the
    collective itself are ordered after the work that produced the tensors; that stream and
    the call's tensors are ``self._routed.cuda`` for ``_launch``. ``fast``: the ``CudaCalls``
    method of the same arguments that takes plain tensors straight to the GPU group (None
    where it is not such a call)."""
    def wrap(method):
        arity = None if fast is None else fast.__code__.co_argcount - 1

        @functools.wraps(method)
        def routed(self, *args, **kwargs):
            calls = self._cuda
            if calls is not None and arity == len(args) and not kwargs:
                work = fast(calls, *args)
                if work is not None:
                    return work
            device = self._device(operation, (args, list(kwargs.values())))
            if device is None:
                return method(self, *args, **kwargs)
            group = self._gpu_group(device, operation)
            outer, self._routed.group = getattr(self._routed, "group", None), group
            try:
                if not stream:
                    with group.transport.call_scope(list(_tensors_in(args)))():
                        return method(self, *args, **kwargs)
                calls = self._cuda
                on = calls.enter(_options(args, kwargs))
                self._routed.cuda = (on, list(_tensors_in(args)))
                with calls.scope(on):
                    return method(self, *args, **kwargs)
            finally:
                self._routed.group = outer
        return routed
    return wrap


def _options(args, kwargs):
    """A call's torch options object (its last argument, or ``opts=``), None if it has none."""
    opts = kwargs.get("opts", args[-1] if args else None)
    return opts if hasattr(opts, "timeout") else None


class _Checks:
    """The validation of torch's arguments, raised as ValueError/TypeError naming the
    operation and the rank before any byte moves; ``self.group`` is the group the call runs
    on (ProcessGroupCollectives.group)."""

    def _where(self, operation) -> str:
        return f"{operation} on rank {self.group.rank}"

    def _flat(self, tensor, operation, name="tensor"):
        """A flat view of a tensor (zero copy): numpy for CPU, CuPy for CUDA tensors, which
        ``_on_device`` sent to the GPU group; anything else raises first."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self._where(operation)}: {name} must be a torch.Tensor, got "
                            f"{type(tensor).__name__}")
        if tensor.device.type not in ("cpu", "cuda"):
            raise TypeError(f"{self._where(operation)}: {name} is on {tensor.device}; the "
                            f"{BACKEND} torch backend takes CPU and CUDA tensors")
        if tensor.layout != torch.strided:
            raise TypeError(f"{self._where(operation)}: {name} has layout {tensor.layout}; "
                            f"only dense tensors are supported")
        return tensors.flat(tensor, operation, self.group.rank, name)

    def _flats(self, items, operation, name, length=None):
        tensors.check_list(items, operation, self.group.rank, name, length)
        return [self._flat(t, operation, f"{name}[{i}]") for i, t in enumerate(items)]

    def _single(self, items, operation, name="tensors"):
        """torch passes a list of one tensor per device; this backend has one device."""
        if not isinstance(items, (list, tuple)) or len(items) != 1:
            got = len(items) if isinstance(items, (list, tuple)) else type(items).__name__
            raise ValueError(f"{self._where(operation)}: {name} must be a list of exactly one "
                             f"tensor (the {BACKEND} backend has one device per rank), got {got}")
        return items[0]

    def _same_dtype(self, operation, like, views, name):
        for i, view in enumerate(views):
            if view.dtype != like.dtype:
                raise TypeError(f"{self._where(operation)}: {name}[{i}] has dtype {view.dtype}, "
                                f"the tensor {like.dtype}; they must match")

    def _root(self, opts, operation):
        root = int(opts.rootRank)
        if not 0 <= root < self.group.size:
            raise ValueError(f"{self._where(operation)}: root rank {root} is out of range for a "
                             f"group of size {self.group.size}")
        if getattr(opts, "rootTensor", 0) != 0:
            raise ValueError(f"{self._where(operation)}: rootTensor must be 0 (one tensor per "
                             f"rank), got {opts.rootTensor}")
        return root

    def _op(self, opts, operation):
        kind = getattr(opts.reduceOp, "op", opts.reduceOp)
        try:
            op = _OPS.get(kind)
        except TypeError:           # not hashable: parsed below every time
            op = None
        if op is not None:
            return op
        if kind == dist.ReduceOp.PREMUL_SUM:
            raise ValueError(f"{self._where(operation)}: ReduceOp.PREMUL_SUM is not supported "
                             f"by the {BACKEND} backend; scale the tensor and use SUM")
        op = ReduceOp.parse(kind)
        try:
            _OPS[kind] = op
        except TypeError:
            pass
        return op

    @staticmethod
    def _timeout(opts):
        """The call's own timeout (torch's opts.timeout), else None: the group's."""
        return torch_seconds(getattr(opts, "timeout", None))


    def _pairs(self, outputs, inputs, operation):
        if not isinstance(outputs, (list, tuple)) or not isinstance(inputs, (list, tuple)) \
                or len(outputs) != len(inputs):
            raise ValueError(f"{self._where(operation)}: outputs and inputs must be lists of "
                             f"equal length")


    def _rooted(self, lists, root, like, operation, name):
        """gather's outputs / scatter's inputs: one list of one tensor per rank on the root,
        each like ``like``; nothing elsewhere. Returns the root's views, else None."""
        if self.group.rank != root:
            if lists and any(len(entry) for entry in lists):
                raise ValueError(f"{self._where(operation)}: {name} must be empty on ranks "
                                 f"other than the root ({root})")
            return None
        views = self._flats(self._single(lists, operation, name), operation, name,
                            self.group.size)
        for i, view in enumerate(views):
            if view.size != like.size or view.dtype != like.dtype:
                raise ValueError(f"{self._where(operation)}: {name}[{i}] has {view.size} "
                                 f"{view.dtype} elements; each must match the tensor "
                                 f"({like.size} {like.dtype})")
        return views

    def _splits(self, sizes, total, per_row, name):
        p = self.group.size
        if not len(sizes):
            if total % p:
                raise ValueError(f"{self._where('all_to_all_single')}: {total} elements do not "
                                 f"split evenly over {p} ranks; give {name}")
            return [total // p] * p
        sizes = [int(s) for s in sizes]
        if len(sizes) != p or any(s < 0 for s in sizes) or sum(sizes) * per_row != total:
            raise ValueError(f"{self._where('all_to_all_single')}: {name} {sizes} must be {p} "
                             f"non-negative row counts adding up to the tensor's rows")
        return [s * per_row for s in sizes]
