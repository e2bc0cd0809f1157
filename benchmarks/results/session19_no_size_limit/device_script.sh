# session 19, device call 5 (4 x H100 host; then 2 of its GPUs): all_gather / all_to_all
# 256M-1G with COLLECTIVES_PEER_MAX_BYTES=0 (no call leaves peer memory for its size), so the
# symmetric rows run the program's pushes where by default every rank's call goes to NCCL
# send/recv (the limit is decided alike on every rank, as if outputs were staged)
O=$1; o=/tmp/r19e; rm -rf $o; mkdir -p $o
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 COLLECTIVES_PEER_MAX_BYTES=0
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED -x CUDA_VISIBLE_DEVICES -x COLLECTIVES_PEER_MAX_BYTES"
cp $0 $o/device_script.sh
b="--backend nccl --no-progress --min-time 0.05 --graph-max 0 --rounds 3 --collectives all_gather,all_to_all --algorithms native,direct --sizes 256M,1G"
timeout 70 $mpi -n 4 python3 benchmarks/bench.py $b --json $o/nolimit4.json > $o/nolimit4.txt 2>&1; tar -czf $O/r.tgz -C $o .
export CUDA_VISIBLE_DEVICES=0,1
timeout 60 $mpi -n 2 python3 benchmarks/bench.py $b --json $o/nolimit2.json > $o/nolimit2.txt 2>&1; tar -czf $O/r.tgz -C $o .
for f in nolimit4 nolimit2; do echo "== $f"; grep -E "^ +[0-9]" $o/$f.txt | awk "{print \$1,\$5,\$6,\$10,\$NF}"; done
