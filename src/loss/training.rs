//! The loss of a training step that mixes cross-entropy and BLEU: [`ce_bleu_from_logits`].
//!
//! Computed apart, the two losses each read the `[B, S, V]` logits forward and each write a
//! `[B, S, V]` logits gradient backward, which candle's autograd then adds up (one more
//! `zeros_like` + `add` pass over `[B, S, V]`). Here one CPU custom op per step carries both:
//! its output holds, for every row, the gathered BLEU probabilities and the row's cross-entropy
//! term, so that its backward receives both gradients in one call and writes one logits
//! gradient.

use super::config::{TrainingLoss, TrainingLossConfig};
use super::pipeline::{
    check_bleu_weight, check_cross_entropy_inputs, check_inputs, combine, finish, hypothesis_pass,
};
use super::references::References;
use candle_core::{Result, Tensor};

/// Cross-entropy plus weighted BLEU loss of one training step, from the logits:
/// `loss = cross_entropy + cfg.bleu_weight · bleu.loss`.
///
/// The parts equal [`cross_entropy_from_logits`](super::cross_entropy_from_logits)`(logits, targets, &cfg.ce)` and
/// [`bleu_loss_from_logits`](super::bleu_loss_from_logits)`(logits, hyp_lengths, refs, &cfg.bleu)` computed apart, values and
/// gradients. On the CPU, with id references, one custom op reads the logits once forward
/// (every form and length model; the paired form's self-match `P Pᵀ` included) and its backward
/// writes one logits gradient for both losses. With matrix references the BLEU side needs every
/// probability: a fused softmax feeds it and the cross-entropy kernel reads the logits a second
/// time. Off the CPU, composed candle ops.
///
/// # Arguments
/// * `logits` - float `[B, S, V]`.
/// * `hyp_lengths`, `refs` - as [`bleu_loss_from_logits`](super::bleu_loss_from_logits).
/// * `targets` - as [`cross_entropy_from_logits`](super::cross_entropy_from_logits) (u32 `[B, S]`).
/// * `cfg` - the weight `λ` (finite, `>= 0`) and the two losses' configurations.
///
/// Errors as the two functions do, and on a negative or non-finite `cfg.bleu_weight`.
pub fn ce_bleu_from_logits(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    targets: &Tensor,
    cfg: &TrainingLossConfig,
) -> Result<TrainingLoss> {
    let TrainingLossConfig {
        bleu_weight,
        ce,
        bleu,
        ..
    } = cfg;
    let bleu_weight = check_bleu_weight(*bleu_weight)?;
    check_cross_entropy_inputs(logits, targets, ce)?;
    let compute_dtype = check_inputs("logits", logits, hyp_lengths, refs, bleu)?;
    let logits = logits.to_dtype(compute_dtype)?;
    let side = refs.side(bleu.max_order, bleu.length.eos_id(), compute_dtype)?;
    let (inputs, cross_entropy) = hypothesis_pass(&logits, &side, bleu, Some((targets, ce)))?;
    let Some(cross_entropy) = cross_entropy else {
        candle_core::bail!("internal: the logits pass computed no cross-entropy")
    };
    let bleu_out = finish(inputs, &side, hyp_lengths, bleu)?;
    combine(cross_entropy, bleu_out, bleu_weight)
}
