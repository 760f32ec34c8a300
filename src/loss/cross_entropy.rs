//! Token-level cross-entropy from logits, fused: PyTorch's
//! `F.cross_entropy(logits, targets, ignore_index = pad, label_smoothing = ε)` in one read of the
//! logits forward and one write of their gradient backward.
//!
//! [`cross_entropy_from_logits_composed`] is its composed reference. The row kernel it runs
//! (`kernels`, through `run::cross_entropy` and `pipeline::logits_pass`) also serves
//! [`ce_bleu_from_logits`](super::ce_bleu_from_logits): the same row pass gathers the softmax at
//! the reference ids, so that one custom op carries both the cross-entropy terms and the BLEU
//! token matches, and its backward receives both gradients in one call.

use super::checked::hypotheses::Hypotheses;
use super::config::{CrossEntropyConfig, CrossEntropyOutput};
use super::dispatch::Path;
use super::reduce::Reducer;
use super::run;
use candle_core::{Result, Tensor};

/// Mean cross-entropy of `softmax(logits)` against `targets`: PyTorch's
/// `F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index = pad_id,
/// label_smoothing = ε)`.
///
/// `loss = (1/n) Σ_{(b,i): t ≠ pad} [(1 − ε)·(−log p[t]) + ε·mean_v(−log p[v])]`, with `n` the
/// number of non-pad positions. At `ε = 0` without padding it equals
/// `candle_nn::loss::cross_entropy` on the flattened logits.
///
/// On the CPU one custom op reads the logits once (online softmax per row: log-sum-exp, target
/// logit, mean logit) and its hand-written backward writes the logits gradient in one pass; no
/// `[B, S, V]` intermediate is stored. On CUDA the crate's CUDA kernels do the same (the `cuda`
/// feature); elsewhere composed candle ops give the same numbers
/// ([`cross_entropy_from_logits_composed`]).
///
/// # Arguments
/// * `logits` - float `[B, S, V]`; f32 and f64 are computed in their dtype, f16 and bf16 in f32.
/// * `targets` - u32 `[B, S]`, each `< V` or equal to `cfg.pad_id`; not all padding.
/// * `cfg` - padding id and label smoothing `ε ∈ [0, 1)`.
///
/// Returns the loss ([`CrossEntropyOutput::loss`]: a scalar, or `[B, S]` with `reduction`
/// `None`, in the compute dtype) and, when `cfg` asks for them, the z-loss's part of it and the
/// token accuracy, computed in the same pass. Errors (naming the argument and its shape or
/// value) on a wrong rank, dtype or shape, a target outside the vocabulary, an all-padding
/// batch under `Mean` (or with `token_accuracy`), `ε` outside `[0, 1)`, a negative or
/// non-finite `z_loss`, or NaN/Inf in `logits`.
///
/// ```
/// use candle_bleu::loss::{cross_entropy_from_logits, CrossEntropyConfig};
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[[2f32, 0.0, 0.0], [0.0, 0.0, 0.0]]], &Device::Cpu)?;
/// let targets = Tensor::new(&[[0u32, 2]], &Device::Cpu)?;
/// let cfg = CrossEntropyConfig { pad_id: Some(2), ..Default::default() };
/// let loss = cross_entropy_from_logits(&logits, &targets, &cfg)?.loss.to_scalar::<f32>()?;
/// // Only position 0 counts: -log(e² / (e² + 2)).
/// assert!((loss - (1.0 + 2.0 * (-2f32).exp()).ln()).abs() < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn cross_entropy_from_logits(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<CrossEntropyOutput> {
    let path = Path::for_device(logits.device());
    run::cross_entropy(
        Hypotheses::Logits(logits),
        targets,
        cfg,
        path,
        Reducer::Local,
    )
}

/// [`cross_entropy_from_logits`] as composed candle ops (`candle_nn::ops::log_softmax`, a
/// gather, a masked mean), never the crate's kernels: the reference the kernels are tested
/// against, and what devices without kernels run. The same value and gradient to rounding; it
/// stores the `[B, S, V]` log-probabilities.
pub fn cross_entropy_from_logits_composed(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<CrossEntropyOutput> {
    let input = Hypotheses::Logits(logits);
    run::cross_entropy(input, targets, cfg, Path::Composed, Reducer::Local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn composed_path_matches_the_kernel() -> Result<()> {
        let logits = Tensor::randn(0f64, 2.0, (2, 3, 7), &Device::Cpu)?;
        let targets = Tensor::new(&[[1u32, 6, 0], [3, 0, 5]], &Device::Cpu)?;
        for cfg in [
            CrossEntropyConfig::default(),
            CrossEntropyConfig {
                pad_id: Some(0),
                label_smoothing: 0.2,
                ..Default::default()
            },
        ] {
            let fused = cross_entropy_from_logits(&logits, &targets, &cfg)?.loss;
            let composed = cross_entropy_from_logits_composed(&logits, &targets, &cfg)?.loss;
            let (fused, composed) = (fused.to_scalar::<f64>()?, composed.to_scalar::<f64>()?);
            assert!((fused - composed).abs() < 1e-12, "{fused} vs {composed}");
        }
        Ok(())
    }
}
