#!/usr/bin/env bash
# gemm's AVX-512 kernels (the `x86-v4` feature) against the AVX2/FMA ones and against the commit
# issue 25 started from (ba939bf), alternated on one host; PyTorch eager in the same rounds.
#   BINS: hidden-v4 (HEAD with x86-v4), hidden-v3 (HEAD without), hidden-ba939bf (old main),
#   each `cargo bench --bench hidden --no-run` of that tree, copied out.
#   benches/results/gemm-avx512/run.sh BINS OUT ROUNDS
set -euo pipefail
bins=$1; out=$2; rounds=${3:-3}
shape=32,64,512,64
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); flags: $(grep -o 'avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $(python3 -c 'import torch; print("torch", torch.__version__)')"
} | tee "$log"
for round in $(seq "$rounds"); do
    echo "## round $round $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
    for build in v4 v3 ba939bf; do
        echo "### $build V=32000" | tee -a "$log"
        "$bins/hidden-$build" --shape $shape,32000 --rounds 3 --variants matmul,logits,hidden \
            --json "$out/rust-$build-32000-$round.json" | tee -a "$log"
    done
    python3 benches/torch_hidden.py --shape $shape,32000 --matmul --json "$out/torch-32000.jsonl" | tee -a "$log"
    for build in v4 v3 ba939bf; do
        echo "### $build V=128000" | tee -a "$log"
        "$bins/hidden-$build" --shape $shape,128000 --rounds 1 --variants matmul,logits,hidden \
            --json "$out/rust-$build-128000-$round.json" | tee -a "$log"
    done
    python3 benches/torch_hidden.py --shape $shape,128000 --matmul --json "$out/torch-128000.jsonl" | tee -a "$log"
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
