# device call 4/5 (N GPUs): the bench's tables with this session's host path (every
# collective, 4K-64M, as section 6's command), the anchor probe, and the host profile's parts
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
timeout 150 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
timeout 100 $mpi -n $n python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M,4M > $o/anchor.txt 2>&1
save
[ -n "$GPU_TESTS" ] && COLLECTIVES_GPU_TEST_SECONDS=100 timeout 120 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -5 > $o/gpu_peer.txt
timeout 100 $mpi -n $n python3 tools/host_profile.py --parts > $o/profile.txt 2>&1
save
