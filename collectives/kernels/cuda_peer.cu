/* The kernel that runs a whole push program (collectives/algorithms/pushed.py) on one GPU;
   docs/peer-memory.md explains the protocol. collectives/kernels/cuda_peer.py compiles it
   (NVRTC), prepends the protocol's header (collectives/kernels/peer_protocol.py: #define
   lines for the instruction kinds OP_*, their columns COL_*, flag word offsets *_WORD(S),
   buffers, error kinds ERROR_* and the special kernels' words) and THREADS, and substitutes
   the element type and the reduction's body where their placeholders stand. */
typedef unsigned long long u64;
typedef long long i64;
typedef STORAGE S;

#define SHARED_ROWS 64

/* Flag words between GPUs. FENCES 0: acquire loads and release stores at system scope;
   1: relaxed polls and stores with one acq_rel fence at system scope around them; 2:
   volatile accesses with __threadfence_system (the classic pattern). */
#ifndef FENCES
#define FENCES 0
#endif
__device__ __forceinline__ u64 acquire(const u64* p) {
    u64 v;
#if FENCES == 0
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#elif FENCES == 1
    asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
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
    asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
#elif FENCES == 1
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
#else
    __threadfence_system();
    *(volatile u64*)p = v;
#endif
}
__device__ __forceinline__ u64 now() {
    u64 t;
    asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
    return t;
}

/* TRACE (tools/peer_trace.py): block 0's clock before each instruction of the latest call,
   and per call (32 kept) the global timer at four points: block 0's entry, block 0 after the
   prologue (its loads of the program, addresses and counters), block 0 at the program's end,
   and the last block's exit (after the counters moved on). */
#ifdef TRACE
__device__ u64 trace_ops[4096];
__device__ u64 trace_calls[128];
#define MARK_OP(i) if (blockIdx.x == 0 && threadIdx.x == 0 && (i) < 4096) trace_ops[i] = clock64();
#define MARK_ENTRY u64 entered = now();
#define MARK_CALL(call, at) if (blockIdx.x == 0 && threadIdx.x == 0) { \
    if ((at) == 1) trace_calls[4 * ((call) % 32)] = entered; \
    trace_calls[4 * ((call) % 32) + (at)] = now(); }
#define MARK_EXIT(call) if (threadIdx.x == 0) trace_calls[4 * ((call) % 32) + 3] = now();
#else
#define MARK_OP(i)
#define MARK_ENTRY
#define MARK_CALL(call, at)
#define MARK_EXIT(call)
#endif

struct Ctx {
    u64* flags; const u64* peer_flags; int* error; int rank; int size; u64 deadline;
};

__device__ void fail(const Ctx& c, int kind, int step, int peer) {
    if (atomicCAS(c.error + ERROR_KIND_WORD, ERROR_NONE, kind) == ERROR_NONE) {
        c.error[ERROR_STEP_WORD] = step; c.error[ERROR_PEER_WORD] = peer;
        __threadfence_system();
    }
    release(c.flags + ABORT_WORD, (u64)(c.rank + 1));
    for (int q = 0; q < c.size; q++)
        if (q != c.rank) release((u64*)c.peer_flags[q] + ABORT_WORD, (u64)(c.rank + 1));
}

__device__ __forceinline__ u64 relaxed(const u64* p) {
    u64 v;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* This call stops because rank ``aborted`` - 1 gave up: recorded (ERROR_ABORTED) unless one is
   already, so that the host raises at this call's synchronize, not one call later (a wait
   that saw the abort and stopped without a word left the call's output unfinished and
   nothing to say so). */
__device__ void stopped_by(int* error, u64 aborted, int step) {
    if (atomicCAS(error + ERROR_KIND_WORD, ERROR_NONE, ERROR_ABORTED) == ERROR_NONE) {
        error[ERROR_STEP_WORD] = step; error[ERROR_PEER_WORD] = (int)aborted - 1;
        __threadfence_system();
    }
}

/* Spin until *p >= target. False when this call must stop (timeout here, or abort).
   ``ordered``: what the writer released before the flag is read after it (an acquire); a
   wait that only gates this rank's writes (an inbox half free again) polls relaxed, which
   costs a microsecond less. */
__device__ bool wait_for(const Ctx& c, const u64* p, u64 target, int step, int peer,
                         bool ordered = true) {
    unsigned polls = 0;
    while ((ordered ? acquire(p) : relaxed(p)) < target) {
        if ((++polls & 255) == 0) {
            const u64 aborted = acquire(c.flags + ABORT_WORD);
            if (aborted) { stopped_by(c.error, aborted, step); return false; }
            if (now() > c.deadline) { fail(c, ERROR_TIMED_OUT, step, peer); return false; }
        }
    }
    if (ordered) acquired();
    return true;
}

/* The flag in the lines of call number ``call`` (pushed.line_flag): never 0. */
__device__ __forceinline__ unsigned line_flag(u64 call) {
    return (unsigned)(call % LINE_PERIOD) + 1u;
}

/* One flagged line: poll until it carries this call's flag (``v`` the first load, issued
   early with the others). False when this call must stop. */
__device__ __forceinline__ bool line_ready(const Ctx& c, const u64* p, u64* v, unsigned flag,
                                           int step, int peer) {
    unsigned polls = 0;
    while ((unsigned)(*v >> 32) != flag) {
        if ((++polls & 255) == 0) {
            const u64 aborted = relaxed(c.flags + ABORT_WORD);
            if (aborted) { stopped_by(c.error, aborted, step); return false; }
            if (now() > c.deadline) { fail(c, ERROR_TIMED_OUT, step, peer); return false; }
        }
        *v = relaxed(p);
    }
    return true;
}

/* All blocks of this kernel: the last to arrive resets the count and moves the generation on
   (the count starts at 0 in every kernel, whatever the previous one's grid). The barrier is
   between blocks of one GPU, so its ordering is at GPU scope: a system-scope acquire or
   release costs microseconds more, once per step. */
__device__ __forceinline__ u64 acquire_gpu(const u64* p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
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
            asm volatile("st.release.gpu.global.u64 [%0], %1;" :: "l"(generation),
                         "l"(seen + 1) : "memory");
        } else {
            unsigned polls = 0;
            while (acquire_gpu(generation) == seen) {
                if ((++polls & 255) == 0) {
                    const u64 aborted = acquire(c.flags + ABORT_WORD);
                    if (aborted) { stopped_by(c.error, aborted, step); *stop = 1; break; }
                    if (now() > c.deadline) {
                        fail(c, ERROR_TIMED_OUT, step, c.rank); *stop = 1; break;
                    }
                }
            }
        }
    }
    __syncthreads();
    return !*stop;
}

/* The call's start, on thread 0: its deadline, its number, and whether an earlier call
   failed (loaded together: one memory latency). After a failure this call does nothing and
   says so (the host raises at the next call or synchronize, naming the rank). */
__device__ __forceinline__ void start_call(const u64* flags, int* error, u64 timeout_ns,
                                           u64* deadline, u64* call, int* stop) {
    const u64 aborted = relaxed(flags + ABORT_WORD), number = flags[CALL_WORD];
    *deadline = now() + timeout_ns;
    *stop = aborted != 0;
    if (aborted) stopped_by(error, aborted, -1);
    *call = number;
}

/* Once a period, the line inbox half of the next call zeroed (pushed.scrubs: a line left a
   period ago would carry this period's flag), all of it before this call's first epoch lets
   a sender write that half again. Every kernel that takes a call number does it. */
__device__ __forceinline__ void scrub_lines(const Ctx& c, char* lines, u64 lines_half,
                                            u64 call, int* stop) {
    if (call % LINE_PERIOD < LINE_PERIOD - 2 || *stop) return;
    u64* half = (u64*)(lines + ((call + 1) & 1) * lines_half);
    for (u64 w = (u64)blockIdx.x * blockDim.x + threadIdx.x; w < lines_half / 8;
         w += (u64)gridDim.x * blockDim.x)
        half[w] = 0;
    __threadfence_system();
    grid_barrier(c, -1, stop);
}

/* The call's end: the last block to finish moves the message tallies (``sends``, ``recvs``
   this call's, added per peer) and the call number on; the others have read them for the
   last time, and the next kernel on this stream starts after all of them. No block waits
   for another. */
__device__ __forceinline__ void end_call(u64* flags, u64 call, const u64* sent,
                                         const u64* received, const u64* sends,
                                         const u64* recvs, int size, int* last_out) {
    if (threadIdx.x == 0) {
        if (gridDim.x > 1) __threadfence();
        *last_out = gridDim.x == 1 || atomicAdd(flags + EXIT_WORD, 1ULL) == gridDim.x - 1;
    }
    __syncthreads();
    if (!*last_out) return;
    if (threadIdx.x < size) {
        flags[SENT_WORDS + threadIdx.x] = sent[threadIdx.x] + sends[threadIdx.x];
        flags[RECEIVED_WORDS + threadIdx.x] = received[threadIdx.x] + recvs[threadIdx.x];
    }
    if (threadIdx.x == 0) {
        flags[EXIT_WORD] = 0;
        flags[CALL_WORD] = call + 1;
    }
}

/* The address of ``place`` ((heap + 1) << HEAP_SHIFT | byte offset) in the peer's memory. */
__device__ __forceinline__ char* symmetric_at(u64 place, const u64* peer_heaps, int peer,
                                             int size) {
    const u64 heap = (place >> HEAP_SHIFT) - 1;
    return (char*)peer_heaps[heap * size + peer] + (place & ((1ULL << HEAP_SHIFT) - 1));
}

/* Where a peer's output receives land this call: its staging memory, or its symmetric output
   as its epoch (seen before any push to it) says. */
__device__ __forceinline__ char* output_of(const u64* flags, const u64* peer_data,
                                          const u64* peer_heaps, int peer, int size) {
    const u64 place = relaxed(flags + PLACE_WORDS + peer);
    if (place == 0) return (char*)peer_data[peer];
    return symmetric_at(place, peer_heaps, peer, size);
}

/* The end of the batch that starts at instruction i: the instructions after it of the same
   kind and step (a step's sends, or its receives, run together). */
__device__ __forceinline__ int batch_end(const i64* code, int n, int i) {
    int j = i + 1;
    while (j < n && code[(i64)j * WIDTH + COL_KIND] == code[(i64)i * WIDTH + COL_KIND] &&
           code[(i64)j * WIDTH + COL_STEP] == code[(i64)i * WIDTH + COL_STEP]) j++;
    return j;
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

/* Loops move UNROLL items per thread per round, every load issued before any store: a
   thread's round pays one memory latency, not one per item. */
#define UNROLL 4

/* Threads tid of nt (of this block) copy n bytes. */
__device__ void copy_range(char* dst, const char* src, i64 n, i64 tid, i64 nt) {
    if ((((u64)dst | (u64)src) & 15) == 0) {
        i64 v = n >> 4;
        uint4* d = (uint4*)dst; const uint4* s = (const uint4*)src;
        for (i64 i = tid; i < v; i += UNROLL * nt) {
            uint4 t[UNROLL];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) if (i + k * nt < v) t[k] = s[i + k * nt];
#pragma unroll
            for (int k = 0; k < UNROLL; k++) if (i + k * nt < v) d[i + k * nt] = t[k];
        }
        for (i64 i = (v << 4) + tid; i < n; i += nt) dst[i] = src[i];
    } else if ((((u64)dst | (u64)src) & 3) == 0) {
        i64 v = n >> 2;
        unsigned* d = (unsigned*)dst; const unsigned* s = (const unsigned*)src;
        for (i64 i = tid; i < v; i += nt) d[i] = s[i];
        for (i64 i = (v << 2) + tid; i < n; i += nt) dst[i] = src[i];
    } else {
        for (i64 i = tid; i < n; i += nt) dst[i] = src[i];
    }
}

__device__ __forceinline__ void copy_bytes(char* dst, const char* src, i64 n) {
    copy_range(dst, src, n, threadIdx.x, blockDim.x);
}

/* A step's messages at once: the block's warps split into m groups (m <= warps), one per
   message, so every message's loads are in flight together and a step of three messages
   pays one memory latency, not three in a row (a thread holds no more registers than for
   one message). This thread's message k, and its place tid of nt threads in the group. */
__device__ __forceinline__ int warp_group(int m, i64* tid, i64* nt) {
    const int warps = blockDim.x / 32, k = (threadIdx.x / 32) * m / warps;
    const int first = (k * warps + m - 1) / m, next = ((k + 1) * warps + m - 1) / m;
    *tid = threadIdx.x - 32 * first;
    *nt = 32 * (next - first);
    return k;
}

/* A step's copies at once (its messages, each this block's share), one warp group each;
   more copies than warps go one after another. */
__device__ void copy_batch(char* const* dst, const char* const* src, const i64* n, int m) {
    if (m == 1 || m > (int)blockDim.x / 32) {
        for (int k = 0; k < m; k++) if (n[k] > 0) copy_bytes(dst[k], src[k], n[k]);
        return;
    }
    i64 tid, nt;
    const int k = warp_group(m, &tid, &nt);
    if (n[k] > 0) copy_range(dst[k], src[k], n[k], tid, nt);
}

__device__ __forceinline__ S combine(S a, S b) {
COMBINE
}

/* dst[e] = x0[e] op x1[e] op ... op x[m-1][e], left to right, for this block's share
   [lo, hi): one pass, the running value in registers. Where every pointer is 16-byte
   aligned at lo, a thread moves 16 bytes of each operand at a time, all its loads issued
   before it combines; otherwise one element at a time. dst may be an operand, element by
   element (each element is read before it is written, by the same thread). With k outs,
   each result is also stored to outs[t] (peers' slots, at this share's start) in the same
   pass: a chain whose result the eager sends after it send on (pushed.SENDS_ON), where it
   would be written, met at a barrier and read back. */
#define VEC (16 / (int)sizeof(S))

__device__ __forceinline__ void fold_vector(uint4* acc, const uint4* x) {
    S* a = (S*)acc; const S* b = (const S*)x;
#pragma unroll
    for (int t = 0; t < VEC; t++) a[t] = combine(a[t], b[t]);
}

__device__ __forceinline__ void reduce_many(S* dst, const S* const* xs, int m, i64 lo, i64 hi,
                                            char* const* outs = nullptr, int k = 0) {
    bool aligned = (((u64)(dst + lo)) & 15) == 0;
    for (int j = 0; j < m; j++) aligned = aligned && (((u64)(xs[j] + lo)) & 15) == 0;
    for (int t = 0; t < k; t++) aligned = aligned && (((u64)outs[t]) & 15) == 0;
    const i64 bd = blockDim.x;
    i64 tail = lo;
    if (aligned) {
        const i64 v = (hi - lo) / VEC;
        for (i64 i = threadIdx.x; i < v; i += bd) {
            uint4 x[FOLD];
#pragma unroll
            for (int j = 0; j < FOLD; j++)
                if (j < m) x[j] = ((const uint4*)(xs[j] + lo))[i];
#pragma unroll
            for (int j = 1; j < FOLD; j++)
                if (j < m) fold_vector(&x[0], &x[j]);
            ((uint4*)(dst + lo))[i] = x[0];
            for (int t = 0; t < k; t++) ((uint4*)outs[t])[i] = x[0];
        }
        tail = lo + v * VEC;
    }
    for (i64 e = tail + threadIdx.x; e < hi; e += bd) {
        S acc = xs[0][e];
        for (int j = 1; j < m; j++) acc = combine(acc, xs[j][e]);
        dst[e] = acc;
        for (int t = 0; t < k; t++) ((S*)outs[t])[e - lo] = acc;
    }
}

/* dst[e] = combine(a[e], b[e]) for this block's share [lo, hi). */
__device__ __forceinline__ void reduce_share(S* dst, const S* a, const S* b, i64 lo, i64 hi) {
    const S* xs[2] = {a, b};
    reduce_many(dst, xs, 2, lo, hi);
}

/* Flagged lines carry 4 data bytes each: a unit is the elements of one line (PER of them)
   or, for 8-byte elements, one element in two lines (LPU). Shares are in elements (16-byte
   aligned, as every op's), so a line never straddles two workers. */
#define PER (sizeof(S) <= 4 ? 4 / (int)sizeof(S) : 1)
#define LPU (sizeof(S) == 8 ? 2 : 1)

__device__ __forceinline__ S from_bits(u64 b) {
    union { u64 u; S s; } x;
    x.u = b;
    return x.s;
}
__device__ __forceinline__ u64 to_bits(S s) {
    union { u64 u; S s; } x;
    x.u = 0;
    x.s = s;
    return x.u;
}

/* This worker's share of a message in lines out of the inbox at ``src``, moved by threads
   tid of bd: each element stored to ``dst`` (a TAKE_LL), or, with ``other``, combined with
   it into ``dst`` and kept in ``keep`` when that is not null (a REDUCE_LL; ``first``: the
   message is the first operand). False when this call must stop. */
__device__ bool take_lines(const Ctx& c, const u64* src, i64 count, S* dst, const S* other,
                           S* keep, bool first, unsigned flag, i64 align, int step, int peer,
                           i64 tid, i64 bd) {
    i64 lo, hi;
    share(count, align, &lo, &hi);
    const i64 u_hi = (hi + PER - 1) / PER;
    for (i64 u0 = lo / PER + tid; u0 < u_hi; u0 += UNROLL * bd) {
        u64 v[UNROLL][LPU];
        S o[UNROLL][PER];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 u = u0 + k * bd;
            if (u >= u_hi) break;
#pragma unroll
            for (int l = 0; l < LPU; l++) v[k][l] = relaxed(src + u * LPU + l);
            if (other)
#pragma unroll
                for (int j = 0; j < PER; j++) if (u * PER + j < hi) o[k][j] = other[u * PER + j];
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 u = u0 + k * bd;
            if (u >= u_hi) break;
#pragma unroll
            for (int l = 0; l < LPU; l++)
                if (!line_ready(c, src + u * LPU + l, &v[k][l], flag, step, peer)) return false;
            u64 bits = (v[k][0] & 0xffffffffULL);
            if (LPU == 2) bits |= v[k][LPU - 1] << 32;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const i64 e = u * PER + j;
                if (e >= hi) break;
                const S x = from_bits(bits >> (8 * sizeof(S) * j));
                if (other) {
                    dst[e] = first ? combine(x, o[k][j]) : combine(o[k][j], x);
                    if (keep) keep[e] = x;
                } else {
                    dst[e] = x;
                }
            }
        }
    }
    return true;
}

/* dst[e] = x0[e] op x1[e] op ... for this worker's share, where operand j is a message in
   lines at ``lines[j]`` (polled: each line waited for by the thread that reads it) or, where
   that is null, plain memory at ``xs[j]``: a chain of reductions over several messages in
   one pass, with no copy out of the inbox and no barrier between messages. Each thread
   issues the loads of all its operands before it waits for any; each result is also sent
   in lines to outs[0..k-1] (peers' slots, SENDS_ON). False when this call must stop. Not
   inlined: its registers then stay out of the kernel's allocation (inlined, it makes the
   kernel spill registers to local memory: check with ptxas -v). */
__device__ __noinline__ bool reduce_lines(const Ctx& c, S* dst, const S* const* xs,
                                          const u64* const* lines, const int* peers, int m,
                                          i64 count, unsigned flag, i64 align, int step,
                                          u64* const* outs, int k) {
    i64 lo, hi;
    share(count, align, &lo, &hi);
    const i64 bd = blockDim.x, u_hi = (hi + PER - 1) / PER;
    for (i64 u = lo / PER + threadIdx.x; u < u_hi; u += bd) {
        u64 v[FOLD][LPU];
        S plain[FOLD][PER];
#pragma unroll
        for (int j = 0; j < FOLD; j++) {
            if (j >= m) break;
            if (lines[j]) {
#pragma unroll
                for (int l = 0; l < LPU; l++) v[j][l] = relaxed(lines[j] + u * LPU + l);
            } else {
#pragma unroll
                for (int t = 0; t < PER; t++)
                    if (u * PER + t < hi) plain[j][t] = xs[j][u * PER + t];
            }
        }
        S acc[PER];
#pragma unroll
        for (int j = 0; j < FOLD; j++) {
            if (j >= m) break;
            S x[PER];
            if (lines[j]) {
#pragma unroll
                for (int l = 0; l < LPU; l++)
                    if (!line_ready(c, lines[j] + u * LPU + l, &v[j][l], flag, step, peers[j]))
                        return false;
                u64 bits = (v[j][0] & 0xffffffffULL);
                if (LPU == 2) bits |= v[j][LPU - 1] << 32;
#pragma unroll
                for (int t = 0; t < PER; t++) x[t] = from_bits(bits >> (8 * sizeof(S) * t));
            } else {
#pragma unroll
                for (int t = 0; t < PER; t++) x[t] = plain[j][t];
            }
#pragma unroll
            for (int t = 0; t < PER; t++) acc[t] = j == 0 ? x[t] : combine(acc[t], x[t]);
        }
        u64 bits = 0;
#pragma unroll
        for (int t = 0; t < PER; t++)
            if (u * PER + t < hi) {
                dst[u * PER + t] = acc[t];
                bits |= to_bits(acc[t]) << (8 * sizeof(S) * t);
            }
        for (int o = 0; o < k; o++)       /* sent on in lines (SENDS_ON), as send_lines */
#pragma unroll
            for (int l = 0; l < LPU; l++)
                asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(outs[o] + u * LPU + l),
                             "l"(((u64)flag << 32) | ((bits >> (32 * l)) & 0xffffffffULL))
                             : "memory");
    }
    return true;
}

/* A REDUCE_N row's operands: xs[j] plain memory, or (lines[j], peers[j]) a message in
   lines in this call's inbox of lines. True when some operand is in lines. */
__device__ __forceinline__ bool chain_operands(const i64* r, char* const* bases,
                                               const char* lines_inbox, int itemsize,
                                               int rank, const S** xs, const u64** lines,
                                               int* peers) {
    const int m = (int)(r[COL_REDUCE_N_OPERANDS] & (SENDS_ON - 1));
    bool polled = false;
    for (int j = 0; j < m; j++) {
        const i64 x = r[COL_REDUCE_N_OPERAND + j];
        lines[j] = nullptr;
        xs[j] = nullptr;
        peers[j] = rank;
        if (x >= 0) {
            xs[j] = (const S*)bases[x & ((1 << BUFFER_BITS) - 1)] + (x >> BUFFER_BITS);
        } else {
            const i64 w = -1 - x;
            lines[j] = (const u64*)(lines_inbox + (w >> LINE_PEER_BITS) * itemsize);
            peers[j] = (int)(w & ((1 << LINE_PEER_BITS) - 1));
            polled = true;
        }
    }
    return polled;
}

/* This worker's share of ``count`` elements at ``src`` into the peer's inbox at ``dst`` as
   flagged lines, moved by threads tid of bd. */
__device__ void send_lines(u64* dst, const S* src, i64 count, u64 flag, i64 align, i64 tid,
                           i64 bd) {
    i64 lo, hi;
    share(count, align, &lo, &hi);
    const i64 u_hi = (hi + PER - 1) / PER;
    for (i64 u0 = lo / PER + tid; u0 < u_hi; u0 += UNROLL * bd) {
        u64 bits[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 u = u0 + k * bd;
            bits[k] = 0;
            if (u >= u_hi) continue;
#pragma unroll
            for (int j = 0; j < PER; j++) {
                const i64 e = u * PER + j;
                if (e >= hi) break;
                bits[k] |= to_bits(src[e]) << (8 * sizeof(S) * j);
            }
        }
#pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            const i64 u = u0 + k * bd;
            if (u >= u_hi) break;
#pragma unroll
            for (int l = 0; l < LPU; l++) {
                const u64 data = (bits[k] >> (32 * l)) & 0xffffffffULL;
                asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(dst + u * LPU + l),
                             "l"(flag | data) : "memory");
            }
        }
    }
}

/* Whether every peer of the SEND_LL rows [i, j) has started the previous call (then this
   call's half of its inbox of lines is free; ``seen``: the epochs as this call started,
   which almost always say so already); thread t waits for row i + t. False when this call
   must stop. */
__device__ bool lines_free(const Ctx& c, const i64* code, int i, int j, const u64* seen,
                           u64 call, int step) {
    bool ok = true;
    for (int t = threadIdx.x; t < j - i; t += blockDim.x) {
        const i64* q = code + (i64)(i + t) * WIDTH;
        if (call >= 2 && seen[q[COL_SEND_LL_PEER]] < (call << STEP_BITS) &&
            !wait_for(c, c.flags + SEEN_WORDS + q[COL_SEND_LL_PEER], call << STEP_BITS, step,
                      (int)q[COL_SEND_LL_PEER], false)) ok = false;
    }
    return ok;
}

extern "C" __global__ void __launch_bounds__(THREADS)
run_program(const i64* code_at, int n, const i64* tallies, char* in, char* out, char* scratch,
            char* caller_out, const u64* peer_data_at, const u64* peer_flags_at, u64 scratch_at,
            u64* flags, int* error, int rank, int size, int itemsize, u64 timeout_ns,
            const u64* peer_inbox_at, u64 inbox_half, const u64* peer_lines_at,
            u64 lines_half, u64 place, const u64* peer_heaps) {
    MARK_ENTRY
    __shared__ int stop;
    __shared__ u64 deadline, call_number;
    /* The program and the peers' addresses copied into shared memory by every thread at
       once: one memory latency at the start instead of one per first use on the way. */
    __shared__ i64 program[SHARED_ROWS * WIDTH];
    __shared__ u64 peer_data[MAX_RANKS], peer_flags[MAX_RANKS], peer_inbox[MAX_RANKS];
    __shared__ u64 peer_lines[MAX_RANKS];    /* the inboxes of messages in lines */
    const i64* code = n <= SHARED_ROWS ? program : code_at;
    if (n <= SHARED_ROWS)
        for (int t = threadIdx.x; t < n * WIDTH; t += blockDim.x) program[t] = code_at[t];
    /* message numbers so far, per peer, and this call's tallies (moved on at the end) */
    __shared__ u64 sent[MAX_RANKS], received[MAX_RANKS];
    __shared__ u64 sends[MAX_RANKS], recvs[MAX_RANKS];
    __shared__ int last_out;
    /* a batch of copies (a step's messages, MAX_BATCH at a time: pushed.SENDS_ON_MAX) */
    __shared__ char* batch_dst[MAX_BATCH];
    __shared__ const char* batch_src[MAX_BATCH];
    __shared__ i64 batch_n[MAX_BATCH];
    if (threadIdx.x < size) {
        const int t = threadIdx.x;
        peer_data[t] = peer_data_at[t];
        peer_flags[t] = peer_flags_at[t];
        peer_inbox[t] = peer_inbox_at[t];
        peer_lines[t] = peer_lines_at[t];
        sends[t] = (u64)tallies[t];
        recvs[t] = (u64)tallies[size + t];
    }
    /* Up to here this kernel reads only what no kernel writes (the program, the addresses,
       the tallies), so it may start while the previous kernel on its stream finishes
       (programmatic dependent launch: the lane's launches, COLLECTIVES_PEER_OVERLAP); from here
       on it reads what that kernel wrote (the counters, the call number), once that kernel
       has completed and its writes are visible. Launched plainly, this returns at once. */
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (threadIdx.x < size) {
        sent[threadIdx.x] = flags[SENT_WORDS + threadIdx.x];
        received[threadIdx.x] = flags[RECEIVED_WORDS + threadIdx.x];
    }
    /* the peers' epochs as this call starts: an eager send whose slot half is already free
       then skips its wait (almost always: the peer started the previous call long ago) */
    __shared__ u64 seen[MAX_RANKS];
    /* the peers this block has synchronized with in this call (an acquire of their epoch of
       this call, or of a message they sent in it): what they published before it (where
       their output is, whether they take eager messages into it: EPOCH) is visible here,
       so a send that needs it waits no more */
    __shared__ bool synced[MAX_RANKS];
    /* whether a peer takes eager messages into its output directly in this call (its
       DIRECT word), read once it is synced (-1: not read yet): then it no longer changes */
    __shared__ signed char direct_of[MAX_RANKS];
    if (threadIdx.x < size) {
        seen[threadIdx.x] = relaxed(flags + SEEN_WORDS + threadIdx.x);
        synced[threadIdx.x] = false;
        direct_of[threadIdx.x] = -1;
    }
    if (threadIdx.x == 0) start_call(flags, error, timeout_ns, &deadline, &call_number, &stop);
    __syncthreads();
    Ctx c = {flags, peer_flags, error, rank, size, deadline};
    const u64 call = call_number;
    MARK_CALL(call, 1)
    scrub_lines(c, (char*)peer_lines[rank], lines_half, call, &stop);
    /* the buffers a row names, in order: INPUT, OUTPUT, SCRATCH, CALLER_OUTPUT; the last,
       INBOX, this call's half of the eager inbox, only as a REDUCE_N operand */
    char* bases[BUFFERS] = {in, out, scratch, caller_out,
                      (char*)peer_inbox[rank] + (call & 1) * inbox_half};
    const i64 align = 16 / itemsize > 0 ? 16 / itemsize : 1;
    for (int i = 0; i < n && !stop; i++) {
        const i64* r = code + (i64)i * WIDTH;
        const int step = (int)r[COL_STEP];
        MARK_OP(i)
        switch ((int)r[COL_KIND]) {
        case OP_BARRIER:   /* every block (a grid barrier) or this block's threads */
            if (r[COL_BARRIER_GRID]) grid_barrier(c, step, &stop);
            else __syncthreads();
            break;
        case OP_EPOCH:   /* into every rank's SEEN word for this rank, so waits poll locally.
                     The call's first, before anything (COL_EPOCH_FIRST): nothing of this
                     call to order before it (the previous kernel is complete), a plain
                     store; but where this rank takes eager messages into its output
                     directly (COL_EPOCH_DIRECT), it says so first and the epoch is a
                     release. Then every block says so (the same words, the same values)
                     before its first send: a peer that took one of its messages knows it
                     without the epoch (``synced``). */
            if ((blockIdx.x == 0 || r[COL_EPOCH_DIRECT]) && threadIdx.x < size) {
                u64* seen = (u64*)peer_flags[threadIdx.x] + SEEN_WORDS + rank;
                const u64 epoch = ((call + 1) << STEP_BITS) | (u64)r[COL_EPOCH_PUBLISHED];
                /* where this call's receives into output land, before the epoch: a
                   sender that sees the epoch sees it */
                asm volatile("st.volatile.global.u64 [%0], %1;"
                             :: "l"((u64*)peer_flags[threadIdx.x] + PLACE_WORDS + rank),
                                "l"(place) : "memory");
                if (r[COL_EPOCH_DIRECT])
                    asm volatile("st.volatile.global.u64 [%0], %1;"
                                 :: "l"((u64*)peer_flags[threadIdx.x] + DIRECT_WORDS + rank),
                                    "l"(call + 1) : "memory");
                if (blockIdx.x == 0 && r[COL_EPOCH_FIRST] && !r[COL_EPOCH_DIRECT])
                    asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(seen), "l"(epoch)
                                 : "memory");
                else if (blockIdx.x == 0)
                    release(seen, epoch);
            }
            break;
        case OP_PUSH:     /* rendezvous */
        case OP_SEND: {   /* eager */
            /* The step's consecutive sends as one batch: their waits in parallel (thread t
               for message t), every message's share copied, then one release each, in
               parallel: a step pays one flag latency, not one per message. The step's
               COPYs right after them (``fused``; no barrier between, so pushed.py found them
               touching nothing the sends read) are copied in the same batch, so
               a rank's own block moves beside its messages instead of adding its copy
               after them (a direct all_gather's own block is as large as a message). */
            const int kind = (int)r[COL_KIND];
            const int j = batch_end(code, n, i), m = j - i;
            const i64* chain = code + (i64)(i - 1) * WIDTH;
            const bool reduced = i > 0 && chain[COL_KIND] == OP_REDUCE_N &&
                                 (chain[COL_REDUCE_N_OPERANDS] & SENDS_ON);
            int fused = 0;
            while (!reduced && j + fused < n &&
                   code[(i64)(j + fused) * WIDTH + COL_KIND] == OP_COPY &&
                   code[(i64)(j + fused) * WIDTH + COL_STEP] == step &&
                   (m - 1) % MAX_BATCH + 1 + fused < MAX_BATCH) fused++;
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                const int peer = (int)q[COL_SENDS_PEER];
                /* rendezvous: the receive is posted; eager: the slot's half is free (the
                   receiver started the previous call, so it is done with the one before),
                   or, for a message that may land in the receiver's output directly
                   (COL_SEND_OUTPUT_AT >= 0), the receiver started this call (then its
                   DIRECT word says whether it does), unless this block synchronized with it
                   in this call */
                const bool posted = kind == OP_PUSH,
                           here = kind == OP_SEND && q[COL_SEND_OUTPUT_AT] >= 0;
                const u64 target = posted
                                 ? (((call + 1) << STEP_BITS) | (u64)q[COL_PUSH_THEIR_STEP])
                                 : here ? (call + 1) << STEP_BITS
                                 : (call >= 2 ? call << STEP_BITS : 0);
                const bool wait = posted || (here ? !synced[peer] : seen[peer] < target);
                if (target && wait) {
                    if (!wait_for(c, flags + SEEN_WORDS + peer, target, step, peer,
                                  posted || here))
                        stop = 1;
                    else if (posted || here)
                        synced[peer] = true;
                }
            }
            __syncthreads();
            if (stop) break;
            for (int k0 = i; k0 < j; k0 += MAX_BATCH) {
                const int h = j - k0 < MAX_BATCH ? j - k0 : MAX_BATCH;
                const int extra = k0 + h == j ? fused : 0;   /* the COPYs, with the last */
                for (int t = threadIdx.x; t < extra; t += blockDim.x) {
                    const i64* q = code + (i64)(j + t) * WIDTH;
                    i64 lo, hi;
                    share(q[COL_COPY_COUNT], align, &lo, &hi);
                    batch_dst[h + t] = bases[q[COL_COPY_DST_BUFFER]]
                                       + (q[COL_COPY_DST_OFFSET] + lo) * itemsize;
                    batch_src[h + t] = bases[q[COL_COPY_SRC_BUFFER]]
                                       + (q[COL_COPY_SRC_OFFSET] + lo) * itemsize;
                    batch_n[h + t] = (hi - lo) * itemsize;
                }
                for (int t = threadIdx.x; t < h; t += blockDim.x) {
                    const i64* q = code + (i64)(k0 + t) * WIDTH;
                    const int peer = (int)q[COL_SENDS_PEER];
                    const i64 count = kind == OP_PUSH ? q[COL_PUSH_COUNT] : q[COL_SEND_COUNT];
                    i64 lo, hi;
                    share(count, align, &lo, &hi);
                    batch_src[t] = bases[q[COL_SENDS_SRC_BUFFER]]
                                   + (q[COL_SENDS_SRC_OFFSET] + lo) * itemsize;
                    bool direct = false;
                    if (kind == OP_SEND && q[COL_SEND_OUTPUT_AT] >= 0) {   /* (synced above) */
                        if (direct_of[peer] < 0)
                            direct_of[peer] = relaxed(flags + DIRECT_WORDS + peer) == call + 1;
                        direct = direct_of[peer] > 0;
                    }
                    batch_dst[t] = kind == OP_PUSH
                        ? (q[COL_PUSH_DST_BUFFER] == OUTPUT
                               ? output_of(flags, peer_data, peer_heaps, peer, size)
                               : (char*)peer_data[peer] + scratch_at)
                          + (q[COL_PUSH_DST_OFFSET] + lo) * itemsize
                        : direct
                        ? output_of(flags, peer_data, peer_heaps, peer, size)
                          + (q[COL_SEND_OUTPUT_AT] + lo) * itemsize
                        : (char*)peer_inbox[peer] + (call & 1) * inbox_half
                          + (q[COL_SEND_SLOT] + lo) * itemsize;
                    batch_n[t] = (hi - lo) * itemsize;
                }
                __syncthreads();
                /* the chain just before, deferred to here (SENDS_ON: at most one batch of
                   these sends, all of its result), or a plain copy of each message */
                if (reduced) {
                    const S* xs[FOLD];        /* (no operand in lines: pushed._send_on) */
                    const u64* in_lines[FOLD];
                    int peers[FOLD];
                    chain_operands(chain, bases, nullptr, itemsize, rank, xs, in_lines, peers);
                    i64 lo, hi;
                    share(chain[COL_REDUCE_N_COUNT], align, &lo, &hi);
                    reduce_many((S*)bases[chain[COL_REDUCE_N_DST_BUFFER]]
                                + chain[COL_REDUCE_N_DST_OFFSET], xs,
                                (int)(chain[COL_REDUCE_N_OPERANDS] & (SENDS_ON - 1)), lo, hi,
                                batch_dst, h);
                } else {
                    copy_batch(batch_dst, batch_src, batch_n, h + extra);
                }
                /* the block's stores (and its reads of the descriptors) before what
                   follows: one release per message (cumulative over the stores the barrier
                   ordered before it) */
                __syncthreads();
            }
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                const int peer = (int)q[COL_SENDS_PEER];
                /* one word per sender and block: of several messages to one peer (a
                   bidirectional ring on 2 ranks) only the last stores its number, or the
                   stores race and a lower number may land last */
                bool last = true;
                for (int u = t + 1; u < m; u++)
                    if (code[(i64)(i + u) * WIDTH + COL_SENDS_PEER] == peer) last = false;
                if (!last) continue;
                const u64 number = kind == OP_PUSH ? (u64)q[COL_PUSH_MESSAGE]
                                                   : (u64)q[COL_SEND_MESSAGE];
                u64* word = (u64*)peer_flags[peer] + DELIVERED_WORDS
                            + (u64)rank * MAX_BLOCKS + blockIdx.x;
                release(word, sent[peer] + number + 1);
            }
            i = j + fused - 1;
            break;
        }
        case OP_ARRIVE:   /* rendezvous: the sender's block of the same share delivered it */
        case OP_TAKE: {   /* eager: the same, then this block's share copied out of the slot */
            const int kind = (int)r[COL_KIND];
            const int j = batch_end(code, n, i), m = j - i;
            for (int t = threadIdx.x; t < m; t += blockDim.x) {
                const i64* q = code + (i64)(i + t) * WIDTH;
                const int peer = (int)q[COL_RECEIVES_PEER];
                const u64 target = received[peer] + (u64)q[COL_RECEIVES_MESSAGE] + 1;
                const u64* word = flags + DELIVERED_WORDS + (u64)peer * MAX_BLOCKS + blockIdx.x;
                if (!wait_for(c, word, target, step, peer)) stop = 1;
                else synced[peer] = true;
            }
            __syncthreads();
            if (stop) break;
            for (int k0 = i; kind == OP_TAKE && k0 < j; k0 += MAX_BATCH) {
                const int h = j - k0 < MAX_BATCH ? j - k0 : MAX_BATCH;
                for (int t = threadIdx.x; t < h; t += blockDim.x) {
                    const i64* q = code + (i64)(k0 + t) * WIDTH;
                    i64 lo, hi;
                    share(q[COL_TAKE_COUNT], align, &lo, &hi);
                    batch_src[t] = bases[INBOX] + (q[COL_TAKE_SLOT] + lo) * itemsize;
                    batch_dst[t] = bases[q[COL_TAKE_DST_BUFFER]]
                                   + (q[COL_TAKE_DST_OFFSET] + lo) * itemsize;
                    /* COL_TAKE_DIRECT: already there */
                    batch_n[t] = q[COL_TAKE_DIRECT] ? 0 : (hi - lo) * itemsize;
                }
                __syncthreads();
                copy_batch(batch_dst, batch_src, batch_n, h);
                __syncthreads();    /* every thread done with the descriptors */
            }
            i = j - 1;
            break;
        }
        case OP_SEND_LL: { /* 4 data bytes and the call's flag in each 8-byte line; the
                     step's messages at once, one warp group each (more than warps: one after
                     another, every thread on each) */
            const int j = batch_end(code, n, i), m = j - i;
            if (!lines_free(c, code, i, j, seen, call, step)) stop = 1;
            __syncthreads();
            if (stop) break;
            i64 tid = threadIdx.x, nt = blockDim.x;
            int k = i, end = j;
            if (m > 1 && m <= (int)blockDim.x / 32) {
                k = i + warp_group(m, &tid, &nt);
                end = k + 1;
            }
            for (; k < end; k++) {
                const i64* q = code + (i64)k * WIDTH;
                send_lines((u64*)((char*)peer_lines[q[COL_SEND_LL_PEER]]
                                  + (call & 1) * lines_half + q[COL_SEND_LL_SLOT] * itemsize),
                           (const S*)bases[q[COL_SEND_LL_SRC_BUFFER]]
                           + q[COL_SEND_LL_SRC_OFFSET], q[COL_SEND_LL_COUNT],
                           (u64)line_flag(call) << 32, align, tid, nt);
            }
            i = j - 1;
            break;
        }
        case OP_TAKE_LL:   /* each line waited for by the thread that copies it; the step's
                     messages at once, one warp group each (more than warps: one by one) */
        case OP_REDUCE_LL: { /* each line waited for and reduced by the thread that reads it */
            i64 tid = threadIdx.x, nt = blockDim.x;
            if (r[COL_KIND] == OP_TAKE_LL) {
                const int j = batch_end(code, n, i), m = j - i;
                if (m > 1 && m <= (int)blockDim.x / 32) {
                    r = code + (i64)(i + warp_group(m, &tid, &nt)) * WIDTH;
                    i = j - 1;
                }
            }
            const i64 slot = r[COL_KIND] == OP_TAKE_LL ? r[COL_TAKE_LL_SLOT]
                                                       : r[COL_REDUCE_LL_SLOT];
            const u64* src = (const u64*)((const char*)peer_lines[rank] + (call & 1) * lines_half
                                          + slot * itemsize);
            const bool ok = r[COL_KIND] == OP_TAKE_LL
                ? take_lines(c, src, r[COL_TAKE_LL_COUNT],
                             (S*)bases[r[COL_TAKE_LL_DST_BUFFER]] + r[COL_TAKE_LL_DST_OFFSET],
                             nullptr, nullptr, false,
                             line_flag(call), align, step, (int)r[COL_TAKE_LL_PEER], tid, nt)
                : take_lines(c, src, r[COL_REDUCE_LL_COUNT],
                             (S*)bases[r[COL_REDUCE_LL_DST_BUFFER]] + r[COL_REDUCE_LL_DST_OFFSET],
                             (const S*)bases[r[COL_REDUCE_LL_OTHER_BUFFER]]
                             + r[COL_REDUCE_LL_OTHER_OFFSET],
                             r[COL_REDUCE_LL_KEEP_BUFFER] < 0 ? nullptr
                             : (S*)bases[r[COL_REDUCE_LL_KEEP_BUFFER]]
                               + r[COL_REDUCE_LL_KEEP_OFFSET],
                             r[COL_REDUCE_LL_FIRST] != 0,
                             line_flag(call), align, step, (int)r[COL_REDUCE_LL_PEER], tid, nt);
            if (!ok) stop = 1;
            break;
        }
        case OP_TAKE_REDUCE: { /* the sender's block of this share delivered it; reduced
                                  straight out of the slot */
            const int peer = (int)r[COL_TAKE_REDUCE_PEER];
            if (threadIdx.x == 0) {
                const u64 target = received[peer] + (u64)r[COL_TAKE_REDUCE_MESSAGE] + 1;
                const u64* word = flags + DELIVERED_WORDS + (u64)peer * MAX_BLOCKS + blockIdx.x;
                if (!wait_for(c, word, target, step, peer)) stop = 1;
                else synced[peer] = true;
            }
            __syncthreads();
            if (stop) break;
            i64 lo, hi;
            share(r[COL_TAKE_REDUCE_COUNT], align, &lo, &hi);
            const S* x = (const S*)((const char*)peer_inbox[rank] + (call & 1) * inbox_half
                                    + r[COL_TAKE_REDUCE_SLOT] * itemsize);
            const S* other = (const S*)bases[r[COL_TAKE_REDUCE_OTHER_BUFFER]]
                             + r[COL_TAKE_REDUCE_OTHER_OFFSET];
            const bool first = r[COL_TAKE_REDUCE_FIRST] != 0;
            reduce_share((S*)bases[r[COL_TAKE_REDUCE_DST_BUFFER]]
                         + r[COL_TAKE_REDUCE_DST_OFFSET], first ? x : other, first ? other : x,
                         lo, hi);
            /* the message kept where the plan reads it again */
            if (r[COL_TAKE_REDUCE_KEEP_BUFFER] >= 0)
                copy_bytes(bases[r[COL_TAKE_REDUCE_KEEP_BUFFER]]
                           + (r[COL_TAKE_REDUCE_KEEP_OFFSET] + lo) * itemsize,
                           (const char*)(x + lo), (hi - lo) * itemsize);
            break;
        }
        case OP_COPY: {
            i64 lo, hi;
            share(r[COL_COPY_COUNT], align, &lo, &hi);
            if (hi > lo)
                copy_bytes(bases[r[COL_COPY_DST_BUFFER]] + (r[COL_COPY_DST_OFFSET] + lo) * itemsize,
                           bases[r[COL_COPY_SRC_BUFFER]] + (r[COL_COPY_SRC_OFFSET] + lo) * itemsize,
                           (hi - lo) * itemsize);
            break;
        }
        case OP_REDUCE_N: { /* a chain of reductions in one pass; an operand >= 0 is
                      offset << BUFFER_BITS | buffer (an eager message's slot in the inbox,
                      its ARRIVE before), < 0 a message in lines,
                      -1 - (slot << LINE_PEER_BITS | peer). SENDS_ON: the sends after it
                      send its results on in its pass: plain SENDs and PUSHes run it after
                      their waits (reduce_many with outs); SEND_LLs are run here, their
                      slots' waits first */
            const bool on = (r[COL_REDUCE_N_OPERANDS] & SENDS_ON) != 0;
            if (on && code[(i64)(i + 1) * WIDTH + COL_KIND] != OP_SEND_LL) break;
            const int j = on ? batch_end(code, n, i + 1) : i + 1, k = j - i - 1;
            if (k) {
                if (!lines_free(c, code, i + 1, j, seen, call, step)) stop = 1;
                for (int t = threadIdx.x; t < k; t += blockDim.x) {
                    const i64* q = code + (i64)(i + 1 + t) * WIDTH;
                    batch_dst[t] = (char*)peer_lines[q[COL_SEND_LL_PEER]] + (call & 1) * lines_half
                                   + q[COL_SEND_LL_SLOT] * itemsize;
                }
                __syncthreads();
                if (stop) break;
            }
            const S* xs[FOLD];
            const u64* in_lines[FOLD];
            int peers[FOLD];
            const int m = (int)(r[COL_REDUCE_N_OPERANDS] & (SENDS_ON - 1));
            if (chain_operands(r, bases, (const char*)peer_lines[rank] + (call & 1) * lines_half,
                               itemsize, rank, xs, in_lines, peers) || k) {
                if (!reduce_lines(c, (S*)bases[r[COL_REDUCE_N_DST_BUFFER]]
                                  + r[COL_REDUCE_N_DST_OFFSET], xs, in_lines, peers, m,
                                  r[COL_REDUCE_N_COUNT],
                                  line_flag(call), align, step, (u64* const*)batch_dst, k))
                    stop = 1;
            } else {
                i64 lo, hi;
                share(r[COL_REDUCE_N_COUNT], align, &lo, &hi);
                reduce_many((S*)bases[r[COL_REDUCE_N_DST_BUFFER]] + r[COL_REDUCE_N_DST_OFFSET],
                            xs, m, lo, hi);
            }
            if (k) {
                __syncthreads();      /* every thread done with the descriptors */
                i = j - 1;
            }
            break;
        }
        case OP_REDUCE: {
            i64 lo, hi;
            share(r[COL_REDUCE_COUNT], align, &lo, &hi);
            reduce_share((S*)bases[r[COL_REDUCE_DST_BUFFER]] + r[COL_REDUCE_DST_OFFSET],
                         (const S*)bases[r[COL_REDUCE_A_BUFFER]] + r[COL_REDUCE_A_OFFSET],
                         (const S*)bases[r[COL_REDUCE_B_BUFFER]] + r[COL_REDUCE_B_OFFSET], lo, hi);
            break;
        }
        }
    }
    /* The call's end: the last block to finish moves the message tallies and the call
       number on (the others have read them for the last time; the next kernel on this
       stream starts after all of them). No block waits for another. */
    MARK_OP(n)
    __syncthreads();
    MARK_OP(n + 1)
#if __CUDA_ARCH__ >= 900
    /* the next call's kernel may start its prologue (it waits above for this one's end) */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    MARK_CALL(call, 2)
    if (stop) return;
    end_call(flags, call, sent, received, sends, recvs, size, &last_out);
    if (last_out) { MARK_EXIT(call) }
}

#ifdef WORLD
/* two_shot all_reduce in place on symmetric memory (``cuda_peer.in_place_kernel``, one build
   per world size WORLD): where every rank's buffer lies in memory every peer has mapped, each
   rank reads its block of the vector where it lies on every peer, reduces it in rank order
   and stores the result back on every peer, in one pass; the program's two steps of pushes
   into inboxes, and its middle wait, are gone. The world size fixed at build time lets each
   thread keep all its peers' loads in flight at once with few registers (reads in place
   inside the interpreter, with the world size unknown at build time, are slower:
   BENCHMARKS.md §6).

   The same words as the interpreter's, so the two alternate on one group: the call's number
   and epochs; one message each way per peer (the tallies move on by one, the delivered
   words of this kernel's blocks carry it). Order: a rank reads a peer's buffer after that
   peer's epoch of this call (its input is in place: its stream reached the call; the epoch
   pushed.in_place_epoch, which no program's send takes for its receiver's) and says so,
   with its stores, in the delivered word of its block; a rank leaves after the same
   block of every peer has (its block of the vector read and written everywhere). Every
   rank must run this kernel for the call: each says so (MODE) before its epoch, and a rank
   whose peer did not (its buffer not symmetric, or the call out of place) fails the call on
   every rank with ERROR_CALLED_OTHERWISE before it touches any peer's memory.

   Parameters as run_program's (one launch path on the host); ``code_at``: the element
   count (IN_PLACE_AT_COUNT); ``caller_out``: this rank's buffer at ``place``. */
#define IN_PLACE_UNROLL 2

/* The call's start in a kernel of a fixed world size, once the previous kernel on the stream
   is complete (programmatic dependent launch: before this, a kernel reads only what no
   kernel writes): this rank's message counters per peer, then the call's number, deadline
   and stop (start_call), seen by every thread. */
__device__ __forceinline__ void world_call_start(const u64* flags, int* error, u64 timeout_ns,
                                                 u64* sent, u64* received, u64* deadline,
                                                 u64* call, int* stop) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    if (threadIdx.x < WORLD) {
        sent[threadIdx.x] = flags[SENT_WORDS + threadIdx.x];
        received[threadIdx.x] = flags[RECEIVED_WORDS + threadIdx.x];
    }
    if (threadIdx.x == 0) start_call(flags, error, timeout_ns, deadline, call, stop);
    __syncthreads();
}

/* dst[m][e] = src[0][e] op src[1][e] op ... op src[WORLD - 1][e], left to right, for every m
   < M and e in [lo, hi), threads tid of nt: where every pointer is 16-byte aligned at lo, each
   thread holds a 16-byte load of every source at once (IN_PLACE_UNROLL of them) before it
   combines and stores; otherwise element by element. A destination may be a source (each
   element is read before it is written, by the same thread). */
template <int M>
__device__ __forceinline__ void fold_world(const S* const* src, S* const* dst, i64 lo, i64 hi,
                                           i64 tid, i64 nt) {
    bool aligned = true;
#pragma unroll
    for (int q = 0; q < WORLD; q++) aligned = aligned && (((u64)(src[q] + lo)) & 15) == 0;
#pragma unroll
    for (int m = 0; m < M; m++) aligned = aligned && (((u64)(dst[m] + lo)) & 15) == 0;
    i64 done = lo;
    if (aligned && hi > lo) {
        const i64 v = (hi - lo) / VEC;
        for (i64 i = tid; i < v; i += IN_PLACE_UNROLL * nt) {
            uint4 x[IN_PLACE_UNROLL][WORLD];
#pragma unroll
            for (int u = 0; u < IN_PLACE_UNROLL; u++)
#pragma unroll
                for (int q = 0; q < WORLD; q++)
                    if (i + u * nt < v)
                        x[u][q] = __ldcg((const uint4*)(src[q] + lo) + i + u * nt);
#pragma unroll
            for (int u = 0; u < IN_PLACE_UNROLL; u++) {
                if (i + u * nt >= v) break;
#pragma unroll
                for (int q = 1; q < WORLD; q++) fold_vector(&x[u][0], &x[u][q]);
#pragma unroll
                for (int m = 0; m < M; m++) ((uint4*)(dst[m] + lo))[i + u * nt] = x[u][0];
            }
        }
        done = lo + v * VEC;
    }
    for (i64 e = done + tid; e < hi; e += nt) {
        S acc = src[0][e];
#pragma unroll
        for (int q = 1; q < WORLD; q++) acc = combine(acc, src[q][e]);
#pragma unroll
        for (int m = 0; m < M; m++) dst[m][e] = acc;
    }
}

extern "C" __global__ void __launch_bounds__(THREADS)
two_shot_in_place(const i64* code_at, int n, const i64* tallies, char* in, char* out,
                  char* scratch, char* caller_out, const u64* peer_data_at,
                  const u64* peer_flags_at, u64 scratch_at, u64* flags, int* error, int rank,
                  int size, int itemsize, u64 timeout_ns, const u64* peer_inbox_at,
                  u64 inbox_half, const u64* peer_lines_at, u64 lines_half, u64 place,
                  const u64* peer_heaps) {
    __shared__ int stop, last_out;
    __shared__ u64 deadline, call_number;
    __shared__ i64 count;
    __shared__ u64 peer_flags[WORLD], sent[WORLD], received[WORLD], ones[WORLD];
    __shared__ S* base[WORLD];
    const int t = threadIdx.x;
    if (t < WORLD) {
        peer_flags[t] = peer_flags_at[t];
        ones[t] = t != rank;
    }
    if (t == 0) count = code_at[IN_PLACE_AT_COUNT];
    world_call_start(flags, error, timeout_ns, sent, received, &deadline, &call_number, &stop);
    Ctx c = {flags, peer_flags, error, rank, WORLD, deadline};
    const u64 call = call_number;
    scrub_lines(c, (char*)peer_lines_at[rank], lines_half, call, &stop);
    /* pushed.in_place_epoch: a peer running the program for this call passes this wait (and
       fails the MODE check) while its rendezvous sends, which wait for this rank's epoch of
       their receive's step, stay out of this rank's buffer */
    const u64 epoch = ((call + 1) << STEP_BITS) - 1;
    if (blockIdx.x == 0 && t < WORLD && !stop) {
        u64* theirs = (u64*)peer_flags[t];
        asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(theirs + PLACE_WORDS + rank),
                     "l"(place) : "memory");
        asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(theirs + MODE_WORDS + rank),
                     "l"(call + 1) : "memory");
        release(theirs + SEEN_WORDS + rank, epoch);
    }
    if (t < WORLD && !stop) {
        if (t == rank) {
            base[t] = (S*)caller_out;
        } else if (!wait_for(c, flags + SEEN_WORDS + t, epoch, 0, t)) {
            stop = 1;
        } else if (relaxed(flags + MODE_WORDS + t) != call + 1) {
            fail(c, ERROR_CALLED_OTHERWISE, 0, t);
            stop = 1;
        } else {
            base[t] = (S*)symmetric_at(relaxed(flags + PLACE_WORDS + t), peer_heaps, t, WORLD);
        }
    }
    __syncthreads();
    if (!stop) {
        /* this rank's block of the vector: 16-byte units shared out alike on every rank;
           reduced and stored back on every rank, the grid's threads each a part */
        const i64 units = (count + VEC - 1) / VEC;
        i64 lo = units * rank / WORLD * VEC, hi = units * (rank + 1) / WORLD * VEC;
        if (lo > count) lo = count;
        if (hi > count) hi = count;
        fold_world<WORLD>(base, base, lo, hi, (i64)blockIdx.x * blockDim.x + t,
                          (i64)gridDim.x * blockDim.x);
    }
    /* this block's part read and written on every peer: said to each; then the same block
       of every peer said so */
    __syncthreads();
    if (t < WORLD && t != rank && !stop) {
        release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS + blockIdx.x,
                sent[t] + 1);
        if (!wait_for(c, flags + DELIVERED_WORDS + (u64)t * MAX_BLOCKS + blockIdx.x,
                      received[t] + 1, 1, t))
            stop = 1;
    }
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (stop) return;
    end_call(flags, call, sent, received, ones, ones, WORLD, &last_out);
}
/* The waits of pipelined_reduce_scatter and copies_around: until thread blocks [first,
   first + of) of every peer have said message ``m`` of this call (their delivered words here
   at received + m), the block's threads sharing the words out; false once the call stops. */
__device__ bool peers_said(const Ctx& c, const u64* received, i64 first, i64 of, u64 m,
                           int step) {
    for (i64 w = threadIdx.x; w < (WORLD - 1) * of; w += blockDim.x) {
        const int i = (int)(w / of), q = i < c.rank ? i : i + 1;
        if (!wait_for(c, c.flags + DELIVERED_WORDS + (u64)q * MAX_BLOCKS + first + w % of,
                      received[q] + m, step, q))
            return false;
    }
    return true;
}
/* direct reduce_scatter of large blocks with its pushes and reductions overlapped
   (``cuda_peer.pipelined_kernel``, one build per world size WORLD). The program sends every
   block of the input to its rank, waits, then reduces the p copies of its own block: the
   pass over this GPU's memory follows the pushes over NVLink instead of running beside
   them, and adds a good fraction of their time to a large call (BENCHMARKS.md §6). Here
   each rank's block is cut into ``chunks`` alike on every rank; thread blocks [0, pushers)
   push chunk after chunk of every peer's block into that peer's scratch slot for this rank,
   each a share of every chunk, then say in its delivered word for the peer how many chunks
   it has pushed; the other blocks reduce chunk k, each a share, as soon as every pusher of
   every peer has said it pushed k, in rank order as the program does (bitwise its result).

   The interpreter's words, so the two alternate on one group: the call's number and epoch
   (pushed.in_place_epoch), ``chunks`` messages each way per peer (message k of pusher j in
   delivered word j; the tallies move on by ``chunks``). A rank pushes into a peer's scratch
   after that peer's epoch of this call (it finished its previous call, whose reductions read
   the slot). The slots are the program's (direct.reduce_scatter: peers in rank order, this
   rank skipped), so the staging memory is the program's.

   A two_shot all_reduce of p equal blocks runs here too (PIPELINED_ALL_REDUCE, its ``gather``): the
   reducers then store each chunk of the rank's block both in its output and in the rank's
   staging memory after the p - 1 slots, and say so in their own delivered words (message
   ``chunks`` + k + 1).
   Once done pushing or reducing, every block reads its share of chunk after chunk of every
   peer's reduced block straight into this rank's output (the caller's memory: nothing
   staged, where the program's pushes land in staging memory and are copied out), each
   chunk as soon as every reducer of that peer has said it. Each block then says it has
   read everything (message 2 ``chunks`` + 1) and waits until the same block of every peer
   has: a rank's call ends only once no peer reads its staging memory any more, so its next
   call (a program whose stores may land there) cannot change what a peer still reads. In
   place (``in`` 0) the input is the output: a peer's chunk k of block q is written here
   only after q has reduced it, so after every pusher here has pushed it; the own block is
   read and written by the same thread. The tallies move on by 2 ``chunks`` + 1.

   Or the GPU's copy engines read the peers' reduced blocks
   (PIPELINED_ALL_REDUCE_BY_COPIES): this kernel pushes and reduces as above, then block 0
   waits until every reducer of every peer has stored its last chunk, and it ends without
   ending the call; the executor's copies read each peer's reduced block, and copies_around
   (COPIES_END, message 2 ``chunks`` + 1) ends it.

   A direct all_gather or all_to_all of p equal blocks runs here too (PIPELINED_ALL_GATHER,
   PIPELINED_ALL_TO_ALL): the pushers push this rank's input (an all_to_all: its block for
   the peer) the same way, and the other blocks, where the reducers reduce, copy chunk k of
   every peer's slot into that peer's block of the output, and of this rank's own block
   from its input, as soon as every pusher of every peer has said k: the output's copy-out
   runs beside the pushes, where the program's follows them. A rank whose output lies in
   symmetric memory says where (its PLACE word, before its epoch, as the program's epochs
   do), and its peers push straight into that output instead of the slot: it then copies
   only its own block.
   So every rank runs this kernel whatever its output, and each output is written as
   directly as it can be. The tallies move on by ``chunks``, as a reduce_scatter's.

   Parameters as run_program's; ``code_at``: count (elements of each rank's block), chunks,
   pushers, kind (PIPELINED_AT_*; the kinds PIPELINED_REDUCE_SCATTER, an all_reduce's
   PIPELINED_ALL_REDUCE gathered by thread blocks or ..._BY_COPIES by the copy engines,
   PIPELINED_ALL_GATHER, PIPELINED_ALL_TO_ALL). */
extern "C" __global__ void __launch_bounds__(THREADS)
pipelined_reduce_scatter(const i64* code_at, int n, const i64* tallies, char* in, char* out,
                         char* scratch, char* caller_out, const u64* peer_data_at,
                         const u64* peer_flags_at, u64 scratch_at, u64* flags, int* error,
                         int rank, int size, int itemsize, u64 timeout_ns,
                         const u64* peer_inbox_at, u64 inbox_half, const u64* peer_lines_at,
                         u64 lines_half, u64 place, const u64* peer_heaps) {
    __shared__ int stop, last_out;
    __shared__ u64 deadline, call_number;
    __shared__ i64 count, chunks, pushers, kind;
    __shared__ u64 peer_flags[WORLD], peer_data[WORLD], sent[WORLD], received[WORLD];
    __shared__ u64 tally[WORLD];
    __shared__ char* into[WORLD];      /* where each peer takes this rank's pushes */
    const int t = threadIdx.x;
    if (t < WORLD) {
        peer_flags[t] = peer_flags_at[t];
        peer_data[t] = peer_data_at[t];
    }
    if (t == 0) {
        count = code_at[PIPELINED_AT_COUNT];
        chunks = code_at[PIPELINED_AT_CHUNKS];
        pushers = code_at[PIPELINED_AT_PUSHERS];
        kind = code_at[PIPELINED_AT_KIND];
    }
    world_call_start(flags, error, timeout_ns, sent, received, &deadline, &call_number, &stop);
    /* an all_reduce's gather (PIPELINED_ALL_REDUCE or ..._BY_COPIES), or 0: none */
    const i64 gather = kind <= PIPELINED_ALL_REDUCE_BY_COPIES ? kind : 0;
    /* an all_gather or all_to_all: no reduction */
    const bool moves = kind >= PIPELINED_ALL_GATHER;
    if (t < WORLD) tally[t] = t != rank ? (u64)(gather ? 2 * chunks + 1 : chunks) : 0;
    const char* src = in ? in : caller_out;              /* an all_reduce in place */
    const i64 reduced_at = (i64)(WORLD - 1) * count;     /* elements into staging's scratch */
    Ctx c = {flags, peer_flags, error, rank, WORLD, deadline};
    const u64 call = call_number;
    scrub_lines(c, (char*)peer_lines_at[rank], lines_half, call, &stop);
    const u64 epoch = ((call + 1) << STEP_BITS) - 1;
    if (blockIdx.x == 0 && t < WORLD && !stop) {
        /* where this call's pushes into this rank's output land (0: its slots), before the
           epoch: a pusher that sees the epoch sees it */
        asm volatile("st.volatile.global.u64 [%0], %1;"
                     :: "l"((u64*)peer_flags[t] + PLACE_WORDS + rank), "l"(place) : "memory");
        release((u64*)peer_flags[t] + SEEN_WORDS + rank, epoch);
    }
    /* chunk k of a rank's block: 16-byte units [units k / chunks, units (k + 1) / chunks),
       shared out among ``of`` blocks alike on every rank; this block (``me``) takes its part */
    const i64 units = (count + VEC - 1) / VEC;
#define CHUNK_SHARE(k, me, of, lo, hi) do { \
        const i64 c0_ = units * (k) / chunks, c1_ = units * ((k) + 1) / chunks; \
        lo = (c0_ + (c1_ - c0_) * (me) / (of)) * VEC; \
        hi = (c0_ + (c1_ - c0_) * ((me) + 1) / (of)) * VEC; \
        if (lo > count) lo = count; \
        if (hi > count) hi = count; \
    } while (0)
    if (blockIdx.x < pushers) {
        /* every peer's epoch of this call: its previous call no longer reads its slots (or
           its output); then where the peer takes this rank's block */
        if (t < WORLD && t != rank && !stop) {
            if (!wait_for(c, flags + SEEN_WORDS + t, epoch, 0, t)) {
                stop = 1;
            } else {
                const u64 theirs = moves ? relaxed(flags + PLACE_WORDS + t) : 0;
                into[t] = theirs ? symmetric_at(theirs, peer_heaps, t, WORLD)
                                       + (i64)rank * count * itemsize
                                 : (char*)peer_data[t] + scratch_at
                                       + (i64)(rank < t ? rank : rank - 1) * count * itemsize;
            }
        }
        __syncthreads();
        for (i64 k = 0; k < chunks && !stop; k++) {
            i64 lo, hi;
            CHUNK_SHARE(k, (i64)blockIdx.x, pushers, lo, hi);
            /* every peer's share at once, one warp group each (copy_batch) */
            char* dst[WORLD - 1];
            const char* from[WORLD - 1];
            i64 bytes[WORLD - 1];
#pragma unroll
            for (int s = 1; s < WORLD; s++) {
                const int q = (rank + s) % WORLD;
                dst[s - 1] = into[q] + lo * itemsize;
                from[s - 1] = src + ((kind == PIPELINED_ALL_GATHER ? 0 : (i64)q * count) + lo)
                                    * itemsize;
                bytes[s - 1] = (hi - lo) * itemsize;
            }
            copy_batch(dst, from, bytes, WORLD - 1);
            __syncthreads();    /* the block's stores, then one release per peer */
            if (t < WORLD && t != rank)
                release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS
                        + blockIdx.x, sent[t] + (u64)k + 1);
        }
    } else if (moves) {
        /* chunk k of every peer's block from its slot (none where peers push into this
           rank's symmetric output), and of this rank's own block from its input */
        const i64 me = blockIdx.x - pushers, copiers = gridDim.x - pushers;
        for (i64 k = 0; k < chunks && !stop; k++) {
            if (!peers_said(c, received, 0, pushers, (u64)k + 1, 1))   /* from every pusher */
                stop = 1;
            __syncthreads();
            if (stop) break;
            i64 lo, hi;
            CHUNK_SHARE(k, me, copiers, lo, hi);
            char* dst[WORLD];
            const char* from[WORLD];
            i64 bytes[WORLD];
            int m = 0;
#pragma unroll
            for (int q = 0; q < WORLD; q++) {
                if (q != rank && place) continue;
                dst[m] = out + ((i64)q * count + lo) * itemsize;
                from[m] = q == rank ? src + ((kind == PIPELINED_ALL_GATHER ? 0 : (i64)q * count)
                                             + lo) * itemsize
                                    : scratch + ((i64)(q < rank ? q : q - 1) * count + lo)
                                                * itemsize;
                bytes[m++] = (hi - lo) * itemsize;
            }
            copy_batch(dst, from, bytes, m);
            __syncthreads();    /* every thread done with chunk k before the next wait */
        }
    } else {
        const i64 me = blockIdx.x - pushers, reducers = gridDim.x - pushers;
        const S* base[WORLD];
#pragma unroll
        for (int q = 0; q < WORLD; q++)
            base[q] = q == rank ? (const S*)src + (i64)rank * count
                                : (const S*)scratch + (q < rank ? q : q - 1) * count;
        /* reduce_scatter: the output; all_reduce: the rank's block of it, and after the
           slots in staging memory, where peers read it */
        S* dst[2] = {(S*)out + (gather ? (i64)rank * count : 0), (S*)scratch + reduced_at};
        for (i64 k = 0; k < chunks && !stop; k++) {
            if (!peers_said(c, received, 0, pushers, (u64)k + 1, 1))   /* from every pusher */
                stop = 1;
            __syncthreads();
            if (stop) break;
            i64 lo, hi;
            CHUNK_SHARE(k, me, reducers, lo, hi);
            if (gather)
                fold_world<2>(base, dst, lo, hi, t, blockDim.x);
            else
                fold_world<1>(base, dst, lo, hi, t, blockDim.x);
            __syncthreads();    /* every thread done with chunk k before the next wait */
            if (gather && t < WORLD && t != rank)   /* and its stores, before the release */
                release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS
                        + blockIdx.x, sent[t] + (u64)(chunks + k) + 1);
        }
    }
    /* an all_reduce: then every block reads its share of chunk after chunk of every peer's
       reduced block, each chunk once every reducer of that peer has said it; then says it
       has read everything, and waits until the same block of every peer has */
    const i64 reducers = gridDim.x - pushers;
    for (i64 k = 0; gather == PIPELINED_ALL_REDUCE && k < chunks && !stop; k++) {
        if (!peers_said(c, received, pushers, reducers, (u64)(chunks + k) + 1, 2))
            stop = 1;
        __syncthreads();
        if (stop) break;
        i64 lo, hi;
        CHUNK_SHARE(k, (i64)blockIdx.x, (i64)gridDim.x, lo, hi);
        char* dst[WORLD - 1];
        const char* from[WORLD - 1];
        i64 bytes[WORLD - 1];
#pragma unroll
        for (int s = 1; s < WORLD; s++) {
            const int q = (rank + s) % WORLD;
            dst[s - 1] = out + ((i64)q * count + lo) * itemsize;
            from[s - 1] = (const char*)peer_data[q] + scratch_at + (reduced_at + lo) * itemsize;
            bytes[s - 1] = (hi - lo) * itemsize;
        }
        copy_batch(dst, from, bytes, WORLD - 1);
        __syncthreads();
    }
    /* gather 2: the copy engines read every peer's reduced block once this launch ends (the
       executor's copies, then copies_around's COPIES_END ends the call); block 0 waits here
       until every reducer of every peer has stored its last chunk. */
    if (gather == PIPELINED_ALL_REDUCE_BY_COPIES) {
        if (blockIdx.x == 0 && !stop &&
            !peers_said(c, received, pushers, reducers, 2 * (u64)chunks, 2))
            stop = 1;
        return;
    }
    if (gather == PIPELINED_ALL_REDUCE && t < WORLD && t != rank && !stop) {
        release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS + blockIdx.x,
                sent[t] + 2 * (u64)chunks + 1);
        if (!wait_for(c, flags + DELIVERED_WORDS + (u64)t * MAX_BLOCKS + blockIdx.x,
                      received[t] + 2 * (u64)chunks + 1, 2, t))
            stop = 1;
    }
#undef CHUNK_SHARE
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (stop) return;
    end_call(flags, call, sent, received, tally, tally, WORLD, &last_out);
}
/* The launches around a call's copies by the copy engines (the executor's
   ``_by_copies``: cudaMemcpyAsync out of the peers' staging memory, where thread blocks'
   loads over NVLink move less on large blocks, BENCHMARKS.md §6). ``code_at``: bytes, mode,
   then the mode's words.

   COPIES_STAGE (bytes, mode, chunks, pieces, then source and destination offsets of each piece,
   then those of the rank's own block), at the call's start, on a stream beside the
   caller's (a direct all_gather: one piece, the rank's input; a direct all_to_all: one per
   peer, the input's block for that peer, into the staging slot of the peer's rank order
   with this rank skipped): every block copies its share of chunk k (16-byte units alike on
   every rank, ``chunk_bounds`` in the executor) of every piece of ``bytes`` from the
   rank's input into its staging memory and says so to every peer (message k + 1 in its
   delivered word), chunk after chunk; then its share of the rank's own block from the
   input into the output; the call does not end. The rank writes its staging memory
   before any word of this call: every peer has ended the call before, and a call of this
   kernel (or of pipelined_reduce_scatter's gather) ends only once no peer reads the rank's
   staging memory any more (COPIES_END); no peer writes it in this call.

   COPIES_WAIT (0, mode, message, blocks), on the caller's stream before the copies of a chunk (one
   block): waits until thread blocks [0, blocks) of every peer have said ``message``.

   COPIES_END (0, mode, message), after the copies (one block): says it has read everything
   (message ``message`` in word 0), waits until every peer has said so, and ends the call,
   the tallies moving on by ``message``: so a rank's next call cannot change what a peer
   still reads. It ends a pipelined all_reduce gathered by the copy engines too (message 2
   chunks + 1). The executor joins the stream of COPIES_STAGE before it (word 0 of its block
   0 then moves no more).

   Parameters as run_program's. */
extern "C" __global__ void __launch_bounds__(THREADS)
copies_around(const i64* code_at, int n, const i64* tallies, char* in, char* out,
              char* scratch, char* caller_out, const u64* peer_data_at,
              const u64* peer_flags_at, u64 scratch_at, u64* flags, int* error, int rank,
              int size, int itemsize, u64 timeout_ns, const u64* peer_inbox_at,
              u64 inbox_half, const u64* peer_lines_at, u64 lines_half, u64 place,
              const u64* peer_heaps) {
    __shared__ int stop, last_out;
    __shared__ u64 deadline, call_number;
    __shared__ u64 peer_flags[WORLD], sent[WORLD], received[WORLD], tally[WORLD];
    const int t = threadIdx.x;
    if (t < WORLD) peer_flags[t] = peer_flags_at[t];
    world_call_start(flags, error, timeout_ns, sent, received, &deadline, &call_number, &stop);
    const i64 bytes = code_at[COPIES_AT_BYTES], mode = code_at[COPIES_AT_MODE];
    const u64 call = call_number;
    Ctx c = {flags, peer_flags, error, rank, WORLD, deadline};
    if (mode == COPIES_STAGE) {
        scrub_lines(c, (char*)peer_lines_at[rank], lines_half, call, &stop);
        if (blockIdx.x == 0 && t < WORLD && !stop)
            release((u64*)peer_flags[t] + SEEN_WORDS + rank, ((call + 1) << STEP_BITS) - 1);
        const i64 chunks = code_at[COPIES_AT_CHUNKS], pieces = code_at[COPIES_AT_PIECES];
        const i64 units = (bytes + 15) / 16;
        for (i64 k = 0; k < chunks && !stop; k++) {
            const i64 c0 = units * k / chunks, c1 = units * (k + 1) / chunks;
            i64 lo = (c0 + (c1 - c0) * blockIdx.x / gridDim.x) * 16;
            i64 hi = (c0 + (c1 - c0) * (blockIdx.x + 1) / gridDim.x) * 16;
            if (hi > bytes) hi = bytes;
            if (lo > hi) lo = hi;
            for (i64 j = 0; j < pieces; j++)
                copy_range(scratch + code_at[COPIES_AT_PIECE + COPIES_PIECE_SIZE * j
                                             + COPIES_PIECE_TO] + lo,
                           in + code_at[COPIES_AT_PIECE + COPIES_PIECE_SIZE * j
                                        + COPIES_PIECE_FROM] + lo, hi - lo, t, blockDim.x);
            __syncthreads();        /* the block's stores, then one release per peer */
            if (t < WORLD && t != rank)
                release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS
                        + blockIdx.x, sent[t] + (u64)k + 1);
        }
        const i64* own = code_at + COPIES_AT_PIECE + COPIES_PIECE_SIZE * pieces;
        i64 lo = units * blockIdx.x / gridDim.x * 16;
        i64 hi = units * (blockIdx.x + 1) / gridDim.x * 16;
        if (hi > bytes) hi = bytes;
        if (lo > hi) lo = hi;
        if (!stop) copy_range(out + own[COPIES_PIECE_TO] + lo, in + own[COPIES_PIECE_FROM] + lo,
                              hi - lo, t, blockDim.x);
        return;
    }
    const u64 message = (u64)code_at[COPIES_AT_MESSAGE];
    if (mode == COPIES_WAIT) {
        if (blockIdx.x == 0 && !stop &&
            !peers_said(c, received, 0, code_at[COPIES_AT_BLOCKS], message, 1))
            stop = 1;
        return;
    }
    if (t < WORLD) tally[t] = t != rank ? message : 0;
    if (t < WORLD && t != rank && !stop) {
        release((u64*)peer_flags[t] + DELIVERED_WORDS + (u64)rank * MAX_BLOCKS + blockIdx.x,
                sent[t] + message);
        if (!wait_for(c, flags + DELIVERED_WORDS + (u64)t * MAX_BLOCKS + blockIdx.x,
                      received[t] + message, 2, t))
            stop = 1;
    }
    __syncthreads();
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    if (stop) return;
    end_call(flags, call, sent, received, tally, tally, WORLD, &last_out);
}
#endif
