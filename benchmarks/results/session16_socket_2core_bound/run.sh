set -u
cd /work/main
O=${1:-OUT}; mkdir -p $O
A="--backend socket --bind-to core --algorithms ring,ring_bidirectional,tree,recursive_doubling,direct,two_shot,native,auto --no-progress --rounds 5"
for n in 2 4; do
  start=$(date +%s)
  timeout 900 .venv/bin/python benchmarks/bench.py $A --world-size $n --tune $O/tuning_socket_$n.json --json $O/socket_${n}_A.json > $O/socket_${n}_A.txt 2>&1
  echo "A $n: exit $? $(( $(date +%s) - start )) s" >> $O/steps.txt
  start=$(date +%s)
  timeout 900 .venv/bin/python benchmarks/bench.py $A --world-size $n --tuning $O/tuning_socket_$n.json --json $O/socket_${n}_B.json > $O/socket_${n}_B.txt 2>&1
  echo "B $n: exit $? $(( $(date +%s) - start )) s" >> $O/steps.txt
done
echo done >> $O/steps.txt
