#!/usr/bin/env python3
"""BLEU's parts for every run of a study's results.json: the n-gram precisions, the brevity
penalty, and BLEU without it — where a system's BLEU gap comes from (length or n-grams).

    pip install sacrebleu==2.6.0
    python3 research/scripts/bleu_breakdown.py docs/ctc_nat_run/results.json > docs/ctc_nat_run/bleu_breakdown.txt

Reads the committed hypothesis and reference files the same way `rescore.py` does (13a
tokenisation unless the run's signature names another) and prints, per run, sacrebleu's BLEU,
its four precisions, BP, the length ratio, and BLEU / BP (the geometric mean of the precisions).
"""
import json
import os
import sys

from sacrebleu.metrics import BLEU

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rescore import read_lines, tokenizer_of  # noqa: E402


def main(path):
    results = json.load(open(path))
    base = os.path.dirname(path)
    print(f"== {path}")
    print("| objective | condition | variant | seed | BLEU | p1 | p2 | p3 | p4 | BP | length ratio | BLEU / BP |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for run in results["runs"]:
        hyp = read_lines(os.path.join(base, run["test_hyp"]))
        ref = read_lines(os.path.join(base, run["test_ref"]))
        signature = run.get("bleu_signature") or run.get("signature")
        score = BLEU(tokenize=tokenizer_of(signature)).corpus_score(hyp, [ref])
        p = score.precisions
        print(
            f"| {run['objective']} | {run.get('condition', '')} | {run.get('variant', '')} | {run.get('seed', '')} "
            f"| {score.score:.2f} | {p[0]:.1f} | {p[1]:.1f} | {p[2]:.1f} | {p[3]:.1f} | {score.bp:.3f} "
            f"| {score.sys_len / score.ref_len:.3f} | {score.score / score.bp:.2f} |"
        )


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
