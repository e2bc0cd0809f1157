# session 19, device call 3 (4 x H100 host): the push probe (the program's layout of three
# 256 MiB pushes, with its own block's copy beside them or after, against a plain copy
# kernel), the GPU tests of the kernel with the copies' warps apart, then all_gather /
# all_to_all 64M-1G on the program (copy engines off, the default), 4 and 2 GPUs
o=/tmp/r19c; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; cp $0 $o/device_script.sh; cp push_probe.py $o/; cp $O/build.log $o/ 2>/dev/null
s=$(date +%s)
timeout 90 $mpi -n 4 python3 push_probe.py > $o/push_probe4.txt 2>&1
step push_probe
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather,all_to_all --algorithms native,direct --sizes 64M,256M,1G"
timeout 80 $mpi -n 4 python3 benchmarks/bench.py $b --json $o/prog4.json > $o/prog4.txt 2>&1
step prog4
COLLECTIVES_GPU_TEST_SECONDS=170 timeout 360 python3 -m pytest -m gpu tests/gpu/test_nccl.py -q -k every_collective -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_nccl.txt
step gpu_nccl
COLLECTIVES_GPU_TEST_SECONDS=150 timeout 330 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined -rA 2>&1 | grep -v "^E  *File\|^E  *Thread" | tail -40 > $o/gpu_pipelined.txt
step gpu_pipelined
export CUDA_VISIBLE_DEVICES=0,1
timeout 80 $mpi -n 2 python3 benchmarks/bench.py $b --json $o/prog2.json > $o/prog2.txt 2>&1
step prog2
cat $o/steps.txt; grep GPUs $o/push_probe4.txt; tail -4 $o/gpu_nccl.txt $o/gpu_pipelined.txt; for f in prog4 prog2; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk "{print \$1,\$5,\$6,\$10,\$NF}"; done
