"""One rank of the torch CUDA suite: the facade (``import collectives as dist``) on torch CUDA
tensors with the nccl backend, one rank per GPU.

Launched by ``test_nccl.py`` as ``mpiexec -n N python tests/gpu/torch_worker.py --store PATH``;
rank and size come from MPI, the rendezvous is ``init_process_group("nccl",
init_method="file://PATH")`` (a fresh file per launch: under mpiexec there is no MASTER_ADDR
for ``env://``). Each rank prints one ``RESULT {json}`` line (cases run, failures) and exits
non-zero on any failure.

What is checked, each against an exact host reference computed with torch on the CPU (inputs
are small integers drawn from a seed every rank shares, so every rank knows every rank's input
and sums are exact in every dtype and any order):

* collectives x algorithms (the capability table's, plus ``native`` where NCCL supports the
  dtype/op) x float32/float16/bfloat16/int32 through the facade: all_reduce (SUM, MAX, AVG
  on floats), broadcast, reduce (non-roots untouched), all_gather (list),
  all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single (even, and uneven row
  splits); 2-D tensors, element counts not divisible by the world size;
* zero copy: every output keeps its ``data_ptr`` and holds the result;
* a non-contiguous tensor: ValueError naming the operation and the rank, tensor unchanged;
* a CPU tensor on the nccl group: TypeError/ValueError naming the operation and the rank,
  tensor unchanged, and the next collective still correct (nothing half-ran);
* stream ordering: the input is written by a kernel queued behind ``torch.cuda._sleep`` on
  torch's current stream, with no synchronization before the collective, and the result is
  read on that stream; once on the default stream, once under ``torch.cuda.stream(s)``;
* ``async_op=True``: several works in flight on different tensors, waited in reverse and in
  order; results read on the current stream (README: wait() means ordered on the current
  stream); ``is_completed()`` True after a host synchronization; ``get_future().wait()``
  returns the result list holding the caller's tensor.

bfloat16: README says "bfloat16 CUDA tensors need CuPy with bfloat16" (CuPy >= 14). A bfloat16 case either
gives the exact result or that refusal (a TypeError naming the operation and rank, tensor
unchanged, before any data moves); refusals are counted in ``bf16_refused`` of the RESULT line.
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

import numpy as np  # noqa: E402
import cupy  # noqa: E402
import torch  # noqa: E402

import collectives as dist  # noqa: E402
from collectives.algorithms import capabilities  # noqa: E402
from collectives.kernels.reduce import BFLOAT16  # noqa: E402

R = dist.ReduceOp
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
OPS = {torch.float32: (R.SUM, R.MAX, R.AVG), torch.float16: (R.SUM, R.AVG),
       torch.bfloat16: (R.SUM, R.MAX), torch.int32: (R.SUM, R.MAX)}
SHAPE = (7, 149)                  # 1043 elements: divisible by neither 2 nor 4
SLEEP_CYCLES = 200_000_000        # ~0.1 s of GPU time queued before the input is written
T0 = time.time()


# CuPy 14 holds ml_dtypes' bfloat16, and tensors.py views bfloat16 CUDA tensors through it:
# there a refusal is a failure.
BFLOAT16_EXPECTED = int(cupy.__version__.split(".")[0]) >= 14


class Refused(Exception):
    """The documented bfloat16 refusal (not a failure)."""


def numpy_dtype(dtype):
    """The dtype the nccl backend sees for a torch dtype (for the native capability check)."""
    if dtype == torch.bfloat16:
        return BFLOAT16
    return np.dtype(str(dtype).replace("torch.", ""))


def inputs(seed, p, shape, dtype):
    """Every rank's input for one case, on the CPU: small integers, exact in every dtype."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(-8, 9, shape, generator=gen).to(dtype) for _ in range(p)]


def reduced(xs, op):
    """The exact reduction of the ranks' CPU tensors (in float64/int64, then cast)."""
    wide = torch.stack([x.to(torch.int64 if not x.is_floating_point() else torch.float64)
                        for x in xs])
    if op == R.SUM:
        out = wide.sum(0)
    elif op == R.MAX:
        out = wide.max(0).values
    elif op == R.AVG:
        out = wide.sum(0) / len(xs)     # p = 2 or 4: exact in every float dtype
    else:
        raise ValueError(op)
    return out.to(xs[0].dtype)


def same(got, want) -> bool:
    got = got.detach().cpu()
    return got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)


def differs(name, got, want) -> str:
    got = got.detach().cpu()
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: got {tuple(got.shape)} {got.dtype}, want {tuple(want.shape)} {want.dtype}"
    bad = (got != want).flatten().nonzero().flatten()
    first = int(bad[0]) if len(bad) else -1
    return (f"{name}: {len(bad)} of {want.numel()} elements differ; first at {first}: got "
            f"{got.flatten()[first].item()} want {want.flatten()[first].item()}")


class Suite:
    def __init__(self, rank, size, device):
        self.rank, self.size, self.device = rank, size, device
        self.runs, self.failures, self.bf16_refused = 0, [], 0
        self.seed = 0

    def check(self, label, case):
        """Run one case: ``case()`` returns None (pass) or a description of what is wrong."""
        self.runs += 1
        self.seed += 1
        try:
            problem = case(self.seed)
        except Refused:
            self.bf16_refused += 1
            problem = None
        except Exception as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if len(self.failures) < 3:         # printed below, not in the RESULT line
                print(f"rank {self.rank} traceback of {label}:\n{traceback.format_exc()}",
                      flush=True)
        # every case ends with the device idle, so a broken case cannot spill into the next
        torch.cuda.synchronize()
        if problem:
            self.failures.append(f"{label}: {problem}")
            if len(self.failures) <= 40:
                print(f"rank {self.rank} FAIL {self.failures[-1]}", flush=True)

    def cuda(self, x):
        return x.to(self.device)

    def call(self, dtype, operation, fn, *watched):
        """Call a facade collective; a bfloat16 refusal must be the documented TypeError,
        naming the operation and this rank, with every watched tensor unchanged."""
        before = [w.detach().cpu().clone() for w in watched]
        try:
            return fn()
        except TypeError as exc:
            if dtype != torch.bfloat16 or "bfloat16" not in str(exc) or BFLOAT16_EXPECTED:
                raise
            named = operation in str(exc) and f"rank {self.rank}" in str(exc)
            if not named:
                raise AssertionError(f"bfloat16 refusal does not name {operation!r} and rank "
                                     f"{self.rank}: {exc}") from None
            if not all(torch.equal(w.detach().cpu(), b) for w, b in zip(watched, before)):
                raise AssertionError("bfloat16 refusal changed the tensor") from None
            raise Refused() from None

    # -- collectives x algorithms x dtypes ------------------------------------------------

    def algorithms(self, collective, dtype, op=R.SUM):
        names = list(capabilities()[collective])
        native = dist.group.WORLD.transport.native
        base = R.SUM if op == R.AVG else op
        if native is not None and native.supports(collective, numpy_dtype(dtype), base):
            names.append("native")
        return names

    def all_reduce(self, dtype, op, algorithm):
        def case(seed):
            xs = inputs(seed, self.size, SHAPE, dtype)
            want = reduced(xs, op)
            t = self.cuda(xs[self.rank])
            ptr = t.data_ptr()
            self.call(dtype, "all_reduce",
                      lambda: dist.all_reduce(t, op=op, algorithm=algorithm), t)
            if t.data_ptr() != ptr:
                return "data_ptr changed"
            return None if same(t, want) else differs("result", t, want)
        return case

    def broadcast(self, dtype, algorithm):
        def case(seed):
            root = seed % self.size
            xs = inputs(seed, self.size, SHAPE, dtype)
            t = self.cuda(xs[self.rank])
            ptr = t.data_ptr()
            self.call(dtype, "broadcast",
                      lambda: dist.broadcast(t, src=root, algorithm=algorithm), t)
            if t.data_ptr() != ptr:
                return "data_ptr changed"
            return None if same(t, xs[root]) else differs(f"root {root}", t, xs[root])
        return case

    def reduce(self, dtype, op, algorithm):
        def case(seed):
            root = seed % self.size
            xs = inputs(seed, self.size, SHAPE, dtype)
            want = reduced(xs, op) if self.rank == root else xs[self.rank]   # others untouched
            t = self.cuda(xs[self.rank])
            ptr = t.data_ptr()
            self.call(dtype, "reduce",
                      lambda: dist.reduce(t, dst=root, op=op, algorithm=algorithm), t)
            if t.data_ptr() != ptr:
                return "data_ptr changed"
            return None if same(t, want) else differs(f"root {root}", t, want)
        return case

    def all_gather(self, dtype, algorithm, into_tensor):
        def case(seed):
            xs = inputs(seed, self.size, SHAPE, dtype)
            t = self.cuda(xs[self.rank])
            if into_tensor:
                out = torch.full((self.size * SHAPE[0], SHAPE[1]), 99, dtype=dtype,
                                 device=self.device)
                ptr = out.data_ptr()
                self.call(dtype, "all_gather_into_tensor",
                          lambda: dist.all_gather_into_tensor(out, t, algorithm=algorithm), out)
                if out.data_ptr() != ptr:
                    return "data_ptr changed"
                want = torch.cat(xs)
                return None if same(out, want) else differs("output", out, want)
            outs = [torch.full(SHAPE, 99, dtype=dtype, device=self.device)
                    for _ in range(self.size)]
            ptrs = [o.data_ptr() for o in outs]
            self.call(dtype, "all_gather",
                      lambda: dist.all_gather(outs, t, algorithm=algorithm), *outs)
            for i, (o, x) in enumerate(zip(outs, xs)):
                if o.data_ptr() != ptrs[i]:
                    return f"tensor_list[{i}] data_ptr changed"
                if not same(o, x):
                    return differs(f"tensor_list[{i}]", o, x)
            return None
        return case

    def reduce_scatter_tensor(self, dtype, op, algorithm):
        def case(seed):
            rows = SHAPE[0]
            xs = inputs(seed, self.size, (self.size * rows, SHAPE[1]), dtype)
            want = reduced(xs, op)[self.rank * rows:(self.rank + 1) * rows]
            inp = self.cuda(xs[self.rank])
            out = torch.full(SHAPE, 99, dtype=dtype, device=self.device)
            ptr = out.data_ptr()
            self.call(dtype, "reduce_scatter_tensor",
                      lambda: dist.reduce_scatter_tensor(out, inp, op=op, algorithm=algorithm),
                      out, inp)
            if out.data_ptr() != ptr:
                return "data_ptr changed"
            if not same(inp, xs[self.rank]):
                return "the input tensor was modified"
            return None if same(out, want) else differs("output", out, want)
        return case

    def all_to_all_single(self, dtype, algorithm, uneven):
        p, me, cols = self.size, self.rank, 5

        def rows(i, j):       # rows rank i sends to rank j
            return 1 + (i + 2 * j) % 3 if uneven else 3

        def case(seed):
            gen = torch.Generator().manual_seed(seed)
            xs = [torch.randint(-8, 9, (sum(rows(i, j) for j in range(p)), cols),
                                generator=gen).to(dtype) for i in range(p)]
            pieces = []
            for i in range(p):
                start = sum(rows(i, j) for j in range(me))
                pieces.append(xs[i][start:start + rows(i, me)])
            want = torch.cat(pieces)
            inp = self.cuda(xs[me])
            out = torch.full(tuple(want.shape), 99, dtype=dtype, device=self.device)
            ptr = out.data_ptr()
            splits = {}
            if uneven:
                splits = dict(output_split_sizes=[rows(i, me) for i in range(p)],
                              input_split_sizes=[rows(me, j) for j in range(p)])
            self.call(dtype, "all_to_all_single",
                      lambda: dist.all_to_all_single(out, inp, algorithm=algorithm, **splits),
                      out)
            if out.data_ptr() != ptr:
                return "data_ptr changed"
            return None if same(out, want) else differs("output", out, want)
        return case

    def collectives(self):
        for dtype in DTYPES:
            name = str(dtype).replace("torch.", "")
            for op in OPS[dtype]:
                for algorithm in self.algorithms("all_reduce", dtype, op):
                    self.check(f"all_reduce {name} {op.name} {algorithm}",
                               self.all_reduce(dtype, op, algorithm))
            for algorithm in self.algorithms("broadcast", dtype):
                self.check(f"broadcast {name} {algorithm}", self.broadcast(dtype, algorithm))
            for algorithm in self.algorithms("reduce", dtype, OPS[dtype][0]):
                self.check(f"reduce {name} SUM {algorithm}",
                           self.reduce(dtype, OPS[dtype][0], algorithm))
            for algorithm in self.algorithms("all_gather", dtype):
                for into in (False, True):
                    self.check(f"all_gather{'_into_tensor' if into else ''} {name} {algorithm}",
                               self.all_gather(dtype, algorithm, into))
            for algorithm in self.algorithms("reduce_scatter", dtype, R.SUM):
                self.check(f"reduce_scatter_tensor {name} SUM {algorithm}",
                           self.reduce_scatter_tensor(dtype, R.SUM, algorithm))
            for algorithm in self.algorithms("all_to_all", dtype):
                for uneven in (False, True):
                    self.check(f"all_to_all_single {name} {algorithm} "
                               f"{'uneven' if uneven else 'even'}",
                               self.all_to_all_single(dtype, algorithm, uneven))
            stage(self.rank, f"collectives {name}: {self.runs} cases, "
                             f"{len(self.failures)} failures")

    # -- bad input ------------------------------------------------------------------------

    def bad_inputs(self):
        def non_contiguous(seed):
            base = torch.arange(8 * 6, dtype=torch.float32, device=self.device).reshape(8, 6)
            t = base.t()
            before = t.cpu().clone()
            try:
                dist.all_reduce(t)
            except ValueError as exc:
                text = str(exc)
                if "all_reduce" not in text or f"rank {self.rank}" not in text \
                        or "contiguous" not in text:
                    return f"the error does not name all_reduce, rank {self.rank} and " \
                           f"contiguity: {text}"
            else:
                return "no error for a non-contiguous tensor"
            return None if same(t, before) else "the tensor changed"

        def cpu_tensor(seed):
            xs = inputs(seed, self.size, SHAPE, torch.float32)
            t = xs[self.rank].clone()           # on the CPU
            try:
                dist.all_reduce(t, algorithm="ring")
            except (TypeError, ValueError) as exc:
                text = str(exc)
                if "all_reduce" not in text or f"rank {self.rank}" not in text:
                    return f"{type(exc).__name__} does not name all_reduce and rank " \
                           f"{self.rank}: {text}"
            except Exception as exc:
                return f"not a clear error: {type(exc).__name__}: {exc}"
            else:
                return "no error for a CPU tensor on the nccl backend"
            if not same(t, xs[self.rank]):
                return "the CPU tensor changed"
            # nothing half-ran: the next collective on the group is still exact
            g = self.cuda(xs[self.rank])
            dist.all_reduce(g, algorithm="ring")
            want = reduced(xs, R.SUM)
            return None if same(g, want) else differs("the next all_reduce", g, want)

        self.check("non-contiguous tensor", non_contiguous)
        self.check("CPU tensor on nccl", cpu_tensor)

    # -- stream ordering ------------------------------------------------------------------

    def late_input(self, algorithm, side_stream):
        """Input written behind a long kernel on the current torch stream, no host sync; the
        collective and the read must both be ordered on that stream to see the right sum."""
        def case(seed):
            n = 1 << 20
            t = torch.zeros(n, dtype=torch.float32, device=self.device)
            torch.cuda.synchronize()             # zeros are there: a race reads them
            stream = torch.cuda.Stream(device=self.device) if side_stream else \
                torch.cuda.current_stream(self.device)
            with torch.cuda.stream(stream):
                delay(SLEEP_CYCLES)
                t.fill_(self.rank + 1)
                dist.all_reduce(t, algorithm=algorithm)
                got = t[::4096].cpu()            # copy on `stream`, then wait for it
            want = torch.full((n // 4096,), self.size * (self.size + 1) // 2,
                              dtype=torch.float32)
            return None if same(got, want) else differs("result", got, want)
        return case

    def streams(self):
        for algorithm in ("ring", "native"):
            for side in (False, True):
                self.check(f"stream order all_reduce {algorithm} "
                           f"{'torch.cuda.stream(s)' if side else 'default stream'}",
                           self.late_input(algorithm, side))

    # -- async ----------------------------------------------------------------------------

    def async_works(self, reverse):
        def case(seed):
            p = self.size
            ts = [torch.zeros(SHAPE, dtype=torch.float32, device=self.device) for _ in range(3)]
            torch.cuda.synchronize()
            delay(SLEEP_CYCLES)                  # inputs written late, on the current stream
            for i, t in enumerate(ts):
                t.fill_(self.rank + 1 + i)
            xs = inputs(seed, p, SHAPE, torch.float32)
            src = self.cuda(xs[self.rank])
            gathered = torch.full((p * SHAPE[0], SHAPE[1]), 99.0, device=self.device)
            root = seed % p
            bcast = self.cuda(xs[self.rank])
            works = [dist.all_reduce(t, async_op=True, algorithm=a)
                     for t, a in zip(ts, ("ring", "native", "recursive_doubling"))]
            works.append(dist.all_gather_into_tensor(gathered, src, async_op=True,
                                                     algorithm="ring"))
            works.append(dist.broadcast(bcast, src=root, async_op=True, algorithm="tree"))
            if any(not isinstance(w, dist.Work) for w in works):
                return f"async_op=True returned {[type(w).__name__ for w in works]}"
            for w in (reversed(works) if reverse else works):
                if w.wait() is not True:
                    return "Work.wait() did not return True"
            # README: after wait() the results are ordered on the current stream
            problems = []
            for i, t in enumerate(ts):
                want = torch.full(SHAPE, p * (p + 1) // 2 + p * i, dtype=torch.float32)
                if not same(t, want):
                    problems.append(differs(f"all_reduce {i}", t, want))
            if not same(gathered, torch.cat(xs)):
                problems.append(differs("all_gather_into_tensor", gathered, torch.cat(xs)))
            if not same(bcast, xs[root]):
                problems.append(differs(f"broadcast from {root}", bcast, xs[root]))
            torch.cuda.synchronize()
            if not all(w.is_completed() for w in works):
                problems.append("is_completed() False after wait() and a host synchronize")
            if not all(w.is_success() for w in works):
                problems.append("is_success() False")
            return "; ".join(problems) or None
        return case

    def future(self, seed):
        xs = inputs(seed, self.size, SHAPE, torch.float32)
        t = self.cuda(xs[self.rank])
        work = dist.all_reduce(t, async_op=True, algorithm="ring")
        fut = work.get_future()
        value = fut.wait()
        if not isinstance(value, list) or len(value) != 1 or value[0] is not t:
            return f"get_future().wait() gave {value!r}, not [the tensor]"
        want = reduced(xs, R.SUM)
        if not same(t, want):
            return differs("result", t, want)
        torch.cuda.synchronize()
        deadline = time.monotonic() + 10.0
        while not work.is_completed():          # documented: true once the host has synced
            if time.monotonic() > deadline:
                return "is_completed() still False 10 s after the future completed"
            time.sleep(0.001)
        if not fut.done():
            return "future not done after wait()"
        return None

    def asynchronous(self):
        self.check("async: 5 works waited in order", self.async_works(reverse=False))
        self.check("async: 5 works waited in reverse", self.async_works(reverse=True))
        self.check("async: get_future().wait()", self.future)


def delay(cycles):
    """A long kernel on the current torch stream (torch.cuda._sleep, else matmuls)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(cycles)
        return
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(20):
        a = a @ a / 64.0


def stage(rank, text, every_rank=False):
    if every_rank or rank == 0:
        print(f"stage rank {rank} {time.time() - T0:6.1f}s: {text}", flush=True)


def main():
    args = argparse.ArgumentParser()
    args.add_argument("--store", required=True, help="a fresh file for the FileStore rendezvous")
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
    stage(rank, f"started, {size} ranks, torch {torch.__version__}", every_rank=True)
    dist.init_process_group("nccl", init_method=f"file://{args.store}", rank=rank,
                            world_size=size, timeout=120)
    device = torch.device("cuda", dist.group.WORLD.transport.device)
    torch.cuda.set_device(device)
    stage(rank, f"process group ready on {device}", every_rank=True)
    suite = Suite(rank, size, device)
    suite.collectives()
    stage(rank, "bad inputs")
    suite.bad_inputs()
    stage(rank, "stream ordering")
    suite.streams()
    stage(rank, "async")
    suite.asynchronous()
    stage(rank, "destroy_process_group", every_rank=True)
    dist.destroy_process_group()
    # One short line (well under the 4 KiB that mpiexec forwards without interleaving it
    # with other ranks' output): the full failure lines are the FAIL lines above.
    print("RESULT " + json.dumps({"rank": rank, "size": size, "runs": suite.runs,
                                  "bf16_refused": suite.bf16_refused,
                                  "failures": [f[:200] for f in suite.failures[:8]],
                                  "failed": len(suite.failures)}), flush=True)
    # Under mpiexec, leaving without MPI_Finalize (os._exit skips it) is an "improper exit"
    # that makes Open MPI kill the other ranks before they print their RESULT.
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.COMM_WORLD.Barrier()
        mpi.Finalize()
    os._exit(1 if suite.failures else 0)


if __name__ == "__main__":
    main()
