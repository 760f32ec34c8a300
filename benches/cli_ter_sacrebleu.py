#!/usr/bin/env python3
"""TER speed: the `candle-bleu -m ter` process against sacrebleu's in-process
`TER().corpus_score`, on corpora this script writes (fixed splitmix64 streams, so every run
scores the same text) under target/cli_bench/ter/:

- main: 300 segments of 15-35 words, one reference: an English-like syllable vocabulary with
  capitals and attached punctuation; hypotheses perturb the reference by word (kept ~80%,
  replaced, dropped, inserted) and move one to three blocks of 1-6 words (TER's shifts);
- growth: 60 segments of exactly 10, 20, 40 and 80 reference words each (same recipe), to
  measure how the time grows with sentence length.

    pip install sacrebleu==2.6.0
    cargo build --release --features cli
    python3 benches/cli_ter_sacrebleu.py [--runs 3] [--bin target/release/candle-bleu]

sacrebleu is timed on lines already in memory (`TER().corpus_score(hyps, [refs])`): reading the
files, the interpreter start and the imports are NOT counted for it, while everything is counted
for candle-bleu (spawn from Python, read, tokenize, shift search, score, print, exit). Both must
print the same score (to 6 decimals). sacrebleu's TER is slow (about 30 ms per segment of
25 words), so the corpora are small and the rounds few: about 80 s in all. Each round times sacrebleu once, then the binary five times; the ratio is
median(sacrebleu) / median(candle-bleu), with the spread (min, quartiles, max) of both.
"""
import argparse
import os
import statistics
import subprocess
import time

import sacrebleu
from sacrebleu.metrics import TER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "cli_bench", "ter")
MASK = (1 << 64) - 1
SYLLABLES = ("ta ren mo li ka sen do ver an tis po nu gar el ri som be lan chi or ful pe dra "
             "kin ast mi vo ther qua zen ho bri").split()
FUNCTION = "the of and to a in is that for it was on with as by at from this be not".split()


class SplitMix64:
    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)

    def below(self, n):
        return self.next() % n


def vocabulary(rng):
    words = list(FUNCTION)
    while len(words) < 3000:
        words.append("".join(SYLLABLES[rng.below(len(SYLLABLES))] for _ in range(1 + rng.below(3))))
    return words


def word(rng, vocab):
    w = vocab[min(rng.below(len(vocab)), rng.below(len(vocab)))]
    r = rng.below(100)
    if r < 4:
        return w.capitalize()
    if r < 8:
        return w + ","
    return w


def segment(rng, vocab, n):
    ref = [word(rng, vocab) for _ in range(n)]
    ref[-1] += "."
    hyp = []
    for w in ref:
        r = rng.below(100)
        if r < 80:
            hyp.append(w)
        elif r < 88:
            hyp.append(word(rng, vocab))
        elif r < 94:
            continue
        else:
            hyp += [w, word(rng, vocab)]
    for _ in range(1 + rng.below(3)):
        if len(hyp) < 4:
            break
        length = 1 + rng.below(min(6, len(hyp) - 2))
        start = rng.below(len(hyp) - length + 1)
        block, rest = hyp[start:start + length], hyp[:start] + hyp[start + length:]
        at = rng.below(len(rest) + 1)
        hyp = rest[:at] + block + rest[at:]
    return " ".join(hyp), " ".join(ref)


def write_corpus(name, seed, segments, lengths):
    rng = SplitMix64(seed)
    vocab = vocabulary(rng)
    hyps, refs = [], []
    for _ in range(segments):
        h, r = segment(rng, vocab, lengths(rng))
        hyps.append(h)
        refs.append(r)
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for fname, lines in (("hyp.txt", hyps), ("ref.txt", refs)):
        with open(os.path.join(d, fname), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return os.path.join(d, "ref.txt"), os.path.join(d, "hyp.txt")


def lines(path):
    # As sacrebleu's CLI reads files.
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def spread(times):
    """min, first quartile, third quartile, max (ms)."""
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [times[0]] * 3
    return f"[min {1e3 * min(times):.1f}, q1 {1e3 * q[0]:.1f}, q3 {1e3 * q[2]:.1f}, max {1e3 * max(times):.1f}]"


def compare(name, binary, ref_path, hyp_path, runs):
    refs, hyps = [lines(ref_path)], lines(hyp_path)
    metric = TER()
    cmd = [binary, ref_path, "-i", hyp_path, "-m", "ter", "-f", "text", "-w", "6"]
    expected = metric.corpus_score(hyps, refs)
    out = subprocess.run(cmd, capture_output=True, check=True, text=True).stdout.strip()
    assert out.split(" = ", 1)[1] == f"{expected.score:.6f}", (out, expected.score)
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
    words = sum(len(h.split()) for h in hyps)
    print(f"{name:<24} sacrebleu {1e3 * py:8.1f} ms   candle-bleu {1e3 * rs:7.2f} ms   "
          f"ratio {py / rs:6.1f}x   (TER {expected.score:.2f}, {len(hyps)} segments, {words} hyp words)")
    print(f"{'':<24} spread: sacrebleu {spread(py_times)}  candle-bleu {spread(rs_times)}")
    return py, rs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "candle-bleu"))
    args = ap.parse_args()
    print(f"sacrebleu {sacrebleu.__version__}, {args.runs} rounds (1 sacrebleu + 5 candle-bleu "
          f"runs each), medians")
    main_corpus = write_corpus("main", 4343, 300, lambda rng: 15 + rng.below(21))
    compare("main, 1 ref", args.bin, *main_corpus, args.runs)
    print("growth with sentence length (60 segments each):")
    previous = None
    for n in (10, 20, 40, 80):
        corpus = write_corpus(f"len{n}", 4400 + n, 60, lambda rng, n=n: n)
        py, rs = compare(f"{n} words", args.bin, *corpus, args.runs)
        if previous:
            print(f"{'':<24} x2 length: sacrebleu x{py / previous[0]:.2f}, candle-bleu x{rs / previous[1]:.2f}")
        previous = (py, rs)


if __name__ == "__main__":
    main()
