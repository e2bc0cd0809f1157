# device call 3 (2 GPUs): checks, the bench's tables, 256 MiB and 1 GiB
o=/tmp/r; n=${N:-2}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
timeout 120 $mpi -n $n python3 tools/peer_check.py --symmetric --no-graphs --sizes 4K,1M > $o/check_symmetric.txt 2>&1
grep "checks done\|WRONG" $o/check_symmetric.txt | head; save
grep -q "checks done: 0 wrong" $o/check_symmetric.txt || exit 3
timeout 150 $mpi -n $n python3 tools/peer_check.py --no-graphs --quick > $o/check.txt 2>&1
grep "checks done\|WRONG" $o/check.txt | head; save
grep -q "checks done: 0 wrong" $o/check.txt || exit 3
timeout 150 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
COLLECTIVES_PEER_MAX_BYTES=0 timeout 150 $mpi -x COLLECTIVES_PEER_MAX_BYTES -n $n python3 benchmarks/bench.py --backend nccl --no-progress --collectives all_reduce --algorithms native,two_shot --sizes 256M,1G --min-time 0.05 --graph-max 0 --json $o/large.json > $o/large.txt 2>&1
save
