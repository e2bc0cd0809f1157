"""Run tests of torch's own distributed suite (``DistributedTest._DistTestBase`` in
``torch/testing/_internal/distributed/distributed_test.py``, shipped in the wheel) on one
backend, and write pass/fail/skip per test as JSON.

    python tests/processes/torch_suite/run.py --backend collectives --world-size 2 \\
        --selection ci --out ours.json
    python tests/processes/torch_suite/run.py --backend gloo --selection full --out gloo.json

It drives the suite as torch's ``test/distributed/test_distributed_spawn.py`` does (a class
``TestDistBackend + _DistTestBase``, file:// rendezvous, one process per rank, BACKEND and
WORLD_SIZE from the environment), with three differences, each for a reason:

* Ranks are forked from this process, not spawned: a spawned rank imports torch again (about
  2-3 s of CPU a rank, a test) which alone would blow the CI budget on 2 cores; a fork inherits
  torch, the suite and ``collectives.c10d`` (imported here before any fork, so the backend is
  registered in every rank) and starts in milliseconds. This process makes no group and starts
  no thread of ours before forking.
* The suite's import-time gates (``require_backend_is_available({"gloo"})``,
  ``BACKEND not in backend_feature["ddp"]`` ...) are decided as for gloo for every backend:
  the module is imported with BACKEND=gloo, then its ``BACKEND`` global is set to the backend
  under test, which is what ``init_process_group``, ``get_backend`` checks and the test bodies
  read at run time. Our backend is a CPU backend meant to do what gloo does, so the fair
  comparison runs the same test bodies on both: with our name at import time, torch would skip
  about 40 CPU tests (all_reduce_coalesced, no_sync, get_future, scatter_object_list ...) on
  ours only because its gates name gloo, and "passes on gloo, passes on ours" would be vacuous
  for them. Tests of gloo-only features (monitored_barrier, gloo's barrier timeouts) then run
  on ours and fail as expected; ``selection.GLOO_ONLY`` names them and says why.
* "collectives" joins torch's feature sets (ddp, subgroup, plugin) for the few run-time checks
  that read them, and the few bodies that test ``BACKEND == "gloo"`` to mean "a CPU backend"
  (``selection.BODY_AS_GLOO``) see gloo's name in the ranks, after our backend is initialized.

``--backend facade`` runs torch's test bodies against our facade instead (``import collectives
as dist``: the module's ``dist`` rebound to the facade, ranks initialized with its socket
backend); torch's own layers (DDP, torch's object collectives) then find no torch group and
fail, so it measures how far the facade alone passes for torch.distributed. Exploratory: CI
compares the backend, not the facade.

A test past ``--timeout`` seconds is killed by torch's own harness (its ranks terminated) and
recorded as failed: a hang fails one test, never the run.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
FACADE = "facade"      # torch's tests calling ``import collectives as dist`` (socket backend)
BACKENDS = ("gloo", "collectives", FACADE)


def _first_error_line(text: str) -> str:
    """The line that names the exception raised in a rank ("ValueError: ..."), else the last
    non-empty line: what a failing test's report shows."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    pattern = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Failure)|"
                         r"AssertionError|RuntimeError)\b.*")
    # torch's harness wraps a rank's traceback in "RuntimeError: Process 0 exited with error
    # code 10 and exception:"; the rank's own exception line is the one worth reading
    for line in reversed(lines):
        if pattern.match(line) and "exited with error code" not in line:
            return line[:400]
    return lines[-1][:400] if lines else ""


class _Result(unittest.TestResult):
    """unittest's result, kept per test as a record: outcome, first error line, seconds."""

    def __init__(self, log):
        super().__init__()
        self.records = {}
        self._log = log
        self._start = 0.0

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        seconds = round(time.monotonic() - self._start, 2)
        self.records[name] = {"outcome": outcome, "error": detail, "seconds": seconds}
        print(f"[torch_suite] {name}: {outcome} ({seconds} s) {detail}", file=self._log,
              flush=True)

    def startTest(self, test):          # noqa: N802  (unittest's names)
        super().startTest(test)
        self._start = time.monotonic()

    def addSuccess(self, test):         # noqa: N802
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):    # noqa: N802
        super().addFailure(test, err)
        self._record(test, "failed", _first_error_line(self.failures[-1][1]))

    def addError(self, test, err):      # noqa: N802
        super().addError(test, err)
        self._record(test, "failed", _first_error_line(self.errors[-1][1]))

    def addSkip(self, test, reason):    # noqa: N802
        super().addSkip(test, reason)
        self._record(test, "skipped", str(reason)[:200])

    def addExpectedFailure(self, test, err):    # noqa: N802
        super().addExpectedFailure(test, err)
        self._record(test, "skipped", "expected failure in torch's suite")

    def addUnexpectedSuccess(self, test):       # noqa: N802
        super().addUnexpectedSuccess(test)
        self._record(test, "passed")


def load_suite(backend: str, world_size: int, timeout: int):
    """Import torch's suite gated as for gloo, point it at ``backend``, and return the test
    class (ranks forked). Must run before anything else here imports the suite."""
    os.environ["BACKEND"] = "gloo"              # the import-time gates: gloo's (see above)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import torch
    import collectives.c10d  # noqa: F401  (registers "collectives" before any rank forks)
    from torch.testing._internal import common_distributed as cd

    import selection

    # torch's harness reads these when a test joins its ranks: one limit for every test
    cd.TIMEOUT_DEFAULT = timeout
    for name in list(cd.TIMEOUT_OVERRIDE):
        cd.TIMEOUT_OVERRIDE[name] = min(cd.TIMEOUT_OVERRIDE[name], timeout)
    for feature in ("ddp", "subgroup", "plugin"):
        cd.DistTestCases.backend_feature[feature].add(collectives.c10d.BACKEND)
    from torch.testing._internal.distributed import distributed_test as dt

    dt.BACKEND = backend                        # what the ranks init and the bodies read
    if backend == FACADE:
        # the bodies' ``dist`` becomes our facade; the ranks init it on its socket backend
        dt.dist = _facade_as_dist()
        dt.BACKEND = "socket"
    fork = torch.multiprocessing.get_context("fork").Process

    class TorchSuite(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(fork)

        def tearDown(self):
            super().tearDown()
            # torch's harness makes a FileStore file per test (delete=False) and leaves it
            try:
                os.remove(self.file_name)
            except OSError:
                pass

        def run_test(self, test_name, parent_pipe):
            # in a rank, after init_process_group(BACKEND): a few bodies read BACKEND == "gloo"
            # as "a CPU backend" (selection.BODY_AS_GLOO); they see gloo's name, run on ours
            if test_name in selection.BODY_AS_GLOO:
                dt.BACKEND = "gloo"
            super().run_test(test_name, parent_pipe)

    TorchSuite.__name__ = TorchSuite.__qualname__ = f"TorchSuite_{backend}"
    return TorchSuite


def _facade_as_dist():
    """``import collectives as dist`` for the suite's module: the facade's names, and torch's
    for what the facade does not define (torch's helpers such as ``get_debug_level``; a
    collective the facade lacks then reaches torch's uninitialized default group and fails,
    naming it)."""
    import types

    import collectives
    import torch.distributed as torch_dist

    class FacadeAsDist(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch_dist, name)

    shim = FacadeAsDist("collectives_as_torch_distributed")
    for name in dir(collectives):
        if not name.startswith("__"):
            setattr(shim, name, getattr(collectives, name))
    return shim


def all_names(cls) -> list[str]:
    return sorted(unittest.TestLoader().getTestCaseNames(cls))


def run(backend, world_size, names, timeout, log=sys.stderr):
    """Run ``names`` (all of the class's tests when None) on ``backend``; return the records."""
    cls = load_suite(backend, world_size, timeout)
    known = set(all_names(cls))
    names = all_names(cls) if names is None else list(names)
    missing = [n for n in names if n not in known]
    suite = unittest.TestSuite(cls(n) for n in names if n in known)
    result = _Result(log)
    start = time.monotonic()
    suite.run(result)
    records = dict(result.records)
    for name in missing:
        records[name] = {"outcome": "missing", "error": "not in this torch's suite",
                         "seconds": 0.0}
    return {"backend": backend, "world_size": world_size, "torch": _torch_version(),
            "seconds": round(time.monotonic() - start, 1), "tests": records}


def _torch_version():
    import torch
    return torch.__version__


def summary(report) -> str:
    counts = {}
    for rec in report["tests"].values():
        counts[rec["outcome"]] = counts.get(rec["outcome"], 0) + 1
    parts = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("passed", "failed", "skipped"))
    extra = f", {counts['missing']} missing" if counts.get("missing") else ""
    return (f"{report['backend']} (world size {report['world_size']}, torch {report['torch']}):"
            f" {parts}{extra} in {report['seconds']} s")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--selection", default="ci",
                        help="quick, ci, full, or a file of test names (one a line)")
    parser.add_argument("--tests", nargs="*", help="test names (instead of --selection)")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per test")
    parser.add_argument("--out", help="write the JSON records here")
    args = parser.parse_args(argv)

    import selection
    names = args.tests or selection.names(args.selection)
    # the suite's ranks write a lot; our own lines go to the real stderr
    log = os.fdopen(os.dup(2), "w")
    report = run(args.backend, args.world_size, names, args.timeout, log=log)
    print(summary(report), file=log, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
    # os._exit: the suite leaves no thread worth joining, and forked ranks are already reaped
    log.flush()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
