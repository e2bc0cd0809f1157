"""torch's own distributed test suite on our torch backend, in CI: the "quick" selection
(30 tests: every kind of collective, sparse all_reduce, the barrier timeout, p2p with tags and
any source, groups, objects, DDP with buckets, no_sync, a comm hook and a static graph) passes
on "collectives" at world size 3.

The tests are torch's (``DistributedTest._DistTestBase`` from
``torch/testing/_internal/distributed/distributed_test.py``, shipped in the wheel), driven as
torch's ``test/distributed/test_distributed_spawn.py`` drives them (tests/processes/torch_suite/run.py
says how and why it forks ranks, and why torch's import-time gates are decided as for gloo).
The selections, the known failures of our backend (with reasons) and the tests of gloo-only
features are in tests/processes/torch_suite/selection.py. Every quick test is one of the "ci"
selection's 87, each of which passes on gloo at this world size; CI runs ours alone (about
25 s on 2 cores, the budget CI has for it). The comparison with gloo, by hand (about 2
minutes for "ci"; the whole suite, most of which skips without GPUs, longer):

    .venv/bin/python tests/processes/torch_suite/compare.py --selection ci --world-size 3
    .venv/bin/python tests/processes/torch_suite/compare.py --selection full --world-size 3
    # torch's tests of [1, 2] subgroups (test_*_group_*) skip below 8 ranks:
    .venv/bin/python tests/processes/torch_suite/compare.py --selection full --world-size 8

It prints passed/failed/skipped per backend, the known failures, and every test that passes
on gloo and not on ours (exit status 1 if any); ``--keep DIR`` keeps the JSON reports and logs.
torch's suite needs ``expecttest`` (a test dependency of torch, in our ``test`` extra).
"""
import importlib.util
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest", reason="torch's test suite imports expecttest")
if importlib.util.find_spec("torch.testing._internal.distributed.distributed_test") is None:
    pytest.skip("this torch ships no distributed test suite", allow_module_level=True)
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_suite"))
import compare  # noqa: E402
import selection  # noqa: E402

WORLD_SIZE = 3          # torch's own CI runs this suite on gloo at 3 ranks without GPUs
RUN_LIMIT = 180         # seconds for the run (about 25 s here); past it, killed: failure
PER_TEST = 60           # seconds per test in torch's harness; past it, that test fails


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """The quick selection's report on our backend."""
    out = tmp_path_factory.mktemp("torch_suite")
    try:
        return compare.run_backend("collectives", WORLD_SIZE, "quick", str(out),
                                   timeout=RUN_LIMIT, per_test=PER_TEST)
    except compare.RunFailed as exc:
        pytest.fail(str(exc))


def _listing(items):
    return "\n".join(f"  {name}: {why}" for name, why in sorted(items.items()))


def test_quick_selection_passes_on_ours(ours):
    got = ours["tests"]
    bad = {name: f"{got[name]['outcome']}: {got[name]['error']}" if name in got else
           "missing: not run"
           for name in selection.QUICK
           if name not in selection.KNOWN_FAILURES
           and got.get(name, {}).get("outcome") != "passed"}
    assert not bad, (f"{len(bad)} of torch's tests (each passes on gloo) do not pass on "
                     f"collectives (world size {WORLD_SIZE}):\n{_listing(bad)}")


def test_quick_selection_is_of_the_ci_selection():
    """Every quick test is one the "ci" selection compares with gloo (so each passes there)."""
    assert set(selection.QUICK) <= set(selection.CI) and len(set(selection.QUICK)) == 30


def test_known_failures_fail_as_described(ours):
    """Each known failure of the quick selection fails for the reason written down (and one
    that passes now should leave selection.KNOWN_FAILURES)."""
    other = {}
    for name, reason in selection.KNOWN_FAILURES.items():
        rec = ours["tests"].get(name)
        if rec is None:
            continue
        if rec["outcome"] == "passed":
            other[name] = "passes now: remove it from KNOWN_FAILURES"
        elif rec["error"].split(":", 1)[0] not in reason:
            other[name] = rec["error"]
    assert not other, f"known failures not failing as described:\n{_listing(other)}"


# -- the comparison itself, on made-up reports (no processes) ---------------------------------


def _report(backend, **outcomes):
    tests = {name: {"outcome": outcome.split(":")[0], "error": outcome.partition(": ")[2],
                    "seconds": 0.1} for name, outcome in outcomes.items()}
    return {"backend": backend, "world_size": WORLD_SIZE, "torch": "x", "seconds": 1.0,
            "tests": tests}


def test_comparison_names_what_fails_on_ours_only(monkeypatch):
    known = "test_known"
    monkeypatch.setitem(selection.KNOWN_FAILURES, known, "a gap of ours, written down")
    only = next(iter(selection.GLOO_ONLY))
    gloo = _report("gloo", test_a="passed", test_b="passed", test_c="skipped", test_d="passed",
                   **{known: "passed", only: "passed"})
    ours = _report("collectives", test_a="passed", test_b="failed: ValueError: boom",
                   test_c="failed: RuntimeError: gloo skipped it",
                   **{known: "failed: X", only: "failed: Y"})
    assert compare.regressions(gloo, ours) == {
        "test_b": "failed: ValueError: boom", "test_d": "missing: not run"}
    assert compare.fixed_known_failures(gloo, ours) == []
    ours["tests"][known]["outcome"] = "passed"
    assert compare.fixed_known_failures(gloo, ours) == [known]


def test_first_error_line_is_the_ranks_exception():
    import run
    text = ("Traceback (most recent call last):\nRuntimeError: Process 1 exited with error code "
            "10 and exception:\nTraceback (most recent call last):\n  File \"x.py\", line 3\n"
            "    dist.all_gather_coalesced(out, inp)\nValueError: 3 output lists for 1 inputs\n")
    assert run._first_error_line(text) == "ValueError: 3 output lists for 1 inputs"
