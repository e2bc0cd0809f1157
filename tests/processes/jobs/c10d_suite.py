"""Every collective through ``torch.distributed`` on the "collectives" backend, world-size
agnostic (2 ranks or more), with exact expected values (integer-valued data).

Run under any launcher that sets torch's environment: ``python -m collectives.run
--standalone --nproc-per-node k c10d_suite.py``, torchrun, or RANK/WORLD_SIZE/MASTER_ADDR/
MASTER_PORT set by hand. Covers the torch functions (sync and async: ``Work.wait``,
``is_completed``, ``get_future``), their pre-2.13 names, subgroups, object collectives,
point-to-point (tags, any source, batch_isend_irecv, a receive whose wait times out and
later completes), functional collectives and a DTensor Shard -> Replicate redistribute, and
bad input: each must raise on every rank before any data moves, naming operation and rank,
and leave the group usable.

A wrong value prints ``FAIL <what>: <detail>`` and the script goes on (every rank still makes
the same calls); an exception prints ``FAIL`` with its traceback and exits 1 at once. At the
end: ``OK rank R checks N`` and exit 0. ``check_all()`` runs the checks in a job of its own
(c10d_training.py ``--suite``: one start of torch per rank instead of two).
"""
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import collectives.c10d
from collectives.errors import CollectiveTimeout

checks = 0
failures = 0


def expect(what, got, want):
    global checks, failures
    checks += 1
    if isinstance(want, torch.Tensor):
        ok = isinstance(got, torch.Tensor) and got.dtype == want.dtype and torch.equal(got, want)
    else:
        ok = got == want
    if not ok:
        failures += 1
        print(f"FAIL {what}: got {got!r}, want {want!r}", flush=True)


def raises(what, kind, pattern, fn):
    """``fn`` must raise ``kind`` with ``pattern`` in its message (and name this rank)."""
    global checks, failures
    checks += 1
    try:
        fn()
    except kind as exc:
        text = str(exc)
        if pattern not in text or f"rank {dist.get_rank()}" not in text:
            failures += 1
            print(f"FAIL {what}: message {text!r} lacks {pattern!r} or the rank", flush=True)
        return
    except Exception as exc:      # noqa: BLE001
        failures += 1
        print(f"FAIL {what}: raised {type(exc).__name__}: {exc}", flush=True)
        return
    failures += 1
    print(f"FAIL {what}: no error", flush=True)


def check_all():
    """Every check, on the default group (initialized on the "collectives" backend). Returns
    the number of failed checks."""
    rank, size = dist.get_rank(), dist.get_world_size()
    assert size >= 2, "run on 2 ranks or more"
    expect("backend", dist.get_backend(), "collectives")
    expect("group class", type(dist.group.WORLD).__name__, "ProcessGroupCollectives")
    ranks = torch.arange(size)

    # all_reduce: every op, sync and async
    for dtype in (torch.float32, torch.int64):
        base = torch.arange(6, dtype=dtype) + rank
        every = torch.stack([torch.arange(6, dtype=dtype) + r for r in range(size)])
        for op, want in ((dist.ReduceOp.SUM, every.sum(0)), (dist.ReduceOp.MAX, every.max(0).values),
                         (dist.ReduceOp.MIN, every.min(0).values),
                         (dist.ReduceOp.PRODUCT, every.prod(0))):
            t = base.clone()
            dist.all_reduce(t, op=op)
            expect(f"all_reduce {dtype} {op}", t, want.to(dtype))
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    expect("all_reduce AVG", t, torch.full((4,), (size + 1) / 2))
    t = torch.ones(5, 2) * (rank + 1)
    work = dist.all_reduce(t, async_op=True)
    expect("async Work.wait", work.wait(), True)
    expect("async is_completed", work.is_completed(), True)
    expect("async is_success", work.is_success(), True)
    expect("async future value", work.get_future().value()[0] is t, True)
    expect("async all_reduce", t, torch.full((5, 2), float(size * (size + 1) // 2)))
    t = torch.ones(3)
    future = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] * 2)
    expect("future then", future.wait(), torch.full((3,), 2.0 * size))
    works = [dist.all_reduce(torch.ones(2) * i, async_op=True) for i in range(4)]
    for i, w in enumerate(works):
        w.wait()
        expect(f"queued async {i}", w.result()[0], torch.full((2,), float(i * size)))
    bf = torch.full((8,), float(rank), dtype=torch.bfloat16)
    dist.all_reduce(bf)
    expect("all_reduce bfloat16", bf, torch.full((8,), float(ranks.sum()), dtype=torch.bfloat16))
    ts = [torch.ones(3) * (rank + 1), torch.ones(2) * rank]
    dist.all_reduce_coalesced(ts)
    expect("all_reduce_coalesced", torch.cat(ts), torch.cat([torch.full((3,), float(size * (size + 1) // 2)),
                                                             torch.full((2,), float(ranks.sum()))]))
    ts = [torch.ones(3) * (rank + 1), torch.arange(2) + rank]      # torch's function takes one dtype
    dist.group.WORLD.allreduce_coalesced(ts).wait()
    expect("allreduce_coalesced float", ts[0], torch.full((3,), float(size * (size + 1) // 2)))
    expect("allreduce_coalesced int", ts[1], torch.arange(2) * size + int(ranks.sum()))
    ts = [torch.ones(3) * (rank + 1), torch.ones(2) * rank]
    with dist._coalescing_manager(async_ops=True) as cm:
        for x in ts:
            dist.all_reduce(x)
    cm.wait()
    expect("coalescing manager", torch.cat(ts), torch.cat([torch.full((3,), float(size * (size + 1) // 2)),
                                                           torch.full((2,), float(ranks.sum()))]))

    # broadcast and reduce, every root
    for root in range(size):
        t = torch.arange(4) * 10 + rank
        dist.broadcast(t, src=root)
        expect(f"broadcast from {root}", t, torch.arange(4) * 10 + root)
        t = torch.arange(4) + rank
        before = t.clone()
        dist.reduce(t, dst=root)
        expect(f"reduce to {root}", t, torch.arange(4) * size + int(ranks.sum()) if rank == root else before)

    # all_gather (even and uneven), all_gather_into_tensor (and its coalesced form)
    out = [torch.empty(3, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(out, torch.full((3,), rank))
    expect("all_gather", torch.stack(out), ranks.repeat_interleave(3).reshape(size, 3))
    out = [torch.empty(r + 1) for r in range(size)]
    dist.all_gather(out, torch.full((rank + 1,), float(rank)))
    expect("all_gather uneven", torch.cat(out), torch.cat([torch.full((r + 1,), float(r)) for r in range(size)]))
    big = torch.empty(size * 2, 3)
    dist.all_gather_into_tensor(big, torch.full((2, 3), float(rank)))
    expect("all_gather_into_tensor", big, ranks.float().repeat_interleave(6).reshape(size * 2, 3))
    pg = dist.group.WORLD
    a, b = torch.empty(size * 2), torch.empty(size)
    pg.allgather_into_tensor_coalesced([a, b], [torch.full((2,), float(rank)), torch.full((1,), float(-rank))]).wait()
    expect("allgather_into_tensor_coalesced", torch.cat([a, b]),
           torch.cat([ranks.float().repeat_interleave(2), -ranks.float()]))
    big = torch.empty(size * 2)
    pg._allgather_base(big, torch.full((2,), float(rank))).wait()
    expect("_allgather_base", big, ranks.float().repeat_interleave(2))

    # gather and scatter, every root
    for root in range(size):
        lst = [torch.empty(2) for _ in range(size)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), lst, dst=root)
        if rank == root:
            expect(f"gather to {root}", torch.stack(lst), ranks.float().repeat_interleave(2).reshape(size, 2))
        t = torch.empty(3, dtype=torch.int64)
        dist.scatter(t, [torch.full((3,), 100 * root + r) for r in range(size)] if rank == root else None,
                     src=root)
        expect(f"scatter from {root}", t, torch.full((3,), 100 * root + rank))

    # reduce_scatter (list, uneven) and reduce_scatter_tensor
    out = torch.empty(rank + 1)
    dist.reduce_scatter(out, [torch.full((r + 1,), float(rank + r)) for r in range(size)])
    expect("reduce_scatter uneven", out, torch.full((rank + 1,), float(ranks.sum() + size * rank)))
    out = torch.empty(2, dtype=torch.int64)
    dist.reduce_scatter_tensor(out, torch.arange(2 * size) + rank, op=dist.ReduceOp.MAX)
    expect("reduce_scatter_tensor MAX", out, torch.arange(2) + 2 * rank + size - 1)
    out = torch.empty(2)
    pg._reduce_scatter_base(out, torch.ones(2 * size)).wait()
    expect("_reduce_scatter_base", out, torch.full((2,), float(size)))
    a, b = torch.empty(1), torch.empty(2)
    pg.reduce_scatter_tensor_coalesced([a, b], [torch.ones(size), torch.ones(2 * size) * 2],
                                       dist.ReduceScatterOptions()).wait()
    expect("reduce_scatter_tensor_coalesced", torch.cat([a, b]), torch.tensor([1.0, 2, 2]) * size)

    # all_to_all: lists (even, uneven), single (even, split sizes)
    outs = [torch.empty(2, dtype=torch.int64) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), 10 * rank + r) for r in range(size)])
    expect("all_to_all", torch.stack(outs), (ranks * 10 + rank).repeat_interleave(2).reshape(size, 2))
    outs = [torch.empty(r + rank + 1) for r in range(size)]
    dist.all_to_all(outs, [torch.full((rank + r + 1,), float(10 * rank + r)) for r in range(size)])
    expect("all_to_all uneven", torch.cat(outs),
           torch.cat([torch.full((r + rank + 1,), float(10 * r + rank)) for r in range(size)]))
    out = torch.empty(size * 2, dtype=torch.int64)
    dist.all_to_all_single(out, (torch.arange(size) * 1 + 10 * rank).repeat_interleave(2))
    expect("all_to_all_single", out, (ranks * 10 + rank).repeat_interleave(2))
    sends = [r + 1 for r in range(size)]                      # rows to rank r
    recvs = [rank + 1] * size
    inp = torch.cat([torch.full((s, 2), float(100 * rank + r)) for r, s in enumerate(sends)])
    out = torch.empty(sum(recvs), 2)
    dist.all_to_all_single(out, inp, recvs, sends)
    expect("all_to_all_single splits", out,
           torch.cat([torch.full((rank + 1, 2), float(100 * r + rank)) for r in range(size)]))
    out = torch.empty(size * 2)
    pg.alltoall_base(out, torch.ones(size * 2), [], [], dist.AllToAllOptions()).wait()
    expect("alltoall_base", out, torch.ones(size * 2))

    dist.barrier()
    expect("barrier async", dist.barrier(async_op=True).wait(), True)

    # sparse COO (as gloo: a SUM of every rank's nonzeros): rank r holds ones at rows 0..r
    def ones_to(r):
        return torch.sparse_coo_tensor(torch.arange(r + 1).reshape(1, -1), torch.ones(r + 1, 2),
                                       (size, 2))
    summed = torch.tensor([[float(size - i)] * 2 for i in range(size)])
    t = ones_to(rank)
    dist.all_reduce(t)
    expect("sparse all_reduce stays sparse", t.is_sparse, True)
    expect("sparse all_reduce", t.to_dense(), summed)
    t = ones_to(rank)
    dist.all_reduce(t, async_op=True).wait()
    expect("sparse all_reduce async", t.to_dense(), summed)

    # objects, subgroups
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank})
    expect("all_gather_object", objs, [{"rank": r} for r in range(size)])
    lst = [rank, "x"]
    dist.broadcast_object_list(lst, src=size - 1)
    expect("broadcast_object_list", lst, [size - 1, "x"])
    evens = list(range(0, size, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        t = torch.ones(2) * rank
        dist.all_reduce(t, group=sub)
        expect("subgroup all_reduce", t, torch.full((2,), float(sum(evens))))
        out = [torch.empty(1) for _ in evens]
        dist.all_gather(out, torch.full((1,), float(rank)), group=sub)
        expect("subgroup all_gather", torch.cat(out), torch.tensor(evens, dtype=torch.float32))
        dist.broadcast(t, src=evens[-1], group=sub)
        expect("subgroup broadcast from a global rank", t, torch.full((2,), float(sum(evens))))

    # point-to-point around the ring, tags, any source, batch
    right, left = (rank + 1) % size, (rank - 1) % size
    got = torch.empty(3)
    if rank % 2 == 0:
        dist.send(torch.full((3,), float(rank)), right, tag=5)
        dist.recv(got, left, tag=5)
    else:
        dist.recv(got, left, tag=5)
        dist.send(torch.full((3,), float(rank)), right, tag=5)
    expect("send/recv ring", got, torch.full((3,), float(left)))
    a, b = torch.empty(2), torch.empty(2)
    ra, rb = dist.irecv(a, left, tag=1), dist.irecv(b, left, tag=2)
    sb, sa = dist.isend(torch.full((2,), 2.0 * rank), right, tag=2), dist.isend(torch.full((2,), 1.0 * rank), right, tag=1)
    for w in (ra, rb, sa, sb):
        w.wait()
    expect("isend/irecv by tag", torch.cat([a, b]), torch.cat([torch.full((2,), 1.0 * left), torch.full((2,), 2.0 * left)]))
    if rank == 0:
        seen = set()
        for _ in range(size - 1):
            t = torch.empty(1)
            src = dist.recv(t, tag=9)
            expect("recv any source value", int(t.item()), src)
            seen.add(src)
        expect("recv any source senders", seen, set(range(1, size)))
    else:
        dist.send(torch.tensor([float(rank)]), 0, tag=9)
    a = torch.empty(2)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), float(rank)), right),
                                    dist.P2POp(dist.irecv, a, left)])
    for w in works:
        w.wait()
    expect("batch_isend_irecv", a, torch.full((2,), float(left)))
    if rank == 1:                 # a wait that times out leaves the receive pending
        t = torch.empty(1)
        w = dist.irecv(t, 0, tag=11)
        try:
            w.wait(timeout=timedelta(seconds=0.2))
            expect("irecv wait timeout", "no timeout", "CollectiveTimeout")
        except CollectiveTimeout:
            expect("irecv wait timeout", True, True)
        dist.barrier()
        w.wait()
        expect("irecv after timeout", t, torch.tensor([7.0]))
    else:
        dist.barrier()
        if rank == 0:
            dist.send(torch.tensor([7.0]), 1, tag=11)
    t = torch.empty(2)
    if rank == 0:
        w = dist.isend(torch.tensor([3.0, 4.0]), 1)
        expect("p2p get_future", w.get_future().wait()[0], torch.tensor([3.0, 4.0]))
    elif rank == 1:
        w = dist.irecv(t, 0)
        w.get_future().wait()
        expect("p2p irecv get_future", t, torch.tensor([3.0, 4.0]))

    # functional collectives and DTensor (device mesh over this group)
    x = funcol.all_reduce(torch.ones(3) * rank, "sum", dist.group.WORLD)
    expect("funcol all_reduce", funcol.wait_tensor(x), torch.full((3,), float(ranks.sum())))
    x = funcol.all_gather_tensor(torch.full((2,), float(rank)), 0, dist.group.WORLD)
    expect("funcol all_gather_tensor", funcol.wait_tensor(x), ranks.float().repeat_interleave(2))
    x = funcol.reduce_scatter_tensor(torch.arange(2.0 * size), "sum", 0, dist.group.WORLD)
    expect("funcol reduce_scatter_tensor", funcol.wait_tensor(x), (torch.arange(2.0) + 2 * rank) * size)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (size,))
    full = torch.arange(4.0 * size * 3).reshape(4 * size, 3)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    expect("DTensor shard", sharded.to_local(), full[4 * rank:4 * rank + 4])
    expect("DTensor Shard->Replicate", sharded.redistribute(mesh, [Replicate()]).to_local(), full)
    expect("DTensor Shard(1)->Shard(0)",
           distribute_tensor(full, mesh, [Shard(1)]).redistribute(mesh, [Shard(0)]).to_local(),
           full[4 * rank:4 * rank + 4])
    expect("DTensor sum", (sharded * 2).sum().full_tensor(), full.sum() * 2)

    # bad input: the same error on every rank, before any data moves; the group goes on
    raises("non-contiguous", ValueError, "not contiguous",
           lambda: dist.all_reduce(torch.zeros(4, 4).t()))
    raises("all_gather list length", ValueError, "all_gather",
           lambda: dist.all_gather([torch.empty(2)] * (size + 1), torch.ones(2)))
    raises("all_gather dtype", TypeError, "all_gather",
           lambda: pg.allgather([[torch.empty(2, dtype=torch.int64)] * size], [torch.ones(2)]).wait())
    raises("all_gather_into_tensor size", ValueError, "all_gather",
           lambda: dist.all_gather_into_tensor(torch.empty(size * 2 + 1), torch.ones(2)))
    raises("reduce_scatter_tensor size", ValueError, "reduce_scatter",
           lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.ones(2 * size)))
    raises("all_to_all_single splits", ValueError, "all_to_all_single",
           lambda: dist.all_to_all_single(torch.empty(size), torch.ones(size), [1] * size, [2] * size))
    raises("all_to_all_single sizes that disagree", ValueError, "expects",
           lambda: dist.all_to_all_single(torch.empty(size + 1), torch.ones(size), [2] + [1] * (size - 1),
                                          [1] * size))
    raises("premul_sum", ValueError, "PREMUL_SUM",
           lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0)))
    raises("BAND on floats", TypeError, "all_reduce",
           lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND))
    raises("meta tensor", TypeError, "meta", lambda: dist.all_reduce(torch.ones(2, device="meta")))
    raises("two tensors", ValueError, "exactly one", lambda: pg.allreduce([torch.ones(1), torch.ones(1)]))
    t = torch.ones(2)
    dist.all_reduce(t)
    expect("usable after errors", t, torch.full((2,), float(size)))

    print(f"OK rank {rank} checks {checks}", flush=True)
    return failures


def main():
    dist.init_process_group("collectives")
    failed = check_all()
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:
        print("FAIL exception:\n" + traceback.format_exc(), flush=True)
        sys.exit(1)
