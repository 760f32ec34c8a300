#!/usr/bin/env python3
"""Where the CTC NAT's BLEU gain and its gap to the teacher come from, from the committed
outputs of a ctc_nat run: each part of BLEU changed one at a time.

    pip install sacrebleu==2.6.0
    python3 research/scripts/ctc_nat_gap.py docs/ctc_nat_run/results.json > docs/ctc_nat_run/gap_split.txt

BLEU = BP · exp(mean_n log p_n). For two systems A (from) and B (to), seed means of each part:
- the length part: B's brevity penalty with A's precisions, minus A's BLEU;
- the precision part: B's precisions with A's brevity penalty, minus A's BLEU.
BLEU is a product, so the two parts do not add up to the whole difference. The gain of an arm
over the control is also split in log space: log(BLEU_arm / BLEU_ctc) = log(BP ratio) +
log(BLEU/BP ratio), and the share of the brevity penalty is the first over the sum.

Also, per system: the unigram precision p1, the length ratio and the word recall (clipped
unigram matches over the reference length), since shorter outputs inflate precision: a
precision comparison between systems of different length ratios says little by itself.
"""
import json
import math
import os
import statistics
import sys

from sacrebleu.metrics import BLEU

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rescore import read_lines, tokenizer_of  # noqa: E402


def parts(base, run):
    hyp = read_lines(os.path.join(base, run["test_hyp"]))
    ref = read_lines(os.path.join(base, run["test_ref"]))
    signature = run.get("bleu_signature") or run.get("signature")
    score = BLEU(tokenize=tokenizer_of(signature)).corpus_score(hyp, [ref])
    # BLEU / BP, the geometric mean of the precisions: 0 when one of them is 0.
    if min(score.precisions) > 0:
        geo = 100 * math.exp(sum(math.log(p / 100) for p in score.precisions) / 4)
    else:
        geo = 0.0
    return {
        "bleu": score.score,
        "bp": score.bp,
        "geo": geo,
        "p1": score.precisions[0],
        "ratio": score.sys_len / score.ref_len,
        "recall": score.counts[0] / score.ref_len,
    }


def mean_parts(runs):
    keys = runs[0].keys()
    return {k: statistics.mean(r[k] for r in runs) for k in keys}


def log_ratio(a, b):
    return math.log(a / b) if a > 0 and b > 0 else float("nan")


def report(variant, systems, teachers):
    """The three tables for the CTC systems decoded as `variant`, beside the copy baseline and
    the teacher's outputs (`teachers`)."""
    print(f"\n=== CTC decoding `{variant}`")
    print("| system | BLEU | BP | BLEU / BP | p1 | length ratio | word recall |")
    print("|---|---|---|---|---|---|---|")
    for name, s in list(systems.items()) + list(teachers.items()):
        print(f"| {name} | {s['bleu']:.2f} | {s['bp']:.3f} | {s['geo']:.2f} | {s['p1']:.1f} | {s['ratio']:.3f} | {s['recall']:.3f} |")

    print("\n== gains over the control `ctc`: the brevity penalty's share of the log-gain")
    print("| arm | Δ BLEU | log BP ratio | log (BLEU/BP) ratio | BP share |")
    print("|---|---|---|---|---|")
    ctc = systems["ctc"]
    for arm in [n for n in systems if n.startswith("ctc+")]:
        a = systems[arm]
        log_bp, log_geo = log_ratio(a["bp"], ctc["bp"]), log_ratio(a["geo"], ctc["geo"])
        total = log_bp + log_geo
        share = f"{100 * log_bp / total:.0f} %" if total != 0 and not math.isnan(total) else "n/a"
        print(f"| {arm} | {a['bleu'] - ctc['bleu']:+.2f} | {log_bp:+.4f} | {log_geo:+.4f} | {share} |")

    print("\n== gaps to the teacher, each part changed alone (from -> to)")
    print("| from | to | gap | length alone | precision alone |")
    print("|---|---|---|---|---|")
    for source in [n for n in systems if n.startswith("ctc") or n == "baseline"]:
        for target in [n for n in teachers if n.startswith("teacher")]:
            a, b = systems[source], teachers[target]
            length = a["geo"] * b["bp"] - a["bleu"]
            precision = b["geo"] * a["bp"] - a["bleu"]
            print(f"| {source} | {target} | {b['bleu'] - a['bleu']:+.2f} | {length:+.2f} | {precision:+.2f} |")


def main(path):
    results = json.load(open(path))
    base = os.path.dirname(path)
    # Seed means per (system, decoding variant): a run with a blank-penalty grid reports each
    # CTC system twice, at δ = 0 (`greedy`) and at its dev-best δ (`blank-tuned`).
    by_variant, teachers = {}, {}
    for run in results["runs"]:
        if run["objective"] == "teacher":
            teachers.setdefault("teacher " + run["variant"], []).append(parts(base, run))
        elif run["objective"] == "copy":
            teachers.setdefault("copy", []).append(parts(base, run))
        else:
            by_variant.setdefault(run["variant"], {}).setdefault(run["objective"], []).append(
                parts(base, run)
            )
    teachers = {name: mean_parts(runs) for name, runs in teachers.items()}
    print(f"== {path} (seed means)")
    for variant, systems in by_variant.items():
        report(variant, {name: mean_parts(runs) for name, runs in systems.items()}, teachers)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
