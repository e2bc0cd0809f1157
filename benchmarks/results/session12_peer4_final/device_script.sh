# device call 2 (4 GPUs): direct landing on by default (checks, A/B against f5d97b9 and
# against itself with it off), the host path's parts, the GPU suite, the bench's tables
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o/old_build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
new=$PWD; old=$PWD/../.snap_old     # old: git archive f5d97b9
(cd $old && ln -sfn $new/.whl .whl && . tools/device_build.sh $o/old_build >/dev/null; echo old build)
nvidia-smi -L > $o/gpus.txt
timeout 150 $mpi -n $n python3 tools/peer_check.py --symmetric --no-graphs --sizes 4K,1M > $o/check_symmetric.txt 2>&1
grep "checks done\|WRONG" $o/check_symmetric.txt | head; save
grep -q "checks done: 0 wrong" $o/check_symmetric.txt || exit 3
timeout 200 $mpi -n $n python3 tools/peer_check.py --no-graphs --quick > $o/check.txt 2>&1
grep "checks done\|WRONG" $o/check.txt | head; save
grep -q "checks done: 0 wrong" $o/check.txt || exit 3
for round in 1 2; do
  for run in "$old 0" "$new 0" "$new 1"; do
    set -- $run
    echo "== $1, COLLECTIVES_PEER_DIRECT=$2, round $round"
    (cd $1 && COLLECTIVES_PEER_DIRECT=$2 PYTHONPATH=$1:/tmp/site timeout 100 $mpi -x COLLECTIVES_PEER_DIRECT -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce,all_gather --algorithms direct,two_shot,ring --sizes 256K,1M,4M,16M --symmetric | grep -A30 "device time")
  done
done > $o/ab.txt 2>&1
save
timeout 100 $mpi -n $n python3 tools/host_profile.py --parts > $o/profile.txt 2>&1
save
COLLECTIVES_GPU_TEST_SECONDS=200 timeout 200 python3 -m pytest -m gpu tests/gpu -q -x 2>&1 | tail -15 > $o/gpu_suite.txt
save
timeout 120 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
