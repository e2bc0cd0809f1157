"""The decision table (``collectives/tuning.py``): size classes, its sources in order (the
call's algorithm, COLLECTIVES_ALGORITHM, the tuning file's measured winners, the model), the
files it reads (decisions, and the older ratios-only files) and their errors, the digest the
ranks compare when a group is made (a mismatch names the ranks and their files: threads and
real processes), the INFO print, ``bench.py --tune`` writing the winners by the median over
rounds and the run's noise, and ``python -m collectives tune show``."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest

from collectives import settings, tuning
from collectives.algorithms import capabilities, cost, measured
from collectives.bench import fit
from collectives.errors import CollectiveError
from collectives.group import ProcessGroup
from collectives.transports.local import LocalWorld

KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def clean_settings(monkeypatch):
    for name in ("COLLECTIVES_TUNING", "COLLECTIVES_ALGORITHM", "COLLECTIVES_DEBUG",
                 "COLLECTIVES_WINDOW"):
        monkeypatch.delenv(name, raising=False)


def groups_of(size, **kwargs):
    """A group per rank of a local world, made on one thread per rank (making one is a
    collective call: the ranks compare their tables)."""
    world = LocalWorld(size)
    groups, errors = [None] * size, [None] * size

    def make(rank):
        try:
            groups[rank] = ProcessGroup(world.transport(rank), backend="local", timeout=20,
                                        **kwargs)
        except BaseException as exc:         # surfaced by the caller
            errors[rank] = exc
            world.abort(repr(exc))
    threads = [threading.Thread(target=make, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return groups, errors


def write(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def decisions_file(tmp_path, rows, size=4, collective="all_reduce", name="tuning.json",
                   transport="local"):
    params = cost.default_params(transport)
    return write(tmp_path / name, {transport: {
        "alpha": params.alpha, "beta": params.beta, "gamma": params.gamma,
        "decisions": {collective: {str(size): rows}}}})


# -- size classes ------------------------------------------------------------------------------

def test_size_classes_are_powers_of_two():
    assert [tuning.size_class(n) for n in (0, 1, 2, 3, 4, 4095, 4096, 8191)] == \
        [0, 1, 2, 2, 3, 12, 13, 13]
    assert tuning.class_bytes(13) == 4096 and tuning.class_bytes(0) == 0
    assert tuning.size_class(1 << 60) == tuning.LAST_CLASS
    assert tuning.class_label(13) == "4K-8K" and tuning.class_label(0) == "0"
    assert tuning.class_label(13, 15) == "4K-32K"
    assert tuning.class_label(5, tuning.LAST_CLASS) == "16+"


# -- sources -------------------------------------------------------------------------------------

def test_without_a_file_every_class_is_the_models_choice_at_its_smallest_size():
    table = tuning.DecisionTable(4, "local")
    params = cost.load_params("local", "")
    for collective in ("all_reduce", "all_gather", "broadcast"):
        for cls in (0, 5, 13, 21, 27):
            ranked = cost.ranking(collective, 4, tuning.class_bytes(cls), params,
                                  capabilities()[collective])
            row = table.decision(collective, cls)
            assert (row.algorithm, row.by) == (ranked[0][1], "model")
            last = max(0, 2 * tuning.class_bytes(cls) - 1)          # the class's largest size
            assert table.algorithm(collective, last) == ranked[0][1]


def test_the_override_holds_for_every_size_and_bad_overrides_are_errors():
    table = tuning.DecisionTable(4, "local", overrides={"all_reduce": "ring"})
    assert {table.lookup("all_reduce", n).by for n in (0, 1, 4 * KIB, 1 << 30)} == {"override"}
    assert table.algorithm("all_reduce", 12345) == "ring"
    assert table.lookup("all_gather", 4 * KIB).by == "model"
    assert tuning.parse_overrides("all_reduce=ring, all_gather=tree") == \
        {"all_reduce": "ring", "all_gather": "tree"}
    with pytest.raises(ValueError, match="COLLECTIVES_ALGORITHM: 'ring' is not of the form"):
        tuning.parse_overrides("ring")
    with pytest.raises(ValueError, match="COLLECTIVES_ALGORITHM='all_reduce=fast'.*valid: "):
        tuning.parse_overrides("all_reduce=fast")
    with pytest.raises(ValueError, match="no native collectives"):
        tuning.DecisionTable(4, "local", overrides={"all_reduce": "native"})


def test_measured_rows_hold_for_their_class_and_between_the_model_outside(tmp_path):
    path = decisions_file(tmp_path, [
        {"bytes": 4 * KIB, "algorithm": "direct", "by": "measured"},
        {"bytes": 64 * KIB, "algorithm": "tree", "by": "model"},
        {"bytes": 1 * MIB, "algorithm": "ring", "by": "measured"}])
    table = tuning.DecisionTable(4, "local", tuning=path)
    model = tuning.DecisionTable(4, "local")
    assert table.algorithm("all_reduce", 4 * KIB) == "direct"
    assert table.algorithm("all_reduce", 6 * KIB) == "direct"       # its class
    assert table.algorithm("all_reduce", 16 * KIB) == "direct"      # nearer 4K than 64K
    assert table.algorithm("all_reduce", 17 * KIB) == "direct"      # 16K-32K: a tie -> smaller
    assert table.algorithm("all_reduce", 32 * KIB) == "tree"
    assert table.algorithm("all_reduce", 1 * MIB) == "ring"
    for outside in (64, 1 * KIB, 8 * MIB, 1 << 30):                 # the model's
        row = table.lookup("all_reduce", outside)
        assert row.by == "model" and row.algorithm == model.algorithm("all_reduce", outside)
    assert table.lookup("all_gather", 4 * KIB).by == "model"        # not measured
    other = tuning.DecisionTable(8, "local", tuning=path)            # another world size
    assert other.lookup("all_reduce", 4 * KIB).by == "model"
    assert "within the noise" in table.lookup("all_reduce", 64 * KIB).note


def test_an_older_file_of_ratios_gives_the_measured_winner(tmp_path):
    path = str(tmp_path / "old.json")
    params = cost.default_params("local")
    # measured: ring 3x its prediction, direct as predicted -> direct measured faster where
    # the model alone ranks ring first
    ring = cost.estimate("all_reduce", "ring", 4, 1 * MIB, params)
    direct = cost.estimate("all_reduce", "direct", 4, 1 * MIB, params)
    measured.save(path, "local", params, {("all_reduce", 4): {
        "ring": [(1 * MIB, 1.0)], "direct": [(1 * MIB, 0.5 * ring / direct)]}})
    table = tuning.DecisionTable(4, "local", tuning=path)
    row = table.lookup("all_reduce", 1 * MIB)
    assert (row.algorithm, row.by) == ("direct", "measured")
    text = tuning.show(path)
    assert "direct" in text and "all_reduce" in text


@pytest.mark.parametrize("entry, says", [
    ({"decisions": []}, "'decisions' must be"),
    ({"decisions": {"all_sum": {}}}, "'all_sum' is not a collective"),
    ({"decisions": {"all_reduce": {"x": []}}}, "world size 'x'"),
    ({"decisions": {"all_reduce": {"4": {}}}}, "expected a list of rows"),
    ({"decisions": {"all_reduce": {"4": [{"bytes": 1}]}}}, "needs bytes and algorithm"),
    ({"decisions": {"all_reduce": {"4": [{"bytes": 1, "algorithm": "fast"}]}}},
     "algorithm one of"),
    ({"decisions": {"all_reduce": {"4": [{"bytes": 1, "algorithm": "ring"},
                                         {"bytes": 1, "algorithm": "tree"}]}}}, "appear once"),
    ({"measured": {"all_reduce": {"4": {"ring": [[4096, -1.0]]}}}}, "finite ratio"),
])
def test_malformed_files_are_errors_naming_the_file_and_the_place(tmp_path, entry, says):
    params = cost.default_params("local")
    path = write(tmp_path / "bad.json", {"local": {"alpha": params.alpha, "beta": params.beta,
                                                   "gamma": params.gamma, **entry}})
    with pytest.raises(ValueError) as info:
        tuning.DecisionTable(4, "local", tuning=path)
    assert says in str(info.value) and f"COLLECTIVES_TUNING={path}" in str(info.value)


def test_unreadable_files_are_errors(tmp_path):
    with pytest.raises(ValueError, match="cannot read the tuning file"):
        tuning.DecisionTable(2, "local", tuning=str(tmp_path / "missing.json"))
    (tmp_path / "x.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        tuning.DecisionTable(2, "local", tuning=str(tmp_path / "x.json"))


def test_the_digest_covers_what_decides_and_nothing_rank_local(tmp_path):
    a = decisions_file(tmp_path, [{"bytes": 4096, "algorithm": "ring"}], name="a.json")
    b = decisions_file(tmp_path, [{"bytes": 4096, "algorithm": "ring"}], name="b.json")
    c = decisions_file(tmp_path, [{"bytes": 4096, "algorithm": "tree"}], name="c.json")
    digest = tuning.DecisionTable(4, "local", tuning=a).digest
    assert tuning.DecisionTable(4, "local", tuning=b).digest == digest   # same content
    assert tuning.DecisionTable(4, "local", tuning=a, window=4, segment=1 << 20).digest == digest
    assert tuning.DecisionTable(4, "local", tuning=c).digest != digest
    assert tuning.DecisionTable(4, "local").digest != digest
    assert tuning.DecisionTable(4, "local", tuning=a,
                                overrides={"all_gather": "ring"}).digest != digest
    assert tuning.DecisionTable(8, "local", tuning=a).digest != digest
    assert tuning.DecisionTable(4, "mpi", tuning=a).digest != digest


# -- groups ----------------------------------------------------------------------------------------

def test_groups_look_auto_up_in_their_table(tmp_path, monkeypatch):
    path = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "tree"}], size=2)
    monkeypatch.setenv("COLLECTIVES_TUNING", path)
    monkeypatch.setenv("COLLECTIVES_ALGORITHM", "all_gather=ring")
    groups, errors = groups_of(2)
    assert errors == [None, None]
    g = groups[0]
    assert g.resolve_algorithm("all_reduce", None, 4 * KIB) == "tree"
    assert g.resolve_algorithm("all_reduce", "auto", 5 * KIB) == "tree"
    assert g.resolve_algorithm("all_reduce", "ring", 4 * KIB) == "ring"     # the call's wins
    assert g.resolve_algorithm("all_gather", None, 4 * KIB) == "ring"
    assert g.overrides == {"all_gather": "ring"}
    with pytest.raises(ValueError, match="all_reduce on rank 0: .*no algorithm 'fast'"):
        g.resolve_algorithm("all_reduce", "fast", 4)
    with pytest.raises(ValueError, match="unknown collective 'all_sum'"):
        g.resolve_algorithm("all_sum", None, 4)
    # read when the group is made: a later change needs a new group
    monkeypatch.delenv("COLLECTIVES_TUNING")
    assert g.resolve_algorithm("all_reduce", None, 4 * KIB) == "tree"
    fresh, _ = groups_of(2)
    assert fresh[0].table.lookup("all_reduce", 4 * KIB).by == "model"


def test_results_stay_exact_through_the_table(tmp_path, monkeypatch):
    path = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "tree"}], size=3)
    monkeypatch.setenv("COLLECTIVES_TUNING", path)
    groups, errors = groups_of(3)
    assert errors == [None] * 3
    outs = [np.full(1024, r + 1, np.float32) for r in range(3)]
    threads = [threading.Thread(target=lambda r: groups[r].prepare(
        "all_reduce", output=outs[r])(), args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all((o == 6).all() for o in outs)


def test_ranks_with_different_tables_fail_naming_the_ranks_and_files(tmp_path, monkeypatch):
    a = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "tree"}], size=3,
                       name="a.json")
    b = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "ring"}], size=3,
                       name="b.json")
    names = {0: a, 1: a, 2: b}
    real = settings.TUNING

    class PerRank:          # threads share one environment: each rank its own file here
        name = real.name

        def __call__(self):
            return names[int(threading.current_thread().name.rsplit("-", 1)[-1])]
    monkeypatch.setattr(settings, "TUNING", PerRank())
    world = LocalWorld(3)
    errors = [None] * 3

    def make(rank):
        try:
            ProcessGroup(world.transport(rank), backend="local", timeout=20)
        except BaseException as exc:
            errors[rank] = exc
    threads = [threading.Thread(target=make, args=(r,), name=f"rank-{r}") for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank, error in enumerate(errors):
        assert isinstance(error, CollectiveError), errors
        text = str(error)
        assert f"ProcessGroup on rank {rank}: the ranks' decision tables differ" in text
        assert f"ranks [0, 1] have table" in text and f"COLLECTIVES_TUNING={a}" in text
        assert f"ranks [2] have table" in text and f"COLLECTIVES_TUNING={b}" in text


def test_ranks_with_different_peer_memory_settings_fail_naming_them():
    """The peer-memory settings that shape a call's programs (eager and line limits, direct
    landing, the size limit, thread blocks) are sources of the table every rank compares when
    a group is made: a rank that differs is an error there, naming the ranks and the values,
    where it would corrupt a call or wait for flags no block writes."""
    agreed = {"COLLECTIVES_PEER_EAGER_BYTES": 4 << 20, "COLLECTIVES_PEER_LINE_BYTES": 256 << 10,
              "COLLECTIVES_PEER_DIRECT": False, "COLLECTIVES_PEER_MAX_BYTES": 32 << 20,
              "COLLECTIVES_PEER_BLOCKS": 128, "COLLECTIVES_PEER_BLOCK_BYTES": 4096}
    other = {**agreed, "COLLECTIVES_PEER_EAGER_BYTES": 1 << 20}
    tables = [tuning.DecisionTable(3, "nccl", agreed=a) for a in (agreed, agreed, other)]
    records = [t.agreement_record() for t in tables]
    assert tuning.disagreement(records[:2], 0) is None
    text = tuning.disagreement(records, 2)
    assert "ranks [0, 1] have table" in text and "ranks [2] have table" in text
    assert "COLLECTIVES_PEER_EAGER_BYTES=4194304" in text
    assert "COLLECTIVES_PEER_EAGER_BYTES=1048576" in text and "peer-memory settings" in text
    assert len(tables[0].label().encode()) <= tuning.LABEL_BYTES
    # a group's table takes them from the group's executor, where it runs on peer memory
    from types import SimpleNamespace
    from collectives.executors import Executor
    transport = SimpleNamespace(name="nccl", native=None, xp=None)
    on_peer = Executor(None, "nccl", peer=SimpleNamespace(agreed=other))
    assert tuning.DecisionTable.for_group(3, transport, on_peer).digest == tables[2].digest
    assert tuning.DecisionTable.for_group(3, transport, Executor(None, "nccl")).agreed == {}
    assert tuning.DecisionTable.for_group(3, transport).agreed == {}


def test_processes_with_different_tuning_files_fail_at_init(tmp_path):
    from reliability_jobs import socket_job
    a = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "tree"}], size=2,
                       name="a.json", transport="socket")
    b = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "ring"}], size=2,
                       name="b.json", transport="socket")
    body = """
    try:
        dist.init_process_group("socket", timeout=__import__("datetime").timedelta(seconds=20))
        report(ok=True)
    except Exception as exc:
        report(**failure(exc))
    """
    records = socket_job(tmp_path, body, 2, per_rank_env={0: {"COLLECTIVES_TUNING": a},
                                                          1: {"COLLECTIVES_TUNING": b}})
    for rank, record in enumerate(records):
        assert record["results"], record["stderr"]
        result = record["results"][0]
        assert result.get("type") == "CollectiveError", result
        assert f"rank {rank}: the ranks' decision tables differ" in result["message"]
        assert a in result["message"] and b in result["message"]
        assert "ranks [0]" in result["message"] and "ranks [1]" in result["message"]


def test_info_prints_each_groups_table_once(tmp_path, monkeypatch, caplog):
    import logging
    path = decisions_file(tmp_path, [{"bytes": 4 * KIB, "algorithm": "tree"}], size=2)
    monkeypatch.setenv("COLLECTIVES_TUNING", path)
    monkeypatch.setenv("COLLECTIVES_DEBUG", "INFO")
    with caplog.at_level(logging.INFO, logger="collectives"):
        groups, errors = groups_of(2)
        assert errors == [None, None]
    tables = [r.getMessage() for r in caplog.records if "decision table:" in r.getMessage()
              and "2 ranks over local" in r.getMessage()]
    assert len(tables) == 1, tables
    assert "all_reduce" in tables[0] and "4K-8K" in tables[0] and "tree" in tables[0]
    assert path in tables[0]


def test_auto_costs_a_lookup_once_a_row_exists():
    table = tuning.DecisionTable(2, "local")
    table.algorithm("all_reduce", 4096)
    calls = []
    real = table._decide
    table._decide = lambda *a: calls.append(a) or real(*a)
    for n in (4096, 5000, 8191):
        table.algorithm("all_reduce", n)
    assert calls == []


# -- bench --tune ----------------------------------------------------------------------------------

def record(name, size, rounds, collective="all_reduce", p=4, wrong=0):
    return {"collective": collective, "algorithm": name, "world_size": p, "size": size,
            "time_p50_us": sorted(rounds)[len(rounds) // 2], "round_p50_us": rounds,
            "wrong": wrong}


def test_winners_by_median_over_rounds_beyond_the_noise():
    params = cost.default_params("local")
    rows = [record("ring", 4096, [100, 101, 99]), record("tree", 4096, [150, 149, 151]),
            record("direct", 4096, [500, 20, 20]),           # wins by its median
            record("native", 4096, [1, 1, 1]), record("auto", 4096, [1, 1, 1]),
            record("ring:graph", 4096, [1, 1, 1]), record("tree", 8192, [1, 1, 1], wrong=3),
            record("ring", 8192, [200, 202, 198]), record("direct", 8192, [199, 201, 203])]
    out = fit.decisions_from_records(rows, params)
    (at4k, at8k), = [out["all_reduce", 4]]
    assert at4k["algorithm"] == "direct" and at4k["by"] == "measured"
    assert set(at4k["median_us"]) == {"ring", "tree", "direct"} and at4k["rounds"] == 3
    assert at4k["noise_from"] == "spread over rounds" and at4k["noise"] > 0
    # 200 vs 201: within the noise, 3 rounds (too few to compare round by round) -> the
    # winner at the nearest decided size, direct at 4K, which is among the two
    assert (at8k["algorithm"], at8k["by"]) == ("direct", "neighbour")
    assert set(at8k["median_us"]) == {"ring", "direct"}
    # with nothing decided anywhere: the model's pick among the two
    (alone,), = fit.decisions_from_records(rows[-2:], params).values()
    model = cost.ranking("all_reduce", 4, 8192, params, ["ring", "direct"])[0][1]
    assert (alone["algorithm"], alone["by"]) == (model, "model")


def test_a_gap_beyond_the_noise_of_a_median_is_measured_not_left_to_the_model():
    """Medians over 5 rounds of rows whose rounds spread as five rounds of 17 % noise would
    (``tie_noise``: their quartiles 95 and 105): a 20 % gap is beyond the noise of a median
    (0.172 / sqrt(5) = 7.7 %) and the measurement decides, even where the model prefers the
    slower one. A 5 % gap is within it: where tree was faster in
    every round (the rounds ran interleaved, so each compares like with like) the rounds
    decide; where direct won one round of five (a sign test needs 5 of 5), the winner at the
    nearest decided size does (tree, at 8K)."""
    params = cost.default_params("local")
    spread = [85, 95, 100, 105, 115]                      # (105 - 95) / 1.349 * 2.326
    rows = [record("tree", 4096, spread, p=4),
            record("direct", 4096, [1.2 * t for t in spread], p=4),
            record("tree", 8192, spread, p=4),
            record("direct", 8192, [1.05 * t for t in spread], p=4),
            record("tree", 16384, spread, p=4),
            record("direct", 16384, [84, 99, 105, 110, 125], p=4)]
    (at4k, at8k, at16k), = fit.decisions_from_records(rows, params).values()
    noise = 0.10 / 1.349 * 2.326
    assert at4k["noise"] == pytest.approx(noise, abs=1e-4) and at4k["rounds"] == 5
    assert at4k["noise_from"] == fit.QUARTILES_OVER_ROUNDS
    assert at4k["threshold"] == pytest.approx(noise / 5 ** 0.5, abs=1e-4)
    assert (at4k["algorithm"], at4k["by"]) == ("tree", "measured")
    assert (at8k["algorithm"], at8k["by"]) == ("tree", "rounds")
    assert (at16k["algorithm"], at16k["by"], at16k["neighbour_bytes"]) == \
        ("tree", "neighbour", 8192)


def test_a_tie_goes_to_the_winner_at_the_nearest_decided_size_before_the_model():
    """all_to_all on 8 MPI ranks (a 32-core host): direct won outright at 64K and 1M, tied
    with the bidirectional ring at 256K, where the model prefers the ring (it prices the
    ring's transfers as if the host had bandwidth for every rank at once) and the ring was
    1.09-1.19x slower in both later runs. The nearest decided size (64K: the smaller of two
    at equal distance) gives direct. At 16M the winner next door (direct at 1M) is not among
    the tied, so the model decides; no neighbour's own neighbour counts."""
    params = cost.default_params("mpi")
    noisy = [80, 95, 100, 105, 120]                       # threshold 7.7 % (``tie_noise``)
    flat = [100, 100, 100, 100, 100]
    rows = [record("direct", 64 << 10, noisy, p=8), record("ring_bidirectional", 64 << 10,
                                                            [1.5 * t for t in noisy], p=8),
            record("direct", 256 << 10, [80, 101, 104, 106, 119], p=8),
            record("ring_bidirectional", 256 << 10, [81, 97, 105, 104, 121], p=8),
            record("direct", 1 << 20, noisy, p=8), record("ring_bidirectional", 1 << 20,
                                                          [1.5 * t for t in noisy], p=8),
            record("direct", 16 << 20, [2 * t for t in flat], p=8),
            record("ring", 16 << 20, [82, 93, 104, 103, 125], p=8),  # 2 rounds of 5
            record("ring_bidirectional", 16 << 20, noisy, p=8)]
    for row in rows:
        row["collective"] = "all_to_all"
    (at64k, at256k, at1m, at16m), = fit.decisions_from_records(rows, params).values()
    assert at64k["by"] == at1m["by"] == "measured" and at64k["algorithm"] == "direct"
    model = cost.ranking("all_to_all", 8, 256 << 10, params,
                         ["direct", "ring_bidirectional"])[0][1]
    assert model == "ring_bidirectional"          # what the model alone would have kept
    assert (at256k["algorithm"], at256k["by"]) == ("direct", "neighbour")
    assert at256k["neighbour_bytes"] == 64 << 10 and "tied" not in at256k
    assert at16m["by"] == "model" and at16m["algorithm"] in ("ring", "ring_bidirectional")


@pytest.mark.parametrize("wins,rounds,decides", [(5, 5, True), (4, 5, False), (6, 6, True),
                                                 (7, 8, True), (6, 8, False), (9, 10, True),
                                                 (8, 10, False), (4, 4, False)])
def test_faster_in_rounds_is_a_one_sided_sign_test(wins, rounds, decides):
    mine = [1.0] * rounds
    theirs = [2.0] * wins + [0.5] * (rounds - wins)
    assert fit.faster_in_rounds(mine, theirs) is decides


def test_run_noise_without_rounds_comes_from_auto_and_its_choice():
    rows = [{"collective": "all_reduce", "algorithm": "ring", "world_size": 2, "size": 64,
             "time_p50_us": 100.0},
            {"collective": "all_reduce", "algorithm": "auto", "chosen": "ring", "world_size": 2,
             "size": 64, "time_p50_us": 110.0}]
    noise, how = fit.run_noise(rows)
    assert noise == pytest.approx(0.1) and how == "auto row vs its choice's row"
    assert fit.run_noise(rows[:1]) == (0.0, "none measured")


def test_bench_tune_writes_the_table_a_group_then_reads(tmp_path, monkeypatch):
    from test_bench import TINY, bench, ok
    path, out = tmp_path / "tuning.json", tmp_path / "run.json"
    result = ok(bench("--backend", "local", "--world-size", "2", "--sizes", "4K,64K",
                      "--collectives", "all_reduce", "--algorithms", "ring,tree,direct",
                      "--rounds", "2", "--tune", str(path), "--json", str(out), *TINY))
    assert f"-> {path}" in result.stdout and "decisions" in result.stdout
    entry = json.loads(path.read_text())["local"]
    rows = entry["decisions"]["all_reduce"]["2"]
    assert [r["bytes"] for r in rows] == [4 * KIB, 64 * KIB]
    for row in rows:
        assert set(row["median_us"]) == {"ring", "tree", "direct"} and row["rounds"] == 2
        assert row["by"] in ("measured", "rounds", "neighbour", "model")
    monkeypatch.setenv("COLLECTIVES_TUNING", str(path))
    groups, errors = groups_of(2)
    assert errors == [None, None]
    for row in rows:
        assert groups[0].resolve_algorithm("all_reduce", None, row["bytes"]) == row["algorithm"]
    # tune show prints it
    shown = subprocess.run([sys.executable, "-m", "collectives", "tune", "show", str(path)],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    lines = [line for line in shown.stdout.splitlines() if line.strip().startswith("all_reduce")]
    assert len(lines) == 2 and all(r["algorithm"] in l for r, l in zip(rows, lines))


def test_tune_show_refuses_bad_files(tmp_path):
    (tmp_path / "bad.json").write_text("[1, 2]")
    for target in ("bad.json", "missing.json"):
        shown = subprocess.run([sys.executable, "-m", "collectives", "tune", "show",
                                str(tmp_path / target)], capture_output=True, text=True,
                               timeout=60)
        assert shown.returncode == 2 and "tune show:" in shown.stderr


def test_save_keeps_other_world_sizes_and_drops_nothing_it_can_read_back(tmp_path):
    path = str(tmp_path / "t.json")
    params = cost.default_params("local")
    first = {("all_reduce", 2): [{"bytes": 64, "algorithm": "ring", "by": "measured"}]}
    second = {("all_reduce", 4): [{"bytes": 64, "algorithm": "tree", "by": "measured"}]}
    tuning.save(path, "local", params, first)
    tuning.save(path, "local", params, second)
    data = json.loads(open(path).read())["local"]["decisions"]["all_reduce"]
    assert set(data) == {"2", "4"}
    with pytest.raises(ValueError, match="algorithm one of"):
        tuning.save(path, "local", params,
                    {("all_reduce", 8): [{"bytes": 64, "algorithm": "fast"}]})


def test_groups_on_peer_memory_rank_with_peer_memory_s_model_and_a_file_still_wins(tmp_path):
    """An nccl group whose plans run on peer memory (``model_name`` nccl_peer) ranks them with
    that medium's defaults, not NCCL send/recv's (a group call's 20 µs a step and 30 µs a
    launched reduction made untuned auto pick recursive doubling for reduce_scatter at every
    size on 4 x H100, 1.07-1.37x slower than direct); calibrated parameters in a tuning
    file's nccl entry win over either; the model takes part in the digest."""
    peer = tuning.DecisionTable(4, "nccl", model="nccl_peer")
    sendrecv = tuning.DecisionTable(4, "nccl")
    assert peer.params == cost.DEFAULTS["nccl_peer"]
    assert sendrecv.params == cost.DEFAULTS["nccl"] and peer.hash != sendrecv.hash
    for nbytes in (4096, 1 << 20, 16 << 20, 1 << 30):
        assert peer.algorithm("reduce_scatter", nbytes) == "direct"
        assert sendrecv.algorithm("reduce_scatter", nbytes) == "recursive_doubling"
    # all_reduce: direct while a step's cost decides, then two_shot (whose large calls the
    # pipelined kernel runs); on 2 ranks recursive doubling, which is two_shot's schedule there
    assert [peer.algorithm("all_reduce", n) for n in (4096, 65536, 1 << 20, 1 << 30)] == \
        ["direct", "direct", "two_shot", "two_shot"]
    two = tuning.DecisionTable(2, "nccl", model="nccl_peer")
    assert two.algorithm("all_reduce", 1 << 30) in ("two_shot", "recursive_doubling")
    path = tmp_path / "tuning.json"
    calibrated = cost.Params(alpha=7e-6, beta=1 / 9e10, gamma=1 / 9e11)
    cost.save_params(str(path), "nccl", calibrated)
    assert tuning.DecisionTable(4, "nccl", tuning=str(path), model="nccl_peer").params == \
        calibrated


def test_a_group_s_executor_names_its_model_by_where_its_plans_run(monkeypatch):
    """The executor the group chose says which cost model ranks its schedules and why peer
    memory is used or not; the transport is asked nothing of it."""
    from types import SimpleNamespace
    from collectives import executors
    from collectives.executors import nccl, peer
    transport = SimpleNamespace(name="nccl", rank=0, offers=frozenset({"stream", "peer_memory"}))
    monkeypatch.setenv("COLLECTIVES_GPU_PATH", "nccl")
    chosen = executors.select(transport)
    assert (chosen.execute, chosen.model_name, chosen.peer) == (nccl.execute, "nccl", None)
    assert chosen.peer_path == "off (COLLECTIVES_GPU_PATH=nccl)" and chosen.agreed is None
    on_peer = peer.PeerExecutor.__new__(peer.PeerExecutor)
    on_peer.agreed = {"COLLECTIVES_PEER_BLOCKS": 8}
    monkeypatch.setattr(peer, "make_executor", lambda t: (on_peer, "2 GPUs of one host"))
    chosen = executors.select(transport)
    assert (chosen.execute, chosen.model_name, chosen.peer) == (on_peer, "nccl_peer", on_peer)
    assert chosen.peer_path == "2 GPUs of one host" and chosen.agreed == on_peer.agreed
    assert vars(transport).keys() == {"name", "rank", "offers"}     # nothing pinned on it
    table = tuning.DecisionTable.for_group(4, SimpleNamespace(name="nccl", native=None,
                                                              xp=None), chosen)
    assert table.params == cost.DEFAULTS["nccl_peer"]
