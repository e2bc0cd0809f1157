"""The ``mpiexec`` the tests launch jobs with, and the flags it needs.

The launcher is the one next to the Python running the tests (the MPICH wheel installs it in
the venv's bin), else MPICH's/Open MPI's on PATH. Open MPI gets ``--oversubscribe`` (and
``--allow-run-as-root`` as root); MPICH needs nothing. Tests that need it are marked
``needs_mpi`` (skipped, saying why, when mpi4py or an mpiexec is missing)."""
import os
import shutil
import subprocess
import sys

import pytest

from repo import HELPERS, ROOT, child_env


def find_mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec") or shutil.which("mpirun")


def launcher_flags(mpiexec):
    """Open MPI refuses root and more ranks than cores unless told; MPICH needs nothing."""
    try:
        version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout + ""
    except (OSError, subprocess.TimeoutExpired):
        return []
    if "Open MPI" in version or "OpenRTE" in version or "PRRTE" in version:
        flags = ["--oversubscribe"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
        return flags
    return []


MPIEXEC = find_mpiexec()
try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False
SKIP_REASON = "needs mpi4py and an mpiexec (pip install mpi4py mpich)"
needs_mpi = pytest.mark.skipif(not (MPIEXEC and HAVE_MPI4PY), reason=SKIP_REASON)
_FLAGS = None


def have_mpi() -> bool:
    return bool(MPIEXEC and HAVE_MPI4PY)


def command(n, *args):
    """``mpiexec [flags] -n n <this python> args...``."""
    global _FLAGS
    if _FLAGS is None:
        _FLAGS = launcher_flags(MPIEXEC)
    return [MPIEXEC, *_FLAGS, "-n", str(n), sys.executable, *map(str, args)]


def mpirun(n, *args, timeout=120):
    """Run ``python args...`` on ``n`` ranks from the checkout's root, the checkout and these
    helpers importable (a test file run as its own worker imports them); the CompletedProcess."""
    env = child_env(path=[HELPERS])
    env.pop("COLLECTIVES_ALGORITHM", None)
    return subprocess.run(command(n, *args), capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)
