"""How a job ends when one of its processes leaves.

Under ``mpiexec`` (the MPICH wheel's): a rank that catches a CollectiveTimeout and calls
``sys.exit(1)`` while a peer never arrives, a rank that exits normally while a peer waits
for it in a collective, and a rank that leaves by ``os._exit`` each end the whole job within
seconds, naming the rank; a clean job, and ranks that finish at different times, still exit
0 without an abort. (The uncaught exception is in test_reliability_mpi.py.)

Under the launcher (``python -m collectives.run``): a launcher killed with SIGKILL takes its
workers (and their children) with it, SIGTERM to the launcher stops them, and Ctrl-C (SIGINT)
to it ends workers that are inside collectives on their own, well before its SIGKILL grace.

Every job is killed at its limit, so a hang fails the test instead of stalling CI.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mpiexec import needs_mpi
from reliability_jobs import ROOT, explain, job, mpi_job

CI_BOUND = 10.0          # the promise is a few seconds; a loaded 2-core CI machine gets slack

def _results(record, **match):
    return [r for r in record["results"] if all(r.get(k) == v for k, v in match.items())]


def _ended_after(record, ended, **match):
    """Seconds from the moment a rank reported it was leaving to the end of mpiexec."""
    leaving = _results(record, **match)
    assert leaving, explain(record)
    return ended - leaving[0]["leaving"]


# -- MPI: a rank leaves, the job ends -----------------------------------------------------------

TIMEOUT_THEN_EXIT = job("exit_after_timeout.py")


@needs_mpi
def test_mpi_rank_that_exits_after_a_timeout_ends_the_job(tmp_path):
    record = mpi_job(tmp_path, TIMEOUT_THEN_EXIT, 2, limit=40)
    ended = time.time()
    delay = _ended_after(record, ended, rank=0)
    print(f"\nrank 0 caught a timeout and called sys.exit(1): mpiexec exited {record['rc']} "
          f"{delay:.2f} s later ({record['wall']:.2f} s in all)")
    assert record["rc"] == 1, explain(record)
    assert "rank 0 of 2 is exiting with code 1 after CollectiveTimeout: all_reduce" in \
        record["stderr"] and "aborting the MPI job" in record["stderr"], explain(record)
    assert delay < CI_BOUND and record["wall"] < 5 + CI_BOUND, explain(record)
    assert not _results(record, unexpected="woke")


LEAVES_WHILE_PEER_WAITS = job("exit_while_peer_waits.py")


@needs_mpi
def test_mpi_normal_exit_while_a_peer_waits_ends_the_job(tmp_path):
    record = mpi_job(tmp_path, LEAVES_WHILE_PEER_WAITS, 2, limit=40)
    ended = time.time()
    delay = _ended_after(record, ended, rank=1)
    print(f"\nrank 1 exited normally while rank 0 waited for it: mpiexec exited "
          f"{record['rc']} {delay:.2f} s later")
    assert record["rc"] not in (0, None), explain(record)
    assert "rank 1 of 2 is exiting while rank 0 waits for it in a collective that rank 1 " \
        "never called" in \
        record["stderr"] and "aborting the MPI job" in record["stderr"], explain(record)
    assert delay < CI_BOUND, explain(record)


UNCAUGHT_AFTER_DESTROY = job("exit_uncaught_after_destroy.py")


@needs_mpi
def test_mpi_uncaught_exception_after_destroy_ends_the_job(tmp_path):
    record = mpi_job(tmp_path, UNCAUGHT_AFTER_DESTROY, 2, limit=40)
    delay = _ended_after(record, time.time(), rank=0)
    print(f"\nrank 0 raised after destroy_process_group: mpiexec exited {record['rc']} "
          f"{delay:.2f} s later")
    assert record["rc"] == 1, explain(record)
    assert "rank 0 of 2 is exiting with code 1 after RuntimeError: rank 0 fails after " \
        "destroy_process_group; aborting the MPI job" in record["stderr"], explain(record)
    assert delay < CI_BOUND, explain(record)


OS_EXIT = job("exit_os_exit.py")


@needs_mpi
def test_mpi_os_exit_ends_the_job_with_its_code(tmp_path):
    record = mpi_job(tmp_path, OS_EXIT, 2, limit=40)
    delay = _ended_after(record, time.time(), rank=0)
    print(f"\nrank 0 called os._exit(3): mpiexec exited {record['rc']} {delay:.2f} s later")
    assert record["rc"] == 3 and delay < CI_BOUND, explain(record)


FINISH_APART = job("exit_finish_apart.py")


@needs_mpi
def test_mpi_clean_job_exits_zero_and_waits_for_a_busy_rank(tmp_path):
    record = mpi_job(tmp_path, FINISH_APART, 3, limit=40)
    print(f"\nclean job, rank 0 finishing 2 s after the others: mpiexec exited "
          f"{record['rc']} after {record['wall']:.2f} s")
    assert record["rc"] == 0, explain(record)
    assert sorted(r["done"] for r in record["results"]) == \
        ["destroyed", "fell off the end", "late"], explain(record)
    assert "aborting" not in record["stderr"], explain(record)
    assert record["wall"] < 2 + CI_BOUND, explain(record)


ALL_EXIT_NONZERO = job("exit_all_nonzero.py")


@needs_mpi
def test_mpi_every_rank_exiting_with_a_code_is_no_abort(tmp_path):
    record = mpi_job(tmp_path, ALL_EXIT_NONZERO, 2, limit=40)
    assert record["rc"] == 2 and len(record["results"]) == 2, explain(record)
    assert "aborting" not in record["stderr"], explain(record)
    assert record["wall"] < CI_BOUND, explain(record)


# -- the launcher: killed or signalled, it takes its workers with it -----------------------------

WORKER = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
if os.environ["RANK"] == "1" and "--stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)       # only SIGKILL ends this one
# a child of the worker (a data-loader process, say): the launcher must stop it too
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # exit-test-child"])
with open(os.path.join(out, "pids-" + os.environ["RANK"] + ".tmp"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.rename(os.path.join(out, "pids-" + os.environ["RANK"] + ".tmp"),
          os.path.join(out, "pids-" + os.environ["RANK"]))
time.sleep(120)
"""


def _alive(pid) -> bool:
    """Running (a zombie that nobody reaped yet is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _start_launcher(tmp_path, *flags):
    script = tmp_path / "sleeper.py"
    script.write_text(textwrap.dedent(WORKER))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLLECTIVES_SECRET", None)
    launcher = subprocess.Popen([sys.executable, "-m", "collectives.run", "--standalone",
                                 "--nproc-per-node", "2", str(script), str(tmp_path), *flags],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=str(tmp_path), start_new_session=True)
    pids, deadline = [], time.monotonic() + 60
    while len(pids) < 4:
        if launcher.poll() is not None or time.monotonic() > deadline:
            out, err = launcher.communicate()
            raise AssertionError(f"the workers did not start: rc={launcher.returncode}\n"
                                 f"{out}\n{err}")
        pids = [int(p) for rank in (0, 1) if (tmp_path / f"pids-{rank}").exists()
                for p in (tmp_path / f"pids-{rank}").read_text().split()]
        time.sleep(0.05)
    return launcher, pids


def _gone_within(pids, limit, t0):
    """Seconds from ``t0`` until none of ``pids`` runs, or None after ``limit`` seconds."""
    while time.monotonic() - t0 < limit:
        if not any(_alive(p) for p in pids):
            return time.monotonic() - t0
        time.sleep(0.02)
    return None


def _cleanup(launcher, pids):
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
    launcher.communicate()


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the parent-death signal is Linux's (prctl)")


@linux_only
def test_killed_launcher_takes_its_workers_and_their_children(tmp_path):
    launcher, pids = _start_launcher(tmp_path)
    try:
        t0 = time.monotonic()
        os.kill(launcher.pid, signal.SIGKILL)
        gone = _gone_within(pids, 15, t0)
        left = [p for p in pids if _alive(p)]
        print(f"\nlauncher SIGKILLed: workers and their children gone after "
              f"{'never' if gone is None else f'{gone:.2f} s'}")
        assert gone is not None, f"still running after the launcher died: {left}"
        assert gone < CI_BOUND
        _, err = launcher.communicate(timeout=30)       # the watchdog shares its stderr
        assert f"the launcher (pid {launcher.pid}) died; stopping its workers" in err, err
    finally:
        _cleanup(launcher, pids)


@pytest.mark.parametrize("stubborn", [False, True], ids=["obliging", "ignores-sigterm"])
def test_sigterm_to_the_launcher_stops_every_worker(tmp_path, stubborn):
    launcher, pids = _start_launcher(tmp_path, *(["--stubborn"] if stubborn else []))
    try:
        t0 = time.monotonic()
        os.kill(launcher.pid, signal.SIGTERM)
        out, err = launcher.communicate(timeout=30)
        ended = time.monotonic() - t0
        gone = _gone_within(pids, 10, time.monotonic())
        print(f"\nSIGTERM to the launcher ({'a worker ignores it' if stubborn else 'workers obey'})"
              f": launcher exited {launcher.returncode} after {ended:.2f} s")
        assert gone is not None, f"still running: {[p for p in pids if _alive(p)]}"
        assert launcher.returncode == 128 + signal.SIGTERM, err
        assert "received SIGTERM; stopped the workers" in err, err
        assert ended < (5 if stubborn else 0) + CI_BOUND
    finally:
        _cleanup(launcher, pids)


IN_COLLECTIVES = """
import faulthandler, os, signal, sys
import numpy as np
import collectives as dist

faulthandler.register(signal.SIGUSR1)    # the test asks a worker that is slow to leave where
dist.init_process_group("gloo")
x = np.ones(1 << 16)                      # 512 KiB: the shared-memory paths between ranks
dist.all_reduce(x)
ready = os.path.join(sys.argv[1], "ready-" + os.environ["RANK"])
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(ready + ".tmp", ready)
while True:
    dist.all_reduce(x)
"""
ROUNDS = 10


@linux_only
def test_ctrl_c_to_the_launcher_ends_workers_inside_collectives_on_their_own(tmp_path):
    """SIGINT goes to every worker's process group; each raises KeyboardInterrupt wherever it
    is in a collective and leaves without waiting for goodbyes its interrupted peers never
    send: the launcher exits 130 well inside its SIGKILL grace (0.2-0.7 s here). Interrupts
    land at random points of the collectives, so several rounds: an interrupt inside a send
    left a worker's exit waiting for a queue no peer would drain, until the SIGKILL (5.1 s in
    one round of 4 to 10 here; the others waited 1 s for goodbyes)."""
    from collectives.run import GRACE_SECONDS
    script = tmp_path / "loop.py"
    script.write_text(IN_COLLECTIVES)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("COLLECTIVES_SECRET", None)
    for round_ in range(ROUNDS):
        out_dir = tmp_path / f"round{round_}"
        out_dir.mkdir()
        launcher = subprocess.Popen([sys.executable, "-m", "collectives.run", "--standalone",
                                     "--nproc-per-node", "3", str(script), str(out_dir)],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, cwd=str(tmp_path), start_new_session=True)
        pids, deadline = [], time.monotonic() + 60
        try:
            while len(pids) < 3:
                assert launcher.poll() is None and time.monotonic() < deadline, \
                    launcher.communicate()
                pids = [int(p.read_text()) for p in out_dir.glob("ready-[0-9]")]
                time.sleep(0.02)
            t0 = time.monotonic()
            os.kill(launcher.pid, signal.SIGINT)
            try:
                out, err = launcher.communicate(timeout=GRACE_SECONDS - 1.5)
            except subprocess.TimeoutExpired:  # where are the workers still running stuck?
                for pid in filter(_alive, pids):
                    try:
                        os.kill(pid, signal.SIGUSR1)
                    except ProcessLookupError:
                        pass
                out, err = launcher.communicate(timeout=30)
            ended = time.monotonic() - t0
            print(f"\nround {round_}: Ctrl-C to the launcher: exited {launcher.returncode} after "
                  f"{ended:.2f} s")
            assert launcher.returncode == 128 + signal.SIGINT, err
            assert "received SIGINT; stopped the workers" in err, err
            assert err.count("KeyboardInterrupt") >= 3, err
            assert ended < GRACE_SECONDS, err
            # an interrupted shutdown is not a protocol error
            assert "malformed" not in err and "failed authentication" not in err, err
            assert _gone_within(pids, 10, time.monotonic()) is not None
        finally:
            _cleanup(launcher, pids)
