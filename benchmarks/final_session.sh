#!/usr/bin/env bash
# The last lent-machine run of a session (4-GPU host, 64 cores), about 4 minutes: the 8-rank
# MPI sweep (compiled executor built against the host's Open MPI, calibrated model), the
# socket transport against gloo at 4 ranks, the nccl bench under collectives.run on 2 GPUs,
# and auto against the bidirectional ring on 4 GPUs. JSON, plots and logs land in $OUT.
set -u
O=${OUT:-./final-logs}; mkdir -p "$O"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
PY=python3
ls .whl/cython-*.whl >/dev/null 2>&1 && $PY -m pip install -q --no-index --no-deps --target /tmp/site .whl/cython-*.whl 2>/dev/null
h=$(find / -name mpi.h -path "*openmpi*" 2>/dev/null | head -n 1)
[ -n "$h" ] && export COLLECTIVES_MPI_INCLUDE=$(dirname "$h")
PYTHONPATH=/tmp/site $PY setup.py build_ext --inplace > "$O/build.log" 2>&1; echo "build rc=$?"
$PY -m collectives info 2>&1 | grep -aE "compiled MPI|MPI library"
M="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED"
timeout -s KILL 90 $M -n 8 $PY benchmarks/bench.py --calibrate "$O/tuning_mpi8.json" \
  --algorithms ring,tree,recursive_doubling,native,auto --sizes 4K:64M --no-progress \
  --json "$O/mpi8.json" --plot "$O/mpi8.png" > "$O/mpi8.log" 2>&1; echo "mpi8 rc=$?"
timeout -s KILL 80 $PY benchmarks/bench.py --backend socket --world-size 4 \
  --collectives all_reduce,all_gather,reduce_scatter --sizes 4K,1M,16M,64M --no-progress \
  --algorithms ring,ring_bidirectional,tree,recursive_doubling,native,auto \
  --json "$O/socket4.json" > "$O/socket4.log" 2>&1; echo "socket4 rc=$?"
timeout -s TERM 60 env CUDA_VISIBLE_DEVICES=0,1 $PY -m collectives.run --standalone \
  --nproc-per-node 2 benchmarks/bench.py --backend nccl --collectives all_reduce,all_to_all \
  --algorithms ring,recursive_doubling --sizes 1M,16M > "$O/launcher2.log" 2>&1; echo "launcher2 rc=$?"
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 4 ] && timeout -s KILL 60 $M -n 4 $PY benchmarks/bench.py --backend nccl --collectives all_reduce,all_gather \
  --algorithms ring,ring_bidirectional,recursive_doubling,auto --sizes 16M,256M \
  --json "$O/nccl4_auto.json" > "$O/nccl4.log" 2>&1; echo "nccl4 rc=$? ($gpus GPUs)"
grep -aE "^# +(all_|reduce_|auto|model)|calibrated|rows" "$O/mpi8.log" | head -n 20
grep -aE "^# +(all_|reduce_|auto)|rows" "$O/socket4.log" | head -n 12
grep -aE "all_reduce|all_to_all|Error" "$O/launcher2.log" | grep -v ceiling | head -n 12
grep -aE "all_reduce|all_gather" "$O/nccl4.log" | grep -v "ceiling\|graph" | head -n 16
