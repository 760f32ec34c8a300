#!/usr/bin/env bash
# The hidden-state path with the vocabulary-tiled backward (b8918d1, "tiled") against gemm's
# AVX-512 kernels alone (8075c2e, "v4") and the commit issue 25 started from (ba939bf),
# alternated on one host, PyTorch eager in the same rounds.
#   BINS holds hidden-tiled, hidden-v4, hidden-ba939bf: `cargo bench --bench hidden --no-run`
#   of each tree, copied out.      benches/results/hidden-tiles/run.sh BINS OUT ROUNDS
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
    for build in tiled ba939bf; do
        echo "### $build V=32000" | tee -a "$log"
        "$bins/hidden-$build" --shape $shape,32000 --rounds 3 --variants matmul,logits,hidden \
            --json "$out/rust-$build-32000-$round.json" | tee -a "$log"
    done
    python3 benches/torch_hidden.py --shape $shape,32000 --matmul --json "$out/torch-32000.jsonl" | tee -a "$log"
    for build in tiled v4 ba939bf; do
        echo "### $build V=128000" | tee -a "$log"
        "$bins/hidden-$build" --shape $shape,128000 --rounds 1 --variants matmul,logits,hidden \
            --json "$out/rust-$build-128000-$round.json" | tee -a "$log"
    done
    python3 benches/torch_hidden.py --shape $shape,128000 --matmul --json "$out/torch-128000.jsonl" | tee -a "$log"
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
