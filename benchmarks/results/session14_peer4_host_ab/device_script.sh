# device call 3 (N GPUs): the host path before (d54112c) and after this session's trims (place
# kept, CuPy's flags not built), the anchor probe alternated twice; the peer GPU tests; the
# host profile's parts after
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
new=$PWD; old=$PWD/../.snap_old
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
mkdir -p $o/old_build; (cd $old && ln -sfn $new/.whl .whl && . tools/device_build.sh $o/old_build)
for round in 1 2; do
  for tree in old new; do
    d=$new; [ $tree = old ] && d=$old
    echo "== $tree, round $round" >> $o/ab.txt
    (cd $d && PYTHONPATH=$d:/tmp/site timeout 100 $mpi -n $n python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M >> $o/ab.txt 2>&1)
    save
  done
done
COLLECTIVES_GPU_TEST_SECONDS=100 timeout 120 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -5 > $o/gpu_peer.txt
save
timeout 100 $mpi -n $n python3 tools/host_profile.py --parts > $o/profile.txt 2>&1
save
