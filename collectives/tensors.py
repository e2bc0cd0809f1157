"""Adapting user buffers to the flat contiguous arrays a ProcessGroup works on.

numpy arrays and torch CPU tensors become numpy views, CuPy arrays and torch CUDA tensors
become CuPy views: zero-copy, so results land in the caller's memory. Tensors of any shape
are flattened (they must be contiguous: a non-contiguous tensor is a ValueError, never a
silent copy; a sparse tensor is a TypeError naming its layout). torch bfloat16 is viewed through ml_dtypes' bfloat16; tensors that require
grad are detached (collectives are not differentiable here, as in torch.distributed).
torch and cupy are optional: they are looked up in ``sys.modules`` (a tensor of theirs can
only exist if they were imported) and never imported by this package.
"""
from __future__ import annotations

import sys

import numpy as np

try:
    import ml_dtypes
    _BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    _BFLOAT16 = None


def _torch():
    return sys.modules.get("torch")


def _cupy():
    return sys.modules.get("cupy")


def is_torch(x) -> bool:
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_cupy(x) -> bool:
    cupy = _cupy()
    return cupy is not None and isinstance(x, cupy.ndarray)


def is_sparse_coo(x) -> bool:
    torch = _torch()
    return is_torch(x) and x.layout == torch.sparse_coo


def flat(x, operation: str, rank: int, name: str = "tensor"):
    """A flat view of ``x``'s memory (numpy or cupy). Raises before anything moves."""
    if isinstance(x, np.ndarray) or is_cupy(x):
        array = x
    elif is_torch(x):
        array = _torch_view(x, operation, rank, name)
    else:
        raise TypeError(f"{operation} on rank {rank}: {name} must be a numpy array, torch "
                        f"tensor or cupy array, got {type(x).__name__}")
    if not array.flags.c_contiguous:
        raise ValueError(f"{operation} on rank {rank}: {name} is not contiguous (shape "
                         f"{tuple(array.shape)}); pass a contiguous tensor, e.g. "
                         f"t.contiguous(), and copy the result back")
    return array.reshape(-1)


def as_real(array):
    """A complex flat view as its (re, im) pairs of reals; any other view unchanged."""
    if array.dtype.kind != "c":
        return array
    return array.view(array.real.dtype)


def writeable(array) -> bool:
    """Whether results may be written into ``array``: numpy says so in its flags; CuPy's flags
    have no such field (device arrays are always writeable)."""
    return getattr(array.flags, "writeable", True)


def check_list(items, operation: str, rank: int, name: str, length: int | None = None,
               per_rank: bool = True) -> None:
    """A list-shaped argument is a list or tuple, of ``length`` entries where given (one per
    rank of the group unless ``per_rank`` is false)."""
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{operation} on rank {rank}: {name} must be a list of tensors, got "
                        f"{type(items).__name__}")
    if length is not None and len(items) != length:
        each = " (one per rank of the group)" if per_rank else ""
        raise ValueError(f"{operation} on rank {rank}: {name} must hold {length} "
                         f"tensors{each}, got {len(items)}")


def flat_list(items, operation: str, rank: int, name: str, length: int | None = None):
    """Flat views of a list of tensors, all of one dtype; ``length`` checks the list size."""
    check_list(items, operation, rank, name, length)
    views = [flat(t, operation, rank, f"{name}[{i}]") for i, t in enumerate(items)]
    for i, view in enumerate(views[1:], 1):
        if view.dtype != views[0].dtype:
            raise TypeError(f"{operation} on rank {rank}: {name} mixes dtypes ({views[0].dtype} "
                            f"and {view.dtype} at index {i})")
    return views


_CUDA_DTYPES: dict = {}


def _cuda_dtypes(torch) -> dict:
    """torch dtype -> numpy dtype, for the CUDA views made without __cuda_array_interface__."""
    if not _CUDA_DTYPES:
        for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                     "uint8", "bool", "complex64", "complex128"):
            _CUDA_DTYPES[getattr(torch, name)] = np.dtype(name)
    return _CUDA_DTYPES


def _torch_view(t, operation, rank, name):
    torch = _torch()
    if t.layout != torch.strided:
        raise TypeError(f"{operation} on rank {rank}: {name} has layout {t.layout}; only dense "
                        f"(torch.strided) tensors are supported: pass t.to_dense()")
    t = t.detach()
    if not t.is_contiguous():
        raise ValueError(f"{operation} on rank {rank}: {name} is not contiguous (shape "
                         f"{tuple(t.shape)}, strides {t.stride()}); pass t.contiguous() and "
                         f"copy the result back")
    if t.device.type == "cuda":
        cupy = _cupy()
        if cupy is None:
            import cupy  # noqa: F811  (only reached with a CUDA tensor in hand)
        dtype = _cuda_dtypes(torch).get(t.dtype)
        if dtype is not None and t.numel():
            # the view made directly (it holds ``t``, as asarray's does): torch's
            # __cuda_array_interface__ builds a dict at every call and costs more than this
            nbytes = t.numel() * dtype.itemsize
            memory = cupy.cuda.UnownedMemory(t.data_ptr(), nbytes, t, t.device.index)
            return cupy.ndarray((t.numel(),), dtype, cupy.cuda.MemoryPointer(memory, 0))
        if t.dtype == torch.bfloat16:
            # CuPy takes ml_dtypes' bfloat16 (CuPy >= 14), so view the 16-bit words as that.
            if _BFLOAT16 is None:
                raise TypeError(f"{operation} on rank {rank}: bfloat16 tensors need ml_dtypes")
            try:
                return cupy.asarray(t.view(torch.int16)).view(_BFLOAT16)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"{operation} on rank {rank}: this CuPy ({cupy.__version__}) "
                                f"cannot hold bfloat16 arrays: {exc}") from None
        return cupy.asarray(t)
    if t.device.type != "cpu":
        raise TypeError(f"{operation} on rank {rank}: {name} is on device {t.device}; only "
                        f"CPU and CUDA tensors are supported")
    if t.dtype == torch.bfloat16:
        if _BFLOAT16 is None:
            raise TypeError(f"{operation} on rank {rank}: bfloat16 tensors need ml_dtypes")
        return t.view(torch.int16).numpy().view(_BFLOAT16)
    try:
        return t.numpy()
    except (TypeError, RuntimeError) as exc:
        raise TypeError(f"{operation} on rank {rank}: {name} has dtype {t.dtype}, which has no "
                        f"array view here: {exc}") from None


def array_module(array):
    """numpy or cupy, whichever ``array`` belongs to."""
    return np if isinstance(array, np.ndarray) else _cupy()


def empty(like, count: int):
    return array_module(like).empty(count, dtype=like.dtype)


def concatenate(views, like):
    """One flat buffer holding ``views`` back to back (a private copy)."""
    xp = array_module(like)
    if not views:
        return xp.empty(0, dtype=like.dtype)
    return xp.concatenate(views)


def split_into(source, views) -> None:
    """Copy consecutive pieces of ``source`` into ``views`` (the caller's tensors)."""
    offset = 0
    for view in views:
        view[...] = source[offset:offset + view.size]
        offset += view.size


def rows(x) -> int:
    """Elements per index of dim 0 (torch's split sizes count rows, not elements)."""
    shape = tuple(x.shape)
    if not shape:
        return 1
    if shape[0] == 0:
        return int(np.prod(shape[1:], dtype=np.int64))
    return int(np.prod(shape, dtype=np.int64)) // shape[0]
