# session 20, device call 5 (4 x H100 host): the pipelined GPU tests again after the worker's
# three set/restore pairs of the copy-engine setting became one context manager
o=/tmp/r20e; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES
cp $0 $o/device_script.sh; nvidia-smi -L > $o/gpus.txt
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 250 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_pipelined.txt
tar -czf $O/r.tgz -C $o .; tail -6 $o/gpu_pipelined.txt
