"""What ``auto`` may choose: the package's own schedules, and a registered schedule only when
it is opted in with ``@algorithm(..., auto=True)`` and the simulator proves it at the group's
world size (on the schedule tests' cases when the decision table is made, and at each size
class before a row prices it). A schedule registered without ``auto=True`` runs only where a
call names it: the model, a tuning file and ``bench.py --tune`` never pick it."""
import json

import pytest

from registered_schedules import EXPERIMENT, favour, isolated, pairwise

from collectives import algorithms, tuning
from collectives.bench import fit
from collectives.algorithms import cost, schedule
from collectives.algorithms.schedule import Region, algorithm, build_plan, sendrecv

KIB = 1 << 10
CLASSES = (0, 1, 5, 10, 13, 17, 21, 27)


@pytest.fixture(autouse=True)
def clean_settings(monkeypatch):
    for name in ("COLLECTIVES_TUNING", "COLLECTIVES_ALGORITHM", "COLLECTIVES_DEBUG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def registry(monkeypatch):
    done = isolated(monkeypatch)
    yield
    done()


# -- registered, not opted in ----------------------------------------------------------------

def test_a_registered_schedule_is_never_autos_choice_even_ranked_first(registry, monkeypatch):
    algorithm("all_reduce", EXPERIMENT)(pairwise)
    favour(monkeypatch, EXPERIMENT)
    assert EXPERIMENT in algorithms.capabilities()["all_reduce"]     # it runs when named
    table = tuning.DecisionTable(4, "local")
    for cls in CLASSES:
        row = table.decision("all_reduce", cls)
        assert row.algorithm != EXPERIMENT and row.by == "model", cls
        assert row.algorithm in algorithms.capabilities()["all_reduce"]
    assert algorithms.choose("all_reduce", 4, 4 * KIB) != EXPERIMENT
    assert cost.cheapest("all_reduce", 4, 4 * KIB)[0] != EXPERIMENT
    assert EXPERIMENT not in algorithms.auto_candidates("all_reduce", 4)


def test_a_package_name_registered_again_by_other_code_leaves_autos_choices(
        registry, monkeypatch):
    algorithm("all_reduce", "tree")(pairwise)           # replaces the package's tree
    favour(monkeypatch, "tree")
    table = tuning.DecisionTable(4, "local")
    assert all(table.decision("all_reduce", cls).algorithm != "tree" for cls in CLASSES)
    assert table.decision("all_gather", 13).algorithm == "tree"     # its other collectives stay
    assert "tree" not in algorithms.auto_candidates("all_reduce", 4)


def test_a_tuning_file_row_naming_a_schedule_not_opted_in_is_an_error(registry, tmp_path):
    algorithm("all_reduce", EXPERIMENT)(pairwise)
    path = tmp_path / "tuning.json"
    params = cost.default_params("local")
    path.write_text(json.dumps({"local": {
        "alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
        "decisions": {"all_reduce": {"4": [{"bytes": 4096, "algorithm": EXPERIMENT}]}}}}))
    with pytest.raises(ValueError, match=f"{EXPERIMENT}.*registered without auto=True"):
        tuning.DecisionTable(4, "local", tuning=str(path))


def test_bench_tune_leaves_out_a_schedule_not_opted_in(registry):
    algorithm("all_reduce", EXPERIMENT)(pairwise)
    records = [{"collective": "all_reduce", "algorithm": name, "world_size": 4, "size": 4096,
                "round_p50_us": [t] * 5}
               for name, t in ((EXPERIMENT, 1.0), ("ring", 50.0), ("tree", 80.0))]
    rows = fit.decisions_from_records(records, cost.default_params("local"))
    [row] = rows["all_reduce", 4]
    assert row["algorithm"] == "ring" and EXPERIMENT not in row["median_us"]


# -- opted in --------------------------------------------------------------------------------

def test_an_opted_in_schedule_that_is_wrong_is_an_error_naming_it(registry):
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    with pytest.raises(ValueError) as caught:
        tuning.DecisionTable(4, "local")
    text = str(caught.value)
    for part in ("all_reduce", repr(EXPERIMENT), "auto=True", "world size 4",
                 "rank 0 holds a wrong result"):
        assert part in text, text
    with pytest.raises(ValueError, match="world size 4"):
        algorithms.choose("all_reduce", 4, 4 * KIB)
    # an override names what runs for that collective: nothing there for auto to prove
    tuning.DecisionTable(4, "local", overrides={"all_reduce": "ring"})


def test_an_opted_in_schedule_that_deadlocks_is_an_error_naming_it(registry):
    @algorithm("all_gather", "waits_for_the_left", auto=True)
    def waits(rank, size, counts):          # everyone receives first: nobody ever sends
        whole = Region("output", 0, sum(counts))
        yield sendrecv(None, None, (rank - 1) % size, whole)
        yield sendrecv((rank + 1) % size, whole)
    with pytest.raises(ValueError, match=r"all_gather schedule 'waits_for_the_left'.*"
                                         r"world size 3.*deadlocks"):
        tuning.DecisionTable(3, "local")


def test_an_opted_in_schedule_proven_right_may_be_autos_choice(registry, monkeypatch):
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    favour(monkeypatch, EXPERIMENT)
    table = tuning.DecisionTable(2, "local")            # where one exchange is the whole sum
    assert EXPERIMENT in algorithms.auto_candidates("all_reduce", 2)
    for cls in CLASSES:
        assert table.decision("all_reduce", cls).algorithm == EXPERIMENT, cls
    assert "auto=True: all_reduce=pairwise_experiment" in table.label()


def test_an_opted_in_schedule_is_proven_at_the_size_classes_it_is_priced_for(
        registry, monkeypatch):
    ring = schedule.REGISTRY["all_reduce"]["ring"]

    @algorithm("all_reduce", "ring_until_4k", auto=True)
    def ring_until_4k(rank, size, count):   # from 4096 elements nothing moves: no sum
        if count < 4096:
            yield from ring(rank, size, count)
    favour(monkeypatch, "ring_until_4k")
    table = tuning.DecisionTable(4, "local")      # the schedule tests' counts are all < 4096
    assert table.algorithm("all_reduce", 1 * KIB) == "ring_until_4k"
    with pytest.raises(ValueError, match=r"'ring_until_4k'.*world size 4.*counts 4096"):
        table.algorithm("all_reduce", 16 * KIB)


def test_a_table_chooses_among_what_was_opted_in_when_it_was_made(registry, monkeypatch):
    favour(monkeypatch, EXPERIMENT)
    table = tuning.DecisionTable(2, "local")
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)     # after: not in its digest
    assert table.decision("all_reduce", 13).algorithm != EXPERIMENT
    assert tuning.DecisionTable(2, "local").decision("all_reduce", 13).algorithm == EXPERIMENT


def test_the_opted_in_schedules_are_among_the_sources_the_ranks_compare(registry):
    plain = tuning.DecisionTable(2, "local")
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    opted = tuning.DecisionTable(2, "local")
    assert plain.digest != opted.digest
    record = tuning.disagreement([plain.agreement_record(), opted.agreement_record()], 0)
    assert record and "auto=True: all_reduce=pairwise_experiment" in record


# -- the registry ----------------------------------------------------------------------------

def twice(rank, size, count):
    yield from pairwise(rank, size, count)
    yield from pairwise(rank, size, count)


def test_registering_a_name_again_replaces_the_plans_built_for_it(registry):
    algorithm("all_reduce", EXPERIMENT)(pairwise)
    assert build_plan("all_reduce", EXPERIMENT, 0, 2, 8).messages == 1
    algorithm("all_reduce", EXPERIMENT)(twice)
    assert build_plan("all_reduce", EXPERIMENT, 0, 2, 8).messages == 2


def test_registering_a_name_again_without_auto_withdraws_its_opt_in(registry):
    algorithm("all_reduce", EXPERIMENT, auto=True)(pairwise)
    assert EXPERIMENT in algorithms.auto_candidates("all_reduce", 2)
    algorithm("all_reduce", EXPERIMENT)(twice)
    assert EXPERIMENT not in algorithms.auto_candidates("all_reduce", 2)


def test_registration_arguments_are_checked_before_anything_is_registered(registry):
    for name in ("auto", "native", "", "ring:graph"):
        with pytest.raises(ValueError, match="all_reduce"):
            algorithm("all_reduce", name)
    with pytest.raises(TypeError, match="auto must be True or False"):
        algorithm("all_reduce", EXPERIMENT, auto="yes")
    assert EXPERIMENT not in schedule.REGISTRY["all_reduce"]
