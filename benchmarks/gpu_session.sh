#!/usr/bin/env bash
# One device call (about 7 minutes): GPU tests at 4 and 2 GPUs, then the benchmark on 4 GPUs
# (4 collectives x ring, ring_bidirectional, recursive_doubling, tree, native; 1M-1G) and on
# 2 GPUs (ring, ring_bidirectional, native).
#   bash benchmarks/gpu_session.sh            (logs under $OUT, or ./gpu-logs; at most 7 files)
# Every step has its own timeout so one hang cannot eat the call; a short table ends the run.
set -u
OUT=${OUT:-./gpu-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=python3
MPI="mpiexec --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED"
SIZES=${SIZES:-1M,16M,256M,1G}
COLLS=all_reduce,reduce_scatter,all_gather,all_to_all

step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
  tail -n 3 "$OUT/$name.log"
}

{
  nvidia-smi -L
  $PY -c "import cupy; from cupy.cuda import nccl; print('cupy', cupy.__version__, 'nccl', nccl.get_version(), 'gpus', cupy.cuda.runtime.getDeviceCount())"
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

step tests4 100 env COLLECTIVES_GPU_TEST_SECONDS=92 $PY -m pytest -m gpu tests/gpu -q -rs -s -k 4gpus
step tests2 55 env COLLECTIVES_GPU_TEST_SECONDS=48 CUDA_VISIBLE_DEVICES=0,1 \
  $PY -m pytest -m gpu tests/gpu -q -rs -s -k 2gpus
step bench4 175 $MPI -n 4 $PY benchmarks/bench.py --backend nccl --collectives $COLLS \
  --algorithms ring,ring_bidirectional,recursive_doubling,tree --sizes $SIZES --json "$OUT/bench4.json"
step bench2 55 env CUDA_VISIBLE_DEVICES=0,1 $MPI -x CUDA_VISIBLE_DEVICES -n 2 $PY benchmarks/bench.py \
  --backend nccl --collectives $COLLS --algorithms ring,ring_bidirectional --sizes $SIZES \
  --json "$OUT/bench2.json"

echo
echo "################ summary"
for n in 4 2; do
  echo "## tests, $n GPUs"
  grep -h "FAIL\|progress\|kernel check\|graph check\|passed\|failed\|skipped\|Error\|did not finish" \
    "$OUT/tests$n.log" | head -n 25
done
for n in 4 2; do
  echo "## bench, $n GPUs"
  grep -E "^# |collective|^ +(all_|reduce_)" "$OUT/bench$n.log" | grep -v ":ceiling" | head -n 150
done
