"""Launching GPU jobs for the gpu tests: whether the nccl backend (and torch with CUDA) is
usable here, how many GPUs are visible, each world size's time limit, ``launch`` (a worker under
``mpiexec -n N`` in a fresh job directory, killed by pid at its limit, or when this process
is told to end) and ``check_results``.
The GPU tests import it from here, never from one another."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid

import pytest

from collectives.transports import nccl

OK, WHY = nccl.available()
HERE = os.path.dirname(os.path.abspath(__file__))


def _terminated(signum, frame):
    """SIGTERM (an outer ``timeout``): leave through the launches' ``finally``, which kill
    their jobs. The default would end this process at once, and the MPI jobs it started (each
    in a process session of its own) would go on using the GPUs under the next command, which
    would then run without peer memory and with NCCL slowed by them."""
    raise SystemExit(128 + signum)


if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _terminated)


def limit_for(world_size: int) -> float:
    """Seconds one world size may take (set below the limit of the command that runs the tests)."""
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
