#!/usr/bin/env bash
# Issues 4, 6 and 7 on a lent 4-GPU host; name the parts to run (each fits one device call
# of under 10 minutes alone; `nccl mpi socket` together take ~6 minutes):
#   dtypes: float16 / bfloat16 against float32 all_reduce busbw at 1 and 16 MiB on 8 MPI
#           ranks (issue 7);
#   mpi:    the default sweep (4K:16M, the four collectives) with every algorithm on 8 MPI
#           ranks, twice: run A calibrates the model and stores its measured ratios (--tune),
#           run B measures again with that tuning file; auto's pick in B is what issue 6
#           judges (bench's summary and benchmarks/model_check.py);
#   nccl:   the same A/B on 4 GPUs (1M, 16M, 256M);
#   socket: the socket transport at 4 ranks against torch gloo (issue 4, many cores).
# $ROUNDS (default 3) interleaves each size's algorithms; $BIND below. JSON, logs and tuning
# files under $OUT.
set -u
[ $# -gt 0 ] || { echo "usage: tune_session.sh dtypes|mpi|nccl|socket ..."; exit 2; }
O=${OUT:-./tune-logs}; mkdir -p "$O"; PY=python3
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. benchmarks/device_build.sh "$O"
$PY -m collectives info | grep -aE "compiled MPI|MPI library"; nproc
# $BIND: Open MPI's placement (default none: the OS places and moves the ranks; e.g.
# "--bind-to core --map-by core" pins rank i to core i for runs that repeat alike)
M="mpiexec --allow-run-as-root --oversubscribe ${BIND:---bind-to none} -x NCCL_NVLS_ENABLE -x PYTHONPATH -x PYTHONUNBUFFERED"
ALGS=ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto
R=${ROUNDS:-3}
summary() { grep -aE "auto time|auto's choice|^#  (all_|reduce_)|tuned|calibrated|rows|Error" "$1" | head -n 40; }

dtypes() {
  for dt in float32 float16 bfloat16; do
    timeout -s KILL 90 $M -n 8 $PY benchmarks/bench.py --collectives all_reduce --sizes 1M,16M \
      --dtype $dt --algorithms ring,recursive_doubling,direct,native --rounds $R --no-progress \
      --json "$O/mpi8_$dt.json" > "$O/mpi8_$dt.log" 2>&1; echo "mpi8 $dt rc=$?"
    grep -aE "^ +(1|16)M " "$O/mpi8_$dt.log"
  done
}

mpi() {
  local T="$O/tuning_mpi8.json"
  timeout -s KILL 240 $M -n 8 $PY benchmarks/bench.py --calibrate "$T" --tune "$T" --algorithms $ALGS \
    --rounds $R --no-progress --json "$O/mpi8_tune.json" > "$O/mpi8_tune.log" 2>&1; echo "mpi8 A rc=$?"
  summary "$O/mpi8_tune.log"
  timeout -s KILL 240 $M -n 8 $PY benchmarks/bench.py --tuning "$T" --algorithms $ALGS \
    --rounds $R --no-progress --json "$O/mpi8_tuned.json" > "$O/mpi8_tuned.log" 2>&1; echo "mpi8 B rc=$?"
  summary "$O/mpi8_tuned.log"
  $PY benchmarks/model_check.py --quiet "$O/mpi8_tuned.json=$T" "$O/mpi8_tuned.json"
}

nccl() {
  local T="$O/tuning_nccl4.json"
  local NCCL="benchmarks/bench.py --backend nccl --collectives all_reduce,reduce_scatter,all_gather,all_to_all \
    --algorithms ring,ring_bidirectional,recursive_doubling,tree,direct,auto --sizes 1M,16M,256M"
  timeout -s KILL 150 $M -n 4 $PY $NCCL --tune "$T" --json "$O/nccl4_tune.json" > "$O/nccl4_tune.log" 2>&1
  echo "nccl4 A rc=$?"; grep -aE "auto:|tuned" "$O/nccl4_tune.log" | head -n 14
  timeout -s KILL 150 $M -n 4 $PY $NCCL --tuning "$T" --json "$O/nccl4_tuned.json" > "$O/nccl4_tuned.log" 2>&1
  echo "nccl4 B rc=$?"; grep -aE "auto:" "$O/nccl4_tuned.log" | head -n 12
  $PY benchmarks/model_check.py --quiet "$O/nccl4_tuned.json=$T" "$O/nccl4_tuned.json"
}

socket() {
  timeout -s KILL 150 $PY benchmarks/bench.py --backend socket --world-size 4 \
    --collectives all_reduce,all_gather,reduce_scatter --sizes 4K,64K,1M,16M,64M --no-progress --rounds 2 \
    --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto \
    --json "$O/socket4.json" > "$O/socket4.log" 2>&1; echo "socket4 rc=$?"
  summary "$O/socket4.log"
}

for part in "$@"; do
  case $part in
    dtypes|mpi|nccl|socket) echo "== $part"; $part ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
