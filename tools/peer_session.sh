#!/usr/bin/env bash
# One device call: the peer-memory executor checked and timed on this host's GPUs.
#   bash tools/peer_session.sh OUT_DIR [N_GPUS]
set -uo pipefail
out=${1:?output folder}; n=${2:-4}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
nvidia-smi -L | tee "$out/gpus.txt"
timeout ${CHECK_SECONDS:-240} $mpi -n "$n" python3 tools/peer_check.py ${CHECK_ARGS:-} 2>&1 | tee "$out/peer_check.txt"
echo "peer_check exit: ${PIPESTATUS[0]}"
if [ "${SUITE:-0}" = 1 ]; then
  COLLECTIVES_GPU_TEST_SECONDS=200 timeout 420 python3 -m pytest -m gpu tests/gpu -q -x 2>&1 | tail -30 | tee "$out/gpu_suite.txt"
fi
# timings only, at other block sizes: SWEEP="16K 256K"
for bytes in ${SWEEP:-}; do
  echo "== COLLECTIVES_PEER_BLOCK_BYTES=$bytes"
  COLLECTIVES_PEER_BLOCK_BYTES=$bytes timeout 120 $mpi -x COLLECTIVES_PEER_BLOCK_BYTES -n "$n" python3 tools/peer_check.py --no-checks --no-graphs --collectives all_reduce,reduce_scatter --algorithms ring,direct,recursive_doubling 2>&1 | tee "$out/sweep_$bytes.txt"
done
# device time (graphs) with each way of ordering flags: FENCES="0 1 2"
for f in ${FENCES:-}; do   # also LINES="0" to time without flagged lines
  echo "== COLLECTIVES_PEER_FENCES=$f"
  COLLECTIVES_PEER_FENCES=$f timeout 120 $mpi -x COLLECTIVES_PEER_FENCES -n "$n" python3 tools/peer_check.py --no-checks --collectives all_reduce,all_to_all --algorithms ring,direct --sizes 4K,64K,1M 2>&1 | grep -A20 "device time" | tee "$out/fences_$f.txt"
done
for l in ${LINES:-}; do
  echo "== COLLECTIVES_PEER_LINE_BYTES=$l"
  COLLECTIVES_PEER_LINE_BYTES=$l timeout 120 $mpi -x COLLECTIVES_PEER_LINE_BYTES -n "$n" python3 tools/peer_check.py --no-checks --collectives all_reduce,all_to_all --algorithms ring,direct --sizes 4K,64K,1M 2>&1 | grep -A20 "device time" | tee "$out/lines_$l.txt"
done
