#!/usr/bin/env bash
# callgrind instruction counts, old (0ce4dcb, session start) and new (HEAD), alternated per case
set -u
old=/work/wt-cg-old/target/release/deps/callgrind-4d4c98b258a1521a
new=/work/main/target/release/deps/callgrind-7ec046c5d161ea21
for case in expected cross_entropy hidden_expected paired cross_entropy_z; do
  for side in old new; do
    bin=$old; [[ $side == new ]] && bin=$new
    RAYON_NUM_THREADS=1 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/$case.$side.out $bin $case > /tmp/cg/$case.$side.log 2>&1
    ir=$(grep -m1 "^summary:" /tmp/cg/$case.$side.out | awk '{print $2}')
    echo "$case $side $ir"
  done
done
