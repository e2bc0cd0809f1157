# session 20, device call 2 (4 x H100 host; N=4, then N=2 with CUDA_VISIBLE_DEVICES=0,1): the
# tables of BENCHMARKS.md §6 with this session's code, 4K-64M every algorithm and auto,
# 256M-1G native/direct/two_shot/auto, the SymmetricMemory anchor
O=$1; o=/tmp/r20b; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; cp $0 $o/device_script.sh; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3"
for N in 4 2; do
  [ $N = 2 ] && export CUDA_VISIBLE_DEVICES=0,1
  timeout 150 $mpi -n $N python3 benchmarks/bench.py $b --algorithms native,ring,direct,recursive_doubling,two_shot,auto --sizes 4K,64K,256K,1M,4M,16M,64M --json $o/bench$N.json > $o/bench$N.txt 2>&1
  step bench$N
  timeout 150 $mpi -n $N python3 benchmarks/bench.py $b --algorithms native,direct,two_shot,auto --sizes 256M,1G --json $o/large$N.json > $o/large$N.txt 2>&1
  step large$N
  timeout 50 $mpi -n $N python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M,4M,16M,64M > $o/anchor$N.txt 2>&1
  step anchor$N
done
cat $o/steps.txt
COLLECTIVES_GPU_TEST_SECONDS=170 timeout 300 python3 -m pytest -m gpu tests/gpu/test_nccl.py -q -k every_collective -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -30 > $o/gpu_nccl.txt
step gpu_nccl
for f in bench4 large4 bench2 large2; do echo "== $f"; grep -E "^ +[0-9]|^# [a-z_]+$" $o/$f.txt | awk '{print $1,$2,$5,$6,$10,$NF}' | grep -v ":ceiling\|:graph"; done; tail -3 $o/anchor4.txt $o/anchor2.txt; tail -4 $o/gpu_nccl.txt
