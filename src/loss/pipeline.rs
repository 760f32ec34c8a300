//! The steps every entry point of the loss shares: validation of the arguments (one helper per
//! argument), the one choice between the crate's kernels and composed candle ops
//! ([`use_kernels`]), the pass over the logits ([`logits_pass`]) and the statistics from its
//! results ([`finish`]).
//!
//! The path of `logits` through [`ce_bleu_from_logits`](super::training::ce_bleu_from_logits):
//! validate ([`check_logits`], [`check_targets`], [`check_bleu_arguments`]) → the reference side
//! ([`References::side`](super::references::References)) → [`hypothesis_pass`] (one op over the logits on
//! the CPU: [`super::kernels::RowOp`]) → [`finish`] (length weights, clipped matches, score).

use super::config::{
    BleuLossConfig, BleuLossOutput, BleuStats, CrossEntropyConfig, Form, LengthModel, TrainingLoss,
};
use super::kernels::{cuda_kernels_loaded, CrossEntropyTerms, GatherIds, RowOp};
use super::references::{ReferenceSide, ReferenceTokens, References};
use super::{forms, host, length, score};
use candle_core::{bail, DType, Device, Result, Tensor, D};

thread_local! {
    static COMPOSED_ON_CPU: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with the loss's composed candle-op path on the CPU as well, on this thread: the
/// path devices without the crate's kernels take, so that the suite can compare both on the
/// CPU. Not part of the API.
pub fn with_composed_path<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            COMPOSED_ON_CPU.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(COMPOSED_ON_CPU.with(|c| c.replace(true)));
    f()
}

/// Whether the CPU kernels run for tensors on `device` (the hidden-state loss's blocks have
/// CPU kernels only).
pub(crate) fn cpu_kernels(device: &Device) -> bool {
    device.is_cpu() && !COMPOSED_ON_CPU.with(std::cell::Cell::get)
}

/// The one choice between the crate's kernels and composed candle ops for tensors on `device`:
/// the CPU kernels on the CPU; the CUDA kernels on CUDA when switched on
/// ([`super::kernels::set_cuda_kernels`]) and loaded; composed ops otherwise.
pub(crate) fn use_kernels(device: &Device) -> bool {
    cpu_kernels(device) || cuda_kernels_loaded(device)
}

/// Validates a hypothesis tensor of logits or probabilities, `name`: float `[B, S, V]` with
/// `B, S, V >= 1`. Returns the compute dtype (f32 for f16/bf16) and `(B, S, V)`.
pub(crate) fn check_logits(name: &str, t: &Tensor) -> Result<(DType, (usize, usize, usize))> {
    let dims = match t.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("`{name}` must be [B, S, V], got shape {dims:?}"),
    };
    let compute_dtype = score::compute_dtype(t.dtype()).map_err(|_| {
        candle_core::Error::Msg(format!(
            "`{name}` must be a float tensor, got {:?} with shape {:?}",
            t.dtype(),
            t.dims()
        ))
    })?;
    if dims.0 == 0 || dims.1 == 0 || dims.2 == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, S and V must be >= 1",
            t.dims()
        );
    }
    Ok((compute_dtype, dims))
}

/// Validates the hypothesis tensor, the lengths and the references against each other;
/// returns the compute dtype.
pub(crate) fn check_inputs(
    name: &str,
    hyp: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<DType> {
    score::validate_config(cfg)?;
    let (compute_dtype, (batch, seq, vocab)) = check_logits(name, hyp)?;
    let shape = HypothesisShape {
        name,
        described: format!("`{name}` shape {:?}", hyp.dims()),
        batch,
        seq,
        vocab,
        device: hyp.device(),
    };
    check_bleu_arguments(&shape, hyp_lengths, refs, cfg)?;
    Ok(compute_dtype)
}

/// Validates `logits` and `targets` for the cross-entropy; returns the compute dtype.
pub(crate) fn check_cross_entropy_inputs(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<DType> {
    let (dtype, (batch, seq, _)) = check_logits("logits", logits)?;
    let described = format!("the [B, S] of `logits` {:?}", logits.dims());
    check_targets(
        targets,
        (batch, seq),
        "logits",
        &described,
        logits.device(),
        cfg,
    )?;
    Ok(dtype)
}

/// The `[B, S, V]` of the hypotheses, however they are given (probabilities, logits, or hidden
/// states and an output layer), for validation messages.
pub(crate) struct HypothesisShape<'a> {
    /// The argument the batch and positions come from.
    pub name: &'a str,
    /// The hypothesis arguments and their shapes, for messages.
    pub described: String,
    pub batch: usize,
    pub seq: usize,
    pub vocab: usize,
    pub device: &'a Device,
}

/// Validates the lengths, the references and the config's `eos_id` against the hypotheses'
/// `[B, S, V]` (the config itself is checked by the caller).
pub(crate) fn check_bleu_arguments(
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
    if refs.batch_size() != batch {
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
    refs.check_vocab(vocab)?;
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

/// Validates the targets' dtype, shape and device against the hypotheses' `[B, S]` (from the
/// argument `name`, described in `described`), and the label smoothing.
pub(crate) fn check_targets(
    targets: &Tensor,
    (batch, seq): (usize, usize),
    name: &str,
    described: &str,
    device: &Device,
    cfg: &CrossEntropyConfig,
) -> Result<()> {
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
    Ok(())
}

/// `bleu_weight` if it is finite and `>= 0`, else an error naming it.
pub(crate) fn check_bleu_weight(bleu_weight: f64) -> Result<f64> {
    if !(bleu_weight.is_finite() && bleu_weight >= 0.0) {
        bail!("`bleu_weight` must be finite and >= 0, got {bleu_weight}");
    }
    Ok(bleu_weight)
}

/// Errors if `t` holds NaN or Inf: in place on the CPU, with a copy elsewhere only under
/// `check_values`.
pub(crate) fn check_finite(name: &str, t: &Tensor, cfg: &BleuLossConfig) -> Result<()> {
    if host::all_finite(t, cfg.check_values)? == Some(false) {
        bail!(
            "`{name}` contains NaN or infinite values (shape {:?})",
            t.dims()
        );
    }
    Ok(())
}

/// Everything the statistics need from the hypothesis side.
pub(crate) struct HypothesisInputs {
    /// `X`: `[B, S, W]`.
    pub token_match: Tensor,
    /// `P[:, :, eos]`: `[B, S]`, for the EOS length models.
    pub eos_probs: Option<Tensor>,
    /// `Z_1 = P Pᵀ`: `[B, S, S]`, for the paired form.
    pub hyp_self_match: Option<Tensor>,
}

/// The token matches from full probabilities: a gather for ids, a product for matrices.
pub(crate) fn hypothesis_inputs_from_probs(
    probs: &Tensor,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    let token_match = match &side.tokens {
        ReferenceTokens::Ids(ids) => gather_columns(probs, ids)?,
        ReferenceTokens::Matrices(matrices) => probs.matmul(&matrices.t()?)?,
    };
    let eos_probs = cfg
        .length
        .eos_id()
        .map(|eos| probs.narrow(2, eos as usize, 1)?.squeeze(2))
        .transpose()?;
    let hyp_self_match = (cfg.form == Form::Paired)
        .then(|| probs.matmul(&probs.t()?))
        .transpose()?;
    Ok(HypothesisInputs {
        token_match,
        eos_probs,
        hyp_self_match,
    })
}

/// `probs[b, i, ids[b, k]]`: `[B, S, K]` from `[B, S, V]` probabilities and u32 `[B, K]` ids.
fn gather_columns(probs: &Tensor, ids: &Tensor) -> Result<Tensor> {
    let (batch, seq, _) = probs.dims3()?;
    let width = ids.dim(1)?;
    let index = ids
        .unsqueeze(1)?
        .broadcast_as((batch, seq, width))?
        .contiguous()?;
    probs.gather(&index, 2)
}

/// The token matches (and EOS probabilities) from the gathered columns `[X | eos]`.
pub(crate) fn inputs_from_gathered(
    gathered: &Tensor,
    width: usize,
    self_match: Option<Tensor>,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    Ok(HypothesisInputs {
        token_match: gathered.narrow(2, 0, width)?,
        eos_probs: cfg
            .length
            .eos_id()
            .map(|_| gathered.narrow(2, width, 1)?.squeeze(2))
            .transpose()?,
        hyp_self_match: self_match,
    })
}

/// What one pass over the logits reads for the BLEU side.
#[derive(Clone, Copy)]
pub(crate) enum Gather<'a> {
    /// Nothing (the cross-entropy alone).
    Nothing,
    /// The softmax at u32 `[B, K]` ids.
    Ids(&'a GatherIds),
    /// The self-match `P Pᵀ` and the softmax at the ids (the paired form).
    SelfMatch(&'a GatherIds),
    /// Every probability (matrix references).
    Probs,
}

/// What [`logits_pass`] gives.
#[derive(Default)]
pub(crate) struct LogitsPass {
    /// `[B, S, K]`: the softmax at the ids.
    pub gathered: Option<Tensor>,
    /// `[B, S, S]`: `P Pᵀ`.
    pub self_match: Option<Tensor>,
    /// `[B, S, V]`: every probability.
    pub probs: Option<Tensor>,
    /// Scalar: the mean cross-entropy against the targets.
    pub cross_entropy: Option<Tensor>,
}

/// One pass over validated `[B, S, V]` logits (in their compute dtype, f32 or f64 on the CPU):
/// what `gather` asks for and, with `targets`, the cross-entropy. The one place that chooses
/// the kernels ([`RowOp`]: one op whose backward writes one logits gradient for everything it
/// computed) or composed candle ops ([`use_kernels`]).
pub(crate) fn logits_pass(
    logits: &Tensor,
    gather: Gather,
    targets: Option<(&Tensor, &CrossEntropyConfig)>,
) -> Result<LogitsPass> {
    if !use_kernels(logits.device()) {
        return composed_logits_pass(logits, gather, targets);
    }
    let (ids, self_match) = match gather {
        Gather::Nothing => (None, false),
        Gather::Ids(ids) => (Some(ids), false),
        Gather::SelfMatch(ids) => (Some(ids), true),
        Gather::Probs => {
            let probs = RowOp::softmax().apply(logits)?;
            let ce = logits_pass(logits, Gather::Nothing, targets)?.cross_entropy;
            return Ok(LogitsPass {
                probs: Some(probs),
                cross_entropy: ce,
                ..Default::default()
            });
        }
    };
    let (_, seq, vocab) = logits.dims3()?;
    // The CUDA kernels take `1/n`; counting the targets is the composed path's check (one copy).
    let inv_count = match targets {
        Some((targets, cfg)) if !logits.device().is_cpu() => {
            let (_, _, count) = device_targets(targets, vocab, cfg)?;
            Some(1.0 / f64::from(count))
        }
        _ => None,
    };
    let terms = targets.map(|(t, cfg)| (t, kernel_terms(cfg)));
    let op = RowOp::rows(self_match, ids, terms, inv_count)?;
    let (self_columns, width) = op.columns(seq)?;
    let out = op.apply(logits)?;
    Ok(LogitsPass {
        gathered: ids
            .map(|_| out.narrow(2, self_columns, width))
            .transpose()?,
        self_match: self_match.then(|| out.narrow(2, 0, seq)).transpose()?,
        probs: None,
        cross_entropy: targets
            .map(|_| out.narrow(2, self_columns + width, 1)?.sum_all())
            .transpose()?,
    })
}

/// [`logits_pass`] as composed candle ops, with the kernels' numbers to rounding.
fn composed_logits_pass(
    logits: &Tensor,
    gather: Gather,
    targets: Option<(&Tensor, &CrossEntropyConfig)>,
) -> Result<LogitsPass> {
    let cross_entropy = targets
        .map(|(targets, cfg)| cross_entropy_composed(logits, targets, cfg))
        .transpose()?;
    let probs = match gather {
        Gather::Nothing => None,
        _ => Some(candle_nn::ops::softmax(logits, D::Minus1)?),
    };
    let mut pass = LogitsPass {
        cross_entropy,
        ..Default::default()
    };
    match (gather, probs) {
        (Gather::Ids(ids), Some(probs)) => pass.gathered = Some(gather_columns(&probs, &ids.ids)?),
        (Gather::SelfMatch(ids), Some(probs)) => {
            pass.self_match = Some(probs.matmul(&probs.t()?)?);
            pass.gathered = Some(gather_columns(&probs, &ids.ids)?);
        }
        (_, probs) => pass.probs = probs,
    }
    Ok(pass)
}

/// The cross-entropy's settings in the kernels' terms.
pub(crate) fn kernel_terms(cfg: &CrossEntropyConfig) -> CrossEntropyTerms {
    CrossEntropyTerms {
        pad_id: cfg.pad_id,
        label_smoothing: cfg.label_smoothing,
    }
}

/// The targets on their device for composed ops: `(safe_targets, mask, count)` with pad
/// positions replaced by 0 in `safe_targets`, `mask` u8 1 at non-pad positions and `count` the
/// number of those. Checks the values with one small counted device-to-host copy (the largest
/// non-pad target and the count, in u32: no f64, which Metal lacks).
pub(crate) fn device_targets(
    targets: &Tensor,
    vocab: usize,
    cfg: &CrossEntropyConfig,
) -> Result<(Tensor, Tensor, u32)> {
    let pad_mask = match cfg.pad_id {
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
    let (max_target, counted) = (summary[0], summary[1]);
    if max_target as usize >= vocab {
        bail!(
            "`targets` holds {max_target} (not `pad_id` {:?}), out of the vocabulary (V = {vocab})",
            cfg.pad_id
        );
    }
    if counted == 0 {
        bail!(
            "every one of the {} `targets` is `pad_id` ({:?}): the mean cross-entropy over no positions is undefined",
            targets.elem_count(),
            cfg.pad_id
        );
    }
    Ok((safe_targets, pad_mask, counted))
}

/// The mean cross-entropy as composed candle ops, with the kernel's semantics.
pub(crate) fn cross_entropy_composed(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<Tensor> {
    let (_, _, vocab) = logits.dims3()?;
    let dtype = logits.dtype();
    let (safe_targets, pad_mask, counted) = device_targets(targets, vocab, cfg)?;
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    let target_log_probs = log_probs
        .gather(&safe_targets.unsqueeze(2)?, 2)?
        .squeeze(2)?;
    let eps = cfg.label_smoothing;
    let mut row_loss = target_log_probs.affine(-(1.0 - eps), 0.0)?;
    if eps != 0.0 {
        row_loss = (row_loss - log_probs.mean(2)?.affine(eps, 0.0)?)?;
    }
    let weights = pad_mask.to_dtype(dtype)?;
    (row_loss * &weights)?.sum_all()? / f64::from(counted)
}

/// The BLEU side's hypothesis inputs from validated logits in their compute dtype (and, with
/// `targets`, the cross-entropy from the same pass): the softmax at the reference ids (and EOS)
/// for id references, `P Pᵀ` too for the paired form, every probability for matrix references.
pub(crate) fn hypothesis_pass(
    logits: &Tensor,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
    targets: Option<(&Tensor, &CrossEntropyConfig)>,
) -> Result<(HypothesisInputs, Option<Tensor>)> {
    // On the CPU the kernels find non-finite logits in the pass they make anyway.
    if !logits.device().is_cpu() {
        check_finite("logits", logits, cfg)?;
    }
    match &side.tokens {
        ReferenceTokens::Ids(ids) => {
            let width = ids.dim(1)?;
            let Some(gather_ids) = &side.gather else {
                bail!("internal: id references without gather ids")
            };
            let gather = match cfg.form {
                Form::Paired => Gather::SelfMatch(gather_ids),
                Form::Expected | Form::LowerBound => Gather::Ids(gather_ids),
            };
            let pass = logits_pass(logits, gather, targets)?;
            let Some(gathered) = pass.gathered else {
                bail!("internal: the logits pass gathered nothing")
            };
            let inputs = inputs_from_gathered(&gathered, width, pass.self_match, cfg)?;
            Ok((inputs, pass.cross_entropy))
        }
        ReferenceTokens::Matrices(_) => {
            let pass = logits_pass(logits, Gather::Probs, targets)?;
            let Some(probs) = pass.probs else {
                bail!("internal: the logits pass gave no probabilities")
            };
            let inputs = hypothesis_inputs_from_probs(&probs, side, cfg)?;
            Ok((inputs, pass.cross_entropy))
        }
    }
}

/// The statistics and the loss from the hypothesis inputs.
pub(crate) fn finish(
    inputs: HypothesisInputs,
    side: &ReferenceSide,
    hyp_lengths: Option<&Tensor>,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let (batch, seq, _) = inputs.token_match.dims3()?;
    let (dtype, device) = (
        inputs.token_match.dtype(),
        inputs.token_match.device().clone(),
    );
    let weights = length::hypothesis_weights(
        cfg.length,
        inputs.eos_probs.as_ref(),
        hyp_lengths,
        batch,
        seq,
        cfg.max_order,
        dtype,
        &device,
    )?;
    let form_inputs = forms::FormInputs {
        token_match: &inputs.token_match,
        hyp_self_match: inputs.hyp_self_match.as_ref(),
        hyp: &weights,
        refs: side,
    };
    let matches = forms::clipped_matches(cfg.form, &form_inputs, cfg.max_order)?;
    let zeros = Tensor::zeros(batch, dtype, &device)?;
    let totals: Vec<Tensor> = weights
        .totals
        .iter()
        .map(|g| g.as_ref().map_or_else(|| Ok(zeros.clone()), |g| g.sum(1)))
        .collect::<Result<_>>()?;
    let hyp_len = weights.length.sum(1)?;
    let ref_len = score::closest_reference_lengths(&hyp_len, &side.ref_lengths, &side.ref_mask)?;
    let matches = Tensor::stack(&matches, 1)?;
    let totals = Tensor::stack(&totals, 1)?;
    let stats = BleuStats {
        matches,
        totals,
        hyp_len,
        ref_len,
    };
    let loss = score::score(&stats, cfg)?;
    Ok(BleuLossOutput { loss, stats })
}

/// `cross_entropy + bleu_weight · bleu.loss` and its parts.
pub(crate) fn combine(
    cross_entropy: Tensor,
    bleu: BleuLossOutput,
    bleu_weight: f64,
) -> Result<TrainingLoss> {
    let loss = (&cross_entropy + bleu.loss.affine(bleu_weight, 0.0)?)?;
    Ok(TrainingLoss {
        loss,
        cross_entropy,
        bleu,
    })
}
