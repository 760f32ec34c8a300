//! The kernels' row computations as composed candle ops: what devices without the crate's
//! kernels run, and the reference the kernels are tested against. The same numbers to rounding.

use crate::loss::kernels::cpu::CrossEntropyTerms;
use candle_core::{DType, Result, Tensor, D};

/// `probs[b, i, ids[b, k]]`: `[B, S, K]` from `[B, S, V]` probabilities and u32 `[B, K]` ids.
pub(crate) fn gather_columns(probs: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (batch, seq, _) = probs.dims3()?;
    let width = ids.dim(1)?;
    let index = ids
        .unsqueeze(1)?
        .broadcast_as((batch, seq, width))?
        .contiguous()?;
    probs.gather(&index, 2)
}

/// `(safe_targets, pad_mask)` of checked targets: pad positions replaced by 0 in
/// `safe_targets`, and `pad_mask` u8, 1 at non-pad positions.
pub(crate) fn masked_targets(targets: &Tensor, pad_id: Option<u32>) -> Result<(Tensor, Tensor)> {
    let pad_mask = match pad_id {
        Some(pad) => targets.ne(pad)?,
        None => targets.ones_like()?.to_dtype(DType::U8)?,
    };
    let safe_targets = pad_mask.where_cond(targets, &targets.zeros_like()?)?;
    Ok((safe_targets, pad_mask))
}

/// Each position's cross-entropy term `[B, S]`, 0 at padding:
/// `(1 − ε)·(−log p[t]) + ε·mean_v(−log p[v]) + λ·lse²` (the z-loss when `λ ≠ 0`); with class
/// weights `w`, `(1 − ε)·w_t·(−log p[t]) + (ε/V)·Σ_v w_v·(−log p[v]) + z_ratio·λ·lse²`
/// (`z_ratio` weighs the z-term against the weighted mean's denominator, 1 otherwise).
pub(crate) fn token_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    terms: &CrossEntropyTerms,
    z_ratio: f64,
) -> Result<Tensor> {
    let dtype = logits.dtype();
    let (safe_targets, pad_mask) = masked_targets(targets, terms.pad_id)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let target_log_probs = log_probs
        .gather(&safe_targets.unsqueeze(2)?, 2)?
        .squeeze(2)?;
    let eps = terms.label_smoothing;
    let mut row_loss = match &terms.class_weights {
        None => {
            let mut row_loss = target_log_probs.affine(-(1.0 - eps), 0.0)?;
            if eps != 0.0 {
                row_loss = (row_loss - log_probs.mean(2)?.affine(eps, 0.0)?)?;
            }
            row_loss
        }
        Some(weights) => {
            let vocab = weights.len();
            let weights = class_weight_tensor(weights, dtype, logits.device())?;
            let target_weights = weights
                .index_select(&safe_targets.flatten_all()?, 0)?
                .reshape(safe_targets.shape())?;
            let mut row_loss = (target_log_probs * target_weights)?.affine(-(1.0 - eps), 0.0)?;
            if eps != 0.0 {
                let smooth = log_probs.broadcast_mul(&weights)?.sum(2)?;
                row_loss = (row_loss - smooth.affine(eps / vocab as f64, 0.0)?)?;
            }
            row_loss
        }
    };
    if terms.z_loss != 0.0 {
        // PaLM's z-loss, λ·lse² per position (Liger's `lse_square_scale`).
        let lse = logits.log_sum_exp(D::Minus1)?;
        let scale = if terms.class_weights.is_some() {
            terms.z_loss * z_ratio
        } else {
            terms.z_loss
        };
        row_loss = (row_loss + lse.sqr()?.affine(scale, 0.0)?)?;
    }
    let weights = pad_mask.to_dtype(dtype)?;
    row_loss * &weights
}

/// The metric columns of rows of logits `[.., V]`, detached: `λ·lse²` and 1 where the target is
/// the argmax (candle's `argmax`: on the CPU the first index among equal maxima), each times
/// `mask` (1 at the positions that count, 0 at padding); `safe_targets` `[..]` u32 (padding
/// replaced by any id).
pub(crate) fn token_metrics(
    logits: &Tensor,
    safe_targets: &Tensor,
    mask: &Tensor,
    z_loss: f64,
) -> Result<(Tensor, Tensor)> {
    let logits = logits.detach();
    let lse = logits.log_sum_exp(D::Minus1)?;
    let z = (lse.sqr()?.affine(z_loss, 0.0)? * mask)?;
    let correct = logits
        .argmax(D::Minus1)?
        .eq(safe_targets)?
        .to_dtype(logits.dtype())?;
    Ok((z, (correct * mask)?))
}

/// Logit soft-capping as candle ops, `c·tanh(z/c)` (Gemma 2's; Liger-Kernel's `softcap`),
/// differentiable: what the logits entry points apply before their pass, and the composed
/// hidden-state rows to each block.
pub(crate) fn softcap(logits: &Tensor, cap: f64) -> Result<Tensor> {
    logits.affine(1.0 / cap, 0.0)?.tanh()?.affine(cap, 0.0)
}

/// The class weights `[V]` in `dtype` on `device`, converted on the host (no f64 tensor on a
/// device without f64).
pub(crate) fn class_weight_tensor(
    weights: &[f64],
    dtype: DType,
    device: &candle_core::Device,
) -> Result<Tensor> {
    match dtype {
        DType::F64 => Tensor::from_slice(weights, weights.len(), device),
        _ => {
            let values: Vec<f32> = weights.iter().map(|&w| w as f32).collect();
            Tensor::from_vec(values, weights.len(), device)?.to_dtype(dtype)
        }
    }
}
