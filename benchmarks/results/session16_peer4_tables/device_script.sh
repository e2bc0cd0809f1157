# device call 2 (4 GPUs, 64-core host): the peer GPU tests with the 2-rank in-place limit
# (64 MiB); the bench's tables on 4 GPUs (every collective, 4K-64M, section 6's command) and
# the anchor probe to 64M; then the NCCL tune pair of issue 16 (tuned in A, judged in B)
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=80 timeout 150 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -40 > $o/gpu_peer.txt
step tests
timeout 150 $mpi -n 4 python3 benchmarks/bench.py --backend nccl --no-progress --algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench4.json > $o/bench4.txt 2>&1
step bench4
timeout 60 $mpi -n 4 python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M,4M,16M,64M > $o/anchor4.txt 2>&1
step anchor4
STEPS=tune TUNE_SECONDS=120 bash tools/session_gpu.sh $o 4 > /dev/null 2>&1
step tune
cat $o/steps.txt
