"""DDP training step time on our torch backend beside the native one of the same run: gloo
on CPUs, NCCL on GPUs.

    python benchmarks/ddp.py --nproc 2                      # CPU ranks: ours vs gloo
    python benchmarks/ddp.py --nproc 4 --device cuda        # one GPU a rank: ours vs nccl
    torchrun --nproc-per-node 4 benchmarks/ddp.py --device cuda    # or under a launcher

With ``--nproc`` it starts the ranks itself (torchrun's variables, rank 0 hosting torch's
TCPStore); under torchrun or ``python -m collectives.run`` (RANK set) it is one rank. Every
rank builds the same model twice (an MLP of ``--layers`` Linear(width, width): 48 MiB of
float32 parameters by default), wraps one copy in DDP over ``init_process_group
("collectives")``'s group and one over ``new_group(backend=native)``, both with
``--bucket-mb`` buckets (25 MiB, DDP's default), and times training steps: forward, backward
(DDP's bucketed all_reduce), SGD step, and on GPUs a synchronize at the end of each. The two
run in alternating rounds (order swapped every round, so drift hits both alike). Rank 0
prints each backend's median step time and its spread (IQR / median), the ratio ours/native
of each round's medians (median, min, max: the run's noise) and, with ``--json``, writes the
record.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NATIVE = {"cpu": "gloo", "cuda": "nccl"}
OURS = "collectives"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=0,
                   help="start this many ranks here (0: this process is one rank of a launcher)")
    p.add_argument("--device", choices=sorted(NATIVE), default="cpu")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per backend per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per backend first")
    p.add_argument("--json", default="", help="write rank 0's record here")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the ranks started with --nproc are killed")
    return p.parse_args(argv)


# -- starting the ranks -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args, argv) -> int:
    """Start args.nproc ranks of this script; returns rank 0's exit status (or the first
    failure's)."""
    port = str(_free_port())
    rest = [a for a in argv if not a.startswith("--nproc")]
    if "--nproc" in argv:                       # "--nproc N" as two words
        i = argv.index("--nproc")
        rest = argv[:i] + argv[i + 2:]
    procs = []
    for rank in range(args.nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(args.nproc),
                   LOCAL_WORLD_SIZE=str(args.nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *rest],
                                      env=env, start_new_session=True))
    deadline = time.monotonic() + args.timeout
    codes = []
    try:
        for proc in procs:
            codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
    except subprocess.TimeoutExpired:
        print(f"ddp.py: ranks still running after {args.timeout} s; killed", file=sys.stderr)
        for proc in procs:
            proc.kill()
        return 124
    return next((c for c in codes if c), 0)


# -- one rank -----------------------------------------------------------------------------------


def model(args, device):
    import torch
    from torch import nn
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(device)


def trainer(args, group, device):
    """(DDP, optimizer) of one copy of the model over ``group``."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    ids = [device.index] if device.type == "cuda" else None
    ddp = DDP(model(args, device), device_ids=ids, process_group=group,
              bucket_cap_mb=args.bucket_mb)
    return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4)


def step(ddp, opt, x, device) -> float:
    import torch
    start = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    ddp(x).square().mean().backward()
    opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def spread(values) -> float:
    """Interquartile range over median."""
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return (q[2] - q[0]) / q[1]


def rank_main(args) -> int:
    sys.path.insert(0, ROOT)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.distributed as dist
    import collectives.c10d  # noqa: F401  (registers "collectives")

    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group(OURS)
    size = dist.get_world_size()
    native_name = NATIVE[args.device]
    runs = {OURS: trainer(args, dist.group.WORLD, device),
            native_name: trainer(args, dist.new_group(backend=native_name), device)}
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, args.width, generator=gen).to(device)
    for ddp, opt in runs.values():
        for _ in range(args.warmup):
            step(ddp, opt, x, device)
    times = {name: [] for name in runs}          # per round: that round's step times
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        for name in order:
            ddp, opt = runs[name]
            times[name].append([step(ddp, opt, x, device) for _ in range(args.steps)])
    dist.barrier()
    if rank == 0:
        report(args, size, device, native_name, times, gpu_path(dist.group.WORLD))
    dist.destroy_process_group()
    return 0


def gpu_path(group) -> str:
    """How our group ran CUDA tensors: the executor the NCCL transport's group chose (peer
    memory, or our schedules on NCCL send/recv, and why); "" on CPUs."""
    gpu = getattr(group, "_gpu", None)
    if gpu is None:
        return ""
    execute = gpu.execute
    return f"{getattr(execute, '__module__', type(execute).__module__)} " \
           f"({getattr(gpu.transport, 'peer_path', 'no peer-memory path')})"


def report(args, size, device, native_name, times, path=""):
    import torch
    params = args.layers * (args.width * args.width + args.width)
    mib = params * 4 / 2**20
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{os.cpu_count()} CPU cores"
    print(f"DDP training step, {size} ranks on {device.type} ({where}), torch "
          f"{torch.__version__}: model {mib:.1f} MiB ({args.layers} x Linear({args.width}, "
          f"{args.width})), buckets {args.bucket_mb:g} MiB, batch {args.batch}, "
          f"{args.rounds} rounds x {args.steps} steps per backend")
    if path:
        print(f"  {OURS} on CUDA: {path}")
    summary = {}
    for name, rounds in times.items():
        flat = [t for rnd in rounds for t in rnd]
        summary[name] = {"median_ms": statistics.median(flat) * 1e3, "iqr_over_median": spread(flat)}
        print(f"  {name:12s} median {summary[name]['median_ms']:9.3f} ms/step   "
              f"IQR/median {100 * summary[name]['iqr_over_median']:5.1f}%")
    ratios = [statistics.median(a) / statistics.median(b)
              for a, b in zip(times[OURS], times[native_name])]
    print(f"  ratio {OURS}/{native_name} (step time, per round): median "
          f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
    if args.json:
        record = {"benchmark": "ddp", "date": time.strftime("%Y-%m-%d"), "world_size": size,
                  "device": device.type, "where": where, "host": platform.node(),
                  "torch": torch.__version__, "model_mib": mib, "args": vars(args),
                  "gpu_path": path,
                  "summary": summary, "ratios": ratios,
                  "times_ms": {k: [[t * 1e3 for t in rnd] for rnd in v]
                               for k, v in times.items()}}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.nproc:
        return spawn(args, argv)
    if "RANK" not in os.environ:
        print("ddp.py: give --nproc N, or run under torchrun / python -m collectives.run",
              file=sys.stderr)
        return 2
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
