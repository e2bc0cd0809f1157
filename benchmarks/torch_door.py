"""Collectives called through ``torch.distributed``, as a training loop calls them: our backend
beside the native one (gloo on CPUs, NCCL on GPUs) of the same ranks in the same run.

    python -m collectives.run --standalone --nproc-per-node 2 benchmarks/torch_door.py
    torchrun --nproc-per-node 4 benchmarks/torch_door.py --device cuda
    mpiexec -n 4 python benchmarks/torch_door.py --device cuda --sizes 4K:1G

One process a rank, started by a launcher: ``python -m collectives.run``, torchrun, or mpiexec
(with mpi4py: rank 0's host and a free port become MASTER_ADDR and MASTER_PORT unless set).
Every rank calls ``init_process_group("collectives")`` (our backend, the default group) and
``new_group(backend=native)`` of the same ranks, then for each collective (all_reduce,
reduce_scatter_tensor, all_gather_into_tensor, all_to_all_single, or the names torch 2.13
gave the middle two: reduce_scatter_single, all_gather_single; float32, sum) and size:

- checks one call of each backend: inputs of small integers whose result is known exactly
  (wrong elements are counted; any fails the run, exit 1);
- times ``--iters`` calls back to back, ``dist.all_reduce(x, group=g)`` and friends as a
  training loop makes them (``async_op=False``), then one synchronize: the host clock per
  call, and on CUDA the time between CUDA events recorded on the current stream before the
  first call and after the last (the GPU's view of the same loop). Each batch starts after a
  fence (a one-element all_reduce on the native group, and on CUDA a synchronize); its time is
  the slowest rank's;
- the two backends alternate, ``--rounds`` rounds, order swapped every round, so drift hits
  both alike.

``size`` is the larger buffer of a call, as in bench.py (all_gather's output, reduce_scatter's
input), rounded down to a whole float32 per rank. Rank 0 prints per row the median over rounds
of each backend's time per call, the ratio ours/native of each round's times (median, and min
and max over rounds: the row's noise) for each clock, and the run's noise: the median over
rows of (max - min) / median of the per-round ratio; a ratio nearer to 1 than that is a tie.
``--json`` writes the records.

bench.py measures our algorithms through the facade (``import collectives``), beside the
transport's native collective; this script measures what a torch user gets, so it calls
nothing but ``torch.distributed``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp import NATIVE, OURS, ROOT, gpu_path, torch_groups  # noqa: E402  (beside this script)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
DEFAULT_SIZES = {"cpu": "4K:1M", "cuda": "4K:1G"}
CLOCKS = {"cpu": ("host",), "cuda": ("host", "event")}
CALLS = {"all_reduce": ("all_reduce",),
         "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor"),
         "all_gather": ("all_gather_single", "all_gather_into_tensor"),
         "all_to_all": ("all_to_all_single",)}
MPI_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", choices=sorted(NATIVE), default="cpu",
                   help="cpu: tensors on the CPU, gloo the baseline; cuda: one GPU a rank "
                        "(LOCAL_RANK's), NCCL the baseline")
    p.add_argument("--sizes", default="",
                   help="bytes of a call's larger buffer: 4K,64K or 4K:1G (x4 steps) or "
                        "4K:1G:2; default " + ", ".join(f"{k}: {v}" for k, v in
                                                        DEFAULT_SIZES.items()))
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help="which of " + ", ".join(COLLECTIVES))
    p.add_argument("--rounds", type=int, default=5, help="rounds of every row, interleaved")
    p.add_argument("--iters", type=int, default=0,
                   help="calls per timed batch (0: as many as take about --min-time, 5 to "
                        "1000, the same on every rank)")
    p.add_argument("--min-time", type=float, default=0.05,
                   help="seconds a timed batch aims at when --iters is 0")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per backend per row")
    p.add_argument("--json", default="", help="write rank 0's records here")
    args = p.parse_args(argv)
    from collectives.bench.cases import parse_sizes
    try:
        args.size_list = parse_sizes(args.sizes or DEFAULT_SIZES[args.device])
    except ValueError as error:
        p.error(str(error))
    args.collective_list = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = sorted(set(args.collective_list) - set(COLLECTIVES))
    if unknown or not args.collective_list:
        p.error(f"--collectives: unknown {', '.join(unknown) or '(none given)'}; choose from "
                f"{', '.join(COLLECTIVES)}")
    if args.rounds < 1 or args.iters < 0 or args.warmup < 0:
        p.error("--rounds must be at least 1, --iters and --warmup at least 0")
    return args


# -- the job ----------------------------------------------------------------------------------


def from_mpiexec() -> bool:
    """Under mpiexec without torch's variables: set RANK, WORLD_SIZE, LOCAL_RANK and (unless
    set) MASTER_ADDR/MASTER_PORT from MPI (rank 0's host, a port free there). False when MPI
    did not start this process."""
    if "RANK" in os.environ or not any(v in os.environ for v in MPI_RANK_VARIABLES):
        return False
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    master = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            master = (os.environ.get("MASTER_ADDR", socket.gethostname()),
                      os.environ.get("MASTER_PORT", str(s.getsockname()[1])))
    master = world.bcast(master)
    os.environ.update(RANK=str(world.rank), WORLD_SIZE=str(world.size),
                      LOCAL_RANK=str(node.rank), LOCAL_WORLD_SIZE=str(node.size),
                      MASTER_ADDR=master[0], MASTER_PORT=master[1])
    node.Free()
    return True


def function(collective):
    """The torch.distributed function a user calls for ``collective``: torch 2.13 renamed
    reduce_scatter_tensor and all_gather_into_tensor (the old names warn, then call the new
    ones), so the newest name this torch has."""
    import torch.distributed as dist
    for name in CALLS[collective]:
        if hasattr(dist, name):
            return getattr(dist, name)
    raise RuntimeError(f"torch.distributed has none of {', '.join(CALLS[collective])}")


class Rows:
    """The buffers of one (collective, size): a timing pair and a checking pair, with the
    call made through ``torch.distributed``."""

    def __init__(self, collective, nbytes, size, rank, device):
        import torch
        self.collective, self.size, self.rank = collective, size, rank
        count = max(1, nbytes // 4)
        if collective != "all_reduce":
            count = max(1, count // size) * size
        self.count, self.nbytes = count, count * 4
        small = count if collective == "all_reduce" else count // size
        shapes = {"all_reduce": (count, count), "reduce_scatter": (count, small),
                  "all_gather": (small, count), "all_to_all": (count, count)}[collective]
        self.input = torch.zeros(shapes[0], device=device)
        self.output = torch.zeros(shapes[1], device=device)
        self.function = function(collective)

    def call(self, group):
        if self.collective == "all_reduce":
            self.function(self.input, group=group)
        else:
            self.function(self.output, self.input, group=group)

    def check(self, group) -> int:
        """Wrong elements of one call on known inputs (small integers: exact in float32)."""
        import torch
        size, rank, device = self.size, self.rank, self.input.device
        index = dict(dtype=torch.int32, device=device)      # 1 GiB of float32 is 2^28 elements
        k = torch.arange(self.input.numel(), **index)
        if self.collective == "all_reduce":
            self.input.copy_(k % 5 + rank % 7 + 1)
            self.call(group)
            ranks = torch.arange(size, device=device)
            expected = size * (k % 5) + float((ranks % 7 + 1).sum())
            got = self.input
        elif self.collective == "reduce_scatter":
            self.input.copy_(k % 5 + rank % 7 + 1)
            self.call(group)
            ranks = torch.arange(size, device=device)
            mine = torch.arange(self.output.numel(), **index) + rank * self.output.numel()
            expected = size * (mine % 5) + float((ranks % 7 + 1).sum())
            got = self.output
        elif self.collective == "all_gather":
            self.input.copy_(k % 13 + rank * 3 + 1)
            self.call(group)
            j = torch.arange(self.output.numel(), **index)
            block = self.input.numel()
            expected = (j % block) % 13 + (j // block) * 3 + 1
            got = self.output
        else:       # block d of this rank's input goes to rank d
            block = self.input.numel() // size
            self.input.copy_((k % block) % 13 + rank * 7 + (k // block) * 3 + 1)
            self.call(group)
            j = torch.arange(self.output.numel(), **index)
            expected = (j % block) % 13 + (j // block) * 7 + rank * 3 + 1
            got = self.output
        wrong = int((got != expected.to(got.dtype)).sum())
        self.input.zero_()          # timed calls sum zeros: values that never overflow
        self.output.zero_()
        return wrong


def fence(native_group, device):
    """Every rank here and the device idle: the batch that follows starts together."""
    import torch
    import torch.distributed as dist
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.all_reduce(torch.zeros(1, device=device), group=native_group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch(row, group, iters, native_group, device) -> dict:
    """Seconds per call of ``iters`` calls back to back then one synchronize, the slowest
    rank's: ``host`` by the host's clock, and on CUDA ``event`` between events on the current
    stream."""
    import torch
    import torch.distributed as dist
    fence(native_group, device)
    if device.type == "cuda":
        first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        first.record()
        start = time.perf_counter()
        for _ in range(iters):
            row.call(group)
        last.record()
        torch.cuda.synchronize(device)
        host = time.perf_counter() - start
        times = [host, first.elapsed_time(last) / 1e3]
    else:
        start = time.perf_counter()
        for _ in range(iters):
            row.call(group)
        times = [time.perf_counter() - start]
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=native_group)
    return dict(zip(CLOCKS[device.type], (t / iters for t in slowest.tolist())))


def choose_iters(args, row, groups, native_group, device) -> int:
    """--iters, or the calls that take about --min-time on the slower backend (rank 0's
    estimate, sent to every rank so that all make the same calls)."""
    import torch
    import torch.distributed as dist
    if args.iters:
        return args.iters
    probe = max(batch(row, g, 2, native_group, device)["host"] for g in groups.values())
    n = torch.tensor([min(1000, max(5, round(args.min_time / max(probe, 1e-9))))],
                     device=device)
    dist.broadcast(n, 0, group=native_group)
    return int(n.item())


def rank_main(args) -> int:
    import torch
    import torch.distributed as dist

    rank, device, native_name, native_group, groups = torch_groups(args.device)
    size = dist.get_world_size()
    records = []
    for collective in args.collective_list:
        for nbytes in args.size_list:
            row = Rows(collective, nbytes, size, rank, device)
            wrong = {name: row.check(g) for name, g in groups.items()}
            counts = torch.tensor(list(wrong.values()), dtype=torch.int64, device=device)
            dist.all_reduce(counts, group=native_group)
            wrong = dict(zip(groups, counts.tolist()))
            for g in groups.values():
                for _ in range(args.warmup):
                    row.call(g)
            iters = choose_iters(args, row, groups, native_group, device)
            rounds = {name: [] for name in groups}
            for r in range(args.rounds):
                for name in (list(groups) if r % 2 == 0 else list(groups)[::-1]):
                    rounds[name].append(batch(row, groups[name], iters, native_group, device))
            records.append(record(collective, row, iters, wrong, rounds, native_name, device))
            del row
    dist.barrier(group=native_group)
    if rank == 0:
        report(args, size, device, native_name, records, gpu_path(dist.group.WORLD))
    dist.destroy_process_group()
    return 1 if any(sum(r["wrong"].values()) for r in records) else 0


def record(collective, row, iters, wrong, rounds, native_name, device) -> dict:
    """One row: per clock, each backend's median time per call over the rounds (µs), and the
    ratio ours/native of every round with its median."""
    out = {"collective": collective, "size": row.nbytes, "count": row.count, "iters": iters,
           "wrong": wrong}
    for clock in CLOCKS[device.type]:
        us = {name: [b[clock] * 1e6 for b in batches] for name, batches in rounds.items()}
        ratios = [a / b for a, b in zip(us[OURS], us[native_name])]
        out[clock] = {"us": {name: statistics.median(v) for name, v in us.items()},
                      "rounds_us": us, "ratio": statistics.median(ratios), "ratios": ratios,
                      "noise": (max(ratios) - min(ratios)) / statistics.median(ratios)}
    return out


def report(args, size, device, native_name, records, path=""):
    import torch
    from collectives.tuning import format_bytes
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"{os.cpu_count()} CPU cores"
    clocks = CLOCKS[device.type]
    calls = ", ".join(function(c).__name__ for c in args.collective_list)
    print(f"through torch.distributed ({calls}), {size} ranks on {device.type} ({where}), torch "
          f"{torch.__version__}: {OURS} vs {native_name} (new_group of the same ranks), "
          f"float32 sum, rounds interleaved: {args.rounds}; time per call, median over rounds; "
          f"ratio {OURS}/{native_name} per round: median (min-max)")
    if path:
        print(f"  {OURS} on CUDA: {path}")
    short = {OURS: "ours", native_name: native_name}
    for collective in args.collective_list:
        rows = [r for r in records if r["collective"] == collective]
        print(f"# {collective}")
        head = f"{'size':>6} {'iters':>5}"
        for clock in clocks:
            head += f" | {clock + ': ' + short[OURS] + ' us':>14} {native_name + ' us':>10} " \
                    f"{'ratio (min-max)':>20}"
        print(head + " | wrong")
        for r in rows:
            line = f"{format_bytes(r['size']):>6} {r['iters']:>5}"
            for clock in clocks:
                c = r[clock]
                line += f" | {c['us'][OURS]:14.1f} {c['us'][native_name]:10.1f} " \
                        f"{c['ratio']:7.3f} ({min(c['ratios']):.2f}-{max(c['ratios']):.2f})"
            line += " | " + ("0" if not sum(r["wrong"].values()) else
                             ", ".join(f"{k} {v}" for k, v in r["wrong"].items() if v))
            print(line)
    noise = {clock: statistics.median(r[clock]["noise"] for r in records) for clock in clocks}
    print("noise (median over rows of the per-round ratio's (max-min)/median): " +
          ", ".join(f"{clock} {100 * v:.1f}%" for clock, v in noise.items()))
    bad = [r for r in records if sum(r["wrong"].values())]
    print("results: " + ("all correct" if not bad else
                         f"WRONG in {len(bad)} rows: " + ", ".join(
                             f"{r['collective']} {format_bytes(r['size'])}" for r in bad)))
    if args.json:
        meta = {"benchmark": "torch_door", "date": time.strftime("%Y-%m-%d"),
                "world_size": size, "device": device.type, "where": where,
                "host": platform.node(), "torch": torch.__version__, "ours": OURS,
                "native": native_name, "clocks": list(clocks), "gpu_path": path,
                "calls": {c: function(c).__name__ for c in args.collective_list},
                "noise": noise, "args": {k: v for k, v in vars(args).items()
                                         if k not in ("size_list", "collective_list")}}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "records": records}, f, indent=1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, ROOT)
    args = parse(argv)
    if not from_mpiexec() and "RANK" not in os.environ:
        print("torch_door.py: one rank of a job: run it under python -m collectives.run, "
              "torchrun or mpiexec, e.g.\n    python -m collectives.run --standalone "
              "--nproc-per-node 2 benchmarks/torch_door.py", file=sys.stderr)
        return 2
    return rank_main(args)


if __name__ == "__main__":
    sys.exit(main())
