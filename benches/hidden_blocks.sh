#!/usr/bin/env bash
# HiddenConfig::block_elements against the hidden path's time and memory: the default (4 Mi
# logits per block) and 16 Mi, at V = 32000 and 128000 ([B,S,D,T] = [32,64,512,64], f32, nearly
# uniform rows), each process against the logits path, ROUNDS rounds alternating the sizes.
#
#   benches/hidden_blocks.sh [ROUNDS] [OUT_DIR]   (default 2 rounds, benches/results/hidden-blocks)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
out=${2:-benches/results/hidden-blocks}
mkdir -p "$out"
bench=$(cargo bench --bench hidden --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "hidden"][-1])')
log="$out/run.txt"
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
for round in $(seq "$rounds"); do
    echo "## round $round $(date -u +%T)" | tee -a "$log"
    for vocab in 32000 128000; do
        for block in 4194304 16777216; do
            echo "### V = $vocab, block_elements = $block" | tee -a "$log"
            "$bench" --shape 32,64,512,64,$vocab --rounds 2 --variants logits,hidden --block-elements $block \
                --json "$out/rust-$vocab-block$block-$round.json" | tee -a "$log"
        done
    done
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
