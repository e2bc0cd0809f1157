#!/usr/bin/env bash
# One device call. Modes:
#   bash benchmarks/gpu_session.sh tests   GPU tests only: 4 GPUs (limit 90 s) then 2 GPUs
#                                          (limit 50 s), ~150 s at most, short summary
#   bash benchmarks/gpu_session.sh torch   the torch CUDA suite only (torch_worker.py through
#                                          the facade): 4 GPUs then 2 GPUs, limit TT s each
#                                          (default 90), short summary
#   bash benchmarks/gpu_session.sh [full]  tests, then the benchmark on 4 GPUs (4 collectives
#                                          x ring, ring_bidirectional, recursive_doubling,
#                                          tree, native; 1M-1G) and on 2 GPUs (ring,
#                                          ring_bidirectional, native); about 7 minutes
#   bash benchmarks/gpu_session.sh launcher  the benchmark under our launcher instead of
#                                          mpiexec (env:// rendezvous, NCCL id and host sync
#                                          through the store): 2 GPUs, all_reduce and
#                                          all_to_all, ring and recursive_doubling, 1M and
#                                          16M (limit 120 s); then the same by hand (no
#                                          launcher: it self-launches one rank per GPU)
# Logs under $OUT (or ./gpu-logs). Limits nest so a hang always reports where it was: the
# worker dumps its stacks and exits 10 s before the test's limit, the test kills its ranks by
# pid at its limit, this script's `timeout` (a few seconds later) is the last resort.
set -u
MODE=${1:-full}
case "$MODE" in tests|torch|full|launcher) ;; *) echo "usage: $0 [tests|torch|full|launcher]"; exit 2;; esac
OUT=${OUT:-./gpu-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=python3
MPI="mpiexec --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED"
SIZES=${SIZES:-1M,16M,256M,1G}
COLLS=all_reduce,reduce_scatter,all_gather,all_to_all
T4=${T4:-90}
T2=${T2:-50}

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

if [ "$MODE" = launcher ]; then
  TL=${TL:-120}
  # TERM first (the launcher forwards it to its workers), KILL only as the last resort
  step launcher2 $TL timeout -k 5 $((TL - 10)) env CUDA_VISIBLE_DEVICES=0,1 $PY -m collectives.run --standalone \
    --nproc-per-node 2 benchmarks/bench.py --backend nccl --collectives all_reduce,all_to_all \
    --algorithms ring,recursive_doubling --sizes 1M,16M --json "$OUT/launcher2.json"
  step byhand2 $TL timeout -k 5 $((TL - 10)) env CUDA_VISIBLE_DEVICES=0,1 $PY benchmarks/bench.py --backend nccl \
    --collectives all_reduce --algorithms ring --sizes 1M,16M --json "$OUT/byhand2.json"
  echo
  echo "################ summary (launcher)"
  for name in launcher2 byhand2; do
    echo "## $name"
    grep -hE "^(\[rank [0-9]+\]:)?(# |.*collective|.*Error|.*Traceback| +(all_|reduce_))|collectives.run:" \
      "$OUT/$name.log" | grep -v ":ceiling" | head -n 40
  done
  exit 0
fi

if [ "$MODE" = torch ]; then
  TT=${TT:-90}
  step torch4 $((TT + 5)) env COLLECTIVES_GPU_TEST_SECONDS_4=$TT \
    $PY -m pytest -m gpu tests/gpu -q -rs -s -k "torch and 4gpus" -p no:cacheprovider
  step torch2 $((TT + 5)) env COLLECTIVES_GPU_TEST_SECONDS_2=$TT CUDA_VISIBLE_DEVICES=0,1 \
    $PY -m pytest -m gpu tests/gpu -q -rs -s -k "torch and 2gpus" -p no:cacheprovider
  echo
  echo "################ summary (torch)"
  for n in 4 2; do
    echo "## torch, $n GPUs"
    grep -h "FAIL\|RESULT\|passed\|failed\|skipped\|did not finish\|Thread 0x\|File \"" \
      "$OUT/torch$n.log" | cut -c1-400 | head -n 40
    echo "last stage lines:"
    grep -h "^stage" "$OUT/torch$n.log" | tail -n 6
  done
  exit 0
fi

step tests4 $((T4 + 5)) env COLLECTIVES_GPU_TEST_SECONDS_4=$T4 \
  $PY -m pytest -m gpu tests/gpu -q -rs -s -k "4gpus and not torch" -p no:cacheprovider
step tests2 $((T2 + 5)) env COLLECTIVES_GPU_TEST_SECONDS_2=$T2 CUDA_VISIBLE_DEVICES=0,1 \
  $PY -m pytest -m gpu tests/gpu -q -rs -s -k "2gpus and not torch" -p no:cacheprovider

summary_tests() {
  for n in 4 2; do
    echo "## tests, $n GPUs"
    grep -h "FAIL\|progress\|kernel check\|graph check\|passed\|failed\|skipped\|Error\|did not finish\|Timeout\|Thread 0x\|File \"" \
      "$OUT/tests$n.log" | head -n 30
    echo "last stage lines:"
    grep -h "^stage" "$OUT/tests$n.log" | tail -n 6
  done
}

if [ "$MODE" = tests ]; then
  echo
  echo "################ summary (tests)"
  summary_tests
  exit 0
fi

step bench4 175 $MPI -n 4 $PY benchmarks/bench.py --backend nccl --collectives $COLLS \
  --algorithms ring,ring_bidirectional,recursive_doubling,tree --sizes $SIZES --json "$OUT/bench4.json"
step bench2 55 env CUDA_VISIBLE_DEVICES=0,1 $MPI -x CUDA_VISIBLE_DEVICES -n 2 $PY benchmarks/bench.py \
  --backend nccl --collectives $COLLS --algorithms ring,ring_bidirectional --sizes $SIZES \
  --json "$OUT/bench2.json"

echo
echo "################ summary"
summary_tests
for n in 4 2; do
  echo "## bench, $n GPUs"
  grep -E "^# |collective|^ +(all_|reduce_)" "$OUT/bench$n.log" | grep -v ":ceiling" | head -n 150
done
