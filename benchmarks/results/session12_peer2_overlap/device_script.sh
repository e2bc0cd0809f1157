# device call 8 (2 GPUs): the bench's all_reduce rows with the session's final code
o=/tmp/r; n=${N:-2}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
nvidia-smi -L > $o/gpus.txt
timeout 90 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --collectives all_reduce --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
tar -czf $O/r.tgz -C $o .
