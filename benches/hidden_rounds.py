#!/usr/bin/env python3
"""Summarises alternated rounds of `cargo bench --bench hidden` builds and PyTorch eager
(benches/results/{gemm-avx512,hidden-tiles}/run.sh): per build and vocabulary, the median over
rounds (min-max) of each variant's time, of hidden/logits, and of each side's time / PyTorch
eager's in the same round.

    python3 benches/hidden_rounds.py benches/results/hidden-tiles
"""
import glob
import json
import os
import re
import statistics
import sys


def spread(values, fmt="{:.0f}"):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(folder):
    torch = {}
    for vocab in (32000, 128000):
        path = os.path.join(folder, f"torch-{vocab}.jsonl")
        if os.path.exists(path):
            with open(path) as f:
                torch[vocab] = [json.loads(line) for line in f if line.strip()]
    rows = {}
    for path in sorted(glob.glob(os.path.join(folder, "rust-*.json"))):
        build, vocab, round_ = re.match(r"rust-(.+)-(\d+)-(\d+)\.json", os.path.basename(path)).groups()
        with open(path) as f:
            result = {r["variant"]: r["median_ms"] for r in json.load(f)["results"]}
        rows.setdefault((int(vocab), build), []).append((int(round_), result))
    print(f"# {folder}: medians over rounds (min-max); ms, or ratios")
    print("V        build      rounds  matmul ms            logits ms            hidden ms            hidden/logits      hidden/torch       torch ms")
    for (vocab, build), runs in sorted(rows.items()):
        get = lambda v: [r[v] for _, r in runs if v in r]
        ratio = [r["hidden"] / r["logits"] for _, r in runs]
        t = torch.get(vocab, [])
        vs_torch = [r["hidden"] / t[k - 1]["median_ms"] for k, r in runs if k - 1 < len(t)]
        torch_ms = [x["median_ms"] for x in t]
        print(
            f"{vocab:<8} {build:<10} {len(runs):<7} {spread(get('matmul')):<20} {spread(get('logits')):<20} "
            f"{spread(get('hidden')):<20} {spread(ratio, '{:.2f}'):<18} "
            f"{spread(vs_torch, '{:.2f}') if vs_torch else '-':<18} {spread(torch_ms) if torch_ms else '-'}"
        )
    for vocab, t in sorted(torch.items()):
        print(f"PyTorch eager V={vocab}: matmul {spread([x['matmul_median_ms'] for x in t])} ms, "
              f"peak extra {spread([x['peak_extra_mib'] for x in t])} MiB")


if __name__ == "__main__":
    main(sys.argv[1])
