"""Run a selection of torch's distributed suite on gloo and on "collectives" at one world size,
and check that every test that passes on gloo passes on ours.

    .venv/bin/python tests/processes/torch_suite/compare.py --selection full --world-size 3
    .venv/bin/python tests/processes/torch_suite/compare.py --selection ci      # 87 tests, ~2 min

Each backend runs in its own process (``run.py``: the suite's module is imported once per
process, with that backend's settings), one after the other: on a 2-core machine two suites at
once would only slow each other, and make timing-sensitive tests of torch's flaky.
Exit status 1 when a test passes on gloo and not on ours, other than the known failures
(``selection.KNOWN_FAILURES``) and tests of gloo-only features (``selection.GLOO_ONLY``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(HERE, "run.py")
sys.path.insert(0, HERE)

import selection  # noqa: E402


class RunFailed(RuntimeError):
    """A backend's run ended without its report (killed at its limit, or crashed)."""


def run_backend(backend, world_size, selection_name, out_dir, *, timeout, per_test=60,
                tests=None):
    """One backend's run in a process of its own; returns its report. Past ``timeout`` seconds
    the run's whole session (the runner and its forked ranks) is killed: RunFailed."""
    out = os.path.join(out_dir, f"{backend}.json")
    log = os.path.join(out_dir, f"{backend}.log")
    cmd = [sys.executable, RUN, "--backend", backend, "--world-size", str(world_size),
           "--timeout", str(per_test), "--out", out]
    cmd += ["--tests", *tests] if tests else ["--selection", selection_name]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # a launcher's variables in the caller's environment would redirect the suite's rendezvous
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "COLLECTIVES_SECRET",
                 "COLLECTIVES_USE_AGENT_STORE", "TORCHELASTIC_USE_AGENT_STORE", "BACKEND",
                 "WORLD_SIZE", "INIT_METHOD", "TEMP_DIR"):
        env.pop(name, None)
    with open(log, "w") as log_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise RunFailed(f"{backend}: killed after {timeout} s; log: {_tail(log)}")
    if not os.path.exists(out):
        raise RunFailed(f"{backend}: exit {proc.returncode}, no report; log: {_tail(log)}")
    with open(out) as f:
        return json.load(f)


def _tail(path, lines=15):
    with open(path, errors="replace") as f:
        return "\n".join(f.read().splitlines()[-lines:])


def regressions(gloo, ours):
    """Tests that pass on gloo and not on ours, less the known failures and the gloo-only
    features: {name: "outcome: first error line"}."""
    out = {}
    for name, rec in sorted(gloo["tests"].items()):
        if rec["outcome"] != "passed" or name in selection.GLOO_ONLY:
            continue
        if name in selection.KNOWN_FAILURES:
            continue
        mine = ours["tests"].get(name, {"outcome": "missing", "error": "not run"})
        if mine["outcome"] != "passed":
            out[name] = f"{mine['outcome']}: {mine['error']}"
    return out


def fixed_known_failures(gloo, ours):
    """Known failures that now pass on ours: the list should lose them."""
    return sorted(name for name in selection.KNOWN_FAILURES
                  if ours["tests"].get(name, {}).get("outcome") == "passed")


def counts(report):
    out = {"passed": 0, "failed": 0, "skipped": 0}
    for rec in report["tests"].values():
        out[rec["outcome"]] = out.get(rec["outcome"], 0) + 1
    return out


def table(gloo, ours) -> str:
    rows = []
    for report in (gloo, ours):
        c = counts(report)
        rows.append(f"  {report['backend']:<12} {c['passed']:>4} passed {c['failed']:>4} failed "
                    f"{c['skipped']:>4} skipped  {report['seconds']:>7.1f} s")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--selection", default="full",
                        help="quick, ci, full, or a file of names")
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--per-test", type=int, default=60, help="seconds per test")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per backend")
    parser.add_argument("--ours", default="collectives", choices=("collectives", "facade"),
                        help="our torch backend, or the facade (torch's tests calling "
                             "``import collectives as dist``; exploratory, not in CI)")
    parser.add_argument("--keep", help="directory for the reports and logs (else a temp dir)")
    args = parser.parse_args(argv)

    out_dir = args.keep or tempfile.mkdtemp(prefix="torch_suite_")
    os.makedirs(out_dir, exist_ok=True)
    gloo, ours = (run_backend(b, args.world_size, args.selection, out_dir,
                              timeout=args.timeout, per_test=args.per_test)
                  for b in ("gloo", args.ours))
    print(f"torch {gloo['torch']}, world size {args.world_size}, selection {args.selection}:")
    print(table(gloo, ours))
    bad = regressions(gloo, ours)
    for name in sorted(selection.KNOWN_FAILURES):
        if gloo["tests"].get(name, {}).get("outcome") == "passed":
            print(f"  known failure {name}: {ours['tests'].get(name, {}).get('error', '')}")
    for name in sorted(selection.GLOO_ONLY):
        if name in ours["tests"] and ours["tests"][name]["outcome"] != "passed":
            print(f"  gloo-only, not compared {name}: {ours['tests'][name]['error']}")
    for name in fixed_known_failures(gloo, ours):
        print(f"  known failure now passes (remove it from selection.KNOWN_FAILURES): {name}")
    for name, why in bad.items():
        print(f"  REGRESSION {name}: {why}")
    print(f"reports and logs: {out_dir}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
