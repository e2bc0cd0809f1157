"""The kernels that run push programs (``algorithms/pushed.py``) and the special kernels on
one GPU: their CUDA text is ``cuda_peer.cu`` beside this module; here are the element types
and reductions they are compiled for, and the NVRTC build (cached per process). The protocol
they speak (instructions, columns, flag words, error kinds) is ``peer_protocol.py``'s, whose
generated header ``source`` prepends; docs/peer-memory.md explains it.

One launch per collective: ``blocks`` thread blocks walk the program, each moving its share
of every message and op (``pushed.share``), meeting only at the grid barriers the lowering
placed. At its start a block loads the program, the peers' addresses and the message
counters into shared memory at once; at its end the last block out moves the counters and
the call number on, no block waiting for another. Every wait is bounded (the call's deadline,
the abort word): no kernel is left spinning.

Reductions in the dtype's own arithmetic (float16 and bfloat16 in float32 with one rounding,
as the other executors), the expressions of ``kernels.cuda``; AVG is SUM here (the group
divides afterwards).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from ..ops import ReduceOp
from . import peer_protocol
from .reduce import BFLOAT16

# the flag words' layout is the protocol's (named here for the executor and the transport)
from .peer_protocol import (  # noqa: F401 (re-exported)
    ABORT_WORD, BARRIER_WORD, CALL_WORD, DELIVERED_WORDS, DIRECT_WORDS, EPOCH_WORD, EXIT_WORD,
    FLAG_BYTES, GENERATION_WORD, HEAP_SHIFT, MAX_BLOCKS, MAX_HEAPS, MAX_RANKS, MODE_WORDS,
    PLACE_WORDS, RECEIVED_WORDS, SEEN_WORDS, SENT_WORDS)

THREADS = 512

_STORAGE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
            np.dtype(np.int8): "signed char", np.dtype(np.int16): "short",
            np.dtype(np.int32): "int", np.dtype(np.int64): "long long",
            np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
            np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long",
            np.dtype(np.bool_): "unsigned char", np.dtype(np.float16): "unsigned short"}
if BFLOAT16 is not None:
    _STORAGE[BFLOAT16] = "unsigned short"

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_peer.cu")


def _combine(op: ReduceOp, dtype: np.dtype) -> str:
    """The body of ``S combine(S a, S b)`` for ``op`` on ``dtype``."""
    from .cuda import _expression
    expr = _expression(op, dtype)
    if dtype == np.float16:
        return (" float x, y; unsigned short h;\n"
                ' asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(a));\n'
                ' asm("cvt.f32.f16 %0, %1;" : "=f"(y) : "h"(b));\n'
                f" float r = {expr};\n"
                ' asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(r));\n'
                " return h;")
    if dtype == BFLOAT16:
        return (" float x = __uint_as_float(((unsigned)a) << 16);\n"
                " float y = __uint_as_float(((unsigned)b) << 16);\n"
                f" float r = {expr};\n"
                " unsigned u = __float_as_uint(r);\n"
                " if ((u & 0x7fffffffu) > 0x7f800000u) return (S)((u >> 16) | 0x40u);\n"
                " return (S)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);")
    if dtype == np.bool_:
        return f" bool x = a != 0, y = b != 0; return (S)({expr});"
    return f" S x = a, y = b; return (S)({expr});"


def supported(op, dtype) -> bool:
    dtype = np.dtype(dtype)
    return dtype in _STORAGE and (op is None or ReduceOp.parse(op) in
                                  (ReduceOp.SUM, ReduceOp.AVG, ReduceOp.PRODUCT, ReduceOp.MIN,
                                   ReduceOp.MAX, ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR))


def source(op, dtype, fences: int = 0, trace: bool = False) -> str:
    """The CUDA source for ``op`` on ``dtype`` (``op`` None: a program without reductions);
    ``trace``: with the timestamps ``tools/peer_trace.py`` reads."""
    dtype = np.dtype(dtype)
    op = ReduceOp.SUM if op is None else ReduceOp.parse(op)
    if op == ReduceOp.AVG:
        op = ReduceOp.SUM
    defines = peer_protocol.header() + f"#define THREADS {THREADS}\n#define FENCES {fences}\n"
    if trace:
        defines += "#define TRACE 1\n"
    return defines + _kernel_text().replace("STORAGE", _STORAGE[dtype]).replace(
        "COMBINE", _combine(op, dtype))


@functools.lru_cache(maxsize=None)
def _kernel_text() -> str:
    with open(_SOURCE) as f:
        return f.read()


@functools.lru_cache(maxsize=None)
def program_kernel(op, dtype, fences: int = 0):
    """The compiled ``run_program`` for ``op`` on ``dtype`` (NVRTC, cached per process)."""
    import cupy
    module = cupy.RawModule(code=source(op, dtype, fences), options=("-std=c++14",))
    return module.get_function("run_program")


IN_PLACE_MAX_WORLD = 8     # each thread holds a 16-byte load of every rank's block at once


@functools.lru_cache(maxsize=None)
def _world_module(op, dtype, fences: int, world: int):
    """The kernels built for ``world`` ranks (``#ifdef WORLD`` in the source: loops over the
    ranks unrolled, so a thread keeps a load of every rank's data in flight in few
    registers), compiled once per (op, dtype, fences, world) with NVRTC."""
    import cupy
    if not 2 <= world <= IN_PLACE_MAX_WORLD:
        raise ValueError(f"the peer kernels of a fixed world size are built for 2 to "
                         f"{IN_PLACE_MAX_WORLD} ranks, not {world}")
    code = f"#define WORLD {world}\n" + source(op, dtype, fences)
    return cupy.RawModule(code=code, options=("-std=c++14",))


@functools.lru_cache(maxsize=None)
def in_place_kernel(op, dtype, fences: int, world: int):
    """The compiled ``two_shot_in_place`` for ``op`` on ``dtype`` and ``world`` ranks: the
    two_shot all_reduce where every rank's buffer lies in symmetric memory."""
    return _world_module(op, dtype, fences, world).get_function("two_shot_in_place")


@functools.lru_cache(maxsize=None)
def pipelined_kernel(op, dtype, fences: int, world: int):
    """The compiled ``pipelined_reduce_scatter`` for ``op`` on ``dtype`` and ``world``
    ranks: a direct reduce_scatter whose pushes and reductions overlap."""
    return _world_module(op, dtype, fences, world).get_function("pipelined_reduce_scatter")


@functools.lru_cache(maxsize=None)
def copies_kernel(op, dtype, fences: int, world: int):
    """The compiled ``copies_around`` for ``world`` ranks: the launches before and after a
    call's copies by the copy engines (a direct all_gather; the end of a pipelined
    all_reduce gathered so)."""
    return _world_module(op, dtype, fences, world).get_function("copies_around")
