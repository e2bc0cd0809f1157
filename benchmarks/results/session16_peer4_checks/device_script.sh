# device call 1 (4 GPUs, 64-core host): the peer GPU tests (2 and 4 GPUs) after the fifteenth
# session's untested changes; the in-place kernel above 8 MiB on 2 GPUs (anchor probe with the
# limit raised); the 8-rank MPI tune pair (issue 16)
o=/tmp/r; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_IN_PLACE_BYTES"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt; nproc >> $o/gpus.txt
cp $0 $o/device_script.sh
s=$(date +%s)
COLLECTIVES_GPU_TEST_SECONDS=80 timeout 150 python3 -m pytest -m gpu tests/gpu/test_peer.py -q 2>&1 | tail -40 > $o/gpu_peer.txt
echo "tests $(( $(date +%s) - s )) s" >> $o/steps.txt; save
s=$(date +%s)
CUDA_VISIBLE_DEVICES=0,1 COLLECTIVES_PEER_IN_PLACE_BYTES=256M timeout 60 $mpi -n 2 python3 tools/anchor_probe.py --sizes 4M,16M,64M > $o/anchor2_raised.txt 2>&1
echo "anchor2 $(( $(date +%s) - s )) s" >> $o/steps.txt; save
s=$(date +%s)
COLLECTIVES_PEER_IN_PLACE_BYTES=256M timeout 50 $mpi -n 4 python3 tools/anchor_probe.py --sizes 16M,64M > $o/anchor4_raised.txt 2>&1
echo "anchor4 $(( $(date +%s) - s )) s" >> $o/steps.txt; save
STEPS=mpi MPI_BIND=core MPI_ROUNDS_A=10 MPI_ROUNDS_B=10 MPI_MIN_TIME=0.2 MPI_SECONDS=170 bash tools/session_gpu.sh $o 4 > /dev/null 2>&1
cat $o/steps.txt; save
