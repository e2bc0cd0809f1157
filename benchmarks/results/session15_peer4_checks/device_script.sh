# device call 2 (4 GPUs): the peer GPU tests after the abort fix and the in-place size limit
# (peer_worker on 2, in_place_worker on 2 and 4), then the anchor probe on 2 of the GPUs
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
COLLECTIVES_GPU_TEST_SECONDS=80 timeout 130 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -40 > $o/gpu_peer.txt
save
CUDA_VISIBLE_DEVICES=0,1 timeout 40 $mpi -n 2 python3 tools/anchor_probe.py --sizes 1M,4M,16M > $o/anchor2.txt 2>&1
save
