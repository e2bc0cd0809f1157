# device call 1 of session 17's second pair (4 GPUs): the peer GPU tests after the pipelined
# kernel learned the two_shot all_reduce (its gather), pipelined worker first (2 and 4 GPUs)
o=/tmp/r17c; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/gpus.txt
cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 320 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -120 > $o/gpu_pipelined.txt
step pipelined_tests
COLLECTIVES_GPU_TEST_SECONDS=60 timeout 200 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k "not pipelined" 2>&1 | tail -40 > $o/gpu_peer.txt
step peer_tests
nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/steps.txt
cat $o/steps.txt; tail -3 $o/gpu_pipelined.txt $o/gpu_peer.txt
