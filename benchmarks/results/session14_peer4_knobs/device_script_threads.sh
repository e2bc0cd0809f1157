# device call 6 (4 GPUs): threads per block (512, the default, against 1024) by the most blocks
# (128, 64, 32), two_shot all_reduce at 1M-16M, device time in CUDA graphs
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
for T in 512 1024; do
  sed -i "s/^THREADS = .*/THREADS = $T/" collectives/kernels/cuda_peer.py
  for B in 128 64 32; do
    echo "== THREADS=$T COLLECTIVES_PEER_BLOCKS=$B" >> $o/threads.txt
    COLLECTIVES_PEER_BLOCKS=$B timeout 60 $mpi -x COLLECTIVES_PEER_BLOCKS -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce --algorithms two_shot,direct --sizes 256K,1M,4M,16M 2>&1 | grep -A6 "device time" >> $o/threads.txt
    save
  done
done
sed -i "s/^THREADS = .*/THREADS = 512/" collectives/kernels/cuda_peer.py
