#!/usr/bin/env bash
# Issue 6's check on runs the model was not fitted to (one 4-GPU device call, ~5 min):
# every algorithm and auto on 4 GPUs (nccl), on 8 MPI ranks (calibrated first; --rounds 3
# interleaves each size's algorithms, $ROUNDS to change) and on 4
# socket ranks against gloo. The bench's summary prints auto's time over the best measured
# algorithm per size; benchmarks/model_check.py replays the same JSON. Logs/JSON under $OUT.
set -u
O=${OUT:-./validate-logs}; mkdir -p "$O"; PY=python3
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
. benchmarks/device_build.sh "$O"
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x PYTHONPATH -x PYTHONUNBUFFERED"
summary() { grep -aE "auto time|^#  (all_|reduce_)|rows|Error" "$1" | head -n 24; }
timeout -s KILL 200 $M -n 4 $PY benchmarks/bench.py --backend nccl \
  --collectives all_reduce,reduce_scatter,all_gather,all_to_all \
  --algorithms ring,ring_bidirectional,recursive_doubling,tree,direct,auto --sizes 1M,16M,256M \
  --json "$O/nccl4_validate.json" > "$O/nccl4_validate.log" 2>&1; echo "nccl4 rc=$?"
grep -aE "auto:" "$O/nccl4_validate.log" | head -n 12
timeout -s KILL 200 $M -n 8 $PY benchmarks/bench.py --calibrate "$O/tuning_mpi8_validate.json" \
  --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto --sizes 4K:64M \
  --rounds ${ROUNDS:-3} --no-progress --json "$O/mpi8_validate.json" > "$O/mpi8_validate.log" 2>&1; echo "mpi8 rc=$?"
summary "$O/mpi8_validate.log"
timeout -s KILL 150 $PY benchmarks/bench.py --backend socket --world-size 4 \
  --collectives all_reduce,all_gather,reduce_scatter --sizes 4K,64K,1M,16M,64M --no-progress \
  --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,native,auto \
  --json "$O/socket4_validate.json" > "$O/socket4_validate.log" 2>&1; echo "socket4 rc=$?"
summary "$O/socket4_validate.log"
