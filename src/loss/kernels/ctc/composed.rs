//! The CTC loss as composed candle ops: the forward recursion `α` in log space, one step per
//! frame on `[B, S]` tensors, with candle's autograd for the gradient. What devices without the
//! CTC kernel run, and the reference the kernel ([`crate::loss::kernels::ctc::op`]) is tested against. Correct,
//! not fast: `T'` steps of a few small ops each.
//!
//! "Zero" in log space is a large finite negative number here ([`LOG_ZERO`]), not `-inf`: a
//! log-sum-exp over `-inf` entries, or its gradient, would be NaN. Inputs are clamped to it from
//! below (a `-inf` log-probability becomes `LOG_ZERO`, whose gradient is 0 there), and an
//! element whose log-likelihood is below `LOG_ZERO / 2` has no alignment: its loss is `+inf` (or
//! 0 under `zero_infinity`) with a zero gradient, as in the kernel.

use crate::loss::kernels::ctc::op::{can_skip, CtcAlignments};
use candle_core::{DType, Device, Result, Shape, Tensor, D};

/// `log 0` in the composed recursion: far below any log-likelihood of a possible alignment
/// (`T'` frames of probability `1e-38` are `-87 T'`), far above f32's lowest value.
const LOG_ZERO: f64 = -1e30;

/// `log(e^a + e^b + e^c)` elementwise, with the maximum detached (its gradient cancels).
fn log_add3(a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    let stacked = Tensor::stack(&[a, b, c], D::Minus1)?;
    let max = stacked.max_keepdim(D::Minus1)?.detach();
    stacked
        .broadcast_sub(&max)?
        .exp()?
        .sum_keepdim(D::Minus1)?
        .log()?
        .add(&max)?
        .squeeze(D::Minus1)
}

/// `alpha` shifted right by `k` states along dimension 1, filled with [`LOG_ZERO`].
fn shifted(alpha: &Tensor, k: usize) -> Result<Tensor> {
    let (batch, states) = alpha.dims2()?;
    let width = k.min(states);
    let fill = table(
        vec![LOG_ZERO; batch * width],
        (batch, width),
        alpha.dtype(),
        alpha.device(),
    )?;
    if k >= states {
        return Ok(fill);
    }
    Tensor::cat(&[&fill, &alpha.narrow(1, 0, states - k)?], 1)
}

/// Host values as a tensor of `dtype` on `device`, converted on the host: no f64 tensor is
/// made on the device unless `dtype` is f64 (Metal has none; the rule of `config::constant`,
/// which the kernels do not import).
fn table(
    values: Vec<f64>,
    shape: impl Into<Shape>,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    match dtype {
        DType::F64 => Tensor::from_vec(values, shape, device),
        _ => Tensor::from_vec(
            values.into_iter().map(|v| v as f32).collect::<Vec<f32>>(),
            shape,
            device,
        )?
        .to_dtype(dtype),
    }
}

/// `x` (`[B, T', V]`) with the frames at and beyond each element's input length replaced by 0:
/// they are padding, never part of the loss, and whatever they hold (NaN included) must not
/// reach the loss or the gradient (a `where` passes none back to them). `x` itself when no
/// element is shorter than `T'`.
pub(crate) fn without_padding_frames(x: &Tensor, input_lengths: &[usize]) -> Result<Tensor> {
    let (batch, frames, vocab) = x.dims3()?;
    if input_lengths.iter().all(|&l| l >= frames) {
        return Ok(x.clone());
    }
    let active: Vec<u8> = input_lengths
        .iter()
        .flat_map(|&l| (0..frames).map(move |t| u8::from(t < l)))
        .collect();
    let active = Tensor::from_vec(active, (batch, frames, 1), x.device())?
        .broadcast_as((batch, frames, vocab))?;
    active.where_cond(x, &x.zeros_like()?)
}

/// The CTC loss of each element, `[B]`, of log-probabilities `[B, T', V]` (f32 or f64) under
/// checked `alignments`, as composed candle ops.
pub(crate) fn ctc_losses(log_probs: &Tensor, alignments: &CtcAlignments) -> Result<Tensor> {
    let (batch, frames, _) = log_probs.dims3()?;
    let (dtype, device) = (log_probs.dtype(), log_probs.device());
    let extended: Vec<Vec<u32>> = (0..batch).map(|b| alignments.extended(b)).collect();
    let states = extended.iter().map(Vec::len).max().unwrap_or(1);
    // Per element and state: the label, whether a skip from s − 2 is allowed, the first frame's
    // states and the final states (0 or LOG_ZERO).
    let mut labels = vec![alignments.blank; batch * states];
    let mut skip = vec![LOG_ZERO; batch * states];
    let mut first = vec![LOG_ZERO; batch * states];
    let mut last = vec![LOG_ZERO; batch * states];
    for (b, ext) in extended.iter().enumerate() {
        let row = b * states;
        labels[row..row + ext.len()].copy_from_slice(ext);
        for s in 0..ext.len() {
            if can_skip(ext, s, alignments.blank) {
                skip[row + s] = 0.0;
            }
        }
        for s in 0..ext.len().min(2) {
            first[row + s] = 0.0;
        }
        for s in ext.len().saturating_sub(2)..ext.len() {
            last[row + s] = 0.0;
        }
    }
    let skip = table(skip, (batch, states), dtype, device)?;
    let first = table(first, (batch, states), dtype, device)?;
    let last = table(last, (batch, states), dtype, device)?;
    let index = Tensor::from_vec(labels, (batch, 1, states), device)?
        .broadcast_as((batch, frames, states))?
        .contiguous()?;
    // Emissions log y_t(l'_s), [B, T', S].
    let emissions = log_probs.maximum(LOG_ZERO)?.gather(&index, 2)?;
    let mut alpha = (emissions.narrow(1, 0, 1)?.squeeze(1)? + first)?;
    for t in 1..frames {
        let active: Vec<u8> = alignments
            .input_lengths
            .iter()
            .map(|&l| u8::from(t < l))
            .collect();
        if !active.contains(&1) {
            break;
        }
        let active = Tensor::from_vec(active, (batch, 1), device)?.broadcast_as((batch, states))?;
        let step = log_add3(
            &alpha,
            &shifted(&alpha, 1)?,
            &(shifted(&alpha, 2)? + &skip)?,
        )?;
        let next = (step + emissions.narrow(1, t, 1)?.squeeze(1)?)?;
        alpha = active.where_cond(&next, &alpha)?;
    }
    let log_likelihood = (alpha + last)?.log_sum_exp(1)?;
    let impossible = log_likelihood.lt(LOG_ZERO / 2.0)?;
    let fill = if alignments.zero_infinity {
        0.0
    } else {
        f64::INFINITY
    };
    let fill = table(vec![fill; batch], batch, dtype, device)?;
    impossible.where_cond(&fill, &log_likelihood.neg()?)
}
