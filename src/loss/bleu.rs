//! The BLEU loss's own entry points: [`bleu_loss`] on probabilities, [`bleu_loss_from_logits`]
//! on logits, and its composed reference [`bleu_loss_from_logits_composed`]: wrappers over the
//! one path (`run::bleu`), which checks the arguments once, runs the pass and the statistics,
//! and scores them; and [`loss_from_stats`], the loss from statistics a caller gives (checked,
//! then reduced and scored as the one path does).

use super::checked::hypotheses::Hypotheses;
use super::checked::stats::stats_call;
use super::config::{BleuLossConfig, BleuLossOutput, BleuStats};
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

/// The loss `-log BLEU` from per-element statistics (docs/loss.md, §Score and loss).
///
/// # Arguments
/// * `stats` - [`BleuStats`]: `matches` and `totals` float `[B, N]` (`m_n` and `t_n` of each
///   element), `hyp_len` and `ref_len` float `[B]` (`c` and the effective reference length),
///   all on one device.
/// * `cfg` - `max_order` (= N), weights, smoothing, reduction and `check_values` are used.
///
/// `Corpus` sums the statistics over the batch and scores once; `SentenceMean` scores each
/// element and averages the losses. Returns a scalar in the dtype of `matches` (f32 for f16
/// and bf16 statistics, which are upcast). The score runs in f64 where the device has it and
/// in f32 on Metal, with the same guards (tiny totals and matches count as zero, ratios are
/// floored at [`PRECISION_FLOOR`](crate::loss::PRECISION_FLOOR)).
///
/// Errors (naming the argument and its shape or dtype) on wrong shapes, an empty batch,
/// non-float statistics, statistics on different devices, an invalid config, or NaN or
/// infinite values — checked in place on the CPU; on other devices only with
/// `cfg.check_values` (one device-to-host copy per statistic), since the check needs the data
/// on the host.
///
/// Because the corpus loss depends on the batch only through these sums, data-parallel
/// workers can all-reduce (sum) their statistics and call this on the totals: every worker
/// gets the same loss, and the gradient flows back to its own shard's statistics.
///
/// ```
/// use candle_bleu::loss::{bleu_loss_from_logits, loss_from_stats, BleuLossConfig, BleuStats, References};
/// use candle_core::{DType, Device, Tensor};
///
/// let dev = Device::Cpu;
/// let cfg = BleuLossConfig::default();
/// let ids = Tensor::new(&[[1u32, 2, 3, 4], [2, 3, 4, 5]], &dev)?;
/// let logits = Tensor::randn(0f32, 1., (2, 4, 6), &dev)?;
/// // Two workers, one element each: each computes its shard's statistics...
/// let shard = |b: usize| -> candle_core::Result<BleuStats> {
///     let refs = References::from_ids(&ids.narrow(0, b, 1)?, 0)?;
///     Ok(bleu_loss_from_logits(&logits.narrow(0, b, 1)?, None, &refs, &cfg)?.stats)
/// };
/// let (a, b) = (shard(0)?, shard(1)?);
/// // ...the statistics are all-reduced (summed over workers; here: concatenated)...
/// let cat = |x: &Tensor, y: &Tensor| Tensor::cat(&[x, y], 0);
/// let all = BleuStats {
///     matches: cat(&a.matches, &b.matches)?,
///     totals: cat(&a.totals, &b.totals)?,
///     hyp_len: cat(&a.hyp_len, &b.hyp_len)?,
///     ref_len: cat(&a.ref_len, &b.ref_len)?,
/// };
/// // ...and every worker scores the same corpus: the full batch's loss.
/// let reduced = loss_from_stats(&all, &cfg)?.to_scalar::<f32>()?;
/// let refs = References::from_ids(&ids, 0)?;
/// let full = bleu_loss_from_logits(&logits, None, &refs, &cfg)?.loss.to_scalar::<f32>()?;
/// assert!((reduced - full).abs() < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn loss_from_stats(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<Tensor> {
    stats_call(stats, cfg)?;
    Reducer::Local.bleu_loss(stats, cfg, Path::for_device(stats.matches.device()))
}
