//! The expected n-gram statistics of CTC outputs ([`crate::loss::kernels::ctc::ngrams`]) as composed candle ops:
//! the same programs, frame by frame, on `[B, K]` and `[B, V]` tensors, with candle's autograd
//! for the backward. The reference the CPU kernel is tested against, and what runs on devices
//! without it. Its output has the op's layout, `[B, 1 + N + N·W]`.

use crate::loss::kernels::ctc::ngrams::{CtcNgramPlan, NO_NODE};
use candle_core::{DType, Device, IndexOp, Result, Tensor, D};

/// The statistics of `logits` (float `[B, T', V]`) under `plan`; `frame_mask` is `[B, T']` in the
/// logits' dtype, 1 at the frames each element uses and 0 beyond.
pub(crate) fn ctc_ngram_expectations_composed(
    logits: &Tensor,
    frame_mask: &Tensor,
    plan: &CtcNgramPlan,
) -> Result<Tensor> {
    let (batch, frames, vocab) = logits.dims3()?;
    let (dtype, device) = (logits.dtype(), logits.device());
    let blank = plan.blank;
    // Padding frames may hold anything (NaN too): zeroed before the softmax, whose backward
    // would otherwise spread NaN into their gradient (a `where` passes none back to them).
    let in_use = frame_mask
        .to_dtype(DType::U8)?
        .unsqueeze(2)?
        .broadcast_as((batch, frames, vocab))?;
    let logits = in_use.where_cond(logits, &logits.zeros_like()?)?;
    let probs = candle_nn::ops::softmax(&logits, D::Minus1)?;
    // A frame beyond the length becomes a certain blank, which changes no statistic.
    let blank_row = one_hot(vocab, blank, dtype, device)?.reshape((1, 1, vocab))?;
    let mask = frame_mask.unsqueeze(2)?;
    let probs = probs
        .broadcast_mul(&mask)?
        .broadcast_add(&blank_row.broadcast_mul(&mask.affine(-1.0, 1.0)?)?)?;
    let blank_probs = probs.narrow(2, blank, 1)?.squeeze(2)?; // [B, T']
    let nonblank = probs.broadcast_mul(&blank_row.affine(-1.0, 1.0)?)?;

    // E[L] = Σ_t Σ_v q_t(v) (1 − q_{t−1}(v)).
    let previous = Tensor::zeros((batch, 1, vocab), dtype, device)?
        .concat_or_keep(&nonblank.narrow(1, 0, frames.saturating_sub(1))?)?;
    let length = nonblank
        .mul(&previous.affine(-1.0, 1.0)?)?
        .sum((1, 2))?
        .unsqueeze(1)?;

    let totals = totals(&nonblank, &blank_probs, &length.squeeze(1)?, plan)?;
    let counts = node_counts(&nonblank, &blank_probs, plan)?;
    Tensor::cat(&[length, totals, counts], 1)
}

trait ConcatOrKeep: Sized {
    fn concat_or_keep(&self, rest: &Tensor) -> Result<Tensor>;
}

impl ConcatOrKeep for Tensor {
    /// `[self; rest]` along the frames, `self` alone when `rest` has no frame.
    fn concat_or_keep(&self, rest: &Tensor) -> Result<Tensor> {
        if rest.dim(1)? == 0 {
            Ok(self.clone())
        } else {
            Tensor::cat(&[self, rest], 1)
        }
    }
}

fn one_hot(vocab: usize, index: usize, dtype: DType, device: &Device) -> Result<Tensor> {
    let mut values = vec![0f32; vocab];
    values[index] = 1.0;
    Tensor::from_vec(values, vocab, device)?.to_dtype(dtype)
}

/// `t_n = max(E[L] − (n − 1) + Σ_{ℓ < n−1} P(L = ℓ)(n − 1 − ℓ), 0)`: `[B, N]`, from the
/// count-capped program; `length` is `E[L]`, `[B]`.
fn totals(
    nonblank: &Tensor,
    blank_probs: &Tensor,
    length: &Tensor,
    plan: &CtcNgramPlan,
) -> Result<Tensor> {
    let (batch, frames, vocab) = nonblank.dims3()?;
    let (dtype, device) = (nonblank.dtype(), nonblank.device());
    let counts = plan.max_order.saturating_sub(1); // P(L = ℓ) for ℓ = 0..=N−2
    let mut probability_of_count = Vec::with_capacity(counts);
    if counts > 0 {
        let zero = Tensor::zeros((batch, 1), dtype, device)?;
        let mut gap = vec![zero.clone(); counts];
        gap[0] = Tensor::ones((batch, 1), dtype, device)?;
        let mut runs = vec![zero.clone(); counts];
        let mut in_run = vec![Tensor::zeros((batch, vocab), dtype, device)?; counts];
        for t in 0..frames {
            let q = nonblank.i((.., t, ..))?;
            let b = blank_probs.i((.., t))?.unsqueeze(1)?;
            let mut next_in = in_run.clone();
            for c in 1..counts {
                let entering = (&gap[c - 1] + &runs[c - 1])?;
                let mut x = in_run[c].broadcast_add(&entering)?;
                if c > 1 {
                    x = (x - &in_run[c - 1])?;
                }
                next_in[c] = q.mul(&x)?;
            }
            let next_gap: Vec<Tensor> = (0..counts)
                .map(|c| b.mul(&(&gap[c] + &runs[c])?))
                .collect::<Result<_>>()?;
            in_run = next_in;
            gap = next_gap;
            runs = std::iter::once(Ok(zero.clone()))
                .chain((1..counts).map(|c| in_run[c].sum_keepdim(1)))
                .collect::<Result<_>>()?;
        }
        for c in 0..counts {
            probability_of_count.push((&gap[c] + &runs[c])?.squeeze(1)?);
        }
    }
    let mut totals = Vec::with_capacity(plan.max_order);
    for order in 1..=plan.max_order {
        let mut total = length.affine(1.0, -((order - 1) as f64))?;
        for (count, p) in probability_of_count.iter().enumerate().take(order - 1) {
            total = (total + p.affine((order - 1 - count) as f64, 0.0)?)?;
        }
        totals.push(total.relu()?);
    }
    Tensor::stack(&totals, 1)
}

/// The expected count at every output slot: `[B, N·W]`.
fn node_counts(nonblank: &Tensor, blank_probs: &Tensor, plan: &CtcNgramPlan) -> Result<Tensor> {
    let (batch, frames, _) = nonblank.dims3()?;
    let (dtype, device) = (nonblank.dtype(), nonblank.device());
    let most = plan
        .elements
        .iter()
        .map(|e| e.nodes.len())
        .max()
        .unwrap_or(0)
        .max(1);
    // Padding nodes read token 0 with root parents; no slot reads them.
    let mut tokens = vec![0u32; batch * most];
    let mut parents = vec![0u32; batch * most];
    let mut root = vec![0f32; batch * most];
    let mut after_other = vec![0f32; batch * most];
    let slots_per_element = plan.max_order * plan.width;
    let mut slot_nodes = vec![0u32; batch * slots_per_element];
    let mut slot_used = vec![0f32; batch * slots_per_element];
    for (b, element) in plan.elements.iter().enumerate() {
        for k in 0..most {
            let i = b * most + k;
            match element.nodes.get(k) {
                Some(node) if !node.is_root() => {
                    tokens[i] = node.token;
                    parents[i] = node.parent;
                    after_other[i] = f32::from(u8::from(!node.repeats_parent));
                }
                Some(node) => {
                    tokens[i] = node.token;
                    parents[i] = k as u32;
                    root[i] = 1.0;
                }
                None => {
                    parents[i] = k as u32;
                    root[i] = 1.0;
                }
            }
        }
        for (j, &slot) in element.slots.iter().enumerate() {
            if slot != NO_NODE {
                slot_nodes[b * slots_per_element + j] = slot;
                slot_used[b * slots_per_element + j] = 1.0;
            }
        }
    }
    let float = |values: Vec<f32>, shape: (usize, usize)| {
        Tensor::from_vec(values, shape, device)?.to_dtype(dtype)
    };
    let tokens = Tensor::from_vec(tokens, (batch, 1, most), device)?
        .broadcast_as((batch, frames, most))?
        .contiguous()?;
    let parents = Tensor::from_vec(parents, (batch, most), device)?;
    let root = float(root, (batch, most))?;
    let after_other = float(after_other, (batch, most))?;
    // q_t(g_k) for every node: [B, T', K].
    let token_probs = nonblank.gather(&tokens, 2)?;
    let zero = Tensor::zeros((batch, most), dtype, device)?;
    let (mut in_run, mut gap, mut count) = (zero.clone(), zero.clone(), zero.clone());
    let mut previous = zero;
    for t in 0..frames {
        let q = token_probs.i((.., t, ..))?;
        let b = blank_probs.i((.., t))?.unsqueeze(1)?;
        let from_parent =
            (in_run.gather(&parents, 1)?.mul(&after_other)? + gap.gather(&parents, 1)?)?;
        let ready = (root.mul(&previous.affine(-1.0, 1.0)?)?
            + root.affine(-1.0, 1.0)?.mul(&from_parent)?)?;
        count = (count + q.mul(&ready)?)?;
        let next_gap = b.broadcast_mul(&(&in_run + &gap)?)?;
        in_run = q.mul(&(&in_run + &ready)?)?;
        gap = next_gap;
        previous = q;
    }
    let slot_nodes = Tensor::from_vec(slot_nodes, (batch, slots_per_element), device)?;
    count
        .gather(&slot_nodes, 1)?
        .mul(&float(slot_used, (batch, slots_per_element))?)
}
