#!/usr/bin/env bash
# benches/loss_vs_torch.sh's rounds with two candle builds after each PyTorch run: HEAD
# ("ops": the score and the expected form's matches as custom ops, ca887e9's tree) and 9552172's
# tree, before either op ("composed"), so the ops' effect on the CPU is measured in the same run
# as the comparison with PyTorch.
#   BINS holds loss-ops, loss-composed.
#   PYTHON=python-with-torch benches/results/loss-vs-torch-ops/run.sh BINS OUT ROUNDS
set -euo pipefail
bins=$1; out=$2; rounds=${3:-3}
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
        # The two builds alternate which goes first after PyTorch, round by round.
        builds=(ops composed)
        if (( round % 2 == 0 )); then builds=(composed ops); fi
        for build in "${builds[@]}"; do
            echo "### $build" | tee -a "$log"
            env "${env_args[@]}" TORCH_RESULTS="$torch_json" "$bins/loss-$build" --large --no-slow --cpu \
                | tee "$out/loss-$build-$policy-$round.txt" | tee -a "$log"
        done
    done
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
