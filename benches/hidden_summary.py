#!/usr/bin/env python3
"""Summarise a `benches/hidden_vs_torch.sh` run: per configuration and variant, the median over
rounds of each round's median step time (with the range of the round medians), the ratios
against this crate's logits path (per round, then the median) and against PyTorch eager, and
the peak extra memory.

    python3 benches/hidden_summary.py benches/results/hidden
"""
import glob
import json
import os
import statistics
import sys


def spread(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def ratio(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main(folder):
    torch = {}
    for path in glob.glob(os.path.join(folder, "torch-*.jsonl")):
        for line in open(path):
            r = json.loads(line)
            torch.setdefault(r["shape"][-1], []).append(r)
    configs = {}
    for path in sorted(glob.glob(os.path.join(folder, "rust-*.json"))):
        name = os.path.basename(path)[len("rust-"):-len(".json")].rsplit("-", 1)[0]
        configs.setdefault(name, []).append(json.load(open(path)))
    print("| configuration | variant | ms per step, median of rounds (range) | vs logits path | vs PyTorch eager | peak extra RSS MiB | heap peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for name, rounds in configs.items():
        vocab = rounds[0]["shape"][-1]
        head = (f"V = {vocab}, σ = {rounds[0]['peaked']}, α = {rounds[0].get('zipf', 0)}: "
                f"{rounds[0]['mean_entropy_nats']:.2f} nats, filter skips "
                f"{100 * rounds[0].get('skipped_tile_share', 0):.1f} % of tiles ({len(rounds)} rounds)")
        torch_ms = [t["median_ms"] for t in torch.get(vocab, [])] if "uniform" in name else []
        variants = [r["variant"] for r in rounds[0]["results"]]
        for variant in variants:
            rows = [next(x for x in r["results"] if x["variant"] == variant) for r in rounds]
            ms = [x["median_ms"] for x in rows]
            vs_logits = [x["vs_logits"] for x in rows if x["vs_logits"] is not None]
            vs_torch = (ratio([m / t for m, t in zip(ms, torch_ms)])
                        if torch_ms and len(torch_ms) == len(ms) else "")
            rss = statistics.median(x["rss_peak_extra_mib"] for x in rows)
            heap = statistics.median(x["heap_peak_extra_mib"] for x in rows)
            print(f"| {head} | {variant} | {spread(ms)} | {ratio(vs_logits) if vs_logits else ''} | {vs_torch} | {rss:.0f} | {heap:.0f} |")
            head = ""
        if torch_ms:
            t = torch[vocab]
            mm = [x["matmul_median_ms"] for x in t if "matmul_median_ms" in x]
            print(f"| | PyTorch eager | {spread(torch_ms)} | | 1 | {statistics.median(x['peak_extra_mib'] for x in t):.0f} | |")
            if mm:
                print(f"| | PyTorch's three products | {spread(mm)} | | | | |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benches/results/hidden")
