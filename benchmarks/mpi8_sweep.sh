#!/usr/bin/env bash
# The 8-rank MPI sweep with every registered algorithm (issue 6's data), on a lent host's
# CPUs with its Open MPI, calibrating first; ~2 min. $OUT gets mpi8_all.json, tuning, log.
set -u
O=${OUT:-./mpi8-logs}; mkdir -p "$O"; PY=python3
. benchmarks/device_build.sh "$O"
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x PYTHONUNBUFFERED"
for r in ${REPS:-1}; do
  timeout -s KILL 240 $M -n 8 $PY benchmarks/bench.py --calibrate "$O/tuning_mpi8_$r.json" \
    --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto --sizes 4K:64M \
    --no-progress --json "$O/mpi8_all_$r.json" > "$O/mpi8_all_$r.log" 2>&1; echo "mpi8 rep $r rc=$?"
  grep -aE "^# +(calibrated|all_|reduce_)|auto time|rows" "$O/mpi8_all_$r.log" | head -n 20
done
