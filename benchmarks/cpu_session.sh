#!/usr/bin/env bash
# CPU benchmarks on a lent machine's many cores (Open MPI there), in one device call:
# build the compiled executor against that MPI, then the 8-rank MPI sweep (issues 3, 6, 7)
# and the socket transport against torch gloo (issue 4). Logs and JSON under $OUT.
#   bash benchmarks/cpu_session.sh
set -u
OUT=${OUT:-./cpu-logs}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=python3
MPI="mpiexec --allow-run-as-root --oversubscribe --bind-to none"

cstep() {   # cstep NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
  echo "=== $name: rc=$? in $(( $(date +%s) - t0 ))s"
}

if ls .whl/cython-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/cython-*.whl && export PYTHONPATH=/tmp/site
fi
header=$(find / -name mpi.h -path "*openmpi*" 2>/dev/null | head -n 1)
[ -n "$header" ] && export COLLECTIVES_MPI_INCLUDE=$(dirname "$header")
cstep build 120 $PY setup.py build_ext --inplace
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
$PY -m collectives info > "$OUT/info.log" 2>&1; grep -E "MPI library|compiled MPI|mpi " "$OUT/info.log"
nproc
cstep mpi8 200 $MPI -n 8 $PY benchmarks/bench.py --algorithms ring,tree,recursive_doubling,native,auto \
  --json "$OUT/mpi8.json" --plot "$OUT/mpi8.png" --no-progress
cstep socket4 150 $PY benchmarks/bench.py --backend socket --world-size 4 \
  --collectives all_reduce,all_gather,reduce_scatter --sizes 4K,64K,1M,16M,64M \
  --algorithms ring,tree,recursive_doubling,native --json "$OUT/socket4.json" --no-progress
echo "################ cpu summary"
grep -E "^# |^ +[0-9]+[KMG]? " "$OUT/mpi8.log" | head -n 170
grep -E "^# |^ +[0-9]+[KMG]? " "$OUT/socket4.log" | head -n 60
