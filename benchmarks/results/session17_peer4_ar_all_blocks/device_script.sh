# device call 3 of session 17 (4 GPUs, then 2 of them): the pipelined kernel's GPU tests (its
# all_reduce's gather now by every thread block), then reduce_scatter (direct) and all_reduce
# (two_shot) at 16M-1G against NCCL's own, by default
o=/tmp/r17e; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_PIPELINE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/gpus.txt
cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=130 timeout 280 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -120 > $o/gpu_pipelined.txt
step pipelined_tests
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3"
run() {  # label, collective, algorithms, sizes, then env assignments
  label=$1; c=$2; a=$3; sizes=$4; shift 4
  echo "== $label" >> $o/bench.txt
  env "$@" timeout 90 $mpi -n ${N:-4} python3 benchmarks/bench.py $b --collectives $c --algorithms $a --sizes $sizes --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/bench.txt
  step $label
}
run ar4 all_reduce native,two_shot 16M,64M,256M,1G
run rs4 reduce_scatter native,direct 16M,64M,256M,1G
export CUDA_VISIBLE_DEVICES=0,1 N=2
run ar2 all_reduce native,two_shot 16M,64M,256M,1G
run rs2 reduce_scatter native,direct 16M,64M,256M,1G
nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/steps.txt
cat $o/steps.txt; tail -n 3 $o/gpu_pipelined.txt
