"""GPU layer: the NCCL transport on real GPUs, each world size in its own mpiexec job.

Marked ``gpu`` and skipped where ``collectives.transports.nccl.available()`` is False (CI has
no CuPy and no GPU) or where fewer GPUs than ranks are visible. Each test launches
``nccl_worker.py`` under ``mpiexec -n N`` (Open MPI needs ``--allow-run-as-root
--oversubscribe`` as root) and asserts that every rank ran every case with no failure: every
collective x algorithm (those registered, plus NCCL's native) x dtypes/ops x counts, each
unsegmented and pipelined, against exact host references that NCCL's own results also meet.

    python -m pytest -m gpu tests/gpu          # on a machine with >= 2 (ideally 4) GPUs
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

from collectives.transports import nccl

pytestmark = pytest.mark.gpu
OK, WHY = nccl.available()
# seconds one world size may take (the device session sets it below its own step limit)
LIMIT = float(os.environ.get("COLLECTIVES_GPU_TEST_SECONDS", "240"))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_worker.py")


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


@pytest.mark.skipif(not OK, reason=f"nccl backend unavailable: {WHY}")
@pytest.mark.parametrize("world_size,rendezvous,quick", [(4, "mpi", False), (2, "file", True)],
                         ids=["4gpus", "2gpus"])
def test_every_collective_matches(world_size, rendezvous, quick, tmp_path):
    if gpu_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs, {gpu_count()} visible")
    how = f"file:{tmp_path / 'store'}" if rendezvous == "file" else "mpi"
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1")
    command = mpiexec(world_size) + [sys.executable, WORKER, "--rendezvous", how] + \
        (["--quick"] if quick else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=LIMIT)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        pytest.fail(f"{world_size} ranks did not finish in {LIMIT} s; output so far:\n"
                    f"{out[-6000:]}")
    print(done.stdout[-3000:])
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
               if line.startswith("RESULT ")]
    detail = "\n".join(f for r in results for f in r["failures"])
    assert done.returncode == 0 and len(results) == world_size, \
        f"exit {done.returncode}, {len(results)} of {world_size} ranks reported\n" \
        f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert all(r["runs"] > 50 for r in results), results
    assert not detail, detail
