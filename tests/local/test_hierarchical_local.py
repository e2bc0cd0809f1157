"""Hierarchical algorithms through the facade on the local transport (threads as ranks): a
name with its topology runs like any other algorithm, bitwise alike on every rank, and a
topology that does not cover the group is a ValueError naming the call before any byte
moves."""
import numpy as np
import pytest

import collectives as dist

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
