"""The benchmarks a torch user reads, on CPU ranks: ``ddp.py`` timing a DDP and an FSDP2
training step on our backend beside gloo (and refusing DDP's bucket size for FSDP2), and
``torch_door.py`` timing collectives through ``torch.distributed`` on both backends under the
launcher, its records' fields, and its check catching a wrong result. Every run is tiny: two
ranks, a small model or one or two sizes, one round."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="gloo, the native baseline on CPUs, is not built")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DDP = os.path.join(ROOT, "benchmarks", "ddp.py")
DOOR = os.path.join(ROOT, "benchmarks", "torch_door.py")
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK",
                 "COLLECTIVES_ALGORITHM", "COLLECTIVES_TUNING")
SMALL_MODEL = ["--layers", "2", "--width", "128", "--batch", "8", "--rounds", "1",
               "--steps", "2", "--warmup", "1"]
LAUNCH = [sys.executable, "-m", "collectives.run", "--standalone", "--nproc-per-node", "2"]


def run(command, timeout=90):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env["PYTHONPATH"] = ROOT
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=ROOT)


def ok(result):
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_ddp_py_times_each_wrapping_on_both_backends_and_checks_the_parameters(tmp_path, wrap):
    out = tmp_path / "step.json"
    result = ok(run([sys.executable, DDP, "--nproc", "2", "--wrap", wrap, *SMALL_MODEL,
                     "--json", str(out)]))
    assert f"{wrap.upper()} training step, 2 ranks on cpu" in result.stdout
    assert ("buckets 25 MiB" if wrap == "ddp" else "fully_shard per Linear") in result.stdout
    assert "ratio collectives/gloo" in result.stdout
    assert "collectives vs gloo: max |diff|" in result.stdout and ": ok" in result.stdout
    record = json.loads(out.read_text())
    assert record["benchmark"] == wrap and record["wrap"] == wrap
    assert record["world_size"] == 2 and record["device"] == "cpu"
    assert set(record["summary"]) == {"collectives", "gloo"} and len(record["ratios"]) == 1
    assert all(len(rounds) == 1 and len(rounds[0]) == 2
               for rounds in record["times_ms"].values())
    check = record["check"]
    assert check["ok"] and check["max_param_diff"] <= check["tolerance"]
    assert check["max_param_change"] > 0             # training moved the parameters


def test_ddp_py_refuses_a_bucket_size_for_fsdp2():
    result = run([sys.executable, DDP, "--nproc", "2", "--wrap", "fsdp2", "--bucket-mb", "1"])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "--bucket-mb sets DDP's buckets; FSDP2 has none" in result.stderr


def test_torch_door_times_both_backends_through_torch_distributed(tmp_path):
    out = tmp_path / "door.json"
    result = ok(run([*LAUNCH, DOOR, "--device", "cpu", "--sizes", "4K,64K", "--rounds", "1",
                     "--iters", "3", "--warmup", "1", "--json", str(out)]))
    assert "through torch.distributed" in result.stdout and "results: all correct" in result.stdout
    data = json.loads(out.read_text())
    meta, records = data["meta"], data["records"]
    assert meta["benchmark"] == "torch_door" and meta["world_size"] == 2
    assert meta["ours"] == "collectives" and meta["native"] == "gloo"
    assert meta["clocks"] == ["host"] and set(meta["noise"]) == {"host"}
    assert sorted((r["collective"], r["size"]) for r in records) == sorted(
        (c, s) for c in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
        for s in (4096, 65536))
    for r in records:
        assert r["wrong"] == {"collectives": 0, "gloo": 0} and r["iters"] == 3
        host = r["host"]
        assert set(host["us"]) == {"collectives", "gloo"} and all(v > 0 for v in
                                                                   host["us"].values())
        assert len(host["ratios"]) == 1 and host["ratio"] == pytest.approx(
            host["us"]["collectives"] / host["us"]["gloo"])


def test_torch_door_fails_on_a_wrong_result(tmp_path):
    """Our backend's all_reduce made to add one to its first element: the check counts it on
    every rank, the row says so, and the run exits 1."""
    wrapper = tmp_path / "broken_door.py"
    wrapper.write_text(
        "import runpy, sys\n"
        "import torch.distributed as dist\n"
        "real = dist.all_reduce\n"
        "def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):\n"
        "    work = real(tensor, op=op, group=group, async_op=async_op)\n"
        "    if group is None or group is dist.group.WORLD:\n"
        "        tensor.view(-1)[0] += 1\n"
        "    return work\n"
        "dist.all_reduce = all_reduce\n"
        f"sys.argv[0] = {DOOR!r}\n"
        f"runpy.run_path({DOOR!r}, run_name='__main__')\n")
    out = tmp_path / "door.json"
    result = run([*LAUNCH, str(wrapper), "--sizes", "4K", "--collectives", "all_reduce",
                  "--rounds", "1", "--iters", "2", "--warmup", "0", "--json", str(out)])
    assert result.returncode == 1, result.stdout + result.stderr
    assert "WRONG in 1 rows: all_reduce 4K" in result.stdout
    (record,) = json.loads(out.read_text())["records"]
    assert record["wrong"] == {"collectives": 2, "gloo": 0}      # one element on each rank
