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
