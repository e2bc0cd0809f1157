"""DDP or FSDP2 training step time on our torch backend beside the native one of the same
run: gloo on CPUs, NCCL on GPUs.

    python benchmarks/ddp.py --nproc 2                      # CPU ranks: ours vs gloo
    python benchmarks/ddp.py --nproc 4 --device cuda        # one GPU a rank: ours vs nccl
    python benchmarks/ddp.py --nproc 2 --wrap fsdp2         # FSDP2 (fully_shard) instead of DDP
    torchrun --nproc-per-node 4 benchmarks/ddp.py --device cuda    # or under a launcher

With ``--nproc`` it starts the ranks itself (torchrun's variables, rank 0 hosting torch's
TCPStore); under torchrun or ``python -m collectives.run`` (RANK set) it is one rank. Every
rank builds the same model twice (an MLP of ``--layers`` Linear(width, width): 48 MiB of
float32 parameters by default), wraps one copy over ``init_process_group("collectives")``'s
group and one over ``new_group(backend=native)`` and times training steps: forward, backward,
SGD step, and on GPUs a synchronize at the end of each.

- ``--wrap ddp`` (the default): DistributedDataParallel with ``--bucket-mb`` buckets (25 MiB,
  DDP's default); the backward pass all_reduces the buckets.
- ``--wrap fsdp2``: ``fully_shard`` on every Linear and then on the model (the usual FSDP2
  wrapping: one unit per layer, the root holding what is left), over a DeviceMesh of each
  group: ours as a user makes it, ``init_device_mesh(device, (world,))`` on the default group,
  the native one ``DeviceMesh.from_group(native_group, device)``. Each unit all_gathers its
  parameters before its forward and backward and reduce_scatters its gradients after the
  backward. FSDP2 has no buckets: ``--bucket-mb`` is refused.

The two copies run in alternating rounds (order swapped every round, so drift hits both
alike). Rank 0 prints each backend's median step time and its spread (IQR / median), the
ratio ours/native of each round's medians (median, min, max: the run's noise) and, with
``--json``, writes the record. Both copies start from the same parameters and take the same
steps on the same data, so at the end their parameters must agree: the largest difference,
beside the largest change training made, is printed and recorded; a difference beyond float
rounding (1% of that change plus a few ulps) fails the run (exit 1): a fast wrong step is no
result.
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
WRAPS = ("ddp", "fsdp2")
DEFAULT_BUCKET_MB = 25.0        # DDP's own default
MISMATCH = 1e-2                 # the copies may differ by this fraction of the parameters' change
ULPS = 8                        # and by this many float32 ulps of the largest parameter


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=0,
                   help="start this many ranks here (0: this process is one rank of a launcher)")
    p.add_argument("--device", choices=sorted(NATIVE), default="cpu")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--width", type=int, default=2048)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--wrap", choices=WRAPS, default="ddp",
                   help="ddp: DistributedDataParallel; fsdp2: fully_shard per Linear and on the "
                        "model (default: ddp)")
    p.add_argument("--bucket-mb", type=float, default=None,
                   help=f"DDP's bucket size in MiB (default: {DEFAULT_BUCKET_MB:g}); not with "
                        f"--wrap fsdp2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="timed steps per backend per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per backend first")
    p.add_argument("--json", default="", help="write rank 0's record here")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before the ranks started with --nproc are killed")
    args = p.parse_args(argv)
    if args.wrap == "fsdp2" and args.bucket_mb is not None:
        p.error("--bucket-mb sets DDP's buckets; FSDP2 has none (each fully_shard unit, here "
                "one per Linear, gathers and reduces its own parameters): drop it, or use "
                "--wrap ddp")
    if args.wrap == "ddp" and args.bucket_mb is None:
        args.bucket_mb = DEFAULT_BUCKET_MB
    return args


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


def trainer(args, group, device, mesh=None):
    """(wrapped model, optimizer) of one copy of the model over ``group``: DDP, or with
    ``mesh`` (a DeviceMesh of ``group``) FSDP2."""
    import torch
    from torch import nn
    if mesh is not None:
        from torch.distributed.fsdp import fully_shard
        wrapped = model(args, device)
        for layer in wrapped:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(wrapped, mesh=mesh)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        ids = [device.index] if device.type == "cuda" else None
        wrapped = DDP(model(args, device), device_ids=ids, process_group=group,
                      bucket_cap_mb=args.bucket_mb)
    return wrapped, torch.optim.SGD(wrapped.parameters(), lr=1e-4)


def meshes(args, native_group):
    """The DeviceMesh of each group for FSDP2: ours as a user makes it (``init_device_mesh``,
    whose one-dimensional mesh of the whole world is the default group), the native group's
    from the group."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    import torch.distributed as dist
    ours = init_device_mesh(args.device, (dist.get_world_size(),))
    if dist.get_backend(ours.get_group()) != OURS:
        raise RuntimeError(f"init_device_mesh's group runs {dist.get_backend(ours.get_group())},"
                           f" not {OURS}")
    return ours, DeviceMesh.from_group(native_group, args.device)


def full_parameters(wrapped):
    """The whole parameters on the CPU (FSDP2's are DTensor shards: gathered)."""
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for p in wrapped.parameters()]


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


def torch_groups(device_type: str):
    """One rank's two groups of the same ranks, for a benchmark run under a launcher:
    ``init_process_group`` on our backend (the default group) and ``new_group`` on the native
    one (gloo on CPUs, NCCL on GPUs; this rank's GPU from LOCAL_RANK). Returns (rank, device,
    native backend's name, native group, {name: group})."""
    sys.path.insert(0, ROOT)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.distributed as dist
    import collectives.c10d  # noqa: F401  (registers "collectives")

    rank = int(os.environ["RANK"])
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group(OURS)
    native_name = NATIVE[device_type]
    native_group = dist.new_group(backend=native_name)
    return rank, device, native_name, native_group, {OURS: dist.group.WORLD,
                                                     native_name: native_group}


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist

    rank, device, native_name, native_group, groups = torch_groups(args.device)
    size = dist.get_world_size()
    mesh = dict(zip(groups, meshes(args, native_group))) if args.wrap == "fsdp2" else {}
    runs = {name: trainer(args, group, device, mesh.get(name)) for name, group in groups.items()}
    start = full_parameters(runs[native_name][0])
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
    check = compare(start, *(full_parameters(runs[name][0]) for name in (OURS, native_name)))
    dist.barrier()
    if rank == 0:
        report(args, size, device, native_name, times, gpu_path(dist.group.WORLD), check)
    dist.destroy_process_group()
    return 0 if check["ok"] else 1


def compare(start, ours, native) -> dict:
    """Our copy's parameters against the native copy's, both trained from ``start``: the
    largest difference, the largest change training made, and whether the difference is
    within ``MISMATCH`` of that change plus a few ulps of the largest parameter (the two
    reduce in different orders, so updates rounded an ulp apart are right; a missed or doubled
    gradient is as large as the change itself)."""
    import torch
    diff = max(float((a - b).abs().max()) for a, b in zip(ours, native))
    moved = max(float((b - a).abs().max()) for a, b in zip(start, native))
    largest = max(float(b.abs().max()) for b in native)
    tolerance = MISMATCH * moved + ULPS * torch.finfo(torch.float32).eps * largest
    return {"max_param_diff": diff, "max_param_change": moved, "tolerance": tolerance,
            "ok": diff <= tolerance}        # False for a NaN too


def gpu_path(group) -> str:
    """How our group ran CUDA tensors: the executor the NCCL transport's group chose (peer
    memory, or our schedules on NCCL send/recv, and why); "" on CPUs."""
    gpu = getattr(group, "_gpu", None)
    if gpu is None:
        return ""
    execute = gpu.execute
    return f"{getattr(execute, '__module__', type(execute).__module__)} " \
           f"({gpu.executor.peer_path or 'no peer-memory path'})"


def report(args, size, device, native_name, times, path="", check=None):
    import torch
    params = args.layers * (args.width * args.width + args.width)
    mib = params * 4 / 2**20
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{os.cpu_count()} CPU cores"
    wrapping = f"buckets {args.bucket_mb:g} MiB" if args.wrap == "ddp" else \
        f"fully_shard per Linear and on the model ({args.layers + 1} units)"
    print(f"{args.wrap.upper()} training step, {size} ranks on {device.type} ({where}), torch "
          f"{torch.__version__}: model {mib:.1f} MiB ({args.layers} x Linear({args.width}, "
          f"{args.width})), {wrapping}, batch {args.batch}, "
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
    if check is not None:
        print(f"  parameters after training, {OURS} vs {native_name}: max |diff| "
              f"{check['max_param_diff']:.3g}, max change {check['max_param_change']:.3g}: "
              f"{'ok' if check['ok'] else 'WRONG (beyond float rounding)'}")
    if args.json:
        record = {"benchmark": args.wrap, "wrap": args.wrap, "date": time.strftime("%Y-%m-%d"),
                  "world_size": size,
                  "device": device.type, "where": where, "host": platform.node(),
                  "torch": torch.__version__, "model_mib": mib, "args": vars(args),
                  "gpu_path": path, "check": check,
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
