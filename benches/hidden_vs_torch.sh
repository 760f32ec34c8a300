#!/usr/bin/env bash
# The training loss from hidden states (issue 16's measurement): this crate's hidden path, its
# logits path and PyTorch eager, forward + backward, back to back, ROUNDS rounds alternating
# the processes; each Rust process alternates its own variants 3 times and reports medians,
# each PyTorch process times 5 steps after 2 of warm-up.
#
#   benches/hidden_vs_torch.sh [ROUNDS] [OUT_DIR]   (default 3 rounds, benches/results/hidden)
#
# Per round, at [B,S,D,T] = [32,64,512,64] f32, 2 threads each:
#   V = 32000, nearly uniform rows (σ = 1): candle matmul, logits path, hidden path, filtered;
#     PyTorch eager (+ its matmul yardstick);
#   V = 32000, peaked rows, logits, hidden, filtered (PyTorch's dense step does not depend on
#     the distribution): σ = 3 with a unigram prior α = 1.5 (about 2.6 nats, near the 2.8 of
#     the translate study's trained models, `translate --output-distribution`), and σ = 2 with
#     α = 2 (about 1.7 nats: a steeper tail, where the filter skips tiles);
#   V = 128000, σ = 1: candle matmul, logits path, hidden path; PyTorch eager.
# Needs `cargo bench --bench hidden --no-run` and Python with torch (pip install torch).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
out=${2:-benches/results/hidden}
mkdir -p "$out"
bench=$(cargo bench --bench hidden --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "hidden"][-1])')
python=${PYTHON:-python3}
shape=32,64,512,64
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $("$python" -c 'import torch; print("torch", torch.__version__, "threads", torch.get_num_threads())')"
} | tee "$log"
for round in $(seq "$rounds"); do
    echo "## round $round $(date -u +%T)" | tee -a "$log"
    "$bench" --shape $shape,32000 --rounds 3 --variants matmul,logits,hidden,filtered \
        --json "$out/rust-32000-uniform-$round.json" | tee -a "$log"
    "$python" benches/torch_hidden.py --shape $shape,32000 --matmul --json "$out/torch-32000.jsonl" | tee -a "$log"
    "$bench" --shape $shape,32000 --rounds 3 --variants logits,hidden,filtered --peaked 3 --zipf 1.5 \
        --json "$out/rust-32000-peaked-$round.json" | tee -a "$log"
    "$bench" --shape $shape,32000 --rounds 3 --variants logits,hidden,filtered --peaked 2 --zipf 2 \
        --json "$out/rust-32000-steep-$round.json" | tee -a "$log"
    "$bench" --shape $shape,128000 --rounds 3 --variants matmul,logits,hidden \
        --json "$out/rust-128000-uniform-$round.json" | tee -a "$log"
    "$python" benches/torch_hidden.py --shape $shape,128000 --matmul --json "$out/torch-128000.jsonl" | tee -a "$log"
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
