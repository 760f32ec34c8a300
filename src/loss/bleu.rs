//! The BLEU loss's own entry points: [`bleu_loss`] on probabilities, [`bleu_loss_from_logits`]
//! on logits, and its composed reference [`bleu_loss_from_logits_composed`]: wrappers over the
//! one path (`run::bleu`), which checks the arguments once, runs the pass and the statistics,
//! and scores them.

use super::checked::Hypotheses;
use super::config::{BleuLossConfig, BleuLossOutput};
use super::dispatch::Path;
use super::reduce::Reducer;
use super::references::References;
use super::run;
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
    // No kernel reads probabilities: composed ops, and the finiteness check they need.
    let input = Hypotheses::Probs(hyp_probs);
    run::bleu(
        input,
        hyp_lengths,
        refs,
        cfg,
        Path::Composed,
        Reducer::Local,
    )
}

/// [`bleu_loss`] of `softmax(logits)`, with the same numbers and gradients, computed by fused
/// kernels.
///
/// For id references with the `Expected` or `LowerBound` form, one CPU kernel reads the
/// softmax probabilities at the reference ids (and EOS) straight from the logits, and its
/// backward writes the logits gradient in one pass: the `[B, S, V]` softmax is never stored.
/// The paired form and matrix references need every probability: they use a fused softmax with
/// a hand-written backward. On CUDA the crate's CUDA kernels do the same (the `cuda` feature);
/// elsewhere composed candle ops give the same numbers ([`bleu_loss_from_logits_composed`]).
///
/// # Arguments
/// * `logits` - float `[B, S, V]`; the rest as [`bleu_loss`]. NaN or Inf in `logits` is an error.
pub fn bleu_loss_from_logits(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let path = Path::for_device(logits.device());
    run::bleu(
        Hypotheses::Logits(logits),
        hyp_lengths,
        refs,
        cfg,
        path,
        Reducer::Local,
    )
}

/// [`bleu_loss_from_logits`] as composed candle ops (`candle_nn::ops::softmax`, a gather,
/// matrix products), never the crate's kernels: the reference the kernels are tested against
/// (as candle-nn's `rms_norm_slow` is for `rms_norm`), and what devices without kernels run.
/// The same values and gradients to rounding; it stores the `[B, S, V]` softmax.
///
/// ```
/// use candle_bleu::loss::{bleu_loss_from_logits, bleu_loss_from_logits_composed, BleuLossConfig, References};
/// use candle_core::{Device, Tensor};
/// let refs = References::from_ids(&Tensor::new(&[[1u32, 2, 3, 4]], &Device::Cpu)?, 0)?;
/// let logits = Tensor::randn(0f64, 1.0, (1, 4, 6), &Device::Cpu)?;
/// let cfg = BleuLossConfig::default();
/// let fused = bleu_loss_from_logits(&logits, None, &refs, &cfg)?.loss.to_scalar::<f64>()?;
/// let composed = bleu_loss_from_logits_composed(&logits, None, &refs, &cfg)?.loss.to_scalar::<f64>()?;
/// assert!((fused - composed).abs() < 1e-12);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn bleu_loss_from_logits_composed(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let input = Hypotheses::Logits(logits);
    run::bleu(
        input,
        hyp_lengths,
        refs,
        cfg,
        Path::Composed,
        Reducer::Local,
    )
}
