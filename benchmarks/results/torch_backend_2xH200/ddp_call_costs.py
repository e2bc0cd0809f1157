import os, time, statistics
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import collectives.c10d  # noqa
from collectives.c10d import backend as B, cuda as C
import sys, collectives.group  # noqa
G = sys.modules["collectives.group"]
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dist.init_process_group("collectives")
nccl = dist.new_group(backend="nccl")
def say(*a):
    if rank == 0: print(*a, flush=True)
ACC = {}
def add(key, dt):
    a = ACC.setdefault(key, [0.0, 0]); a[0] += dt; a[1] += 1
def timed(cls, name, key):
    orig = getattr(cls, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            add(key, time.perf_counter() - t)
    setattr(cls, name, wrapper)
for cls, name in ((B.ProcessGroupCollectives, "allreduce"), (C.CudaWork, "get_future"),
                  (C.CudaCalls, "view"), (C.CudaCalls, "finish"), (C.CudaCalls, "keep"),
                  (C.CudaCalls, "_op"), (C.CudaCalls, "all_reduce"), (C.CudaCalls, "_run"),
                  (C.CudaWork, "wait"), (C.CudaWork, "__init__")):
    timed(cls, name, f"{cls.__name__}.{name}")
orig_prepare = G.ProcessGroup.prepare
def prepare(self, *a, **k):
    t = time.perf_counter()
    run = orig_prepare(self, *a, **k)
    add("group.prepare", time.perf_counter() - t)
    def timed_run():
        t = time.perf_counter(); run(); add("run()", time.perf_counter() - t)
    return timed_run
G.ProcessGroup.prepare = prepare
import torch.futures as TF
orig_set = TF.Future.set_result
def set_result(self, v):
    t = time.perf_counter(); orig_set(self, v); add("Future.set_result", time.perf_counter() - t)
TF.Future.set_result = set_result
orig_init = TF.Future.__init__
def finit(self, *a, **k):
    t = time.perf_counter(); orig_init(self, *a, **k); add("Future.__init__", time.perf_counter() - t)
TF.Future.__init__ = finit
def report(label, steps):
    say(label)
    for k, (s, n) in sorted(ACC.items(), key=lambda kv: -kv[1][0]):
        say(f"   {k:<28} {s / steps * 1e6:8.1f} us/step  {s / max(n, 1) * 1e6:7.1f} us/call  ({n / steps:.1f}/step)")
    ACC.clear()
torch.manual_seed(0)
d = DDP(nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(3)]).cuda(), device_ids=[rank],
        bucket_cap_mb=25)
opt = torch.optim.SGD(d.parameters(), lr=1e-3)
x = torch.randn(32, 2048, device="cuda")
def step():
    opt.zero_grad(set_to_none=False); d(x).square().mean().backward(); opt.step()
for _ in range(5): step()
torch.cuda.synchronize(); ACC.clear()
t = time.perf_counter()
for _ in range(20): step()
host = (time.perf_counter() - t) / 20 * 1e6
torch.cuda.synchronize()
report(f"DDP 25 MB buckets, host {host:.0f} us/step", 20)
b = torch.ones(6 << 20, device="cuda")
def loop():
    dist.all_reduce(b, async_op=True).get_future()
for _ in range(10): loop()
torch.cuda.synchronize(); ACC.clear()
t = time.perf_counter()
for _ in range(100): loop()
host = (time.perf_counter() - t) / 100 * 1e6
torch.cuda.synchronize()
report(f"tight loop: async all_reduce of 24 MiB + get_future, host {host:.0f} us/call", 100)
# from another thread, as DDP's autograd thread calls
import threading
def other():
    torch.cuda.set_device(rank)
    for _ in range(10): loop()
    torch.cuda.synchronize(); ACC.clear()
    t = time.perf_counter()
    for _ in range(100): loop()
    ACC["host"] = [time.perf_counter() - t, 100]
    torch.cuda.synchronize()
th = threading.Thread(target=other); th.start(); th.join()
report("the same from a second thread", 100)
dist.barrier(group=nccl)
dist.destroy_process_group()
