#!/usr/bin/env python3
"""Golden vectors for the cross-entropy options of `candle_bleu::loss` from PyTorch (CPU, f64).

    python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch==2.15.0 numpy
    /tmp/venv-torch/bin/python tests/golden/ce_options_torch.py   # writes ce_options_torch.json

(PyPI's torch wheel brings its CUDA libraries, about 3 GB installed; the generator runs on the
CPU in f64.)

The options are those of Liger-Kernel's fused cross-entropy and of PyTorch's `F.cross_entropy`:

- per-class weights `w` (PyTorch's `weight=`), with label smoothing `eps`, `ignore_index` and
  `reduction`, exactly as `F.cross_entropy` computes them: per token
  `(1 - eps) * w[t] * (-log p_t) + (eps / V) * sum_v w[v] * (-log p_v)`, the mean divided by
  `sum_i w[t_i]` over the non-ignored tokens;
- the z-loss (Liger's `lse_square_scale`): `lam * logsumexp(z)^2` per non-ignored token, added to
  the loss; its mean is over the non-ignored tokens (`n`, unweighted, as Liger divides it);
- logit soft-capping (Liger's and Gemma 2's `softcap`): `z <- c * tanh(z / c)` before the softmax;
- the token accuracy (Liger's `return_token_accuracy`): the share of non-ignored targets that
  are the argmax of their (capped) logits.

Every case records the inputs, the options (`z_loss` is the scale), and PyTorch's loss, the
z-loss term (`z_loss_value`, reduced as the loss), the token accuracy and
gradients: with respect to the logits (`kind = "logits"`), or to the hidden states, the output
layer's weight `[V, D]` and its bias (`kind = "hidden"`, logits `h W^T + b`). For
`reduction = none` the loss is per token `[B, S]` (0 at ignored tokens) and the gradient is that
of `sum_i r_i * loss_i` with the recorded weights `r`.

Deterministic (numpy's seeded PCG64); inputs rounded to 3 decimals so that they are exact in the
JSON. tests/ce_options.rs checks every case on both paths: values and gradients to 1e-10 in f64,
1e-5 relative in f32.
"""
import itertools
import json
import os

import numpy as np
import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)

PAD = 0


def options():
    for weighted, eps, reduction, z_loss, softcap in itertools.product(
        [False, True], [0.0, 0.1], ["mean", "sum", "none"], [0.0, 0.01], [None, 2.5]
    ):
        yield {
            "weighted": weighted,
            "label_smoothing": eps,
            "reduction": reduction,
            "z_loss": z_loss,
            "softcap": softcap,
        }


def loss_terms(logits, targets, class_weights, opt):
    """PyTorch's numbers for `logits` [N, V] (after nothing), `targets` [N]."""
    capped = logits
    if opt["softcap"] is not None:
        c = opt["softcap"]
        capped = c * torch.tanh(logits / c)
    mask = targets != PAD
    n = int(mask.sum())
    weight = class_weights if opt["weighted"] else None
    per_token = F.cross_entropy(
        capped,
        targets,
        weight=weight,
        ignore_index=PAD,
        label_smoothing=opt["label_smoothing"],
        reduction="none",
    )
    lse = torch.logsumexp(capped, -1)
    z_tokens = opt["z_loss"] * lse * lse * mask
    if opt["reduction"] == "mean":
        ce = F.cross_entropy(
            capped,
            targets,
            weight=weight,
            ignore_index=PAD,
            label_smoothing=opt["label_smoothing"],
            reduction="mean",
        )
        z = z_tokens.sum() / n
        loss = ce + z
    elif opt["reduction"] == "sum":
        z = z_tokens.sum()
        loss = per_token.sum() + z
    else:
        z = z_tokens.sum() / n
        loss = per_token + z_tokens
    correct = (capped.argmax(-1) == targets) & mask
    accuracy = float(correct.sum()) / n
    return loss, z, accuracy


def rounded(rng, shape, scale):
    return np.round(rng.normal(0.0, scale, shape), 3)


def draw_targets(rng, batch, seq, vocab, pads):
    targets = rng.integers(1, vocab, (batch, seq))
    for b, s in pads:
        targets[b, s] = PAD
    return targets


def class_weights(rng, vocab):
    # Positive weights, one of them 0 (a class that never counts), the padding class's arbitrary.
    w = np.round(rng.uniform(0.25, 2.0, vocab), 3)
    w[vocab - 1] = 0.0
    return w


def logits_case(rng, name, batch, seq, vocab, pads, scale):
    logits = rounded(rng, (batch, seq, vocab), scale)
    targets = draw_targets(rng, batch, seq, vocab, pads)
    w = class_weights(rng, vocab)
    row_weights = np.round(rng.uniform(0.5, 2.0, (batch, seq)), 3)
    return logits_results(name, logits, targets, w, row_weights)


def logits_results(name, logits, targets, w, row_weights):
    batch, seq, vocab = logits.shape
    results = []
    for opt in options():
        x = torch.tensor(logits, requires_grad=True)
        loss, z, acc = loss_terms(
            x.reshape(-1, vocab), torch.tensor(targets).reshape(-1), torch.tensor(w), opt
        )
        total = (loss * torch.tensor(row_weights).reshape(-1)).sum() if opt["reduction"] == "none" else loss
        total.backward()
        results.append(
            {
                **opt,
                "loss": loss.detach().reshape(-1).tolist() if opt["reduction"] == "none" else float(loss.detach()),
                "z_loss_value": float(z.detach()),
                "token_accuracy": acc,
                "grad_logits": x.grad.reshape(-1).tolist(),
            }
        )
    return {
        "name": name,
        "kind": "logits",
        "shape": [batch, seq, vocab],
        "logits": logits.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "class_weights": w.tolist(),
        "row_weights": row_weights.reshape(-1).tolist(),
        "results": results,
    }


def hidden_case(rng, name, batch, seq, dim, vocab, pads):
    hidden = rounded(rng, (batch, seq, dim), 1.0)
    weight = rounded(rng, (vocab, dim), 1.0)
    bias = rounded(rng, (vocab,), 0.5)
    targets = draw_targets(rng, batch, seq, vocab, pads)
    w = class_weights(rng, vocab)
    row_weights = np.round(rng.uniform(0.5, 2.0, (batch, seq)), 3)
    results = []
    for opt in options():
        h = torch.tensor(hidden, requires_grad=True)
        wt = torch.tensor(weight, requires_grad=True)
        b = torch.tensor(bias, requires_grad=True)
        logits = h.reshape(-1, dim) @ wt.T + b
        loss, z, acc = loss_terms(logits, torch.tensor(targets).reshape(-1), torch.tensor(w), opt)
        total = (loss * torch.tensor(row_weights).reshape(-1)).sum() if opt["reduction"] == "none" else loss
        total.backward()
        results.append(
            {
                **opt,
                "loss": loss.detach().reshape(-1).tolist() if opt["reduction"] == "none" else float(loss.detach()),
                "z_loss_value": float(z.detach()),
                "token_accuracy": acc,
                "grad_hidden": h.grad.reshape(-1).tolist(),
                "grad_weight": wt.grad.reshape(-1).tolist(),
                "grad_bias": b.grad.reshape(-1).tolist(),
            }
        )
    return {
        "name": name,
        "kind": "hidden",
        "shape": [batch, seq, dim, vocab],
        "hidden": hidden.reshape(-1).tolist(),
        "weight": weight.reshape(-1).tolist(),
        "bias": bias.reshape(-1).tolist(),
        "targets": targets.reshape(-1).tolist(),
        "class_weights": w.tolist(),
        "row_weights": row_weights.reshape(-1).tolist(),
        "results": results,
    }


def main():
    rng = np.random.default_rng(35)
    cases = [
        logits_case(rng, "logits, one pad", 2, 4, 7, [(1, 3)], 2.0),
        logits_case(rng, "logits, large values", 2, 3, 9, [(0, 2), (1, 0)], 6.0),
        hidden_case(rng, "hidden, one pad", 2, 3, 4, 9, [(1, 2)]),
        # The non-pad targets' class weights sum to exactly 1 (two targets of weight 0.5): the
        # weighted mean's divisor is 1, and the z-loss is still a mean over the 2 tokens.
        logits_results(
            "logits, target weights summing to 1",
            np.array([[[1.0, 2.0, 0.5, 0.0, -1.0], [0.3, -1.0, 2.0, 0.1, 0.2]]]),
            np.array([[1, 2]]),
            np.array([1.0, 0.5, 0.5, 1.0, 1.0]),
            np.array([[1.0, 1.0]]),
        ),
    ]
    out = {
        "torch": torch.__version__.split("+")[0],
        "pad": PAD,
        "cases": cases,
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ce_options_torch.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases x {len(list(options()))} option sets")


if __name__ == "__main__":
    main()
