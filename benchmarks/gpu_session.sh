#!/usr/bin/env bash
# One device call: GPU tests at 2 and 4 GPUs, the p2p probe, the benchmark at 4 and 2 GPUs.
#   bash benchmarks/gpu_session.sh [quick|full]     (logs under $OUT, or ./gpu-logs)
# Every step has its own timeout so one hang cannot eat the call; a short table ends the run.
set -u
MODE=${1:-full}
OUT=${OUT:-./gpu-logs}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
PY=python3
MPI="mpiexec --allow-run-as-root --oversubscribe"

step() {   # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout -s KILL "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "=== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
  tail -n 4 "$OUT/$name.log"
}

{
  nvidia-smi -L
  nvidia-smi topo -m
  $PY - <<'EOF'
import cupy, numpy
from cupy.cuda import nccl
print("cupy", cupy.__version__, "nccl", nccl.get_version(), "gpus", cupy.cuda.runtime.getDeviceCount())
try:
    import ml_dtypes
    print("ml_dtypes", ml_dtypes.__version__)
    x = cupy.ones(4, dtype=ml_dtypes.bfloat16)
    print("cupy bfloat16 arrays: yes", (x + x).get())
except Exception as exc:
    print("cupy bfloat16 arrays: no", type(exc).__name__, exc)
EOF
} >"$OUT/env.log" 2>&1
cat "$OUT/env.log"

if [ "$MODE" = quick ]; then
  SIZES=1M,16M,256M; SEGS=64M; PROBE=1M:1G:4
else
  SIZES=1M,16M,256M,1G; SEGS=64M; PROBE=
fi

step tests 170 $PY -m pytest -m gpu tests/gpu -q -rs -s
if [ -n "$PROBE" ]; then
  step probe_default 60 $MPI -n 4 $PY benchmarks/bench_nccl.py --collectives "" --probe $PROBE
  step probe_chunk 60 env NCCL_P2P_NVL_CHUNKSIZE=2097152 $MPI -x NCCL_P2P_NVL_CHUNKSIZE -n 4 \
    $PY benchmarks/bench_nccl.py --collectives "" --probe $PROBE
  step probe_channels 60 env NCCL_MIN_P2P_NCHANNELS=32 NCCL_MAX_P2P_NCHANNELS=32 \
    $MPI -x NCCL_MIN_P2P_NCHANNELS -x NCCL_MAX_P2P_NCHANNELS -n 4 \
    $PY benchmarks/bench_nccl.py --collectives "" --probe $PROBE
  step probe_ce 60 env NCCL_P2P_USE_CUDA_MEMCPY=1 $MPI -x NCCL_P2P_USE_CUDA_MEMCPY -n 4 \
    $PY benchmarks/bench_nccl.py --collectives "" --probe $PROBE
fi
SEGARG=${SEGS:+--segments $SEGS}
step bench4 150 $MPI -n 4 $PY benchmarks/bench_nccl.py --sizes $SIZES $SEGARG --json "$OUT/bench4.json"
step bench2 70 env CUDA_VISIBLE_DEVICES=0,1 $MPI -x CUDA_VISIBLE_DEVICES -n 2 \
  $PY benchmarks/bench_nccl.py --algorithms ring --sizes $SIZES --json "$OUT/bench2.json"

echo
echo "################ summary ($MODE)"
grep -h "FAIL\|progress\|kernel check\|passed\|failed\|skipped\|Error" "$OUT/tests.log" | head -n 40
for f in "$OUT"/probe_*.log; do [ -f "$f" ] && { echo "## $(basename "$f")"; grep "p2p" "$f"; }; done
for n in 4 2; do
  echo "## bench, $n GPUs"
  grep -E "^# bench_nccl|collective|^ +(all_|reduce_)" "$OUT/bench$n.log" | head -n 120
done
