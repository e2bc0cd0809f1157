"""One rank of the peer-memory checks (``test_peer.py``), under ``mpiexec -n N``: what the
collective-by-collective suite (``nccl_worker.py``) does not reach on the peer path.

0. The flagged lines' wrap: the call number set just below 2^32 (``start_at_call``), then
   calls of growing size across it, rank 1 held back before each so that rank 0 polls lines
   its peer has not written yet. The kernel's flag was (call + 1) in 32 bits: at call 2^32 - 1
   it was 0, which every line never written holds, so rank 0 took zeros for rank 1's data (a
   silent wrong result). Now the flag is the call modulo 2^31 plus one and each inbox half is
   zeroed at the end of a period (``pushed.scrubs``); these calls cross two such ends.
1. Graph capture and replay: calls captured once on a side stream, replayed with new input
   each time; every replay's result checked (the kernel's call number lives in device memory,
   so replays move the protocol on as eager calls do).
2. Two streams: calls issued on two streams back to back, no synchronization between them;
   both results checked (the executor orders a call after the previous call's stream).
4. Symmetric outputs (``group.symmetric_empty``), then registered ones (an ordinary CuPy
   array each rank registered, ``group.register_buffer``): calls large enough that peers
   write outputs directly (rendezvous), with rank 0's output there and the others' staged,
   then every rank's; all_reduce (two_shot, ring), all_gather and all_to_all (direct), in
   place and out of place, against numpy. Deregistered, the buffer is staged again (its
   place 0) and the same call still right.
5. Symmetric memory, then a registered buffer, made while the caller's stream still runs
   a long kernel (as a bench's 256 MiB fills): the handles' exchange once copied them to the
   device on that stream and read them on another, so every rank opened stale handles
   (cudaErrorInvalidValue); then an all_gather into each, against numpy.
3. A rank that never arrives: rank 1 skips one all_reduce; every other rank's kernel stops at
   the call's timeout and the next use of the group raises CollectiveTimeout naming rank 1;
   rank 1's next call finds the abort and does nothing, and its next synchronize raises
   TransportError naming the rank that gave up (before, that call returned as if it had
   worked). No kernel is left spinning: every rank's stream drains.

Prints ``RESULT {...}`` per rank (``gpu_jobs.check_results``).
"""
from __future__ import annotations

import numpy as np

from peer_job import (Tally, capture, leave_failed_group,  # beside this file: puts the checkout
                      start)
from collectives.errors import CollectiveTimeout, TransportError  # noqa: E402  on the path


def inputs(call, p, count):
    """Every rank's input of call number ``call`` (small integers: sums are exact)."""
    return [np.random.default_rng(1000 * call + r).integers(-8, 9, count).astype(np.float32)
            for r in range(p)]


def main():
    group, cupy, _ = start()
    rank, p = group.rank, group.size
    tally = Tally(cupy, rank, p)
    failures, check = tally.failures, tally.check
    executor = group.executor.peer
    if executor is None:
        failures.append(f"the group does not run on peer memory: "
                        f"{group.executor.peer_path}")

    # 0. across the flagged lines' wrap (first: no earlier call has written the inboxes)
    if executor is not None:
        spin = cupy.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
            long long start = clock64(); while (clock64() - start < cycles) {} }''', "spin")
        executor.start_at_call((1 << 32) - 5)
        group.bench_host.barrier()
        for call in range(10):
            count = 2000 * (call + 1)
            mine = inputs(100 + call, p, count)
            d_in = cupy.asarray(mine[rank])
            cupy.cuda.Device().synchronize()
            group.bench_host.barrier()
            if rank == 1:
                spin((1,), (1,), (np.int64(4_000_000),))       # ~2 ms on the GPU
            if call % 2:
                d_out = cupy.zeros(count * p, cupy.float32)
                group.prepare("all_gather", input=d_in, output=d_out, algorithm="ring")()
                want = np.concatenate(mine)
            else:
                d_out = cupy.zeros(count, cupy.float32)
                group.prepare("all_reduce", input=d_in, output=d_out, algorithm="direct")()
                want = np.sum(mine, axis=0, dtype=np.float32)
            check(f"call 2^32 - 5 + {call} ({'all_gather' if call % 2 else 'all_reduce'}, "
                  f"{count} elements)", d_out, want)

    # 1. graph capture and replay
    stream = cupy.cuda.Stream(non_blocking=True)
    for algorithm, count in (("direct", 1000), ("ring", 1 << 16), ("recursive_doubling", 4099)):
        d_in, d_out = cupy.zeros(count, cupy.float32), cupy.zeros(count, cupy.float32)

        def call():
            group.prepare("all_reduce", input=d_in, output=d_out, algorithm=algorithm)()
        graph = capture(stream, call)
        with stream:
            for replay in range(4):
                mine = inputs(replay, p, count)
                d_in.set(mine[rank], stream=stream)
                graph.launch(stream)
                stream.synchronize()
                check(f"graph replay {replay} all_reduce {algorithm} {count}", d_out,
                      np.sum(mine, axis=0, dtype=np.float32))

    # 2. two streams, no synchronization between their calls
    first, second = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    for round_ in range(3):
        a, b = inputs(10 + round_, p, 5000), inputs(20 + round_, p, 70000)
        with first:
            a_in, a_out = cupy.asarray(a[rank]), cupy.zeros(5000, cupy.float32)
        with second:
            b_in, b_out = cupy.asarray(b[rank]), cupy.zeros(70000, cupy.float32)
        first.synchronize()
        second.synchronize()
        with first:
            group.prepare("all_reduce", input=a_in, output=a_out, algorithm="ring")()
        with second:
            n = 70000 // p
            group.prepare("all_gather", input=b_in[:n], output=b_out[:n * p],
                          algorithm="direct")()
        with first:
            group.prepare("all_reduce", input=a_out, output=a_out, algorithm="direct")()
        first.synchronize()
        second.synchronize()
        check(f"two streams round {round_}: all_reduce twice", a_out,
              np.sum(a, axis=0, dtype=np.float32) * p)
        n = 70000 // p
        check(f"two streams round {round_}: all_gather", b_out[:n * p],
              np.concatenate([b[r][:n] for r in range(p)]))

    # 4. symmetric, then registered outputs: rank 0's alone, then every rank's
    count = 3 << 20                             # 12 MiB: messages above the eager limit
    memory = group.executor.peer.memory
    registered = cupy.empty(count * p + 64, cupy.float32)[64:]   # not at its allocation's start
    group.register_buffer(registered)
    if memory.place(registered) == 0 or memory.place(cupy.empty(16, cupy.float32)) != 0:
        failures.append("a registered buffer has no place, or another array has one")
    symmetric_heap = group.symmetric_empty(count * p, "float32")
    for kind, heap, mixed in (("symmetric", symmetric_heap, True),
                              ("symmetric", symmetric_heap, False),
                              ("registered", registered, True),
                              ("registered", registered, False),
                              ("deregistered", registered, False)):
        if kind == "deregistered":
            group.transport.synchronize(30.0)
            group.deregister_buffer(registered)
            if memory.place(registered) != 0:
                failures.append("a deregistered buffer still has a place")
        symmetric = rank == 0 or not mixed
        for collective, algorithm in (("all_reduce", "two_shot"), ("all_reduce", "ring"),
                                      ("all_gather", "direct"), ("all_to_all", "direct")):
            n = count // p if collective != "all_reduce" else count
            size_in = n * p if collective == "all_to_all" else n
            size_out = n * p if collective != "all_reduce" else n
            mine = inputs(50, p, size_in)
            d_in = cupy.asarray(mine[rank])
            d_out = heap[:size_out] if symmetric else cupy.zeros(size_out, cupy.float32)
            d_out.fill(-1)
            in_place = collective == "all_reduce" and algorithm == "ring"
            if in_place:
                d_out[...] = d_in
            group.prepare(collective, input=d_out if in_place else d_in, output=d_out,
                          algorithm=algorithm)()
            if collective == "all_reduce":
                want = np.sum(mine, axis=0, dtype=np.float32)
            elif collective == "all_gather":
                want = np.concatenate(mine)
            else:
                want = np.concatenate([m[rank * n:(rank + 1) * n] for m in mine])
            check(f"{kind} output ({'rank 0 only' if mixed else 'every rank'}) "
                  f"{collective} {algorithm}", d_out, want)

    # 5. symmetric memory and a registered buffer made while the caller's stream is busy
    spin = cupy.RawKernel(r'''extern "C" __global__ void spin(long long cycles) {
        long long start = clock64(); while (clock64() - start < cycles) {} }''', "spin")
    busy = cupy.cuda.Stream(non_blocking=True)
    count = 1 << 20
    for kind in ("symmetric", "registered"):
        group.transport.synchronize(30.0)
        group.bench_host.barrier()
        with busy:
            spin((1,), (1,), (np.int64(300_000_000),))        # ~0.2 s queued before the handles
            try:
                if kind == "symmetric":
                    out = group.symmetric_empty(count * p, "float32")
                else:
                    out = cupy.empty(count * p, cupy.float32)
                    group.register_buffer(out)
            except Exception as exc:      # noqa: BLE001 (the failure is what is checked)
                failures.append(f"{kind} memory made behind a busy stream: "
                                f"{type(exc).__name__}: {exc}")
                continue
            mine = inputs(60, p, count)
            d_in = cupy.asarray(mine[rank])
            out.fill(-1)
            group.prepare("all_gather", input=d_in, output=out, algorithm="direct")()
            busy.synchronize()
        if memory.place(out) == 0:
            failures.append(f"{kind} memory made behind a busy stream has no place")
        check(f"all_gather into {kind} memory made behind a busy stream", out,
              np.concatenate(mine))
        if kind == "registered":
            group.deregister_buffer(out)

    # 3. rank 1 never arrives at one all_reduce
    group.transport.synchronize(30.0)
    group.bench_host.barrier()
    d = cupy.ones(1024, cupy.float32)
    if rank != 1:
        group.prepare("all_reduce", input=d, output=d, algorithm="ring", timeout=2.0)()
        try:
            group.transport.synchronize(30.0)
            group.prepare("all_reduce", input=d, output=d, algorithm="ring")()
            failures.append("rank 1 never came, yet the group went on")
        except CollectiveTimeout as exc:
            tally.runs += 1
            if "rank 1" not in str(exc):
                failures.append(f"the timeout does not name rank 1: {exc}")
        except Exception as exc:      # noqa: BLE001
            failures.append(f"expected CollectiveTimeout, got {type(exc).__name__}: {exc}")
    group.bench_host.barrier()          # rank 0 has given up (its error is in every rank)
    if rank == 1:
        try:    # its kernel finds the abort and stops; the error surfaces at the next sync
            group.prepare("all_reduce", input=d, output=d, algorithm="ring")()
            group.transport.synchronize(30.0)
            failures.append("the group went on after rank 0 gave up")
        except (TransportError, CollectiveTimeout) as exc:
            tally.runs += 1
            if "rank 0" not in str(exc):
                failures.append(f"rank 1's error does not name rank 0: {exc}")
    tally.drained()
    tally.report()
    leave_failed_group()              # the group failed on purpose (3.)


if __name__ == "__main__":
    main()
