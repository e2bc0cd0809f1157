# device call 1 (4 GPUs), session 17: the peer GPU tests, pipelined_reduce_scatter's first
# (its worker on 2 and 4 GPUs, each job limited so the step's own limit is never reached),
# then the others (the in-place kernel's refactors of the sixteenth session not yet run on a GPU)
o=/tmp/r17; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/gpus.txt
cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=140 timeout 300 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | tail -150 > $o/gpu_pipelined.txt
step pipelined_tests
COLLECTIVES_GPU_TEST_SECONDS=70 timeout 225 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k "not pipelined" 2>&1 | tail -40 > $o/gpu_peer.txt
step peer_tests
nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/steps.txt
cat $o/steps.txt
