"""``auto`` on real ranks (threads on the local transport) beside a user's registered
schedule: plain calls run the package's schedules unless the user opted one in with
``@algorithm(..., auto=True)``; an opted-in schedule the simulator finds wrong stops the
group from being made, on every rank, naming it; one proven right may be chosen; naming a
registered schedule runs it whatever ``auto`` may do."""
import numpy as np
import pytest
from registered_schedules import EXPERIMENT, favour, isolated, pairwise

import collectives as dist
from collectives import state
from collectives.algorithms.schedule import algorithm
from collectives.testing import RankFailed


@pytest.fixture
def registry(monkeypatch):
    for name in ("COLLECTIVES_TUNING", "COLLECTIVES_ALGORITHM"):
        monkeypatch.delenv(name, raising=False)
    done = isolated(monkeypatch)
    yield
    done()


def plain_and_named(rank):
    """A plain all_reduce of ones, then one naming the experiment; what auto chose."""
    plain, named = np.ones(4, np.float32), np.ones(4, np.float32)
    dist.all_reduce(plain)
    dist.all_reduce(named, algorithm=EXPERIMENT)
    chosen = state.world().default.resolve_algorithm("all_reduce", None, plain.nbytes)
    return plain.tolist(), named.tolist(), chosen


def test_a_plain_all_reduce_never_runs_a_registered_schedule(local_group, registry,
                                                             monkeypatch):
    algorithm("all_reduce", EXPERIMENT)(pairwise)
    favour(monkeypatch, EXPERIMENT)             # the model would take it at every size
    for plain, named, chosen in local_group(4, plain_and_named):
        assert plain == [4.0] * 4
        assert chosen != EXPERIMENT
        assert named == [2.0] * 4               # named, it runs: the sum of a pair


def test_an_opted_in_schedule_found_wrong_stops_the_group_on_every_rank(local_group,
                                                                        registry):
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    with pytest.raises(RankFailed) as caught:
        local_group(4, plain_and_named)
    error = caught.value.__cause__
    assert isinstance(error, ValueError), repr(error)
    for part in ("ProcessGroup on rank", "all_reduce schedule 'pairwise_experiment'",
                 "auto=True", "world size 4", "wrong result"):
        assert part in str(error), str(error)


def test_an_opted_in_schedule_proven_right_may_run_in_a_plain_call(local_group, registry,
                                                                   monkeypatch):
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    favour(monkeypatch, EXPERIMENT)
    for plain, named, chosen in local_group(2, plain_and_named):
        assert (plain, named, chosen) == ([2.0] * 4, [2.0] * 4, EXPERIMENT)
