#!/usr/bin/env bash
# Old tree against new tree in one job on a lent GPU host (64 cores, 4 GPUs): the MPI
# bench on 8 ranks and the NCCL bench on 4 GPUs (the NCCL send/recv executor in both trees:
# COLLECTIVES_GPU_PATH=nccl), interleaved old/new; then the peer-memory table on 2 GPUs.
#   bash tools/before_after.sh OLD_TREE NEW_TREE OUT
set -u
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); out=$3; mkdir -p "$out/o" "$out/n"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x PYTHONUNBUFFERED -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x COLLECTIVES_GPU_PATH"
(cd "$new" && . tools/device_build.sh "$out/n")          # installs Cython from new/.whl
(cd "$old" && . "$new/tools/device_build.sh" "$out/o")
cpu="-m collectives.bench --backend mpi --collectives all_reduce,all_to_all --algorithms ring,tree,direct,native --sizes 4K:1M --rounds 2 --no-progress"
gpu="-m collectives.bench --backend nccl --collectives all_reduce,reduce_scatter --algorithms ring,recursive_doubling,direct,native --sizes 64K,1M,16M,256M"
for i in 1 2; do
  for t in old new; do
    d=$old; [ $t = new ] && d=$new
    (cd "$d" && export PYTHONPATH=$d:/tmp/site COLLECTIVES_GPU_PATH=nccl &&
     timeout -s KILL 150 $M -n 8 python3 $cpu --json "$out/cpu_${t}_$i.json" > "$out/cpu_${t}_$i.log" 2>&1; echo "cpu $t $i rc=$?"
     [ $i = 1 ] && { timeout -s KILL 150 $M -n 4 python3 $gpu --json "$out/gpu_${t}_$i.json" > "$out/gpu_${t}_$i.log" 2>&1; echo "gpu $t $i rc=$?"; })
  done
done
nproc; nvidia-smi -L
python3 "$new/tools/ab_compare.py" "$out" cpu_ | tee "$out/cpu_compare.txt" | tail -12
python3 "$new/tools/ab_compare.py" "$out" gpu_ | tee "$out/gpu_compare.txt"
(cd "$new" && CUDA_VISIBLE_DEVICES=0,1 PYTHONPATH=$new timeout 150 $M -n 2 python3 tools/peer_check.py --no-checks 2>&1 | grep -v "^\[vm" | tee "$out/peer2.txt" | grep -v ":nccl")
tar czf "$out/logs.tgz" -C "$out" $(cd "$out" && ls *.log *.json 2>/dev/null) 2>/dev/null; rm -f "$out"/*.log "$out"/*.json
