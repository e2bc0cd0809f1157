# device call 6 (4 GPUs): programmatic dependent launch (COLLECTIVES_PEER_OVERLAP): checks with
# graphs, the peer suite, as peer_check times it with it on and off (alternated), the bench's
# all_reduce rows beside SymmetricMemory
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x COLLECTIVES_PEER_OVERLAP"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
timeout 150 $mpi -n $n python3 tools/peer_check.py --quick --collectives all_reduce,all_gather,all_to_all --algorithms direct,two_shot,ring --sizes 4K,256K > $o/check.txt 2>&1
grep "checks done\|WRONG\|graph failed" $o/check.txt | head; save
grep -q "checks done: 0 wrong" $o/check.txt || exit 3
COLLECTIVES_GPU_TEST_SECONDS=120 timeout 120 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -x 2>&1 | tail -15 > $o/gpu_peer_suite.txt
save
for round in 1 2; do
  for v in 1 0; do
    echo "== COLLECTIVES_PEER_OVERLAP=$v, round $round"
    COLLECTIVES_PEER_OVERLAP=$v timeout 60 $mpi -n $n python3 tools/peer_check.py --no-checks --no-graphs --collectives all_reduce,all_gather --algorithms direct,two_shot,ring --sizes 4K,64K,256K,1M,4M | grep -v "^peer path\|device time\|ring all_reduce 4 KiB\|host time"
  done
done > $o/ab.txt 2>&1
save
timeout 100 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --collectives all_reduce --algorithms native,direct,two_shot --sizes 4K,64K,256K,1M,4M,16M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
