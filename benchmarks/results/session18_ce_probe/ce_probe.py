"""Copy engines against SM copies over NVLink, every rank at once (one process per GPU,
mpiexec -n N). Each rank's gather of an all_reduce of 1 GiB on 4 ranks: 3 blocks of 256 MiB
read from the peers (pull) or written to them (push). Prints per test the slowest rank's
median time and the bytes each GPU received per second."""
import sys, time
import numpy as np
import cupy as cp
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
cp.cuda.Device(rank % cp.cuda.runtime.getDeviceCount()).use()
rt = cp.cuda.runtime
B = int(sys.argv[1]) if len(sys.argv) > 1 else 256 << 20      # bytes per peer block
CHUNK = 4 << 20
src = rt.malloc(size * B)
dst = rt.malloc(size * B)
red = [rt.malloc(B) for _ in range(5)]                         # a local reduction's operands
rt.memset(src, rank + 1, size * B)
handles = comm.allgather((rt.ipcGetMemHandle(src), rt.ipcGetMemHandle(dst)))
peer_src, peer_dst = {}, {}
for q in range(size):
    if q == rank:
        peer_src[q], peer_dst[q] = src, dst
    else:
        peer_src[q] = rt.ipcOpenMemHandle(handles[q][0])
        peer_dst[q] = rt.ipcOpenMemHandle(handles[q][1])
peers = [(rank + s) % size for s in range(1, size)]
streams = [cp.cuda.Stream(non_blocking=True) for _ in peers]
main = cp.cuda.Stream(non_blocking=True)
DEF = rt.memcpyDefault

code = r'''
extern "C" __global__ void copy3(uint4* d0, const uint4* s0, uint4* d1, const uint4* s1,
                                 uint4* d2, const uint4* s2, long long n, int m) {
    uint4* d = blockIdx.y == 0 ? d0 : blockIdx.y == 1 ? d1 : d2;
    const uint4* s = blockIdx.y == 0 ? s0 : blockIdx.y == 1 ? s1 : s2;
    if (blockIdx.y >= m) return;
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = s[i], b = s[i + stride], c = s[i + 2 * stride], e = s[i + 3 * stride];
        d[i] = a; d[i + stride] = b; d[i + 2 * stride] = c; d[i + 3 * stride] = e;
    }
    for (; i < n; i += stride) d[i] = s[i];
}
extern "C" __global__ void reduce4(float4* d, const float4* a, const float4* b, const float4* c,
                                   const float4* e, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float4 x = a[i], y = b[i], z = c[i], w = e[i];
        d[i] = make_float4(x.x + y.x + z.x + w.x, x.y + y.y + z.y + w.y,
                           x.z + y.z + z.z + w.z, x.w + y.w + z.w + w.w);
    }
}
'''
mod = cp.RawModule(code=code)
copy3, reduce4 = mod.get_function("copy3"), mod.get_function("reduce4")


def ce(pairs, multi, chunk=0):
    """pairs: [(dst, src)] per peer; on one stream each (multi) or all on main."""
    for i, (d, s) in enumerate(pairs):
        st = streams[i] if multi else main
        if chunk:
            for off in range(0, B, chunk):
                rt.memcpyAsync(d + off, s + off, min(chunk, B - off), DEF, st.ptr)
        else:
            rt.memcpyAsync(d, s, B, DEF, st.ptr)


def sm(pairs, blocks):
    a = []
    for d, s in pairs + [(0, 0)] * (3 - len(pairs)):
        a += [np.uint64(d), np.uint64(s)]
    copy3((blocks, 3), (512,), (*a, np.int64(B // 16), np.int32(len(pairs))), stream=main)


def local_reduce(stream):
    reduce4((264,), (512,), tuple(np.uint64(p) for p in red) + (np.int64(B // 16),),
            stream=stream)


pull = [(dst + q * B, peer_src[q] + q * B) for q in peers]
push = [(peer_dst[q] + rank * B, src + rank * B) for q in peers]


def timed(name, body, reps=10):
    times = []
    for it in range(reps + 3):
        comm.Barrier()
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(main)
        for st in streams:
            st.wait_event(e0)
        body()
        for st in streams:
            ev = cp.cuda.Event()
            ev.record(st)
            main.wait_event(ev)
        e1.record(main)
        e1.synchronize()
        if it >= 3:
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3)
    med = float(np.median(times))
    worst = comm.allreduce(med, op=MPI.MAX)
    if rank == 0:
        gb = len(peers) * B / worst / 1e3
        print(f"{size} GPUs {B >> 20:5d} MiB/peer {name:34s} {worst:9.1f} us  {gb:6.1f} GB/s in",
              flush=True)
    return worst


timed("ce pull, 1 stream", lambda: ce(pull, False))
timed("ce pull, a stream per peer", lambda: ce(pull, True))
timed("ce pull, per peer, 4 MiB chunks", lambda: ce(pull, True, CHUNK))
timed("ce push, 1 stream", lambda: ce(push, False))
timed("ce push, a stream per peer", lambda: ce(push, True))
for blocks in (44, 88, 132):
    timed(f"sm pull, {blocks}x3 blocks", lambda: sm(pull, blocks))
    timed(f"sm push, {blocks}x3 blocks", lambda: sm(push, blocks))
timed("local reduce pass alone (4 -> 1)", lambda: local_reduce(main))
timed("ce pull + local reduce beside", lambda: (ce(pull, True), local_reduce(main)))
timed("sm push (88x3) + ce pull beside", lambda: (ce(pull, True), sm(push, 88)))
timed("sm push (132x3) + ce pull beside", lambda: (ce(pull, True), sm(push, 132)))
timed("ce push + ce pull beside", lambda: (ce(pull, True), ce(push, False)))
comm.Barrier()
