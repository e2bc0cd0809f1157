"""Schedules a test registers as a user would, and the registry put back after it.

``isolated(monkeypatch)``: what the test registers is forgotten when ``done()`` runs (with the
plans and the model's prices cached under its names). ``pairwise``: one exchange with
rank ^ 1, a research schedule right only at world size 2. ``favour(monkeypatch, name)``: the
model ranks ``name`` first wherever it is a candidate, so a test can show ``auto`` would have
taken it."""
from collectives import tuning
from collectives.algorithms import cost, schedule
from collectives.algorithms.schedule import COLLECTIVES, Region, build_plan, sendrecv

EXPERIMENT = "pairwise_experiment"


def isolated(monkeypatch):
    """The registry's tables replaced by copies for the test; returns ``done()``, which puts
    them back and forgets what was cached for the test's schedules."""
    for table in (schedule.REGISTRY, getattr(schedule, "OPTED_IN", {})):
        for collective in COLLECTIVES:
            monkeypatch.setitem(table, collective, dict(table.get(collective, {})))

    def done():
        monkeypatch.undo()
        build_plan.cache_clear()
        cost.clear_caches()
        tuning._ranked.cache_clear()
    return done


def pairwise(rank, size, count):
    """One exchange with rank ^ 1: the sum of two ranks, right only at world size 2."""
    whole = Region("output", 0, count)
    yield sendrecv(rank ^ 1, whole, rank ^ 1, whole, reduce=True)


def favour(monkeypatch, name):
    """The model ranks ``name`` first wherever it is among the candidates."""
    real = cost.ranking

    def ranking(collective, size, nbytes, params, candidates, *args, **kwargs):
        ranked = real(collective, size, nbytes, params, candidates, *args, **kwargs)
        return sorted(ranked, key=lambda item: item[1] != name)
    monkeypatch.setattr(cost, "ranking", ranking)
