"""The whole facade, world-size-agnostic, in real processes: ``import collectives as dist``.

Run under ``mpiexec -n k`` (the mpi backend) or ``python -m collectives.run --standalone
--nproc-per-node k`` (the socket backend): ``init_process_group()`` with no arguments picks
the backend by itself. An optional first argument names the backend that must be picked.
Every function of the facade is called with exact checks (integer-valued data, so SUM and
AVG are exact): every algorithm of ``capabilities()`` for the main collectives (plus
``native`` on mpi), float32/int64 (float16/bfloat16 for all_reduce), SUM/MAX/AVG, uneven
variants, async Work, subgroups (ranks 0 and 2 in a group while rank 1 does p2p with the last
rank), object collectives, p2p with tags and any source, and torch CPU tensors when torch
imports (``FACADE_SUITE_TORCH=0`` skips them).

A wrong value prints ``FAIL <what>: <detail>`` and the script goes on (every rank still makes
the same calls); an exception prints ``FAIL`` with its traceback and exits 1 at once (the
launchers then stop the other ranks). At the end: ``OK rank R checks N`` and exit 0.
"""
import os
import sys
import traceback

import numpy as np

import collectives as dist
from collectives.algorithms import capabilities

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BFLOAT16 = None

torch = None
if os.environ.get("FACADE_SUITE_TORCH", "1") != "0":
    try:
        import torch
    except ImportError:
        torch = None

SUM, MAX, AVG = dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.AVG
checks = 0
failures = 0
rank = size = -1


def fail(what, detail):
    global failures
    failures += 1
    print(f"FAIL {what}: rank {rank}: {detail}", flush=True)


def as_numpy(x):
    if torch is not None and isinstance(x, torch.Tensor):
        return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
    x = np.asarray(x)
    if x.dtype == np.float16 or x.dtype == BFLOAT16:
        return x.astype(np.float64)
    return x


def expect(what, got, want):
    """Exact equality of values and shape."""
    global checks
    checks += 1
    g, w = as_numpy(got), as_numpy(want)
    if g.shape != w.shape or not np.array_equal(g.astype(np.float64), w.astype(np.float64)):
        fail(what, f"got {g.ravel()[:10].tolist()} (shape {g.shape}), "
                   f"want {w.ravel()[:10].tolist()} (shape {w.shape})")


def expect_true(what, condition, detail=""):
    global checks
    checks += 1
    if not condition:
        fail(what, detail or "condition is false")


def vals(r, n, dtype=np.float32, salt=0):
    """Rank ``r``'s data: small integers, exact in every dtype even after a 5-rank SUM."""
    return ((np.arange(n) + salt) % 13 + 3 * r + 1).astype(dtype)


def reference(op, arrays):
    stack = np.stack([a.astype(np.float64) for a in arrays])
    if op == MAX:
        return stack.max(0)
    total = stack.sum(0)
    return total / len(arrays) if op == AVG else total


def algorithms(collective):
    names = list(capabilities()[collective])
    if dist.get_backend() == "mpi":
        names.append("native")
    return names


# -- sections -----------------------------------------------------------------------------


def setup(expected_backend):
    expect_true("is_initialized", dist.is_initialized())
    if expected_backend:
        expect_true("get_backend", dist.get_backend() == expected_backend,
                    f"{dist.get_backend()!r} != {expected_backend!r}")
    env_rank = os.environ.get("RANK", os.environ.get("PMI_RANK"))
    env_size = os.environ.get("WORLD_SIZE", os.environ.get("PMI_SIZE"))
    if env_rank is not None:
        expect_true("get_rank vs environment", str(rank) == env_rank, f"{rank} vs {env_rank}")
    if env_size is not None:
        expect_true("get_world_size vs environment", str(size) == env_size,
                    f"{size} vs {env_size}")
    world = dist.group.WORLD
    expect_true("group.WORLD", world is dist.GroupMember.WORLD and world is not None)
    expect_true("get_rank(WORLD)", dist.get_rank(world) == rank)
    expect_true("get_world_size(WORLD)", dist.get_world_size(world) == size)
    expect_true("get_process_group_ranks(WORLD)",
                dist.get_process_group_ranks(world) == list(range(size)))
    expect_true("get_global_rank(WORLD)", dist.get_global_rank(world, rank) == rank)
    expect_true("get_group_rank(WORLD)", dist.get_group_rank(world, rank) == rank)


def every_algorithm():
    """The main collectives through every algorithm the backend has."""
    p, n = size, 7
    for alg in algorithms("all_reduce"):
        for dtype in (np.float32, np.int64):
            for op in (SUM, MAX, AVG):
                if op == AVG and dtype == np.int64:
                    continue
                if alg == "native" and op == AVG and dtype != np.float32:
                    continue
                a = vals(rank, n, dtype)
                dist.all_reduce(a, op=op, algorithm=alg)
                want = reference(op, [vals(r, n, dtype) for r in range(p)])
                expect(f"all_reduce {alg} {np.dtype(dtype).name} {op.name}", a, want)
        if alg != "native":
            for dtype in [np.float16] + ([BFLOAT16] if BFLOAT16 is not None else []):
                for op in (SUM, MAX):
                    a = vals(rank, 33, dtype)
                    dist.all_reduce(a, op=op, algorithm=alg)
                    want = reference(op, [vals(r, 33, dtype) for r in range(p)])
                    expect(f"all_reduce {alg} {np.dtype(dtype).name} {op.name}", a, want)
    for alg in algorithms("broadcast"):
        root = (len(alg) + 1) % p
        b = vals(rank, n, np.int64)
        dist.broadcast(b, src=root, algorithm=alg)
        expect(f"broadcast {alg} src={root}", b, vals(root, n, np.int64))
    for alg in algorithms("reduce"):
        root = len(alg) % p
        for op in (SUM, MAX):
            x = vals(rank, n, np.float32)
            dist.reduce(x, dst=root, op=op, algorithm=alg)
            want = reference(op, [vals(r, n) for r in range(p)]) if rank == root \
                else vals(rank, n)
            expect(f"reduce {alg} {op.name} dst={root}", x, want)
    for alg in algorithms("all_gather"):
        outs = [np.full(n, -1, np.int64) for _ in range(p)]
        dist.all_gather(outs, vals(rank, n, np.int64), algorithm=alg)
        for j in range(p):
            expect(f"all_gather {alg} [{j}]", outs[j], vals(j, n, np.int64))
        whole = np.full((p, 3), -1.0, np.float32)
        dist.all_gather_into_tensor(whole, vals(rank, 3), algorithm=alg)
        expect(f"all_gather_into_tensor {alg}", whole, np.stack([vals(j, 3) for j in range(p)]))
        uneven = [np.full(j + 1, -1, np.int64) for j in range(p)]
        dist.all_gather(uneven, vals(rank, rank + 1, np.int64), algorithm=alg)
        for j in range(p):
            expect(f"all_gather uneven {alg} [{j}]", uneven[j], vals(j, j + 1, np.int64))
    for alg in algorithms("gather"):
        root = (len(alg) + 2) % p
        slots = [np.full(4, -1.0, np.float32) for _ in range(p)] if rank == root else None
        dist.gather(vals(rank, 4), slots, dst=root, algorithm=alg)
        if rank == root:
            for j in range(p):
                expect(f"gather {alg} dst={root} [{j}]", slots[j], vals(j, 4))
    for alg in algorithms("scatter"):
        root = (len(alg) + 3) % p
        mine = np.full(5, -1, np.int64)
        pieces = [vals(j, 5, np.int64, salt=7) for j in range(p)] if rank == root else None
        dist.scatter(mine, pieces, src=root, algorithm=alg)
        expect(f"scatter {alg} src={root}", mine, vals(rank, 5, np.int64, salt=7))
    for alg in algorithms("reduce_scatter"):
        for op in (SUM, MAX, AVG):
            out = np.full(3, -1.0, np.float32)
            dist.reduce_scatter(out, [vals(rank, 3, salt=j) for j in range(p)], op=op,
                                algorithm=alg)
            want = reference(op, [vals(r, 3, salt=rank) for r in range(p)])
            expect(f"reduce_scatter {alg} {op.name}", out, want)
        out = np.full(rank + 1, -1, np.int64)
        dist.reduce_scatter(out, [vals(rank, j + 1, np.int64, salt=j) for j in range(p)],
                            algorithm=alg)
        want = reference(SUM, [vals(r, rank + 1, np.int64, salt=rank) for r in range(p)])
        expect(f"reduce_scatter uneven {alg}", out, want)
        flat = np.full(2, -1, np.int64)
        dist.reduce_scatter_tensor(flat, vals(rank, 2 * p, np.int64), algorithm=alg)
        total = reference(SUM, [vals(r, 2 * p, np.int64) for r in range(p)])
        expect(f"reduce_scatter_tensor {alg}", flat, total[2 * rank:2 * rank + 2])
    for alg in algorithms("all_to_all"):
        all_to_all_checks(alg)
    for alg in algorithms("barrier"):
        dist.barrier(algorithm=alg)
        expect_true(f"barrier {alg}", True)


def chunk(src, dst, length, dtype=np.int64):
    return np.full(length, 100 * src + dst, dtype)


def all_to_all_checks(alg):
    p = size
    outs = [np.full(1 + (j + rank) % 3, -1, np.int64) for j in range(p)]
    dist.all_to_all(outs, [chunk(rank, j, 1 + (rank + j) % 3) for j in range(p)], algorithm=alg)
    for j in range(p):
        expect(f"all_to_all {alg} [{j}]", outs[j], chunk(j, rank, 1 + (j + rank) % 3))
    single = np.full(2 * p, -1.0, np.float32)
    dist.all_to_all_single(single, np.concatenate([chunk(rank, j, 2, np.float32)
                                                   for j in range(p)]), algorithm=alg)
    expect(f"all_to_all_single {alg}", single,
           np.concatenate([chunk(j, rank, 2, np.float32) for j in range(p)]))
    # split sizes count rows of dim 0; rank r sends (r + j) % 3 rows of 2 to rank j
    sends = [(rank + j) % 3 for j in range(p)]
    recvs = [(j + rank) % 3 for j in range(p)]
    inp = np.concatenate([chunk(rank, j, 2 * sends[j]) for j in range(p)]).reshape(-1, 2)
    out = np.full((sum(recvs), 2), -1, np.int64)
    dist.all_to_all_single(out, inp, recvs, sends, algorithm=alg)
    want = np.concatenate([chunk(j, rank, 2 * recvs[j]) for j in range(p)]).reshape(-1, 2)
    expect(f"all_to_all_single split sizes {alg}", out, want)


def defaults():
    """The plain torch calls, no algorithm keyword, default roots."""
    p = size
    a = vals(rank, 9, np.int64)
    dist.all_reduce(a)
    expect("all_reduce default", a, reference(SUM, [vals(r, 9) for r in range(p)]))
    b = vals(rank, 4)
    dist.broadcast(b, 0)
    expect("broadcast default src", b, vals(0, 4))
    c = vals(rank, 4)
    dist.reduce(c, 0)
    expect("reduce default dst", c, reference(SUM, [vals(r, 4) for r in range(p)])
           if rank == 0 else vals(rank, 4))
    dist.barrier()


def async_ops():
    p = size
    a, b = vals(rank, 6), vals(rank, 6, np.int64)
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.broadcast(b, src=p - 1, async_op=True)
    outs = [np.zeros(6, np.float32) for _ in range(p)]
    w3 = dist.all_gather(outs, vals(rank, 6), async_op=True)
    chained = w1.get_future().then(lambda f: float(f.value()[0].sum()))
    expect_true("Work type", isinstance(w1, dist.Work))
    expect_true("Work.wait", w3.wait() is True and w2.wait() is True)
    w1.wait()
    expect_true("Work.is_completed", w1.is_completed() and w2.is_completed())
    want = reference(SUM, [vals(r, 6) for r in range(p)])
    expect("async all_reduce", a, want)
    expect("async broadcast", b, vals(p - 1, 6, np.int64))
    for j in range(p):
        expect(f"async all_gather [{j}]", outs[j], vals(j, 6))
    expect_true("Future.then", chained.wait() == float(want.sum()),
                f"{chained.wait()} != {want.sum()}")
    expect_true("get_future value", w1.get_future().wait()[0] is a)
    rs = np.zeros(2, np.float32)
    w4 = dist.reduce_scatter_tensor(rs, vals(rank, 2 * p), async_op=True)
    w5 = dist.barrier(async_op=True)
    w4.get_future().wait()
    w5.wait()
    expect("async reduce_scatter_tensor", rs,
           reference(SUM, [vals(r, 2 * p) for r in range(p)])[2 * rank:2 * rank + 2])
    # a synchronous call after an un-waited async one runs after it
    x = vals(rank, 3)
    dist.all_reduce(x, async_op=True)
    y = vals(rank, 3)
    dist.all_reduce(y)
    expect("sync after async", x, y)


def point_to_point():
    p = size
    if p == 1:
        return
    right, left = (rank + 1) % p, (rank - 1) % p
    # blocking ring: even ranks send first, odd ranks receive first
    got = np.full(5, -1, np.int64)
    if rank % 2 == 0:
        dist.send(vals(rank, 5, np.int64), dst=right)
        sender = dist.recv(got, src=left)
    else:
        sender = dist.recv(got, src=left)
        dist.send(vals(rank, 5, np.int64), dst=right)
    expect("send/recv ring", got, vals(left, 5, np.int64))
    expect_true("recv returns the sender", sender == left, f"{sender} != {left}")
    # isend / irecv
    got = np.full(3, -1.0, np.float32)
    rw = dist.irecv(got, src=left, tag=5)
    sw = dist.isend(vals(rank, 3), dst=right, tag=5)
    sw.wait()
    rw.wait()
    expect_true("irecv is_completed", rw.is_completed() and sw.is_completed())
    expect("isend/irecv ring", got, vals(left, 3))
    expect_true("irecv source_rank", rw.source_rank == left, f"{rw.source_rank}")
    # batch_isend_irecv both ways around the ring
    from_left, from_right = np.full(4, -1, np.int64), np.full(4, -1, np.int64)
    ops = [dist.P2POp(dist.irecv, from_left, left, tag=1),
           dist.P2POp(dist.irecv, from_right, right, tag=2),
           dist.P2POp(dist.isend, vals(rank, 4, np.int64), right, tag=1),
           dist.P2POp(dist.isend, vals(rank, 4, np.int64, salt=1), left, tag=2)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    expect("batch_isend_irecv from left", from_left, vals(left, 4, np.int64))
    expect("batch_isend_irecv from right", from_right, vals(right, 4, np.int64, salt=1))
    # any source: rank 0 receives one message from every other rank, in whatever order
    if rank == 0:
        senders = []
        for _ in range(p - 1):
            buf = np.full(2, -1, np.int64)
            source = dist.recv(buf)
            senders.append(source)
            expect(f"any-source recv from {source}", buf, np.full(2, 1000 + source, np.int64))
        expect_true("any-source senders", sorted(senders) == list(range(1, p)), f"{senders}")
    else:
        dist.send(np.full(2, 1000 + rank, np.int64), dst=0)
    # any-source irecv with a tag: Work.source_rank
    buf = np.full(1, -1, np.int64)
    w = dist.irecv(buf, tag=9)
    dist.isend(np.array([rank], np.int64), dst=right, tag=9).wait()
    w.wait()
    expect_true("any-source irecv source_rank", w.source_rank == left and buf[0] == left,
                f"source {w.source_rank}, data {buf[0]}")
    # tags: rank 1 sends tag 1 then tag 2; rank 0 receives tag 2 first
    if rank == 0:
        first, second = np.zeros(3, np.float32), np.zeros(3, np.float32)
        dist.recv(second, src=1, tag=2)
        dist.recv(first, src=1, tag=1)
        expect("tag 2 received first", second, np.full(3, 2.0, np.float32))
        expect("tag 1 received second", first, np.full(3, 1.0, np.float32))
    elif rank == 1:
        w1 = dist.isend(np.full(3, 1.0, np.float32), dst=0, tag=1)
        w2 = dist.isend(np.full(3, 2.0, np.float32), dst=0, tag=2)
        w1.wait()
        w2.wait()
    dist.barrier()


def subgroups():
    p = size
    everyone = dist.new_group()
    a = vals(rank, 5)
    dist.all_reduce(a, group=everyone)
    expect("new_group() all_reduce", a, reference(SUM, [vals(r, 5) for r in range(p)]))
    mine, groups = dist.new_subgroups()
    expect_true("new_subgroups default", len(groups) * dist.get_world_size(mine) == p)
    single, singles = dist.new_subgroups(1)
    expect_true("new_subgroups(1)", len(singles) == p and dist.get_world_size(single) == 1
                and dist.get_process_group_ranks(single) == [rank])
    x = vals(rank, 3)
    dist.all_reduce(x, group=single)
    expect("all_reduce on a group of one", x, vals(rank, 3))
    if p % 2 == 0:
        pair, pairs = dist.new_subgroups(2)
        y = np.array([rank], np.int64)
        dist.all_reduce(y, group=pair)
        expect("new_subgroups(2) all_reduce", y, np.array([2 * (rank // 2) * 2 + 1]))
        expect_true("new_subgroups(2) ranks", dist.get_process_group_ranks(pair)
                    == [rank - rank % 2, rank - rank % 2 + 1])
    if p < 3:
        return
    g = dist.new_group([2, 0])
    last = p - 1
    if rank in (0, 2):
        me = rank // 2
        expect_true("get_rank(subgroup)", dist.get_rank(g) == me)
        expect_true("get_world_size(subgroup)", dist.get_world_size(g) == 2)
        expect_true("get_process_group_ranks(subgroup)",
                    dist.get_process_group_ranks(g) == [0, 2])
        expect_true("get_global_rank(subgroup)", dist.get_global_rank(g, 1) == 2)
        expect_true("get_group_rank(subgroup)", dist.get_group_rank(g, 2) == 1)
        for alg in algorithms("all_reduce"):
            s = vals(rank, 6, np.int64)
            dist.all_reduce(s, group=g, algorithm=alg)
            expect(f"subgroup all_reduce {alg}", s, vals(0, 6) + vals(2, 6))
        b = vals(rank, 4)
        dist.broadcast(b, src=2, group=g)                       # src is a global rank
        expect("subgroup broadcast src=2", b, vals(2, 4))
        c = vals(rank, 4)
        dist.broadcast(c, group=g, group_src=0)
        expect("subgroup broadcast group_src=0", c, vals(0, 4))
        outs = [np.zeros(3, np.float32) for _ in range(2)]
        dist.all_gather(outs, vals(rank, 3), group=g)
        expect("subgroup all_gather [1]", outs[1], vals(2, 3))
        w = dist.all_reduce(vals(rank, 2), group=g, async_op=True)
        w.wait()
        expect_true("subgroup async", w.is_completed())
        objs = [None, None]
        dist.all_gather_object(objs, {"rank": rank}, group=g)
        expect_true("subgroup all_gather_object", objs == [{"rank": 0}, {"rank": 2}], f"{objs}")
        if rank == 2:
            got = np.zeros(2, np.int64)
            source = dist.recv(got, group=g)                    # any source, in the subgroup
            expect_true("subgroup any-source recv", source == 0 and got[0] == 7,
                        f"{source} {got}")
        else:
            dist.send(np.full(2, 7, np.int64), dst=2, group=g)
    else:
        expect_true("non-member get_rank", dist.get_rank(g) == -1)
        expect_true("non-member get_world_size", dist.get_world_size(g) == -1)
        untouched = vals(rank, 3)
        expect_true("non-member all_reduce returns None",
                    dist.all_reduce(untouched, group=g) is None)
        expect("non-member tensor untouched", untouched, vals(rank, 3))
        # meanwhile rank 1 talks to the last rank (when that is not 0 or 2)
        if last > 2 and rank in (1, last):
            peer = last if rank == 1 else 1
            got = np.full(8, -1, np.int64)
            if rank == 1:
                dist.send(vals(1, 8, np.int64), dst=peer, tag=3)
                dist.recv(got, src=peer, tag=4)
            else:
                dist.recv(got, src=peer, tag=3)
                dist.send(vals(last, 8, np.int64), dst=peer, tag=4)
            expect("p2p beside the subgroup", got, vals(peer, 8, np.int64))
    dist.barrier()
    dist.destroy_process_group(g)


def objects():
    p = size
    payload = {"rank": rank, "text": "x" * rank, "list": list(range(rank))}
    got = [None] * p
    dist.all_gather_object(got, payload)
    expect_true("all_gather_object", [o["rank"] for o in got] == list(range(p))
                and got[-1]["text"] == "x" * (p - 1), f"{got}")
    root = p - 1
    blist = [{"from": root}, (1, 2), "three"] if rank == root else [None, None, None]
    dist.broadcast_object_list(blist, src=root)
    expect_true("broadcast_object_list", blist == [{"from": root}, (1, 2), "three"], f"{blist}")
    gathered = [None] * p if rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    if rank == 0:
        expect_true("gather_object", [g["list"] for g in gathered]
                    == [list(range(j)) for j in range(p)], f"{gathered}")
    src = 1 % p
    out = [None]
    dist.scatter_object_list(out, [f"for {j}" * (j + 1) for j in range(p)] if rank == src
                             else None, src=src)
    expect_true("scatter_object_list", out[0] == f"for {rank}" * (rank + 1), f"{out}")


def torch_tensors():
    if torch is None:
        return
    p = size
    base = torch.arange(6, dtype=torch.float32) + rank
    want = sum(torch.arange(6, dtype=torch.float32) + r for r in range(p))
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        t = base.to(dtype).reshape(2, 3).clone()
        dist.all_reduce(t)
        expect(f"torch all_reduce {dtype}", t, want.to(dtype).reshape(2, 3))
    m = base.clone()
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    expect("torch all_reduce MAX", m, torch.arange(6, dtype=torch.float32) + (p - 1))
    b = torch.full((4,), float(rank))
    dist.broadcast(b, src=p - 1)
    expect("torch broadcast", b, torch.full((4,), float(p - 1)))
    whole = torch.zeros(p, 3, dtype=torch.int64)
    dist.all_gather_into_tensor(whole, torch.full((3,), rank, dtype=torch.int64))
    expect("torch all_gather_into_tensor", whole,
           torch.arange(p, dtype=torch.int64).repeat_interleave(3).reshape(p, 3))
    outs = [torch.zeros(2) for _ in range(p)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    expect("torch all_gather", torch.stack(outs), torch.arange(p).float()[:, None].expand(p, 2))
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * p, dtype=torch.float32))
    expect("torch reduce_scatter_tensor", rs, torch.arange(2 * rank, 2 * rank + 2).float() * p)
    sends = [(rank + j) % 2 + 1 for j in range(p)]
    recvs = [(j + rank) % 2 + 1 for j in range(p)]
    inp = torch.cat([torch.full((s,), 100 * rank + j, dtype=torch.int64)
                     for j, s in enumerate(sends)])
    out = torch.full((sum(recvs),), -1, dtype=torch.int64)
    dist.all_to_all_single(out, inp, recvs, sends)
    expect("torch all_to_all_single split sizes", out,
           torch.cat([torch.full((s,), 100 * j + rank, dtype=torch.int64)
                      for j, s in enumerate(recvs)]))
    if p > 1:
        got = torch.zeros(3)
        if rank == 0:
            source = dist.recv(got)
            expect_true("torch any-source recv", source == p - 1 and got[0].item() == p - 1,
                        f"{source} {got}")
        elif rank == p - 1:
            dist.send(torch.full((3,), float(rank)), dst=0)
    dist.barrier()


SECTIONS = [defaults, every_algorithm, async_ops, point_to_point, subgroups, objects,
            torch_tensors]


def main():
    global rank, size
    expected = sys.argv[1] if len(sys.argv) > 1 else None
    dist.init_process_group()
    rank, size = dist.get_rank(), dist.get_world_size()
    try:
        setup(expected)
        for section in SECTIONS:
            section()
    except Exception:
        print(f"FAIL exception: rank {rank}:\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)       # the others may be blocked in a collective: let the launcher stop them
    dist.destroy_process_group()
    expect_true("destroy_process_group", not dist.is_initialized())
    if failures:
        print(f"FAILED rank {rank}: {failures} of {checks} checks", flush=True)
        return 1
    print(f"OK rank {rank} checks {checks}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
