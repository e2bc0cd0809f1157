#!/usr/bin/env bash
# Issue 7's 8-rank profile on a lent host's CPUs (Open MPI there), one device call, ~5 min:
# (a) the breakdown of our all_reduce / all_to_all at 1, 4, 16 MiB (full plan, transfers only,
#     reductions only, native, copies: benchmarks/profile_breakdown.py);
# (b) Open MPI's own algorithms pinned (coll_tuned): all_reduce ring (4), segmented ring (5),
#     Rabenseifner (6); all_to_all linear (1, every exchange in flight) and pairwise (2, one
#     at a time, like our ring) -- against its default choice in the same job;
# (c) our ring/RD against native with $COLLECTIVES_WINDOW 1 and 4 (steps in flight), twice.
# Logs under $OUT. Needs the compiled executor built against the host's Open MPI.
set -u
O=${OUT:-./profile8-logs}; mkdir -p "$O"; PY=python3
. benchmarks/device_build.sh "$O"
$PY -m collectives info | grep -ai compiled
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x PYTHONUNBUFFERED -x COLLECTIVES_WINDOW"
timeout 100 $M -n 8 $PY benchmarks/profile_breakdown.py 1,4,16 5 > "$O/profile8.log" 2>&1; echo "profile rc=$?"
cat "$O/profile8.log"
for a in 0 4 5 6; do
  timeout 40 $M --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm $a -n 8 \
    $PY benchmarks/bench.py --collectives all_reduce --algorithms native --sizes 1M:16M --no-progress > "$O/ompi_allreduce_alg$a.log" 2>&1
  echo "== Open MPI all_reduce algorithm $a"; grep -aE "^ +[0-9]+[KM] " "$O/ompi_allreduce_alg$a.log"
done
for a in 0 1 2; do
  timeout 40 $M --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_alltoall_algorithm $a -n 8 \
    $PY benchmarks/bench.py --collectives all_to_all --algorithms native --sizes 1M:16M --no-progress > "$O/ompi_alltoall_alg$a.log" 2>&1
  echo "== Open MPI all_to_all algorithm $a"; grep -aE "^ +[0-9]+[KM] " "$O/ompi_alltoall_alg$a.log"
done
for w in ${WINDOWS:-1}; do for r in 1 2; do
  export COLLECTIVES_WINDOW=$w
  timeout 60 $M -n 8 $PY benchmarks/bench.py --collectives all_reduce,all_gather,all_to_all \
    --algorithms ring,recursive_doubling,native --sizes 1M:16M --no-progress --json "$O/window${w}_$r.json" > "$O/window${w}_$r.log" 2>&1
  echo "== window $w rep $r rc=$?"; grep -aE "^ +[0-9]+[KM] |^#  (all_|reduce_)" "$O/window${w}_$r.log" | head -n 40
done; done
