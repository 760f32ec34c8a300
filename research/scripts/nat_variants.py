#!/usr/bin/env python3
"""Every decoding variant of the NAT study, re-scored from its committed files.

    pip install sacrebleu==2.6.0
    python3 research/scripts/nat_variants.py [docs/nat_run] [--corpus DIR] > docs/nat_run/variants.txt

Reads `results.json`, `log.csv`, the gzipped hypotheses and `test.ref.gz` of the run folder
(and `test.src.gz` / `dev.src.gz` / `dev.ref.gz` where present) and prints, per condition
(distilled, raw) and decoding variant (`l1`, `l3`, `l5`, `oracle`, each with and without
`+dedup`):

* each objective's mean test BLEU, chrF and length ratio over seeds, and its BLEU against the
  English source (how much of the output is copied source);
* Δ = objective − `ce` per seed and its mean, the seed-level paired t-test and Holm's
  correction exactly as the study makes them (`research/src/stats.rs`: `paired_t_test` on the
  per-seed scores, `holm` over the objectives compared with `ce` in that condition and
  variant, i.e. m = 2: `bon2` and `bleu4`; BLEU and chrF are separate families);
* the brevity penalty's share of the log-gain: with log BLEU = log BP + mean_n log p_n,
  share = Δ log BP / Δ log BLEU, per seed and for the seed means of the logs;
* then the variants ranked by Δ, the copy baseline (the source as hypothesis), what the dev
  logs show, the speed, the teacher, and, with `--corpus DIR` (a folder holding `train.tsv` as
  written by `cargo run --release --example corpus -- --out DIR`, and the Python `tokenizers`
  package), the BLEU of the distilled training targets against the human references.

Deterministic: no sampling; sacrebleu's BLEU (13a) and chrF with their defaults, as the study
reports them. Needs only sacrebleu (the t distribution is computed here, no scipy).
"""
import argparse
import csv
import gzip
import json
import math
import os
import statistics
import sys

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

OBJECTIVES = ("baseline", "ce", "bon2", "bleu4")
COMPARED = ("bon2", "bleu4")  # the study's Holm family per condition, variant and metric
VARIANT_ORDER = ("l1", "l1+dedup", "l3", "l3+dedup", "l5", "l5+dedup", "oracle", "oracle+dedup")


def read_lines(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="\n") as f:
        return [line.rstrip("\n") for line in f]


# --- Student's t distribution (as research/src/stats.rs: two-sided p, quantiles) -----------


def _betacf(a, b, x):
    # Continued fraction of the incomplete beta function (Lentz's method).
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a, b, x):
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t, df):
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q, df):
    # Bisection on the CDF; q in (0.5, 1).
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if 1.0 - t_two_sided_p(mid, df) / 2.0 < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def paired_t(control, system):
    """research/src/stats.rs `paired_t_test`: (mean Δ, p, detectable difference at 80 % power)."""
    diffs = [s - c for s, c in zip(system, control)]
    n = len(diffs)
    mean = statistics.mean(diffs)
    sd = statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    df = n - 1.0
    t = mean / se if se > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    detectable = (t_quantile(0.975, df) + t_quantile(0.8, df)) * se
    return mean, t_two_sided_p(t, df), detectable


def holm(pvalues):
    """research/src/stats.rs `holm`: step-down, returned in input order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# --- scoring ----------------------------------------------------------------------------


class Scorer:
    def __init__(self):
        self.bleu = BLEU()  # 13a, exp smoothing: the study's signature
        self.chrf = CHRF()
        self.cache = {}

    def score(self, hyp_lines, ref_lines, key):
        if key not in self.cache:
            b = self.bleu.corpus_score(hyp_lines, [ref_lines])
            c = self.chrf.corpus_score(hyp_lines, [ref_lines])
            log_p = sum(math.log(p / 100.0) if p > 0 else -math.inf for p in b.precisions) / 4
            self.cache[key] = {
                "bleu": b.score,
                "chrf": c.score,
                "bp": b.bp,
                "log_bp": math.log(b.bp) if b.bp > 0 else -math.inf,
                "log_p": log_p,
                "ratio": b.sys_len / b.ref_len,
            }
        return self.cache[key]


def fmt_p(p):
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", default="docs/nat_run")
    parser.add_argument("--corpus", help="folder with train.tsv (the distillation check)")
    args = parser.parse_args()
    run = args.run
    results = json.load(open(os.path.join(run, "results.json"), encoding="utf-8"))
    refs = read_lines(os.path.join(run, "test.ref.gz"))
    src_path = os.path.join(run, "test.src.gz")
    srcs = read_lines(src_path) if os.path.exists(src_path) else None
    scorer = Scorer()
    command = "python3 research/scripts/nat_variants.py " + " ".join(sys.argv[1:])
    print(f"NAT study: every decoding variant, re-scored from {run} (sacrebleu {sacrebleu.__version__})")
    print(f"command: {command}")
    print(f"test set: {len(refs)} references" + (f", {len(srcs)} sources" if srcs else ", no sources committed"))
    print("BLEU = sacrebleu BLEU (13a), chrF = sacrebleu chrF; ratio = hypothesis/reference length;")
    print("'vs src' = BLEU of the output against the English source (copying).")
    print("Δ: objective − ce per seed; p: seed-level paired t-test (research/src/stats.rs paired_t_test);")
    print("Holm: over the m = 2 objectives compared with ce (bon2, bleu4) in the same condition,")
    print("variant and metric, as the study's paired_t_vs_ce; 'detectable': the difference detectable")
    print("at 80 % power. BP share: Δ log BP / Δ log BLEU (log BLEU = log BP + mean_n log p_n).")

    # runs[(condition, variant)][objective][seed] = metrics
    table = {}
    dev_bleu = {}
    for r in results["runs"]:
        if r["condition"] == "ar":
            continue
        key = (r["condition"], r["variant"])
        hyp = read_lines(os.path.join(run, r["test_hyp"]))
        m = dict(scorer.score(hyp, refs, r["test_hyp"]))
        if abs(m["bleu"] - r["test_bleu"]) > 1e-9 or abs(m["chrf"] - r["test_chrf"]) > 1e-9:
            sys.exit(f"{r['test_hyp']}: re-scored {m['bleu']} / {m['chrf']}, reported {r['test_bleu']} / {r['test_chrf']}")
        if srcs:
            m["vs_src"] = scorer.bleu.corpus_score(hyp, [srcs]).score
        table.setdefault(key, {}).setdefault(r["objective"], {})[r["seed"]] = m
        dev_bleu.setdefault((r["condition"], r["objective"], r["seed"]), set()).add(round(r["dev_bleu"], 9))
    print("every re-scored BLEU and chrF equals the reported one (|difference| <= 1e-9)")

    deltas = {}  # (condition, variant) -> bon2 BLEU delta
    for condition in ("distilled", "raw"):
        variants = [v for v in VARIANT_ORDER if (condition, v) in table]
        for variant in variants:
            by_obj = table[(condition, variant)]
            seeds = sorted(by_obj["ce"])
            print(f"\n== {condition}, {variant} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
            for obj in OBJECTIVES:
                if obj not in by_obj:
                    continue
                vals = [by_obj[obj][s] for s in seeds if s in by_obj[obj]]
                line = (
                    f"  {obj:>8}: BLEU {statistics.mean(v['bleu'] for v in vals):6.2f}"
                    f"  chrF {statistics.mean(v['chrf'] for v in vals):6.2f}"
                    f"  ratio {statistics.mean(v['ratio'] for v in vals):.3f}"
                )
                if srcs:
                    line += "  vs src " + " ".join(f"{v['vs_src']:5.2f}" for v in vals)
                print(line + "  (per seed BLEU " + " ".join(f"{v['bleu']:.2f}" for v in vals) + ")")
            ce = [by_obj["ce"][s] for s in seeds]
            for metric in ("bleu", "chrf"):
                compared = [o for o in COMPARED if o in by_obj and len(by_obj[o]) == len(seeds)]
                if len(seeds) < 2:
                    for obj in compared:
                        d = by_obj[obj][seeds[0]][metric] - ce[0][metric]
                        print(f"  Δ {metric:>4} {obj:>5}: {d:+.2f} (one seed, no test)")
                        if metric == "bleu" and obj == "bon2":
                            deltas[(condition, variant)] = (d, None, None)
                    continue
                tests = [paired_t([c[metric] for c in ce], [by_obj[o][s][metric] for s in seeds]) for o in compared]
                adjusted = holm([t[1] for t in tests])
                for obj, (mean, p, detectable), p_holm in zip(compared, tests, adjusted):
                    per_seed = " ".join(f"{by_obj[obj][s][metric] - c[metric]:+.2f}" for s, c in zip(seeds, ce))
                    print(
                        f"  Δ {metric:>4} {obj:>5}: {mean:+.2f} (seeds {per_seed}; p {fmt_p(p)}, Holm {fmt_p(p_holm)}"
                        f" (m = {len(compared)}); detectable {detectable:.2f})"
                    )
                    if metric == "bleu" and obj == "bon2":
                        deltas[(condition, variant)] = (mean, p_holm, None)
            # Brevity penalty's share of bon2's log-gain over ce.
            if "bon2" in by_obj:
                shares, dbp_sum, dlog_sum = [], 0.0, 0.0
                for s in seeds:
                    b, c = by_obj["bon2"][s], ce[seeds.index(s)]
                    dbp = b["log_bp"] - c["log_bp"]
                    dlog = math.log(b["bleu"]) - math.log(c["bleu"])
                    shares.append(dbp / dlog)
                    dbp_sum += dbp
                    dlog_sum += dlog
                pooled = dbp_sum / dlog_sum
                bp_b = statistics.mean(by_obj["bon2"][s]["bp"] for s in seeds)
                bp_c = statistics.mean(c["bp"] for c in ce)
                print(
                    f"  bon2 vs ce: BP {bp_c:.3f} → {bp_b:.3f}; BP share of the log-gain {pooled:.0%}"
                    f" (per seed " + " ".join(f"{x:.0%}" for x in shares) + ")"
                )
                entry = deltas[(condition, variant)]
                deltas[(condition, variant)] = (entry[0], entry[1], pooled)

    print("\n== bon2 − ce in test BLEU, every variant, ranked (mean over seeds; Holm m = 2)")
    for condition in ("distilled", "raw"):
        rows = sorted(((v, d) for (c, v), d in deltas.items() if c == condition), key=lambda x: -x[1][0])
        for variant, (d, p_holm, share) in rows:
            b = statistics.mean(x["bleu"] for x in table[(condition, variant)]["bon2"].values())
            c = statistics.mean(x["bleu"] for x in table[(condition, variant)]["ce"].values())
            holm_text = "one seed" if p_holm is None else f"Holm {fmt_p(p_holm)}"
            print(
                f"  {condition:>9} {variant:>13}: {d:+.2f}  (ce {c:5.2f} → bon2 {b:5.2f}; {holm_text};"
                f" BP share {share:.0%})"
            )
    print("\n== Holm over every variant at once (a stricter family than the study's m = 2)")
    for metric in ("bleu", "chrf"):
        family = []
        for variant in VARIANT_ORDER:
            by_obj = table.get(("distilled", variant))
            if not by_obj:
                continue
            seeds = sorted(by_obj["ce"])
            for obj in COMPARED:
                if obj in by_obj and len(seeds) > 1:
                    _, p, _ = paired_t(
                        [by_obj["ce"][s][metric] for s in seeds], [by_obj[obj][s][metric] for s in seeds]
                    )
                    family.append((variant, obj, p))
        adjusted = holm([p for _, _, p in family])
        print(f"  distilled, {metric}, m = {len(family)} (variants x objectives):")
        for (variant, obj, p), p_holm in zip(family, adjusted):
            print(f"    {variant:>13} {obj:>5}: p {fmt_p(p)}, Holm {fmt_p(p_holm)}")

    print("\n== the length beam's rescoring (mean log-probability over the first l lengths)")
    for condition in ("distilled", "raw"):
        for dedup in ("", "+dedup"):
            for obj in OBJECTIVES:
                means = []
                for l in ("l1", "l3", "l5"):
                    by_obj = table.get((condition, l + dedup), {})
                    if obj in by_obj:
                        means.append(statistics.mean(x["bleu"] for x in by_obj[obj].values()))
                if len(means) == 3:
                    order = "l1 > l3 > l5" if means[0] > means[1] > means[2] else "NOT l1 > l3 > l5"
                    print(
                        f"  {condition:>9} {obj:>8} {dedup or 'no dedup':>8}: l1 {means[0]:5.2f}, l3 {means[1]:5.2f},"
                        f" l5 {means[2]:5.2f} ({order})"
                    )
    for condition in ("distilled", "raw"):
        for obj in ("ce", "bon2"):
            cands = [
                (statistics.mean(x["bleu"] for x in table[(condition, v)][obj].values()), v)
                for v in VARIANT_ORDER
                if (condition, v) in table and not v.startswith("oracle")
            ]
            best = max(cands)
            print(f"  best variant without the oracle length, {condition} {obj}: {best[1]} ({best[0]:.2f})")

    print("\n== dev")
    same = all(len(v) == 1 for v in dev_bleu.values())
    print(
        "  dev outputs per decoding variant are not committed: results.json's dev_bleu is "
        + ("the same number for every variant of a run" if same else "NOT constant across variants")
        + " (the selection's l1+dedup dev BLEU),"
    )
    print("  so which variant is best on dev cannot be computed from the committed files.")
    for (condition, obj, seed), v in sorted(dev_bleu.items()):
        step = next(
            r["best_step"]
            for r in results["runs"]
            if r["condition"] == condition and r["objective"] == obj and r["seed"] == seed
        )
        print(f"  {condition:>9} {obj:>8} seed {seed}: dev BLEU (l1+dedup) {min(v):.2f}, selected at step {step}")

    log = list(csv.DictReader(open(os.path.join(run, "log.csv"), encoding="utf-8")))
    print("\n== training logs (log.csv)")
    for name in sorted({row["run"] for row in log}):
        rows = [row for row in log if row["run"] == name]
        if "baseline" not in name.lower() and "teacher" not in name:
            continue
        devs = [float(row["dev_bleu"]) for row in rows]
        print(
            f"  {name}: steps {rows[0]['step']}–{rows[-1]['step']}, train CE {float(rows[0]['train_ce']):.2f} → "
            f"{float(rows[-1]['train_ce']):.2f}, dev BLEU " + " ".join(f"{d:.2f}" for d in devs)
        )

    if srcs:
        print("\n== copy baseline (the English source as the hypothesis)")
        b = scorer.bleu.corpus_score(srcs, [refs])
        c = scorer.chrf.corpus_score(srcs, [refs])
        print(f"  test: BLEU {b.score:.2f}  chrF {c.score:.2f}  ratio {b.sys_len / b.ref_len:.3f}  ({b})")
        dev_src, dev_ref = os.path.join(run, "dev.src.gz"), os.path.join(run, "dev.ref.gz")
        if os.path.exists(dev_src) and os.path.exists(dev_ref):
            b = scorer.bleu.corpus_score(read_lines(dev_src), [read_lines(dev_ref)])
            c = scorer.chrf.corpus_score(read_lines(dev_src), [read_lines(dev_ref)])
            print(f"  dev:  BLEU {b.score:.2f}  chrF {c.score:.2f}  ratio {b.sys_len / b.ref_len:.3f}")
        teacher = read_lines(os.path.join(run, "test.teacher.hyp.gz"))
        print(f"  the teacher's output against the source: BLEU {scorer.bleu.corpus_score(teacher, [srcs]).score:.2f}")
    else:
        print("\n== copy baseline: test.src.gz is not in the run folder")

    teacher_run = next(r for r in results["runs"] if r["objective"] == "teacher")
    print("\n== teacher and gap")
    print(
        f"  teacher (AR, beam 5): test BLEU {teacher_run['test_bleu']:.2f}, chrF {teacher_run['test_chrf']:.2f},"
        f" ratio {teacher_run['test_length_ratio']:.3f}; {results['teacher']['origin']}"
    )
    for variant in VARIANT_ORDER:
        if ("distilled", variant) in table:
            b = statistics.mean(x["bleu"] for x in table[("distilled", variant)]["bon2"].values())
            print(f"  distilled bon2 {variant:>13}: {b:5.2f}, {teacher_run['test_bleu'] - b:5.2f} below the teacher")

    print("\n== speed (sentences/s, results.json)")
    for s in results["speed"]:
        print(f"  {s['model']:>3} {s['search']:>14} batch {s['batch']:>2}: {s['sentences_per_second']:7.1f}")

    if args.corpus:
        distilled_check(run, args.corpus, scorer)


def distilled_check(run, corpus, scorer):
    print("\n== distilled training targets against the human references")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        print("  skipped: the Python package `tokenizers` is not installed")
        return
    tok = Tokenizer.from_file(os.path.join(run, "tokenizer.json"))
    pairs = [line.split("\t") for line in read_lines(os.path.join(corpus, "train.tsv"))]
    # research/src/translate/data.rs `encode`: training pairs with a side longer than
    # max_len / 2 − 2 = 62 subwords are dropped (max_len 128).
    kept = [
        (s, t)
        for (s, t), es, et in zip(
            pairs,
            tok.encode_batch([p[0] for p in pairs], add_special_tokens=False),
            tok.encode_batch([p[1] for p in pairs], add_special_tokens=False),
        )
        if len(es.ids) <= 62 and len(et.ids) <= 62
    ]
    ids = [[int(x) for x in line.split()] for line in read_lines(os.path.join(run, "distilled.ids.gz"))]
    if len(ids) != len(kept):
        print(f"  skipped: {len(ids)} distilled lines but {len(kept)} kept training pairs")
        return
    hyps = tok.decode_batch(ids, skip_special_tokens=True)
    b = scorer.bleu.corpus_score(hyps, [[t for _, t in kept]])
    c = scorer.chrf.corpus_score(hyps, [[t for _, t in kept]])
    print(f"  {len(ids)} pairs ({len(pairs) - len(kept)} dropped as in the study): BLEU {b.score:.2f}, chrF {c.score:.2f}, ratio {b.sys_len / b.ref_len:.3f}")
    print(f"  ({b})")


if __name__ == "__main__":
    main()
