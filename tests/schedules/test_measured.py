"""Measured corrections (``algorithms/measured.py``): the ratios a ``bench.py --tune`` run
stored, how the model applies them (interpolated, held at the ends, the machine's offset for
unmeasured algorithms, nothing for unmeasured world sizes), the file round trip and its
errors. (``bench.py --tune`` now writes decisions: test_tuning.py.)"""
import json
import math

import pytest

from collectives.algorithms import choose as auto_choose
from collectives.algorithms import cost, measured
from collectives.algorithms.cost import Params

P = Params(alpha=1e-5, beta=1e-9, gamma=2e-9)
KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def no_tuning_file(monkeypatch):
    monkeypatch.delenv(cost.ENV_TUNING, raising=False)


def corrections(**curves):
    return measured.Corrections({("all_reduce", 8): curves})


def test_factor_is_the_ratio_at_a_measured_size_and_geometric_between():
    c = corrections(ring=[(4 * KIB, 2.0), (1 * MIB, 0.5)])
    assert c.factor("all_reduce", 8, "ring", 4 * KIB) == pytest.approx(2.0)
    assert c.factor("all_reduce", 8, "ring", 1 * MIB) == pytest.approx(0.5)
    # 64 KiB is halfway between 4 KiB and 1 MiB in log size: sqrt(2 * 0.5)
    assert c.factor("all_reduce", 8, "ring", 64 * KIB) == pytest.approx(1.0)
    # beyond the ends the nearest end's ratio holds
    assert c.factor("all_reduce", 8, "ring", 16) == pytest.approx(2.0)
    assert c.factor("all_reduce", 8, "ring", 1 << 30) == pytest.approx(0.5)


def test_unmeasured_algorithms_take_the_machines_offset_and_unmeasured_shapes_nothing():
    c = corrections(ring=[(4 * KIB, 2.0)], tree=[(4 * KIB, 8.0)])
    assert c.factor("all_reduce", 8, "direct", 4 * KIB) == pytest.approx(4.0)  # sqrt(2 * 8)
    assert c.factor("all_reduce", 4, "ring", 4 * KIB) == 1.0        # another world size
    assert c.factor("all_gather", 8, "ring", 4 * KIB) == 1.0        # another collective
    assert not measured.NONE and measured.NONE.factor("all_reduce", 8, "ring", 1) == 1.0


def test_corrections_turn_auto_to_the_measured_winner():
    nbytes = 1 * MIB
    candidates = ["ring", "recursive_doubling"]
    model_pick, _ = cost.cheapest("all_reduce", 8, nbytes, candidates=candidates, params=P,
                                corrections=measured.NONE)
    other = next(a for a in candidates if a != model_pick)
    # the run measured the model's pick 3x slower than predicted and the other as predicted
    ratio_gap = (cost.estimate("all_reduce", other, 8, nbytes, P)
                 / cost.estimate("all_reduce", model_pick, 8, nbytes, P))
    c = corrections(**{model_pick: [(nbytes, 3.0 * ratio_gap)], other: [(nbytes, 1.0)]})
    pick, seconds = cost.cheapest("all_reduce", 8, nbytes, candidates=candidates, params=P,
                                corrections=c)
    assert pick == other
    assert seconds == pytest.approx(cost.estimate("all_reduce", other, 8, nbytes, P))


def rows(*items):
    return [{"collective": "all_reduce", "algorithm": name, "world_size": 4, "size": size,
             "time_p50_us": us, "wrong": wrong} for name, size, us, wrong in items]


def test_from_rows_takes_algorithm_rows_only_and_divides_by_the_estimate():
    table = measured.from_rows(rows(
        ("ring", 4 * KIB, 100.0, 0), ("ring", 64 * KIB, 300.0, 0),
        ("native", 4 * KIB, 50.0, 0), ("auto", 4 * KIB, 90.0, 0),
        ("tree", 4 * KIB, 80.0, 3),              # wrong results measure nothing
        ("ring:graph", 4 * KIB, 10.0, 0)), P, 4)
    assert set(table) == {("all_reduce", 4)} and set(table["all_reduce", 4]) == {"ring"}
    (n0, r0), (n1, r1) = table["all_reduce", 4]["ring"]
    assert (n0, n1) == (4 * KIB, 64 * KIB)
    assert r0 == pytest.approx(100e-6 / cost.estimate("all_reduce", "ring", 4, 4 * KIB, P))
    assert r1 == pytest.approx(300e-6 / cost.estimate("all_reduce", "ring", 4, 64 * KIB, P))
    # the nccl bench's rows carry seconds instead of p50 microseconds
    nccl = [{"collective": "all_reduce", "algorithm": "ring", "world_size": 4,
             "size": 4 * KIB, "time_s": 1e-4, "wrong": 0}]
    assert measured.from_rows(nccl, P, 4) == {("all_reduce", 4): {"ring": [(4 * KIB, r0)]}}


def test_save_load_merge_and_recalibration_drops_the_ratios(tmp_path):
    path = str(tmp_path / "tuning.json")
    measured.save(path, "mpi", P, {("all_reduce", 8): {"ring": [(4 * KIB, 2.0)]}})
    measured.save(path, "mpi", P, {("all_gather", 8): {"tree": [(4 * KIB, 0.5)]}})
    assert cost.load_params("mpi", path) == P
    loaded = measured.load("mpi", path)
    assert loaded.factor("all_reduce", 8, "ring", 4 * KIB) == pytest.approx(2.0)   # kept
    assert loaded.factor("all_gather", 8, "tree", 4 * KIB) == pytest.approx(0.5)
    assert not measured.load("socket", path)               # another transport: none
    # new parameters: the old ratios were relative to the old ones
    other = Params(alpha=2e-5, beta=1e-9, gamma=2e-9)
    measured.save(path, "mpi", other, {("all_gather", 8): {"tree": [(4 * KIB, 0.7)]}})
    loaded = measured.load("mpi", path)
    assert loaded.factor("all_reduce", 8, "ring", 4 * KIB) == 1.0
    assert loaded.factor("all_gather", 8, "tree", 4 * KIB) == pytest.approx(0.7)
    cost.save_params(path, "mpi", P)                         # --calibrate rewrites the entry
    assert not measured.load("mpi", path)


def test_auto_reads_the_ratios_through_the_tuning_variable(tmp_path, monkeypatch):
    nbytes = 1 * MIB
    ranked = cost.ranking("all_reduce", 8, nbytes, cost.load_params("mpi"),
                          sorted(cost.REGISTRY["all_reduce"]))
    (_, first), (_, second) = ranked[:2]
    assert auto_choose("all_reduce", 8, nbytes, "mpi") == first
    # measured: the model's pick 100x slower than predicted, the runner-up as predicted; the
    # others take their geometric mean (10x), which cannot bring them below the runner-up
    path = str(tmp_path / "tuning.json")
    measured.save(path, "mpi", cost.load_params("mpi"),
                  {("all_reduce", 8): {first: [(nbytes, 100.0)], second: [(nbytes, 1.0)]}})
    monkeypatch.setenv(cost.ENV_TUNING, path)
    assert auto_choose("all_reduce", 8, nbytes, "mpi") == second


@pytest.mark.parametrize("raw, says", [
    ([], "expected {collective"),
    ({"all_sum": {}}, "'all_sum' is not a collective"),
    ({"all_reduce": {"x": {}}}, "world size 'x'"),
    ({"all_reduce": {"8": {"ring": [[4096]]}}}, "expected [[bytes, ratio]"),
    ({"all_reduce": {"8": {"ring": [[4096, -1.0]]}}}, "finite ratio > 0"),
    ({"all_reduce": {"8": {"ring": [[4096, float("nan")]]}}}, "finite ratio > 0"),
    ({"all_reduce": {"8": {"ring": [[4096, 1.0], [4096, 2.0]]}}}, "a size appears twice"),
])
def test_malformed_tables_name_the_file_and_the_place(tmp_path, raw, says):
    path = tmp_path / "tuning.json"
    path.write_text(json.dumps({"mpi": {"alpha": 1e-5, "beta": 1e-9, "gamma": 1e-9,
                                        "measured": raw}}))
    with pytest.raises(ValueError) as info:
        measured.load("mpi", str(path))
    assert says in str(info.value) and str(path) in str(info.value)
