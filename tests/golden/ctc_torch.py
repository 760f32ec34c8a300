#!/usr/bin/env python3
"""Golden vectors for `candle_bleu::loss::ctc_loss` from PyTorch's `F.ctc_loss` (CPU, f64).

    python3 tests/golden/ctc_torch.py   # writes tests/golden/ctc_torch.json

Deterministic (numpy's seeded PCG64). Each case records batch-first logits `[B, T, V]` (rounded
to 3 decimals, so that the JSON stays small and the values are exact in it), padded targets
`[B, L]`, the lengths and the blank, and for every reduction (`mean`, `sum`, `none`) with
`zero_infinity` off and on, PyTorch's loss of

    F.ctc_loss(F.log_softmax(logits, -1).transpose(0, 1), targets, input_lengths,
               target_lengths, blank, reduction, zero_infinity)

(PyTorch is time-first `[T, B, V]`, hence the transpose) and the gradient **with respect to the
logits**, through `log_softmax`. PyTorch's gradient with respect to a leaf `log_probs` is not
the gradient of its loss (pytorch/pytorch#52241: it assumes a log_softmax upstream), so it is
never recorded; through `log_softmax` it is exact. For `reduction = none` the gradient is that
of `Σ_b w_b loss_b` with the recorded weights `w`.

Non-finite numbers are written as strings: a loss `"inf"`, a gradient entry `"nan"` (PyTorch's
gradient of an infinite loss without `zero_infinity`; candle-bleu gives 0 there).

tests/ctc_loss.rs checks every case: values and gradients to 1e-10 in f64, 1e-5 relative in f32.
"""
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)


def extended_length(target):
    """The fewest frames that align `target`: its length plus one per repeated neighbour."""
    return len(target) + sum(1 for a, b in zip(target, target[1:]) if a == b)


def draw_target(rng, length, vocab, blank, repeats):
    labels = [v for v in range(vocab) if v != blank]
    target = [int(rng.choice(labels)) for _ in range(length)]
    for _ in range(repeats):
        if length >= 2:
            j = int(rng.integers(1, length))
            target[j] = target[j - 1]
    return target


def case(rng, name, vocab, blank, frames, elements, scale=2.0):
    """`elements`: (input_length, target) per batch element; `frames`: T; L is the longest target."""
    batch = len(elements)
    max_len = max(1, max(len(t) for _, t in elements))
    logits = np.round(rng.normal(0.0, scale, (batch, frames, vocab)), 3)
    # Padding holds ids beyond each target length: arbitrary, ignored (here: the blank's neighbour).
    targets = np.full((batch, max_len), (blank + 1) % vocab, dtype=np.int64)
    for b, (_, t) in enumerate(elements):
        targets[b, : len(t)] = t
    input_lengths = [il for il, _ in elements]
    target_lengths = [len(t) for _, t in elements]
    weights = np.round(rng.uniform(0.5, 2.0, batch), 3)
    results = []
    for reduction in ["mean", "sum", "none"]:
        for zero_infinity in [False, True]:
            x = torch.tensor(logits, requires_grad=True)
            log_probs = F.log_softmax(x, -1).transpose(0, 1)
            loss = F.ctc_loss(
                log_probs,
                torch.tensor(targets),
                torch.tensor(input_lengths),
                torch.tensor(target_lengths),
                blank=blank,
                reduction=reduction,
                zero_infinity=zero_infinity,
            )
            total = (loss * torch.tensor(weights)).sum() if reduction == "none" else loss
            total.backward()
            results.append(
                {
                    "reduction": reduction,
                    "zero_infinity": zero_infinity,
                    "loss": [encode(v) for v in np.atleast_1d(loss.detach().numpy())],
                    "grad": [encode(v) for v in x.grad.numpy().ravel()],
                }
            )
    return {
        "name": name,
        "shape": [batch, frames, vocab, max_len],
        "blank": blank,
        "logits": [float(v) for v in logits.ravel()],
        "targets": targets.tolist(),
        "input_lengths": input_lengths,
        "target_lengths": target_lengths,
        "weights": [float(w) for w in weights],
        "results": results,
    }


def encode(v):
    v = float(v)
    if np.isnan(v):
        return "nan"
    if np.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def main():
    rng = np.random.Generator(np.random.PCG64(20261127))
    cases = []
    # Blank 0; repeats; varied lengths.
    t = [draw_target(rng, n, 5, 0, r) for n, r in [(3, 1), (2, 0), (1, 0)]]
    cases.append(case(rng, "blank_first", 5, 0, 8, [(8, t[0]), (6, t[1]), (3, t[2])]))
    # Blank in the middle; one target exactly as long as its input allows (T' = L + repeats).
    t = [draw_target(rng, n, 6, 3, r) for n, r in [(4, 2), (3, 1), (2, 0), (4, 0)]]
    tight = extended_length(t[0])
    cases.append(
        case(rng, "blank_middle_tight", 6, 3, 9, [(tight, t[0]), (9, t[1]), (5, t[2]), (4, t[3])])
    )
    # Blank V - 1, all-repeat target, frames beyond the lengths.
    t = [[1, 1, 1], draw_target(rng, 2, 5, 4, 0), [2, 0, 2]]
    cases.append(
        case(rng, "blank_last_repeats", 5, 4, 7, [(5, t[0]), (7, t[1]), (extended_length(t[2]), t[2])])
    )
    # Impossible alignments: too few frames for the target with its repeats.
    t = [[1, 1], [2, 3, 4], [1, 2]]
    cases.append(case(rng, "impossible", 5, 0, 6, [(3, t[0]), (2, t[1]), (6, t[2])]))
    # Empty targets beside a full-length one; a single frame.
    t = [[], [2, 1, 3], [], [4]]
    cases.append(case(rng, "empty_targets", 5, 0, 5, [(1, t[0]), (5, t[1]), (4, t[2]), (1, t[3])]))
    # Larger random case, blank in the middle, sharper logits.
    elements = []
    for _ in range(4):
        n = int(rng.integers(1, 5))
        target = draw_target(rng, n, 7, 2, int(rng.integers(0, 2)))
        frames = int(rng.integers(extended_length(target), 13))
        elements.append((frames, target))
    cases.append(case(rng, "random_sharp", 7, 2, 12, elements, scale=4.0))
    # One frame for everyone.
    cases.append(case(rng, "one_frame", 4, 1, 1, [(1, [0]), (1, [2]), (1, [3])]))
    out = {"torch": torch.__version__.split("+")[0], "cases": cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctc_torch.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"{path}: {len(cases)} cases, {os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main()
