"""Groups used wrongly say what happened: a group of a destroyed process group, and groups
made in a different order (or with different ranks) on different ranks, or not on every
rank."""
import threading

import numpy as np
import pytest

import collectives as dist
from collectives.errors import CollectiveError, CollectiveTimeout
from collectives.transports.local import LocalWorld
from local_ranks import TIMEOUT, spawn


def test_a_group_of_a_destroyed_process_group_is_refused_before_any_byte_moves():
    again = LocalWorld(2)

    def fn(rank):
        sub = dist.new_group([0, 1])
        world = dist.group.WORLD
        dist.destroy_process_group()
        dist.init_process_group("local", rank=rank, world_size=2, store=again, timeout=TIMEOUT)
        x = np.ones(4, np.float32)
        with pytest.raises(ValueError, match="belongs to a process group that was destroyed"
                                             ".*new_group after init_process_group"):
            dist.all_reduce(x, group=sub)
        with pytest.raises(ValueError, match="default group of a process group that was "
                                             "destroyed.*group=None"):
            dist.broadcast(x, src=0, group=world)
        with pytest.raises(ValueError, match="destroyed"):
            dist.get_rank(sub)
        dist.all_reduce(x)                   # the new default group works
        fresh = dist.new_group([0, 1])
        dist.all_reduce(x, group=fresh)
        return x.tolist()
    assert spawn(2, fn) == [[4.0] * 4] * 2


def test_a_subgroup_destroyed_alone_is_refused():
    def fn(rank):
        sub = dist.new_group([0, 1])
        dist.destroy_process_group(sub)
        with pytest.raises(ValueError, match=r"this group was destroyed \(destroy_process_group"
                                             r"\(group\)\); create it again with new_group"):
            dist.all_reduce(np.ones(2), group=sub)
        dist.barrier()
    spawn(2, fn)


def _made_in_another_order(rank):
    """Rank 0 makes [0, 1] then [0, 1, 2]; ranks 1 and 2 the other way round."""
    first, second = ([0, 1], [0, 1, 2]) if rank == 0 else ([0, 1, 2], [0, 1])
    dist.new_group(first)
    dist.new_group(second)


def _made_with_other_ranks(rank):
    dist.new_group([0, 1] if rank == 0 else [0, 1, 2])


@pytest.mark.parametrize("program", [_made_in_another_order, _made_with_other_ranks],
                         ids=["order", "ranks"])
def test_groups_made_differently_on_different_ranks_say_so_on_every_rank(program):
    """Every rank fails at once, naming the groups each rank makes, never blaming the
    decision tables (or timing out)."""
    def fn(rank):
        with pytest.raises(CollectiveError) as info:
            program(rank)
        return str(info.value)
    said = spawn(3, fn)
    for rank, message in enumerate(said):
        assert message.startswith(f"new_group on rank {rank}: the ranks make different "
                                  f"groups at this call (the job's new_group number 1): "
                                  f"ranks [0] make group 1 of ranks [0, 1]; ranks [1, 2] make "
                                  f"group 1 of ranks [0, 1, 2]. Every rank of the job must "
                                  f"call new_group"), message
        assert "decision table" not in message and "COLLECTIVES_TUNING" not in message


def test_groups_made_alike_still_work():
    def fn(rank):
        sub = dist.new_group([1, 2])
        pair = dist.new_group([0, 1])
        x = np.full(3, rank + 1.0)
        if sub is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(x, group=sub)
        if pair is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.all_reduce(x, group=pair)
        return x.tolist()
    assert spawn(3, fn) == [[6.0] * 3, [6.0] * 3, [5.0] * 3]


def test_a_rank_that_skips_new_group_makes_the_others_say_so_at_their_timeout():
    """Only the members call new_group: they wait for the third rank, then say what it is
    they waited for, not just that an all_gather timed out."""
    from datetime import timedelta
    done = [threading.Event(), threading.Event()]

    def fn(rank):
        if rank == 2:
            for event in done:               # alive, but never calls new_group
                event.wait(30)
            return None
        try:
            with pytest.raises(CollectiveTimeout) as info:
                dist.new_group([0, 1])
        finally:
            done[rank].set()
        return str(info.value)
    said = dist.spawn_local(3, fn, timeout=timedelta(seconds=0.5))
    for rank in (0, 1):
        assert said[rank].startswith(f"new_group on rank {rank}: not every rank of the job "
                                     f"made group 1 of ranks [0, 1] (every rank must call "
                                     f"new_group for every group, members or not"), said[rank]
