"""The GPU tests' launcher (``tests/gpu/gpu_jobs.py``) on the CPU: a test run ended from
outside (SIGTERM, as an outer ``timeout`` ends it) kills the job it launched, whose ranks run
in a process session of their own, instead of leaving them on the GPUs for the next command,
where they would take the GPUs' peer memory and slow every measurement after them."""
import os
import signal
import subprocess
import sys
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = os.path.join(HERE, "..", "gpu")

# the job: one "rank" that writes its pid where launch looks for it, tells the test, sleeps
RANK = textwrap.dedent("""
    import os, sys, time
    pid_dir = sys.argv[sys.argv.index("--pid-dir") + 1]
    with open(os.path.join(pid_dir, "pid.0"), "w") as f:
        f.write(str(os.getpid()))
    with open(os.environ["RANK_PID"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
""")

# the test run: launch (mpiexec replaced by nothing: the rank runs directly) and wait on it
RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import gpu_jobs
    gpu_jobs.mpiexec = lambda n: []
    gpu_jobs.launch(sys.argv[2], 1, [], "cleanup")
""")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:          # a zombie is not running
        return f.read().split()[2] != "Z"


def test_a_test_run_ended_by_sigterm_kills_the_job_it_launched(tmp_path):
    rank, marker = tmp_path / "rank.py", tmp_path / "rank.pid"
    rank.write_text(RANK)
    run = subprocess.Popen([sys.executable, "-c", RUN, GPU, str(rank)],
                           env=dict(os.environ, RANK_PID=str(marker),
                                    COLLECTIVES_GPU_TEST_SECONDS="100"),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        time.sleep(0.05)
    pid = int(marker.read_text())
    assert _alive(pid)
    run.send_signal(signal.SIGTERM)
    code = run.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    alive = _alive(pid)
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "the launched job outlived the test run"
    assert code == 128 + signal.SIGTERM, run.communicate()      # through launch's finally
