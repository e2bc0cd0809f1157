"""Per call through torch.distributed on CUDA tensors: ours against NCCL's group, then a
profile of ours (rank 0)."""
import cProfile, io, os, pstats, sys, time
import torch
import torch.distributed as dist
import collectives.c10d  # noqa: F401
rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("collectives")
nccl = dist.new_group(backend="nccl")
for size in (4096, 65536, 1 << 20, 16 << 20):
    x = torch.ones(size // 4, device="cuda")
    for g, name in ((None, "ours"), (nccl, "nccl"), (None, "ours"), (nccl, "nccl")):
        for _ in range(30):
            dist.all_reduce(x, group=g)
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 300
        for _ in range(n):
            dist.all_reduce(x, group=g)
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t) / n
        if rank == 0:
            print(f"{name} {size} {dt * 1e6:.1f} us", flush=True)
x = torch.ones(1024, device="cuda")
for _ in range(50):
    dist.all_reduce(x)
torch.cuda.synchronize()
pr = cProfile.Profile()
pr.enable()
for _ in range(1000):
    dist.all_reduce(x)
torch.cuda.synchronize()
pr.disable()
if rank == 0:
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(40)
        print(s.getvalue()[-9000:], flush=True)
dist.barrier()
dist.destroy_process_group()
