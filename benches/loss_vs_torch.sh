#!/usr/bin/env bash
# The loss from logits against PyTorch, back to back (issue 25's measurement): ROUNDS rounds, each
# running PyTorch (benches/torch_bleu_loss.py) and then this crate's `loss` bench on the same
# shape, both with 2 threads, under two glibc heap policies:
#   default      glibc's own (buffers of [B, S, V] are mmapped fresh every step: page faults)
#   reuse-heap   MALLOC_MMAP_THRESHOLD_=1 GiB, MALLOC_TRIM_THRESHOLD_=2 GiB (freed buffers stay in
#                the heap and are reused), set for both processes alike
# Each `loss` run reads the PyTorch run just before it (TORCH_RESULTS) for its "vs torch" column.
#
#   benches/loss_vs_torch.sh [ROUNDS] [OUT_DIR]   (default 2 rounds, benches/results/loss-vs-torch)
#
# Needs Python with torch (pip install torch numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
out=${2:-benches/results/loss-vs-torch}
mkdir -p "$out"
bench=$(cargo bench --bench loss --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "loss"][-1])')
python=${PYTHON:-python3}
forms=cross_entropy,expected,ce_expected,lower_bound,paired
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $("$python" -c 'import torch; print("torch", torch.__version__)')"
} | tee "$log"
for round in $(seq "$rounds"); do
    for policy in default reuse-heap; do
        env_args=()
        if [ "$policy" = reuse-heap ]; then
            env_args=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483648)
        fi
        echo "## round $round, $policy, $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
        torch_json="$out/torch-$policy-$round.json"
        env "${env_args[@]}" "$python" benches/torch_bleu_loss.py --skip-check --threads 2 \
            --shapes 32,64,64,32000 --forms $forms --json "$torch_json" | tee -a "$log"
        env "${env_args[@]}" TORCH_RESULTS="$torch_json" "$bench" --large --no-slow --cpu \
            | tee "$out/loss-$policy-$round.txt" | tee -a "$log"
    done
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
