"""The kernel that runs a whole push program (``algorithms/pushed.py``) on one GPU.

One launch per collective: ``blocks`` thread blocks walk the program together, each moving
its share of every message and op (``share``: 16-byte aligned pieces where the regions are);
``BARRIER`` is a grid barrier on a counter in this rank's flag words; cross-GPU order comes
from the epoch and delivered words, written with release stores and read with acquire loads
at system scope (other GPUs write them over NVLink). Data goes to peers as plain stores
through their IPC-mapped staging memory.

A grid barrier counts arrivals in one word; the last block to arrive resets it and moves a
generation word on, which the others wait for. Waits are bounded: every spin checks this rank's abort word and, every 256 polls, the GPU's
global timer against the call's deadline. The first wait that times out records (kind, step,
peer) in the group's error words (host memory mapped into the device, so the host reads them
without synchronizing) and raises the abort word of every rank, so the others stop at once
and report which rank gave up; no kernel is left spinning. Error kinds: 1 timed out, 2 a peer
aborted.

Reductions: one element per thread, in the dtype's own arithmetic (float16 and bfloat16 in
float32 with one rounding, as the other executors), the expressions of ``kernels.cuda``; AVG
is SUM here (the group divides afterwards).
"""
from __future__ import annotations

import functools

import numpy as np

from ..ops import ReduceOp
from .reduce import BFLOAT16

THREADS = 512
MAX_BLOCKS = 128          # delivered words per sender in a rank's flags

# Flag words (uint64) of one rank; DELIVERED is [sender][block].
EPOCH_WORD, CALL_WORD, BARRIER_WORD, ABORT_WORD, GENERATION_WORD = 0, 1, 2, 3, 4
SENT_WORDS, RECEIVED_WORDS, SEEN_WORDS, DELIVERED_WORDS = 256, 512, 768, 1024
MAX_RANKS = 256
FLAG_BYTES = (DELIVERED_WORDS + MAX_RANKS * MAX_BLOCKS) * 8

_STORAGE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double",
            np.dtype(np.int8): "signed char", np.dtype(np.int16): "short",
            np.dtype(np.int32): "int", np.dtype(np.int64): "long long",
            np.dtype(np.uint8): "unsigned char", np.dtype(np.uint16): "unsigned short",
            np.dtype(np.uint32): "unsigned int", np.dtype(np.uint64): "unsigned long long",
            np.dtype(np.bool_): "unsigned char", np.dtype(np.float16): "unsigned short"}
if BFLOAT16 is not None:
    _STORAGE[BFLOAT16] = "unsigned short"

_SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;
typedef STORAGE S;

#define EPOCH_WORD %(EPOCH_WORD)d
#define CALL_WORD %(CALL_WORD)d
#define BARRIER_WORD %(BARRIER_WORD)d
#define ABORT_WORD %(ABORT_WORD)d
#define GENERATION_WORD %(GENERATION_WORD)d
#define SENT_WORDS %(SENT_WORDS)d
#define RECEIVED_WORDS %(RECEIVED_WORDS)d
#define SEEN_WORDS %(SEEN_WORDS)d
#define DELIVERED_WORDS %(DELIVERED_WORDS)d
#define MAX_BLOCKS %(MAX_BLOCKS)d
#define WIDTH %(WIDTH)d
#define STEP_BITS %(STEP_BITS)d
#define OUTPUT %(OUTPUT)d

/* Flag words between GPUs. FENCES 0: acquire loads and release stores at system scope;
   1: relaxed polls and stores with one acq_rel fence at system scope around them; 2:
   volatile accesses with __threadfence_system (the classic pattern). */
#ifndef FENCES
#define FENCES 0
#endif
__device__ __forceinline__ u64 acquire(const u64* p) {
    u64 v;
#if FENCES == 0
    asm volatile("ld.acquire.sys.global.u64 %%0, [%%1];" : "=l"(v) : "l"(p) : "memory");
#elif FENCES == 1
    asm volatile("ld.relaxed.sys.global.u64 %%0, [%%1];" : "=l"(v) : "l"(p) : "memory");
#else
    v = *(volatile const u64*)p;
#endif
    return v;
}
/* after a poll saw its value: what the writer released is visible to this thread */
__device__ __forceinline__ void acquired() {
#if FENCES == 1
    asm volatile("fence.acq_rel.sys;" ::: "memory");
#elif FENCES == 2
    __threadfence_system();
#endif
}
__device__ __forceinline__ void release(u64* p, u64 v) {
#if FENCES == 0
    asm volatile("st.release.sys.global.u64 [%%0], %%1;" :: "l"(p), "l"(v) : "memory");
#elif FENCES == 1
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("st.relaxed.sys.global.u64 [%%0], %%1;" :: "l"(p), "l"(v) : "memory");
#else
    __threadfence_system();
    *(volatile u64*)p = v;
#endif
}
__device__ __forceinline__ u64 now() {
    u64 t;
    asm volatile("mov.u64 %%0, %%globaltimer;" : "=l"(t));
    return t;
}

/* TRACE (tools/peer_trace.py): block 0's clock before each instruction of the latest call,
   and the global timer at every call's entry and exit (64 calls kept). */
#ifdef TRACE
__device__ u64 trace_ops[4096];
__device__ u64 trace_calls[128];
#define MARK_OP(i) if (blockIdx.x == 0 && threadIdx.x == 0 && (i) < 4096) trace_ops[i] = clock64();
#define MARK_CALL(call, at) if (blockIdx.x == 0 && threadIdx.x == 0) trace_calls[2 * ((call) %% 64) + (at)] = now();
#else
#define MARK_OP(i)
#define MARK_CALL(call, at)
#endif

struct Ctx {
    u64* flags; const u64* peer_flags; int* error; int rank; int size; u64 deadline;
};

__device__ void fail(const Ctx& c, int kind, int step, int peer) {
    if (atomicCAS(c.error, 0, kind) == 0) {
        c.error[1] = step; c.error[2] = peer;
        __threadfence_system();
    }
    release(c.flags + ABORT_WORD, (u64)(c.rank + 1));
    for (int q = 0; q < c.size; q++)
        if (q != c.rank) release((u64*)c.peer_flags[q] + ABORT_WORD, (u64)(c.rank + 1));
}

/* Spin until *p >= target. False when this call must stop (timeout here, or abort). */
__device__ bool wait_for(const Ctx& c, const u64* p, u64 target, int step, int peer) {
    unsigned polls = 0;
    while (acquire(p) < target) {
        if ((++polls & 255) == 0) {
            u64 aborted = acquire(c.flags + ABORT_WORD);
            if (aborted) {
                if (atomicCAS(c.error, 0, 2) == 0) {
                    c.error[1] = step; c.error[2] = (int)aborted - 1;
                    __threadfence_system();
                }
                return false;
            }
            if (now() > c.deadline) { fail(c, 1, step, peer); return false; }
        }
    }
    acquired();
    return true;
}

/* All blocks of this kernel: the last to arrive resets the count and moves the generation on
   (the count starts at 0 in every kernel, whatever the previous one's grid). The barrier is
   between blocks of one GPU, so its ordering is at GPU scope: a system-scope acquire or
   release costs microseconds more, once per step. */
__device__ __forceinline__ u64 acquire_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %%0, [%%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}
__device__ bool grid_barrier(const Ctx& c, int step, int* stop) {
    __syncthreads();
    if (gridDim.x == 1) return !*stop;
    if (threadIdx.x == 0) {
        u64* generation = c.flags + GENERATION_WORD;
        const u64 seen = acquire_gpu(generation);
        __threadfence();
        if (atomicAdd(c.flags + BARRIER_WORD, 1ULL) == gridDim.x - 1) {
            atomicExch(c.flags + BARRIER_WORD, 0ULL);
            asm volatile("st.release.gpu.global.u64 [%%0], %%1;" :: "l"(generation),
                         "l"(seen + 1) : "memory");
        } else {
            unsigned polls = 0;
            while (acquire_gpu(generation) == seen) {
                if ((++polls & 255) == 0) {
                    if (acquire(c.flags + ABORT_WORD)) { *stop = 1; break; }
                    if (now() > c.deadline) { fail(c, 1, step, c.rank); *stop = 1; break; }
                }
            }
        }
    }
    __syncthreads();
    return !*stop;
}

/* [lo, hi) of count items for this block, boundaries rounded to multiples of align items. */
__device__ __forceinline__ void share(i64 count, i64 align, i64* lo, i64* hi) {
    i64 b = blockIdx.x, g = gridDim.x;
    i64 units = (count + align - 1) / align;
    *lo = units * b / g * align;
    *hi = units * (b + 1) / g * align;
    if (*lo > count) *lo = count;
    if (*hi > count) *hi = count;
}

__device__ void copy_bytes(char* dst, const char* src, i64 n) {
    if ((((u64)dst | (u64)src) & 15) == 0) {
        i64 v = n >> 4;
        uint4* d = (uint4*)dst; const uint4* s = (const uint4*)src;
        for (i64 i = threadIdx.x; i < v; i += blockDim.x) d[i] = s[i];
        for (i64 i = (v << 4) + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    } else if ((((u64)dst | (u64)src) & 3) == 0) {
        i64 v = n >> 2;
        unsigned* d = (unsigned*)dst; const unsigned* s = (const unsigned*)src;
        for (i64 i = threadIdx.x; i < v; i += blockDim.x) d[i] = s[i];
        for (i64 i = (v << 2) + threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    } else {
        for (i64 i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
    }
}

__device__ __forceinline__ S combine(S a, S b) {
COMBINE
}

extern "C" __global__ void __launch_bounds__(%(THREADS)d)
run_program(const i64* code, int n, const i64* tallies, char* in, char* out, char* scratch,
            char* caller_out, const u64* peer_data, const u64* peer_flags, u64 scratch_at,
            u64* flags, int* error, int rank, int size, int itemsize, u64 timeout_ns,
            const u64* peer_inbox, u64 inbox_half) {
    __shared__ int stop;
    __shared__ u64 deadline;
    if (threadIdx.x == 0) {
        stop = 0;
        deadline = now() + timeout_ns;
        if (acquire(flags + ABORT_WORD)) stop = 1;   /* an earlier call failed: do nothing */
    }
    __syncthreads();
    Ctx c = {flags, peer_flags, error, rank, size, deadline};
    const u64 call = flags[CALL_WORD];
    MARK_CALL(call, 0)
    char* bases[4] = {in, out, scratch, caller_out};
    const i64 align = 16 / itemsize > 0 ? 16 / itemsize : 1;
    for (int i = 0; i < n && !stop; i++) {
        const i64* r = code + (i64)i * WIDTH;
        const int step = (int)r[1];
        MARK_OP(i)
        switch ((int)r[0]) {
        case 0:   /* BARRIER */
            grid_barrier(c, step, &stop);
            break;
        case 1:   /* EPOCH: into every rank's SEEN word for this rank, so waits poll locally */
            if (blockIdx.x == 0 && threadIdx.x < size) {
                u64* seen = (u64*)peer_flags[threadIdx.x] + SEEN_WORDS + rank;
                release(seen, ((call + 1) << STEP_BITS) | (u64)r[2]);
            }
            break;
        case 2:   /* PUSH (rendezvous) */
        case 6: { /* SEND (eager) */
            /* The step's consecutive sends as one batch: their waits in parallel (thread t
               for message t), every message's share copied, then one release each, in
               parallel: a step pays one flag latency, not one per message. */
            const int kind = (int)r[0];
            int j = i + 1;
            while (j < n && code[(i64)j * WIDTH] == kind && code[(i64)j * WIDTH + 1] == r[1]) j++;
            const int m = j - i;
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                const int peer = (int)q[2];
                /* rendezvous: the receive is posted; eager: the slot's half is free (the
                   receiver started the previous call, so it is done with the one before) */
                const u64 target = kind == 2 ? (((call + 1) << STEP_BITS) | (u64)q[8])
                                             : (call >= 2 ? call << STEP_BITS : 0);
                if (target && !wait_for(c, flags + SEEN_WORDS + peer, target, step, peer))
                    stop = 1;
            }
            __syncthreads();
            if (stop) break;
            for (int k = i; k < j; k++) {
                const i64* q = code + (i64)k * WIDTH;
                const int peer = (int)q[2];
                const i64 count = kind == 2 ? q[7] : q[6];
                i64 lo, hi;
                share(count, align, &lo, &hi);
                const char* src = bases[q[3]] + (q[4] + lo) * itemsize;
                char* dst = kind == 2
                    ? (char*)peer_data[peer] + (q[5] == OUTPUT ? 0 : scratch_at)
                      + (q[6] + lo) * itemsize
                    : (char*)peer_inbox[peer] + (call & 1) * inbox_half
                      + (q[5] + lo) * itemsize;
                if (hi > lo) copy_bytes(dst, src, (hi - lo) * itemsize);
            }
            /* the block's stores, then one release per message (cumulative over the stores
               the barrier ordered before it) */
            __syncthreads();
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                const int peer = (int)q[2];
                /* one word per sender and block: of several messages to one peer (a
                   bidirectional ring on 2 ranks) only the last stores its number, or the
                   stores race and a lower number may land last */
                bool last = true;
                for (int u = t + 1; u < m; u++)
                    if (code[(i64)(i + u) * WIDTH + 2] == peer) last = false;
                if (!last) continue;
                const u64 number = kind == 2 ? (u64)q[9] : (u64)q[7];
                u64* word = (u64*)peer_flags[peer] + DELIVERED_WORDS
                            + (u64)rank * MAX_BLOCKS + blockIdx.x;
                release(word, flags[SENT_WORDS + peer] + number + 1);
            }
            i = j - 1;
            break;
        }
        case 3:   /* ARRIVE (rendezvous): every block of the sender delivered its share */
        case 7: { /* TAKE (eager): the same, then this block's share copied out of the slot */
            const int kind = (int)r[0];
            int j = i + 1;
            while (j < n && code[(i64)j * WIDTH] == kind && code[(i64)j * WIDTH + 1] == r[1]) j++;
            const int m = j - i;
            for (int t = threadIdx.x; t < m * (int)gridDim.x; t += blockDim.x) {
                const i64* q = code + (i64)(i + t / gridDim.x) * WIDTH;
                const int peer = (int)q[2];
                const u64 target = flags[RECEIVED_WORDS + peer] + (u64)q[3] + 1;
                const u64* word = flags + DELIVERED_WORDS + (u64)peer * MAX_BLOCKS
                                  + t %% gridDim.x;
                if (!wait_for(c, word, target, step, peer)) stop = 1;
            }
            __syncthreads();
            if (stop) break;
            if (kind == 7) {
                for (int k = i; k < j; k++) {
                    const i64* q = code + (i64)k * WIDTH;
                    i64 lo, hi;
                    share(q[7], align, &lo, &hi);
                    const char* src = (const char*)peer_inbox[rank]
                                      + (call & 1) * inbox_half + (q[6] + lo) * itemsize;
                    if (hi > lo) copy_bytes(bases[q[4]] + (q[5] + lo) * itemsize, src,
                                            (hi - lo) * itemsize);
                }
            }
            i = j - 1;
            break;
        }
        case 8: { /* SEND_LL: 4 data bytes and the call's flag in each 8-byte line */
            int j = i + 1;
            while (j < n && code[(i64)j * WIDTH] == 8 && code[(i64)j * WIDTH + 1] == r[1]) j++;
            const int m = j - i;
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                if (call >= 2 && !wait_for(c, flags + SEEN_WORDS + q[2], call << STEP_BITS, step,
                                           (int)q[2])) stop = 1;
            }
            __syncthreads();
            if (stop) break;
            const u64 flag = (u64)(unsigned)(call + 1) << 32;
            for (int k = i; k < j; k++) {
                const i64* q = code + (i64)k * WIDTH;
                const i64 bytes = q[6] * itemsize, lines = (bytes + 3) / 4;
                i64 lo, hi;
                share(lines, 1, &lo, &hi);
                const unsigned char* src = (const unsigned char*)(bases[q[3]] + q[4] * itemsize);
                u64* dst = (u64*)((char*)peer_inbox[q[2]] + (call & 1) * inbox_half
                                  + q[5] * itemsize);
                const bool words = (((u64)src) & 3) == 0;
                for (i64 l = lo + threadIdx.x; l < hi; l += blockDim.x) {
                    unsigned data = 0;
                    if (words && 4 * l + 4 <= bytes) {
                        data = ((const unsigned*)src)[l];
                    } else {
                        for (int b = 0; b < 4 && 4 * l + b < bytes; b++)
                            data |= (unsigned)src[4 * l + b] << (8 * b);
                    }
                    asm volatile("st.volatile.global.u64 [%%0], %%1;" :: "l"(dst + l),
                                 "l"(flag | data) : "memory");
                }
            }
            i = j - 1;
            break;
        }
        case 9: { /* TAKE_LL: each line waited for by the thread that copies it */
            const u64 flag = (u64)(unsigned)(call + 1);
            for (int k = i; k < n && code[(i64)k * WIDTH] == 9 && code[(i64)k * WIDTH + 1] == r[1];
                 k++) {
                const i64* q = code + (i64)k * WIDTH;
                const i64 bytes = q[7] * itemsize, lines = (bytes + 3) / 4;
                i64 lo, hi;
                share(lines, 1, &lo, &hi);
                const u64* src = (const u64*)((const char*)peer_inbox[rank]
                                              + (call & 1) * inbox_half + q[6] * itemsize);
                unsigned char* dst = (unsigned char*)(bases[q[4]] + q[5] * itemsize);
                const bool words = (((u64)dst) & 3) == 0;
                for (i64 l = lo + threadIdx.x; l < hi && !stop; l += blockDim.x) {
                    u64 v;
                    unsigned polls = 0;
                    while (true) {
                        asm volatile("ld.volatile.global.u64 %%0, [%%1];" : "=l"(v)
                                     : "l"(src + l) : "memory");
                        if ((v >> 32) == flag) break;
                        if ((++polls & 255) == 0) {
                            if (acquire(c.flags + ABORT_WORD)) { stop = 1; break; }
                            if (now() > c.deadline) { fail(c, 1, step, (int)q[2]); stop = 1; break; }
                        }
                    }
                    if (stop) break;
                    const unsigned data = (unsigned)v;
                    if (words && 4 * l + 4 <= bytes) {
                        ((unsigned*)dst)[l] = data;
                    } else {
                        for (int b = 0; b < 4 && 4 * l + b < bytes; b++)
                            dst[4 * l + b] = (unsigned char)(data >> (8 * b));
                    }
                }
                i = k;
            }
            __syncthreads();
            break;
        }
        case 4: { /* COPY */
            i64 lo, hi;
            share(r[6], align, &lo, &hi);
            if (hi > lo)
                copy_bytes(bases[r[2]] + (r[3] + lo) * itemsize,
                           bases[r[4]] + (r[5] + lo) * itemsize, (hi - lo) * itemsize);
            break;
        }
        case 5: { /* REDUCE */
            i64 lo, hi;
            share(r[8], align, &lo, &hi);
            S* dst = (S*)bases[r[2]] + r[3];
            const S* a = (const S*)bases[r[4]] + r[5];
            const S* b = (const S*)bases[r[6]] + r[7];
            for (i64 e = lo + threadIdx.x; e < hi; e += blockDim.x) dst[e] = combine(a[e], b[e]);
            break;
        }
        }
    }
    /* The call's end: message tallies and the call number move on once every block is done
       (the next call's blocks read them at their start: kernels on one stream are ordered). */
    MARK_OP(n)
    if (!stop) grid_barrier(c, -1, &stop);
    MARK_OP(n + 1)
    MARK_CALL(call, 1)
    if (!stop && blockIdx.x == 0 && threadIdx.x == 0) {
        for (int q = 0; q < size; q++) {
            flags[SENT_WORDS + q] += (u64)tallies[q];
            flags[RECEIVED_WORDS + q] += (u64)tallies[size + q];
        }
        flags[CALL_WORD] = call + 1;
        __threadfence();
    }
}
"""


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
    from ..algorithms import pushed
    dtype = np.dtype(dtype)
    op = ReduceOp.SUM if op is None else ReduceOp.parse(op)
    if op == ReduceOp.AVG:
        op = ReduceOp.SUM
    body = _SOURCE % dict(EPOCH_WORD=EPOCH_WORD, CALL_WORD=CALL_WORD, BARRIER_WORD=BARRIER_WORD,
                          ABORT_WORD=ABORT_WORD, GENERATION_WORD=GENERATION_WORD, SENT_WORDS=SENT_WORDS,
                          RECEIVED_WORDS=RECEIVED_WORDS, SEEN_WORDS=SEEN_WORDS, DELIVERED_WORDS=DELIVERED_WORDS,
                          MAX_BLOCKS=MAX_BLOCKS, WIDTH=pushed.WIDTH, STEP_BITS=pushed.STEP_BITS,
                          OUTPUT=pushed.OUTPUT,
                          THREADS=THREADS)
    return (f"#define FENCES {fences}\n" + ("#define TRACE 1\n" if trace else "") + body.replace("STORAGE", _STORAGE[dtype])
            .replace("COMBINE", _combine(op, dtype)))


@functools.lru_cache(maxsize=None)
def program_kernel(op, dtype, fences: int = 0):
    """The compiled ``run_program`` for ``op`` on ``dtype`` (NVRTC, cached per process)."""
    import cupy
    module = cupy.RawModule(code=source(op, dtype, fences), options=("-std=c++14",))
    return module.get_function("run_program")
