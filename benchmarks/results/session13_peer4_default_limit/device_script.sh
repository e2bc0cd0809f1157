# device call 6 (4 GPUs): the final tree: reduce_scatter at 64M-1G with the default size
# limit (now on peer memory: its plans stage nothing), then the whole GPU suite
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
timeout 150 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --collectives reduce_scatter --algorithms native,direct,ring --sizes 64M,256M,1G --min-time 0.05 --graph-max 0 --json $o/large_default.json > $o/large_default.txt 2>&1
save
COLLECTIVES_GPU_TEST_SECONDS=240 timeout 250 python3 -m pytest -m gpu tests/gpu -q 2>&1 | tail -15 > $o/gpu_suite.txt
tail -3 $o/gpu_suite.txt; save
