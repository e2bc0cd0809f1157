# device call 3 (2 of the host's GPUs): the bench's tables on 2 GPUs (every collective,
# 4K-64M, section 6's command) with the 2-rank in-place limit, and the anchor probe to 64M
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0,1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh
s=$(date +%s)
timeout 150 $mpi -n 2 python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench2.json > $o/bench2.txt 2>&1
step bench2
timeout 60 $mpi -n 2 python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M,4M,16M,64M > $o/anchor2.txt 2>&1
step anchor2
cat $o/steps.txt
