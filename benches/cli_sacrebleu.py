#!/usr/bin/env python3
"""sacrebleu's side of benches/cli.rs: sacrebleu's in-process `BLEU(tokenize=...).corpus_score`
(and `CHRF(word_order=...).corpus_score`) and the `candle-bleu` binary as a whole process, on the
files that `cargo bench --features cli --bench cli` writes, alternating run by run:

- english-like: target/cli_bench/{ref,hyp}.txt (one reference), BLEU with 13a and none;
- zipf: target/cli_bench/zipf/{ref1,ref2,hyp}.txt (two references; also timed with ref1 only),
  BLEU with 13a and none;
- chrf: target/cli_bench/chrf/{ref,hyp}.txt (3000 segments of 15-35 words, one reference),
  chrF (`CHRF()` against `-m chrf`) and chrF++ (`CHRF(word_order=2)` against `-m chrf -cw 2`).

    pip install sacrebleu==2.6.0
    cargo build --release --features cli && cargo bench --features cli --bench cli
    python3 benches/cli_sacrebleu.py [--runs 15] [--bin target/release/candle-bleu]

sacrebleu is timed on lines already in memory (`BLEU(tokenize=tok).corpus_score(hyps, refs)`,
exp smoothing): reading the files, the interpreter start and the imports are NOT counted for
it, while everything is counted for candle-bleu (spawn from Python, read, tokenize, count, score,
print, exit). Both must print the same score. Each round times sacrebleu once, then the binary
five times; the ratio is median(sacrebleu) / median(candle-bleu), and the spread (min, quartiles,
max) of both is printed under it.
"""
import argparse
import os
import statistics
import subprocess
import time

import sacrebleu
from sacrebleu.metrics import BLEU, CHRF

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "target", "cli_bench")


def lines(path):
    # As sacrebleu's CLI reads files.
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def spread(times):
    """min, first quartile, third quartile, max (ms)."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return f"[min {1e3 * min(times):.1f}, q1 {1e3 * q[0]:.1f}, q3 {1e3 * q[2]:.1f}, max {1e3 * max(times):.1f}]"


def compare(name, binary, ref_paths, hyp_path, tok, runs):
    refs = [lines(p) for p in ref_paths]
    hyps = lines(hyp_path)
    if tok.startswith("chrf"):
        word_order = 2 if tok == "chrf++" else 0
        metric = CHRF(word_order=word_order)
        cmd = [binary, *ref_paths, "-i", hyp_path, "-m", "chrf", "-cw", str(word_order),
               "-f", "text"]
    else:
        metric = BLEU(tokenize=tok)
        cmd = [binary, *ref_paths, "-i", hyp_path, "-tok", tok, "-f", "text"]
    expected = metric.corpus_score(hyps, refs)
    out = subprocess.run(cmd, capture_output=True, check=True, text=True).stdout.strip()
    assert out.split(" = ", 1)[1] == expected.format(width=1).split(" = ", 1)[1], (out, expected)
    py_times, rs_times = [], []
    for _ in range(runs):
        start = time.perf_counter()
        metric.corpus_score(hyps, refs)
        py_times.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            rs_times.append(time.perf_counter() - start)
    py, rs = statistics.median(py_times), statistics.median(rs_times)
    print(f"{name:<28} {tok:<6}  sacrebleu {1e3 * py:7.1f} ms   candle-bleu {1e3 * rs:6.2f} ms"
          f"   ratio {py / rs:5.1f}x   ({expected.format(width=1).split(' = ', 1)[1].split()[0]})")
    print(f"{'':<36}spread: sacrebleu {spread(py_times)}  candle-bleu {spread(rs_times)}")
    return py / rs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "candle-bleu"))
    ap.add_argument("--only", choices=["english", "zipf", "chrf"], default=None)
    args = ap.parse_args()
    english = (os.path.join(BENCH, "ref.txt"),), os.path.join(BENCH, "hyp.txt")
    zipf = os.path.join(BENCH, "zipf")
    zipf2 = (os.path.join(zipf, "ref1.txt"), os.path.join(zipf, "ref2.txt")), \
        os.path.join(zipf, "hyp.txt")
    zipf1 = (os.path.join(zipf, "ref1.txt"),), os.path.join(zipf, "hyp.txt")
    chrf = (os.path.join(BENCH, "chrf", "ref.txt"),), os.path.join(BENCH, "chrf", "hyp.txt")
    if not all(os.path.exists(p[1]) for p in (english, zipf2, chrf)):
        raise SystemExit("run `cargo bench --bench cli` first (it writes target/cli_bench/)")
    print(f"sacrebleu {sacrebleu.__version__}, {args.runs} rounds (1 sacrebleu + 5 candle-bleu "
          f"runs each), medians")
    cases = []
    if args.only in (None, "english"):
        cases.append(("english-like, 1 ref", english))
    if args.only in (None, "zipf"):
        cases += [("zipf, 2 refs", zipf2), ("zipf, 1 ref", zipf1)]
    ratios = []
    for name, (refs, hyp) in cases:
        for tok in ("13a", "none"):
            ratios.append(compare(name, args.bin, list(refs), hyp, tok, args.runs))
    if args.only in (None, "chrf"):
        refs, hyp = chrf
        for metric in ("chrf", "chrf++"):
            ratios.append(compare("chrf corpus, 1 ref", args.bin, list(refs), hyp, metric,
                                  args.runs))
    print(f"smallest ratio: {min(ratios):.1f}x")


if __name__ == "__main__":
    main()
