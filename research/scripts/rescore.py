#!/usr/bin/env python3
"""Re-score a study's committed outputs with sacrebleu and recompute its seed-level tests.

    pip install sacrebleu==2.6.0 scipy
    python3 research/scripts/rescore.py docs/translate_run/results.json [more results.json ...]

For every run in `runs`, the hypothesis file `test_hyp` is scored against `test_ref` (both
relative to the results.json; `.gz` files are read gzipped) with sacrebleu's BLEU (the tokenizer its `bleu_signature` or
`signature` names: `13a` for the real-data study, `none` for the synthetic ones), chrF and
chrF++ where the run reports them, and compared with the reported values. Then, per objective,
the mean ± sd over seeds and, where the file has a `ce` control, the seed-level paired t-test of
each objective against it (scipy's `ttest_rel`) with Holm's correction over the objectives, for
comparison with the study's own `paired_t_vs_ce` / `holm_adjusted_p_vs_ce`. Runs that carry a
`condition` and a `variant` (the NAT study: distilled/raw/ar, length beam and duplicate removal)
are grouped by them, and each group's objectives are compared with that group's `ce` (the CTC
NAT study's control is `ctc`: its `study` field is `ctc_nat`). Exits non-zero if a
score differs from the reported one by more than 1e-9 (sacrebleu rounds nothing internally).
"""
import gzip
import json
import os
import re
import statistics
import sys

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF


def tokenizer_of(signature):
    match = re.search(r"tok:([^|]+)", signature or "")
    return match.group(1) if match else "13a"


def read_lines(path):
    # The committed copies in docs/ hold their outputs gzipped; sacrebleu reads `.gz` too.
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def holm(pvalues):
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def rescore(results_path):
    base = os.path.dirname(os.path.abspath(results_path))
    results = json.load(open(results_path, encoding="utf-8"))
    print(f"== {results_path} (sacrebleu {sacrebleu.__version__})")
    worst = 0.0
    scores = {}
    for run in results["runs"]:
        hyp = read_lines(os.path.join(base, run["test_hyp"]))
        ref = read_lines(os.path.join(base, run["test_ref"]))
        tok = tokenizer_of(run.get("bleu_signature") or run.get("signature"))
        bleu = BLEU(tokenize=tok).corpus_score(hyp, [ref]).score
        group = " ".join(str(run[k]) for k in ("condition", "variant") if run.get(k) is not None)
        line = f"{group + ' ' if group else ''}{run['objective']:>16} seed {run['seed']}: BLEU {bleu:8.4f} (reported {run['test_bleu']:8.4f})"
        worst = max(worst, abs(bleu - run["test_bleu"]))
        metrics = {"bleu": bleu}
        if run.get("test_chrf") is not None:
            chrf = CHRF().corpus_score(hyp, [ref]).score
            chrf_pp = CHRF(word_order=2).corpus_score(hyp, [ref]).score
            worst = max(worst, abs(chrf - run["test_chrf"]))
            if run.get("test_chrf_pp") is not None:
                worst = max(worst, abs(chrf_pp - run["test_chrf_pp"]))
            line += f"  chrF {chrf:7.4f} (reported {run['test_chrf']:7.4f})"
            metrics["chrf"] = chrf
        print(line)
        scores.setdefault(group, {}).setdefault(run["objective"], {})[run["seed"]] = metrics
    print(f"largest difference from the reported scores: {worst:.2e}")

    try:
        from scipy.stats import ttest_rel
    except ImportError:
        print("(scipy missing: seed-level tests skipped)")
        return worst
    print("\nper objective: mean ± sd over seeds; seed-level paired t-test vs the control (ce, or ctc for the CTC NAT), Holm over objectives")
    for group, by_objective in scores.items():
        if group:
            print(f"-- {group}")
        control_name = "ctc" if "ce" not in by_objective and "ctc" in by_objective else "ce"
        control = by_objective.get(control_name)
        for metric in ("bleu", "chrf"):
            rows, pvalues = [], []
            for objective, by_seed in by_objective.items():
                values = [by_seed[s][metric] for s in sorted(by_seed) if metric in by_seed[s]]
                if not values:
                    continue
                sd = statistics.stdev(values) if len(values) > 1 else 0.0
                row = [objective, statistics.mean(values), sd, None, None]
                if control and objective not in (control_name, "baseline"):
                    seeds = sorted(set(by_seed) & set(control))
                    a = [by_seed[s][metric] for s in seeds]
                    b = [control[s][metric] for s in seeds]
                    if len(seeds) > 1 and any(x != y for x, y in zip(a, b)):
                        row[3] = statistics.mean(x - y for x, y in zip(a, b))
                        row[4] = float(ttest_rel(a, b).pvalue)
                        pvalues.append(row[4])
                rows.append(row)
            adjusted = iter(holm(pvalues))
            for objective, mean, sd, delta, p in rows:
                tail = "" if p is None else f"  Δ {delta:+.2f}  p {p:.3f}  Holm {next(adjusted):.3f}"
                print(f"{metric:>5} {objective:>16}: {mean:6.2f} ± {sd:.2f}{tail}")
    return worst


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    worst = max(rescore(path) for path in sys.argv[1:])
    sys.exit(0 if worst <= 1e-9 else 1)
