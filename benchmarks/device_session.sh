#!/usr/bin/env bash
# Everything the lent 4-GPU machine is needed for, in one device call (about 9 minutes):
# GPU tests (4 then 2 GPUs), the compiled executor built against the machine's Open MPI, the
# 8-rank MPI sweep on its CPUs, the 4-GPU sweep with `auto`, and the socket transport against
# torch gloo. Logs are re-packed into $OUT/logs.tgz after every step, so a cut-off call still
# returns what finished; JSON and plots land in $OUT directly.
#   bash benchmarks/device_session.sh
set -u
FINAL=${OUT:-./device-logs}
export OUT=/tmp/device-logs
mkdir -p "$OUT" "$FINAL"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
pack() { tar czf "$FINAL/logs.tgz" -C /tmp device-logs 2>/dev/null; cp "$OUT"/*.json "$OUT"/*.png "$FINAL"/ 2>/dev/null; }

T4=${T4:-110} T2=${T2:-50} bash benchmarks/gpu_session.sh tests > "$OUT/gpu_tests_summary.log" 2>&1
pack; tail -n 40 "$OUT/gpu_tests_summary.log"

bash benchmarks/cpu_session.sh > "$OUT/cpu_summary.log" 2>&1
pack

MPI="mpiexec --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED"
echo "=== bench4auto"
timeout -s KILL 130 $MPI -n 4 python3 benchmarks/bench.py --backend nccl \
  --collectives all_reduce,reduce_scatter,all_gather,all_to_all \
  --algorithms ring,ring_bidirectional,recursive_doubling,tree,auto --sizes 1M,16M,256M \
  --json "$OUT/nccl4_auto.json" > "$OUT/bench4auto.log" 2>&1
echo "=== bench4auto rc=$?"
pack

echo "################ cpu"
grep -E "=== |MPI library|compiled MPI" "$OUT/cpu_summary.log"
grep -E "^# +(all_|reduce_|auto|ring vs|model)" "$OUT/mpi8.log" | head -n 40
grep -E "^# +(all_|reduce_)|gloo" "$OUT/socket4.log" | head -n 12
echo "################ gpu auto"
grep -E "^# +(all_|reduce_|auto)" "$OUT/bench4auto.log" | head -n 30
tail -n 3 "$OUT/bench4auto.log"
