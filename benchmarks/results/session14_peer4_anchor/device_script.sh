# device call 2 (4 GPUs): the anchor probe fixed (SymmetricMemory timed on torch's stream,
# graphs replayed on the capture stream), with the host's issue time per call; then the
# probe at 4K-64K with programmatic dependent launch off, and with the Python path only
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
nvidia-smi -L > $o/gpus.txt
cp $0 $o/device_script.sh
timeout 150 $mpi -n $n python3 tools/anchor_probe.py > $o/anchor.txt 2>&1
save
for kv in COLLECTIVES_PEER_OVERLAP=0 COLLECTIVES_PEER_LANE=0 NONE=1; do
  echo "== $kv" >> $o/anchor_knobs.txt
  env $kv timeout 100 $mpi -x ${kv%%=*} -n $n python3 tools/anchor_probe.py --sizes 4K,64K >> $o/anchor_knobs.txt 2>&1
  save
done
