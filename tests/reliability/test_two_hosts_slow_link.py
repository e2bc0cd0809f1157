"""Flat and hierarchical collectives on two "hosts" joined by a slow link: the tiny run of
``benchmarks/two_hosts.py`` (two network namespaces, a veth pair shaped by tc to 1 Gbit/s,
2 x 4 ranks under ``collectives.run --nnodes 2``, ``COLLECTIVES_TOPOLOGY=2x4``; the bench at
64 KiB and 1 MiB, one round). Every result is checked by the bench; here: the job completes,
nothing is wrong, all four collectives ran flat and hierarchical rows, each priced by the
two-level model, and auto ran too.

Needs root and iproute2 (``ip``, ``tc``); otherwise skipped with the reason. About 20 s on
2 cores; killed after 240 s."""
import json
import os
import subprocess
import sys

import pytest

from repo import ROOT, child_env

pytestmark = pytest.mark.slow

SCRIPT = os.path.join(ROOT, "benchmarks", "two_hosts.py")
SKIPPED = 77
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def test_flat_and_hierarchical_over_a_slow_link(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run as root, as CI does)")
    env = child_env({"PYTHONUNBUFFERED": "1"})
    for name in ("COLLECTIVES_ALGORITHM", "COLLECTIVES_TOPOLOGY", "COLLECTIVES_TUNING"):
        env.pop(name, None)
    try:
        done = subprocess.run([sys.executable, SCRIPT, "--tiny", "--out", str(tmp_path)],
                              env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"two_hosts.py --tiny hung: {exc.stdout!r:.2000} {exc.stderr!r:.2000}")
    if done.returncode == SKIPPED:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    summary = json.loads((tmp_path / "two_hosts.json").read_text())
    assert summary["wrong"] == 0
    assert summary["topology"] == "2x4"
    rows = summary["rows"]
    assert sorted({(r["collective"], r["bytes"]) for r in rows}) == \
        sorted((c, n) for c in COLLECTIVES for n in (64 << 10, 1 << 20))
    for row in rows:
        names = set(row["measured_us"])
        assert {"ring", "tree"} <= names and "auto" in names, row
        assert any(n.startswith("hierarchical:") for n in names), row
        assert row["speedup"] is not None, row
        # every row but auto's is priced by the two-level model (flat ones too)
        assert all(row["predicted_us"][n] for n in names if n != "auto"), row
    print("\n" + (tmp_path / "report.md").read_text())
