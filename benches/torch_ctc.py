#!/usr/bin/env python3
"""PyTorch's CTC loss, forward + backward from logits with the log-softmax included, at the
shape of `benches/ctc.rs`: `F.ctc_loss(F.log_softmax(logits, -1), ...)` with `logits` time-first
`[T, B, V]` (PyTorch's own layout), f32, reduction `mean`, blank 0, every input length T and
target length L, targets drawn uniformly from 1..V. One JSON line, as the Rust bench prints.

    python3 benches/torch_ctc.py [--threads 2] [--runs 5] [--shape 32,128,8000,48]
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--shape", default="32,128,8000,48")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    batch, frames, vocab, length = map(int, args.shape.split(","))
    g = torch.Generator().manual_seed(33)
    logits = torch.randn(frames, batch, vocab, generator=g, dtype=torch.float32).requires_grad_()
    targets = torch.randint(1, vocab, (batch, length), generator=g)
    input_lengths = torch.full((batch,), frames, dtype=torch.long)
    target_lengths = torch.full((batch,), length, dtype=torch.long)

    def step():
        logits.grad = None
        loss = F.ctc_loss(F.log_softmax(logits, -1), targets, input_lengths, target_lengths)
        loss.backward()
        return float(loss.detach())

    loss = step()  # warm-up
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    s = sorted(times)
    print(json.dumps({
        "row": "torch_ctc",
        "shape": [batch, frames, vocab, length],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "loss": loss,
        "median_ms": round(s[len(s) // 2], 3),
        "min_ms": round(s[0], 3),
        "max_ms": round(s[-1], 3),
        "runs_ms": [round(t, 3) for t in times],
    }))


if __name__ == "__main__":
    main()
