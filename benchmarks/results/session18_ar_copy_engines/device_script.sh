# session 18, device call 2 (4 x H100, then 2 of them): the pipelined all_reduce gathered by
# the copy engines (COLLECTIVES_PEER_COPY_ENGINE_BYTES, 16M by default) against its gather by
# thread blocks (=0), NCCL's own beside; then the peer GPU tests (pipelined worker first)
o=/tmp/r18b; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_COPY_ENGINE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_reduce --algorithms native,two_shot"
bench() { label=$1; sizes=$2; shift 2; echo "== $label" >> $o/bench.txt
  env "$@" timeout 100 $mpi -n ${N:-4} python3 benchmarks/bench.py $b --sizes $sizes --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/bench.txt; step $label; }
bench ar4 16M,64M,256M,1G
bench ar4_threads 64M,256M,1G COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
export CUDA_VISIBLE_DEVICES=0,1 N=2
bench ar2 16M,64M,256M,1G
bench ar2_threads 64M,256M,1G COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
unset CUDA_VISIBLE_DEVICES N
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 320 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -120 > $o/gpu_pipelined.txt
step pipelined_tests
COLLECTIVES_GPU_TEST_SECONDS=60 timeout 150 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k "not pipelined" 2>&1 | tail -40 > $o/gpu_peer.txt
step peer_tests
cat $o/steps.txt; grep -h "native\|two_shot " $o/bench.txt | awk '{print $1,$5,$6,$10}'; tail -3 $o/gpu_pipelined.txt $o/gpu_peer.txt
