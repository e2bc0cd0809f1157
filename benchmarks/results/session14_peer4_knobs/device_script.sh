# device call 1 (4 GPUs): the anchor probe (ours against SymmetricMemory, back to back and in
# graphs), then the peer kernel's knobs at 64K-16M (all_reduce direct / two_shot)
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
timeout 150 $mpi -n $n python3 tools/anchor_probe.py > $o/anchor.txt 2>&1
save
for kv in NONE=1 COLLECTIVES_PEER_BLOCKS=32 COLLECTIVES_PEER_BLOCKS=64 COLLECTIVES_PEER_BLOCK_BYTES=16K COLLECTIVES_PEER_LINE_BYTES=64K COLLECTIVES_PEER_LINE_BYTES=1M; do
  echo "== $kv" >> $o/knobs.txt
  env $kv timeout 75 $mpi -x ${kv%%=*} -n $n python3 tools/peer_check.py --no-checks --collectives all_reduce --algorithms direct,two_shot --sizes 64K,256K,1M,4M,16M >> $o/knobs.txt 2>&1
  save
done
