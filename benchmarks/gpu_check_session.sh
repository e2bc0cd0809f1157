#!/usr/bin/env bash
# One 4-GPU device call for issue 5's checks (~5 min): the GPU tests at 4 and 2 GPUs (CuPy
# arrays, every collective x algorithm; then torch CUDA tensors through the facade: streams,
# async work, bad input), the benchmark under our launcher on 4 GPUs, and the NVLink p2p chunk
# sweep around our default. Logs under $OUT (packed into logs.tgz).
set -u
O=${OUT:-./gpu-check-logs}; mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=$O/tests bash benchmarks/gpu_session.sh tests 2>&1 | tail -n 30
OUT=$O/torch bash benchmarks/gpu_session.sh torch 2>&1 | tail -n 30
echo "=== launcher, 4 GPUs"
timeout -k 5 100 python3 -m collectives.run --standalone --nproc-per-node 4 benchmarks/bench.py \
  --backend nccl --collectives all_reduce,all_to_all --algorithms ring,recursive_doubling \
  --sizes 1M,16M,256M --json "$O/launcher4.json" > "$O/launcher4.log" 2>&1; echo "launcher4 rc=$?"
grep -aE "Error|Traceback|rows|wrong|collectives.run" "$O/launcher4.log" | head -n 10
grep -aE "^\[rank 0\]: +(all_reduce|all_to_all) " "$O/launcher4.log" | grep -v "ceiling\|graph" | head -n 20
SETTINGS="ours_64k COLLECTIVES_NCCL_P2P_CHUNKSIZE=65536
chunk32k NCCL_P2P_NVL_CHUNKSIZE=32768
chunk16k NCCL_P2P_NVL_CHUNKSIZE=16384" PROBE=1M:1G SIZES=1M,16M,256M,1G ALGS=ring,ring_bidirectional \
  OUT=$O/p2p bash benchmarks/nccl_p2p_sweep.sh
