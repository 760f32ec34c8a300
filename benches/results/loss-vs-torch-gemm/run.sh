#!/usr/bin/env bash
# benches/loss_vs_torch.sh's rounds with two candle builds after each PyTorch run: HEAD
# (b8918d1, "tiled": gemm with AVX-512) and 252f76a's tree without gemm's x86-v4 ("v3"), so
# the paired form's gemm change is measured in the same run as the comparison with PyTorch.
#   BINS holds loss-tiled, loss-v3.     benches/results/loss-vs-torch-gemm/run.sh BINS OUT ROUNDS
set -euo pipefail
bins=$1; out=$2; rounds=${3:-3}
forms=cross_entropy,expected,ce_expected,lower_bound,paired
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $(python3 -c 'import torch; print("torch", torch.__version__)')"
} | tee "$log"
for round in $(seq "$rounds"); do
    for policy in default reuse-heap; do
        env_args=()
        if [ "$policy" = reuse-heap ]; then
            env_args=(MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=2147483648)
        fi
        echo "## round $round, $policy, $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
        torch_json="$out/torch-$policy-$round.json"
        env "${env_args[@]}" python3 benches/torch_bleu_loss.py --skip-check --threads 2 \
            --shapes 32,64,64,32000 --forms $forms --json "$torch_json" | tee -a "$log"
        for build in tiled v3; do
            echo "### $build" | tee -a "$log"
            env "${env_args[@]}" TORCH_RESULTS="$torch_json" "$bins/loss-$build" --large --no-slow --cpu \
                | tee "$out/loss-$build-$policy-$round.txt" | tee -a "$log"
        done
    done
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
