#!/usr/bin/env bash
# Quiet-window benchmarks on core 1 (the study runs single-threaded on core 0).
set -u
cd /work/main
export RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1 OMP_NUM_THREADS=1
R=benches/results
LOSS=$(ls target/release/deps/loss-45ced62bbbd55e06)
STREAM=$(ls target/release/deps/stream-85a4322858c575c4)
CLI=$(ls target/release/deps/cli-1008144f2b662760)
echo "machine: $(lscpu | grep 'Model name' | sed 's/  */ /g'), $(nproc) cores; pinned to core 1, 1 thread each; the study runs on core 0" > $R/window-1thread-machine.txt
for i in 1 2 3 4 5; do
  t=$(date +%s)
  taskset -c 1 /work/torch-venv/bin/python benches/torch_bleu_loss.py --skip-check --threads 1 --shapes 32,64,64,32000 \
     --forms cross_entropy,expected,ce_expected,lower_bound,paired --json $R/torch-1thread-$i.json > $R/torch-1thread-$i.txt 2>&1
  TORCH_RESULTS=$R/torch-1thread-$i.json taskset -c 1 $LOSS --large --no-slow --cpu > $R/loss-1thread-$i.txt 2>&1
  echo "alternation $i done $(date +%T)"
done
taskset -c 1 $STREAM > $R/stream-1core.txt 2>&1; echo "stream done $(date +%T)"
taskset -c 1 $CLI > $R/cli-bench-rust.txt 2>&1
taskset -c 1 python3 benches/cli_sacrebleu.py --runs 7 --bin target/release/candle-bleu > $R/cli-sacrebleu-1core.txt 2>&1; echo "cli done $(date +%T)"
