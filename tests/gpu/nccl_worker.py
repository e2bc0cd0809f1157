"""One rank of the GPU suite: every collective x algorithm x dtype/op on the NCCL transport.

Launched by ``test_nccl.py`` as ``mpiexec -n N python tests/gpu/nccl_worker.py``; each rank
prints one ``RESULT {json}`` line (cases run, failures). Inputs are small integers drawn from a
seed shared by all ranks, so every rank computes every rank's input and the exact expected
output on the host (sums of small integers are exact in every float type and any order);
NCCL's own collective (``native``) is held to the same expectation, so ours and NCCL's agree
bit for bit. Each case runs unsegmented and pipelined (tiny segments), out of place and, for
all_reduce, in place.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

from collectives.algorithms import capabilities  # noqa: E402
from collectives.errors import CollectiveTimeout  # noqa: E402
from collectives.executors import nccl as nccl_executor  # noqa: E402
from collectives.group import ProcessGroup  # noqa: E402
from collectives.kernels.reduce import BFLOAT16, finish_average, reducer  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402
from collectives.transports import nccl as nccl_transport  # noqa: E402

R = ReduceOp
# Every op and dtype of the kernels is checked bit for bit by check_kernels; the collectives
# run a spread of them (kept short: the device run has minutes for both world sizes).
DTYPE_OPS = [
    (np.float32, (R.SUM, R.AVG, R.MAX, R.PRODUCT)),
    (np.float16, (R.SUM,)),
    (np.int32, (R.BXOR, R.MIN)),
    (np.bool_, (R.SUM,)),
] + ([(BFLOAT16, (R.SUM,))] if BFLOAT16 is not None else [])
QUICK_DTYPE_OPS = [(np.float32, (R.SUM, R.MAX)), (np.int32, (R.BXOR,))] + \
    ([(BFLOAT16, (R.SUM,))] if BFLOAT16 is not None else [])
MOVE_DTYPES = (np.float32, np.int8, np.float16)
QUICK_MOVE_DTYPES = (np.float32, np.int8)
COUNTS = (1, 5, 4099, (1 << 17) + 3)
QUICK_COUNTS = (5, (1 << 17) + 3)
GRAPH_CALLS = 4                  # eager, capture, then replays
SMALL_SEGMENT = 1 << 14          # bytes: forces the pipelined path on the larger counts


def values(rng, count, dtype, op):
    if dtype == np.bool_:
        return rng.random(count) < 0.3
    if op == R.PRODUCT:
        return rng.choice(np.array([-1, 1, 2]), count).astype(dtype)
    if op in (R.BXOR, R.BAND, R.BOR):
        return rng.integers(0, 1 << 12, count).astype(dtype)
    return rng.integers(-8, 9, count).astype(dtype)


def expected(collective, inputs, rank, root, op, dtype, counts):
    p = len(inputs)
    combine = reducer(op, dtype)

    def reduce_all():
        acc = inputs[0].copy()
        for x in inputs[1:]:
            combine(acc, acc, x)
        if op == R.AVG:
            finish_average(acc, p)
        return acc

    offsets = np.concatenate(([0], np.cumsum(counts))).astype(int) if counts else None
    if collective == "all_reduce":
        return reduce_all()
    if collective == "reduce":
        return reduce_all() if rank == root else None
    if collective == "reduce_scatter":
        return reduce_all()[offsets[rank]:offsets[rank + 1]]
    if collective == "all_gather":
        return np.concatenate(inputs)
    if collective == "gather":
        return np.concatenate(inputs) if rank == root else None
    if collective == "broadcast":
        return inputs[root]
    if collective == "scatter":
        return inputs[root][offsets[rank]:offsets[rank + 1]]
    if collective == "all_to_all":
        c = counts[0]
        return np.concatenate([inputs[i][rank * c:(rank + 1) * c] for i in range(p)])
    raise ValueError(collective)


def case_inputs(seed, collective, p, count, dtype, op, root):
    """Every rank's input (the same on all ranks) and the counts argument."""
    rng = np.random.default_rng(seed)
    uneven = tuple(count + (i % 2) for i in range(p))
    if collective in ("all_reduce", "reduce", "broadcast"):
        return [values(rng, count, dtype, op) for _ in range(p)], None
    if collective in ("reduce_scatter", "scatter"):
        counts = uneven
        return [values(rng, sum(counts), dtype, op) for _ in range(p)], counts
    if collective in ("all_gather", "gather"):
        counts = uneven
        return [values(rng, counts[i], dtype, op) for i in range(p)], counts
    if collective == "all_to_all":
        return [values(rng, count * p, dtype, op) for _ in range(p)], (count,) * p
    raise ValueError(collective)


def run_case(group, cupy, collective, algorithm, dtype, op, count, root, seed, in_place):
    p, rank = group.size, group.rank
    dtype = np.dtype(dtype)
    inputs, counts = case_inputs(seed, collective, p, count, dtype, op, root)
    want = expected(collective, inputs, rank, root, op, dtype, counts)
    mine = inputs[rank]
    kwargs = dict(op=op, root=root, algorithm=algorithm)
    d_in = cupy.asarray(mine)
    if collective == "all_reduce":
        out = d_in if in_place else cupy.empty_like(d_in)
        call = group.prepare(collective, input=None if in_place else d_in, output=out, **kwargs)
    elif collective == "broadcast":
        out = d_in
        if rank != root:
            out[...] = 0
        call = group.prepare(collective, output=out, **kwargs)
    else:
        n_out = want.size if want is not None else 0
        if collective == "reduce":
            n_out = count
        if collective == "gather" and rank != root:
            n_out = sum(counts)
        out = cupy.full(n_out, 99 if dtype != np.bool_ else 0, dtype=dtype)
        if collective in ("reduce_scatter", "all_gather", "gather", "scatter"):
            kwargs["counts"] = counts
        call = group.prepare(collective, input=d_in, output=out, **kwargs)
    call()
    group.transport.synchronize(30.0, operation=collective)   # a hang aborts, never blocks
    if want is None:
        return None
    got = cupy.asnumpy(out)
    if got.shape != want.shape or not np.array_equal(got.view(np.uint8), want.view(np.uint8)):
        bad = np.flatnonzero(got != want) if got.shape == want.shape else []
        where = int(bad[0]) if len(bad) else -1
        return (f"{len(bad)} of {want.size} elements differ; first at {where}: got "
                f"{got[where] if where >= 0 else got.shape} want "
                f"{want[where] if where >= 0 else want.shape}")
    return None


def check_kernels(cupy):
    """The CUDA reduction kernels against the numpy twin, bit for bit, on random data."""
    from collectives.kernels.cuda import reduce_kernel
    failures, rng = [], np.random.default_rng(7)
    dtypes = [np.float32, np.float16, np.int8, np.int32, np.bool_, np.complex64] + ([BFLOAT16] if BFLOAT16 is not None else [])
    for dtype in dtypes:
        dtype = np.dtype(dtype)
        for op in (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR):
            if dtype.kind in "fc" or dtype == BFLOAT16:
                if op in (R.BAND, R.BOR, R.BXOR) or (dtype.kind == "c" and op in (R.MIN, R.MAX)):
                    continue
            n = 10007
            if dtype == np.bool_:
                a, b = rng.random(n) < 0.5, rng.random(n) < 0.5
            elif dtype.kind in "iu":
                a = rng.integers(0, 100, n).astype(dtype)
                b = rng.integers(0, 100, n).astype(dtype)
            elif dtype.kind == "c":
                a = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
                b = (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dtype)
            else:
                a = rng.standard_normal(n).astype(np.float32).astype(dtype)
                b = rng.standard_normal(n).astype(np.float32).astype(dtype)
            want = np.empty_like(a)
            reducer(op, dtype)(want, a, b)
            storage = np.uint16 if dtype == BFLOAT16 else dtype
            da = cupy.asarray(a.view(storage))
            db = cupy.asarray(b.view(storage))
            dc = cupy.empty_like(da)
            try:
                reduce_kernel(op, dtype)(dc, da, db)
                got = cupy.asnumpy(dc).view(dtype)
            except Exception as exc:
                failures.append(f"kernel {op.name} {dtype.name}: {type(exc).__name__}: {exc}")
                continue
            if dtype.kind in "c" and op == R.PRODUCT:   # complex multiply may fuse (FMA)
                ok = np.allclose(got, want, rtol=1e-5)
            else:
                ok = np.array_equal(got.view(np.uint8), want.view(np.uint8))
            if not ok:
                failures.append(f"kernel {op.name} {dtype.name}: differs from numpy at "
                                f"{int(np.flatnonzero(got != want)[0])}")
    return failures


T0 = time.time()


def stage(rank, text, every_rank=False):
    """A progress line (flushed), so a hang shows where it happened."""
    if every_rank or rank == 0:
        print(f"stage rank {rank} {time.time() - T0:6.1f}s: {text}", flush=True)


def graph_check(group, cupy, have, runs, failures):
    """COLLECTIVES_NCCL_GRAPH=1: the same call (same buffers) GRAPH_CALLS times on a
    non-default stream: eager, captured, replayed; each result checked."""
    from collectives.executors.nccl import ENV_GRAPH, graph_cache
    cache = graph_cache(group.transport)
    os.environ[ENV_GRAPH] = "1"
    p, rank = group.size, group.rank
    count, dtype, op = 4099, np.dtype(np.float32), R.SUM
    before = len(failures)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for collective in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            for algorithm in have[collective]:
                runs += 1
                label = f"graph {collective} {algorithm}"
                try:
                    inputs, counts = case_inputs(1000 + runs, collective, p, count, dtype, op, 0)
                    want = expected(collective, inputs, rank, 0, op, dtype, counts)
                    d_in = cupy.asarray(inputs[rank])
                    out = cupy.zeros(want.size, dtype=dtype)
                    kwargs = dict(op=op, algorithm=algorithm)
                    if collective in ("reduce_scatter", "all_gather"):
                        kwargs["counts"] = counts
                    for call in range(GRAPH_CALLS):
                        out[...] = 0
                        group.prepare(collective, input=d_in, output=out, **kwargs)()
                        group.transport.synchronize(30.0, operation=label)
                        if not np.array_equal(cupy.asnumpy(out), want):
                            failures.append(f"{label}: call {call + 1} wrong")
                            break
                except CollectiveTimeout:
                    raise
                except Exception as exc:
                    failures.append(f"{label}: {type(exc).__name__}: {exc}")
    os.environ[ENV_GRAPH] = "0"
    captured = sum(1 for e in cache.entries.values() if e[0] is not None)
    if rank == 0:
        print(f"graph check: {captured} plans captured, capture failures "
              f"{cache.failures[:3]}, {len(failures) - before} wrong results", flush=True)
    if cache.failures:
        failures.append(f"graph capture failed: {cache.failures[:3]}")
    return runs, failures


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--rendezvous", default="mpi", help="mpi or file:PATH")
    args.add_argument("--quick", action="store_true")
    args.add_argument("--job", default="", help="this launch's unique id (store key prefix)")
    args.add_argument("--pid-dir", default="", help="write pid.RANK here (the test kills by id)")
    args.add_argument("--deadline", type=float, default=0.0,
                      help="seconds; past it every thread's stack goes to stderr and the "
                           "process exits (a hang never outlives the test)")
    args = args.parse_args()
    if args.deadline > 0:
        faulthandler.dump_traceback_later(args.deadline, exit=True)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"pid.{rank}"), "w") as f:
            f.write(str(os.getpid()))
    stage(rank, f"started, {size} ranks, rendezvous {args.rendezvous}, job {args.job!r}",
          every_rank=True)
    store = None
    if args.rendezvous.startswith("file:"):
        from collectives.store import FileStore, PrefixStore
        # a fresh file per launch, and this launch's id in every key: never another job's id
        store = PrefixStore(args.job or "job", FileStore(args.rendezvous[5:], size,
                                                          timeout=60.0))
    import cupy
    transport = nccl_transport.create(rank=rank, world_size=size, store=store, timeout=120.0)
    stage(rank, f"communicator ready on GPU {transport.device}", every_rank=True)
    group = ProcessGroup(transport, backend="nccl", timeout=120.0)
    failures, runs = [], 0
    if rank == 0:
        failures += check_kernels(cupy)
        print(f"kernel check: {len(failures)} failures", flush=True)
    have = capabilities()
    counts = QUICK_COUNTS if args.quick else COUNTS
    dtype_ops = QUICK_DTYPE_OPS if args.quick else DTYPE_OPS
    move_dtypes = QUICK_MOVE_DTYPES if args.quick else MOVE_DTYPES
    seed, stop = 0, None
    t0 = time.time()
    for collective, algorithms in have.items():
        if collective == "barrier" or stop:
            continue
        names = list(algorithms) + ["native"]
        reducing = collective in ("all_reduce", "reduce_scatter", "reduce")
        combos = [(np.dtype(d), op) for d, ops in dtype_ops for op in ops] if reducing \
            else [(np.dtype(d), R.SUM) for d in move_dtypes]
        before = len(failures)
        for algorithm in names:
            for dtype, op in combos:
                if stop:
                    break
                if algorithm == "native" and not transport.native.supports(
                        collective, dtype, R.SUM if op == R.AVG else op):
                    continue
                for count in counts:
                    # the pipelined path: every algorithm, at the largest count only
                    big = count == counts[-1] and count * dtype.itemsize > SMALL_SEGMENT
                    segments = (0, SMALL_SEGMENT) if big and algorithm != "native" else (0,)
                    places = (False, True) if collective == "all_reduce" and count == 4099 \
                        else (False,)
                    for segment in segments:
                        for in_place in places:
                            seed += 1
                            root = seed % size if collective in (
                                "broadcast", "reduce", "gather", "scatter") else 0
                            os.environ[nccl_executor.ENV_SEGMENT] = str(segment)
                            label = (f"{collective} {algorithm} {dtype.name} {op.name} "
                                     f"count={count} segment={segment} in_place={in_place} "
                                     f"root={root}")
                            runs += 1
                            try:
                                problem = run_case(group, cupy, collective, algorithm, dtype,
                                                   op, count, root, seed, in_place)
                            except CollectiveTimeout as exc:
                                problem = stop = f"TIMEOUT (stopping): {exc}"
                            except Exception as exc:
                                problem = f"{type(exc).__name__}: {exc}"
                                if len(failures) < 3:
                                    problem += "\n" + traceback.format_exc()
                            if problem:
                                failures.append(f"{label}: {problem}")
                                if len(failures) <= 20:
                                    print(f"rank {rank} FAIL {failures[-1]}", flush=True)
                            if stop:
                                break
        if rank == 0:
            print(f"progress: {collective} done at {time.time() - t0:.1f}s, {runs} cases, "
                  f"{len(failures) - before} failures", flush=True)
    if stop:
        print("RESULT " + json.dumps({"rank": rank, "size": size, "runs": runs,
                                      "failures": failures[:40], "failed": len(failures)}),
              flush=True)
        os._exit(1)
    os.environ[nccl_executor.ENV_SEGMENT] = "0"
    stage(rank, "graph check")
    runs, failures = graph_check(group, cupy, have, runs, failures)
    # barrier through every algorithm, and the generic isend/irecv path
    for algorithm in list(have["barrier"]) + ["native"]:
        stage(rank, f"barrier {algorithm}", every_rank=True)
        runs += 1
        try:
            group.prepare("barrier", algorithm=algorithm)()
            transport.synchronize(20.0)
        except Exception as exc:
            failures.append(f"barrier {algorithm}: {type(exc).__name__}: {exc}")
    stage(rank, "isend/irecv ring", every_rank=True)
    runs += 1
    try:
        right, left = (rank + 1) % size, (rank - 1) % size
        out = cupy.zeros(1000, dtype=cupy.float32)
        reqs = [transport.isend(cupy.full(1000, rank, dtype=cupy.float32), right, 0),
                transport.irecv(out, left, 0)]
        transport.wait_all(reqs, timeout=20.0)
        if not bool((out == left).all()):
            failures.append("isend/irecv ring: wrong data")
    except Exception as exc:
        failures.append(f"isend/irecv ring: {type(exc).__name__}: {exc}")
    stage(rank, "close (graphs dropped, communicator destroyed)", every_rank=True)
    transport.close()
    stage(rank, "closed", every_rank=True)
    print("RESULT " + json.dumps({"rank": rank, "size": size, "runs": runs,
                                  "failures": failures[:40], "failed": len(failures)}),
          flush=True)


if __name__ == "__main__":
    main()
