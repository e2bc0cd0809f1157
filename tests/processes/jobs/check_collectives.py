"""World-size-agnostic checks of the MPI transport, run under ``mpiexec -n k`` (k = 1, 2, 3, 4).

Differential: every collective x algorithm (native included) on random inputs equals MPI's own
collective called directly through mpi4py (exact for integers, within tolerance for floats).
Then subgroups, point-to-point with tags and any-source, timeouts and size mismatches.
Prints one ``ok <name>`` line per check; exits non-zero (with the failures) on any failure.
"""
import sys
import traceback

import numpy as np
from mpi4py import MPI

from collectives import transports
from collectives.algorithms import capabilities
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.group import ProcessGroup
from collectives.ops import ReduceOp

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures = []
MPI_TYPE = {np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
            np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE}
MPI_OP = {ReduceOp.SUM: MPI.SUM, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
          ReduceOp.BXOR: MPI.BXOR, ReduceOp.PRODUCT: MPI.PROD}


def check(name):
    def wrap(fn):
        try:
            fn()
            flag = 0
        except Exception:
            flag = 1
            failures.append(f"rank {rank}: {name}:\n{traceback.format_exc()}")
        if comm.allreduce(flag, MPI.SUM) == 0 and rank == 0:
            print(f"ok {name}", flush=True)
        return fn
    return wrap


def random_data(rng, dtype, n):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype)
    return rng.integers(-1000, 1000, n).astype(dtype)


def same(got, want, dtype):
    if np.dtype(dtype).kind == "f":
        return np.allclose(got, want, rtol=1e-5, atol=1e-5 * size)
    return np.array_equal(got, want)


def uneven(n):
    return tuple(n + (i * 7 + 3) % 5 for i in range(size))


def differential(group, transport, comm, collective, algorithm, dtype, op, n, root, seed):
    """Run one call through the group and the same call through mpi4py; compare."""
    r, p = comm.Get_rank(), comm.Get_size()
    rng = np.random.default_rng(seed * 1000 + r)
    t = MPI_TYPE[np.dtype(dtype)]
    counts = None
    if collective == "all_reduce":
        x = random_data(rng, dtype, n)
        out, want = np.empty_like(x), np.empty_like(x)
        comm.Allreduce([x, t], [want, t], MPI_OP[op])
        inp = x
    elif collective == "reduce":
        inp = random_data(rng, dtype, n)
        out = np.empty_like(inp) if r == root else None
        want = np.empty_like(inp) if r == root else None
        comm.Reduce([inp, t], [want, t] if r == root else None, MPI_OP[op], root)
    elif collective == "broadcast":
        inp = None
        out = random_data(rng, dtype, n) if r == root else np.zeros(n, dtype)
        want = comm.bcast(out if r == root else None, root)
    elif collective == "reduce_scatter":
        counts = uneven(n)
        inp = random_data(rng, dtype, sum(counts))
        out, want = np.empty(counts[r], dtype), np.empty(counts[r], dtype)
        comm.Reduce_scatter([inp, t], [want, t], list(counts), MPI_OP[op])
    elif collective in ("all_gather", "gather"):
        counts = uneven(n)
        inp = random_data(rng, dtype, counts[r])
        full = np.empty(sum(counts), dtype)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        if collective == "all_gather":
            comm.Allgatherv([inp, t], [full, list(counts), displs, t])
            out, want = np.empty_like(full), full
        else:
            comm.Gatherv([inp, t], [full, list(counts), displs, t] if r == root else None, root)
            out, want = (np.empty_like(full), full) if r == root else (None, None)
    elif collective == "scatter":
        counts = uneven(n)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).tolist()
        inp = random_data(rng, dtype, sum(counts)) if r == root else None
        want = np.empty(counts[r], dtype)
        comm.Scatterv([inp, list(counts), displs, t] if r == root else None, [want, t], root)
        out = np.empty_like(want)
    elif collective == "all_to_all":
        counts = tuple(tuple(n + (3 * i + j) % 4 for j in range(p)) for i in range(p))
        inp = random_data(rng, dtype, sum(counts[r]))
        recv = [counts[i][r] for i in range(p)]
        want = np.empty(sum(recv), dtype)
        sd = np.concatenate([[0], np.cumsum(counts[r])[:-1]]).tolist()
        rd = np.concatenate([[0], np.cumsum(recv)[:-1]]).tolist()
        comm.Alltoallv([inp, list(counts[r]), sd, t], [want, recv, rd, t])
        out = np.empty_like(want)
    elif collective == "barrier":
        group.prepare("barrier", algorithm=algorithm)()
        return
    group.prepare(collective, input=inp, output=out, counts=counts, root=root, op=op,
                  algorithm=algorithm, timeout=60)()
    if out is not None and not same(out, want, dtype):
        bad = np.flatnonzero(~np.isclose(out, want))[:5]
        raise AssertionError(f"{collective}/{algorithm} {np.dtype(dtype).name} {op.name} n={n}: "
                             f"mismatch at {bad.tolist()}: got {out[bad]} want {want[bad]}")


def algorithms_of(collective, transport):
    return list(capabilities()[collective]) + (["native"] if transport.native else [])


world = transports.create("mpi", rank=rank, world_size=size, timeout=60)
group = ProcessGroup(world, backend="mpi")

CASES = [(np.float32, ReduceOp.SUM, 1000), (np.int64, ReduceOp.SUM, 37),
         (np.int32, ReduceOp.MAX, 5), (np.float64, ReduceOp.SUM, 0), (np.int32, ReduceOp.BXOR, 1)]
# the group's own executor (compiled, where built) and the pure-Python host executor
from collectives.executors import host
compiled_execute = group.execute if group.execute is not host.execute else None
for collective in capabilities():
    @check(f"differential {collective}")
    def _():
        seed = 0
        for execute in ([compiled_execute] if compiled_execute else []) + [host.execute]:
            group.execute = execute
            for algorithm in algorithms_of(collective, world):
                for dtype, op, n in CASES:
                    for root in sorted({0, size - 1}):
                        seed += 1
                        differential(group, world, comm, collective, algorithm, dtype, op, n,
                                     root, seed)
        group.execute = compiled_execute or host.execute


@check("native on bfloat16 moves bytes, refuses to reduce")
def _():
    import ml_dtypes
    bf = np.dtype(ml_dtypes.bfloat16)
    x = np.full(5, rank + 1, bf)
    out = np.empty(5 * size, bf)
    group.prepare("all_gather", input=x, output=out, algorithm="native")()
    if not np.array_equal(out.astype(np.float32), np.repeat(np.arange(1, size + 1), 5)):
        raise AssertionError(f"bfloat16 all_gather gave {out}")
    if world.native.supports("all_reduce", bf, ReduceOp.SUM):
        raise AssertionError("native claims to reduce bfloat16")
    if world.native.supports("all_reduce", np.float32, ReduceOp.BAND):
        raise AssertionError("native claims BAND on float32")
    flags = np.array([rank % 2 == 0, True, False], dtype=bool)
    out = np.empty_like(flags)
    group.prepare("all_reduce", input=flags, output=out, op=ReduceOp.MAX, algorithm="native")()
    if out.tolist() != [True, True, False]:
        raise AssertionError(f"bool MAX (or) gave {out}")


@check("subgroup: even ranks run collectives while odd ranks exchange")
def _():
    members = list(range(0, size, 2))
    sub = world.subgroup(members)
    if rank % 2:
        if sub is not None:
            raise AssertionError("a non-member got a subgroup transport")
        peer = rank + 2 if rank + 2 < size else (1 if rank != 1 else None)
        if peer is not None and peer != rank:     # odd ranks: a ring of p2p among themselves
            left = rank - 2 if rank - 2 >= 1 else max(r for r in range(1, size, 2))
            buf = np.empty(3, np.int64)
            world.wait_all([world.irecv(buf, left, 99), world.isend(np.full(3, rank), peer, 99)], 30)
            if buf.tolist() != [left] * 3:
                raise AssertionError(f"odd-rank exchange got {buf}")
        return
    if sub.size != len(members) or sub.rank != members.index(rank):
        raise AssertionError(f"subgroup rank/size {sub.rank}/{sub.size}")
    subgroup = ProcessGroup(sub, backend="mpi", group_id=1, ranks=members)
    for algorithm in algorithms_of("all_reduce", sub):
        x = np.full(10, rank, np.int64)
        out = np.empty_like(x)
        subgroup.prepare("all_reduce", input=x, output=out, algorithm=algorithm)()
        if out.tolist() != [sum(members)] * 10:
            raise AssertionError(f"subgroup all_reduce ({algorithm}) gave {out}")
    sub.close()


@check("p2p: tags are matched, any-source reports the sender")
def _():
    if rank == 0:
        got = {}
        for _ in range(size - 1):
            buf = np.empty(4, np.int32)
            req = world.irecv(buf, -1, 7)
            world.wait_all([req], 30)
            got[req.source] = buf.tolist()
        if got != {r: [r] * 4 for r in range(1, size)}:
            raise AssertionError(f"any-source receives gave {got}")
    else:
        world.send(np.full(4, rank, np.int32), 0, 7)
    # tags: two messages to self with different tags, received in the other order
    a, b = np.empty(2, np.float64), np.empty(2, np.float64)
    sends = [world.isend(np.array([1.0, 1.0]), rank, 5), world.isend(np.array([2.0, 2.0]), rank, 6)]
    world.recv(b, rank, 6, timeout=30)
    world.recv(a, rank, 5, timeout=30)
    world.wait_all(sends, 30)
    if a.tolist() != [1.0, 1.0] or b.tolist() != [2.0, 2.0]:
        raise AssertionError(f"tag matching gave {a} {b}")


@check("timeout: a rank that never sends is a CollectiveTimeout naming rank, peer and tag")
def _():
    peer = (rank + 1) % size
    try:
        world.recv(np.empty(1, np.int32), peer, 4242, timeout=0.2)
    except CollectiveTimeout as exc:
        text = str(exc)
        for part in (f"rank {rank}", f"rank {peer}", "4242"):
            if part not in text:
                raise AssertionError(f"timeout message {text!r} lacks {part!r}")
    else:
        raise AssertionError("no CollectiveTimeout")
    comm.Barrier()


@check("size mismatch: a shorter or longer message is a CollectiveError naming the sender")
def _():
    peer_to, peer_from = (rank + 1) % size, (rank - 1) % size
    for sent, expected in ((8, 16), (16, 8)):
        req = world.isend(np.zeros(sent, np.uint8), peer_to, 77)
        try:
            world.recv(np.empty(expected, np.uint8), peer_from, 77, timeout=30)
        except CollectiveError as exc:
            if f"rank {peer_from}" not in str(exc):
                raise AssertionError(f"mismatch message {exc} does not name rank {peer_from}")
        else:
            raise AssertionError(f"{sent} bytes into a {expected}-byte receive passed silently")
        world.wait_all([req], 30)
        comm.Barrier()


@check("create: a rank or size that disagrees with MPI is a ValueError")
def _():
    for kwargs in ({"rank": rank + 1, "world_size": size}, {"rank": rank, "world_size": size + 1}):
        try:
            transports.create("mpi", **kwargs)
        except ValueError:
            continue
        raise AssertionError(f"create({kwargs}) accepted")


if failures:
    sys.stderr.write("\n".join(failures))
    sys.stderr.flush()
comm.Barrier()
if rank == 0:
    print("done" if not comm.allreduce(len(failures)) else "FAILED", flush=True)
else:
    comm.allreduce(len(failures))
sys.exit(1 if failures else 0)
