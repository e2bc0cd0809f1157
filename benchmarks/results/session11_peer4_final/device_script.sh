# device call 2 (4 GPUs): checks (eager default; then rendezvous forced), A/B against 19f9981, bench, large, suite
o=/tmp/r; n=${N:-4}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:/tmp/site
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
STEPS="check" CHECK_ARGS="--collectives all_reduce,reduce_scatter,all_gather,all_to_all" bash tools/session_gpu.sh $o $n
grep -q "checks done: 0 wrong" $o/peer_check.txt || exit 3
mv $o/peer_check.txt $o/peer_check_default.txt
COLLECTIVES_PEER_EAGER_BYTES=16K COLLECTIVES_PEER_LINE_BYTES=4K timeout 200 $mpi -x COLLECTIVES_PEER_EAGER_BYTES -x COLLECTIVES_PEER_LINE_BYTES -n $n python3 tools/peer_check.py --collectives all_reduce,reduce_scatter,all_gather --no-graphs > $o/peer_check_rendezvous.txt 2>&1
grep "checks done" $o/peer_check_rendezvous.txt
grep -q "checks done: 0 wrong" $o/peer_check_rendezvous.txt || exit 4
STEPS="ab bench large suite" AB_OLD=$PWD/../.snap_old AB_ROUNDS="1 2" AB_ARGS="--collectives all_reduce,all_gather --algorithms direct,two_shot,ring --sizes 4K,256K,1M,4M,64M --symmetric" BENCH_ARGS="--algorithms native,ring,direct,recursive_doubling,two_shot --sizes 4K,64K,256K,1M,4M,16M,64M --min-time 0.05 --graph-max 0" LARGE_ARGS="--collectives all_reduce --algorithms native,two_shot" LARGE_SIZES="256M,1G" bash tools/session_gpu.sh $o $n
