"""What runs here: the executor that runs the plans (and why not the compiled one where it
could), and how many ranks of the job share this host's usable cores. More ranks than cores
is warned about in the header and again after the summary: the times are then of an
oversubscribed machine."""
from __future__ import annotations

import os
import sys

import numpy as np


def _package_dir() -> str:
    """The folder of the ``collectives`` package this process imported."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _extension_in(package_dir: str) -> str | None:
    """The compiled MPI executor's extension file in the ``collectives`` folder
    ``package_dir``, or None."""
    from importlib.machinery import EXTENSION_SUFFIXES
    for suffix in EXTENSION_SUFFIXES:
        path = os.path.join(package_dir, "executors", "_mpi_exec" + suffix)
        if os.path.exists(path):
            return path
    return None


def missing_extension_reason(package_dir: str, search_path=None) -> str | None:
    """Why the package in ``package_dir`` has no compiled MPI executor, when the cause is
    where it was imported from; None when the extension is there, or when nothing better
    than ``compiled.status()`` can be said.

    The trap: after ``pip install .`` (not editable) the extension is built into the
    installed copy only, but Python run from the checkout (``python -m ...``, a script in
    its root) puts the checkout first on sys.path, so the source tree, which has no
    extension, shadows the installed package. ``search_path`` (default sys.path plus the
    site-packages folders) is searched for such another copy."""
    if _extension_in(package_dir):
        return None
    if search_path is None:
        import site
        search_path = list(sys.path) + site.getsitepackages() + [site.getusersitepackages()]
    here = os.path.realpath(package_dir)
    for entry in search_path:
        other = os.path.join(entry or os.getcwd(), "collectives")
        if os.path.realpath(other) != here and _extension_in(other):
            return (f"extension not built in {package_dir} (the source tree shadows the "
                    f"installed package at {other}, which has it: run pip install -e . in "
                    f"the checkout, or run from outside the checkout)")
    if os.path.exists(os.path.join(os.path.dirname(package_dir), "setup.py")):
        return (f"extension not built in {package_dir} (a source tree: pip install -e "
                f"\".[mpi]\" there builds it in place)")
    return None


def describe_executor(group, dtype=None, largest: int = 0) -> str:
    """Which executor runs this group's plans, and why not the compiled one where it could;
    with the run's ``dtype`` and ``largest`` size in bytes, also what the compiled executor
    hands to the Python one (complex and long double elements, messages of 2 GiB or more)."""
    transport = group.transport.name
    if transport == "nccl":
        return _gpu_executor(group)
    if transport != "mpi":
        return (f"Python host executor (the {transport} transport runs plans step by step "
                f"in Python; only mpi has a compiled executor)")
    from ..executors import compiled, host
    # the group's choice (made once, from what the transport offers); a transport's own
    # ``execute`` where a group does not carry one
    execute = getattr(group, "execute", None) or getattr(group.transport, "execute", None)
    if execute is not None and execute is not host.execute:
        line = (f"compiled MPI executor (Cython, the whole plan in C), {compiled.status()}, "
                f"from {_package_dir()}")
        dtype = None if dtype is None else np.dtype(dtype)
        if dtype is not None and (dtype.kind == "c" or dtype.kind == "f" and dtype.itemsize > 8):
            line += f"; but {dtype} plans run in the Python host executor"
        elif largest >= 2**31:
            line += "; but messages of 2 GiB or more run in the Python host executor"
        return line
    why = compiled.status()
    if why.startswith("extension not built"):
        why = missing_extension_reason(_package_dir()) or why
    elif compiled.available():
        why = f"it loads ({why}), but this group did not select it"
    return f"Python host executor: the compiled MPI executor is not used here: {why}"


def _gpu_executor(group) -> str:
    """The GPU group's executor: peer memory where the group opened it, else NCCL
    send/recv, and why (the group's executor records why peer memory is off)."""
    from ..executors import nccl
    why = group.executor.peer_path
    if getattr(group, "execute", None) in (None, nccl.execute):
        return ("NCCL send/recv executor (stream-ordered, on the GPU)"
                + (f"; peer memory: {why}" if why else ""))
    return ("peer-memory executor (whole plans on the GPU over peer memory); our schedules on "
            "NCCL send/recv beside it as <algorithm>:sendrecv rows")


def usable_cores() -> set:
    """The cores this process may run on (its affinity), else all of the host's."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


MASK_CORES = 4096         # the core numbers a socket job's ranks compare (those beyond: not counted)


def host_load(group) -> tuple[int, int, bool]:
    """(ranks of the job on this host, cores they may run on, whether each runs on one core).
    Under MPI and over sockets a collective call: every rank of ``group`` calls it; the cores
    are the union of the affinity of the ranks that share this host (a launcher that binds
    each rank to one core leaves each rank one, the host still has as many as there are
    ranks). Over sockets the union is over every rank of the group (a job on hosts alike: the
    same core numbers)."""
    transport = group.transport.name
    mine = sorted(usable_cores())
    if transport == "mpi":
        from mpi4py import MPI
        node = group.transport.comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            masks = node.allgather(mine)
            return (node.Get_size(), len(set().union(*map(set, masks))),
                    all(len(m) == 1 for m in masks))
        finally:
            node.Free()
    if transport == "socket":
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        ranks = int(local) if local.isdigit() else group.size
        from ..ops import ReduceOp
        mask = np.zeros(MASK_CORES + 1, np.int64)     # the last: this rank's count of cores
        mask[[c for c in mine if c < MASK_CORES]] = 1
        mask[-1] = len(mine)
        union = np.zeros_like(mask)
        group.prepare("all_reduce", input=mask, output=union, op=ReduceOp.MAX,
                      algorithm="ring")()
        return ranks, int(union[:-1].sum()), int(union[-1]) == 1
    return group.size, len(mine), False         # local: every rank is a thread here



def oversubscription_warning(ranks: int, cores: int, backend: str) -> str | None:
    """The warning for more ranks than cores on one host; None when each rank has a core."""
    if ranks <= cores:
        return None
    how = {"mpi": f"mpiexec -n {cores}", "socket": f"--world-size {cores}",
           "local": f"--world-size {cores}"}.get(backend, f"{cores} ranks")
    advice = (f"use at most one rank per core ({how} here)" if cores > 1 else
              "run on a host that gives the job at least 2 cores")
    return (f"WARNING: {ranks} ranks on {cores} core{'s' if cores != 1 else ''} of this host: "
            f"oversubscribed, so ranks take turns on the cores and the times measure the "
            f"scheduler as much as the algorithms; ratios between algorithms and to native "
            f"are unreliable: {advice}")
