# session 18, device call 5 (4 x H100 host): the GPU tests of the copy engines' all_gather
# (pipelined worker, 2 and 4 GPUs), then all_gather at 256M / 1G with the copy engines (auto)
# against without (=0), on 4 GPUs and on 2 of them
o=/tmp/r18e; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_COPY_ENGINE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=110 timeout 240 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -60 > $o/gpu_pipelined.txt
step pipelined_tests
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather --algorithms native,direct --sizes 256M,1G"
ag() { label=$1; n=$2; shift 2; echo "== $label" >> $o/ag.txt
  env "$@" timeout 50 $mpi -n $n python3 benchmarks/bench.py $b --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/ag.txt; step $label; }
ag ag4 4
ag ag4_off 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
export CUDA_VISIBLE_DEVICES=0,1
ag ag2 2
ag ag2_off 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
cat $o/steps.txt; grep -h "^==\|native\|direct " $o/ag.txt | awk '{print $1,$2,$5,$6,$10,$11}'; tail -4 $o/gpu_pipelined.txt
