#!/usr/bin/env bash
# What governs NCCL point-to-point bandwidth (issue 5): the p2p probe (every GPU sends one
# block right / splits it over both neighbours) and ring all_reduce with its transfer-only
# ceiling, under NCCL settings that change how a send/recv is cut up: the NVLink p2p chunk
# size (bytes per pipeline step inside NCCL's p2p kernel; default 512 KiB), the number of
# channels (thread blocks) a p2p op may use, and copy-engine p2p (cudaMemcpy instead of SMs).
# Each setting in a fresh job (NCCL reads these once per process). Logs under $OUT.
# $SETTINGS replaces the list (lines of: name VAR=value ...); our transport's own default
# is NCCL_P2P_NVL_CHUNKSIZE=65536 (COLLECTIVES_NCCL_P2P_CHUNKSIZE=0 keeps NCCL's).
set -u
O=${OUT:-./p2p-logs}; mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
N=${N:-$(nvidia-smi -L | wc -l)}
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $N"
B="-m collectives.bench_nccl --probe ${PROBE:-4M:256M} --collectives all_reduce,reduce_scatter --algorithms ${ALGS:-ring} --sizes ${SIZES:-16M,256M} --graph-max 0"
while read -r name settings; do
  [ -z "$name" ] && continue
  env $settings timeout -s KILL 60 $M -x NCCL_NVLS_ENABLE $(for s in $settings; do echo -x ${s%%=*}; done) \
    python3 $B < /dev/null > "$O/p2p_$name.log" 2>&1
  echo "== $name ($settings) rc=$?"
  grep -aE "^#  p2p|^ +(all_reduce|reduce_scatter) .*(ring|native|ceiling)" "$O/p2p_$name.log" | head -n 20
done <<LIST
${SETTINGS:-nccl_default COLLECTIVES_NCCL_P2P_CHUNKSIZE=0
chunk128k NCCL_P2P_NVL_CHUNKSIZE=131072
chunk64k NCCL_P2P_NVL_CHUNKSIZE=65536
chunk2m NCCL_P2P_NVL_CHUNKSIZE=2097152
minch16_chunk128k NCCL_MIN_P2P_NCHANNELS=16 NCCL_P2P_NVL_CHUNKSIZE=131072
memcpy COLLECTIVES_NCCL_P2P_CHUNKSIZE=0 NCCL_P2P_USE_CUDA_MEMCPY=1}
LIST
