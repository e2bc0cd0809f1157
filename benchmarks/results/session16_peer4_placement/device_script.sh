# device call 4 (4 GPUs, 64-core host): does where a rank's CPU lies set our host path?
# The anchor probe at 4K-1M with ranks unbound (as every run so far), bound to the cores
# local to their GPU (/sys/bus/pci/devices/<gpu>/local_cpulist) and bound to the other
# cores; twice, alternated; on 2 and on 4 GPUs. Then reduce_scatter at 256M/1G: the pushes
# alone (the bench's ceiling row) against the whole call, and the reduce pass alone.
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x BIND"
save() { tar -czf $O/r.tgz -C $o . ; }
step() { echo "$1 $(( $(date +%s) - s )) s" >> $o/steps.txt; save; s=$(date +%s); }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh
s=$(date +%s)
{ nvidia-smi topo -m; lscpu | grep -i "numa\|socket\|model name"; } > $o/topo.txt 2>&1
for g in 0 1 2 3; do
  bus=$(nvidia-smi -i $g --query-gpu=pci.bus_id --format=csv,noheader | tr 'A-F' 'a-f' | sed 's/^0000//')
  echo "gpu $g $bus $(cat /sys/bus/pci/devices/$bus/local_cpulist) node $(cat /sys/bus/pci/devices/$bus/numa_node)" >> $o/topo.txt
done
cat > $o/bind.sh <<'EOS'
# one rank: bound to its GPU's local cores (BIND=local), to the others (far), or not (none)
r=${OMPI_COMM_WORLD_LOCAL_RANK:-0}
IFS=, read -ra vis <<< "${CUDA_VISIBLE_DEVICES:-0,1,2,3}"
bus=$(nvidia-smi -i ${vis[$r]} --query-gpu=pci.bus_id --format=csv,noheader | tr 'A-F' 'a-f' | sed 's/^0000//')
local=$(cat /sys/bus/pci/devices/$bus/local_cpulist)
all=$(python3 -c "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))")
far=$(python3 -c "
import sys
def expand(t):
    out = set()
    for p in t.split(','):
        a, _, b = p.partition('-'); out.update(range(int(a), int(b or a) + 1))
    return out
print(','.join(map(str, sorted(expand('$all') - expand('$local')))) or '$all')")
command -v taskset > /dev/null || echo "no taskset: unbound" >&2
case $BIND in local) exec taskset -c $local "$@" ;; far) exec taskset -c $far "$@" ;; *) exec "$@" ;; esac
EOS
step topo
for n in 2 4; do
  [ $n = 2 ] && export CUDA_VISIBLE_DEVICES=0,1 || export CUDA_VISIBLE_DEVICES=0,1,2,3
  for round in 1 2; do
    for b in none local far; do
      echo "== $n GPUs, BIND=$b, round $round"
      BIND=$b timeout 40 $mpi -n $n bash $o/bind.sh python3 tools/anchor_probe.py --sizes 4K,64K,256K,1M 2>&1 | grep -v "Warn\|enable"
    done
  done >> $o/bind_probe.txt 2>&1
  step probe$n
done
export CUDA_VISIBLE_DEVICES=0,1,2,3
timeout 100 $mpi -n 4 python3 benchmarks/bench.py --backend nccl --no-progress --collectives reduce_scatter --algorithms native,direct,ring --sizes 256M,1G --min-time 0.05 --graph-max 0 --json $o/rs_large.json > $o/rs_large.txt 2>&1
step rs_large
python3 - > $o/reduce_pass.txt 2>&1 <<'EOP'
# the reduce pass alone: 4 blocks of 1/4 of the vector (3 received, 1 own) summed into one
import cupy
add4 = cupy.ElementwiseKernel("float32 a, float32 b, float32 c, float32 d", "float32 y",
                              "y = a + b + c + d", "add4")
for total in (256 << 20, 1 << 30):
    n = total // 4 // 4
    xs = [cupy.ones(n, cupy.float32) for _ in range(4)]
    y = cupy.empty(n, cupy.float32)
    for _ in range(3):
        add4(*xs, y)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(20):
        add4(*xs, y)
    end.record(); end.synchronize()
    us = cupy.cuda.get_elapsed_time(start, end) / 20 * 1e3
    moved = 5 * n * 4
    print(f"reduce pass of a {total >> 20} MiB reduce_scatter on 4 ranks: {us:.1f} us "
          f"({moved / us / 1e3:.0f} GB/s of HBM traffic)")
EOP
step reduce_pass
cat $o/steps.txt
