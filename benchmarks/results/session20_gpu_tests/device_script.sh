# session 20, device call 3 (4 x H100 host): the GPU tests this session's tables call left
# out (every collective x algorithm on 4 GPUs: CUDA_VISIBLE_DEVICES was still set to two),
# and the peer tests beside the pipelined ones (line wrap, graphs, two streams, a rank that
# never arrives, in place on symmetric memory), on the code of the tables
o=/tmp/r20c; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=170 timeout 240 python3 -m pytest -m gpu tests/gpu/test_nccl.py -q -k every_collective -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_nccl.txt
step gpu_nccl
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 240 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k "not pipelined" -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_peer.txt
step gpu_peer
cat $o/steps.txt; tail -5 $o/gpu_nccl.txt; tail -6 $o/gpu_peer.txt
