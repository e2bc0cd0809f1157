# session 18, device call 4 (4 x H100 host): the 2-GPU tables again (call 3's 2-GPU run
# lost the compiled repeat path: the carried tree replaced the build), then all_gather with
# the copy engines against the program / send-recv on 4 and 2 GPUs, then the GPU tests
o=/tmp/r18d; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_COPY_ENGINE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
python3 -c "import collectives.executors._peer_lane as m; print('lane built:', m.__file__)" >> $o/gpus.txt 2>&1
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3"
export CUDA_VISIBLE_DEVICES=0,1
timeout 120 $mpi -n 2 python3 benchmarks/bench.py $b --algorithms native,ring,direct,recursive_doubling,two_shot,auto --sizes 4K,64K,256K,1M,4M,16M,64M --json $o/bench2.json > $o/bench2.txt 2>&1
step bench2
timeout 120 $mpi -n 2 python3 benchmarks/bench.py $b --algorithms native,direct,two_shot,auto --sizes 256M,1G --json $o/large2.json > $o/large2.txt 2>&1
step large2
timeout 45 $mpi -n 2 python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M,4M,16M,64M > $o/anchor2.txt 2>&1
step anchor2
ag() { label=$1; n=$2; shift 2; echo "== $label" >> $o/ag.txt
  env "$@" timeout 80 $mpi -n $n python3 benchmarks/bench.py $b --collectives all_gather --algorithms native,direct --sizes 64M,256M,1G --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/ag.txt; step $label; }
ag ag2_ce 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M
unset CUDA_VISIBLE_DEVICES
ag ag4 4
ag ag4_ce16 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M
ag ag4_off 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 320 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -60 > $o/gpu_pipelined.txt
step pipelined_tests
cat $o/steps.txt; grep "lane" $o/gpus.txt; grep -h "native\|direct " $o/ag.txt | awk '{print $1,$5,$6,$10,$11}'; tail -4 $o/gpu_pipelined.txt
