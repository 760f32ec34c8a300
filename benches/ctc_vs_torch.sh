#!/usr/bin/env bash
# The CTC loss from logits against PyTorch (issue 33): `ctc_loss_from_logits` forward + backward
# (benches/ctc.rs) and `F.ctc_loss(F.log_softmax(logits))` forward + backward
# (benches/torch_ctc.py) at [B, T', V, L] = [32, 128, 8000, 48], f32, 2 threads each, alternated
# for ROUNDS rounds (PyTorch first in each); then the median over rounds of each side's
# per-round median, the spread (lowest and highest per-round median) and the ratio.
#
#   benches/ctc_vs_torch.sh [ROUNDS] [OUT_DIR] [ROWS]
#   (default 3 rounds, benches/results/ctc-vs-torch, rows ctc_from_logits)
#
# PyTorch's rows run when Python has torch (else they are skipped, and the ratios are to the
# first row): PYTHON=/path/to/venv/bin/python after `pip install torch==2.15.0` in that venv.
# BENCH=path runs an already built bench executable.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
out=${2:-benches/results/ctc-vs-torch}
rows=${3:-ctc_from_logits}
shape=32,128,8000,48
mkdir -p "$out"
bench=${BENCH:-$(cargo bench --bench ctc --no-run --message-format=json 2>/dev/null \
    | python3 -c 'import json,sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "ctc"][-1])')}
python=${PYTHON:-python3}
log="$out/run.txt"
{
    echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cores, $(lscpu | grep 'Model name' | sed 's/  */ /g'); load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "# $("$python" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'no torch'); shape $shape; 2 threads each"
} | tee "$log"
for round in $(seq "$rounds"); do
    echo "## round $round, $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
    if "$python" -c 'import torch' 2>/dev/null; then
        "$python" benches/torch_ctc.py --threads 2 --runs 5 --shape "$shape" | tee -a "$log"
    fi
    RAYON_NUM_THREADS=2 "$bench" --runs 5 --shape "$shape" --rows "$rows" | tee -a "$log"
done
echo "# done $(date -u +%FT%TZ); load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
"$python" - "$log" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
rounds = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        rounds.setdefault(r["row"], []).append(r["median_ms"])
base_row = "torch_ctc" if "torch_ctc" in rounds else next(iter(rounds))
base = statistics.median(rounds[base_row])
for row, medians in rounds.items():
    m = statistics.median(medians)
    print(f"{row:26s} median of {len(medians)} rounds {m:9.1f} ms  spread {min(medians):.1f}-{max(medians):.1f} ms"
          f"  per round {medians}  vs {base_row} {m / base:.2f}x")
PY
