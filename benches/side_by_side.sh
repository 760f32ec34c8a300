#!/usr/bin/env bash
# Two builds of the crate side by side, in one run: the logits path and the hidden path of
# `benches/hidden.rs` (ce_bleu from logits and from hidden states, forward + backward) from a
# BASE build and a HEAD build, alternated ROUNDS times, each process alternating its own
# variants 3 times and reporting medians; PyTorch eager's logits path in each round as the
# yardstick (benches/torch_hidden.py). 2 threads each, [B,S,D,T,V] = SHAPE.
#
#   benches/side_by_side.sh BASE_BENCH HEAD_BENCH [ROUNDS] [OUT_DIR] [SHAPE]
#
# BASE_BENCH and HEAD_BENCH are `hidden` bench executables (`cargo bench --bench hidden
# --no-run` in each checkout, with its own CARGO_TARGET_DIR). Needs Python with torch.
set -euo pipefail
cd "$(dirname "$0")/.."
base=$1
head=$2
rounds=${3:-3}
out=${4:-benches/results/side-by-side}
shape=${5:-32,64,512,64,32000}
python=${PYTHON:-python3}
mkdir -p "$out"
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# base $base; head $head; shape $shape"
} | tee "$log"
for round in $(seq "$rounds"); do
    for build in base head; do
        bin=$base
        [ "$build" = head ] && bin=$head
        echo "## round $round $build $(date -u +%T)" | tee -a "$log"
        "$bin" --shape "$shape" --rounds 3 --variants logits,hidden \
            --json "$out/$build-$round.json" | tee -a "$log"
    done
    echo "## round $round torch $(date -u +%T)" | tee -a "$log"
    "$python" benches/torch_hidden.py --shape "$shape" --json "$out/torch.jsonl" | tee -a "$log"
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
