"""The facade with torch CPU tensors, and the torch.distributed tutorial programs with only
the import changed (``import collectives as dist``), on the local backend."""
import pytest

torch = pytest.importorskip("torch")

import collectives as dist  # noqa: E402  (the one changed line of the tutorial programs)
from local_ranks import spawn


# -- tensors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int64, torch.int8, torch.uint8, torch.bool,
                                   torch.complex64])
def test_all_reduce_every_torch_dtype_in_place(dtype):
    def make(rank):
        return (torch.arange(12).reshape(3, 4) % 3 + rank).to(dtype)

    def fn(rank):
        t = make(rank)
        before = t.data_ptr()
        dist.all_reduce(t, op=torch.distributed.ReduceOp.MAX if dtype != torch.complex64 else
                        dist.ReduceOp.SUM)
        assert t.data_ptr() == before and t.shape == (3, 4)
        return t
    out = spawn(3, fn)
    if dtype == torch.complex64:
        want = make(0) + make(1) + make(2)
    else:
        want = torch.maximum(torch.maximum(make(0), make(1)), make(2))
    for t in out:
        assert t.dtype == dtype and torch.equal(t, want)


def test_requires_grad_and_bfloat16_average():
    def fn(rank):
        w = torch.full((2, 2), float(rank + 1), requires_grad=True)
        dist.all_reduce(w, op=dist.ReduceOp.AVG)
        b = torch.full((5,), float(rank), dtype=torch.bfloat16)
        dist.all_reduce(b)
        return w.detach(), b
    for w, b in spawn(4, fn):
        assert torch.equal(w, torch.full((2, 2), 2.5))
        assert torch.equal(b, torch.full((5,), 6.0, dtype=torch.bfloat16))


def test_non_contiguous_tensor_is_a_clear_value_error():
    def fn(rank):
        t = torch.arange(6.0).reshape(2, 3).t()
        with pytest.raises(ValueError, match="not contiguous"):
            dist.all_reduce(t)
        with pytest.raises(TypeError, match="tensor"):
            dist.all_reduce([1, 2])
        return True
    assert all(spawn(2, fn))


def test_torch_lists_splits_and_async():
    def fn(rank):
        n = dist.get_world_size()
        outs = [torch.zeros(2, 2, dtype=torch.int32) for _ in range(n)]
        work = dist.all_gather(outs, torch.full((2, 2), rank, dtype=torch.int32), async_op=True)
        # rank r sends r+1 rows to everyone; rows of 3 elements
        inp = torch.full((n * (rank + 1), 3), float(rank))
        out = torch.zeros(sum(j + 1 for j in range(n)), 3)
        dist.all_to_all_single(out, inp, [j + 1 for j in range(n)], [rank + 1] * n)
        work.wait()
        red = torch.full((3,), float(rank + 1))
        dist.reduce(red, dst=0, op=dist.ReduceOp.PRODUCT)
        rs = torch.zeros(2)
        dist.reduce_scatter_tensor(rs, torch.arange(2.0 * n))
        return outs, out, red, rs
    n = 3
    for rank, (outs, out, red, rs) in enumerate(spawn(n, fn)):
        assert all(torch.equal(o, torch.full((2, 2), j, dtype=torch.int32)) for j, o in enumerate(outs))
        want = torch.cat([torch.full((j + 1, 3), float(j)) for j in range(n)])
        assert torch.equal(out, want)
        assert torch.equal(red, torch.full((3,), 6.0) if rank == 0 else torch.full((3,), rank + 1.0))
        assert torch.equal(rs, n * torch.arange(2.0 * rank, 2.0 * rank + 2))


def test_objects_holding_tensors():
    def fn(rank):
        objs = [None, None]
        dist.all_gather_object(objs, {"t": torch.tensor([rank])})
        return [o["t"].item() for o in objs]
    assert spawn(2, fn) == [[0, 1], [0, 1]]


# -- the tutorial programs, written as the torch.distributed tutorial writes them ------------


def p2p_blocking(rank, size):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    else:
        dist.recv(tensor=tensor, src=0)
    return tensor[0].item()


def p2p_nonblocking(rank, size):
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        req = dist.isend(tensor=tensor, dst=1)
    else:
        req = dist.irecv(tensor=tensor, src=0)
    req.wait()
    return tensor[0].item()


def all_reduce_in_group(rank, size):
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor[0].item()


def every_collective(rank, size):
    group = dist.new_group(list(range(size)))
    seen = {}
    tensor = torch.tensor([float(rank)])
    dist.broadcast(tensor, src=0, group=group)
    seen["broadcast"] = tensor.tolist()
    tensor = torch.tensor([float(rank)])
    dist.reduce(tensor, dst=0, op=dist.ReduceOp.SUM, group=group)
    seen["reduce"] = tensor.tolist()
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    seen["all_reduce"] = tensor.tolist()
    tensor = torch.empty(1)
    scatter_list = [torch.tensor([i * 10.0]) for i in range(size)] if rank == 0 else None
    dist.scatter(tensor, scatter_list, src=0, group=group)
    seen["scatter"] = tensor.tolist()
    tensor = torch.tensor([float(rank)])
    gather_list = [torch.empty(1) for _ in range(size)] if rank == 0 else None
    dist.gather(tensor, gather_list, dst=0, group=group)
    seen["gather"] = [t.item() for t in gather_list] if rank == 0 else None
    tensor_list = [torch.empty(1) for _ in range(size)]
    dist.all_gather(tensor_list, torch.tensor([float(rank)]), group=group)
    seen["all_gather"] = [t.item() for t in tensor_list]
    output = torch.empty(1)
    dist.reduce_scatter(output, [torch.tensor([float(i)]) for i in range(size)],
                        op=dist.ReduceOp.SUM, group=group)
    seen["reduce_scatter"] = output.tolist()
    inputs = list(torch.tensor([rank * 100.0 + i for i in range(size)]).chunk(size))
    outputs = list(torch.empty(size).chunk(size))
    dist.all_to_all(outputs, inputs, group=group)
    seen["all_to_all"] = [t.item() for t in outputs]
    dist.barrier(group)
    return seen


def test_tutorial_point_to_point():
    assert spawn(2, p2p_blocking, 2) == [1.0, 1.0]
    assert spawn(2, p2p_nonblocking, 2) == [1.0, 1.0]


def test_tutorial_all_reduce_in_new_group():
    assert spawn(2, all_reduce_in_group, 2) == [2.0, 2.0]


@pytest.mark.parametrize("size", [2, 4])
def test_tutorial_collectives(size):
    for rank, seen in enumerate(spawn(size, every_collective, size)):
        assert seen["broadcast"] == [0.0]
        assert seen["reduce"] == ([sum(range(size)) * 1.0] if rank == 0 else [float(rank)])
        assert seen["all_reduce"] == [float(size)]
        assert seen["scatter"] == [rank * 10.0]
        assert seen["gather"] == (list(map(float, range(size))) if rank == 0 else None)
        assert seen["all_gather"] == list(map(float, range(size)))
        assert seen["reduce_scatter"] == [float(rank * size)]
        assert seen["all_to_all"] == [j * 100.0 + rank for j in range(size)]
