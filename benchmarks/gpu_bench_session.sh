#!/usr/bin/env bash
# The issue 5/6 GPU tables in one device call (~8 min on 4 GPUs): the torch CUDA suite at 4
# and 2 GPUs, then bench.py --backend nccl with every algorithm and auto on 4 GPUs (1M, 16M,
# 256M; 1G without tree) and on 2 GPUs. NCCL native and the point-to-point ceiling are in
# every table. JSON and logs under $OUT.
set -u
O=${OUT:-./gpu-bench-logs}; mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=$O/torch bash benchmarks/gpu_session.sh torch 2>&1 | grep -aE "RESULT|passed|failed" | head -n 12
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED"
B="benchmarks/bench.py --backend nccl --collectives all_reduce,reduce_scatter,all_gather,all_to_all"
run() {   # run NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  timeout -s KILL "$limit" "$@" --json "$O/$name.json" > "$O/$name.log" 2>&1
  echo "=== $name rc=$?"
  grep -aE "^# +(all_|reduce_|auto)|rows|Error" "$O/$name.log" | head -n 30
}
run nccl4 230 $M -n 4 python3 $B --algorithms ring,ring_bidirectional,recursive_doubling,tree,direct,auto --sizes 1M,16M,256M
run nccl4_1g 100 $M -n 4 python3 $B --algorithms ring,ring_bidirectional,recursive_doubling,direct --sizes 1G
run nccl2 120 env CUDA_VISIBLE_DEVICES=0,1 $M -x CUDA_VISIBLE_DEVICES -n 2 python3 $B \
  --algorithms ring,ring_bidirectional,recursive_doubling,direct,auto --sizes 1M,16M,256M,1G
