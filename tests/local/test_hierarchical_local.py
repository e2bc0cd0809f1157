"""Hierarchical algorithms through the facade on the local transport (threads as ranks): a
name with its topology runs like any other algorithm, bitwise alike on every rank, and a
topology that does not cover the group is a ValueError naming the call before any byte
moves."""
import numpy as np
import pytest

import collectives as dist
from collectives.testing import RankFailed

ALGORITHM = "hierarchical:ring+ring@3,5"


def _collectives(rank):
    x = np.arange(11, dtype=np.float32) * (rank + 1)
    dist.all_reduce(x, algorithm=ALGORITHM)
    out = [np.empty(2, np.int64) for _ in range(8)]
    dist.all_gather(out, np.full(2, rank, np.int64), algorithm=ALGORITHM)
    b = np.arange(5.0) if rank == 6 else np.zeros(5)
    dist.broadcast(b, src=6, algorithm=ALGORITHM)
    return x, np.concatenate(out), b


def test_hierarchical_collectives_on_the_local_transport(local_group):
    results = local_group(8, _collectives)
    want = np.arange(11, dtype=np.float32) * 36
    for x, gathered, b in results:
        np.testing.assert_allclose(x, want)
        assert np.array_equal(x, results[0][0])
        assert np.array_equal(gathered, np.repeat(np.arange(8), 2))
        assert np.array_equal(b, np.arange(5.0))


def _wrong_size(rank):
    with pytest.raises(ValueError, match="all_reduce .*covers 8 ranks, but the group has 4"):
        dist.all_reduce(np.ones(3), algorithm=ALGORITHM)
    with pytest.raises(ValueError, match="reduce has no hierarchical form"):
        dist.reduce(np.ones(3), dst=0, algorithm="hierarchical:ring+ring@2x2")
    return True


def test_bad_hierarchical_calls_are_value_errors(local_group):
    assert all(local_group(4, _wrong_size))


# -- the group's topology: COLLECTIVES_TOPOLOGY qualifies hierarchical:<a>+<b> -----------------


def _short_names(rank):
    x = np.arange(9, dtype=np.int64) * (rank + 1)
    dist.all_reduce(x, algorithm="hierarchical:ring+recursive_doubling")   # @3,5 added
    out = [np.empty(1, np.int64) for _ in range(8)]
    dist.all_gather(out, np.full(1, rank, np.int64))       # COLLECTIVES_ALGORITHM's, qualified
    return x, np.concatenate(out)


def test_the_groups_topology_names_the_hosts(local_group, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "3,5")
    monkeypatch.setenv("COLLECTIVES_ALGORITHM", "all_gather=hierarchical:ring+ring")
    for x, gathered in local_group(8, _short_names):
        assert np.array_equal(x, np.arange(9, dtype=np.int64) * 36)
        assert np.array_equal(gathered, np.arange(8))


def _overrides(rank):
    from collectives import state
    pg = state.world().default
    return pg.topology.spec, pg.overrides


def test_a_topology_in_the_algorithm_override(local_group, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "2x2")
    monkeypatch.setenv("COLLECTIVES_ALGORITHM",
                       "all_reduce=hierarchical:ring+ring,all_gather=hierarchical:ring+ring@1,3")
    for spec, overrides in local_group(4, _overrides):
        assert spec == "2x2"
        assert overrides == {"all_reduce": "hierarchical:ring+ring@2x2",
                             "all_gather": "hierarchical:ring+ring@1,3"}


def _without_topology(rank):
    with pytest.raises(ValueError, match=rf"all_reduce on rank {rank}: .*needs a topology"):
        dist.all_reduce(np.ones(3), algorithm="hierarchical:ring+ring")
    return True


def test_a_hierarchical_name_needs_a_topology(local_group, monkeypatch):
    monkeypatch.delenv("COLLECTIVES_TOPOLOGY", raising=False)
    assert all(local_group(4, _without_topology))


def test_a_topology_of_another_size_is_refused_naming_the_rank(local_group, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "2x4")
    with pytest.raises(RankFailed, match=r"ValueError: .*on rank \d.*COLLECTIVES_TOPOLOGY=2x4.*covers 8 "
                                         r"ranks, but the group has 4"):
        local_group(4, _without_topology)


def test_an_override_without_a_topology_names_the_rank(local_group, monkeypatch):
    monkeypatch.delenv("COLLECTIVES_TOPOLOGY", raising=False)
    monkeypatch.setenv("COLLECTIVES_ALGORITHM", "all_reduce=hierarchical:ring+ring")
    with pytest.raises(RankFailed, match=r"ValueError: ProcessGroup on rank \d: COLLECTIVES_ALGORITHM=.*"
                                         r"needs a topology"):
        local_group(4, _without_topology)


def _subgroup(rank):
    sub = dist.new_group([1, 2, 5, 6])
    if sub is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    x = np.full(4, rank, np.int64)
    dist.all_reduce(x, group=sub, algorithm="hierarchical:ring+ring")
    return sub.topology.spec, x


def test_a_subgroup_takes_its_members_hosts(local_group, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_TOPOLOGY", "2x4")
    results = [r for r in local_group(8, _subgroup) if r is not None]
    assert len(results) == 4
    for spec, x in results:
        assert spec == "2x2"                # ranks 1, 2 on host 0; 5, 6 on host 1
        assert np.array_equal(x, np.full(4, 14))
