"""GPU layer: the peer-memory path beyond one call at a time (``peer_worker.py`` under
``mpiexec -n 2``): calls across the flagged lines' wrap (the call number set just below
2^32, where the old 32-bit flag became 0 and unwritten lines passed for this call's), calls
captured in a CUDA graph and replayed with new input, calls on two
streams without synchronization between them, and a rank that never arrives (the others stop
at the call's timeout naming it, the group fails everywhere, no kernel keeps spinning).

    python -m pytest -m gpu tests/gpu/test_peer.py      # on a machine with >= 2 GPUs
"""
import os

import pytest

from gpu_jobs import HERE, OK, WHY, check_results, gpu_count, launch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not OK, reason=f"nccl backend unavailable: {WHY}")]


def test_line_wrap_graphs_two_streams_and_a_rank_that_never_arrives():
    if gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs, {gpu_count()} visible")
    outcome = launch(os.path.join(HERE, "peer_worker.py"), 2, [], "peer")
    check_results(2, *outcome, min_runs=30)
