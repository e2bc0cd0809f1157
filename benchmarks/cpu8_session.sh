#!/usr/bin/env bash
# CPU benchmarks on a lent host's many cores, one device call (~6 min), for issues 4, 6, 7:
# the compiled executor built against the host's Open MPI; the 8-rank MPI sweep with every
# algorithm, native and auto (calibrating the model first); all_to_all with 1 and 8 steps in
# flight (COLLECTIVES_WINDOW); the socket transport at 4 ranks against torch gloo, with the
# same-host shared-memory path (default) and without it (COLLECTIVES_SOCKET_SHM=0).
# JSON and logs under $OUT.
set -u
O=${OUT:-./cpu8-logs}; mkdir -p "$O"; PY=python3
. benchmarks/device_build.sh "$O"
$PY -m collectives info | grep -aE "compiled MPI|MPI library"; nproc
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x PYTHONUNBUFFERED -x COLLECTIVES_WINDOW"
ALGS=ring,tree,recursive_doubling,direct,native,auto
timeout -s KILL 200 $M -n 8 $PY benchmarks/bench.py --calibrate "$O/tuning_mpi8.json" --algorithms $ALGS \
  --sizes 4K:64M --no-progress --json "$O/mpi8.json" --plot "$O/mpi8.png" > "$O/mpi8.log" 2>&1; echo "mpi8 rc=$?"
grep -aE "^# +(all_|reduce_|auto|model|calibrated)|rows" "$O/mpi8.log" | head -n 30
for w in 1 8; do
  export COLLECTIVES_WINDOW=$w
  timeout -s KILL 60 $M -n 8 $PY benchmarks/bench.py --collectives all_to_all --algorithms ring,direct,native \
    --sizes 16K:16M --no-progress --json "$O/a2a_window$w.json" > "$O/a2a_window$w.log" 2>&1; echo "a2a window $w rc=$?"
  grep -aE "^ +[0-9]+[KM] " "$O/a2a_window$w.log"
done
unset COLLECTIVES_WINDOW
SOCK="benchmarks/bench.py --backend socket --world-size 4 --collectives all_reduce,all_gather,reduce_scatter --no-progress"
timeout -s KILL 150 $PY $SOCK --sizes 4K,64K,1M,16M,64M --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto \
  --json "$O/socket4.json" > "$O/socket4.log" 2>&1; echo "socket4 (shm) rc=$?"
grep -aE "^#  (all_|reduce_)|rows" "$O/socket4.log"
COLLECTIVES_SOCKET_SHM=0 timeout -s KILL 90 $PY $SOCK --sizes 4K,1M,16M,64M --algorithms ring,recursive_doubling,direct,native \
  --json "$O/socket4_tcp.json" > "$O/socket4_tcp.log" 2>&1; echo "socket4 (tcp only) rc=$?"
grep -aE "^#  (all_|reduce_)|rows" "$O/socket4_tcp.log"
