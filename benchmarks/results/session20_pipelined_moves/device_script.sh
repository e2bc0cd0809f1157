# session 20, device call 1 (4 x H100 host; then 2 of its GPUs): direct all_gather /
# all_to_all on the pipelined kernel (kinds 3, 4: the copy-out of every chunk beside the
# pushes; peers push straight into symmetric outputs), 16M-1G: default (pipelined from 16M
# blocks), COLLECTIVES_PEER_PIPELINE_BYTES=0 (the program / NCCL send/recv above the size
# limit, as before), and 3/4 of the thread blocks pushing; then the GPU tests of the kernel
o=/tmp/r20a; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_PIPELINE_BYTES -x PUSHERS"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; cp $0 $o/device_script.sh; cp pushers_bench.py $o/; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather,all_to_all --algorithms native,direct --sizes 16M,64M,256M,1G"
run() { label=$1; n=$2; shift 2
  env "$@" timeout 75 $mpi -n $n python3 pushers_bench.py $b --json $o/$label.json > $o/$label.txt 2>&1; step $label; }
run new4 4 PUSHERS=2
run off4 4 PUSHERS=2 COLLECTIVES_PEER_PIPELINE_BYTES=0
run p3_4 4 PUSHERS=3
export CUDA_VISIBLE_DEVICES=0,1
run new2 2 PUSHERS=2
run off2 2 PUSHERS=2 COLLECTIVES_PEER_PIPELINE_BYTES=0
unset CUDA_VISIBLE_DEVICES
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 300 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_pipelined.txt
step gpu_pipelined
cat $o/steps.txt; tail -6 $o/gpu_pipelined.txt; for f in new4 off4 p3_4 new2 off2; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk "{print \$1,\$5,\$6,\$10,\$NF}"; done
