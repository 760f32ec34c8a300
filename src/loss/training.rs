//! The loss of a training step that mixes cross-entropy and BLEU: [`ce_bleu_from_logits`] and
//! its composed reference [`ce_bleu_from_logits_composed`].
//!
//! Computed apart, the two losses each read the `[B, S, V]` logits forward and each write a
//! `[B, S, V]` logits gradient backward, which candle's autograd then adds up (one more
//! `zeros_like` + `add` pass over `[B, S, V]`). Here one CPU custom op per step carries both:
//! its output holds, for every row, the gathered BLEU probabilities and the row's cross-entropy
//! term, so that its backward receives both gradients in one call and writes one logits
//! gradient.

use super::checked::hypotheses::Hypotheses;
use super::config::{TrainingLoss, TrainingLossConfig};
use super::dispatch::Path;
use super::reduce::Reducer;
use super::references::TrainingTargets;
use super::run;
use candle_core::{Result, Tensor};

/// Cross-entropy plus weighted BLEU loss of one training step, from the logits:
/// `loss = cross_entropy + cfg.bleu_weight · bleu.loss`.
///
/// The parts equal [`cross_entropy_from_logits`](super::cross_entropy_from_logits)`(logits, targets.tokens, &cfg.ce)` and
/// [`bleu_loss_from_logits`](super::bleu_loss_from_logits)`(logits, targets.hyp_lengths, targets.refs, &cfg.bleu)` computed apart, values and
/// gradients. On the CPU, with id references, one custom op reads the logits once forward
/// (every form and length model; the paired form's self-match `P Pᵀ` included) and its backward
/// writes one logits gradient for both losses. With matrix references the BLEU side needs every
/// probability: a fused softmax feeds it and the cross-entropy kernel reads the logits a second
/// time. On CUDA the crate's CUDA kernels do the same (the `cuda` feature); elsewhere composed
/// candle ops ([`ce_bleu_from_logits_composed`]).
///
/// # Arguments
/// * `logits` - float `[B, S, V]`.
/// * `targets` - the target ids `[B, S]`, the references and the optional hypothesis lengths
///   ([`TrainingTargets`]).
/// * `cfg` - the weight `λ` (finite, `>= 0`) and the two losses' configurations.
///
/// Errors as the two functions do, and on a negative or non-finite `cfg.bleu_weight`.
pub fn ce_bleu_from_logits(
    logits: &Tensor,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
) -> Result<TrainingLoss> {
    let path = Path::for_device(logits.device());
    run::training(
        Hypotheses::Logits(logits),
        targets,
        cfg,
        path,
        Reducer::Local,
    )
}

/// [`ce_bleu_from_logits`] as composed candle ops, never the crate's kernels: the reference the
/// kernels are tested against, and what devices without kernels run. The same values and
/// gradients to rounding.
pub fn ce_bleu_from_logits_composed(
    logits: &Tensor,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
) -> Result<TrainingLoss> {
    let input = Hypotheses::Logits(logits);
    run::training(input, targets, cfg, Path::Composed, Reducer::Local)
}
