"""GPU benchmark of the NCCL transport: ours vs NCCL native vs the point-to-point ceiling.

    mpiexec -n 4 python benchmarks/bench.py --backend nccl [--sizes 1M,16M,256M,1G] [--json F]
    python -m collectives.run --standalone --nproc-per-node 4 benchmarks/bench.py --backend nccl
    python benchmarks/bench.py --backend nccl [--world-size N]   (launches one rank per GPU)
    mpiexec -n 4 python benchmarks/bench_nccl.py [--segments 64M] [--graph-max 16M] [--probe 1M:1G]

Rows in nccl-tests' terms (size = the larger buffer; busbw = algbw x 2(p-1)/p for
all_reduce, x (p-1)/p for all_gather, reduce_scatter, all_to_all). For each (collective,
size): NCCL's native collective, then each of our algorithms, then ``<alg>:ceiling`` = the
same plan with its local copies and reductions removed (its transfers alone, the bound a
send/recv schedule cannot beat), and optional ``ring:seg=N`` rows (pipelined executor).
Columns ``vs_native`` and ``vs_ceiling`` are time ratios (native time / ours; ceiling time /
ours). Timing: CUDA events around ``iters`` back-to-back calls on one stream (each call is
the whole user path: ``group.prepare(...)()``), repeated ``reps`` times; p50 over the reps.
Results are checked once per row (exact small-integer patterns from ``collectives.bench``).
``--probe`` adds the raw p2p sweep: every GPU sends one block right and receives one from the
left (one NCCL group), and the same split over both neighbours, at each size.

``<alg>:graph`` rows (sizes up to ``--graph-max``, default 16M) run the same call with
``COLLECTIVES_NCCL_GRAPH=1``: captured once as a CUDA graph, then replayed. ``collectives.bench``
hands ``--backend nccl`` to ``run_from_bench`` here: its timing (host clocks around host
buffers) does not fit stream-ordered GPU work.

Two ways in, one benchmark. Under mpiexec the NCCL id travels through MPI and the host-side
coordination (barriers before timing, the max of the ranks' times, the sum of wrong counts)
uses ``MPI.COMM_WORLD`` (``MpiHost``). Under ``collectives.run``/torchrun (RANK, WORLD_SIZE,
MASTER_ADDR/PORT set, no MPI) each rank joins through ``collectives.rendezvous`` (env://), the
id travels through that store, and the same coordination goes through the store
(``StoreHost``: per-round keys, a few small exchanges per row, never inside a timed region).
Run by hand with neither, ``bench.py --backend nccl`` re-executes itself under the launcher
with one rank per visible GPU (or ``--world-size``), as the socket backend does.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from . import settings
from .algorithms import capabilities
from .algorithms.schedule import Plan, Recv, Region, Send, Step, build_plan, plan_args
from .bench import BUS_FACTOR, Case, element_count, format_size, parse_sizes, tune
from .executors import nccl as executor
from .group import ProcessGroup, call_size
from .ops import ReduceOp
from .transports import nccl as nccl_transport


def timed(cupy, fn, iters, reps, warmup=2):
    """p50 over reps of (event time of `iters` back-to-back calls) / iters, in seconds."""
    stream = cupy.cuda.get_current_stream()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    samples = []
    for _ in range(reps):
        start = stream.record()
        for _ in range(iters):
            fn()
        end = stream.record()
        end.synchronize()
        samples.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / iters)
    return float(np.median(samples))


def transfers_only(plan: Plan) -> Plan:
    steps = tuple(Step(s.sends, s.recvs, ()) for s in plan.steps if s.sends or s.recvs)
    return dataclasses.replace(plan, steps=steps)


def iterations(nbytes):
    if nbytes <= 4 << 20:
        return 50, 7
    if nbytes <= 64 << 20:
        return 10, 5
    return 3, 5


def bench(group, cupy, args, host):
    p, rank = group.size, group.rank
    dtype = np.dtype(args.dtype)
    op = ReduceOp.SUM
    have = capabilities()
    rows = []
    for collective in args.collectives.split(","):
        for nbytes in parse_sizes(args.sizes):
            count = element_count(collective, nbytes, dtype.itemsize, p)
            case = Case(collective, rank, p, count, dtype, op)
            d_in, expect = cupy.asarray(case.input), cupy.asarray(case.expected)
            d_out = cupy.empty_like(expect)
            iters, reps = iterations(nbytes)
            iters = getattr(args, "iters", None) or iters
            names = ["native"] + [a for a in args.algorithms.split(",")
                                  if a in have[collective] or a == "auto"]
            variants = [(n, None) for n in names]
            variants += [(f"{a}:graph", None) for a in names[1:]
                         if nbytes <= args.graph_max and a != "auto"]
            variants += [("ring", seg) for seg in args.segments if "ring" in have[collective]]
            native_t = {}
            user_segment = settings.NCCL_SEGMENT_BYTES.raw()
            for name, seg in variants:
                label = name if seg is None else f"{name}:seg={format_size(seg)}"
                if name == "auto":      # show what auto chose, as the main suite does
                    label = "auto:" + group.resolve_algorithm(
                        collective, "auto", call_size(collective, _counts(collective, count, p),
                                                       p) * dtype.itemsize)
                _segment_setting(seg, user_segment)   # plain rows: the executor's default
                graph = name.endswith(":graph")
                os.environ[executor.ENV_GRAPH] = "1" if graph else "0"
                algorithm = name.split(":")[0]

                def call(d_in=d_in, d_out=d_out, algorithm=algorithm):
                    group.prepare(collective, input=d_in, output=d_out, op=op,
                                  algorithm=algorithm)()
                d_out[...] = 0
                call()
                cupy.cuda.get_current_stream().synchronize()
                wrong = int((d_out != expect).sum())
                host.barrier()
                t = timed(cupy, call, iters, reps)
                t = host.max(t)
                wrong = host.sum(wrong)
                rows.append(_row(collective, label, nbytes, count, t, p, wrong))
                if name == "native":
                    native_t[collective] = t
                os.environ[executor.ENV_GRAPH] = "0"
                if name not in ("native", "auto") and seg is None and not graph:
                    plan = build_plan(collective, name, rank, p,
                                      *plan_args(collective, p, _counts(collective, count, p)))
                    bare = transfers_only(plan)
                    bufs = _plan_buffers(collective, d_in, d_out)
                    os.environ[executor.ENV_SEGMENT] = "0"
                    host.barrier()
                    tc = timed(cupy, lambda: executor.execute(bare, group.transport, bufs,
                                                              None, dtype=dtype), iters, reps)
                    tc = host.max(tc)
                    rows.append(_row(collective, f"{name}:ceiling", nbytes, count, tc, p, 0))
                    rows[-2]["ceiling_s"] = tc
            _segment_setting(None, user_segment)
            for r in rows:
                if r["collective"] == collective and r["size"] == nbytes:
                    r["vs_native"] = native_t[collective] / r["time_s"]
                    if "ceiling_s" in r:
                        r["vs_ceiling"] = r["ceiling_s"] / r["time_s"]
            if rank == 0:
                for r in rows:
                    if r["collective"] == collective and r["size"] == nbytes:
                        print(fmt(r), flush=True)
            del d_in, d_out, expect, case
            cupy.get_default_memory_pool().free_all_blocks()
    return rows


def _segment_setting(seg, user_value):
    """``ring:seg=X`` rows pipeline in X-byte segments; every other row runs as a user's call
    would: with $COLLECTIVES_NCCL_SEGMENT_BYTES as the user set it, or the executor's default."""
    if seg is not None:
        os.environ[executor.ENV_SEGMENT] = str(seg)
    elif user_value is None:
        os.environ.pop(executor.ENV_SEGMENT, None)
    else:
        os.environ[executor.ENV_SEGMENT] = user_value


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


def _row(collective, algorithm, nbytes, count, t, p, wrong):
    algbw = nbytes / t / 1e9
    return {"collective": collective, "algorithm": algorithm, "size": nbytes, "count": count,
            "time_s": t, "time_us": t * 1e6, "algbw_gbs": algbw,
            "busbw_gbs": algbw * BUS_FACTOR[collective](p), "world_size": p, "wrong": wrong}


def fmt(r):
    vs_n = f"{r['vs_native']:.2f}x" if "vs_native" in r else ""
    vs_c = f"{r['vs_ceiling']:.2f}x" if "vs_ceiling" in r else ""
    return (f"{r['collective']:>14} {format_size(r['size']):>6} {r['algorithm']:>26} "
            f"{r['time_us']:>11.1f} {r['algbw_gbs']:>8.1f} {r['busbw_gbs']:>8.1f} "
            f"{vs_n:>9} {vs_c:>10} {r['wrong']:>6}")


HEADER = (f"{'collective':>14} {'size':>6} {'algorithm':>26} {'time_p50_us':>11} "
          f"{'algbw':>8} {'busbw':>8} {'vs_native':>9} {'vs_ceiling':>10} {'wrong':>6}")


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


def add_arguments(ap, standalone=True):
    if standalone:
        ap.add_argument("--collectives",
                        default="all_reduce,all_gather,reduce_scatter,all_to_all")
        ap.add_argument("--algorithms", default="ring,ring_bidirectional,tree,recursive_doubling")
        ap.add_argument("--sizes", default="1M,16M,256M,1G")
        ap.add_argument("--dtype", default="float32")
        ap.add_argument("--json")
    ap.add_argument("--segments", default="", help="ring:seg rows, e.g. 16M,64M")
    ap.add_argument("--graph-max", default="16M", help="graph rows up to this size (0: none)")
    ap.add_argument("--probe", default="", help="p2p sweep sizes, e.g. 1M:1G")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(ap)
    return run_from_bench(ap.parse_args())


MPI_LAUNCHER_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_SIZE",
                          "MPI_LOCALRANKID")
STORE_PREFIX = "collectives/bench_nccl"


def under_mpi() -> bool:
    """True when an MPI launcher (mpiexec, mpirun, srun with PMI) started this process."""
    return any(name in os.environ for name in MPI_LAUNCHER_VARIABLES)


def launched() -> bool:
    """True when something started this process as one rank of a job (MPI or a launcher)."""
    return under_mpi() or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


class MpiHost:
    """Host-side coordination through ``MPI.COMM_WORLD`` (the mpiexec path)."""

    def __init__(self, comm=None):
        from mpi4py import MPI
        self.mpi = MPI
        self.comm = comm or MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self):
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return self.comm.allreduce(value, op=self.mpi.MAX)

    def sum(self, value: int) -> int:
        return self.comm.allreduce(value)

    def close(self):
        pass


class StoreHost:
    """Host-side coordination through the rendezvous store (the launcher path).

    Each call is one round with its own keys, so every rank must make the same calls in the
    same order (the benchmark does). ``barrier``: a per-round counter; the last rank to
    arrive sets the round's release key that all wait on. ``max``/``sum``: every rank sets
    its value under ``<round>/<rank>`` and reads all of them (exact: floats travel as
    ``repr``). Cost: about ``size + 3`` store round trips per call, a few per benchmark row.
    Keys of a finished round are deleted one round later (once every rank has provably left
    it). ``close``: rank 0 waits until every rank has finished with the store, so a store
    served by rank 0 (torchrun without its agent store) outlives the others' last reads.
    """

    def __init__(self, store, rank: int, size: int, timeout: float = 300.0,
                 prefix: str = STORE_PREFIX):
        self.store, self.rank, self.size = store, rank, size
        self.timeout, self.prefix = timeout, prefix
        self.round = 0
        self._mine = []            # keys this rank set in the previous round

    def _next(self) -> str:
        self.round += 1
        return f"{self.prefix}/{self.round}"

    def _forget_previous(self, keys):
        """Called once every rank has entered this round: none still reads the previous."""
        for key in self._mine:
            self.store.delete_key(key)
        self._mine = keys

    def barrier(self):
        base = self._next()
        release = f"{base}/release"
        if self.store.add(f"{base}/arrived", 1) == self.size:
            self.store.set(release, b"1")
        self.store.wait([release], timeout=self.timeout)
        # one rank (0) deletes the counter and release key of a finished barrier round
        self._forget_previous([f"{base}/arrived", release] if self.rank == 0 else [])

    def gather(self, value: float) -> list:
        base = self._next()
        mine = f"{base}/{self.rank}"
        self.store.set(mine, repr(float(value)).encode())
        keys = [f"{base}/{r}" for r in range(self.size)]
        self.store.wait(keys, timeout=self.timeout)
        values = [float(self.store.get(k)) for k in keys]
        self._forget_previous([mine])
        return values

    def max(self, value: float) -> float:
        return max(self.gather(value))

    def sum(self, value: int) -> int:
        return int(sum(self.gather(value)))

    def close(self):
        left = f"{self.prefix}/left"
        if self.store.add(left, 1) == self.size:
            self.store.set(f"{left}/all", b"1")
        if self.rank == 0:
            self.store.wait([f"{left}/all"], timeout=self.timeout)


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
        from .rendezvous import rendezvous
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
    from .bench_socket import launch
    if world_size is None:
        usable, why = nccl_transport.available()
        if not usable:
            raise ValueError(f"--backend nccl: {why}")
        import cupy
        world_size = cupy.cuda.runtime.getDeviceCount()
    return launch(list(argv), world_size)


def run_from_bench(args, group=None, host=None):
    """The benchmark on ``args`` (collectives, algorithms, sizes, dtype, json; segments,
    graph_max, probe and iters where given). ``host`` coordinates the ranks on the host
    (default: the one ``nccl_group`` attached to the group, else MPI). Returns the exit
    status (1 if any result was wrong)."""
    for name, default in (("segments", ""), ("graph_max", "16M"), ("probe", "")):
        if not hasattr(args, name):
            setattr(args, name, default)
    args.segments = parse_sizes(args.segments) if args.segments else ()
    args.graph_max = parse_sizes(args.graph_max)[0] if args.graph_max not in ("", "0") else 0
    args.algorithms = ",".join(a for a in args.algorithms.split(",") if a not in ("native",))
    import cupy
    if group is None:
        group, _ = nccl_group()
    if host is None:
        host = getattr(group, "bench_host", None) or MpiHost()
    transport = group.transport
    leader = group.rank == 0
    stream = cupy.cuda.Stream(non_blocking=True)
    meta = {}
    if leader:
        props = cupy.cuda.runtime.getDeviceProperties(transport.device)
        meta = {"gpu": props["name"].decode() if isinstance(props["name"], bytes)
                else props["name"], "world_size": group.size,
                "nccl": transport.version, "cupy": cupy.__version__,
                "command": " ".join(sys.argv), "host_sync": type(host).__name__,
                "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")
                        or k.startswith("COLLECTIVES_") and k != "COLLECTIVES_SECRET"}}
        print(f"# bench_nccl: {meta['world_size']} x {meta['gpu']}, NCCL {meta['nccl']}, "
              f"CuPy {meta['cupy']}, dtype {args.dtype}, host sync {meta['host_sync']}",
              flush=True)
    out = {"meta": meta}
    with stream:
        if args.probe:
            out["probe"] = probe(group, cupy, host, parse_sizes(args.probe))
        if args.collectives:
            if leader:
                print(HEADER, flush=True)
            out["rows"] = bench(group, cupy, args, host)
    if leader:
        failures = executor.graph_cache(transport).failures
        out["graph_capture_failures"] = failures[:10]
        if failures:
            print(f"# graph capture failures: {failures[:3]}", flush=True)
    if leader and args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    wrong = sum(r["wrong"] for r in out.get("rows", []))
    if leader and getattr(args, "tune", None) and out.get("rows"):
        tune(args.tune, out["rows"], transport.name, np.dtype(args.dtype).itemsize)
    transport.close()      # drops the captured graphs first: NCCL waits for them on destroy
    host.close()
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
