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
``gpu_jobs.launch`` (job directory, pid files, limits) and ``check_results``.

Each launch is self-contained: a fresh directory (unique name) holds the file store and the
ranks' pid files, the store keys carry a per-launch id, so nothing of an earlier (killed) job
can be picked up. Limits nest so a hang always ends with a report: the worker dumps every
thread's stack and exits at ``limit - 10`` s (faulthandler), the test kills the ranks by pid
and the mpiexec process group at ``limit`` s. ``COLLECTIVES_GPU_TEST_SECONDS_4`` and
``_2`` set each world size's limit (default: ``COLLECTIVES_GPU_TEST_SECONDS``, else 240).
"""
import os
import uuid

import pytest

from gpu_jobs import HERE, OK, TORCH_OK, TORCH_WHY, WHY, check_results, gpu_count, launch

pytestmark = pytest.mark.gpu
WORKER = os.path.join(HERE, "nccl_worker.py")
TORCH_WORKER = os.path.join(HERE, "torch_worker.py")


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
