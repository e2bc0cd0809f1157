# device call 1 (4 GPUs), the kernel of 9e1d9d9 (the per-call wait; the DIRECT word still read
# per message): checks with direct landing on, A/B of device time against f5d97b9 with it off
# and on (old: git archive f5d97b9; its compiled extensions did not build in this call, which
# changes host times only), the host path's parts (host_profile --parts, its first version)
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x COLLECTIVES_PEER_DIRECT"
save() { tar -czf $O/r.tgz -C $o . ; }
new=$PWD; old=$PWD/../.snap_old
(cd $old && ln -sfn $new/.whl .whl && . tools/device_build.sh $o/old_build >/dev/null; echo old build)
export COLLECTIVES_PEER_DIRECT=1
timeout 150 $mpi -n $n python3 tools/peer_check.py --symmetric --no-graphs --sizes 4K,1M > $o/check_symmetric.txt 2>&1
timeout 200 $mpi -n $n python3 tools/peer_check.py --no-graphs --quick > $o/check.txt 2>&1
for round in 1 2; do
  for d in 0 1; do
    for tree in $old $new; do
      echo "== $tree, COLLECTIVES_PEER_DIRECT=$d, round $round"
      (cd $tree && COLLECTIVES_PEER_DIRECT=$d PYTHONPATH=$tree:/tmp/site timeout 150 $mpi -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce,all_gather --algorithms direct,two_shot,ring --sizes 256K,1M,4M,16M --symmetric | grep -A30 "device time")
    done
  done
done > $o/ab.txt 2>&1
COLLECTIVES_PEER_DIRECT=0 timeout 150 $mpi -n $n python3 tools/host_profile.py --parts > $o/profile.txt 2>&1
save
