#!/usr/bin/env python3
"""Summarises alternated rounds of PyTorch and `cargo bench --bench loss` builds
(benches/results/loss-vs-torch-gemm/run.sh): per heap policy, build and row, the median over
rounds (min-max) of candle's time and of candle / PyTorch in the same round, and per row the
median of one build's time over another's.

    python3 benches/loss_rounds.py benches/results/loss-vs-torch-gemm tiled v3
"""
import glob
import os
import re
import statistics
import sys

ROWS = {
    "cross_entropy_from_logits (fused)": "cross-entropy",
    "bleu_loss_from_logits Expected (fused)": "expected",
    "ce_bleu_from_logits Expected (one op)": "CE + BLEU expected",
    "bleu_loss_from_logits LowerBound (fused)": "lower bound",
    "bleu_loss_from_logits Paired": "paired",
    "ce_bleu_from_logits Paired (one op)": "CE + BLEU paired",
}


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def parse(path):
    out = {}
    with open(path) as f:
        for line in f:
            for row, name in ROWS.items():
                if line.startswith(row):
                    fields = line[len(row):].split()
                    ms = float(fields[0])
                    vs_torch = None if fields[3] == "-" else float(fields[3].rstrip("x"))
                    out[name] = (ms, vs_torch)
    return out


def main(folder, builds):
    runs = {}
    for path in glob.glob(os.path.join(folder, "loss-*-*-*.txt")):
        build, policy, round_ = re.match(r"loss-(.+)-(default|reuse-heap)-(\d+)\.txt", os.path.basename(path)).groups()
        runs[(policy, build, int(round_))] = parse(path)
    print(f"# {folder}: medians over rounds (min-max)")
    for policy in ("default", "reuse-heap"):
        rounds = sorted({r for (p, _, r) in runs if p == policy})
        print(f"## {policy} heap, {len(rounds)} rounds")
        print(f"{'row':<22}" + "".join(f"{b + ' ms':<24}{b + ' / torch':<22}" for b in builds) + f"{builds[0]} / {builds[1]}")
        for name in ROWS.values():
            line = f"{name:<22}"
            for b in builds:
                ms = [runs[(policy, b, r)][name][0] for r in rounds if name in runs.get((policy, b, r), {})]
                vs = [runs[(policy, b, r)][name][1] for r in rounds if runs.get((policy, b, r), {}).get(name, (0, None))[1] is not None]
                line += f"{spread(ms, '{:.1f}') if ms else '-':<24}{spread(vs, '{:.2f}') if vs else '-':<22}"
            ratio = [runs[(policy, builds[0], r)][name][0] / runs[(policy, builds[1], r)][name][0]
                     for r in rounds if name in runs.get((policy, builds[0], r), {}) and name in runs.get((policy, builds[1], r), {})]
            line += spread(ratio, "{:.2f}") if ratio else "-"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:4])
