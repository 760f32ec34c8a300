#!/usr/bin/env bash
# Re-scores a finished CTC NAT study's committed outputs with sacrebleu and writes the analyses
# beside its results.json — the files docs/ctc_nat.md cites:
#   rescore.txt        every output re-scored, the seed-level tests recomputed (rescore.py)
#   bleu_breakdown.txt each run's precisions, brevity penalty and BLEU / BP (bleu_breakdown.py)
#   gap_split.txt      the gain over `ctc` and the gap to the teacher, length and precision
#                      changed one at a time, and word recall (ctc_nat_gap.py)
#
#   research/scripts/score_study.sh docs/ctc_nat_lc_run
#
# Installs sacrebleu 2.6.0 and scipy with pip (--user) when they are missing. Exits non-zero if
# a re-scored number differs from the reported one (rescore.py's rule).
set -euo pipefail
dir="${1:?usage: score_study.sh DIR (holding results.json)}"
results="$dir/results.json"
[[ -f "$results" ]] || { echo "score_study: no $results" >&2; exit 2; }
here="$(cd "$(dirname "$0")" && pwd)"
if ! python3 -c 'import sacrebleu, scipy; assert sacrebleu.__version__ == "2.6.0"' 2>/dev/null; then
    python3 -m pip install --quiet --user 'sacrebleu==2.6.0' scipy \
        || python3 -m pip install --quiet --user --break-system-packages 'sacrebleu==2.6.0' scipy
fi
python3 "$here/rescore.py" "$results" > "$dir/rescore.txt"
python3 "$here/bleu_breakdown.py" "$results" > "$dir/bleu_breakdown.txt"
python3 "$here/ctc_nat_gap.py" "$results" > "$dir/gap_split.txt"
echo "score_study: wrote $dir/rescore.txt, bleu_breakdown.txt, gap_split.txt" >&2
