"""One rank of the GPU usability checks (test_nccl_usability.py): what a new user meets first.

``--case mpi`` (under ``mpiexec -n N``, no MASTER_ADDR): ``init_process_group("nccl")`` with
no init_method takes rank and size from MPI; then point-to-point on CuPy arrays and, where
torch has CUDA, on torch CUDA tensors: send/recv, isend/irecv, batch_isend_irecv, and the
collectives with async_op=True; then the object collectives. Each rank prints one ``RESULT {json}`` line (checks run, failures).

``--case raise`` (under mpiexec or ``python -m collectives.run``): the other ranks wait for
an all_reduce (on the host, inside NCCL) that rank 1 never joins: it raises an uncaught
exception. The job must end, by
itself, soon: the test measures it and reads the abort message.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402
import cupy  # noqa: E402

import collectives as dist  # noqa: E402


class Checks:
    def __init__(self, rank):
        self.rank, self.runs, self.failures = rank, 0, []

    def check(self, label, case):
        """``case()`` returns None (pass) or what is wrong; an exception is a failure."""
        self.runs += 1
        try:
            problem = case()
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            print(f"rank {self.rank} traceback of {label}:\n{traceback.format_exc()}", flush=True)
        cupy.cuda.get_current_stream().synchronize()
        if problem:
            self.failures.append(f"{label}: {problem}")
            print(f"rank {self.rank} FAIL {label}: {problem}", flush=True)


def host(array):
    """The values of a CuPy array or torch CUDA tensor, read after the current stream."""
    if isinstance(array, cupy.ndarray):
        return cupy.asnumpy(array)
    return array.cpu().numpy()            # torch: ordered on torch's current stream


def p2p_cases(checks, rank, size, make, kind):
    """send/recv, isend/irecv, batch_isend_irecv on arrays from ``make(values)``."""
    right, left = (rank + 1) % size, (rank - 1) % size

    def send_recv():
        # pairs (0, 1), (2, 3), ...: even ranks send first, then the other way round
        peer = rank ^ 1
        if peer >= size:
            return None
        for sender in (rank & ~1, rank | 1):
            if rank == sender:
                dist.send(make([rank + 1.0] * 5), dst=peer)
            else:
                out = make([0.0] * 5)
                source = dist.recv(out, src=peer)
                if source != peer or not (host(out) == peer + 1.0).all():
                    return f"recv from {peer}: source {source}, values {host(out)}"
        return None

    def isend_irecv():
        out = make([-1.0] * 7)
        works = [dist.irecv(out, src=left), dist.isend(make([rank] * 7), dst=right)]
        for work in reversed(works):
            work.wait()
        if works[0].source_rank != left or not (host(out) == left).all():
            return f"irecv from {left}: source {works[0].source_rank}, values {host(out)}"
        return None

    def batch():
        out = make([-1.0] * 9)
        ops = [dist.P2POp(dist.irecv, out, left), dist.P2POp(dist.isend, make([rank * 2] * 9),
                                                             right)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if not (host(out) == left * 2).all():
            return f"batch_isend_irecv from {left}: {host(out)}"
        return None

    checks.check(f"{kind}: send/recv", send_recv)
    checks.check(f"{kind}: isend/irecv ring", isend_irecv)
    checks.check(f"{kind}: batch_isend_irecv ring", batch)


def async_cases(checks, rank, size, make, kind):
    """Collectives with async_op=True (they used to fail on the group's worker thread with
    CUDA_ERROR_INVALID_CONTEXT). Each input is dropped right after the call and new arrays
    are made before the wait: they may take its memory, but only after the collective in
    the stream's order."""
    n = 1 << 12
    total = size * (size + 1) / 2

    def check(out, want):
        got = host(out)
        return None if np.array_equal(got, np.asarray(want, np.float32)) else (
            f"got {got[:4]}..., want {np.asarray(want)[:4]}...")

    def all_reduce():
        x = make([rank + 1.0] * n)
        work = dist.all_reduce(x, async_op=True)
        make([-7.0] * n)
        work.wait()
        return check(x, [total] * n)

    def all_gather_into_tensor():
        x, out = make([rank + 1.0] * n), make([0.0] * (n * size))
        work = dist.all_gather_into_tensor(out, x, async_op=True)
        del x
        make([-7.0] * n)
        work.wait()
        return check(out, np.repeat(np.arange(1, size + 1), n))

    def reduce_scatter_tensor():
        x, out = make([rank + 1.0] * (n * size)), make([0.0] * n)
        work = dist.reduce_scatter_tensor(out, x, async_op=True)
        del x
        make([-7.0] * (n * size))
        work.wait()
        return check(out, [total] * n)

    def all_to_all_single():
        x = make(np.repeat(np.arange(size) + rank * size, n))
        out = make([0.0] * (n * size))
        work = dist.all_to_all_single(out, x, async_op=True)
        del x
        make([-7.0] * (n * size))
        work.wait()
        return check(out, np.repeat(np.arange(size) * size + rank, n))

    def broadcast():
        x = make([rank + 1.0] * n)
        work = dist.broadcast(x, src=size - 1, async_op=True)
        work.wait()
        return check(x, [size] * n)

    for name, case in (("all_reduce", all_reduce),
                       ("all_gather_into_tensor", all_gather_into_tensor),
                       ("reduce_scatter_tensor", reduce_scatter_tensor),
                       ("all_to_all_single", all_to_all_single),
                       ("broadcast", broadcast)):
        checks.check(f"async {name} ({kind})", case)


def object_cases(checks, rank, size):
    def all_gather_object():
        got = [None] * size
        dist.all_gather_object(got, {"rank": rank, "pad": "x" * (100 * rank)})
        want = [{"rank": r, "pad": "x" * (100 * r)} for r in range(size)]
        return None if got == want else f"got {got}"

    def broadcast_object_list():
        root = size - 1
        objs = [{"from": root}, (1, 2), "three"] if rank == root else [None, None, None]
        dist.broadcast_object_list(objs, src=root)
        return None if objs == [{"from": root}, (1, 2), "three"] else f"got {objs}"

    def gather_object():
        out = [None] * size if rank == 0 else None
        dist.gather_object(("g", rank), out, dst=0)
        return None if rank != 0 or out == [("g", r) for r in range(size)] else f"got {out}"

    def scatter_object_list():
        out = [None]
        dist.scatter_object_list(out, [f"to {r}" * (r + 1) for r in range(size)]
                                 if rank == 0 else None, src=0)
        return None if out == [f"to {rank}" * (rank + 1)] else f"got {out}"

    for name, case in (("all_gather_object", all_gather_object),
                       ("broadcast_object_list", broadcast_object_list),
                       ("gather_object", gather_object),
                       ("scatter_object_list", scatter_object_list)):
        checks.check(name, case)


def case_mpi(args):
    from mpi4py import MPI
    # the user's script: no init_method, no MASTER_ADDR (README's Launching section)
    dist.init_process_group("nccl", timeout=120)
    rank, size = dist.get_rank(), dist.get_world_size()
    checks = Checks(rank)
    checks.check("rank and size from MPI", lambda: None if (rank, size) == (
        MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()) else f"{rank}/{size}")
    device = dist.group.WORLD.transport.device
    cupy.cuda.Device(device).use()

    def make_cupy(values):
        return cupy.asarray(np.asarray(values, np.float32))
    p2p_cases(checks, rank, size, make_cupy, "cupy")
    async_cases(checks, rank, size, make_cupy, "cupy")
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        torch.cuda.set_device(device)

        def make_torch(values):
            return torch.tensor(values, dtype=torch.float32, device=f"cuda:{device}")
        p2p_cases(checks, rank, size, make_torch, "torch")
        async_cases(checks, rank, size, make_torch, "torch")
    object_cases(checks, rank, size)
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "size": size, "runs": checks.runs,
                                  "torch": have_torch, "failures": checks.failures[:8],
                                  "failed": len(checks.failures)}), flush=True)
    MPI.COMM_WORLD.Barrier()
    MPI.Finalize()
    os._exit(1 if checks.failures else 0)


def case_raise(args):
    dist.init_process_group("nccl", timeout=600)      # long: the job must end by the abort
    rank = dist.get_rank()
    device = dist.group.WORLD.transport.device
    cupy.cuda.Device(device).use()
    print(f"rank {rank} joined", flush=True)
    dist.barrier()
    cupy.cuda.get_current_stream().synchronize()
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    x = cupy.ones(1 << 20, cupy.float32)
    dist.all_reduce(x)                                   # rank 1 never joins this one,
    cupy.cuda.get_current_stream().synchronize()         # so this waits inside NCCL
    print(f"rank {rank}: all_reduce returned", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("mpi", "raise"), required=True)
    parser.add_argument("--pid-dir", default="")
    parser.add_argument("--deadline", type=float, default=0.0,
                        help="seconds; past it every thread's stack goes to stderr and the "
                             "process exits (a hang never outlives the test)")
    args = parser.parse_args()
    if args.deadline > 0:
        faulthandler.dump_traceback_later(args.deadline, exit=True)
    if args.pid_dir:
        rank = next((os.environ[k] for k in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
                                             "PMIX_RANK") if k in os.environ), str(os.getpid()))
        with open(os.path.join(args.pid_dir, f"pid.{rank}"), "w") as f:
            f.write(str(os.getpid()))
    (case_mpi if args.case == "mpi" else case_raise)(args)


if __name__ == "__main__":
    main()
