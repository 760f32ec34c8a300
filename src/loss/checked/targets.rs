//! What the hypotheses are scored against, checked against their `[B, S, V]`: the
//! cross-entropy's targets with their count ([`input_targets`] → [`CheckedTargets`]), and the
//! BLEU loss's references, hypothesis lengths and `eos_id` ([`bleu_arguments`]).

use super::logits::HypothesisShape;
use crate::loss::config::{BleuLossConfig, CrossEntropyConfig, CrossEntropyReduction, LengthModel};
use crate::loss::host;
use crate::loss::kernels::cpu::CrossEntropyTerms;
use crate::loss::references::References;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Checked cross-entropy targets: u32 `[B, S]` on the hypotheses' device, each `< V` or the
/// padding id — the caller's tensor, or, when the values were not read
/// ([`TargetCount::Device`]), a copy made on the device with every out-of-vocabulary target
/// replaced by a valid id, so that no kernel reads outside a row.
pub(crate) struct CheckedTargets<'a> {
    pub targets: std::borrow::Cow<'a, Tensor>,
    pub terms: CrossEntropyTerms,
    /// `n`, the number of non-pad targets, read on the host or left on the device. A host 0 is
    /// refused by the reduction stage (`reduce::Reducer::divide`) on the sum it reduces over,
    /// not here.
    pub count: TargetCount,
    /// Which mean the reduction stage takes, set by it (`reduce::Reducer::divide`): the mean
    /// over this batch (divided by `n`, or `Σ w_t` with class weights), or none (a sum, each
    /// position's loss, a data-parallel shard's sum). [`Division::None`] until then.
    pub division: Division,
    /// How the token losses are reduced.
    pub reduction: CrossEntropyReduction,
}

/// The count of non-pad targets.
pub(crate) enum TargetCount {
    /// Read on the host (on the CPU in place, elsewhere one small copy): `n`, and `Σ w_t` over
    /// the non-pad targets with class weights (`n` without them), the weighted mean's
    /// denominator.
    Host { count: usize, weight_sum: f64 },
    /// Left on the device — off the CPU with the value checks off and no class weights — so
    /// that the loss makes no device-to-host copy: `n` as an f32 scalar, and f32 `[B, S]` with
    /// 1 where a non-pad target is `>= V` (replaced in [`CheckedTargets::targets`]; the
    /// reduction stage makes the loss NaN there instead of reading outside the row). A batch of
    /// only padding then gives a NaN mean rather than an error.
    Device { count: Tensor, out_of_vocab: Tensor },
}

/// The mean the reduction stage takes of the cross-entropy's row terms, said explicitly (never
/// inferred from the divisor's value: a weighted mean whose `Σ w_t` is 1 is still a mean).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Division {
    /// No division: a sum, each position's loss, or a data-parallel shard's sum.
    None,
    /// The mean over this batch's `n` non-pad targets.
    Mean,
    /// The mean over this batch weighted by class weights: divided by `Σ w_t`.
    WeightedMean,
    /// The mean over this batch's non-pad targets counted on the device
    /// ([`TargetCount::Device`]): the rows are summed with weight 1 and the sum divided by the
    /// count tensor.
    MeanOnDevice,
}

impl CheckedTargets<'_> {
    /// What each non-pad row's term is divided by: `n`, `Σ w_t`, or 1, as
    /// [`Self::division`] says.
    pub(crate) fn divisor(&self) -> f64 {
        match (self.division, &self.count) {
            (Division::None | Division::MeanOnDevice, _) => 1.0,
            (Division::Mean, TargetCount::Host { count, .. }) => *count as f64,
            (Division::WeightedMean, TargetCount::Host { weight_sum, .. }) => *weight_sum,
            // `Reducer::divide` never pairs a host mean with a device count.
            (Division::Mean | Division::WeightedMean, TargetCount::Device { .. }) => f64::NAN,
        }
    }

    /// `n` read on the host, or `None` where it stayed on the device.
    pub(crate) fn host_count(&self) -> Option<usize> {
        match self.count {
            TargetCount::Host { count, .. } => Some(count),
            TargetCount::Device { .. } => None,
        }
    }

    /// `1 / divisor`: each non-pad row's weight (`1/n` in a local mean).
    pub(crate) fn inv_count(&self) -> f64 {
        1.0 / self.divisor()
    }

    /// The z-term's row weight over the cross-entropy's: `Σ w_t / n` for a local weighted
    /// mean (the z-term's mean divides by the count, as Liger's does), 1 otherwise.
    pub(crate) fn z_ratio(&self) -> f64 {
        match (self.division, &self.count) {
            (Division::WeightedMean, TargetCount::Host { count, weight_sum }) if *count > 0 => {
                weight_sum / *count as f64
            }
            _ => 1.0,
        }
    }
}

/// The cross-entropy's targets checked against the hypotheses' `[B, S, V]`.
/// Off the CPU the values are read (one small copy) only with `check_values` or class weights;
/// otherwise they stay on the device ([`TargetCount::Device`]).
pub(super) fn input_targets<'a>(
    shape: &HypothesisShape,
    targets: &'a Tensor,
    cfg: &CrossEntropyConfig,
    check_values: bool,
) -> Result<CheckedTargets<'a>> {
    // "the [B, S] of `logits` [2, 3, 7]"; the hidden states' own description names both.
    let described = match shape.name {
        "hidden" => shape.described.clone(),
        _ => format!(
            "the [B, S] of {}",
            shape.described.replacen(" shape", "", 1)
        ),
    };
    checked_targets(
        targets,
        (shape.batch, shape.seq, shape.vocab),
        shape.name,
        &described,
        shape.device,
        cfg,
        check_values,
    )
}

/// Checks the lengths, the references and the config's `eos_id` against the hypotheses'
/// `[B, S, V]` (the config itself is checked by the caller).
pub(super) fn bleu_arguments(
    hyp: &HypothesisShape,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<()> {
    let HypothesisShape {
        name,
        described,
        batch,
        seq,
        vocab,
        device,
    } = hyp;
    let (batch, seq, vocab) = (*batch, *seq, *vocab);
    reference_arguments(hyp, refs)?;
    if let Some(eos) = cfg.length.eos_id() {
        if eos as usize >= vocab {
            bail!("`eos_id` {eos} is out of the vocabulary (V = {vocab}, {described})");
        }
    }
    if let Some(lengths) = hyp_lengths {
        if matches!(cfg.length, LengthModel::SoftEos { .. }) {
            bail!(
                "`hyp_lengths` must be None with LengthModel::SoftEos: its lengths come from the EOS probabilities"
            );
        }
        if lengths.dtype() != DType::U32 || lengths.dims() != [batch] {
            bail!(
                "`hyp_lengths` must be u32 [{batch}], got {:?} with shape {:?}",
                lengths.dtype(),
                lengths.dims()
            );
        }
        if !lengths.device().same_device(device) {
            bail!(
                "`hyp_lengths` are on {:?} but `{name}` is on {device:?}",
                lengths.device(),
            );
        }
        // In place on the CPU; elsewhere a copy, only with `check_values`.
        if let Some(values) = host::u32_values(lengths, cfg.check_values)? {
            if let Some((element, &length)) =
                values.iter().enumerate().find(|(_, &l)| l as usize > seq)
            {
                bail!("`hyp_lengths[{element}]` = {length} exceeds S = {seq} ({described})");
            }
        }
    }
    Ok(())
}

/// Checks that `refs` fit the hypotheses: the same batch size and device, every id `< V`.
pub(super) fn reference_arguments(hyp: &HypothesisShape, refs: &References) -> Result<()> {
    let HypothesisShape {
        name,
        described,
        batch,
        vocab,
        device,
        ..
    } = hyp;
    if refs.batch_size() != *batch {
        bail!(
            "`refs` has {} batch elements but `{name}` has {batch} ({described})",
            refs.batch_size(),
        );
    }
    if !refs.device().same_device(device) {
        bail!(
            "`refs` are on {:?} but `{name}` is on {device:?}",
            refs.device()
        );
    }
    refs.check_vocab(*vocab)
}

/// Checks the targets' dtype, shape and device against the hypotheses' `[B, S]` (from the
/// argument `name`, described in `described`), the label smoothing, and the values: each
/// `< V` or the padding id; counts the non-pad ones (the rule that at least one counts is the
/// reduction stage's, on the sum it reduces over). On the CPU the values are read in place;
/// elsewhere, with `check_values` (or class weights, whose `Σ w_t` the mean needs), the
/// largest non-pad target and the count come back in one small counted copy (in u32: no f64,
/// which Metal lacks); without, nothing is read ([`device_count`]).
fn checked_targets<'a>(
    targets: &'a Tensor,
    (batch, seq, vocab): (usize, usize, usize),
    name: &str,
    described: &str,
    device: &Device,
    cfg: &CrossEntropyConfig,
    check_values: bool,
) -> Result<CheckedTargets<'a>> {
    if targets.dtype() != DType::U32 || targets.dims() != [batch, seq] {
        bail!(
            "`targets` must be u32 [{batch}, {seq}] ({described}), got {:?} with shape {:?}",
            targets.dtype(),
            targets.dims()
        );
    }
    if !targets.device().same_device(device) {
        bail!(
            "`targets` are on {:?} but `{name}` are on {device:?}",
            targets.device(),
        );
    }
    let eps = cfg.label_smoothing;
    if !(eps.is_finite() && (0.0..1.0).contains(&eps)) {
        bail!("`label_smoothing` must be in [0, 1), got {eps}");
    }
    if !(cfg.z_loss.is_finite() && cfg.z_loss >= 0.0) {
        bail!("`z_loss` must be finite and >= 0, got {}", cfg.z_loss);
    }
    if let Some(cap) = cfg.softcap {
        if !(cap.is_finite() && cap > 0.0) {
            bail!("`softcap` must be finite and > 0, got {cap}");
        }
    }
    let class_weights = cfg.class_weights.as_deref();
    if let Some(weights) = class_weights {
        if weights.len() != vocab {
            bail!(
                "`class_weights` must hold V = {vocab} values (the last dimension of `{name}`), got {}",
                weights.len()
            );
        }
        if let Some((v, w)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
        {
            bail!("`class_weights[{v}]` = {w}: every class weight must be finite and >= 0");
        }
    }
    let pad_id = cfg.pad_id;
    // The targets' count and class-weight sum, and their check, on the host values.
    let scan = |values: &[u32]| -> Result<(usize, f64)> {
        let (mut count, mut weight_sum) = (0usize, 0f64);
        for (row, &target) in values.iter().enumerate() {
            if Some(target) == pad_id {
                continue;
            }
            if target as usize >= vocab {
                bail!(
                    "`targets[{}, {}]` = {target} is out of the vocabulary (V = {vocab}) and is not `pad_id` ({pad_id:?})",
                    row / seq.max(1),
                    row % seq.max(1),
                );
            }
            count += 1;
            if let Some(weights) = class_weights {
                weight_sum += weights[target as usize];
            }
        }
        Ok((count, weight_sum))
    };
    let terms = CrossEntropyTerms {
        pad_id,
        label_smoothing: eps,
        class_weights: cfg.class_weights.clone(),
        z_loss: cfg.z_loss,
        token_accuracy: cfg.token_accuracy,
    };
    if counts_on_device(targets.device(), check_values) && class_weights.is_none() {
        let (safe_targets, count) = device_count(targets, vocab, pad_id)?;
        return Ok(CheckedTargets {
            targets: std::borrow::Cow::Owned(safe_targets),
            terms,
            count,
            division: Division::None,
            reduction: cfg.reduction,
        });
    }
    let (count, weight_sum) = if targets.device().is_cpu() {
        host::with_cpu_slice::<u32, _>(targets, scan)?
    } else if class_weights.is_some() {
        // The weighted mean needs Σ w_t: one copy of the targets (not of any float tensor).
        scan(&host::to_vec1::<u32>(&targets.flatten_all()?)?)?
    } else {
        let pad_mask = match pad_id {
            Some(pad) => targets.ne(pad)?,
            None => targets.ones_like()?.to_dtype(DType::U8)?,
        };
        let safe_targets = pad_mask.where_cond(targets, &targets.zeros_like()?)?;
        let summary = host::to_vec1::<u32>(&Tensor::stack(
            &[
                safe_targets.max_all()?,
                pad_mask.to_dtype(DType::U32)?.sum_all()?,
            ],
            0,
        )?)?;
        let (max_target, count) = (summary[0], summary[1]);
        if max_target as usize >= vocab {
            bail!(
                "`targets` holds {max_target} (not `pad_id` {pad_id:?}), out of the vocabulary (V = {vocab})"
            );
        }
        (count as usize, 0.0)
    };
    Ok(CheckedTargets {
        targets: std::borrow::Cow::Borrowed(targets),
        terms,
        count: TargetCount::Host {
            count,
            weight_sum: if class_weights.is_some() {
                weight_sum
            } else {
                count as f64
            },
        },
        division: Division::None,
        reduction: cfg.reduction,
    })
}

/// Whether targets on `device` are counted on the device, unread: off the CPU without
/// `check_values`, with the `cuda-unverified` feature (this path has run on the CPU only, in
/// the unit tests, not yet on a GPU; without the feature the targets are read as before). In
/// the crate's unit tests also on the CPU when [`COUNT_TARGETS_ON_DEVICE`] is set.
fn counts_on_device(device: &Device, check_values: bool) -> bool {
    #[cfg(test)]
    if COUNT_TARGETS_ON_DEVICE.with(|on| on.get()) && !check_values {
        return true;
    }
    cfg!(feature = "cuda-unverified") && !device.is_cpu() && !check_values
}

#[cfg(test)]
thread_local! {
    /// Tests only: count the targets on the device on the CPU too ([`counts_on_device`]).
    pub(crate) static COUNT_TARGETS_ON_DEVICE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The targets counted where they are, with no copy to the host: the non-pad targets in the
/// vocabulary counted (f32 scalar), the non-pad ones `>= V` marked (f32 `[B, S]`) and replaced
/// by the padding id (or 0 without one) in the returned copy, which the passes read instead.
/// About ten small ops on the device (comparisons, a select, a sum), none reading back.
fn device_count(
    targets: &Tensor,
    vocab: usize,
    pad_id: Option<u32>,
) -> Result<(Tensor, TargetCount)> {
    let vocab = u32::try_from(vocab).unwrap_or(u32::MAX);
    let in_vocab = targets.lt(vocab)?;
    let not_pad = match pad_id {
        Some(pad) => targets.ne(pad)?,
        None => targets.ones_like()?.to_dtype(DType::U8)?,
    };
    let counted = (&in_vocab * &not_pad)?;
    let out_of_vocab = (&not_pad - &counted)?;
    let fill = Tensor::full(pad_id.unwrap_or(0), targets.shape(), targets.device())?;
    let safe_targets = out_of_vocab.where_cond(&fill, targets)?;
    let count = counted.to_dtype(DType::F32)?.sum_all()?;
    Ok((
        safe_targets,
        TargetCount::Device {
            count,
            out_of_vocab: out_of_vocab.to_dtype(DType::F32)?,
        },
    ))
}
