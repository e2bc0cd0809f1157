"""The bench on GPUs: the nccl transport's groups, CUDA-event timing and the GPU-only rows.

    mpiexec -n 4 python benchmarks/bench.py --backend nccl [--sizes 1M,16M,256M,1G] [--json F]
    python -m collectives.run --standalone --nproc-per-node 4 benchmarks/bench.py --backend nccl
    python benchmarks/bench.py --backend nccl [--world-size N]   (launches one rank per GPU)

Rows, beside each other in one run with one timing (``timing.CudaEvents``): NCCL's own
collective (``native``); each of our algorithms as the group runs it (on peer memory where
the transport opened it, else NCCL send/recv); ``<alg>:sendrecv``, the same schedule on the
NCCL send/recv executor over the same transport, where the group runs peer memory;
``<alg>:ceiling``, the send/recv plan with its local copies and reductions removed (its
transfers alone, the bound a send/recv schedule cannot beat); ``<alg>:symm`` (all_reduce,
all_gather, all_to_all on peer memory), the schedule with its output in the group's
symmetric memory (``group.symmetric_empty``: peers write it directly, no staging), as
SymmetricMemory's rows run on symmetric buffers; ``two_shot:symm_in_place``, all_reduce
in place on such a buffer as SymmetricMemory's two-shot runs (one pass:
``two_shot_in_place``); ``<alg>:graph`` (sizes up to ``--graph-max``), the call captured once
as a CUDA graph and replayed; ``ring:seg=N``
(``--segments``), the pipelined send/recv executor; and for all_reduce, when torch can run
it here, torch's SymmetricMemory ``symm_mem:one_shot`` and ``symm_mem:two_shot``
(``SymmetricMemory``; every reason it cannot is one printed line, and the run goes on).
``--probe`` adds the raw p2p sweep: every GPU sends one block right and receives one from the
left, and the same bytes split over both neighbours.

NVLink multicast stays off: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set
when this module is imported (unless set already), before torch or NCCL initialise.

Two ways in. Under mpiexec the NCCL id travels through MPI and the host-side coordination
(barriers, the max of the ranks' times, the sum of wrong counts) uses ``MPI.COMM_WORLD``
(``MpiHost``). Under ``collectives.run``/torchrun each rank joins through
``collectives.rendezvous`` (env://), the id and the coordination go through that store
(``StoreHost``). Run by hand with neither, the bench re-executes itself under the launcher
with one rank per visible GPU (or ``--world-size``).
"""
from __future__ import annotations

import dataclasses
import os
import weakref

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402

from ..algorithms import capabilities  # noqa: E402
from ..algorithms.schedule import Plan, Recv, Region, Send, Step, build_plan, plan_args  # noqa
from ..executors import nccl as executor  # noqa: E402
from ..group import ProcessGroup  # noqa: E402
from ..transports import nccl as nccl_transport  # noqa: E402
from .backends import launch, launched, under_mpi  # noqa: E402
from .cases import Case, format_size, parse_sizes  # noqa: E402
from .symmetric import SymmetricMemory  # noqa: E402
from .sweep import Entry  # noqa: E402
from .timing import CudaEvents, MpiHost, StoreHost, split, timed  # noqa: E402

__all__ = ["GpuBench", "MpiHost", "StoreHost", "nccl_group", "probe", "self_launch", "timed",
           "transfers_only"]


def nccl_group(timeout=300.0, init_method=None, rank=None, world_size=None):
    """(group, cupy) for this process, one GPU per rank. Under mpiexec the NCCL id goes
    through MPI; under a launcher (RANK/WORLD_SIZE/MASTER_* set), or with ``init_method``,
    through the rendezvous store (``rank``/``world_size`` override the environment's).
    ``group.bench_host`` is the matching host coordinator (``MpiHost`` or ``StoreHost``)."""
    import cupy
    if init_method is None and (under_mpi() or not launched()):
        host = MpiHost()
        transport = nccl_transport.create(rank=host.rank, world_size=host.size,
                                          timeout=timeout)
    else:
        from datetime import timedelta

        from ..rendezvous import rendezvous
        store, rank, size = rendezvous(init_method or "env://", rank=rank,
                                       world_size=world_size,
                                       timeout=timedelta(seconds=timeout))
        transport = nccl_transport.create(rank=rank, world_size=size, store=store,
                                          timeout=timeout)
        host = StoreHost(store, rank, size, timeout)
    group = ProcessGroup(transport, backend="nccl", timeout=timeout)
    group.bench_host = host
    return group, cupy


def self_launch(argv, world_size=None) -> int:
    """``bench.py --backend nccl`` run by hand: the same command under ``collectives.run``,
    one rank per visible GPU (or ``world_size``); rank 0's output passed through."""
    if world_size is None:
        usable, why = nccl_transport.available()
        if not usable:
            raise ValueError(f"--backend nccl: {why}")
        import cupy
        world_size = cupy.cuda.runtime.getDeviceCount()
    return launch(list(argv), world_size)


def transfers_only(plan: Plan) -> Plan:
    steps = tuple(Step(s.sends, s.recvs, ()) for s in plan.steps if s.sends or s.recvs)
    return dataclasses.replace(plan, steps=steps)


def iterations(nbytes) -> tuple[int, int]:
    """(back-to-back calls per batch, batches) by size: enough calls that a batch outlasts
    the events' resolution, few enough that 1 GiB rows stay short."""
    if nbytes <= 4 << 20:
        return 50, 7
    if nbytes <= 64 << 20:
        return 10, 5
    return 3, 5


def _counts(collective, count, p):
    if collective == "all_reduce":
        return count
    if collective == "all_to_all":
        return ((count // p,) * p,) * p
    return (count // p,) * p


def _plan_buffers(collective, d_in, d_out):
    if collective == "all_reduce":
        return {"output": d_out}
    return {"input": d_in, "output": d_out}


SYMMETRIC_ROWS = ("all_reduce", "all_gather", "all_to_all")   # whose outputs peers write
_HEAPS = weakref.WeakKeyDictionary()     # group -> its symmetric memory for those rows


def sendrecv_group(group):
    """The same group (transport, ranks, decision table) with its plans run by the NCCL
    send/recv executor, or None where the group runs them there already."""
    if group.execute is executor.execute:
        return None
    twin = ProcessGroup.__new__(ProcessGroup)
    twin.__dict__.update(group.__dict__)
    twin.execute = executor.execute
    twin._repeats, twin._lane = {}, None
    return twin


class GpuBench:
    """The nccl backend's side of the sweep: device buffers, CUDA events, host coordination
    through MPI or the store, and the GPU-only rows (see the module notes)."""

    def __init__(self, group, cupy, options=None, host=None):
        self.group, self.cupy = group, cupy
        self.clock = CudaEvents(cupy)
        self.host = host or getattr(group, "bench_host", None) or MpiHost()
        options = options or {}
        self.segments = tuple(options.get("segments") or ())
        self.graph_max = int(options.get("graph_max") or 0)
        self.baselines = bool(options.get("baselines", True))
        self.collectives = tuple(options.get("collectives") or ())
        self.twin = sendrecv_group(group)
        self.symmetric = None
        self._buffers = []
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def running(self):
        return self.stream            # every row's calls and events on this stream

    def prepare(self):
        leader = self.group.rank == 0
        if self.baselines and "all_reduce" in self.collectives:
            self.symmetric, why = SymmetricMemory.open(self.group, self.host)
            if self.symmetric is None and leader:
                print(f"# no symm_mem rows: {why}", flush=True)
        for _ in range(3):
            self.host.barrier()

    def batches(self, nbytes: int) -> int:
        return iterations(nbytes)[1]

    def iterations(self, nbytes, slowest, config, rounds) -> tuple[int, int]:
        calls, batches = iterations(nbytes)
        return split(calls * batches, batches)

    def entries(self, collective, count, dtype, op, names) -> list[Entry]:
        cupy, group, p, rank = self.cupy, self.group, self.group.size, self.group.rank
        case = Case(collective, rank, p, count, dtype, op)
        d_in, expect = cupy.asarray(case.input), cupy.asarray(case.expected)
        d_out = cupy.empty_like(expect)
        self._buffers = [d_in, d_out, expect]
        nbytes = count * dtype.itemsize
        have = capabilities()

        def entry(label, on, algorithm, output=d_out, **kw):
            def call():
                on.prepare(collective, input=d_in, output=output, op=op, algorithm=algorithm)()

            def poison():
                output[...] = 0

            def wrong():
                self.clock.settle()
                return int((output != expect).sum())
            kw.setdefault("env", {executor.ENV_GRAPH: "0"})
            return Entry(label, call, poison=poison, wrong=wrong, **kw)

        out = []
        plain = [n for n in names if n not in ("native", "auto")]
        for name in names:
            if name == "auto":
                out.append(entry("auto", group, "auto", chosen=group.resolve_algorithm(
                    collective, "auto", nbytes)))
                continue
            out.append(entry(name, group, name))
            if name == "native":
                if self.symmetric is not None and collective == "all_reduce":
                    out += self.symmetric.entries(case, d_in, expect, count, dtype, op,
                                                  self.host)
                continue
            if self.twin is not None:
                out.append(entry(f"{name}:sendrecv", self.twin, name, chosen=name))
                if collective in SYMMETRIC_ROWS and \
                        group.executor.peer is not None:
                    out.append(entry(f"{name}:symm", group, name, chosen=name,
                                     output=self._symmetric(expect)))
                    if collective == "all_reduce" and name == "two_shot":
                        out.append(self._in_place(name, d_in, expect))
            out.append(self._ceiling(collective, name, count, dtype, d_in, d_out))
        for name in plain if nbytes <= self.graph_max else ():
            out.append(entry(f"{name}:graph", group, name, chosen=name,
                             env={executor.ENV_GRAPH: "1"}))
        for seg in self.segments if "ring" in have[collective] else ():
            out.append(entry(f"ring:seg={format_size(seg)}", self.twin or group, "ring",
                             chosen="ring", env={executor.ENV_GRAPH: "0",
                                                 executor.ENV_SEGMENT: str(seg)}))
        return out

    def _symmetric(self, like):
        """An output like ``like`` in the group's symmetric memory (the <alg>:symm rows),
        grown collectively as sizes grow: every rank asks for the same rows in the same
        order. One allocation per group, kept across benches (a group has 16 at most)."""
        nbytes, group = like.nbytes, self.group
        heap = _HEAPS.get(group)
        if heap is None or heap.nbytes < nbytes:
            size = max(nbytes, 4 * (heap.nbytes if heap is not None else 1 << 20))
            heap = _HEAPS[group] = group.symmetric_empty(size, "uint8")
        return heap[:nbytes].view(like.dtype)

    def _in_place(self, name, d_in, expect) -> Entry:
        """``<alg>:symm_in_place``: the all_reduce in place on a buffer in symmetric memory,
        as SymmetricMemory's two-shot row runs (two_shot then runs as one pass,
        ``two_shot_in_place``). Each call feeds on the last one's result, so only the first
        call after a refill is checked."""
        group, buf = self.group, self._symmetric(expect)

        def call():
            group.prepare("all_reduce", input=buf, output=buf, algorithm=name)()

        def refill():
            buf[...] = d_in

        def wrong():
            self.clock.settle()
            return int((buf != expect).sum())
        return Entry(f"{name}:symm_in_place", call, chosen=name, poison=refill, wrong=wrong,
                     check_last=False, env={executor.ENV_GRAPH: "0"})

    def _ceiling(self, collective, name, count, dtype, d_in, d_out) -> Entry:
        group = self.group
        plan = build_plan(collective, name, group.rank, group.size,
                          *plan_args(collective, group.size, _counts(collective, count,
                                                                      group.size)))
        bare, buffers = transfers_only(plan), _plan_buffers(collective, d_in, d_out)

        def call():
            executor.execute(bare, group.transport, buffers, None, dtype=dtype)
        return Entry(f"{name}:ceiling", call, chosen=name, priced=False,
                     env={executor.ENV_SEGMENT: "0", executor.ENV_GRAPH: "0"})

    def annotate(self, records):
        """A row's ceiling's time over its own (1.0: at the bound of its transfers)."""
        times = {r["algorithm"]: r["time_p50_us"] for r in records}
        for r in records:
            ceiling = times.get(f"{r['algorithm']}:ceiling")
            if ceiling:
                r["ratio_to_ceiling"] = ceiling / r["time_p50_us"]

    def release(self):
        self._buffers = []
        if self.symmetric is not None:
            self.symmetric.release()
        self.cupy.get_default_memory_pool().free_all_blocks()

    def close(self):
        if self.symmetric is not None:
            self.symmetric.close()
        failures = executor.graph_cache(self.group.transport).failures
        return failures[:10]


def probe(group, cupy, host, sizes):
    """Ring step (send right, receive left) vs the same bytes split over both neighbours."""
    p, rank = group.size, group.rank
    right, left = (rank + 1) % p, (rank - 1) % p
    rows = []
    for nbytes in sizes:
        n = nbytes
        buf = cupy.empty(2 * n, dtype=cupy.uint8)
        half = n // 2
        one = Plan("probe", "one_peer", rank, p,
                   (Step(sends=(Send(right, Region("output", 0, n)),),
                         recvs=(Recv(left, Region("output", n, n)),)),), 0)
        two = Plan("probe", "two_peers", rank, p,
                   (Step(sends=(Send(right, Region("output", 0, half)),
                                Send(left, Region("output", half, n - half))),
                         recvs=(Recv(left, Region("output", n, half)),
                                Recv(right, Region("output", n + half, n - half)))),), 0)
        for plan in (one, two) if p > 2 else (one,):
            iters, reps = iterations(nbytes)
            host.barrier()
            t = timed(cupy, lambda plan=plan, buf=buf: executor.execute(
                plan, group.transport, {"output": buf}, None, dtype=np.uint8), iters, reps)
            t = host.max(t)
            rows.append({"probe": plan.algorithm, "size": nbytes, "time_us": t * 1e6,
                         "gbs_per_gpu": nbytes / t / 1e9})
            if rank == 0:
                print(f"#  p2p {plan.algorithm:>10} {format_size(nbytes):>6}: "
                      f"{t * 1e6:10.1f} us  {nbytes / t / 1e9:7.1f} GB/s per GPU out", flush=True)
        del buf
    return rows


def describe_gpus(group, cupy, host) -> dict:
    """What the GPU rows ran on, for the header and the JSON's meta (rank 0)."""
    transport = group.transport
    props = cupy.cuda.runtime.getDeviceProperties(transport.device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return {"gpu": name, "nccl": transport.version, "cupy": cupy.__version__,
            "host_sync": type(host).__name__,
            "peer_path": group.executor.peer_path,
            "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")
                    or k.startswith("TORCH_SYMM_MEM") or k.startswith("COLLECTIVES_")
                    and k != "COLLECTIVES_SECRET"}}


def options_from(args) -> dict:
    """The GPU rows' options from the bench's flags (absent flags: their defaults)."""
    segments = getattr(args, "segments", "") or ""
    graph_max = str(getattr(args, "graph_max", "16M") or "0")
    collectives = args.collectives
    if isinstance(collectives, str):
        collectives = tuple(c for c in collectives.split(",") if c)
    return {"segments": parse_sizes(segments) if segments else (),
            "graph_max": parse_sizes(graph_max)[0] if graph_max != "0" else 0,
            "collectives": tuple(collectives)}


def run_from_bench(args, group=None, host=None) -> int:
    """The GPU bench on ``args`` (a namespace with collectives, algorithms and sizes as
    comma-separated text, dtype, json; segments, graph_max, probe, iters, rounds where given)
    on ``group`` (default: ``nccl_group()``); ``host`` coordinates the ranks on the host
    (default: the group's). NCCL's own collective is always a row: it is the baseline.
    Returns the exit status (1 if any result was wrong)."""
    from .cli import run_groups
    from .sweep import Config
    if group is None:
        group, _ = nccl_group()
    if host is not None:
        group.bench_host = host
    algorithms = tuple(a for a in args.algorithms.split(",") if a)
    config = Config(collectives=tuple(c for c in args.collectives.split(",") if c),
                    algorithms=("native",) + tuple(a for a in algorithms if a != "native"),
                    sizes=parse_sizes(args.sizes), dtype=getattr(args, "dtype", "float32"),
                    op=getattr(args, "op", "sum"), iters=getattr(args, "iters", None),
                    warmup=getattr(args, "warmup", 2), rounds=getattr(args, "rounds", 1))
    for name, default in (("json", None), ("csv", None), ("plot", None), ("tune", None),
                          ("calibrate", None), ("probe", ""), ("timeout", 300.0),
                          ("backend", "nccl")):
        if not hasattr(args, name):
            setattr(args, name, default)
    import cupy
    return run_groups(args, config, [(group, cupy)])

