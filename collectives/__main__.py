"""``python -m collectives info``: what this installation can do here, and why not, and every
COLLECTIVES_* setting with its value here (``--settings-table``: their table in
docs/settings.md).
``python -m collectives tune show FILE``: a tuning file (``bench.py --tune``) as a table."""
from __future__ import annotations

import importlib
import platform
import sys

from . import settings


def _version(module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure to import is information here
        return f"not usable ({type(exc).__name__}: {exc})"
    return getattr(module, "__version__", "installed")


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("collectives")
    except PackageNotFoundError:
        return "(not installed; running from a source tree)"


def _mpi_library() -> str:
    try:
        from mpi4py import MPI
    except Exception as exc:  # noqa: BLE001
        return f"none ({exc})"
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def _gpus() -> str:
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"none seen ({type(exc).__name__}: {str(exc)[:80]})"
    names = []
    for index in range(count):
        props = cupy.cuda.runtime.getDeviceProperties(index)
        names.append(props["name"].decode() if isinstance(props["name"], bytes) else props["name"])
    return f"{count}: " + ", ".join(names)


def _compiled_executor() -> str:
    from .bench import missing_extension_reason
    from .executors import compiled
    status = compiled.status()
    if status.startswith("extension not built"):
        # the usual cause is a checkout shadowing the installed package: say so and what to do
        status = missing_extension_reason(_package_dir()) or status
    return status


def _package_dir() -> str:
    import os
    return os.path.dirname(os.path.abspath(__file__))


def _peer_lane() -> str:
    try:
        from .executors import _peer_lane  # noqa: F401
    except ImportError as exc:
        return f"not built ({exc}): repeated calls take the Python path"
    return "built" + ("" if settings.PEER_LANE() else " (off: COLLECTIVES_PEER_LANE=0)")


def _kernels() -> list[str]:
    lines = [f"compiled MPI executor (Cython): {_compiled_executor()}",
             f"compiled peer-memory repeat path (Cython): {_peer_lane()}"]
    try:
        from .kernels.reduce import kernel_status
    except ImportError:
        return lines + ["numpy reductions only (no compiled kernel module)"]
    return lines + [f"{name}: {state}" for name, state in kernel_status().items()]


def info() -> str:
    from . import transports
    from .algorithms import ALIASES, capabilities

    lines = [f"collectives {_package_version()} from {_package_dir()}",
             f"python {platform.python_version()} ({sys.executable}) on {platform.machine()}",
             f"numpy {_version('numpy')}, ml_dtypes {_version('ml_dtypes')}, "
             f"numba {_version('numba')}, mpi4py {_version('mpi4py')}, "
             f"cupy {_version('cupy')}, torch {_version('torch')}",
             f"MPI library: {_mpi_library()}",
             f"GPUs: {_gpus()}",
             "transports:"]
    for name in ["local"] + sorted(transports.BACKENDS):
        ok, why = (True, "threads in one process") if name == "local" else transports.available(name)
        lines.append(f"  {name:7s} {'usable' if ok else 'not usable'}" + (f" ({why})" if why else ""))
    lines.append("compiled kernels:")
    lines.extend(f"  {line}" for line in _kernels())
    lines.append("algorithms:")
    for collective, names in capabilities().items():
        also = [f"{a} = {n}" for a, n in sorted(ALIASES.get(collective, {}).items())
                if n in names]
        lines.append(f"  {collective:15s} {', '.join(names)}"
                     + (f" (also {', '.join(also)})" if also else ""))
    lines.append("settings (value here; [when read]):")
    lines.extend(f"  {line}" for line in settings.describe())
    return "\n".join(lines)


USAGE = ("usage: python -m collectives info [--settings-table]\n"
         "       python -m collectives tune show FILE")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["info"]:
        print(info())
        return 0
    if argv == ["info", "--settings-table"]:
        print(settings.markdown_table())
        return 0
    if len(argv) == 3 and argv[:2] == ["tune", "show"]:
        from .tuning import show
        try:
            print(show(argv[2]))
        except ValueError as exc:
            print(f"python -m collectives tune show: {exc}", file=sys.stderr)
            return 2
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
