"""GPU layer: what a new user meets first on the nccl backend (usability_worker.py).

* ``init_process_group("nccl")`` under ``mpiexec -n N`` with no init_method and no
  MASTER_ADDR: rank, size and the NCCL unique id come from MPI; then send/recv, isend/irecv
  and batch_isend_irecv on CuPy arrays and on torch CUDA tensors (recv into a CUDA tensor
  used to fail on numpy's ``writeable`` flag), and the object collectives (all_gather_object,
  broadcast_object_list, gather_object, scatter_object_list), which used to refuse nccl.
* A rank that raises an uncaught exception while the others wait inside NCCL: the job ends
  by itself, under ``python -m collectives.run --nproc-per-node 4`` (it used to hang until
  killed) and under ``mpiexec -n 2``, naming the rank and aborting its NCCL communicator.

    python -m pytest -m gpu tests/gpu/test_nccl_usability.py -v      # >= 2 GPUs (4 ideally)

Skipped where the nccl backend is unavailable (no CuPy/GPU) or GPUs are fewer than ranks.
Limits as in test_nccl.py (COLLECTIVES_GPU_TEST_SECONDS, default 240 s per launch).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from gpu_jobs import HERE, OK, WHY, _kill_job, check_results, gpu_count, launch, limit_for

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not OK, reason=f"nccl backend unavailable: {WHY}")]
WORKER = os.path.join(HERE, "usability_worker.py")
ROOT = os.path.dirname(os.path.dirname(HERE))
ENDS_WITHIN = 60.0          # seconds from start to the end of a job whose rank 1 raises
RENDEZVOUS_ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


def _needs(world_size):
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")


@pytest.mark.parametrize("world_size", [4, 2], ids=["4gpus", "2gpus"])
def test_mpiexec_init_p2p_and_objects(world_size, monkeypatch):
    _needs(world_size)
    for name in RENDEZVOUS_ENV:          # as under a plain mpiexec: nothing but MPI's
        monkeypatch.delenv(name, raising=False)
    outcome = launch(WORKER, world_size, ["--case", "mpi"], "usability")
    # 1 + 3 p2p + 5 async collectives on CuPy (and again on torch CUDA tensors where torch
    # has CUDA) + 4 object cases
    check_results(world_size, *outcome, min_runs=13)


def test_a_rank_that_raises_ends_the_job_under_mpiexec(monkeypatch):
    _needs(2)
    for name in RENDEZVOUS_ENV:
        monkeypatch.delenv(name, raising=False)
    t0 = time.monotonic()
    returncode, stdout, stderr, _ = launch(WORKER, 2, ["--case", "raise"], "raise")
    took = time.monotonic() - t0
    print(f"job whose rank 1 raised ended after {took:.1f} s with code {returncode}")
    assert returncode != 0 and took < ENDS_WITHIN, (took, stdout[-3000:], stderr[-3000:])
    assert "RuntimeError: rank 1 fails on purpose" in stderr, stderr[-3000:]
    assert "rank 1 of 2 raised an uncaught RuntimeError; aborting its NCCL communicator and " \
           "the MPI job" in stderr, stderr[-3000:]
    assert "all_reduce returned" not in stdout


def test_a_rank_that_raises_ends_the_job_under_the_launcher():
    world_size = 4 if gpu_count() >= 4 else 2
    _needs(world_size)
    limit = limit_for(world_size)
    job_dir = tempfile.mkdtemp(prefix=f"collectives-raise-launcher-{uuid.uuid4().hex[:8]}-")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in RENDEZVOUS_ENV + ("COLLECTIVES_SECRET",):
        env.pop(name, None)
    command = [sys.executable, "-m", "collectives.run", "--standalone", "--nproc-per-node",
               str(world_size), WORKER, "--case", "raise", "--pid-dir", job_dir,
               "--deadline", str(max(5.0, limit - 10))]
    t0 = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env, cwd=ROOT, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_job(process, job_dir)
        stdout, stderr = process.communicate()
        pytest.fail(f"the launcher did not end in {limit} s after rank 1 raised (killed):\n"
                    f"{stdout[-4000:]}\nstderr:\n{stderr[-4000:]}")
    finally:
        _kill_job(process, job_dir)
        shutil.rmtree(job_dir, ignore_errors=True)
    took = time.monotonic() - t0
    print(f"{world_size} ranks, rank 1 raised: the launcher ended after {took:.1f} s with code "
          f"{process.returncode}")
    assert process.returncode == 1 and took < ENDS_WITHIN, (took, stdout[-3000:],
                                                             stderr[-3000:])
    assert f"rank 1 of {world_size} raised an uncaught RuntimeError; aborting its NCCL " \
           f"communicator" in stderr, stderr[-3000:]
    assert "worker rank 1 (local rank 1" in stderr and "exited with code 1" in stderr, \
        stderr[-3000:]
    assert "all_reduce returned" not in stdout
