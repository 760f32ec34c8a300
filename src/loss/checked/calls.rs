//! The three calls every kind of hypotheses goes through, once per loss — [`bleu_call`],
//! [`cross_entropy_call`], [`training_call`] — each combining the checks of the input
//! (`hypotheses.rs`), of the targets and references (`targets.rs`) and of the config.

use super::hypotheses::{shaped, CheckedInput, Hypotheses};
use super::targets::{bleu_arguments, input_targets, CheckedTargets};
use crate::loss::config::{
    BleuLossConfig, CrossEntropyConfig, CrossEntropyReduction, TrainingLossConfig,
};
use crate::loss::dispatch::Path;
use crate::loss::references::References;
use crate::loss::score;
use candle_core::{bail, Result, Tensor};

/// Whether `cfg` asks for an option beyond the plain CUDA kernels' padding and label smoothing:
/// the z-loss, the token accuracy or class weights, which the CPU kernels, the composed ops and
/// the CUDA options kernels (`cuda-unverified`) compute (`Path::for_options`).
fn beyond_plain_kernels(cfg: &CrossEntropyConfig) -> bool {
    cfg.z_loss != 0.0 || cfg.token_accuracy || cfg.class_weights.is_some()
}

/// The arguments of a BLEU loss on any kind of hypotheses, checked:
/// [`bleu_loss`](crate::loss::bleu_loss),
/// [`bleu_loss_from_logits`](crate::loss::bleu_loss_from_logits),
/// [`bleu_loss_from_hidden`](crate::loss::bleu_loss_from_hidden) and their data-parallel forms.
pub(crate) fn bleu_call(
    input: Hypotheses<'_>,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
    path: Path,
) -> Result<CheckedInput> {
    score::validate_config(cfg)?;
    let shaped = shaped(input, path, cfg.check_values)?;
    bleu_arguments(&shaped.shape(), hyp_lengths, refs, cfg)?;
    shaped.finish(cfg.check_values, None)
}

/// The arguments of a cross-entropy on logits or hidden states, checked:
/// [`cross_entropy_from_logits`](crate::loss::cross_entropy_from_logits),
/// [`cross_entropy_from_hidden`](crate::loss::cross_entropy_from_hidden) and their data-parallel
/// forms.
pub(crate) fn cross_entropy_call<'a>(
    input: Hypotheses<'_>,
    targets: &'a Tensor,
    cfg: &CrossEntropyConfig,
    path: Path,
) -> Result<(CheckedInput, CheckedTargets<'a>)> {
    let path = path.for_options(input.device(), beyond_plain_kernels(cfg));
    softcap_with_blocks(cfg, &input)?;
    let shaped = shaped(input, path, false)?;
    let targets = input_targets(&shaped.shape(), targets, cfg, cfg.check_values)?;
    Ok((shaped.finish(false, cfg.softcap)?, targets))
}

/// Refuses soft-capping and class weights with the hidden-state path's gradient filtering: a
/// skipped tile's gradient is built from the rank-one structure of uncapped, unweighted logits
/// (`dz/dz = 1`, one smoothing offset for every column), which both break.
fn softcap_with_blocks(cfg: &CrossEntropyConfig, input: &Hypotheses<'_>) -> Result<()> {
    if let Hypotheses::Hidden { blocks, .. } = input {
        if let Some(tau) = blocks.filter_below {
            if let Some(cap) = cfg.softcap {
                bail!(
                    "`softcap` ({cap}) with gradient filtering (`blocks.filter_below` = {tau}): a skipped tile's gradient assumes uncapped logits; use one or the other"
                );
            }
            if cfg.class_weights.is_some() {
                bail!(
                    "`class_weights` with gradient filtering (`blocks.filter_below` = {tau}): a skipped tile's gradient assumes one smoothing offset for every class; use one or the other"
                );
            }
        }
    }
    Ok(())
}

/// The arguments of a training step's loss on logits or hidden states, checked: the input, the
/// targets, and `bleu_weight` (returned):
/// [`ce_bleu_from_logits`](crate::loss::ce_bleu_from_logits),
/// [`ce_bleu_from_hidden`](crate::loss::ce_bleu_from_hidden) and their data-parallel forms.
pub(crate) fn training_call<'a>(
    input: Hypotheses<'_>,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    targets: &'a Tensor,
    cfg: &TrainingLossConfig,
    path: Path,
) -> Result<(CheckedInput, CheckedTargets<'a>, f64)> {
    let bleu_weight = checked_bleu_weight(cfg.bleu_weight)?;
    score::validate_config(&cfg.bleu)?;
    if cfg.ce.reduction == CrossEntropyReduction::None {
        bail!(
            "`ce.reduction` None: a training step's loss `cross_entropy + bleu_weight · bleu` is a scalar; take per-position losses from `cross_entropy_from_logits` or `cross_entropy_from_hidden`"
        );
    }
    let path = path.for_options(input.device(), beyond_plain_kernels(&cfg.ce));
    softcap_with_blocks(&cfg.ce, &input)?;
    let shaped = shaped(input, path, cfg.bleu.check_values)?;
    let targets = {
        let shape = shaped.shape();
        // Either config's `check_values` reads the targets (one small copy off the CPU).
        let check_targets = cfg.ce.check_values || cfg.bleu.check_values;
        let targets = input_targets(&shape, targets, &cfg.ce, check_targets)?;
        bleu_arguments(&shape, hyp_lengths, refs, &cfg.bleu)?;
        targets
    };
    // Capping changes the model's distribution: the BLEU term sees the capped logits too.
    let input = shaped.finish(cfg.bleu.check_values, cfg.ce.softcap)?;
    Ok((input, targets, bleu_weight))
}

/// `bleu_weight` if it is finite and `>= 0`, else an error naming it.
fn checked_bleu_weight(bleu_weight: f64) -> Result<f64> {
    if !(bleu_weight.is_finite() && bleu_weight >= 0.0) {
        bail!("`bleu_weight` must be finite and >= 0, got {bleu_weight}");
    }
    Ok(bleu_weight)
}
