# device call 1 (4 GPUs): inputs read in place (pushed.lower(pulls=)): bitwise checks with
# symmetric inputs/outputs and in place, the peer GPU suite, A/B COLLECTIVES_PEER_PULL=0/1
# as peer_check times it (device time in graphs too), the bench's tables
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
timeout 200 $mpi -n $n python3 tools/peer_check.py --symmetric --quick --no-graphs --sizes 4K,1M > $o/check_symmetric.txt 2>&1
grep "checks done\|WRONG\|rror" $o/check_symmetric.txt | head -20; save
grep -q "checks done: 0 wrong" $o/check_symmetric.txt || exit 3
COLLECTIVES_GPU_TEST_SECONDS=100 timeout 100 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -x 2>&1 | tail -15 > $o/gpu_peer.txt
tail -3 $o/gpu_peer.txt; save
for round in 1 2; do
  for pull in 0 1; do
    echo "== COLLECTIVES_PEER_PULL=$pull, round $round"
    COLLECTIVES_PEER_PULL=$pull timeout 100 $mpi -x COLLECTIVES_PEER_PULL -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce --algorithms direct,two_shot,ring --sizes 16K,64K,256K,1M,4M,16M --symmetric
  done
done > $o/ab.txt 2>&1
save
timeout 130 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
