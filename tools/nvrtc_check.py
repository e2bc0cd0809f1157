"""Compile the peer-memory kernel's every variant with NVRTC on a machine without a GPU (to
catch compile errors before a device call): python tools/nvrtc_check.py PATH/libnvrtc.so.12"""
import ctypes
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 2)[0])
from collectives.kernels import cuda_peer  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])


def compile_source(source):
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"k.cu", 0, None,
                                  None) == 0
    opts = [b"-std=c++14", b"-arch=compute_90"]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    return rc, log.value.decode()


bad = 0
for dtype in (np.float32, np.float16, np.float64, np.int8, np.int32):
    for op in (ReduceOp.SUM, ReduceOp.MAX, None):
        for trace in (False, True):
            for world in (None, 2, 4, 8):   # the kernels of a fixed world size (#ifdef WORLD)
                head = "" if world is None else f"#define WORLD {world}\n"
                rc, log = compile_source(head + cuda_peer.source(op, dtype, 0, trace))
                if rc or "warning" in log:
                    print(np.dtype(dtype).name, op, trace, world, rc, log[:3000])
                    bad += rc != 0
print("compile errors:", bad)
