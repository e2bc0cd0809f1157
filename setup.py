"""Builds the optional compiled extensions: the MPI executor and the peer-memory repeat path.
Everything else is in setup.cfg.

The MPI executor needs Cython, mpi4py's Cython declarations and an MPI's mpi.h (found through
``$COLLECTIVES_MPI_INCLUDE``, ``$MPICC`` or ``mpicc -show``; the mpich wheel in the build
requirements provides one). Build it against the MPI you run on: an extension built with
MPICH's headers refuses to run on Open MPI (and says so in ``python -m collectives info``). If
any of that is missing, or the compile fails, the package installs without it and
``python -m collectives info`` says why. The repeat path needs Cython only; without it
repeated peer-memory calls take the Python path.
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def mpi_include_dirs():
    if os.environ.get("COLLECTIVES_MPI_INCLUDE"):        # the folder holding mpi.h, by hand
        return [os.environ["COLLECTIVES_MPI_INCLUDE"]]
    mpicc = os.environ.get("MPICC") or shutil.which("mpicc")
    if mpicc:
        try:
            flags = subprocess.run([mpicc, "-show"], capture_output=True, text=True,
                                   check=True).stdout
            dirs = [f[2:] for f in shlex.split(flags) if f.startswith("-I")]
            if dirs:
                return dirs
        except (OSError, subprocess.CalledProcessError):
            pass
    header = os.path.join(sys.prefix, "include", "mpi.h")      # the mpich wheel's layout
    return [os.path.dirname(header)] if os.path.exists(header) else []


def extensions():
    """The peer-memory repeat path (Cython alone) and the compiled MPI executor (Cython,
    mpi4py's declarations and an mpi.h), each where what it needs is there."""
    try:
        from Cython.Build import cythonize
    except ImportError as exc:
        print(f"collectives: not building the compiled extensions ({exc})", file=sys.stderr)
        return []
    here = "collectives/executors"
    exts = [Extension("collectives.executors._peer_lane", [f"{here}/_peer_lane.pyx"],
                      extra_compile_args=["-O3"])]
    try:
        import mpi4py
    except ImportError as exc:
        print(f"collectives: not building the compiled executor ({exc})", file=sys.stderr)
        mpi4py = None
    include = mpi_include_dirs() if mpi4py else []
    if mpi4py and not include:
        print("collectives: not building the compiled executor (no mpi.h found)", file=sys.stderr)
    if include:
        # depends: a changed header rebuilds the extension, and the header goes into the sdist
        exts.append(Extension("collectives.executors._mpi_exec", [f"{here}/_mpi_exec.pyx"],
                              include_dirs=[here] + include + [mpi4py.get_include()],
                              depends=[f"{here}/_mpi_exec.h"], extra_compile_args=["-O3"]))
    return cythonize(exts, compiler_directives={"language_level": 3}, quiet=True)


class OptionalBuildExt(build_ext):
    """A failed compile is a warning, not a failed install: the Python executor remains."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001
            print(f"collectives: compiled extensions not built: {exc}", file=sys.stderr)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            print(f"collectives: {ext.name} not built: {exc}", file=sys.stderr)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
