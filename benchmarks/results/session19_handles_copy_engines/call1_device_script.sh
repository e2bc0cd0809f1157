# session 19, device call 1 (4 x H100 host): the handle-exchange fix checked before/after
# (peer_worker section 5 on the old transports/peer.py, then the GPU tests), then all_gather
# and all_to_all 64M-1G with the copy engines (setting 16M) against without (0), 4 and 2 GPUs
o=/tmp/r19a; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_COPY_ENGINE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
# before the fix: the same worker on the old transports/peer.py
rm -rf /tmp/old && cp -r . /tmp/old && cp old_peer.py /tmp/old/collectives/transports/peer.py
(cd /tmp/old && PYTHONPATH=/tmp/old:/tmp/site COLLECTIVES_GPU_TEST_SECONDS=60 timeout 120 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k line_wrap -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30) > $o/old_section5.txt
step old_section5
COLLECTIVES_GPU_TEST_SECONDS=100 timeout 200 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k "not pipelined" -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_peer.txt
step gpu_peer
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 320 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_pipelined.txt
step gpu_pipelined
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather,all_to_all --algorithms native,direct --sizes 64M,256M,1G"
run() { label=$1; n=$2; shift 2; echo "== $label" >> $o/ce.txt
  env "$@" timeout 80 $mpi -n $n python3 benchmarks/bench.py $b --json $o/$label.json > $o/$label.txt 2>&1; step $label; }
run ce4 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M
run off4 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
export CUDA_VISIBLE_DEVICES=0,1
run ce2 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M
run off2 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
cat $o/steps.txt; tail -3 $o/old_section5.txt $o/gpu_peer.txt $o/gpu_pipelined.txt; for f in ce4 off4 ce2 off2; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk "{print \$1,\$5,\$6,\$10,\$NF}"; done
