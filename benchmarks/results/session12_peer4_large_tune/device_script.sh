# device call 4 (4 GPUs): 256 MiB and 1 GiB; auto tuned in run A, judged in run B (issue 16)
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
save() { tar -czf $O/r.tgz -C $o . ; }
STEPS="large" LARGE_ARGS="--collectives all_reduce --algorithms native,two_shot" LARGE_SIZES="256M,1G" bash tools/session_gpu.sh $o $n > /dev/null 2>&1; save
STEPS="tune" TUNE_SECONDS=250 bash tools/session_gpu.sh $o $n > /dev/null 2>&1; save
