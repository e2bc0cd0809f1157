# device call 1 (N GPUs): two_shot_in_place — the GPU tests (peer path, in place on 2 and 4
# GPUs), the anchor probe with its row, the bench's all_reduce rows 64K-64M, and the in-place
# row at other block counts
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
COLLECTIVES_GPU_TEST_SECONDS=100 timeout 330 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -x 2>&1 | tail -40 > $o/gpu_peer.txt
save
timeout 100 $mpi -n $n python3 tools/anchor_probe.py --sizes 64K,256K,1M,4M,16M > $o/anchor.txt 2>&1
save
timeout 120 $mpi -n $n python3 benchmarks/bench.py --backend nccl --no-progress --collectives all_reduce --algorithms native,direct,two_shot --sizes 64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0 --json $o/bench.json > $o/bench.txt 2>&1
save
for b in 16K 32K; do
  echo "== COLLECTIVES_PEER_BLOCK_BYTES=$b" >> $o/knobs.txt
  COLLECTIVES_PEER_BLOCK_BYTES=$b timeout 80 $mpi -x COLLECTIVES_PEER_BLOCK_BYTES -n $n python3 tools/anchor_probe.py --sizes 1M,4M,16M >> $o/knobs.txt 2>&1
  save
done
