# session 20, device call 4 (4 x H100 host): a probe, two_shot all_reduce at 1M-16M on the
# pipelined kernel (COLLECTIVES_PEER_PIPELINE_BYTES=256K: blocks of 256 KiB-4 MiB, nothing
# staged) in chunks of 4 MiB (one per block) and of 256 KiB, against the default (the program,
# staged output); then the peer GPU tests with the workers' graph replays written once
# (peer_job.replays)
o=/tmp/r20d; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
unset CUDA_VISIBLE_DEVICES
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x COLLECTIVES_PEER_PIPELINE_BYTES -x CHUNK"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; cp $0 $o/device_script.sh; cp probe_bench.py $o/; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_reduce --algorithms native,two_shot --sizes 1M,4M,16M"
run() { label=$1; shift
  env "$@" timeout 60 $mpi -n 4 python3 probe_bench.py $b --json $o/$label.json > $o/$label.txt 2>&1; step $label; }
run default CHUNK=4194304
run piped_4M COLLECTIVES_PEER_PIPELINE_BYTES=256K CHUNK=4194304
run piped_256K COLLECTIVES_PEER_PIPELINE_BYTES=256K CHUNK=262144
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 330 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_peer.txt
step gpu_peer
cat $o/steps.txt; tail -8 $o/gpu_peer.txt; for f in default piped_4M piped_256K; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk '{print $1,$5,$6,$10,$NF}' | grep -v ceiling; done
