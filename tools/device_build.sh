# Sourced from the repository root on a lent GPU machine (`. tools/device_build.sh "$O"`): Cython
# from the carried wheel (.whl/, no network there), then the compiled executor built in place
# against the host's Open MPI headers; the build log goes to $1/build.log. Sets PY and exports
# PYTHONPATH (the checkout, then the wheel's install target).
PY=${PY:-python3}
ls .whl/cython-*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/cython-*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
_mpi_h=$(find / -name mpi.h -path "*openmpi*" 2>/dev/null | head -n 1)
[ -n "$_mpi_h" ] && export COLLECTIVES_MPI_INCLUDE=$(dirname "$_mpi_h")
$PY setup.py build_ext --inplace > "${1:-.}/build.log" 2>&1; echo "build rc=$?"
