"""Thread blocks' pushes over NVLink, every rank at once (one process per GPU, mpiexec -n N):
each rank's part of a direct all_gather of 1 GiB on 4 ranks (3 messages of 256 MiB stored into
the peers' memory) with and without its own block's local copy beside them, laid out as the
program lays them out (128 blocks, each block's warps split among the messages, each block a
contiguous share of every message) or as a plain copy kernel (a grid-stride loop, each block
one destination). Prints per variant the slowest rank's median time."""
import sys
import numpy as np
import cupy as cp
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
rt = cp.cuda.runtime
B = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20
src = rt.malloc(B)
dst = rt.malloc(size * B)
rt.memset(src, rank + 1, B)
handles = comm.allgather(rt.ipcGetMemHandle(dst))
peer_dst = {q: dst if q == rank else rt.ipcOpenMemHandle(handles[q]) for q in range(size)}
peers = [(rank + s) % size for s in range(1, size)]
main = cp.cuda.Stream(non_blocking=True)

code = r'''
extern "C" __global__ void grid_push(uint4* d0, uint4* d1, uint4* d2, const uint4* s,
                                     long long n) {
    uint4* d = blockIdx.y == 0 ? d0 : blockIdx.y == 1 ? d1 : d2;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
        d[i] = a; d[i + stride] = b; d[i + 2 * stride] = c; d[i + 3 * stride] = e;
    }
    for (; i < n; i += stride) d[i] = s[i];
}
/* the program's layout: message k (of m) gets warps [first[k], first[k + 1]) of every block;
   each block copies its contiguous share of every message */
extern "C" __global__ void block_push(uint4* d0, uint4* d1, uint4* d2, uint4* d3,
                                      const uint4* s, long long n, int m, int f0, int f1,
                                      int f2, int f3, int f4) {
    uint4* ds[4] = {d0, d1, d2, d3};
    const int f[5] = {f0, f1, f2, f3, f4};
    const int w = threadIdx.x / 32;
    int k = 0;
    while (k < m && w >= f[k + 1]) k++;
    if (k >= m) return;
    const long long tid = threadIdx.x - 32 * f[k], nt = 32 * (f[k + 1] - f[k]);
    const long long lo = n * blockIdx.x / gridDim.x, hi = n * (blockIdx.x + 1) / gridDim.x;
    uint4* d = ds[k] + lo;
    const uint4* x = s + lo;
    const long long v = hi - lo;
    for (long long i = tid; i < v; i += 4 * nt) {
        uint4 t[4];
#pragma unroll
        for (int u = 0; u < 4; u++) if (i + u * nt < v) t[u] = x[i + u * nt];
#pragma unroll
        for (int u = 0; u < 4; u++) if (i + u * nt < v) d[i + u * nt] = t[u];
    }
}
'''
mod = cp.RawModule(code=code)
grid_push, block_push = mod.get_function("grid_push"), mod.get_function("block_push")
n = np.int64(B // 16)
remote = [np.uint64(peer_dst[q] + rank * B) for q in peers]
local = np.uint64(dst + rank * B)


def grid(blocks):
    grid_push((blocks, 3), (512,), (*remote, np.uint64(src), n), stream=main)


def program(warps, with_copy, blocks=128, targets=None):
    """warps: per message (the remote ones, then the local copy's where with_copy)."""
    first = [int(x) for x in np.cumsum([0] + list(warps))]
    ds = targets or (remote + ([local] if with_copy else []))
    ds = list(ds) + [np.uint64(0)] * (4 - len(ds))
    f = first + [first[-1]] * (5 - len(first))
    block_push((blocks,), (512,), (*ds, np.uint64(src), n, np.int32(len(warps)),
                                   *[np.int32(x) for x in f[:5]]), stream=main)


def timed(name, body, reps=10):
    times = []
    for it in range(reps + 3):
        comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(main)
        body()
        e1.record(main)
        e1.synchronize()
        if it >= 3:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    worst = comm.allreduce(float(np.median(times)), op=MPI.MAX)
    if rank == 0:
        print(f"{size} GPUs {B >> 20:5d} MiB/peer {name:52s} {worst:9.1f} us "
              f"{3 * B / worst / 1e3:6.1f} GB/s out", flush=True)


timed("grid-stride, 132x3 blocks (ce_probe's sm push)", lambda: grid(132))
timed("program layout, 128 blocks, warps 5/5/6", lambda: program((5, 5, 6), False))
timed("program layout, 128 blocks, warps 5/5/6, then local copy",
      lambda: (program((5, 5, 6), False), program((16,), False, targets=[local])))
timed("program layout, 128 blocks, warps 4/4/4 + copy 4", lambda: program((4, 4, 4, 4), True))
timed("program layout, 128 blocks, warps 5/5/5 + copy 1", lambda: program((5, 5, 5, 1), True))
timed("program layout, 128 blocks, warps 4/4/4 (no copy)", lambda: program((4, 4, 4), False))
timed("program layout, 128 blocks, warps 2/2/2 (no copy)", lambda: program((2, 2, 2), False))
timed("program layout, 64 blocks, warps 5/5/6 (no copy)", lambda: program((5, 5, 6), False, 64))
comm.Barrier()
