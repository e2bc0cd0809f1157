# session 19, device call 2 (4 x H100 host): GPU tests of the copy engines' all_gather /
# all_to_all (chunked, one chunk) and of the program's copies beside its sends (every
# collective x algorithm), then all_gather / all_to_all 64M-1G: copy engines with chunks of
# 32M and 128M against the program (0), 4 GPUs; 32M against 0 on 2
o=/tmp/r19b; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_COPY_ENGINE_BYTES -x COLLECTIVES_PEER_COPY_CHUNK_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 330 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_pipelined.txt
step gpu_pipelined
COLLECTIVES_GPU_TEST_SECONDS=170 timeout 360 python3 -m pytest -m gpu tests/gpu/test_nccl.py -q -k every_collective -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_nccl.txt
step gpu_nccl
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather,all_to_all --algorithms native,direct --sizes 64M,256M,1G"
run() { label=$1; n=$2; shift 2
  env "$@" timeout 80 $mpi -n $n python3 benchmarks/bench.py $b --json $o/$label.json > $o/$label.txt 2>&1; step $label; }
run ce32_4 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M COLLECTIVES_PEER_COPY_CHUNK_BYTES=32M
run ce128_4 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M COLLECTIVES_PEER_COPY_CHUNK_BYTES=128M
run off4 4 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
export CUDA_VISIBLE_DEVICES=0,1
run ce32_2 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=16M COLLECTIVES_PEER_COPY_CHUNK_BYTES=32M
run off2 2 COLLECTIVES_PEER_COPY_ENGINE_BYTES=0
cat $o/steps.txt; tail -4 $o/gpu_pipelined.txt; tail -4 $o/gpu_nccl.txt; for f in ce32_4 ce128_4 off4 ce32_2 off2; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk "{print \$1,\$5,\$6,\$10,\$NF}"; done
