# device call 3 (4 GPUs): reduce_vectors not inlined: checks, A/B against b830319 (one
# round of loads at a time, inlined) with pulls off and on, and this tree with both
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o/old_build
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
new=$PWD; old=$PWD/../.snap_old
(cd $old && ln -sfn $new/.whl .whl && . tools/device_build.sh $o/old_build >/dev/null; echo old build)
nvidia-smi -L > $o/gpus.txt
timeout 120 $mpi -n $n python3 tools/peer_check.py --symmetric --quick --no-graphs --collectives all_reduce --sizes 4K,4M > $o/check_symmetric.txt 2>&1
grep "checks done\|WRONG\|rror" $o/check_symmetric.txt | head -20; save
grep -q "checks done: 0 wrong" $o/check_symmetric.txt || exit 3
for round in 1 2; do
  for run in "$old 0" "$old 1" "$new 0" "$new 1"; do
    set -- $run
    echo "== $1, COLLECTIVES_PEER_PULL=$2, round $round"
    (cd $1 && COLLECTIVES_PEER_PULL=$2 PYTHONPATH=$1:/tmp/site timeout 100 $mpi -x COLLECTIVES_PEER_PULL -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce --algorithms direct,two_shot --sizes 64K,1M,4M,16M,64M --symmetric | grep -A30 "algorithm")
  done
done > $o/ab.txt 2>&1
save
