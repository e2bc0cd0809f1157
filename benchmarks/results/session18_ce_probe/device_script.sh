# session 18, device call 1 (4 x H100, then 2 of them): copy engines against SM copies over
# NVLink (ce_probe.py), then NCCL / ours at 256M-1G as this code runs them, and untuned auto
o=/tmp/r18a; O=$1; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt; nvidia-smi topo -m >> $o/gpus.txt
cp $0 $o/device_script.sh; cp ce_probe.py $o/
s=$(date +%s)
timeout 120 $mpi -n 4 python3 ce_probe.py > $o/ce4.txt 2>&1; step ce4
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3"
bench() { label=$1; shift; echo "== $label" >> $o/bench.txt
  timeout 150 $mpi -n ${N:-4} python3 benchmarks/bench.py $b "$@" --json $o/$label.json 2>&1 | grep -v "^#\|Warn\|^$\|sendrecv\|enable(group" >> $o/bench.txt; step $label; }
bench ar4 --collectives all_reduce --algorithms native,two_shot --sizes 256M,1G
bench auto4 --collectives all_reduce,reduce_scatter --algorithms native,auto,direct,two_shot,recursive_doubling --sizes 64K,1M,4M,16M,64M
export CUDA_VISIBLE_DEVICES=0,1 N=2
timeout 100 $mpi -n 2 python3 ce_probe.py > $o/ce2.txt 2>&1; step ce2
cat $o/steps.txt; cat $o/ce4.txt $o/ce2.txt
