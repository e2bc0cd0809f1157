# device call 7 (4 GPUs): auto tuned in run A, judged in run B (issue 16), with this session's
# host path
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
save() { tar -czf $O/r.tgz -C $o . ; }
cp $0 $o/device_script.sh
STEPS="tune" TUNE_SECONDS=220 bash tools/session_gpu.sh $o $n > $o/log.txt 2>&1; save
