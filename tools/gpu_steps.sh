#!/usr/bin/env bash
# One device call on the GPUs of one host: the peer-memory trace, the GPU test suite and the
# bench's GPU rows, each step's output under OUT.
#   bash tools/gpu_steps.sh OUT N_GPUS   (STEPS="check trace suite bench sweep lines fences
#   large profile knobs tune mpi ab pipelined" picks steps; SWEEP, LINES, FENCES, *_ARGS, *_SECONDS,
#   MPI_BIND, MPI_ROUNDS_A/B, AB_OLD (another checkout: device times of both, alternated) and
#   AB_ROUNDS tune them)
set -uo pipefail
out=${1:?output folder}; n=${2:-2}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
mpi="mpiexec --allow-run-as-root --oversubscribe --bind-to none -x PYTHONPATH -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x PYTHONUNBUFFERED"
nvidia-smi -L | tee "$out/gpus.txt"
for step in ${STEPS:-trace suite bench}; do
  start=$(date +%s)
  case $step in
    trace) timeout ${TRACE_SECONDS:-150} $mpi -n "$n" python3 tools/peer_trace.py ${TRACE_ARGS:-} 2>&1 | tee "$out/trace.txt" ;;
    suite) COLLECTIVES_GPU_TEST_SECONDS=200 timeout 300 python3 -m pytest -m gpu tests/gpu -q -x 2>&1 | tail -30 | tee "$out/gpu_suite.txt" ;;
    check) timeout ${CHECK_SECONDS:-200} $mpi -n "$n" python3 tools/peer_check.py ${CHECK_ARGS:-} 2>&1 | tee "$out/peer_check.txt" ;;
    sweep) for b in ${SWEEP:-4K 8K 32K}; do
             echo "== COLLECTIVES_PEER_BLOCK_BYTES=$b"
             COLLECTIVES_PEER_BLOCK_BYTES=$b timeout 120 $mpi -x COLLECTIVES_PEER_BLOCK_BYTES -n "$n" python3 tools/peer_check.py --no-checks --no-graphs --collectives all_reduce,reduce_scatter --algorithms ring,direct,recursive_doubling --sizes 64K,256K,1M,4M
           done 2>&1 | tee "$out/sweep.txt" ;;
    large) COLLECTIVES_PEER_MAX_BYTES=0 timeout ${BENCH_SECONDS:-240} $mpi -x COLLECTIVES_PEER_MAX_BYTES -n "$n" python3 benchmarks/bench.py --backend nccl --no-progress ${LARGE_ARGS:---collectives all_reduce,all_gather --algorithms native,ring,direct} --sizes ${LARGE_SIZES:-4M,16M,64M,256M} --min-time 0.05 --graph-max 0 --json "$out/large.json" 2>&1 | tee "$out/large.txt" ;;
    knobs) for k in ${KNOBS:-COLLECTIVES_PEER_BLOCKS=64 COLLECTIVES_PEER_BLOCKS=128}; do   # device time per setting
             echo "== $k"
             env "$k" COLLECTIVES_PEER_MAX_BYTES=0 timeout 120 $mpi -x "${k%%=*}" -x COLLECTIVES_PEER_MAX_BYTES -n "$n" python3 tools/peer_check.py --no-checks ${KNOB_ARGS:---collectives all_reduce,reduce_scatter --algorithms direct,two_shot --sizes 1M,16M,64M} | grep -A${KNOB_LINES:-12} "device time"
           done 2>&1 | tee "$out/knobs.txt" ;;
    lines) for l in ${LINES:-256K 1M}; do   # device time with larger flagged-line messages
             echo "== COLLECTIVES_PEER_LINE_BYTES=$l"
             COLLECTIVES_PEER_LINE_BYTES=$l timeout 120 $mpi -x COLLECTIVES_PEER_LINE_BYTES -n "$n" python3 tools/peer_check.py --no-checks --collectives all_reduce,reduce_scatter,all_gather --algorithms ring,direct --sizes 64K,256K,1M | grep -A${KNOB_LINES:-12} "device time"
           done 2>&1 | tee "$out/lines.txt" ;;
    fences) for f in ${FENCES:-0 1 2}; do   # device time with each way of ordering flag words
              echo "== COLLECTIVES_PEER_FENCES=$f"
              COLLECTIVES_PEER_FENCES=$f timeout 120 $mpi -x COLLECTIVES_PEER_FENCES -n "$n" python3 tools/peer_check.py --no-checks --collectives all_reduce,all_to_all --algorithms ring,direct --sizes 4K,64K,1M | grep -A${KNOB_LINES:-12} "device time"
            done 2>&1 | tee "$out/fences.txt" ;;
    profile) for lane in 1 0; do     # the compiled repeat path, then the Python path alone
               echo "== COLLECTIVES_PEER_LANE=$lane"
               COLLECTIVES_PEER_LANE=$lane timeout 120 $mpi -x COLLECTIVES_PEER_LANE -n "$n" python3 tools/host_profile.py ${PROFILE_ARGS:-}
             done 2>&1 | tee "$out/profile.txt" ;;
    tune) A="--algorithms ${TUNE_ALGORITHMS:-ring,ring_bidirectional,tree,recursive_doubling,direct,two_shot,native,auto} --rounds 5"
          for run in A B; do    # tuned in run A, judged in a separate run B (issue 16)
            [ $run = A ] && t="--tune $out/tuning_nccl.json" || t="--tuning $out/tuning_nccl.json"
            timeout ${TUNE_SECONDS:-270} $mpi -n "$n" python3 benchmarks/bench.py --backend nccl --no-progress $A --min-time 0.05 --graph-max 0 $t --json "$out/nccl_$run.json" 2>&1 | tail -40
          done 2>&1 | tee "$out/tune.txt" ;;
    mpi) A="--algorithms ${TUNE_ALGORITHMS:-ring,ring_bidirectional,tree,recursive_doubling,direct,two_shot,native,auto} --min-time ${MPI_MIN_TIME:-0.25}"
         for run in A B; do     # 8 MPI ranks on the host's cores, tuned in A, judged in B
           [ $run = A ] && t="--rounds ${MPI_ROUNDS_A:-5} --calibrate $out/tuning_mpi.json --tune $out/tuning_mpi.json" || t="--rounds ${MPI_ROUNDS_B:-5} --tuning $out/tuning_mpi.json"
           timeout ${MPI_SECONDS:-280} ${mpi/--bind-to none/--bind-to ${MPI_BIND:-none}} -n 8 python3 benchmarks/bench.py --no-progress $A $t --json "$out/mpi_$run.json" 2>&1 | grep -v "variable file\|amca-param\|^---" | tail -40
         done 2>&1 | tee "$out/mpi.txt" ;;
    ab) old=${AB_OLD:?AB_OLD: a checkout of the commit to compare against}   # device time, A/B
        (w=$PWD/.whl; cd "$old" && ln -sfn "$w" .whl; mkdir -p "$out/ab_old" && . tools/device_build.sh "$out/ab_old")
        for round in ${AB_ROUNDS:-1 2}; do   # alternated, so drift shows as a difference between rounds
          for tree in "$old" "$PWD"; do
            echo "== $tree, round $round"
            (cd "$tree" && PYTHONPATH=$tree:/tmp/site timeout 150 $mpi -n "$n" python3 tools/peer_check.py --no-checks ${AB_ARGS:-} | grep -A${KNOB_LINES:-30} "device time")
          done
        done 2>&1 | tee "$out/ab.txt" ;;
    pipelined) # pipelined_reduce_scatter (off by default): its GPU tests, then the program
               # against it (COLLECTIVES_PEER_PIPELINE_BYTES 0 and 16M) beside NCCL's own
               COLLECTIVES_GPU_TEST_SECONDS=200 timeout 450 python3 -m pytest -m gpu tests/gpu/test_peer.py -q -k pipelined 2>&1 | tail -30 | tee "$out/pipelined_tests.txt"
               for b in 0 16M; do
                 echo "== COLLECTIVES_PEER_PIPELINE_BYTES=$b"
                 COLLECTIVES_PEER_PIPELINE_BYTES=$b timeout 120 $mpi -x COLLECTIVES_PEER_PIPELINE_BYTES -n "$n" python3 benchmarks/bench.py --backend nccl --no-progress --collectives reduce_scatter --algorithms native,direct --sizes ${PIPELINE_SIZES:-16M,64M,256M,1G} --min-time 0.05 --graph-max 0 --json "$out/pipelined_$b.json"
               done 2>&1 | tee "$out/pipelined.txt" ;;
    bench) timeout ${BENCH_SECONDS:-240} $mpi -n "$n" python3 benchmarks/bench.py --backend nccl --no-progress ${BENCH_ARGS:-} --json "$out/bench.json" 2>&1 | tee "$out/bench.txt" ;;
  esac
  rc=${PIPESTATUS[0]}
  echo "== $step: exit $rc, $(( $(date +%s) - start )) s" | tee -a "$out/steps.txt"
  [ "$step" = check ] && [ "$rc" != 0 ] && break    # wrong results: nothing else is worth timing
done
