"""One rank of the checks of ``pipelined_reduce_scatter`` (``test_peer.py``), under
``mpiexec -n N``: a direct reduce_scatter of large blocks, which runs with some thread blocks
pushing chunk after chunk while the others reduce each chunk as it arrives.

The group is made with COLLECTIVES_PEER_PIPELINE_BYTES=4K, chunks of 64 KiB,
COLLECTIVES_PEER_COPY_ENGINE_BYTES=256K and COLLECTIVES_PEER_COPY_CHUNK_BYTES=64K (all alike
on every rank), so that calls of a few MiB cut into many chunks and many shares, and
all_reduces of blocks from 256 KiB gather with the copy engines (two launches, the copies
between them), smaller ones with thread blocks.

1. Results: every dtype and op below, counts per rank from 1 to past 64 chunks, bitwise
   equal to numpy's reduction in rank order (the program's order: direct.reduce_scatter);
   each call checked to have run as ``pipelined_reduce_scatter`` from the threshold on and
   as the program below it.
1b. two_shot all_reduces of p equal blocks, out of place and in place (the kernel's gather:
   every peer's reduced block read straight into the output, by thread blocks or the copy
   engines), bitwise against numpy in rank order, and the kernel each ran; an uneven count
   runs as the program.
1c. direct all_gathers and all_to_alls, every dtype: blocks from 256 KiB run with the copy
   engines (each rank's input staged in chunks of 64 KiB beside the copies of every peer's
   block for it out of the peer's staging memory), blocks from 4 KiB pipelined (every
   chunk copied out of the slots as soon as every peer has pushed it), smaller ones as the
   program; bitwise what numpy says, and the kernel each ran.
1d. pipelined all_gathers and all_to_alls (the copy engines off) whose outputs lie in
   symmetric memory on some ranks and not on others (none, rank 0, the odd ranks, every
   rank): peers push straight into a symmetric output, into the slots otherwise, in one
   call; every dtype; every rank's output bitwise right.
2. Alternation: pipelined calls between program calls of the same group (reduce_scatter
   below the threshold, all_reduce two_shot, all_gather direct, whose output is staged
   where the all_reduce's reduced block lay; a pipelined all_gather among them), as
   message tallies, epochs and call numbers must survive, and all_gathers by the copy
   engines before program all_gathers that receive where they staged, all_to_alls by them
   too; every result checked.
3. A CUDA graph: the pipelined call captured once, replayed with new input each time; and an
   all_reduce gathered by the copy engines (two launches and the copies in one graph), and
   an all_gather and an all_to_all by them (the side stream's staging and copy of the rank's
   own block, each chunk's wait and copies); and a pipelined all_gather into symmetric
   memory on even ranks.
4. Large: 64 MiB per rank's block with the default pipeline chunks; an all_reduce of p such
   blocks in place; an all_to_all of its result (by the copy engines, in 2 chunks of 32 MiB);
   then pipelined (the copy engines off) an all_gather and an all_to_all of 64 MiB blocks
   (past COLLECTIVES_PEER_MAX_BYTES: every rank runs the kernel whatever its output), their
   outputs symmetric on odd ranks.
5. A rank that never arrives (rank 0 skips a call all made before): every other rank's call
   ends at its timeout naming rank 0; its output not written (no chunk came from every
   peer); no kernel left spinning. The group is failed after it, so it comes last.

Prints ``RESULT {...}`` per rank (``gpu_jobs.check_results``).
"""
from __future__ import annotations

import contextlib
import os

import numpy as np

os.environ["COLLECTIVES_PEER_PIPELINE_BYTES"] = "4K"
os.environ["COLLECTIVES_PEER_COPY_ENGINE_BYTES"] = "256K"
os.environ["COLLECTIVES_PEER_COPY_CHUNK_BYTES"] = "64K"
# peer_job, beside this file, puts the checkout on the path
from peer_job import (Tally, contents, leave_failed_group, peer_executor_of,  # noqa: E402
                      replays, start)
from collectives.errors import CollectiveTimeout, TransportError  # noqa: E402
from collectives.executors import peer as peer_executor  # noqa: E402
from collectives.ops import ReduceOp  # noqa: E402

COUNTS = (1, 3, 1000, 1025, 4099, (1 << 18) + 5, (1 << 20) + 3)
CASES = (("float32", "sum"), ("float32", "max"), ("float16", "sum"), ("int32", "sum"),
         ("int32", "product"), ("int64", "min"))
OPS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}


def reference(inputs, rank, count, op):
    """Block ``rank`` of every rank's input reduced in rank order, as numpy computes it."""
    block = slice(rank * count, (rank + 1) * count)
    acc = inputs[0][block].copy()
    for x in inputs[1:]:
        acc = OPS[op](acc, x[block])
    return acc


def main():
    peer_executor.PIPELINE_CHUNK_BYTES = 64 << 10
    group, cupy, _ = start()
    rank, p = group.rank, group.size
    tally = Tally(cupy, rank, p)
    failures = tally.failures
    executor = peer_executor_of(group, tally)
    if executor is None:
        return

    def reduce_scatter(inputs, count, dtype, op, algorithm="direct"):
        out = cupy.zeros(count, dtype)
        group.prepare("reduce_scatter", input=cupy.asarray(inputs[rank]), output=out, op=op,
                      algorithm=algorithm)()
        return out

    def ran(count, dtype, op, collective="reduce_scatter"):
        """Whether the reduce_scatter of ``count`` elements per rank (the two_shot all_reduce
        of ``count`` elements) of ``dtype`` and ``op`` ran pipelined (the kernel of the
        executor's entries for its plan)."""
        algorithm = "direct" if collective == "reduce_scatter" else "two_shot"
        kernels = {getattr(entry, "kernel", "nccl send/recv")
                   for key, (plan, entry) in executor._entries.items()
                   if plan.collective == collective and plan.algorithm == algorithm and
                   (plan.args[0][rank] if collective == "reduce_scatter" else plan.args[0])
                   == count and key[1] == np.dtype(dtype) and key[2] in (op, ReduceOp.parse(op))}
        if not kernels or (collective == "reduce_scatter" and len(kernels) != 1):
            failures.append(f"{collective} {count} {dtype} {op}: entries running "
                            f"{sorted(kernels)}")
        want = "pipelined_" + collective
        if collective == "all_reduce" and \
                count // p * np.dtype(dtype).itemsize >= executor.copy_engine["all_reduce"]:
            want += "_copy_engines"
        return kernels == {want}

    def case(seed, count, dtype, op, label, expect=None):
        inputs = [contents(seed, r, count * p, dtype) for r in range(p)]
        out = reduce_scatter(inputs, count, dtype, op)
        tally.check(label, out, reference(inputs, rank, count, op), bitwise=True)
        if expect is not None and ran(count, dtype, op) != expect:
            failures.append(f"{label}: ran {'as the program' if expect else 'pipelined'}")

    # 1. results, bitwise against numpy in rank order
    for seed, (dtype, op) in enumerate(CASES):
        for count in COUNTS:
            expect = count * np.dtype(dtype).itemsize >= executor.pipeline
            case(seed, count, dtype, op, f"{dtype} {op} {count} per rank", expect)

    # 1b. two_shot all_reduces (the kernel's gather), out of place and in place
    for seed, (dtype, op) in enumerate(CASES):
        for block in (1, 1000, 1025, (1 << 18) + 5):
            count = block * p
            inputs = [contents(100 + seed, r, count, dtype) for r in range(p)]
            want = reference(inputs, 0, count, op)
            expect = block * np.dtype(dtype).itemsize >= executor.pipeline
            label = f"all_reduce {dtype} {op} {count}"
            out = cupy.zeros(count, dtype)
            group.prepare("all_reduce", input=cupy.asarray(inputs[rank]), output=out, op=op,
                          algorithm="two_shot")()
            tally.check(label, out, want, bitwise=True)
            d = cupy.asarray(inputs[rank])
            group.prepare("all_reduce", input=d, output=d, op=op, algorithm="two_shot")()
            tally.check(label + " in place", d, want, bitwise=True)
            if ran(count, dtype, op, "all_reduce") != expect:
                failures.append(f"{label}: ran {'as the program' if expect else 'pipelined'}")
    count = 4099                            # the ranks do not divide it: the program
    ints = [contents(9, r, count, "int32") for r in range(p)]
    d = cupy.asarray(ints[rank])
    group.prepare("all_reduce", input=d, output=d, algorithm="two_shot")()
    tally.check("all_reduce of an uneven count", d, reference(ints, 0, count, "sum"))

    # 1c. direct all_gathers and all_to_alls: the copy engines from 256 KiB blocks (staged in
    # chunks of 64 KiB, up to 8 of them), the program below
    def ran_copied(collective, block, dtype):
        """The kernels the executor's entries run for a direct ``collective`` of ``block``
        elements per block."""
        return {getattr(entry, "kernel", "nccl send/recv")
                for key, (plan, entry) in executor._entries.items()
                if plan.collective == collective and plan.algorithm == "direct" and
                (plan.args[0][0][0] if collective == "all_to_all" else plan.args[0][rank])
                == block and key[1] == np.dtype(dtype)}

    def expected(collective, inputs, block):
        """What this rank's output holds after ``collective`` of ``inputs``."""
        if collective == "all_gather":
            return np.concatenate(inputs)
        return np.concatenate([x[rank * block:(rank + 1) * block] for x in inputs])

    def copied_call(collective, seed, block, dtype, label):
        inputs = [contents(seed, r, block * (p if collective == "all_to_all" else 1), dtype)
                  for r in range(p)]
        out = cupy.zeros(block * p, dtype)
        group.prepare(collective, input=cupy.asarray(inputs[rank]), output=out,
                      algorithm="direct")()
        tally.check(label, out, expected(collective, inputs, block), bitwise=True)
        nbytes = block * np.dtype(dtype).itemsize
        want = f"copies_{collective}" if nbytes >= executor.copy_engine[collective] else \
            f"pipelined_{collective}" if nbytes >= executor.pipeline else "run_program"
        if ran_copied(collective, block, dtype) != {want}:
            failures.append(f"{label}: ran {sorted(ran_copied(collective, block, dtype))}, "
                            f"not {want}")
    for collective in ("all_gather", "all_to_all"):
        for seed, dtype in enumerate(("float32", "float16", "int32", "int64")):
            for block in (1000, (1 << 16) + 3, (1 << 18) + 5):
                copied_call(collective, 200 + seed, block, dtype,
                            f"{collective} {dtype} {block} per block")
        executor.copy_chunk = 1 << 20               # one chunk (the wait before its copies)
        copied_call(collective, 230, (1 << 16) + 7, "float32",
                    f"{collective} in one chunk")
        executor.copy_chunk = 64 << 10

    # 1d. pipelined all_gathers and all_to_alls, outputs symmetric on some ranks
    @contextlib.contextmanager
    def pipelined_moves():
        """The copy engines off for all_gather and all_to_all (so that their large blocks
        run pipelined), the executor's entries chosen again on entry and on exit, on every
        rank alike."""
        kept = dict(executor.copy_engine)
        executor.copy_engine.update(all_gather=0, all_to_all=0)
        executor._entries.clear()
        group._forget_repeats()
        try:
            yield
        finally:
            executor.copy_engine.update(kept)
            executor._entries.clear()
            group._forget_repeats()
    heap = group.symmetric_empty(8 * p * ((1 << 18) + 8), "uint8")

    def moved(collective, seed, block, dtype, symmetric, label):
        """A direct ``collective`` of ``block`` elements per block, this rank's output in
        symmetric memory where ``symmetric`` holds for it, checked bitwise, and pipelined."""
        inputs = [contents(seed, r, block * (p if collective == "all_to_all" else 1), dtype)
                  for r in range(p)]
        nbytes = block * p * np.dtype(dtype).itemsize
        out = heap[:nbytes].view(dtype) if symmetric(rank) else cupy.zeros(block * p, dtype)
        out.fill(0)
        group.prepare(collective, input=cupy.asarray(inputs[rank]), output=out,
                      algorithm="direct")()
        tally.check(label, out, expected(collective, inputs, block), bitwise=True)
        if ran_copied(collective, block, dtype) != {f"pipelined_{collective}"}:
            failures.append(f"{label}: ran {sorted(ran_copied(collective, block, dtype))}")
    whose = {"no rank's": lambda r: False, "rank 0's": lambda r: r == 0,
             "odd ranks'": lambda r: r % 2 == 1, "every rank's": lambda r: True}
    with pipelined_moves():
        for collective in ("all_gather", "all_to_all"):
            for seed, dtype in enumerate(("float32", "float16", "int32", "int64")):
                for block in ((1 << 16) + 3, (1 << 18) + 5):
                    for name, symmetric in whose.items():
                        moved(collective, 300 + seed, block, dtype, symmetric,
                              f"{collective} {dtype} {block}, {name} output symmetric")

    # 2. pipelined calls between program calls
    for round_ in range(3):
        case(20 + round_, (1 << 16) + 1, "float32", "sum", f"round {round_}: pipelined", True)
        case(30 + round_, 100, "float32", "sum", f"round {round_}: the program", False)
        ints = [contents(40 + round_, r, 4099, "int32") for r in range(p)]
        d = cupy.asarray(ints[rank])
        group.prepare("all_reduce", input=d, output=d, algorithm="two_shot")()
        want = ints[0].copy()
        for x in ints[1:]:
            want += x
        tally.check(f"round {round_}: two_shot all_reduce after", d, want)
        small = [x[:1000] for x in ints]            # 4000 bytes a block: the program
        out = cupy.zeros(1000 * p, cupy.int32)
        group.prepare("all_gather", input=cupy.asarray(small[rank]), output=out,
                      algorithm="direct")()
        tally.check(f"round {round_}: direct all_gather after", out, np.concatenate(small))
        out = cupy.zeros(4099 * p, cupy.int32)      # pipelined
        group.prepare("all_gather", input=cupy.asarray(ints[rank]), output=out,
                      algorithm="direct")()
        tally.check(f"round {round_}: pipelined all_gather after", out, np.concatenate(ints))
        case(50 + round_, (1 << 16) + 1, "float32", "sum", f"round {round_}: pipelined again",
             True)
        floats = [contents(60 + round_, r, (1 << 16) * p, "float32") for r in range(p)]
        out = cupy.zeros((1 << 16) * p, cupy.float32)
        group.prepare("all_reduce", input=cupy.asarray(floats[rank]), output=out,
                      algorithm="two_shot")()
        tally.check(f"round {round_}: pipelined all_reduce", out,
                    reference(floats, 0, (1 << 16) * p, "sum"), bitwise=True)
        copied_call("all_gather", 210 + round_, 1 << 16, "float32",
                    f"round {round_}: copied all_gather")
        copied_call("all_to_all", 220 + round_, 1 << 16, "float32",
                    f"round {round_}: copied all_to_all")
        gathered = cupy.zeros(1000 * p, cupy.int32)
        group.prepare("all_gather", input=cupy.asarray(small[rank]), output=gathered,
                      algorithm="direct")()
        tally.check(f"round {round_}: direct all_gather after it", gathered,
                    np.concatenate(small))

    # 3. captured in a CUDA graph, replayed with new input
    stream = cupy.cuda.Stream(non_blocking=True)
    count = 70001
    src = cupy.zeros(count * p, cupy.int32)
    out = cupy.zeros(count, cupy.int32)
    def call():
        group.prepare("reduce_scatter", input=src, output=out, algorithm="direct")()
    for replay, inputs in replays(stream, call, src, 4, 70, rank, p):
        tally.check(f"graph replay {replay}", out, reference(inputs, rank, count, "sum"))
    if not ran(count, "int32", "sum"):
        failures.append("the graph's call did not run pipelined")
    count = (1 << 16) * p                   # 256 KiB blocks: the copy engines gather
    src = cupy.zeros(count, cupy.float32)
    out = cupy.zeros(count, cupy.float32)
    def call():
        group.prepare("all_reduce", input=src, output=out, algorithm="two_shot")()
    for replay, inputs in replays(stream, call, src, 3, 80, rank, p):
        tally.check(f"all_reduce graph replay {replay}", out,
                    reference(inputs, 0, count, "sum"), bitwise=True)
    if not ran(count, "float32", "sum", "all_reduce"):
        failures.append("the graph's all_reduce did not gather with the copy engines")
    block = 1 << 18                         # 1 MiB blocks: staged in 8 chunks
    for collective in ("all_gather", "all_to_all"):
        src = cupy.zeros(block * (p if collective == "all_to_all" else 1), cupy.float32)
        out = cupy.zeros(block * p, cupy.float32)
        def call():
            group.prepare(collective, input=src, output=out, algorithm="direct")()
        for replay, inputs in replays(stream, call, src, 3, 90, rank, p):
            tally.check(f"{collective} graph replay {replay}", out,
                        expected(collective, inputs, block), bitwise=True)
        if ran_copied(collective, block, "float32") != {f"copies_{collective}"}:
            failures.append(f"the graph's {collective} did not run with the copy engines")

    with pipelined_moves():
        src = cupy.zeros(block, cupy.float32)
        out = heap[:4 * block * p].view(cupy.float32) if rank % 2 == 0 else \
            cupy.zeros(block * p, cupy.float32)
        def call():
            group.prepare("all_gather", input=src, output=out, algorithm="direct")()
        for replay, inputs in replays(stream, call, src, 3, 95, rank, p):
            tally.check(f"pipelined all_gather graph replay {replay}", out,
                        np.concatenate(inputs), bitwise=True)
        if ran_copied("all_gather", block, "float32") != {"pipelined_all_gather"}:
            failures.append("the graph's all_gather did not run pipelined")

    # 4. large, the default pipeline chunks; copies in chunks of 32 MiB
    peer_executor.PIPELINE_CHUNK_BYTES = 4 << 20
    executor.copy_chunk = 32 << 20
    count = 16 << 20
    inputs = [np.arange(count * p, dtype=np.float32) % 1024 + r for r in range(p)]
    case_out = reduce_scatter(inputs, count, "float32", "sum")
    tally.check("64 MiB per rank", case_out, reference(inputs, rank, count, "sum"), bitwise=True)
    d = cupy.asarray(inputs[rank])
    group.prepare("all_reduce", input=d, output=d, algorithm="two_shot")()
    tally.check(f"all_reduce of {p} x 64 MiB in place", d,
                reference(inputs, 0, count * p, "sum"), bitwise=True)
    if not ran(count * p, "float32", "sum", "all_reduce"):
        failures.append("the large all_reduce did not run pipelined")
    out = cupy.zeros(count * p, cupy.float32)        # 64 MiB blocks: 2 chunks
    group.prepare("all_to_all", input=d, output=out, algorithm="direct")()
    want = reference(inputs, 0, count * p, "sum")
    tally.check(f"all_to_all of {p} x 64 MiB", out, np.tile(want[rank * count:
                                                                 (rank + 1) * count], p))
    if ran_copied("all_to_all", count, "float32") != {"copies_all_to_all"}:
        failures.append("the large all_to_all did not run with the copy engines")
    with pipelined_moves():
        big = group.symmetric_empty(count * p, "float32")   # collective: every rank makes it
        moved_out = big if rank % 2 == 1 else cupy.zeros(count * p, cupy.float32)
        moved_out.fill(0)
        group.prepare("all_gather", input=d[:count], output=moved_out, algorithm="direct")()
        tally.check(f"pipelined all_gather of {p} x 64 MiB", moved_out,
                    np.tile(want[:count], p), bitwise=True)
        moved_out.fill(0)
        group.prepare("all_to_all", input=d, output=moved_out, algorithm="direct")()
        tally.check(f"pipelined all_to_all of {p} x 64 MiB", moved_out,
                    np.tile(want[rank * count:(rank + 1) * count], p), bitwise=True)
        for collective in ("all_gather", "all_to_all"):
            if ran_copied(collective, count, "float32") != {f"pipelined_{collective}"}:
                failures.append(f"the large {collective} did not run pipelined")

    # 5. rank 0 never arrives (at a call every rank has made once, so that no rank waits in
    # the growth of the group's memory, which the host side bounds: test_peer_host_side.py)
    count = 1 << 16
    ones = cupy.ones(count * p, cupy.float32)
    out = reduce_scatter([cupy.asnumpy(ones)] * p, count, "float32", "sum")
    tally.check("before rank 0 stays away", out, np.full(count, p, np.float32))
    group.transport.synchronize(30.0)
    group.bench_host.barrier()
    out = cupy.full(count, -1.0, cupy.float32)
    timed_out = 0
    if rank != 0:
        try:
            group.prepare("reduce_scatter", input=ones, output=out, algorithm="direct",
                          timeout=3.0)()
            group.transport.synchronize(30.0)
            failures.append("rank 0 never called, yet the call returned")
        except CollectiveTimeout as exc:     # this rank's wait for rank 0 ran out
            tally.runs += 1
            timed_out = 1
            if "rank 0" not in str(exc):
                failures.append(f"the timeout does not name rank 0: {exc}")
        except TransportError as exc:        # another rank's ran out first and said so
            tally.runs += 1
            if "gave up" not in str(exc):
                failures.append(f"expected a peer that gave up: {exc}")
        tally.drained()
        if (cupy.asnumpy(out) != -1.0).any():
            failures.append("output was written though rank 0 never sent its part")
    if group.bench_host.sum(timed_out) < 1:
        failures.append("no rank's call timed out waiting for rank 0")
    tally.report()
    leave_failed_group()              # the group failed on purpose (5.)


if __name__ == "__main__":
    main()
