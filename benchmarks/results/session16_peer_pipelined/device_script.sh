# device call 5 (4 GPUs): pipelined_reduce_scatter (new): the peer GPU tests (its worker on 2
# and 4 GPUs, and the others, since the kernel source changed); then reduce_scatter at
# 64M-1G, direct, against NCCL: the program (COLLECTIVES_PEER_PIPELINE_BYTES=0) and the
# kernel with chunk sizes and pusher shares varied; 2 GPUs: the program and the default
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_PIPELINE_BYTES -x VARIANT"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh
cat > $o/variant.py <<'EOP'
# bench.py with pipelined_reduce_scatter's chunk bytes and pusher quarters set (VARIANT=c,q)
import os, runpy, sys
sys.path.insert(0, os.getcwd())
from collectives.executors import peer
if os.environ.get("VARIANT"):
    chunk, quarters = os.environ["VARIANT"].split(",")
    peer.PIPELINE_CHUNK_BYTES, peer.PIPELINE_PUSHERS = int(chunk) << 20, int(quarters)
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
EOP
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=100 timeout 200 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -40 > $o/gpu_peer.txt
step tests
rs="--backend nccl --no-progress --collectives reduce_scatter --algorithms native,direct --sizes 64M,256M,1G --min-time 0.05 --graph-max 0 --rounds 3"
run() {  # label, then env assignments
  label=$1; shift
  echo "== $label" >> $o/rs4.txt
  env "$@" timeout 60 $mpi -n ${N:-4} python3 $o/variant.py $rs --json $o/rs_$label.json 2>&1 | grep -v "^#\|Warn\|^$" >> $o/rs4.txt
  step $label
}
run program COLLECTIVES_PEER_PIPELINE_BYTES=0
run default
run c2q3 VARIANT=2,3
run c8q3 VARIANT=8,3
run c4q2 VARIANT=4,2
export CUDA_VISIBLE_DEVICES=0,1 N=2
run program2 COLLECTIVES_PEER_PIPELINE_BYTES=0
run default2
cat $o/steps.txt
