#!/usr/bin/env bash
# How the BLEU loss on CTC outputs grows (issue 33): `ctc_bleu_loss_from_logits` (4-grams)
# forward + backward at T' = 64, 128, 256 (V = 8000, L = 48), at reference lengths L = 24, 48,
# 96 (V = 8000, and V = 64 where the vocabulary-sized passes are small and the n-gram programs
# show), 2 threads, ROUNDS rounds of every row in turn; then each row's median over rounds and
# its ratio to the middle size.
#
#   benches/ctc_bleu_scaling.sh [ROUNDS] [OUT_DIR]   (default 3, benches/results/ctc-bleu)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
out=${2:-benches/results/ctc-bleu}
mkdir -p "$out"
bench=${BENCH:-$(cargo bench --bench ctc --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "ctc"][-1])')}
rows=ctc_bleu4_t64,ctc_bleu4,ctc_bleu4_t256,ctc_bleu4_l24,ctc_bleu4_l96,ctc_bleu4_v64_l24,ctc_bleu4_v64_l48,ctc_bleu4_v64_l96
log="$out/scaling.txt"
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$log"
for round in $(seq "$rounds"); do
    echo "## round $round, $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
    RAYON_NUM_THREADS=2 "$bench" --runs 5 --rows "$rows" | tee -a "$log"
done
python3 - "$log" <<'PY' | tee "$out/scaling-summary.txt"
import json, statistics, sys
rounds = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        rounds.setdefault(r["row"], (r["shape"], []))[1].append(r["median_ms"])
med = {row: statistics.median(v) for row, (_, v) in rounds.items()}
groups = [("frames T' (V 8000, L 48)", ["ctc_bleu4_t64", "ctc_bleu4", "ctc_bleu4_t256"], "ctc_bleu4"),
          ("reference length L (V 8000, T' 128)", ["ctc_bleu4_l24", "ctc_bleu4", "ctc_bleu4_l96"], "ctc_bleu4"),
          ("reference length L (V 64, T' 128)", ["ctc_bleu4_v64_l24", "ctc_bleu4_v64_l48", "ctc_bleu4_v64_l96"], "ctc_bleu4_v64_l48")]
for title, rows, middle in groups:
    print(title)
    for row in rows:
        shape, v = rounds[row]
        print(f"  {row:20s} {str(shape):22s} median {med[row]:8.2f} ms  spread {min(v):.2f}-{max(v):.2f}  x{med[row] / med[middle]:.2f} of the middle size")
PY
