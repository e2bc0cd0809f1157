"""The bench's backends: name -> ``(args) -> [(group, xp), ...]``, the groups this process drives.

``mpi``: one group per process under mpiexec. ``local``: one thread per rank of this
process. ``socket``: one group per process under collectives.run/torchrun, torch's gloo
attached as its baseline (``gloo``); run by hand, the bench re-executes itself under the
launcher (``launch``) with ``--world-size`` processes. ``nccl``: one GPU per process
(``nccl.nccl_group``), self-launched the same way with one rank per visible GPU.

With no ``--backend`` and nothing to detect (no MPI launcher, no collectives.run/torchrun, no
mpi4py) the bench refuses with what it looked for and the three ways on, rather than
guessing a backend that needs a world size (``default_backend``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np

from ..transports.mpi import launched as under_mpi

RANK_PREFIX = "[rank 0]:"
# the variables in which a launcher numbers this process, before any group exists
_RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK",
                   "RANK")


def under_launcher() -> bool:
    """True when collectives.run or torchrun started this process as one rank of a job."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launched() -> bool:
    """True when something started this process as one rank of a job (MPI or a launcher)."""
    return under_mpi() or under_launcher()


def launch_rank() -> int:
    """This process's rank as its launcher numbered it, before any group exists (0 when no
    launcher started it): messages printed before the groups are made come from rank 0
    only, instead of once per rank."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


def default_backend() -> str:
    """mpi under mpiexec/mpirun, socket under collectives.run/torchrun (RANK and WORLD_SIZE
    set), else mpi when mpi4py is importable. With none of these there is no backend to
    guess (``local`` and ``socket`` need a world size): a ValueError saying what was looked
    for and what to do."""
    if under_mpi():
        return "mpi"
    if under_launcher():
        return "socket"        # collectives.run or torchrun started us, not an MPI launcher
    try:
        import mpi4py  # noqa: F401
        return "mpi"
    except ImportError as exc:
        missing = exc
    raise ValueError(
        "no --backend given and none detected: this process was not started by mpiexec or "
        "mpirun, nor by collectives.run or torchrun (no RANK and WORLD_SIZE), and mpi4py is "
        f"not importable ({missing}). Either\n"
        "  install MPI support and run under mpiexec:\n"
        "    pip install mpi4py mpich && mpiexec -n 2 python benchmarks/bench.py\n"
        "  or run without MPI:\n"
        "    python benchmarks/bench.py --backend socket --world-size 2   (2 processes here; "
        "torch's gloo is the baseline when torch is installed)\n"
        "    python benchmarks/bench.py --backend local --world-size 2    (threads of this "
        "process, for checking schedules)")


def launch(argv, world_size: int, bind_to: str = "none") -> int:
    """Run the bench as ``world_size`` local processes through ``collectives.run`` (each
    bound to one core with ``bind_to`` "core"); pass rank 0's output through without the
    launcher's prefix; return the job's exit code."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"--world-size must be >= 1, got {world_size!r}")
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "collectives.run", "--standalone", "--nproc-per-node",
               str(world_size), "--bind-to", bind_to, "-m", "collectives.bench", *argv]
    if "--no-progress" not in argv:
        command.append("--no-progress")   # the launcher forwards whole lines: no live bar
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE)
    try:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(RANK_PREFIX):
                line = line[len(RANK_PREFIX):]
            sys.stdout.write(line)
            sys.stdout.flush()
    except KeyboardInterrupt:
        proc.terminate()
    return proc.wait()


def mpi_groups(args):
    from ..group import ProcessGroup
    from ..transports import create
    transport = create("mpi", rank=None, world_size=None, timeout=args.timeout)
    return [(ProcessGroup(transport, backend="mpi", timeout=args.timeout), transport.xp)]


def local_groups(args):
    from ..group import ProcessGroup
    from ..transports.local import LocalWorld
    if not args.world_size or args.world_size < 1:
        raise ValueError("bench --backend local needs --world-size N (N >= 1)")
    world = LocalWorld(args.world_size)
    groups = [None] * args.world_size

    def make(rank):       # a thread per rank: making a group is collective (tables compared)
        groups[rank] = (ProcessGroup(world.transport(rank), backend="local",
                                     timeout=args.timeout), np)
    threads = [threading.Thread(target=make, args=(r,)) for r in range(args.world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if any(g is None for g in groups):
        raise RuntimeError("bench --backend local: a rank's group could not be made")
    return groups


def socket_groups(args):
    """This rank's bench group over the socket transport, gloo attached as its baseline."""
    if not under_launcher():
        raise ValueError("bench --backend socket: RANK and WORLD_SIZE are not set; run the bench "
                         "directly (it launches its own processes) or under collectives.run")
    from datetime import timedelta

    import collectives as dist

    from .. import state
    from .gloo import gloo_baseline
    dist.init_process_group("socket", timeout=timedelta(seconds=args.timeout))
    group = state.world().default
    baseline, why = gloo_baseline(group, args.timeout)
    if baseline is not None:
        group.transport.native = baseline
    elif group.rank == 0:
        print(f"# no baseline column: {why}", flush=True)
    return [(group, np)]


def nccl_groups(args):
    from .nccl import nccl_group
    return [nccl_group(args.timeout)]


BACKENDS = {"mpi": mpi_groups, "local": local_groups, "socket": socket_groups,
            "nccl": nccl_groups}
