"""Layer 1: every registered schedule, simulated with all ranks in one process.

Every send meets a receive (rendezvous matching), nothing deadlocks, and every output element
holds exactly the right contributions (random 64-bit words, wrapping sum)."""
import pytest

from collectives.algorithms import capabilities
from collectives.algorithms.simulate import verify

SIZES = list(range(1, 34)) + [64, 100]


def counts_for(p):
    return sorted({0, 1, max(p - 1, 0), p, p + 1, 31, 1000})


def case_args(collective, p, c, root):
    """The schedule's counts argument for total count ``c`` (uneven where it can be)."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return c
    if collective in ("all_gather", "gather", "reduce_scatter", "scatter"):
        return tuple((c + i) % 7 + (c // p) for i in range(p))           # uneven per rank
    if collective == "all_to_all":
        return tuple(tuple((c + 3 * i + j) % 5 + (c // (p * p)) for j in range(p)) for i in range(p))
    return None


CASES = [(coll, alg) for coll, algs in capabilities().items() for alg in algs]


@pytest.mark.parametrize("collective,algorithm", CASES)
def test_schedule_every_size_and_count(collective, algorithm):
    for p in SIZES:
        roots = sorted({0, p - 1, p // 2}) if collective in ("broadcast", "reduce", "gather", "scatter") else [0]
        for c in counts_for(p):
            for root in roots:
                verify(collective, algorithm, p, case_args(collective, p, c, root), root=root)


def sparse_args(collective, p):
    """Small counts at large p: a few non-empty, uneven blocks, the rest empty (the dense
    cases above already run every block at p <= 100)."""
    if collective in ("all_reduce", "broadcast", "reduce"):
        return 3
    if collective in ("all_gather", "gather", "reduce_scatter", "scatter"):
        return tuple(i % 7 + 1 if i % 97 == 5 else 0 for i in range(p))
    if collective == "all_to_all":
        return tuple(tuple(1 if (i + j) % 97 == 0 else 0 for j in range(p)) for i in range(p))
    return None


@pytest.mark.parametrize("p", [128, pytest.param(1024, marks=pytest.mark.slow)])
@pytest.mark.parametrize("collective,algorithm", CASES)
def test_schedule_at_large_world_sizes(collective, algorithm, p):
    """128 ranks in the default run; 1024 (seconds each) marked slow."""
    root = 5 if collective in ("broadcast", "reduce", "gather", "scatter") else 0
    verify(collective, algorithm, p, sparse_args(collective, p), root=root)
