# device call 2 of session 17's second pair (4 GPUs, then 2 of them): reduce_scatter (direct)
# and all_reduce (two_shot) at 16M-1G against NCCL's own, by default (pipelined from 16 MiB
# blocks) and with COLLECTIVES_PEER_PIPELINE_BYTES=0 (the program, or send/recv above 32 MiB
# messages), and the pusher share varied
o=/tmp/r17d; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_PIPELINE_BYTES -x VARIANT"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/gpus.txt
cp $0 $o/device_script.sh
cat > $o/variant.py <<'EOP'
# bench.py with pipelined_reduce_scatter's pusher quarters set (VARIANT=q)
import os, runpy, sys
sys.path.insert(0, os.getcwd())
from collectives.executors import peer
if os.environ.get("VARIANT"):
    peer.pipeline_pushers = lambda world, q=int(os.environ["VARIANT"]): q
sys.argv = ["benchmarks/bench.py"] + sys.argv[1:]
runpy.run_path("benchmarks/bench.py", run_name="__main__")
EOP
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3"
run() {  # label, collective, algorithms, sizes, then env assignments
  label=$1; c=$2; a=$3; sizes=$4; shift 4
  echo "== $label" >> $o/bench.txt
  env "$@" timeout 90 $mpi -n ${N:-4} python3 $o/variant.py $b --collectives $c --algorithms $a --sizes $sizes --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/bench.txt
  step $label
}
run ar4 all_reduce native,two_shot,direct 16M,64M,256M,1G
run ar4_off all_reduce native,two_shot 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=0
run ar4_q3 all_reduce native,two_shot 64M,256M,1G VARIANT=3
run rs4 reduce_scatter native,direct 16M,64M,256M,1G
run ar4_again all_reduce native,two_shot 64M,256M,1G
export CUDA_VISIBLE_DEVICES=0,1 N=2
run ar2 all_reduce native,two_shot 16M,64M,256M,1G
run ar2_off all_reduce native,two_shot 64M,256M,1G COLLECTIVES_PEER_PIPELINE_BYTES=0
run ar2_q2 all_reduce native,two_shot 64M,256M,1G VARIANT=2
run rs2 reduce_scatter native,direct 16M,64M,256M,1G
run rs2_q2 reduce_scatter native,direct 64M,256M,1G VARIANT=2
nvidia-smi --query-compute-apps=pid,name --format=csv >> $o/steps.txt
cat $o/steps.txt
