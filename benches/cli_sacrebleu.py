#!/usr/bin/env python3
"""sacrebleu's side of benches/cli.rs: `sacrebleu.corpus_bleu` in-process on the files that
`cargo bench --features cli --bench cli` writes (target/cli_bench/{ref,hyp}.txt), and the
`candle-bleu` binary as a whole process on the same files, back to back, alternating.

    pip install sacrebleu==2.6.0
    cargo build --release --features cli && cargo bench --features cli --bench cli
    python3 benches/cli_sacrebleu.py [--runs 15] [--bin target/release/candle-bleu]

sacrebleu is timed on lines already in memory (`corpus_bleu(hyps, [refs])`, default 13a, exp
smoothing): reading the files, the interpreter start and the imports are NOT counted for it,
while everything is counted for candle-bleu (spawn, read, tokenize, score, print). Both must
print the same score.
"""
import argparse
import os
import statistics
import subprocess
import time

import sacrebleu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "target", "cli_bench")


def lines(path):
    # As sacrebleu's CLI reads files.
    with open(path, encoding="utf-8", newline="\n") as f:
        return [line.rstrip() for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "candle-bleu"))
    args = ap.parse_args()
    ref_path, hyp_path = os.path.join(BENCH, "ref.txt"), os.path.join(BENCH, "hyp.txt")
    if not os.path.exists(ref_path):
        raise SystemExit("run `cargo bench --bench cli` first (it writes target/cli_bench/)")
    refs, hyps = lines(ref_path), lines(hyp_path)
    ntok = sum(len(h.split()) for h in hyps)
    print(f"{len(hyps)} segments, {ntok} whitespace tokens in the hypotheses "
          f"(sacrebleu {sacrebleu.__version__})")

    expected = sacrebleu.corpus_bleu(hyps, [refs])
    cmd = [args.bin, ref_path, "-i", hyp_path, "-f", "text"]
    out = subprocess.run(cmd, capture_output=True, check=True, text=True).stdout.strip()
    print("sacrebleu  :", expected)
    print("candle-bleu:", out)
    assert out.split(" = ", 1)[1] == expected.format(1).split(" = ", 1)[1], "scores differ"

    py_times, rs_times = [], []
    for _ in range(args.runs):
        start = time.perf_counter()
        sacrebleu.corpus_bleu(hyps, [refs])
        py_times.append(time.perf_counter() - start)
        for _ in range(5):
            start = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            rs_times.append(time.perf_counter() - start)
    py, rs = statistics.median(py_times), statistics.median(rs_times)
    print(f"sacrebleu.corpus_bleu (in-process, 13a): median {1e3 * py:.1f} ms, "
          f"min {1e3 * min(py_times):.1f} ms ({len(py_times)} runs)")
    print(f"candle-bleu (whole process, 13a):        median {1e3 * rs:.2f} ms, "
          f"min {1e3 * min(rs_times):.2f} ms ({len(rs_times)} runs)")
    print(f"ratio (median sacrebleu / median candle-bleu): {py / rs:.1f}x")


if __name__ == "__main__":
    main()
