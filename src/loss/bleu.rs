//! The BLEU loss's own entry points: [`bleu_loss`] on probabilities and
//! [`bleu_loss_from_logits`] on logits. Each validates its arguments once (`pipeline`) and runs
//! the pass and the statistics.

use super::config::{BleuLossConfig, BleuLossOutput};
use super::pipeline::{
    check_finite, check_inputs, finish, hypothesis_inputs_from_probs, hypothesis_pass,
};
use super::references::References;
use candle_core::{Result, Tensor};

/// `-log BLEU` of hypothesis distributions against references (docs/loss.md).
///
/// # Arguments
/// * `hyp_probs` - float `[B, S, V]`: one distribution per hypothesis position (a softmax
///   output; a one-hot row is a hard token). f32 and f64 are computed in their dtype, f16 and
///   bf16 in f32. Use `candle_nn::ops::softmax(x, D::Minus1)`, not `softmax_last_dim`, which
///   has no backward: or pass logits to [`bleu_loss_from_logits`].
/// * `hyp_lengths` - u32 `[B]`, each `<= S`; `None` = `S`. Must be `None` with `SoftEos`.
/// * `refs` - [`References`] of the same batch, on the same device.
/// * `cfg` - form, length model, reduction, smoothing, orders and weights.
///
/// Errors (naming the argument and its shape or value) on a wrong rank or dtype, a batch or
/// vocabulary mismatch, an id or `eos_id` outside the vocabulary, lengths above `S`, an invalid
/// config, or NaN/Inf in `hyp_probs`.
pub fn bleu_loss(
    hyp_probs: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let compute_dtype = check_inputs("hyp_probs", hyp_probs, hyp_lengths, refs, cfg)?;
    let probs = hyp_probs.to_dtype(compute_dtype)?;
    check_finite("hyp_probs", &probs, cfg)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), compute_dtype)?;
    let inputs = hypothesis_inputs_from_probs(&probs, &side, cfg)?;
    finish(inputs, &side, hyp_lengths, cfg)
}

/// [`bleu_loss`] of `softmax(logits)`, with the same numbers and gradients, computed by fused
/// kernels.
///
/// For id references with the `Expected` or `LowerBound` form, one CPU kernel reads the
/// softmax probabilities at the reference ids (and EOS) straight from the logits, and its
/// backward writes the logits gradient in one pass: the `[B, S, V]` softmax is never stored.
/// The paired form and matrix references need every probability: they use a fused softmax with
/// a hand-written backward. Off the CPU, composed candle ops give the same numbers.
///
/// # Arguments
/// * `logits` - float `[B, S, V]`; the rest as [`bleu_loss`]. NaN or Inf in `logits` is an error.
pub fn bleu_loss_from_logits(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let compute_dtype = check_inputs("logits", logits, hyp_lengths, refs, cfg)?;
    let logits = logits.to_dtype(compute_dtype)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), compute_dtype)?;
    let (inputs, _) = hypothesis_pass(&logits, &side, cfg, None)?;
    finish(inputs, &side, hyp_lengths, cfg)
}
