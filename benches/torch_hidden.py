#!/usr/bin/env python3
"""PyTorch eager yardstick for `cargo bench --bench hidden`: the training loss from hidden states
on materialised logits, forward + backward, time and peak extra memory.

What a PyTorch user writes for CE + λ·(expected BLEU loss) from a decoder's states:

    logits = F.linear(hidden, weight)                  # [B, S, V], stored for the backward
    log_probs = log_softmax(logits)                    # shared by both terms
    ce = label-smoothed NLL over non-pad targets (ε = 0.1, pad 0)
    X = exp(log_probs.gather(reference ids))           # token matches, then the expected form
    loss = ce + 0.3 · (−log BLEU)                      # Given lengths, 4-grams, corpus, add-1
    loss.backward()                                    # gradients of hidden and weight

The BLEU part is `benches/torch_bleu_loss.py`'s implementation (self-checked there against a
pure-Python BLEU counter). Inputs follow the Rust bench: hidden ~ N(0, 1) `[B, S, D]`, tied
output weight ~ N(0, σ²/D) `[V, D]` (σ = `--peaked`), one reference of T ids per element,
lengths uniform in [S/2, S], f32, `torch.set_num_threads(--threads)`.

Each shape runs in a fresh subprocess: warm-up steps, then timed steps; the median is reported.
Peak memory is VmHWM − VmRSS over the timed steps after the warm-up with the gradients released,
so it counts the logits, the log-probabilities, autograd's saved tensors, temporaries and the
gradients of hidden and weight, not the inputs and parameters themselves — the same quantity the
Rust bench reports. `--matmul` also times PyTorch's three products of the loss (H Wᵀ, G W,
Gᵀ H) so that the ratio against candle's (`--variants matmul` there) explains the rest.

    python3 benches/torch_hidden.py --shape 32,64,512,64,32000 --json out.json
    python3 benches/torch_hidden.py --shape 32,64,512,64,128000 --peaked 2.5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bleu_loss import (  # noqa: E402
    PAD_ID,
    bleu_loss_from_token_match,
    reference_side,
    reset_peak_rss,
    rss_kib,
    strip_references,
)


def make_inputs(shape, peaked: float, seed: int = 2024):
    b, s, d, t, v = shape
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, s, d, generator=gen)
    weight = torch.randn(v, d, generator=gen) * (peaked / d**0.5)
    lengths = torch.randint(max(1, s // 2), s + 1, (b,), generator=gen)
    refs = torch.zeros(b, 1, t, dtype=torch.long)
    targets = torch.zeros(b, s, dtype=torch.long)
    for e in range(b):
        n = int(lengths[e])
        refs[e, 0, : min(n, t)] = torch.randint(1, v, (min(n, t),), generator=gen)
        targets[e, :n] = torch.randint(1, v, (n,), generator=gen)
    return hidden.requires_grad_(True), weight.requires_grad_(True), refs, targets, lengths


def loss_step(hidden, weight, refside, targets, lengths, smoothing=0.1, bleu_weight=0.3):
    b, s, _ = hidden.shape
    logits = F.linear(hidden, weight)
    log_probs = torch.log_softmax(logits, dim=-1)
    flat = log_probs.reshape(b * s, -1)
    keep = targets.reshape(-1) != PAD_ID
    rows = flat[keep]
    nll = -rows.gather(1, targets.reshape(-1)[keep][:, None]).squeeze(1)
    ce = ((1 - smoothing) * nll - smoothing * rows.mean(1)).mean()
    idx = refside.ref_cat[:, None, :].expand(b, s, refside.ref_cat.shape[1])
    X = log_probs.gather(2, idx).exp()
    bleu, _ = bleu_loss_from_token_match(X, None, refside, "expected", lengths)
    loss = ce + bleu_weight * bleu
    loss.backward()
    return float(loss)


def mean_entropy(hidden, weight):
    with torch.no_grad():
        p = torch.softmax(F.linear(hidden[:4], weight), dim=-1)
        return float(-(p * p.clamp_min(1e-30).log()).sum(-1).mean())


def worker(shape, peaked, warmup, repeats, threads, matmul):
    torch.set_num_threads(threads)
    hidden, weight, refs, targets, lengths = make_inputs(shape, peaked)
    refside = reference_side(strip_references(refs, PAD_ID), 4)

    def step():
        hidden.grad = None
        weight.grad = None
        return loss_step(hidden, weight, refside, targets, lengths)

    for _ in range(warmup):
        step()
    hidden.grad = None
    weight.grad = None
    baseline = rss_kib("VmRSS")
    reset_peak_rss()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = step()
        times.append((time.perf_counter() - t0) * 1e3)
    peak_mib = (rss_kib("VmHWM") - baseline) / 1024
    out = {
        "shape": list(shape),
        "variant": "pytorch-eager",
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "runs_ms": times,
        "peak_extra_mib": peak_mib,
        "loss": value,
        "mean_entropy_nats": mean_entropy(hidden, weight),
        "threads": threads,
        "torch": torch.__version__,
    }
    if matmul:
        b, s, d, _, v = shape
        h = hidden.detach().reshape(b * s, d)
        w = weight.detach()
        mm = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            logits = h @ w.t()
            _ = logits @ w
            _ = logits.t() @ h
            mm.append((time.perf_counter() - t0) * 1e3)
        out["matmul_median_ms"] = statistics.median(mm)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="32,64,512,64,32000", help="B,S,D,T,V")
    parser.add_argument("--peaked", type=float, default=1.0, help="σ of the weight's N(0, σ²/D)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--matmul", action="store_true", help="also time the three products")
    parser.add_argument("--json", default="", help="append the result as one JSON line here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    if len(shape) != 5 or min(shape) < 1:
        raise SystemExit(f"--shape: expected B,S,D,T,V (positive), got {args.shape!r}")
    if args.worker:
        print(json.dumps(worker(shape, args.peaked, args.warmup, args.repeats, args.threads, args.matmul)))
        return
    # A fresh process per measurement, so the peak is this shape's alone.
    cmd = [sys.executable, os.path.abspath(__file__), "--worker"] + sys.argv[1:]
    result = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    line = (f"pytorch-eager {list(shape)} peaked {args.peaked}: median {result['median_ms']:.1f} ms "
            f"(min {result['min_ms']:.1f}, max {result['max_ms']:.1f}), peak extra {result['peak_extra_mib']:.0f} MiB, "
            f"entropy {result['mean_entropy_nats']:.2f} nats")
    if "matmul_median_ms" in result:
        line += f", matmul {result['matmul_median_ms']:.1f} ms"
    print(line)
    if args.json:
        with open(args.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
