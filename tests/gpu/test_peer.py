"""GPU layer: the peer-memory path beyond one call at a time (``peer_worker.py`` under
``mpiexec -n 2``): calls across the flagged lines' wrap (the call number set just below
2^32, where the old 32-bit flag became 0 and unwritten lines passed for this call's), calls
captured in a CUDA graph and replayed with new input, calls on two
streams without synchronization between them, and a rank that never arrives (the others stop
at the call's timeout naming it, the group fails everywhere, no kernel keeps spinning);
``in_place_worker.py`` on 2 and 4 GPUs: two_shot all_reduce in place on symmetric memory
(``two_shot_in_place``); ``pipelined_worker.py`` on 2 and 4 GPUs: direct reduce_scatter of
large blocks with pushes and reductions overlapped (``pipelined_reduce_scatter``).

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


@pytest.mark.parametrize("world_size", [2, 4])
def test_two_shot_in_place_on_symmetric_memory(world_size):
    """``in_place_worker.py``: two_shot all_reduce in place on symmetric memory runs as one
    pass, bitwise as the program; alternates with program calls; replays in a graph; a rank
    that calls otherwise fails the call on every rank at once."""
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")
    outcome = launch(os.path.join(HERE, "in_place_worker.py"), world_size, [], "in_place")
    check_results(world_size, *outcome, min_runs=100)


@pytest.mark.parametrize("world_size", [2, 4])
def test_pipelined_reduce_scatter(world_size):
    """``pipelined_worker.py``: a direct reduce_scatter of large blocks runs with its pushes
    and reductions overlapped, bitwise as numpy in rank order; alternates with program calls;
    replays in a graph; a rank that never arrives ends the call on every other rank."""
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")
    outcome = launch(os.path.join(HERE, "pipelined_worker.py"), world_size, [], "pipelined")
    check_results(world_size, *outcome, min_runs=50)
