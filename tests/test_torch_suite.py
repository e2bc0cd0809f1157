"""torch's own distributed test suite on our torch backend: every test of the CI selection
that passes on gloo passes on "collectives", at the same world size (3).

The tests are torch's (``DistributedTest._DistTestBase`` from
``torch/testing/_internal/distributed/distributed_test.py``, shipped in the wheel), driven as
torch's ``test/distributed/test_distributed_spawn.py`` drives them, once with BACKEND=gloo and
once with our backend, each run in a process of its own (tests/torch_suite/run.py says how and
why it forks ranks, and why torch's import-time gates are decided as for gloo). The selection,
the known failures of our backend (with reasons) and the tests of gloo-only features are in
tests/torch_suite/selection.py.

CI runs the "ci" selection (87 tests: collectives, p2p, groups, object collectives, DDP on
CPU; about 45 s on gloo and 55 s on ours, 2 cores). The whole suite (every test of
``_DistTestBase``; most skip on a CPU-only machine, on gloo as on ours), by hand:

    .venv/bin/python tests/torch_suite/compare.py --selection full --world-size 3
    # torch's tests of [1, 2] subgroups (test_*_group_*) skip below 8 ranks:
    .venv/bin/python tests/torch_suite/compare.py --selection full --world-size 8

Against the facade (torch's test bodies with ``dist`` = ``import collectives as dist``; an
exploration, not asserted here):

    .venv/bin/python tests/torch_suite/compare.py --selection ci --ours facade

It prints passed/failed/skipped per backend, the known failures, and every test that passes
on gloo and not on ours (exit status 1 if any); ``--keep DIR`` keeps the JSON reports and logs.
torch's suite needs ``expecttest`` (a test dependency of torch: ``pip install expecttest``).
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
RUN_LIMIT = 240         # seconds per backend's run (about 50 s here); past it, killed: failure
PER_TEST = 60           # seconds per test in torch's harness; past it, that test fails


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """The CI selection's reports on gloo and on ours, one run each."""
    out = tmp_path_factory.mktemp("torch_suite")
    try:
        return tuple(compare.run_backend(backend, WORLD_SIZE, "ci", str(out),
                                         timeout=RUN_LIMIT, per_test=PER_TEST)
                     for backend in ("gloo", "collectives"))
    except compare.RunFailed as exc:
        pytest.fail(str(exc))


def _listing(items):
    return "\n".join(f"  {name}: {why}" for name, why in sorted(items.items()))


def test_what_passes_on_gloo_passes_on_ours(reports):
    gloo, ours = reports
    bad = compare.regressions(gloo, ours)
    assert not bad, (f"{len(bad)} of torch's tests pass on gloo and not on collectives "
                     f"(world size {WORLD_SIZE}):\n{_listing(bad)}")


def test_the_selection_runs_on_gloo(reports):
    """A selected test that does not pass on gloo here compares nothing: the selection (or
    the machine) has drifted from what it says."""
    gloo, _ = reports
    not_passing = {name: f"{rec['outcome']}: {rec['error']}"
                   for name, rec in gloo["tests"].items() if rec["outcome"] != "passed"}
    assert not not_passing, f"CI-selected tests that do not pass on gloo:\n{_listing(not_passing)}"


def test_known_failures_still_fail(reports):
    """A known failure that passes on ours now should leave selection.KNOWN_FAILURES (as a
    strict xfail would say)."""
    gloo, ours = reports
    fixed = compare.fixed_known_failures(gloo, ours)
    assert not fixed, f"known failures that now pass (remove them from KNOWN_FAILURES): {fixed}"


def test_known_failures_fail_as_described(reports):
    """Each known failure fails for the reason written down, not another one."""
    _, ours = reports
    other = {}
    for name, reason in selection.KNOWN_FAILURES.items():
        rec = ours["tests"].get(name)
        if rec is None or rec["outcome"] != "failed":
            continue
        error = rec["error"]
        head = error.split(":", 1)[0]
        if head not in reason:
            other[name] = error
    assert not other, f"known failures failing for another reason:\n{_listing(other)}"


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
