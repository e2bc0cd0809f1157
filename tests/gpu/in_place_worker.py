"""One rank of the checks of ``two_shot_in_place`` (``test_peer.py``), under ``mpiexec -n N``:
two_shot all_reduce called in place on a buffer in the group's symmetric memory on every
rank, which runs as one pass over the peers' buffers instead of the program.

1. Results: every dtype and op below, counts from 1 to past a block per SM, the buffer at
   the heap's start and one element in (16-byte loads, then element by element), each
   bitwise equal to the same call on an ordinary array (the program, the same rank order)
   and, for integers, to numpy. Each call is checked to have run in place up to
   COLLECTIVES_PEER_IN_PLACE_BYTES and as the program above it: the peers' MODE words name
   this rank's latest call, or not.
2. Alternation: in-place calls between program calls of the same group (two_shot out of
   place, ring in place on the same symmetric buffer, direct into an ordinary array), as
   message tallies and call numbers must survive; every result checked.
3. A CUDA graph: the in-place call captured once, replayed with new contents each time.
4. A rank that calls otherwise (rank 0 in place on symmetric memory, the others on ordinary
   arrays): every rank's call fails at once, rank 0's naming the rank that called
   otherwise, the others' naming rank 0; no rank's buffer changed; no kernel left spinning.
   The group is failed after it, so it comes last.

Prints ``RESULT {...}`` per rank (``gpu_jobs.check_results``).
"""
from __future__ import annotations

import numpy as np

# peer_job, beside this file, puts the checkout on the path
from peer_job import (Tally, contents, leave_failed_group, peer_executor_of, replays,
                      start)
from collectives.errors import CollectiveTimeout, TransportError  # noqa: E402
from collectives.kernels import cuda_peer  # noqa: E402

COUNTS = (1, 3, 7, 1000, 4099, (1 << 20) + 5, 3 << 20)
CASES = (("float32", "sum"), ("float32", "max"), ("float16", "sum"), ("int32", "sum"),
         ("int32", "product"), ("int64", "min"))


def reference(parts, op):
    """numpy's result for integers, in rank order."""
    acc = parts[0].copy()
    for x in parts[1:]:
        acc = {"sum": np.add, "max": np.maximum, "min": np.minimum,
               "product": np.multiply}[op](acc, x)
    return acc


def main():
    group, cupy, _ = start()
    rank, p = group.rank, group.size
    tally = Tally(cupy, rank, p)
    failures = tally.failures
    executor = peer_executor_of(group, tally)
    if executor is None:
        return
    memory = executor.memory

    def words(start, n):
        out = np.zeros(n, np.uint64)
        cupy.cuda.runtime.memcpy(out.ctypes.data, memory.flags_ptr + 8 * start, 8 * n, 2)
        return out

    def ran_in_place():
        """Whether this rank's latest call ran in place: every peer wrote its MODE word
        with that call's number + 1, which is this rank's next call number."""
        cupy.cuda.Device().synchronize()
        call = int(words(cuda_peer.CALL_WORD, 1)[0])
        mode = words(cuda_peer.MODE_WORDS, p)
        return all(int(mode[q]) == call for q in range(p) if q != rank)

    def check(label, got, want):
        tally.check(label, got, want, bitwise=True)

    heap = group.symmetric_empty(8 * ((3 << 20) + 8), "uint8")

    def in_heap(dtype, count, offset):
        return heap[:(count + offset) * np.dtype(dtype).itemsize].view(dtype)[offset:]

    # 1. results, bitwise against the program on an ordinary array
    for seed, (dtype, op) in enumerate(CASES):
        for count in COUNTS:
            for offset in (0, 1):
                if count > (1 << 20) and offset:
                    continue
                parts = [contents(seed, r, count, dtype) for r in range(p)]
                label = f"{dtype} {op} {count} elements at +{offset}"
                plain = cupy.asarray(parts[rank])
                group.prepare("all_reduce", input=plain, output=plain, op=op,
                              algorithm="two_shot")()
                if ran_in_place():
                    failures.append(f"{label}: the ordinary array ran in place")
                buf = in_heap(dtype, count, offset)
                buf.set(parts[rank])
                group.prepare("all_reduce", input=buf, output=buf, op=op,
                              algorithm="two_shot")()
                expected = count * np.dtype(dtype).itemsize <= executor.in_place
                if ran_in_place() != expected:
                    failures.append(f"{label}: the symmetric buffer ran "
                                    f"{'as the program' if expected else 'in place'} "
                                    f"(COLLECTIVES_PEER_IN_PLACE_BYTES={executor.in_place})")
                check(f"{label}: in place against the program", buf, cupy.asnumpy(plain))
                if np.dtype(dtype).kind == "i":
                    check(f"{label}: against numpy", buf, reference(parts, op))

    # 2. in-place calls between program calls
    count = (1 << 18) + 3
    for round_ in range(3):
        parts = [contents(50 + round_, r, count, "float32") for r in range(p)]
        want = reference(parts, "sum")
        buf = in_heap("float32", count, 0)
        buf.set(parts[rank])
        group.prepare("all_reduce", input=buf, output=buf, algorithm="two_shot")()
        first = cupy.asnumpy(buf)
        out = cupy.zeros(count, cupy.float32)
        group.prepare("all_reduce", input=cupy.asarray(parts[rank]), output=out,
                      algorithm="two_shot")()
        check(f"round {round_}: two_shot out of place after in place", out, first)
        buf.set(parts[rank])
        group.prepare("all_reduce", input=buf, output=buf, algorithm="ring")()
        if ran_in_place():
            failures.append(f"round {round_}: ring ran in place")
        ints = [contents(60 + round_, r, 4099, "int32") for r in range(p)]
        d = cupy.asarray(ints[rank])
        group.prepare("all_reduce", input=d, output=d, algorithm="direct")()
        check(f"round {round_}: direct after", d, reference(ints, "sum"))
        buf.set(parts[rank])
        group.prepare("all_reduce", input=buf, output=buf, algorithm="two_shot")()
        check(f"round {round_}: in place again", buf, first)
        tally.runs += 1
        if not np.allclose(first, want, rtol=1e-4, atol=1e-4):
            failures.append(f"round {round_}: in place far from numpy's sum")

    # 3. captured in a CUDA graph, replayed with new contents
    stream = cupy.cuda.Stream(non_blocking=True)
    count = 70001
    buf = in_heap("int32", count, 0)
    def call():
        group.prepare("all_reduce", input=buf, output=buf, algorithm="two_shot")()
    for replay, parts in replays(stream, call, buf, 4, 70, rank, p):
        check(f"graph replay {replay}", buf, reference(parts, "sum"))

    # 4. rank 0 in place on symmetric memory, the others on ordinary arrays
    group.transport.synchronize(30.0)
    group.bench_host.barrier()
    count = 1 << 16
    mine = contents(90, rank, count, "float32")
    buf = in_heap("float32", count, 0) if rank == 0 else cupy.asarray(mine)
    buf.set(mine)
    try:
        group.prepare("all_reduce", input=buf, output=buf, algorithm="two_shot")()
        group.transport.synchronize(30.0)
        group.prepare("all_reduce", input=buf, output=buf, algorithm="two_shot")()
        failures.append("a rank called otherwise, yet the group went on")
    except (TransportError, CollectiveTimeout) as exc:
        tally.runs += 1
        text = str(exc)
        if isinstance(exc, CollectiveTimeout):
            failures.append(f"the mismatch waited for the timeout: {text}")
        elif rank == 0 and "did not run this all_reduce as this rank did" not in text:
            failures.append(f"rank 0's error does not say a peer called otherwise: {text}")
        elif rank != 0 and "rank 0" not in text:
            failures.append(f"rank {rank}'s error does not name rank 0: {text}")
    tally.drained()
    check("the buffer of a failed call", buf, mine)
    tally.report()
    leave_failed_group()              # the group failed on purpose (4.)


if __name__ == "__main__":
    main()
