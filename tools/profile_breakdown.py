"""Breakdown of a large all_reduce / all_to_all on the compiled executor (mpiexec -n P).

Per size and algorithm: the full plan, the same plan with transfers only (local ops dropped),
the reductions alone (local ops, no transfers), native MPI_Allreduce / Alltoall called
directly, the input->output copy group.py does for out-of-place all_reduce, and the full plan
with large scratch allocated per call (pool cap 0). Time = slower rank; min and median of REPS
repetitions (each the mean of a few calls), all variants interleaved per repetition so that a
noisy minute hits them alike."""
import dataclasses, sys, time
import numpy as np
from mpi4py import MPI
from collectives import transports
from collectives.algorithms.schedule import build_plan, plan_args, Step
from collectives.executors import compiled
from collectives.ops import ReduceOp

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SIZES = [int(s) << 20 for s in (sys.argv[1] if len(sys.argv) > 1 else "1,16,64").split(",")]
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
world = transports.create("mpi", rank=rank, world_size=size, timeout=120)
run = compiled.make_executor(world.comm)
DT = np.dtype(np.float32)


def only(plan, keep_transfers, keep_local):
    steps = tuple(Step(s.sends if keep_transfers else (), s.recvs if keep_transfers else (),
                       s.local if keep_local else ()) for s in plan.steps)
    return dataclasses.replace(plan, steps=steps)


def timed(fn, calls):
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return comm.allreduce((time.perf_counter() - t) / calls, MPI.MAX)


for nbytes in SIZES:
    n = nbytes // 4
    x = np.ones(n, DT); y = np.ones(n, DT); xin = np.ones(n, DT)
    calls = 20 if nbytes <= 4 << 20 else 3
    variants = {}
    for algo in ("ring", "recursive_doubling"):
        plan = build_plan("all_reduce", algo, rank, size, *plan_args("all_reduce", size, n))
        buf = {"output": y}
        ex = lambda p: (lambda: run(p, world, buf, None, tag=7, timeout=120.0,
                                    operation="all_reduce", dtype=DT, op=ReduceOp.SUM))
        variants[f"all_reduce {algo}: full plan"] = ex(plan)
        variants[f"all_reduce {algo}: transfers only"] = ex(only(plan, True, False))
        variants[f"all_reduce {algo}: local ops only"] = ex(only(plan, False, True))

        def nocache(f=ex(plan)):
            cap, compiled.scratch_pool.cap = compiled.scratch_pool.cap, 0
            compiled.scratch_pool.clear()
            try:
                f()
            finally:
                compiled.scratch_pool.cap = cap
        variants[f"all_reduce {algo}: full, scratch per call"] = nocache
    variants["all_reduce native MPI_Allreduce (in place)"] = lambda: comm.Allreduce(MPI.IN_PLACE, [y, MPI.FLOAT], MPI.SUM)
    variants["all_reduce native MPI_Allreduce (out of place)"] = lambda: comm.Allreduce([xin, MPI.FLOAT], [y, MPI.FLOAT], MPI.SUM)
    variants["input->output copy (group.py, out of place)"] = lambda: np.copyto(y, xin)
    a2a = build_plan("all_to_all", "ring", rank, size, *plan_args("all_to_all", size, ((n // size,) * size,) * size))
    out = np.empty(n, DT)
    variants["all_to_all ring: full plan"] = lambda: run(a2a, world, {"input": x, "output": out}, None, tag=8, timeout=120.0, operation="all_to_all", dtype=DT)
    variants["all_to_all native MPI_Alltoall"] = lambda: comm.Alltoall([x, MPI.FLOAT], [out, MPI.FLOAT])
    results = {k: [] for k in variants}
    for k, f in variants.items():
        f()                                  # warm: first touch, plan flattening
    for _ in range(REPS):
        for k, f in variants.items():
            results[k].append(timed(f, calls))
    if rank == 0:
        print(f"\n{nbytes >> 20} MiB float32, {size} ranks, {MPI.Get_library_version().splitlines()[0][:40]}; {REPS} reps x {calls} calls")
        print("| variant | min µs | median µs | busbw GB/s at min |\n|---|---|---|---|")
        for k, ts in results.items():
            ts.sort()
            f = 2 * (size - 1) / size if k.startswith("all_reduce") else (size - 1) / size
            print(f"| {k} | {ts[0]*1e6:.0f} | {ts[len(ts)//2]*1e6:.0f} | {nbytes/ts[0]/1e9*f:.2f} |")
