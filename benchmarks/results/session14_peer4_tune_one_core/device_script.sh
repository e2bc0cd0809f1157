# device call 8 (4 GPUs): the same pair as call 7 with each rank bound to a core (mpiexec
# --bind-to core): does the host's jitter at the host-bound sizes go down?
o=/tmp/r; n=${N:-4}; O=$1; mkdir -p $o
save() { tar -czf $O/r.tgz -C $o . ; }
cp $0 $o/device_script.sh
sed -i 's/--bind-to none/--bind-to core/' tools/session_gpu.sh
STEPS="tune" TUNE_SECONDS=220 bash tools/session_gpu.sh $o $n > $o/log.txt 2>&1; save
