#!/usr/bin/env python3
"""sacrebleu's side of benches/exact.rs: time `BLEU().corpus_score` on the same corpus.

    pip install sacrebleu==2.6.0
    python3 benches/exact_sacrebleu.py [--runs 15]

The corpus generator (splitmix64, integer operations only) is the one of benches/exact.rs, so
both score identical tokens: 3000 segments, hypotheses of 16..36 ids (mean 26), one
reference each. The ids are written as space-separated text, i.e. pre-tokenized; timed with
`tokenize='none'` (pure scoring, what the Rust in-process number compares with) and with the
default `13a`.
"""
import argparse
import statistics
import time

from sacrebleu.metrics import BLEU

SEGMENTS = 3000
SEED = 2024
MASK = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed):
        self.state = seed

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        return z ^ (z >> 31)


def corpus():
    rng = SplitMix64(SEED)

    def token():
        a = rng.next() % 2000
        b = rng.next() % 2000
        return min(a, b)

    hyps, refs = [], []
    for _ in range(SEGMENTS):
        length = 16 + rng.next() % 21
        hyp = [token() for _ in range(length)]
        ref = []
        for t in hyp:
            r = rng.next() % 20
            if r in (0, 1):
                continue
            if r <= 6:
                ref.append(token())
            elif r == 19:
                ref.append(t)
                ref.append(token())
            else:
                ref.append(t)
        hyps.append(" ".join(map(str, hyp)))
        refs.append(" ".join(map(str, ref)))
    return hyps, refs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    hyps, refs = corpus()
    for tokenize in ("none", "13a"):
        bleu = BLEU(tokenize=tokenize, force=True)
        score = bleu.corpus_score(hyps, [refs])
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            bleu.corpus_score(hyps, [refs])
            times.append(time.perf_counter() - start)
        print(
            "sacrebleu %s BLEU(tokenize=%r).corpus_score: score = %r, median %.1f ms, min %.1f ms"
            % (
                __import__("sacrebleu").__version__,
                tokenize,
                score.score,
                1e3 * statistics.median(times),
                1e3 * min(times),
            )
        )
        print("  ", score)


if __name__ == "__main__":
    main()
