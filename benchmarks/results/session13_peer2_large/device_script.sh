# device call 4 (N GPUs): the bench's tables with the final code (every collective, 4K-64M),
# then 64M-1G with COLLECTIVES_PEER_MAX_BYTES=0: staged peer memory (<alg>), symmetric
# (<alg>:symm) and NCCL send/recv (<alg>:sendrecv) side by side, for the default's limit
o=/tmp/r; n=${N:-2}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
if [ -z "$LARGE_ONLY" ]; then
timeout 150 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
fi
COLLECTIVES_PEER_MAX_BYTES=0 timeout 300 $mpi -x COLLECTIVES_PEER_MAX_BYTES -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,two_shot --sizes 64M,256M,1G --min-time 0.05 --graph-max 0 --json $o/large.json > $o/large.txt 2>&1
save
