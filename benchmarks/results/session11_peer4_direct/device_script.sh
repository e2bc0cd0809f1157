# device call 5 (4 GPUs): symmetric checks, A/B against the kernel before direct landing, suite
o=/tmp/r; n=${N:-4}; O=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
save() { tar -czf $O/r.tgz -C $o . ; }
timeout 150 $mpi -n $n python3 tools/peer_check.py --symmetric --no-graphs --sizes 4K > $o/peer_check_symmetric.txt 2>&1
grep "checks done\|WRONG" $o/peer_check_symmetric.txt | head; save
grep -q "checks done: 0 wrong" $o/peer_check_symmetric.txt || exit 3
STEPS="ab" AB_OLD=$PWD/../.snap_old AB_ROUNDS="1 2" AB_ARGS="--collectives all_reduce,all_gather --algorithms direct,two_shot,ring --sizes 256K,1M,4M,16M --symmetric" bash tools/session_gpu.sh $o $n; save
STEPS="suite" bash tools/session_gpu.sh $o $n; save
