"""One rank of the torch backend's GPU suite: ``init_process_group("collectives")`` with CUDA
tensors (our schedules over the NCCL transport), beside torch's own NCCL group of the same
ranks, one rank per GPU.

Launched by ``test_c10d_gpu.py`` as ``mpiexec -n N python tests/gpu/c10d_worker.py --store
PATH``; rank and size come from MPI, the rendezvous is ``file://PATH``. Each rank prints one
``RESULT {json}`` line (cases run, failures) and exits non-zero on any failure.

What is checked:

* collectives through ``torch.distributed`` on CUDA tensors of small integers (exact in any
  order), each sync and with ``async_op=True``: all_reduce (SUM, MAX; float32, int32),
  broadcast, reduce, all_gather, all_gather_into_tensor, reduce_scatter_tensor,
  all_to_all_single, send/recv (isend/irecv); barrier; outputs keep their memory (zero copy);
* torch's stream semantics: the input written on a side stream behind a long kernel, the
  collective called there with ``async_op=True``, ``wait()`` and the result read on another
  stream (the default one): ordered there, with no host synchronization in between; a
  Future's ``then`` on CUDA; ``is_completed()`` once the GPU is idle; a tensor the caller
  frees right after an async call is not handed out again before the collective ends;
  all_reduce, reduce_scatter_tensor and all_gather_into_tensor captured in a CUDA graph and
  replayed on new inputs;
* a tensor on another GPU than the group's: ValueError naming the call and the rank; CPU
  tensors on the same group still run (on the socket transport);
* DDP (several buckets; plain, torch's ``allreduce_hook``, ``no_sync``) trained 5 steps on
  ours and on torch's NCCL group, same seeds: parameters bitwise identical across ranks; on
  2 ranks bitwise equal to NCCL's (a sum of two numbers has one order); on more, equal
  within float32 rounding (rtol 1e-5: our ring and NCCL's add in different orders);
* FSDP2 (``fully_shard`` per layer and on the model) trained 5 steps on a device mesh over
  ours and over NCCL's group: equal within float32 rounding; a DTensor redistributed
  Shard(0) -> Replicate on CUDA.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic matmuls

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import collectives.c10d  # noqa: E402,F401  (registers "collectives")

SHAPE = (7, 149)                  # 1043 elements: divisible by neither 2 nor 4
SLEEP_CYCLES = 200_000_000        # ~0.1 s of GPU time queued before the input is written
VARIANTS = ("plain", "allreduce_hook", "no_sync")
STEPS = 5
T0 = time.time()


def ints(seed, shape=SHAPE, dtype=torch.float32):
    """Every rank's input for one case, on the CPU: small integers, exact in any order."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, shape, generator=gen).to(dtype)


class Suite:
    def __init__(self, rank, size, device, native):
        self.rank, self.size, self.device, self.native = rank, size, device, native
        self.runs, self.failures = 0, []

    def check(self, label, case):
        """``case()`` returns None (pass) or what is wrong; an exception is a failure."""
        self.runs += 1
        try:
            problem = case()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if len(self.failures) < 4:
                print(f"rank {self.rank} traceback of {label}:\n{traceback.format_exc()}",
                      flush=True)
        torch.cuda.synchronize()
        if problem:
            self.failures.append(f"{label}: {problem}")
            print(f"FAIL rank {self.rank} {label}: {problem}", flush=True)

    def mine(self, seed, r=None, **kw):
        return ints(seed * 100 + (self.rank if r is None else r), **kw)

    def on_gpu(self, t):
        return t.to(self.device)

    @staticmethod
    def same(label, got, want):
        got = got.detach().cpu()
        if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            bad = (got != want).sum().item() if got.shape == want.shape else "all"
            return f"{label}: {bad} elements differ (got {got.flatten()[:4].tolist()}, " \
                   f"want {want.flatten()[:4].tolist()})"
        return None

    # -- collectives ---------------------------------------------------------------------

    def collectives(self):
        p, me = self.size, self.rank

        def all_reduce(op, dtype, async_op):
            def case():
                x = self.on_gpu(self.mine(1, dtype=dtype))
                ptr = x.data_ptr()
                work = dist.all_reduce(x, op=op, async_op=async_op)
                if async_op:
                    work.wait()
                every = torch.stack([self.mine(1, r, dtype=dtype) for r in range(p)])
                want = every.sum(0) if op == dist.ReduceOp.SUM else every.max(0).values
                if x.data_ptr() != ptr:
                    return "the output moved"
                return self.same("all_reduce", x, want.to(dtype))
            return case
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
            for dtype in (torch.float32, torch.int32):
                for async_op in (False, True):
                    self.check(f"all_reduce {op} {dtype} async={async_op}",
                               all_reduce(op, dtype, async_op))

        def done(work, async_op):
            if async_op:
                work.wait()

        def broadcast(async_op):
            x = self.on_gpu(self.mine(2))
            done(dist.broadcast(x, src=p - 1, async_op=async_op), async_op)
            return self.same("broadcast", x, self.mine(2, p - 1))

        def reduce(async_op):
            x = self.on_gpu(self.mine(3))
            done(dist.reduce(x, dst=0, async_op=async_op), async_op)
            want = sum(self.mine(3, r) for r in range(p)) if me == 0 else self.mine(3)
            return self.same("reduce", x, want)

        def all_gather(async_op):
            outs = [torch.empty(SHAPE, device=self.device) for _ in range(p)]
            done(dist.all_gather(outs, self.on_gpu(self.mine(4)), async_op=async_op), async_op)
            return self.same("all_gather", torch.stack(outs),
                             torch.stack([self.mine(4, r) for r in range(p)]))

        def all_gather_into_tensor(async_op):
            out = torch.empty((p * SHAPE[0], SHAPE[1]), device=self.device)
            done(dist.all_gather_into_tensor(out, self.on_gpu(self.mine(5)), async_op=async_op),
                 async_op)
            return self.same("all_gather_into_tensor", out,
                             torch.cat([self.mine(5, r) for r in range(p)]))

        def reduce_scatter_tensor(async_op):
            rows = 3
            out = torch.empty((rows, SHAPE[1]), device=self.device)
            x = self.on_gpu(self.mine(6, shape=(p * rows, SHAPE[1])))
            done(dist.reduce_scatter_tensor(out, x, async_op=async_op), async_op)
            total = sum(self.mine(6, r, shape=(p * rows, SHAPE[1])) for r in range(p))
            return self.same("reduce_scatter_tensor", out, total[me * rows:(me + 1) * rows])

        def all_to_all_single(async_op):
            rows = 2
            out = torch.empty((p * rows, 5), device=self.device)
            x = self.on_gpu(self.mine(7, shape=(p * rows, 5)))
            done(dist.all_to_all_single(out, x, async_op=async_op), async_op)
            want = torch.cat([self.mine(7, r, shape=(p * rows, 5))[me * rows:(me + 1) * rows]
                              for r in range(p)])
            return self.same("all_to_all_single", out, want)

        def send_recv(async_op):
            peer = me ^ 1
            if peer >= p:
                return None
            got = torch.empty(SHAPE, device=self.device)
            mine = self.on_gpu(self.mine(8))
            if async_op:
                works = [dist.isend(mine, peer), dist.irecv(got, peer)]
                for work in works:
                    work.wait()
            elif me % 2 == 0:
                dist.send(mine, peer)
                dist.recv(got, peer)
            else:
                dist.recv(got, peer)
                dist.send(mine, peer)
            return self.same("send/recv", got, self.mine(8, peer))

        for case in (broadcast, reduce, all_gather, all_gather_into_tensor,
                     reduce_scatter_tensor, all_to_all_single, send_recv):
            for async_op in (False, True):
                self.check(f"{case.__name__} async={async_op}",
                           lambda case=case, async_op=async_op: case(async_op))

        def barrier():
            dist.barrier()
            return None
        self.check("barrier", barrier)

        def cpu_on_the_same_group():
            t = self.mine(9)
            dist.all_reduce(t)
            return self.same("CPU all_reduce", t, sum(self.mine(9, r) for r in range(p)))
        self.check("CPU tensors on the same group", cpu_on_the_same_group)

        def another_gpu():
            if torch.cuda.device_count() < 2:
                return None
            other = torch.device("cuda", (self.device.index + 1) % torch.cuda.device_count())
            x = torch.ones(3, device=other)
            try:
                dist.all_reduce(x)
            except ValueError as exc:
                if f"all_reduce on rank {me}" not in str(exc) or str(other) not in str(exc):
                    return f"the error does not name the call, rank and device: {exc}"
                return self.same("untouched", x, torch.ones(3))
            return "no error for a tensor on another GPU"
        self.check("a tensor on another GPU", another_gpu)

    # -- streams and Works ----------------------------------------------------------------

    def streams(self):
        p, me = self.size, self.rank

        def side_stream_then_default():
            side = torch.cuda.Stream(self.device)
            x = torch.zeros(SHAPE, device=self.device)
            src = self.on_gpu(self.mine(10))
            with torch.cuda.stream(side):
                delay(SLEEP_CYCLES)
                x.copy_(src)
                work = dist.all_reduce(x, async_op=True)
            work.wait()              # the default stream now waits for the collective
            got = x.clone()          # read on the default stream, no host sync before
            return self.same("read on the default stream", got,
                             sum(self.mine(10, r) for r in range(p)))
        self.check("async on a side stream, wait() and read on the default stream",
                   side_stream_then_default)

        def future_then():
            x = self.on_gpu(self.mine(11))
            delay(SLEEP_CYCLES)
            fut = dist.all_reduce(x, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
            got = fut.wait()
            return self.same("future then", got, 2 * sum(self.mine(11, r) for r in range(p)))
        self.check("get_future().then() on CUDA", future_then)

        def completed():
            x = self.on_gpu(self.mine(12))
            work = dist.all_reduce(x, async_op=True)
            torch.cuda.synchronize()
            return None if work.is_completed() else "is_completed() False on an idle GPU"
        self.check("is_completed", completed)

        def freed_before_wait():
            # The collective waits behind a long kernel; the caller drops its tensor at once
            # and allocates another of the same size on the same stream: the allocator must
            # not hand it the memory the pending collective still reads and writes.
            torch.cuda.synchronize()
            x = self.on_gpu(self.mine(13, shape=(1 << 16,)))
            delay(SLEEP_CYCLES)
            work = dist.all_reduce(x, async_op=True)
            freed = x.data_ptr()
            del x
            y = torch.empty(1 << 16, device=self.device)
            reused = y.data_ptr() == freed
            y.fill_(1e6)                # where the memory was reused: a wrong sum everywhere
            work.wait()
            out = work.result()[0]
            if reused:
                return "a tensor freed right after an async call got its memory back at once"
            return self.same("sum after the input was freed", out,
                             sum(self.mine(13, r, shape=(1 << 16,)) for r in range(p)))
        self.check("a tensor freed after an async call is not reused before it ends",
                   freed_before_wait)

        def graph(name, call, make, want):
            def case():
                args = make(1)
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    call(*args)                         # warm, outside the capture
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    call(*args)
                for k in (2, 3, 5):
                    fresh = make(k)
                    for a, b in zip(args, fresh):
                        a.copy_(b)
                    g.replay()
                    problem = self.same(f"{name} replay {k}", args[0], want(k))
                    if problem:
                        return problem
                return None
            self.check(f"{name} captured in a CUDA graph and replayed", case)

        rows = 4

        def block(seed, k, r=me, n=p * rows):       # on the CPU; .to(GPU) where an input
            return k * self.mine(seed, r, shape=(n, 6))
        gpu = self.on_gpu
        graph("all_reduce", lambda x: dist.all_reduce(x),
              lambda k: (gpu(block(14, k)),),
              lambda k: sum(block(14, k, r) for r in range(p)))
        graph("reduce_scatter_tensor", lambda out, x: dist.reduce_scatter_tensor(out, x),
              lambda k: (torch.empty((rows, 6), device=self.device), gpu(block(15, k))),
              lambda k: sum(block(15, k, r) for r in range(p))[me * rows:(me + 1) * rows])
        graph("all_gather_into_tensor", lambda out, x: dist.all_gather_into_tensor(out, x),
              lambda k: (torch.empty((p * rows, 6), device=self.device), gpu(block(16, k, n=rows))),
              lambda k: torch.cat([block(16, k, r, n=rows) for r in range(p)]))

    # -- DDP ------------------------------------------------------------------------------

    def ddp(self):
        ours, native = dist.group.WORLD, self.native
        for variant in VARIANTS:
            def case(variant=variant):
                mine = train(ours, variant, self.device, self.rank)
                theirs = train(native, variant, self.device, self.rank)
                flat = torch.cat([t.flatten() for t in mine]).to(self.device)
                every = torch.empty((self.size, flat.numel()), device=self.device)
                dist.all_gather_into_tensor(every, flat, group=native)
                if not all(torch.equal(every[0], every[r]) for r in range(self.size)):
                    return "parameters differ between ranks"
                start = [t.detach().cpu() for t in model(self.device).parameters()]
                if any(torch.equal(a, s) for a, s in zip(mine, start)):
                    return "training did not move the parameters"
                for a, b in zip(mine, theirs):
                    if self.size == 2 and not torch.equal(a, b):
                        return f"not bitwise equal to NCCL's: max diff {(a - b).abs().max()}"
                    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
                return None
            self.check(f"DDP {variant} against NCCL", case)


    # -- FSDP2 and DTensor -----------------------------------------------------------------

    def fsdp2(self):
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
        ours = init_device_mesh("cuda", (self.size,))          # the default group: ours
        native = DeviceMesh.from_group(self.native, "cuda")

        def trained():
            mine = train_fsdp2(ours, self.device, self.rank)
            theirs = train_fsdp2(native, self.device, self.rank)
            start = [t.detach().cpu() for t in model(self.device).parameters()]
            if any(torch.equal(a, s) for a, s in zip(mine, start)):
                return "training did not move the parameters"
            for a, b in zip(mine, theirs):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            return None
        self.check("FSDP2 (fully_shard) trained on ours against NCCL", trained)

        def redistribute():
            full = torch.arange(self.size * 4 * 3, dtype=torch.float32).reshape(-1, 3)
            sharded = distribute_tensor(full.to(self.device), ours, [Shard(0)])
            problem = self.same("DTensor shard", sharded.to_local(),
                                full[4 * self.rank:4 * self.rank + 4])
            return problem or self.same("DTensor Shard(0) -> Replicate",
                                        sharded.redistribute(ours, [Replicate()]).to_local(),
                                        full)
        self.check("DTensor redistribute on CUDA", redistribute)


def train_fsdp2(mesh, device, rank):
    """STEPS steps of SGD under FSDP2 (``fully_shard`` per Linear and on the model) over
    ``mesh``; each rank's own data. Returns the full parameters, on the CPU."""
    from torch.distributed.fsdp import fully_shard
    net = model(device)
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(2000 + rank)
    for _ in range(STEPS):
        opt.zero_grad()
        x, y = torch.randn(16, 32, generator=gen), torch.randn(16, 8, generator=gen)
        nn.functional.mse_loss(net(x.to(device)), y.to(device)).backward()
        opt.step()
    torch.cuda.synchronize()
    return [p.full_tensor().detach().cpu().clone() for p in net.parameters()]


def model(device):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 8)).to(device)


def train(group, variant, device, rank):
    """STEPS steps of SGD with DDP over ``group``; each rank's own data (seeded by rank).
    Buckets of 10 KB: the 64x64 layer alone fills one, so there are several."""
    ddp = DDP(model(device), device_ids=[device.index], process_group=group,
              bucket_cap_mb=0.01)
    if variant == "allreduce_hook":
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)

    def batch():
        return (torch.randn(16, 32, generator=gen).to(device),
                torch.randn(16, 8, generator=gen).to(device))
    for _ in range(STEPS):
        opt.zero_grad()
        if variant == "no_sync":
            x, y = batch()
            with ddp.no_sync():
                nn.functional.mse_loss(ddp(x), y).backward()
        x, y = batch()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    torch.cuda.synchronize()
    return [p.detach().cpu().clone() for p in ddp.module.parameters()]


def delay(cycles):
    """A long kernel on the current torch stream (torch.cuda._sleep, else matmuls)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(cycles)
        return
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        a = a @ a / 64.0


def stage(rank, text):
    print(f"stage rank {rank} {time.time() - T0:6.1f}s: {text}", flush=True)


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--store", required=True, help="a fresh file for the file:// rendezvous")
    args.add_argument("--pid-dir", default="", help="write pid.RANK here (the test kills by id)")
    args.add_argument("--deadline", type=float, default=0.0,
                      help="seconds; past it every thread's stack goes to stderr and the "
                           "process exits (a hang never outlives the test)")
    args = args.parse_args()
    if args.deadline > 0:
        faulthandler.dump_traceback_later(args.deadline, exit=True)
    from mpi4py import MPI
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"pid.{rank}"), "w") as f:
            f.write(str(os.getpid()))
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("MPI_LOCALRANKID",
                                                                             rank)))
    device = torch.device("cuda", local % torch.cuda.device_count())
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    stage(rank, f"started, {size} ranks on {device}, torch {torch.__version__}")
    dist.init_process_group("collectives", init_method=f"file://{args.store}", rank=rank,
                            world_size=size)
    native = dist.new_group(backend="nccl")
    suite = Suite(rank, size, device, native)
    stage(rank, "collectives")
    suite.collectives()
    stage(rank, "streams")
    suite.streams()
    stage(rank, "DDP")
    suite.ddp()
    stage(rank, "FSDP2 and DTensor")
    suite.fsdp2()
    stage(rank, "destroy_process_group")
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "size": size, "runs": suite.runs,
                                  "failures": [f[:300] for f in suite.failures[:8]],
                                  "failed": len(suite.failures)}), flush=True)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()
    os._exit(1 if suite.failures else 0)


if __name__ == "__main__":
    main()
