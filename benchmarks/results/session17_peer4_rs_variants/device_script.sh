# device call 2 (4 GPUs), session 17: reduce_scatter (direct) against NCCL's own at 4M-1G:
# the program (COLLECTIVES_PEER_PIPELINE_BYTES=0) and pipelined_reduce_scatter wherever it
# can run (4K), its chunk size and pusher share varied; the same on 2 GPUs; then all_reduce
# at 64M-1G by default.
o=/tmp/r17b; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_PIPELINE_BYTES -x VARIANT"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/gpus.txt
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
rs="--backend nccl --no-progress --collectives reduce_scatter --algorithms native,direct --min-time 0.05 --graph-max 0 --rounds 3"
run() {  # label, sizes, then env assignments
  label=$1; sizes=$2; shift 2
  echo "== $label" >> $o/rs.txt
  env "$@" timeout 75 $mpi -n ${N:-4} python3 $o/variant.py $rs --sizes $sizes --json $o/rs_$label.json 2>&1 | grep -v "^#\|Warn\|^$" >> $o/rs.txt
  step $label
}
run program 4M,16M,64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=0
run pipelined 4M,16M,64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=4K
run c2q3 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=4K VARIANT=2,3
run c8q3 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=4K VARIANT=8,3
run c4q2 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=4K VARIANT=4,2
run program_again 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=0
export CUDA_VISIBLE_DEVICES=0,1 N=2
run program2 4M,16M,64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=0
run pipelined2 4M,16M,64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=4K
unset CUDA_VISIBLE_DEVICES
timeout 90 $mpi -n 4 python3 benchmarks/bench.py --backend nccl --no-progress --collectives all_reduce --algorithms native,direct,two_shot --sizes 64M,256M,1G --min-time 0.05 --graph-max 0 --rounds 3 --json $o/ar_large.json 2>&1 | grep -v "^#\|Warn\|^$" > $o/ar_large.txt
step ar_large
nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/steps.txt
cat $o/steps.txt
