"""GPU layer: the torch backend "collectives" on CUDA tensors (c10d_worker.py): collectives
through torch.distributed (sync and async), torch's stream semantics for Work and Future,
CUDA graph capture, and DDP and FSDP2 trained on ours beside torch's own NCCL group (DDP
bitwise equal on 2 GPUs; within float32 rounding on 4, where our ring and NCCL's add in
different orders, and for FSDP2).

    python -m pytest -m gpu tests/gpu/test_c10d_gpu.py -v      # >= 2 GPUs (4 ideally)

Skipped where the nccl transport is unavailable (no CuPy/GPU), where torch has no CUDA or
no NCCL, or where GPUs are fewer than ranks. Limits as in test_nccl.py
(COLLECTIVES_GPU_TEST_SECONDS, default 240 s per launch).
"""
import os

import pytest

from gpu_jobs import HERE, TORCH_OK, TORCH_WHY, check_results, launch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not TORCH_OK, reason=TORCH_WHY)]
WORKER = os.path.join(HERE, "c10d_worker.py")
# per rank: 8 all_reduce + 17 other collective cases, 7 stream/Work/graph cases, 3 DDP
# variants, FSDP2 and DTensor
MIN_CASES = 37


@pytest.mark.parametrize("world_size", [4, 2], ids=["4gpus", "2gpus"])
def test_torch_backend_on_cuda_tensors_and_ddp_against_nccl(world_size):
    import torch
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL backend to compare with")
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {torch.cuda.device_count()} visible")
    outcome = launch(WORKER, world_size, ["--store", "{job_dir}/store"], "c10d")
    check_results(world_size, *outcome, min_runs=MIN_CASES)
