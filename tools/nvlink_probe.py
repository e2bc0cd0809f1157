"""How fast the GPUs of one host move a step's messages over NVLink, by stores into peers'
memory (push) or by loads from it (pull), with the ways the peer-memory kernel could split a
step's messages among a block's threads: one message after another (``seq``) or one warp
group per message (``grouped``); and a pull that reduces as it loads (``pull_reduce``: every
peer's block of a vector plus this GPU's, as a two-shot all_reduce's first half does).

One process drives every GPU (peer access enabled between all of them); each GPU runs the
same kernel ``--iters`` times back to back on its own stream, all GPUs at once, and the time
per kernel is the slowest GPU's. Only where peer access is enabled; no NCCL, no MPI.

    python tools/nvlink_probe.py [--sizes 256K,1M,4M] [--blocks 32,128]
"""
from __future__ import annotations

import argparse

import numpy as np

KERNEL = r"""
typedef unsigned long long u64;
#define UNROLL 4
__device__ __forceinline__ void copy_range(uint4* d, const uint4* s, long long v, long long tid,
                                           long long nt) {
    for (long long i = tid; i < v; i += UNROLL * nt) {
        uint4 t[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) if (i + k * nt < v) t[k] = s[i + k * nt];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) if (i + k * nt < v) d[i + k * nt] = t[k];
    }
}
/* the block's share of v items: [lo, hi) */
__device__ __forceinline__ void share(long long v, long long* lo, long long* hi) {
    *lo = v * blockIdx.x / gridDim.x; *hi = v * (blockIdx.x + 1) / gridDim.x;
}
/* mode 0: one message after another; 1: one warp group per message */
extern "C" __global__ void move(const u64* dsts, const u64* srcs, int m, long long v, int mode) {
    long long lo, hi;
    share(v, &lo, &hi);
    if (mode == 0) {
        for (int k = 0; k < m; k++)
            copy_range((uint4*)dsts[k] + lo, (const uint4*)srcs[k] + lo, hi - lo, threadIdx.x,
                       blockDim.x);
    } else {
        const int warps = blockDim.x / 32, w = threadIdx.x / 32, k = w * m / warps;
        const int first = (k * warps + m - 1) / m, next = ((k + 1) * warps + m - 1) / m;
        copy_range((uint4*)dsts[k] + lo, (const uint4*)srcs[k] + lo, hi - lo,
                   threadIdx.x - 32 * first, 32 * (next - first));
    }
}
/* dst = own + srcs[0] + ... + srcs[m-1] (float32), every load of a round issued first */
extern "C" __global__ void pull_reduce(float* dst, const float* own, const u64* srcs, int m,
                                       long long v) {
    long long lo, hi;
    share(v, &lo, &hi);
    for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        float4 x[8];
        x[0] = ((const float4*)own)[i];
#pragma unroll
        for (int k = 0; k < 7; k++) if (k < m) x[k + 1] = ((const float4*)srcs[k])[i];
#pragma unroll
        for (int k = 0; k < 7; k++) if (k < m) {
            x[0].x += x[k + 1].x; x[0].y += x[k + 1].y; x[0].z += x[k + 1].z; x[0].w += x[k + 1].w;
        }
        ((float4*)dst)[i] = x[0];
    }
}
"""


def size_of(text):
    units = {"K": 1 << 10, "M": 1 << 20}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main():
    import cupy
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256K,1M,4M", help="bytes of each message")
    ap.add_argument("--blocks", default="32,64,128")
    ap.add_argument("--threads", type=int, default=512)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    n = cupy.cuda.runtime.getDeviceCount()
    for a in range(n):
        with cupy.cuda.Device(a):
            for b in range(n):
                if a != b:
                    cupy.cuda.runtime.deviceEnablePeerAccess(b)
    kernels = []
    for d in range(n):
        with cupy.cuda.Device(d):
            module = cupy.RawModule(code=KERNEL, options=("-std=c++14",))
            kernels.append((module.get_function("move"), module.get_function("pull_reduce")))
    print(f"# {n} GPUs: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}; "
          f"{args.threads} threads a block; µs per kernel (slowest GPU), GB/s out of each GPU")
    for nbytes in [size_of(s) for s in args.sizes.split(",")]:
        v = nbytes // 16
        # every GPU: a send buffer per peer, an inbox per peer (peers write or read them)
        bufs = []
        for d in range(n):
            with cupy.cuda.Device(d):
                bufs.append({"send": [cupy.full(nbytes // 4, d + 1, cupy.float32)
                                      for _ in range(n)],
                             "inbox": [cupy.zeros(nbytes // 4, cupy.float32) for _ in range(n)],
                             "out": cupy.zeros(nbytes // 4, cupy.float32)})
        peers = {d: [q for q in range(n) if q != d] for d in range(n)}

        def tables(kind):
            out = []
            for d in range(n):
                if kind == "push":    # my send buffer for q -> q's inbox for me
                    dsts = [bufs[q]["inbox"][d].data.ptr for q in peers[d]]
                    srcs = [bufs[d]["send"][q].data.ptr for q in peers[d]]
                else:                 # q's send buffer for me -> my inbox for q
                    dsts = [bufs[d]["inbox"][q].data.ptr for q in peers[d]]
                    srcs = [bufs[q]["send"][d].data.ptr for q in peers[d]]
                with cupy.cuda.Device(d):
                    out.append((cupy.asarray(np.array(dsts, np.uint64)),
                                cupy.asarray(np.array(srcs, np.uint64))))
            return out

        def run(launch):
            streams, events = [], []
            for d in range(n):
                with cupy.cuda.Device(d):
                    streams.append(cupy.cuda.Stream(non_blocking=True))
            for rep in range(2):          # the first round warms up
                events = []
                for d in range(n):
                    with cupy.cuda.Device(d):
                        start, end = cupy.cuda.Event(), cupy.cuda.Event()
                        start.record(streams[d])
                        for _ in range(args.iters):
                            launch(d, streams[d])
                        end.record(streams[d])
                        events.append((start, end))
                for d in range(n):
                    with cupy.cuda.Device(d):
                        events[d][1].synchronize()
            return max(cupy.cuda.get_elapsed_time(s, e) for s, e in events) * 1e3 / args.iters

        m = n - 1
        for blocks in [int(b) for b in args.blocks.split(",")]:
            row = []
            for kind in ("push", "pull"):
                t = tables(kind)
                for mode, name in ((0, "seq"), (1, "grouped")):
                    def launch(d, stream, t=t, mode=mode):
                        with cupy.cuda.Device(d):
                            kernels[d][0]((blocks,), (args.threads,),
                                          (t[d][0], t[d][1], np.int32(m), np.int64(v),
                                           np.int32(mode)), stream=stream)
                    us = run(launch)
                    row.append(f"{kind}_{name} {us:6.2f} µs {m * nbytes / us / 1e3:5.0f} GB/s")
            t = tables("pull")

            def launch(d, stream, t=t):
                with cupy.cuda.Device(d):
                    kernels[d][1]((blocks,), (args.threads,),
                                  (bufs[d]["out"], bufs[d]["send"][d], t[d][1], np.int32(m),
                                   np.int64(v)), stream=stream)
            us = run(launch)
            row.append(f"pull_reduce {us:6.2f} µs {m * nbytes / us / 1e3:5.0f} GB/s")
            print(f"{nbytes >> 10:6d} KiB x {m}, {blocks:3d} blocks: " + " | ".join(row),
                  flush=True)


if __name__ == "__main__":
    main()
