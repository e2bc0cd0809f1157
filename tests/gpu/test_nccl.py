"""GPU layer: the NCCL transport on real GPUs, each world size in its own mpiexec job.

Marked ``gpu`` and skipped where ``collectives.transports.nccl.available()`` is False (CI has
no CuPy and no GPU) or where fewer GPUs than ranks are visible. Each test launches
``nccl_worker.py`` under ``mpiexec -n N`` (Open MPI needs ``--allow-run-as-root
--oversubscribe`` as root) and asserts that every rank ran every case with no failure: every
collective x algorithm (those registered, plus NCCL's native) x dtypes/ops x counts, each
unsegmented and pipelined, against exact host references that NCCL's own results also meet.

    python -m pytest -m gpu tests/gpu          # on a machine with >= 2 (ideally 4) GPUs

Each launch is self-contained: a fresh directory (unique name) holds the file store and the
ranks' pid files, the store keys carry a per-launch id, so nothing of an earlier (killed) job
can be picked up. Limits nest so a hang always ends with a report: the worker dumps every
thread's stack and exits at ``limit - 10`` s (faulthandler), the test kills the ranks by pid
and the mpiexec process group at ``limit`` s. ``COLLECTIVES_GPU_TEST_SECONDS_4`` and
``_2`` set each world size's limit (default: ``COLLECTIVES_GPU_TEST_SECONDS``, else 240).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid

import pytest

from collectives.transports import nccl

pytestmark = pytest.mark.gpu
OK, WHY = nccl.available()
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_worker.py")


def limit_for(world_size: int) -> float:
    """Seconds one world size may take (the device session sets them below its step limit)."""
    default = os.environ.get("COLLECTIVES_GPU_TEST_SECONDS", "240")
    return float(os.environ.get(f"COLLECTIVES_GPU_TEST_SECONDS_{world_size}", default))


def gpu_count() -> int:
    if not OK:
        return 0
    import cupy
    return cupy.cuda.runtime.getDeviceCount()


def mpiexec(n: int) -> list:
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        pytest.skip("no mpiexec on PATH")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    flags = ["--allow-run-as-root", "--oversubscribe"] if "Open MPI" in version or \
        "OpenRTE" in version else []
    return [exe, *flags, "-n", str(n)]


def _kill_job(process, job_dir):
    """SIGKILL this launch's ranks (by the pids they wrote) and mpiexec's process group."""
    for name in os.listdir(job_dir):
        if name.startswith("pid."):
            try:
                with open(os.path.join(job_dir, name)) as f:
                    os.kill(int(f.read().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    try:
        os.killpg(process.pid, signal.SIGKILL)   # start_new_session: its own group
    except OSError:
        pass


@pytest.mark.skipif(not OK, reason=f"nccl backend unavailable: {WHY}")
@pytest.mark.parametrize("world_size,rendezvous,quick", [(4, "mpi", False), (2, "file", True)],
                         ids=["4gpus", "2gpus"])
def test_every_collective_matches(world_size, rendezvous, quick):
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")
    limit = limit_for(world_size)
    job = uuid.uuid4().hex
    job_dir = tempfile.mkdtemp(prefix=f"collectives-gpu{world_size}-{job[:8]}-")
    how = f"file:{os.path.join(job_dir, 'store')}" if rendezvous == "file" else "mpi"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    command = mpiexec(world_size) + [
        sys.executable, WORKER, "--rendezvous", how, "--job", job, "--pid-dir", job_dir,
        "--deadline", str(max(5.0, limit - 10))] + (["--quick"] if quick else [])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_job(process, job_dir)
        stdout, stderr = process.communicate()
        pytest.fail(f"{world_size} ranks did not finish in {limit} s (killed); output:\n"
                    f"{stdout[-6000:]}\nstderr:\n{stderr[-4000:]}")
    finally:
        _kill_job(process, job_dir)             # stragglers of a failed job, by pid
        shutil.rmtree(job_dir, ignore_errors=True)
    print(stdout[-3000:])
    results = [json.loads(line[len("RESULT "):]) for line in stdout.splitlines()
               if line.startswith("RESULT ")]
    detail = "\n".join(f for r in results for f in r["failures"])
    assert process.returncode == 0 and len(results) == world_size, \
        f"exit {process.returncode}, {len(results)} of {world_size} ranks reported\n" \
        f"{stdout[-4000:]}\n{stderr[-4000:]}"
    assert all(r["runs"] > 50 for r in results), results
    assert not detail, detail
