#!/usr/bin/env python3
"""PyTorch reference benchmark of the differentiable BLEU loss (docs/loss.md).

A batched PyTorch implementation of the same loss the crate implements in candle, so the two can
be timed back to back on the same machine. It is a benchmark script, not a test dependency: the
Rust crate never calls it.

What is implemented (docs/loss.md):
  * references as token ids `[B, R, T]` with trailing padding, laid end to end; the reference side
    (`e_j`, `ν_j`, `κ_j`, reference lengths) is computed from the ids in plain Python on the host,
    integer, no gradient (timed separately as `ref_prep_ms`, not inside the forward+backward);
  * the length model `Given(len)` (per-element hypothesis lengths, default all `S`);
  * the three forms `expected`, `paired`, `lower_bound`, with n-gram matches built as shifted
    products of slices of the token match `X = gather(P, ref ids)` (never a `V`-sized matmul;
    only `paired` pays the `V`-sized hypothesis self-match `Z = P Pᵀ`);
  * products over the strictly lower triangle (`μ`) with `torch.prod` (no exp(Σ log));
  * the score `log BLEU = β(C, L) + Σ_n w_n log p̃_n` with AddK(k) smoothing on orders >= 2, the
    `t_n = 0` and `1e-30` guards, and reductions `corpus` (default) / `sentence_mean`;
  * `loss = -log BLEU`.

Timed (f32, forward + backward from `logits` with requires_grad, torch.set_num_threads(T)):
  expected       softmax -> gather -> expected form -> loss -> backward
  expected_lse   same numbers, X = exp(gather(logits) - logsumexp(logits)) (no P kept for the graph)
  paired         softmax -> gather + bmm(P, Pᵀ) -> paired form -> loss -> backward
  lower_bound    softmax -> gather -> lower-bound form -> loss -> backward
  cross_entropy  F.cross_entropy(logits, reference ids) forward + backward (the yardstick)
  ce_expected    cross-entropy + expected-form BLEU sharing one log_softmax (`ce_bleu_loss`)
Each (shape, form) runs in a fresh subprocess: `warmup` untimed runs, then `repeats` timed ones;
the median is reported. Peak memory is the peak resident set size of that subprocess during the
timed runs minus its resident size just before them, after the warmup, with logits.grad released
(Linux VmHWM reset through /proc/self/clear_refs; ru_maxrss as a fallback). So it covers P, the
saved activations, temporaries and logits.grad, but not the inputs (logits, ids) themselves.

Before timing, a self-check asserts that all three forms give exactly the clipped matches, totals
and lengths of a tiny pure-Python BLEU counter on one-hot probabilities (random cases with repeats,
several references, padding, n > length), that the corpus loss equals -log BLEU computed in pure
Python, and (f64, small) that autograd's gradients through softmax match finite differences.

Usage (from the repository root; torch from PyPI, see BENCHMARKS.md):
  python benches/torch_bleu_loss.py                        # both shapes, all forms, writes JSON
  python benches/torch_bleu_loss.py --shapes 16,32,32,1000 --forms expected,cross_entropy
  python benches/torch_bleu_loss.py --repeats 3 --json /tmp/out.json
  python benches/torch_bleu_loss.py --check-only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F

FORMS = ("expected", "paired", "lower_bound")
TIMED_FORMS = ("expected", "expected_lse", "paired", "lower_bound", "cross_entropy", "ce_expected")
DEFAULT_SHAPES = "32,64,64,32000;16,32,32,1000"
PRECISION_FLOOR = 1e-30
PAD_ID = 0
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_results.json")


# ---------------------------------------------------------------------------------------------
# Reference side: e_j, ν_j, κ_j from the ids (host, integer, no gradient)
# ---------------------------------------------------------------------------------------------


def strip_references(ref_ids: torch.Tensor, pad_id: int) -> list[list[list[int]]]:
    """`[B, T]` or `[B, R, T]` ids -> `[b][r]` token lists, trailing `pad_id` removed; a row of
    padding only is no reference (as `References::from_ids`)."""
    if ref_ids.dim() == 2:
        ref_ids = ref_ids.unsqueeze(1)
    out = []
    for element in ref_ids.tolist():
        kept = []
        for row in element:
            length = len(row)
            while length > 0 and row[length - 1] == pad_id:
                length -= 1
            if length > 0:
                kept.append(row[:length])
        if not kept:
            raise ValueError("every reference row of a batch element is padding")
        out.append(kept)
    return out


@dataclass
class ReferenceSide:
    """The references of a batch laid end to end, and their n-gram masks and clip counts.

    ref_cat:  long [B, Tc], the concatenated references (0 past the end of an element's).
    nu[n-1]:  float [B, Tc-n+1], ν_j: 1 at the first occurrence of each distinct n-gram over all
              references of the element (n-grams never span two references), else 0.
    kappa[n-1]: float [B, Tc-n+1], κ_j = ν_j · max_r count_r(g).
    ref_lens: [b][r] reference lengths.
    """

    ref_cat: torch.Tensor
    nu: list[torch.Tensor]
    kappa: list[torch.Tensor]
    ref_lens: list[list[int]]


def reference_side(refs: list[list[list[int]]], max_order: int) -> ReferenceSide:
    batch = len(refs)
    total = max(1, max(sum(len(r) for r in element) for element in refs))
    ref_cat = torch.zeros(batch, total, dtype=torch.long)
    nu = [torch.zeros(batch, max(0, total - n + 1), dtype=torch.float64) for n in range(1, max_order + 1)]
    kappa = [torch.zeros_like(x) for x in nu]
    for b, element in enumerate(refs):
        cat = [tok for r in element for tok in r]
        ref_cat[b, : len(cat)] = torch.tensor(cat, dtype=torch.long)
        for n in range(1, max_order + 1):
            max_count: dict[tuple, int] = {}
            for r in element:
                for gram, count in Counter(ngrams(r, n)).items():
                    max_count[gram] = max(max_count.get(gram, 0), count)
            seen = set()
            offset = 0
            for r in element:
                for s in range(len(r) - n + 1):
                    gram = tuple(r[s : s + n])
                    if gram not in seen:
                        seen.add(gram)
                        nu[n - 1][b, offset + s] = 1.0
                        kappa[n - 1][b, offset + s] = float(max_count[gram])
                offset += len(r)
    return ReferenceSide(ref_cat, nu, kappa, [[len(r) for r in element] for element in refs])


def closest_ref_len(hyp_len: float, lengths: list[int]) -> float:
    """The reference length closest to `hyp_len`, the shorter on a tie (a constant)."""
    return float(min(lengths, key=lambda r: (abs(r - hyp_len), r)))


# ---------------------------------------------------------------------------------------------
# Hypothesis side and the three forms
# ---------------------------------------------------------------------------------------------


def token_match(probs: torch.Tensor, ref_cat: torch.Tensor) -> torch.Tensor:
    """X[b, i, j] = P[b, i, ref_cat[b, j]]: `[B, S, Tc]`, a gather (no V-sized matmul)."""
    batch, seq, _ = probs.shape
    return probs.gather(2, ref_cat[:, None, :].expand(batch, seq, ref_cat.shape[1]))


def token_match_from_logits(logits: torch.Tensor, ref_cat: torch.Tensor) -> torch.Tensor:
    """Same numbers as token_match(softmax(logits)), without keeping P for the backward."""
    batch, seq, _ = logits.shape
    idx = ref_cat[:, None, :].expand(batch, seq, ref_cat.shape[1])
    return torch.exp(logits.gather(2, idx) - torch.logsumexp(logits, dim=2, keepdim=True))


def ce_bleu_loss(logits: torch.Tensor, refside: ReferenceSide, targets: torch.Tensor, bleu_weight: float = 1.0,
                 pad_id: int = 0):
    """Cross-entropy + bleu_weight * expected-form BLEU loss, sharing one log_softmax, as a PyTorch user
    would write a mixed training objective: `F.nll_loss` on the log-probabilities and the BLEU token
    matches `X = exp(log_probs.gather(ref ids))`."""
    batch, seq, vocab = logits.shape
    log_probs = torch.log_softmax(logits, dim=-1)
    ce = F.nll_loss(log_probs.reshape(-1, vocab), targets.reshape(-1), ignore_index=pad_id)
    idx = refside.ref_cat[:, None, :].expand(batch, seq, refside.ref_cat.shape[1])
    X = log_probs.gather(2, idx).exp()
    hyp_lengths = torch.full((batch,), seq, dtype=torch.long)
    bleu, _ = bleu_loss_from_token_match(X, None, refside, "expected", hyp_lengths)
    return ce + bleu_weight * bleu, ce, bleu


def match_weights(hyp_lengths: torch.Tensor, seq: int, n: int, dtype) -> torch.Tensor:
    """Given(len): u_i = 1[i + n - 1 < len] for starts i = 0..S-n: `[B, max(0, S-n+1)]`."""
    starts = torch.arange(max(0, seq - n + 1))
    return (starts[None, :] + n - 1 < hyp_lengths[:, None]).to(dtype)


def strictly_lower_product(factors: torch.Tensor) -> torch.Tensor:
    """Π_{i'<i} factors[..., i, i'] over the strictly lower triangle: `[..., S, S] -> [..., S]`.

    Entries on and above the diagonal are replaced by 1 and the rows multiplied with torch.prod,
    whose backward handles exact zeros (no exp(Σ log)), so one-hot inputs keep finite gradients.
    """
    size = factors.shape[-1]
    strict = torch.ones(size, size, dtype=torch.bool).tril(-1)
    return torch.where(strict, factors, torch.ones((), dtype=factors.dtype)).prod(-1)


def bleu_statistics(
    X: torch.Tensor,
    refside: ReferenceSide,
    hyp_lengths: torch.Tensor,
    form: str,
    max_order: int,
    probs: torch.Tensor | None = None,
):
    """Per-element statistics: matches `[B, N]` (differentiable), totals `[B, N]`, hyp_len `[B]`,
    ref_len `[B]` (constants under Given lengths).

    X: token match `[B, S, Tc]`; probs: `[B, S, V]`, needed by `paired` only (for Z = P Pᵀ).
    """
    batch, seq, _ = X.shape
    dtype = X.dtype
    if form == "paired":
        if probs is None:
            raise ValueError("the paired form needs the probabilities")
        Z1 = torch.bmm(probs, probs.transpose(1, 2))  # [B, S, S]: the V-sized self-match
    matches = []
    M = X
    Z = None
    for n in range(1, max_order + 1):
        if n > 1:
            # M_n[i, j] = M_{n-1}[i, j] · X[i+n-1, j+n-1]: shifted products of slices.
            M = M[:, :-1, :-1] * X[:, n - 1 :, n - 1 :]
        kappa = refside.kappa[n - 1].to(dtype)
        nu = refside.nu[n - 1].to(dtype)
        u = match_weights(hyp_lengths, seq, n, dtype)  # [B, S-n+1]
        if M.shape[1] == 0 or M.shape[2] == 0:
            matches.append(X.sum((1, 2)) * 0.0)
            if form == "paired":
                Z = Z1 if n == 1 else Z[:, :-1, :-1] * Z1[:, n - 1 :, n - 1 :]
            continue
        if form == "expected":
            expected_count = (M * u[:, :, None]).sum(1)  # E_j = Σ_i M[j,i] u_i
            m = torch.minimum(kappa, nu * expected_count).sum(-1)
        elif form == "lower_bound":
            a = M * u[:, :, None]  # a_ji = u_i M[j,i]
            others = 1.0 + a.sum(1, keepdim=True) - a  # 1 + E_j - a_ji >= 1
            share = torch.clamp(kappa[:, None, :] / others, max=1.0)
            m = (a * share).sum((1, 2))
        elif form == "paired":
            Z = Z1 if n == 1 else Z[:, :-1, :-1] * Z1[:, n - 1 :, n - 1 :]  # [B, S-n+1, S-n+1]
            zu = Z * u[:, None, :]  # Z[i,i'] u_i'
            mu = u * strictly_lower_product(1.0 - zu)  # μ_i
            count = mu * zu.sum(-1)  # c_i
            clipped = M * kappa[:, None, :] * mu[:, :, None]
            unclipped = M * count[:, :, None] * nu[:, None, :]
            m = torch.minimum(clipped, unclipped).sum((1, 2))
        else:
            raise ValueError(f"unknown form {form!r}")
        matches.append(m)
    matches = torch.stack(matches, dim=1)
    lengths = hyp_lengths.to(dtype)
    totals = torch.stack([torch.clamp(lengths - n + 1, min=0) for n in range(1, max_order + 1)], 1)
    ref_len = torch.tensor(
        [closest_ref_len(c, lens) for c, lens in zip(lengths.tolist(), refside.ref_lens)], dtype=dtype
    )
    return matches, totals, lengths, ref_len


def log_brevity_penalty(C: torch.Tensor, L: torch.Tensor) -> torch.Tensor:
    """β(C, L) = min(0, 1 - L/C) for C >= 1, min(0, 1 - 2L + L·C) below."""
    long_enough = C >= 1
    safe_C = torch.where(long_enough, C, torch.ones_like(C))
    return torch.clamp(torch.where(long_enough, 1.0 - L / safe_C, 1.0 - 2.0 * L + L * C), max=0.0)


def log_bleu_from_stats(matches, totals, hyp_len, ref_len, k: float | None, weights) -> torch.Tensor:
    """Σ_n w_n log p̃_n + β over the last dim; statistics `[K, N]`, lengths `[K]` -> `[K]`."""
    order_count = matches.shape[-1]
    add = torch.tensor([0.0 if (n == 0 or k is None) else k for n in range(order_count)], dtype=matches.dtype)
    has = totals > 0
    num = torch.where(has, matches + add, torch.ones_like(matches))
    den = torch.where(has, totals + add, torch.ones_like(totals))
    log_p = torch.log(torch.clamp(num / den, min=PRECISION_FLOOR))
    w = torch.tensor(weights, dtype=matches.dtype)
    return (log_p * w).sum(-1) + log_brevity_penalty(hyp_len, ref_len)


def bleu_loss(
    probs_or_logits: torch.Tensor,
    refside: ReferenceSide,
    form: str = "expected",
    hyp_lengths: torch.Tensor | None = None,
    max_order: int = 4,
    k: float | None = 1.0,
    reduction: str = "corpus",
    from_logits: bool = False,
    lse: bool = False,
):
    """loss = -log BLEU (scalar) and the statistics. `probs_or_logits` `[B, S, V]`."""
    batch, seq, _ = probs_or_logits.shape
    if hyp_lengths is None:
        hyp_lengths = torch.full((batch,), seq, dtype=torch.long)
    probs = None
    if from_logits and lse and form != "paired":
        X = token_match_from_logits(probs_or_logits, refside.ref_cat)
    else:
        probs = torch.softmax(probs_or_logits, dim=-1) if from_logits else probs_or_logits
        X = token_match(probs, refside.ref_cat)
    return bleu_loss_from_token_match(X, probs, refside, form, hyp_lengths, max_order, k, reduction)


def bleu_loss_from_token_match(X, probs, refside, form, hyp_lengths, max_order=4, k=1.0, reduction="corpus"):
    """The rest of `bleu_loss` once the token matches X (and, for the paired form, P) exist."""
    matches, totals, hyp_len, ref_len = bleu_statistics(X, refside, hyp_lengths, form, max_order, probs)
    weights = [1.0 / max_order] * max_order
    if reduction == "corpus":
        log_bleu = log_bleu_from_stats(
            matches.sum(0, keepdim=True), totals.sum(0, keepdim=True), hyp_len.sum(0, keepdim=True),
            ref_len.sum(0, keepdim=True), k, weights,
        )[0]
    elif reduction == "sentence_mean":
        log_bleu = log_bleu_from_stats(matches, totals, hyp_len, ref_len, k, weights).mean()
    else:
        raise ValueError(f"unknown reduction {reduction!r}")
    return -log_bleu, (matches, totals, hyp_len, ref_len)


# ---------------------------------------------------------------------------------------------
# Self-check against a tiny pure-Python BLEU counter
# ---------------------------------------------------------------------------------------------


def ngrams(tokens, n):
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def python_stats(hyp: list[int], refs: list[list[int]], max_order: int):
    matches, totals = [], []
    for n in range(1, max_order + 1):
        max_ref: dict[tuple, int] = {}
        for r in refs:
            for g, c in Counter(ngrams(r, n)).items():
                max_ref[g] = max(max_ref.get(g, 0), c)
        matches.append(sum(min(c, max_ref.get(g, 0)) for g, c in Counter(ngrams(hyp, n)).items()))
        totals.append(max(0, len(hyp) - n + 1))
    return matches, totals, len(hyp), closest_ref_len(len(hyp), [len(r) for r in refs])


def python_corpus_loss(stats, max_order, k):
    m = [sum(s[0][n] for s in stats) for n in range(max_order)]
    t = [sum(s[1][n] for s in stats) for n in range(max_order)]
    C = sum(s[2] for s in stats)
    L = sum(s[3] for s in stats)
    total = 0.0
    for n in range(max_order):
        if t[n] == 0:
            continue
        p = m[n] / t[n] if (n == 0 or k is None) else (m[n] + k) / (t[n] + k)
        total += math.log(max(p, PRECISION_FLOOR)) / max_order
    beta = min(0.0, 1.0 - L / C) if C >= 1 else min(0.0, 1.0 - 2.0 * L + L * C)
    return -(beta + total)


def self_check(cases: int = 300, seed: int = 1234) -> None:
    rng = random.Random(seed)
    max_order = 4
    for case in range(cases):
        batch = rng.randint(1, 4)
        vocab = rng.randint(3, 6)  # ids 1..vocab-1 (0 is padding): many repeats
        seq = rng.randint(1, 8)
        refs_count = rng.randint(1, 3)
        ref_width = rng.randint(1, 8)
        hyps, lens, ref_rows = [], [], []
        for _ in range(batch):
            length = rng.randint(0, seq)  # Given(len) <= S; positions past len are junk tokens
            hyps.append([rng.randint(1, vocab - 1) for _ in range(seq)])
            lens.append(length)
            rows = []
            for r in range(refs_count):
                rlen = rng.randint(1 if r == 0 else 0, ref_width)  # extra rows may be all padding
                rows.append([rng.randint(1, vocab - 1) for _ in range(rlen)] + [PAD_ID] * (ref_width - rlen))
            ref_rows.append(rows)
        ref_ids = torch.tensor(ref_rows, dtype=torch.long)
        refs = strip_references(ref_ids, PAD_ID)
        refside = reference_side(refs, max_order)
        hyp_lengths = torch.tensor(lens, dtype=torch.long)
        expected = [python_stats(h[:l], r, max_order) for h, l, r in zip(hyps, lens, refs)]
        want_loss = python_corpus_loss(expected, max_order, 1.0)
        for dtype in (torch.float64, torch.float32):
            probs = F.one_hot(torch.tensor(hyps), vocab).to(dtype)
            for form in FORMS:
                loss, (m, t, c, L) = bleu_loss(probs, refside, form, hyp_lengths, max_order, 1.0)
                for b, (em, et, ec, eL) in enumerate(expected):
                    got_m = m[b].tolist()
                    if form == "lower_bound":
                        # c positions each get κ/c: exact in real arithmetic, but c·fl(κ/c) may be
                        # one rounding off κ (e.g. 3 · fl(2/3) = 1.9999999999999998 in f64).
                        ulp = 1e-13 if dtype == torch.float64 else 1e-5
                        assert all(abs(g - e) <= ulp * max(1, e) for g, e in zip(got_m, em)), (
                            case, form, dtype, b, got_m, em)
                        got_m = [float(round(g)) for g in got_m]
                    got = (got_m, t[b].tolist(), c[b].item(), L[b].item())
                    assert got == (em, et, ec, eL), (case, form, dtype, b, got, (em, et, ec, eL))
                tol = 1e-12 if dtype == torch.float64 else 1e-5
                assert abs(loss.item() - want_loss) <= tol * max(1.0, abs(want_loss)), (
                    case, form, dtype, loss.item(), want_loss)
    # Gradients through softmax, f64, against central finite differences (soft inputs: off kinks).
    gen = torch.Generator().manual_seed(seed)
    refs = strip_references(torch.tensor([[[1, 2, 3, 1, 2, 0]], [[3, 3, 1, 2, 0, 0]]]), PAD_ID)
    refside = reference_side(refs, max_order)
    for form in FORMS:
        for reduction in ("corpus", "sentence_mean"):
            logits = torch.randn(2, 5, 4, dtype=torch.float64, generator=gen).requires_grad_()
            lengths = torch.tensor([5, 4])
            torch.autograd.gradcheck(
                lambda x: bleu_loss(x, refside, form, lengths, max_order, 1.0, reduction, from_logits=True)[0],
                (logits,), eps=1e-6, atol=1e-7, rtol=1e-5,
            )
    # expected_lse == expected (values and gradients).
    logits = torch.randn(3, 7, 11, dtype=torch.float64, generator=gen).requires_grad_()
    refside = reference_side(strip_references(torch.randint(1, 11, (3, 2, 6), generator=gen), PAD_ID), max_order)
    a, _ = bleu_loss(logits, refside, "expected", from_logits=True)
    (ga,) = torch.autograd.grad(a, logits)
    b, _ = bleu_loss(logits, refside, "expected", from_logits=True, lse=True)
    (gb,) = torch.autograd.grad(b, logits)
    assert abs(a.item() - b.item()) < 1e-12 and (ga - gb).abs().max().item() < 1e-12


# ---------------------------------------------------------------------------------------------
# Timing (one fresh subprocess per shape and form)
# ---------------------------------------------------------------------------------------------


def check_ce_bleu(seed: int = 7) -> None:
    """`ce_bleu_loss` (one shared log_softmax) against the two losses computed apart."""
    gen = torch.Generator().manual_seed(seed)
    batch, seq, vocab = 3, 6, 11
    logits = torch.randn(batch, seq, vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    ref_ids = torch.randint(1, vocab, (batch, 1, 5), generator=gen)
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    refside = reference_side(strip_references(ref_ids, PAD_ID), 4)
    together, _, _ = ce_bleu_loss(logits, refside, targets, 0.7, PAD_ID)
    (grad_together,) = torch.autograd.grad(together, logits)
    apart = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=PAD_ID) + 0.7 * bleu_loss(
        logits, refside, "expected", from_logits=True)[0]
    (grad_apart,) = torch.autograd.grad(apart, logits)
    assert abs(together.item() - apart.item()) < 1e-12, (together.item(), apart.item())
    assert torch.allclose(grad_together, grad_apart, rtol=0, atol=1e-12)


def rss_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (Linux >= 4.0)
        return True
    except OSError:
        return False


def cpu_busy_seconds() -> float | None:
    """Busy CPU time of the whole machine so far (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def make_inputs(shape, seed: int = 0):
    batch, seq, ref_len, vocab = shape
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=gen, dtype=torch.float32)
    ref_ids = torch.randint(1, vocab, (batch, 1, ref_len), generator=gen)  # one reference each
    return logits, ref_ids


def worker(shape, form: str, warmup: int, repeats: int, threads: int, min_time_s: float) -> dict:
    torch.set_num_threads(threads)
    logits, ref_ids = make_inputs(shape)
    logits.requires_grad_(True)
    t0 = time.perf_counter()
    refside = reference_side(strip_references(ref_ids, PAD_ID), 4)
    ref_prep_ms = (time.perf_counter() - t0) * 1e3
    batch, seq, _, vocab = shape
    targets = ref_ids[:, 0, :seq]
    if targets.shape[1] < seq:
        targets = F.pad(targets, (0, seq - targets.shape[1]), value=PAD_ID)

    def step():
        logits.grad = None
        if form == "cross_entropy":
            loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), ignore_index=PAD_ID)
        elif form == "ce_expected":
            loss, _, _ = ce_bleu_loss(logits, refside, targets, 1.0, PAD_ID)
        else:
            base = "expected" if form == "expected_lse" else form
            loss, _ = bleu_loss(logits, refside, base, from_logits=True, lse=(form == "expected_lse"))
        loss.backward()
        return loss.item()

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    # Fast shapes: more timed runs, so that they fill about `min_time_s` (a median of 7 runs of
    # a few milliseconds is mostly scheduler noise on 2 shared cores).
    per_run = (time.perf_counter() - t0) / max(1, warmup)
    if warmup > 0 and per_run > 0:
        repeats = max(repeats, min(500, math.ceil(min_time_s / per_run)))
    # Steady state: measure the peak over the timed runs only, from the resident size after the
    # warmup with logits.grad released (so the peak includes the gradient's allocation).
    logits.grad = None
    baseline_rss = rss_kib("VmRSS")
    hwm_reset = reset_peak_rss()
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    loss_value = None
    busy0, own0, wall0 = cpu_busy_seconds(), own_cpu_seconds(), time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        loss_value = step()
        times.append((time.perf_counter() - t0) * 1e3)
    busy1, own1, wall1 = cpu_busy_seconds(), own_cpu_seconds(), time.perf_counter()
    # Cores' worth of CPU used by other processes during the timed runs: on a 2-core machine
    # anything above ~0.1 means the numbers are contaminated (OpenMP threads get descheduled).
    other_load = None
    if busy0 is not None and busy1 is not None and wall1 - wall0 >= 0.5:  # jiffies are 10 ms
        other_load = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall1 - wall0)
    if hwm_reset:
        peak_kib = rss_kib("VmHWM") - baseline_rss
        peak_method = "VmHWM-VmRSS"
    else:
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - max(baseline_rss, maxrss_before)
        peak_method = "ru_maxrss"
    assert math.isfinite(loss_value) and torch.isfinite(logits.grad).all()
    logits_mib = logits.numel() * logits.element_size() / 2**20
    return {
        "shape": list(shape),
        "form": form,
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "runs_ms": times,
        "warmup": warmup,
        "repeats": repeats,
        "peak_mib": peak_kib / 1024,
        "peak_method": peak_method,
        "logits_mib": logits_mib,
        "peak_over_logits": (peak_kib / 1024) / logits_mib,
        "ref_prep_ms": ref_prep_ms,
        "other_load": other_load,
        "loss": loss_value,
    }


def parse_shapes(text: str):
    shapes = []
    for part in text.split(";"):
        dims = [int(x) for x in part.replace("x", ",").split(",") if x.strip()]
        if len(dims) != 4:
            raise SystemExit(f"--shapes: each shape is B,S,T,V; got {part!r}")
        shapes.append(tuple(dims))
    return shapes


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES, help="B,S,T,V shapes separated by ';'")
    parser.add_argument("--forms", default=",".join(TIMED_FORMS), help="comma-separated: " + ",".join(TIMED_FORMS))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="seconds the timed runs should fill at least (adds repeats for fast shapes)")
    parser.add_argument("--json", default=DEFAULT_JSON, help="write the results here ('' to skip)")
    parser.add_argument("--check-only", action="store_true", help="run the self-check and exit")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker(tuple(spec["shape"]), spec["form"], args.warmup, args.repeats, args.threads,
                                args.min_time)))
        return

    torch.set_num_threads(args.threads)
    if not args.skip_check:
        t0 = time.perf_counter()
        self_check()
        print(f"self-check passed ({time.perf_counter() - t0:.1f} s): one-hot statistics exact for "
              f"{', '.join(FORMS)}; loss = pure-Python -log BLEU; gradcheck through softmax (f64)")
    if not args.skip_check:
        check_ce_bleu()
        print("ce_bleu_loss = F.cross_entropy + expected bleu_loss computed apart (f64, values and gradients)")
    if args.check_only:
        return

    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    for form in forms:
        if form not in TIMED_FORMS:
            raise SystemExit(f"--forms: unknown form {form!r} (choose from {', '.join(TIMED_FORMS)})")
    results = []
    header = (f"{'shape [B,S,T,V]':<22} {'form':<14} {'median ms':>10} {'min ms':>9} {'runs':>5} {'peak MiB':>9} "
              f"{'peak/logits':>11} {'other load':>10}")
    print(f"torch {torch.__version__}, {args.threads} threads, f32, forward+backward, "
          f"warmup {args.warmup}, median of {args.repeats} (more for runs under {args.min_time} s in all)")
    print(header)
    print("-" * len(header))
    for shape in parse_shapes(args.shapes):
        for form in forms:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps({"shape": shape, "form": form}),
                   "--warmup", str(args.warmup), "--repeats", str(args.repeats), "--threads", str(args.threads),
                   "--min-time", str(args.min_time)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"worker for {shape} {form} failed:\n{proc.stderr}")
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            results.append(row)
            print(f"{str(list(shape)):<22} {form:<14} {row['median_ms']:>10.1f} {row['min_ms']:>9.1f} "
                  f"{row['repeats']:>5} "
                  f"{row['peak_mib']:>9.0f} {row['peak_over_logits']:>11.2f} "
                  f"{'-' if row['other_load'] is None else format(row['other_load'], '.2f'):>10}",
                  flush=True)
    if args.json:
        doc = {
            "torch_version": torch.__version__,
            "python": platform.python_version(),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "threads": args.threads,
            "dtype": "f32",
            "max_order": 4,
            "smoothing": "add-k 1 (orders >= 2)",
            "reduction": "corpus",
            "length_model": "given (all S)",
            "measure": "forward+backward from logits; median of repeats after warmup; "
                       "peak = peak RSS during the timed runs minus RSS before them (after warmup, "
                       "logits.grad released); other_load = cores used by other processes meanwhile",
            "results": results,
            "median_ms": {"x".join(map(str, r["shape"])): {} for r in results},
        }
        for r in results:
            doc["median_ms"]["x".join(map(str, r["shape"]))][r["form"]] = r["median_ms"]
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
