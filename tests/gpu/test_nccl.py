"""GPU layer: the NCCL transport on real GPUs, each world size in its own mpiexec job.

Marked ``gpu`` and skipped where ``collectives.transports.nccl.available()`` is False (CI has
no CuPy and no GPU) or where fewer GPUs than ranks are visible. Each test launches
``nccl_worker.py`` under ``mpiexec -n N`` (Open MPI needs ``--allow-run-as-root
--oversubscribe`` as root) and asserts that every rank ran every case with no failure: every
collective x algorithm (those registered, plus NCCL's native) x dtypes/ops x counts, each
unsegmented and pipelined, against exact host references that NCCL's own results also meet.

    python -m pytest -m gpu tests/gpu          # on a machine with >= 2 (ideally 4) GPUs

``test_torch_cuda_tensors_through_the_facade`` launches ``torch_worker.py`` the same way (skipped
without torch+CUDA): torch CUDA tensors through ``import collectives as dist`` on nccl, zero
copy, bad-input errors, ordering on torch's current stream, async Work/Future. Both tests use
``launch`` (job directory, pid files, limits) and ``check_results``.

Each launch is self-contained: a fresh directory (unique name) holds the file store and the
ranks' pid files, the store keys carry a per-launch id, so nothing of an earlier (killed) job
can be picked up. Limits nest so a hang always ends with a report: the worker dumps every
thread's stack and exits at ``limit - 10`` s (faulthandler), the test kills the ranks by pid
and the mpiexec process group at ``limit`` s. ``COLLECTIVES_GPU_TEST_SECONDS_4`` and
``_2`` set each world size's limit (default: ``COLLECTIVES_GPU_TEST_SECONDS``, else 240).
"""
import importlib.util
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
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "nccl_worker.py")
TORCH_WORKER = os.path.join(HERE, "torch_worker.py")


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


def launch(worker: str, world_size: int, args: list, tag: str, env=None):
    """Run ``worker`` under ``mpiexec -n world_size`` in a fresh job directory (passed as
    ``{job_dir}`` inside ``args``; the worker gets ``--pid-dir`` and ``--deadline`` too),
    killing it at the world size's limit. Returns (returncode, stdout, stderr, RESULT dicts);
    a launch that outlives its limit fails the test with its output."""
    limit = limit_for(world_size)
    job_dir = tempfile.mkdtemp(prefix=f"collectives-{tag}{world_size}-{uuid.uuid4().hex[:8]}-")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1", **(env or {}))
    command = mpiexec(world_size) + [
        sys.executable, worker, *[a.replace("{job_dir}", job_dir) for a in args],
        "--pid-dir", job_dir, "--deadline", str(max(5.0, limit - 10))]
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
    return process.returncode, stdout, stderr, results


def check_results(world_size, returncode, stdout, stderr, results, min_runs):
    """Every rank reported, ran at least ``min_runs`` cases and none failed."""
    detail = "\n".join(f"rank {r['rank']}: {f}" for r in results for f in r["failures"])
    failed = sum(r.get("failed", len(r["failures"])) for r in results)
    assert returncode == 0 and len(results) == world_size, \
        f"exit {returncode}, {len(results)} of {world_size} ranks reported\n" \
        f"{stdout[-4000:]}\n{stderr[-4000:]}"
    assert all(r["runs"] >= min_runs for r in results), results
    assert not failed, f"{failed} failures, the first of each rank:\n{detail}"


@pytest.mark.skipif(not OK, reason=f"nccl backend unavailable: {WHY}")
@pytest.mark.parametrize("world_size,rendezvous,quick", [(4, "mpi", False), (2, "file", True)],
                         ids=["4gpus", "2gpus"])
def test_every_collective_matches(world_size, rendezvous, quick):
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")
    job = uuid.uuid4().hex
    how = "file:{job_dir}/store" if rendezvous == "file" else "mpi"
    outcome = launch(WORKER, world_size, ["--rendezvous", how, "--job", job] +
                     (["--quick"] if quick else []), "gpu")
    check_results(world_size, *outcome, min_runs=51)


def torch_cuda() -> tuple[bool, str]:
    """(usable, why) for the torch suite: torch importable with CUDA (checked without
    importing torch where it is absent, as on CI)."""
    if importlib.util.find_spec("torch") is None:
        return False, "torch is not installed"
    import torch
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s)"


TORCH_OK, TORCH_WHY = torch_cuda() if OK else (False, f"nccl backend unavailable: {WHY}")
# Cases per rank of torch_worker.py: 4 dtypes x (all_reduce x ops, broadcast, reduce,
# all_gather x2, reduce_scatter_tensor, all_to_all_single x2) x algorithms, then bad inputs,
# stream ordering and async. A rank that ran fewer stopped early.
TORCH_MIN_CASES = 186


@pytest.mark.skipif(not TORCH_OK, reason=TORCH_WHY)
@pytest.mark.parametrize("world_size", [4, 2], ids=["torch-4gpus", "torch-2gpus"])
def test_torch_cuda_tensors_through_the_facade(world_size):
    """torch CUDA tensors through ``import collectives as dist`` on nccl: every collective x
    algorithm x dtype exact and zero copy, clear errors for bad tensors, ordering on torch's
    current stream (default and side stream), async Work/Future (see torch_worker.py)."""
    import torch
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {torch.cuda.device_count()} visible")
    outcome = launch(TORCH_WORKER, world_size, ["--store", "{job_dir}/store"], "torch")
    check_results(world_size, *outcome, min_runs=TORCH_MIN_CASES)
