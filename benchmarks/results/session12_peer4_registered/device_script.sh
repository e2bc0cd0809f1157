# device call 5 (4 GPUs): registered outputs (group.register_buffer): checks, the peer suite
# (deregistration, mixed, in place), and as peer_check times it at 64 MiB-1 GiB
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x COLLECTIVES_PEER_MAX_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
timeout 150 $mpi -n $n python3 tools/peer_check.py --registered --no-graphs --sizes 4K,1M > $o/check_registered.txt 2>&1
grep "checks done\|WRONG\|Error" $o/check_registered.txt | head; save
grep -q "checks done: 0 wrong" $o/check_registered.txt || exit 3
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 150 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -x 2>&1 | tail -15 > $o/gpu_peer_suite.txt
save
COLLECTIVES_PEER_MAX_BYTES=0 timeout 150 $mpi -n $n python3 tools/peer_check.py --registered --no-checks --no-graphs --collectives all_reduce,all_gather --algorithms two_shot,direct --sizes 64M,256M,1G > $o/large_registered.txt 2>&1
save
