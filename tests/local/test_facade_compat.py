"""Where torch's own distributed tests, run against the facade, found it unlike
torch.distributed: debug levels, the coalesced collectives, subgroups by enumeration, a
barrier's timeout wording, torch's errors for Backend(None), complex reductions, sparse
tensors, non-members and empty object lists. Ranks are threads (the local backend)."""
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="the facade-compat tests use torch tensors (pip install torch)")

import collectives as dist
from collectives.errors import CollectiveTimeout
from local_ranks import spawn


# -- debug levels -----------------------------------------------------------------------------


def test_debug_level_maps_onto_collectives_debug(monkeypatch):
    # set first, so that monkeypatch puts the variables back as they were (set_debug_level
    # writes os.environ itself): a DETAIL left behind would change every later test
    monkeypatch.setenv("COLLECTIVES_DEBUG", "OFF")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "OFF")
    monkeypatch.delenv("COLLECTIVES_DEBUG")
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG")
    assert dist.get_debug_level() == dist.DebugLevel.OFF
    assert [m.name for m in dist.DebugLevel] == ["OFF", "INFO", "DETAIL"]
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    import os
    assert os.environ["COLLECTIVES_DEBUG"] == "DETAIL"
    from collectives import debug
    assert debug.level() == "DETAIL"                      # one source of truth
    monkeypatch.setenv("COLLECTIVES_DEBUG", "info")
    assert dist.get_debug_level() == dist.DebugLevel.INFO
    monkeypatch.delenv("COLLECTIVES_DEBUG")
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    dist.set_debug_level_from_env()
    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    monkeypatch.setenv("COLLECTIVES_DEBUG", "loud")
    with pytest.raises(ValueError, match="OFF, INFO, DETAIL"):
        dist.set_debug_level_from_env()
    with pytest.raises(ValueError):
        dist.set_debug_level(7)


# -- coalesced collectives --------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_all_reduce_coalesced(n):
    def fn(rank):
        a = torch.full((2, 3), float(rank))
        b = torch.arange(4, dtype=torch.float32) * (rank + 1)
        dist.all_reduce_coalesced([a, b])
        work = dist.all_reduce_coalesced(b, op=dist.ReduceOp.MAX, async_op=True)
        work.wait()
        return a.tolist(), b.tolist()
    total = sum(range(n))
    scale = n * (n + 1) // 2
    for a, b in spawn(n, fn):
        assert a == [[float(total)] * 3] * 2
        assert b == [float(i * scale) for i in range(4)]


def test_all_reduce_coalesced_refuses_mixed_dtypes_before_moving_data():
    def fn(rank):
        a, b = torch.ones(2), torch.ones(2, dtype=torch.int64)
        with pytest.raises(TypeError, match="all_reduce_coalesced on rank .*mixes dtypes"):
            dist.all_reduce_coalesced([a, b])
        return a.tolist()
    assert spawn(2, fn) == [[1.0, 1.0]] * 2


@pytest.mark.parametrize("n", [1, 3])
def test_all_gather_coalesced_takes_torchs_layout(n):
    def fn(rank):
        ins = [torch.full((2,), float(rank)), torch.full((1, 3), 10.0 + rank)]
        outs = [[torch.zeros(2), torch.zeros(1, 3)] for _ in range(n)]
        dist.all_gather_coalesced(outs, ins)
        return [[t.tolist() for t in per_rank] for per_rank in outs]
    expected = [[[float(r)] * 2, [[10.0 + r] * 3]] for r in range(n)]
    assert spawn(n, fn) == [expected] * n


def test_all_gather_coalesced_checks_the_output_lists():
    def fn(rank):
        ins = [torch.ones(2)]
        with pytest.raises(ValueError, match="output_tensor_lists must hold 2 lists"):
            dist.all_gather_coalesced([[torch.zeros(2)]], ins)
        with pytest.raises(ValueError, match=r"output_tensor_lists\[1\]\[0\] has 3"):
            dist.all_gather_coalesced([[torch.zeros(2)], [torch.zeros(3)]], ins)
        return True
    assert all(spawn(2, fn))


# -- subgroups --------------------------------------------------------------------------------


def test_new_subgroups_by_enumeration():
    def fn(rank):
        mine, every = dist.new_subgroups_by_enumeration([[0, 2], [1, 3]])
        assert len(every) == 2
        assert dist.get_process_group_ranks(mine) == ([0, 2] if rank % 2 == 0 else [1, 3])
        a = torch.tensor([rank])
        dist.all_reduce(a, group=mine)
        with pytest.raises(ValueError, match="Rank 4 is out of range"):
            dist.new_subgroups_by_enumeration([[0, 1], [4, 2]])
        with pytest.raises(ValueError, match=r"Rank -1 is out of range"):
            dist.new_subgroups_by_enumeration([[-1, -2]])
        with pytest.raises(ValueError, match="Rank 1 has appeared in both subgroup"):
            dist.new_subgroups_by_enumeration([[0], [1, 2], [1, 3]])
        with pytest.raises(ValueError, match="cannot be empty"):
            dist.new_subgroups_by_enumeration([])
        return int(a[0])
    assert spawn(4, fn) == [2, 4, 2, 4]


def test_new_subgroups_splits_the_given_group():
    def fn(rank):
        upper = dist.new_group([2, 3, 4, 5])
        if upper is dist.GroupMember.NON_GROUP_MEMBER:
            with pytest.raises(ValueError, match="not a member of the group to split"):
                dist.new_subgroups(2, group=upper)
            dist.new_group([2, 3])          # keep the group count of every rank the same
            dist.new_group([4, 5])
            return None
        mine, every = dist.new_subgroups(2, group=upper)
        assert len(every) == 2
        return dist.get_process_group_ranks(mine)
    assert spawn(6, fn) == [None, None, [2, 3], [2, 3], [4, 5], [4, 5]]


# -- a barrier's timeout ------------------------------------------------------------------------


def test_barrier_timeout_says_timed_out_and_keeps_where_it_waited():
    def fn(rank):
        if rank == 0:
            with pytest.raises(CollectiveTimeout) as caught:
                dist.barrier(timeout=0.2)
            return str(caught.value)
        return None
    message = spawn(2, fn)[0]
    assert " Timed out after 0." in message
    import re
    assert re.search(" (Timed out|closed|timeout) ", message), message    # torch's tests
    assert "step 1 of" in message and "rank 1" in message, message


# -- torch's errors -----------------------------------------------------------------------------


def test_backend_none_is_a_value_error():
    with pytest.raises(ValueError, match="string-ish"):
        dist.Backend(None)
    with pytest.raises(ValueError, match="string-ish"):
        dist.Backend(3)


@pytest.mark.parametrize("op", ["MAX", "MIN", "BAND", "BOR", "BXOR"])
def test_complex_all_reduce_refuses_torchs_ops(op):
    def fn(rank):
        t = torch.ones(3, dtype=torch.complex64)
        with pytest.raises(ValueError, match=f"all_reduce does not support ReduceOp.{op} on "
                                             f"complex tensors"):
            dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        with pytest.raises(ValueError, match="all_reduce does not support"):
            dist.all_reduce_coalesced([t], op=getattr(dist.ReduceOp, op))
        dist.all_reduce(t)                                   # SUM still works
        return t.tolist()
    assert spawn(2, fn) == [[complex(2, 0)] * 3] * 2


def test_complex_product_is_computed_where_torch_refuses_it():
    # torch reduces complex as pairs of reals, which would make PRODUCT wrong, so it refuses
    # it; ours multiplies complex numbers, so the facade computes it
    def fn(rank):
        t = torch.full((3,), complex(rank + 1, 1), dtype=torch.complex128)
        dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
        return t.tolist()
    assert spawn(2, fn) == [[complex(1, 1) * complex(2, 1)] * 3] * 2


def test_sparse_all_reduce_sums_as_gloo_does():
    def fn(rank):
        # rank r holds ones at rows 0..r of a (3, 2) tensor with one dense dimension
        t = torch.sparse_coo_tensor(torch.arange(rank + 1).reshape(1, -1),
                                    torch.ones(rank + 1, 2), (3, 2))
        dist.all_reduce(t)
        with pytest.raises(ValueError, match="sparse tensors reduce with ReduceOp.SUM only"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        csr = torch.eye(2).to_sparse_csr()
        with pytest.raises(TypeError, match="broadcast on rank .*layout torch.sparse_csr"):
            dist.broadcast(csr, src=0)
        # two sparse dimensions: rank r holds r + 1 at (r, 2 - r) and 1 at (0, 0)
        m = torch.sparse_coo_tensor([[rank, 0], [2 - rank, 0]], [rank + 1.0, 1.0], (3, 3))
        dist.all_reduce(m)
        return t.layout == torch.sparse_coo, t.to_dense().tolist(), m.to_dense().tolist()
    summed = [[3.0, 0.0, 1.0], [0.0, 2.0, 0.0], [3.0, 0.0, 0.0]]
    assert spawn(3, fn) == [(True, [[3.0, 3.0], [2.0, 2.0], [1.0, 1.0]], summed)] * 3


def test_get_backend_of_a_non_member_and_empty_scatter_object_list():
    def fn(rank):
        other = dist.new_group([1])
        if rank == 0:
            with pytest.raises(ValueError, match="Invalid process group specified"):
                dist.get_backend(other)
        with pytest.raises(ValueError, match="Expected argument scatter_object_output_list to "
                                             "be a list of size at least 1"):
            dist.scatter_object_list([], [1, 2], src=0)
        return True
    assert all(spawn(2, fn))


def test_all_reduce_coalesced_mixes_complex_and_its_element_type():
    def fn(rank):
        a = torch.full((2,), float(rank + 1))
        z = torch.full((2,), complex(rank, 1), dtype=torch.complex64)
        dist.all_reduce_coalesced([a, z])
        return a.tolist(), z.tolist()
    assert spawn(3, fn) == [([6.0, 6.0], [complex(3, 3)] * 2)] * 3


def test_all_gather_coalesced_of_complex_tensors():
    def fn(rank):
        ins = [torch.full((2,), complex(rank, -rank), dtype=torch.complex128),
               torch.full((1,), float(rank), dtype=torch.float64)]
        outs = [[torch.zeros(2, dtype=torch.complex128), torch.zeros(1, dtype=torch.float64)]
                for _ in range(2)]
        dist.all_gather_coalesced(outs, ins)
        return [[t.tolist() for t in per_rank] for per_rank in outs]
    expected = [[[complex(r, -r)] * 2, [float(r)]] for r in range(2)]
    assert spawn(2, fn) == [expected] * 2
