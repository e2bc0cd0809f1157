"""The benchmark suite's CLI: local backend, JSON/CSV/plot output, the model columns, auto rows,
--calibrate, --simulate, and the socket backend launching its own two processes (with torch's
gloo as the baseline when torch is installed). Every run is tiny: a few rows, a few
iterations; each test takes seconds."""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench.py")
TINY = ["--iters", "2", "--warmup", "1", "--no-progress"]

# the documented record fields (collectives/bench.py's module text)
FIELDS = {"collective", "algorithm", "chosen", "backend", "world_size", "size", "count",
          "dtype", "op", "iters", "time_p50_us", "time_p99_us", "algbw_gbs", "busbw_gbs",
          "ratio_to_native", "native_name", "predicted_us", "model_error", "wrong"}


def bench(*args, timeout=60, env=None):
    full = dict(os.environ, PYTHONPATH=ROOT)
    for name in ("COLLECTIVES_ALGORITHM", "COLLECTIVES_TUNING", "RANK", "WORLD_SIZE"):
        full.pop(name, None)
    full.update(env or {})
    return subprocess.run([sys.executable, BENCH, *args], capture_output=True, text=True,
                          timeout=timeout, env=full, cwd=ROOT)


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_local_json_schema_model_and_auto(tmp_path):
    out = tmp_path / "b.json"
    result = ok(bench("--backend", "local", "--world-size", "3", "--sizes", "4K,64K",
                      "--collectives", "all_reduce,all_gather", "--json", str(out), *TINY))
    data = json.loads(out.read_text())
    records = data["records"]
    assert data["meta"]["backend"] == "local" and data["meta"]["world_size"] == 3
    assert records and all(set(r) >= FIELDS for r in records)
    # ring, tree, recursive_doubling and auto at each of 2 sizes for 2 collectives; no native
    assert len(records) == 2 * 2 * 4
    assert all(r["wrong"] == 0 and r["ratio_to_native"] is None for r in records)
    for r in records:
        assert r["predicted_us"] > 0 and r["model_error"] == pytest.approx(
            r["time_p50_us"] / r["predicted_us"])
    autos = [r for r in records if r["algorithm"] == "auto"]
    assert len(autos) == 4
    from collectives.algorithms import capabilities
    assert all(a["chosen"] in capabilities()[a["collective"]] for a in autos)
    assert all(r["chosen"] == r["algorithm"] for r in records if r["algorithm"] != "auto")
    # auto's line in the table names its pick; the summary compares auto with the best
    assert "auto:" in result.stdout and "auto time / best measured" in result.stdout
    summary = data["summary"]["all_reduce"]
    assert all(b["auto_vs_best"] > 0 and b["best"] != "auto" for b in summary["best"])
    assert summary["model_error"]["min"] <= summary["model_error"]["max"]


def test_local_csv(tmp_path):
    out = tmp_path / "b.csv"
    ok(bench("--backend", "local", "--world-size", "2", "--sizes", "1K", "--collectives",
             "reduce_scatter", "--algorithms", "ring,auto", "--csv", str(out), *TINY))
    rows = list(csv.DictReader(out.open()))
    assert [r["algorithm"] for r in rows] == ["ring", "auto"]
    assert set(rows[0]) >= FIELDS
    from collectives.algorithms import capabilities
    assert rows[1]["chosen"] in capabilities()["reduce_scatter"]
    assert float(rows[0]["predicted_us"]) > 0 and rows[0]["wrong"] == "0"


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "b.png"
    ok(bench("--backend", "local", "--world-size", "2", "--sizes", "1K,16K", "--collectives",
             "all_reduce,all_gather", "--plot", str(out), *TINY))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_predicts_and_verifies(tmp_path):
    out = tmp_path / "sim.json"
    result = ok(bench("--simulate", "64", "--backend", "socket", "--sizes", "4K,16M",
                      "--collectives", "all_reduce,all_gather", "--json", str(out)))
    assert "verification took" in result.stdout and "0 failed" in result.stdout
    data = json.loads(out.read_text())
    rows = data["records"]
    assert {r["world_size"] for r in rows} == {64} and len(rows) == 2 * 2 * 3
    for collective in ("all_reduce", "all_gather"):
        for size in {r["size"] for r in rows if r["collective"] == collective}:
            at = [r for r in rows if r["collective"] == collective and r["size"] == size]
            best = [r for r in at if r["best"]]
            assert len(best) == 1
            assert best[0]["predicted_us"] == min(r["predicted_us"] for r in at)
    assert all(v["status"] == "ok" for v in data["verification"])
    assert len(data["verification"]) == 2 * 3


def test_simulate_skips_what_exceeds_the_budget():
    result = ok(bench("--simulate", "128", "--sizes", "4K", "--collectives", "all_reduce",
                      "--verify-seconds", "0"))
    assert result.stdout.count("skipped: ~") == 3 and "3 skipped" in result.stdout


def test_calibrate_saves_and_uses_the_fit(tmp_path):
    tuning = tmp_path / "tuning.json"
    out = tmp_path / "b.json"
    result = ok(bench("--backend", "local", "--world-size", "2", "--calibrate", str(tuning),
                      "--sizes", "4K", "--collectives", "all_reduce", "--algorithms", "ring",
                      "--json", str(out), *TINY))
    saved = json.loads(tuning.read_text())["local"]
    assert set(saved) == {"alpha", "beta", "gamma"} and all(v >= 0 for v in saved.values())
    assert f"# calibrated local: alpha {saved['alpha'] * 1e6:.2f} us" in result.stdout
    assert str(tuning) in result.stdout
    # the sweep after calibration predicts with the fitted parameters
    from collectives.algorithms import cost
    record = json.loads(out.read_text())["records"][0]
    fitted = cost.Params(**saved)
    assert record["predicted_us"] == pytest.approx(
        cost.estimate("all_reduce", "ring", 2, record["size"], fitted) * 1e6)


def test_tuning_file_must_be_readable(tmp_path):
    result = bench("--backend", "local", "--world-size", "2", "--tuning",
                   str(tmp_path / "missing.json"), *TINY)
    assert result.returncode == 2 and "cannot read the tuning file" in result.stderr


def test_simulate_refuses_calibrate(tmp_path):
    result = bench("--simulate", "8", "--calibrate", str(tmp_path / "t.json"))
    assert result.returncode == 2 and "--tuning" in result.stderr


def test_socket_launches_its_own_ranks(tmp_path):
    out = tmp_path / "s.json"
    result = ok(bench("--backend", "socket", "--world-size", "2", "--sizes", "4K",
                      "--collectives", "all_reduce,all_gather", "--json", str(out), *TINY,
                      timeout=90))
    assert "[rank 0]:" not in result.stdout        # rank 0's lines pass through unprefixed
    data = json.loads(out.read_text())
    records = data["records"]
    assert data["meta"]["backend"] == "socket" and data["meta"]["world_size"] == 2
    assert all(r["wrong"] == 0 and r["world_size"] == 2 for r in records)
    natives = [r for r in records if r["algorithm"] == "native"]
    try:
        import torch.distributed as tdist
        have_gloo = tdist.is_available() and tdist.is_gloo_available()
    except ImportError:
        have_gloo = False
    if have_gloo:
        assert len(natives) == 2 and all(r["native_name"] == "gloo" for r in natives)
        assert "native:gloo" in result.stdout
        assert all(r["ratio_to_native"] > 0 for r in records)
    else:
        assert not natives and "no baseline column" in result.stdout


def test_socket_without_torch_says_there_is_no_baseline(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('torch hidden by the test')\n")
    result = ok(bench("--backend", "socket", "--world-size", "2", "--sizes", "1K",
                      "--collectives", "all_reduce", "--algorithms", "ring,native", *TINY,
                      env={"PYTHONPATH": os.pathsep.join([ROOT, str(fake.parent)])},
                      timeout=90))
    assert "no baseline column: torch is not importable" in result.stdout
    rows = [line.split() for line in result.stdout.split("# all_reduce", 1)[1].splitlines()
            if line.strip() and not line.startswith("#")]
    assert [row[4] for row in rows] == ["ring"]         # no native row, ring still runs


def test_rounds_interleave_and_pool_iterations(tmp_path):
    """--rounds 3: every row ran 3 times (its iterations pooled: 3 x --iters), the algorithms
    of a size in a rotated order each round, the output has the same rows and fields as one
    round (no raw times), and a bad value is a clear error."""
    out = tmp_path / "r.json"
    ok(bench("--backend", "local", "--world-size", "2", "--sizes", "4K,16K",
             "--collectives", "all_reduce", "--algorithms", "ring,tree,recursive_doubling",
             "--rounds", "3", "--json", str(out), *TINY))
    records = json.loads(out.read_text())["records"]
    assert [(r["size"], r["algorithm"]) for r in records] == [
        (s, a) for s in (4096, 16384) for a in ("ring", "tree", "recursive_doubling")]
    assert all(r["iters"] == 3 * 2 and r["rounds"] == 3 and r["wrong"] == 0 for r in records)
    assert all(set(r) >= FIELDS and "times" not in r for r in records)
    # each round's own p50 is kept; the pooled p50 lies within their range
    for r in records:
        assert len(r["round_p50_us"]) == 3
        assert min(r["round_p50_us"]) <= r["time_p50_us"] <= max(r["round_p50_us"])
    bad = bench("--backend", "local", "--world-size", "2", "--rounds", "0", *TINY)
    assert bad.returncode != 0 and "--rounds must be a positive integer" in bad.stderr


def test_rounds_rotate_the_order_of_a_sizes_algorithms(monkeypatch):
    from collectives import bench as suite
    from collectives.bench import sweep
    from collectives.transports.local import LocalWorld
    from collectives.group import ProcessGroup
    calls = []
    real = sweep.measure

    def spy(entry, *rest):
        calls.append(entry.algorithm)
        return real(entry, *rest)
    monkeypatch.setattr(sweep, "measure", spy)
    world = LocalWorld(1)
    group = ProcessGroup(world.transport(0), backend="local")
    config = suite.Config(collectives=("all_reduce",), algorithms=("ring", "tree", "direct"),
                          sizes=(4096,), iters=1, warmup=1, rounds=3)
    records = suite.bench_rank(group, config)
    assert calls == ["ring", "tree", "direct", "tree", "direct", "ring",
                     "direct", "ring", "tree"]
    assert [r["algorithm"] for r in records] == ["ring", "tree", "direct"]


def test_summary_judges_autos_choice_by_its_own_row():
    """auto ran recursive doubling; that schedule's own row is within 10% of the best (ring)
    though the auto row itself measured slower: the summary gives both, and their quotient
    (one schedule measured twice) as the run's noise. A verdict on "within 10%" is printed
    only where the gap to 1.10 is larger than that noise."""
    from collectives.bench import format_summary, summarize

    def row(algorithm, us, chosen=None):
        return {"collective": "all_reduce", "algorithm": algorithm, "size": 4096,
                "time_p50_us": us, "busbw_gbs": 1.0 / us, "ratio_to_native": None,
                "chosen": chosen or algorithm}
    records = [row("ring", 100.0), row("recursive_doubling", 105.0),
               row("auto", 120.0, chosen="recursive_doubling")]
    best = summarize(records)["all_reduce"]["best"][0]
    assert best["best"] == "ring" and best["auto_vs_best"] == pytest.approx(1.20)
    assert best["pick_vs_best"] == pytest.approx(1.05)
    assert best["auto_vs_pick"] == pytest.approx(120 / 105)
    text = format_summary(summarize(records))
    # one schedule measured twice differs by 14%: neither 1.20 nor 1.05 is decided by it
    assert "noise: 14.3%, auto row vs its choice's row" in text
    assert "worst 1.20 (the noise, 14%, is larger than the gap to 1.10: no verdict)" in text
    assert ("auto's choice, by its own row / best measured: worst 1.05 (the noise, 14%, is "
            "larger than the gap to 1.10: no verdict)") in text
    assert "auto row / that row 1.14 .. 1.14" in text
    assert "4K: ring~recursive_doubling" in text
    assert "ring vs recursive_doubling: tie (within the noise) at 4K" in text
    # rounds that agree within 2%: the same rows earn their verdicts
    for r in records:
        r["round_p50_us"] = [r["time_p50_us"], r["time_p50_us"] * 1.02]
    text = format_summary(summarize(records))
    assert "noise: 2.0%, spread over rounds" in text
    assert "worst 1.20 (NOT within 10%)" in text
    assert "auto's choice, by its own row / best measured: worst 1.05 (within 10%)" in text
    assert "all_reduce: 4K: ring\n" in text and "ring vs recursive_doubling: ring faster at 4K" in text


def test_summary_names_the_best_row_with_a_symmetric_output():
    """<alg>:symm rows (bench.nccl) are not among "ours" (a variant, like :sendrecv), but the
    summary gives their best per size on a line of its own, with its ratio to native."""
    from collectives.bench import format_summary, summarize

    def row(algorithm, us):
        return {"collective": "all_reduce", "algorithm": algorithm, "size": 1 << 24,
                "time_p50_us": us, "busbw_gbs": 1.0 / us, "ratio_to_native": 100.0 / us,
                "chosen": algorithm.partition(":")[0]}
    records = [row("native", 100.0), row("two_shot", 105.0), row("two_shot:symm", 93.0),
               row("ring:symm", 120.0)]
    best = summarize(records)["all_reduce"]["best"][0]
    assert best["best"] == "two_shot"
    assert best["symmetric"] == {"best": "two_shot", "ratio_to_native": pytest.approx(100 / 93)}
    text = format_summary(summarize(records))
    assert "#  all_reduce: 16M: two_shot 0.95x" in text
    assert "#    with the output in symmetric memory: 16M: two_shot 1.08x" in text
    assert "symmetric memory" not in format_summary(summarize(records[:2]))


def test_each_side_meets_at_its_own_barrier_over_sockets():
    """Over sockets our rows synchronize with our barrier and gloo's rows with gloo's; under
    MPI (the native library is the transport) every row uses the native barrier."""
    from types import SimpleNamespace

    from collectives.bench import row_barrier as _row_barrier

    def group(transport_name):
        calls = []
        native = SimpleNamespace(name="gloo" if transport_name == "socket" else "MPI")
        g = SimpleNamespace(transport=SimpleNamespace(name=transport_name, native=native),
                            calls=calls)
        g.prepare = lambda collective, algorithm=None: (
            lambda: calls.append((collective, algorithm)))
        return g

    for transport, ours, theirs in (("socket", None, "native"), ("mpi", "native", "native")):
        g = group(transport)
        _row_barrier(g, "ring")()
        _row_barrier(g, "native")()
        assert g.calls == [("barrier", ours), ("barrier", theirs)], transport


def test_auto_table_takes_medians_over_rounds(tmp_path):
    """``benchmarks/tables.py --auto``: auto's time over the best measured algorithm's at each
    size, each the median of its rounds (a slow round of one row does not decide), with the
    geometric mean and the worst; baselines, labelled variants and wrong rows are no
    candidates."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("tables", os.path.join(ROOT, "benchmarks",
                                                                         "tables.py"))
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)

    def row(algorithm, size, rounds, **extra):
        return {"collective": "all_reduce", "algorithm": algorithm, "size": size,
                "round_p50_us": rounds, "time_p50_us": sum(rounds) / len(rounds),
                "rounds": len(rounds), "wrong": 0, **extra}
    records = [row("native", 4096, [10, 10, 10]),
               row("ring", 4096, [100, 100, 900]),          # median 100 despite one slow round
               row("tree", 4096, [120, 120, 120]),
               row("ring:sendrecv", 4096, [50, 50, 50]),
               row("auto", 4096, [110, 110, 110], chosen="tree"),
               row("ring", 65536, [200, 200, 200]),
               row("tree", 65536, [100, 100, 100], wrong=3),
               row("auto", 65536, [200, 200, 200], chosen="ring")]
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"meta": {"backend": "socket", "world_size": 2},
                                "records": records}))
    text = tables.auto_table(str(path))
    assert "| all_reduce | 1.10 (tree / ring) | 1.00 (ring) |" in text
    assert "geometric mean 1.049, worst 1.10, 2/2 sizes within 1.10" in text
    assert "held out" not in text                   # fewer than 4 rounds


def test_auto_table_held_out_removes_the_luck_of_the_best():
    """Six rows of one schedule and auto's row, all measured with the same noise: the best of
    the six medians is the luckiest, so auto looks slower than "the best" by the noise alone.
    Picking the best on half the rounds and timing it on the other half removes that bias."""
    import importlib.util
    import math
    spec = importlib.util.spec_from_file_location("tables", os.path.join(ROOT, "benchmarks",
                                                                         "tables.py"))
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    rng = np.random.default_rng(7)
    plain, held = [], []
    for _ in range(300):
        row = {name: {"round_p50_us": list(100 * np.exp(rng.normal(0, 0.2, 10)))}
               for name in ("a", "b", "c", "d", "e", "f", "auto")}
        medians = {n: tables._median(r["round_p50_us"]) for n, r in row.items()}
        plain.append(math.log(medians["auto"] / min(v for n, v in medians.items()
                                                    if n != "auto")))
        held.append(math.log(tables._held_out(row)))
    assert math.exp(np.mean(plain)) > 1.08            # the luck of the best of six
    assert abs(math.exp(np.mean(held)) - 1.0) < 0.03
    row = {n: {"round_p50_us": [1.0, 2.0, 3.0]} for n in ("a", "auto")}
    assert tables._held_out(row) is None               # fewer than 4 rounds


def test_summary_gives_symmetric_memorys_best_over_ours_where_the_run_has_its_rows():
    """The anchor of the GPU rows: torch SymmetricMemory's faster all_reduce row over our
    fastest, with or without symmetric memory (two_shot:symm_in_place counts as ours); no
    line where the run has no SymmetricMemory rows."""
    from collectives.bench import format_summary, summarize

    def row(algorithm, size, us):
        return {"collective": "all_reduce", "algorithm": algorithm, "size": size,
                "time_p50_us": us, "busbw_gbs": size / us, "ratio_to_native": None,
                "chosen": algorithm.partition(":")[0]}
    records = [row("direct", 4096, 10.0), row("direct:symm", 4096, 9.0),
               row("symm_mem:one_shot", 4096, 12.0), row("symm_mem:two_shot", 4096, 9.9),
               row("two_shot", 1 << 22, 36.0), row("two_shot:symm_in_place", 1 << 22, 31.0),
               row("symm_mem:two_shot", 1 << 22, 31.0)]
    best = summarize(records)["all_reduce"]["best"]
    assert [b["anchor"] for b in best] == [pytest.approx(9.9 / 9.0), pytest.approx(1.0)]
    assert "SymmetricMemory's best / ours (above 1: ours faster): 4K: 1.10; 4M: 1.00" in \
        format_summary(summarize(records))
    plain = [r for r in records if not r["algorithm"].startswith("symm_mem")]
    assert "SymmetricMemory" not in format_summary(summarize(plain))


def test_summary_crosses_each_algorithm_at_its_best_form_measured_and_predicted():
    """Ring against tree compares the best form of each (the pipelined trees are the tree's,
    the bidirectional ring the ring's), measured and as the model predicts; the summary names
    the forms that won."""
    from collectives.bench import format_summary, summarize

    def row(algorithm, size, us, predicted):
        return {"collective": "all_reduce", "algorithm": algorithm, "size": size,
                "time_p50_us": us, "busbw_gbs": size / us, "ratio_to_native": None,
                "chosen": algorithm, "predicted_us": predicted}
    small, large = 4096, 1 << 24
    records = [row("ring", small, 100.0, 90.0), row("ring", large, 1000.0, 900.0),
               row("tree", small, 50.0, 60.0), row("tree", large, 4000.0, 3000.0),
               row("double_binary_tree", small, 80.0, 70.0),
               row("double_binary_tree", large, 1100.0, 800.0),
               row("recursive_doubling", small, 40.0, 50.0),
               row("recursive_doubling", large, 2000.0, 1500.0)]
    c = summarize(records)["all_reduce"]["crossings"]
    assert set(c) == {"ring vs tree", "ring vs recursive_doubling", "tree vs recursive_doubling"}
    # measured: the unpipelined tree wins small, the double binary tree is the tree at 16M,
    # still behind ring; the model has the double binary tree ahead at 16M
    assert c["ring vs tree"]["text"] == "tree faster at 4K; ring faster at 16M (crosses at 16M)"
    assert c["ring vs tree"]["predicted"]["text"] == "tree faster at 4K-16M"
    assert c["ring vs tree"]["forms"] == {"tree 16M": "double_binary_tree"}
    assert c["tree vs recursive_doubling"]["crosses_at"] == [large]
    text = format_summary(summarize(records))
    assert ("ring vs tree: tree faster at 4K; ring faster at 16M (crosses at 16M); the model: "
            "tree faster at 4K-16M") in text
    assert "best forms: tree 16M double_binary_tree" in text
