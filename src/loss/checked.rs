//! The loss's one validation. Every kind of hypotheses ([`Hypotheses`]: probabilities, logits,
//! or hidden states with the output layer and its blocks) goes through the same three calls —
//! [`bleu_call`], [`cross_entropy_call`], [`training_call`] — once, into checked values that the
//! passes consume without checking again: the hypotheses in their compute dtype
//! ([`CheckedInput`]) and the cross-entropy's targets with their count ([`CheckedTargets`]).
//! Every error names the argument and its shape or value.
//!
//! Value checks that need the data run in place on the CPU, always; off the CPU they take a
//! counted copy to the host only where the config asks for it
//! ([`BleuLossConfig::check_values`]), except the targets' largest id and count (one small
//! copy, which the mean needs anyway). The CPU kernels report a non-finite logit from the pass
//! they make anyway ([`Path::checks_finite`]), so the separate finiteness check is skipped
//! there.

use super::config::{
    compute_dtype, BleuLossConfig, BleuStats, CrossEntropyConfig, CrossEntropyReduction, CtcConfig,
    Form, HiddenConfig, LengthModel, TrainingLossConfig,
};
use super::dispatch::Path;
use super::host;
use super::kernels::cpu::CrossEntropyTerms;
#[cfg(feature = "cuda-unverified")]
use super::kernels::ctc::cuda::DeviceAlignments;
use super::kernels::ctc::op::{non_finite_frame, CtcAlignments};
use super::kernels::softcap;
use super::references::References;
use super::score;
use candle_core::{bail, DType, Device, Result, Tensor};
use candle_nn::Linear;

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

impl<'a> HypothesisShape<'a> {
    /// The shape of the hypothesis tensor `name` (already checked as `[B, S, V]`).
    fn of(name: &'a str, t: &'a Tensor, (batch, seq, vocab): (usize, usize, usize)) -> Self {
        Self {
            name,
            described: format!("`{name}` shape {:?}", t.dims()),
            batch,
            seq,
            vocab,
            device: t.device(),
        }
    }
}

/// Checked hypothesis probabilities or logits `[B, S, V]` (`B, S, V >= 1`), in their compute
/// dtype (f32 for f16/bf16) — except 16-bit logits for the CUDA options kernels, which read them
/// as they are (`Path::runs_options_kernels`) — with the path that runs on them.
pub(crate) struct CheckedHypotheses {
    pub tensor: Tensor,
    pub path: Path,
    /// A soft cap `c` left to the row pass, which reads each logit through `c·tanh(z/c)` (the
    /// CUDA options kernels: `Path::runs_options_kernels`); `None` when `tensor` is capped already or
    /// there is no cap.
    pub softcap: Option<f64>,
}

impl CheckedHypotheses {
    /// The dtype the passes compute in: the tensor's, f32 for 16-bit logits left for the CUDA
    /// options kernels.
    pub(crate) fn compute_dtype(&self) -> DType {
        match self.tensor.dtype() {
            DType::F16 | DType::BF16 => DType::F32,
            dtype => dtype,
        }
    }
}

/// Checked cross-entropy targets: u32 `[B, S]` on the hypotheses' device, each `< V` or the
/// padding id.
pub(crate) struct CheckedTargets<'a> {
    pub targets: &'a Tensor,
    pub terms: CrossEntropyTerms,
    /// `n`, the number of non-pad targets; 0 is refused by the reduction stage
    /// (`reduce::Reducer::divide`) on the sum it reduces over, not here.
    pub count: usize,
    /// `Σ w_t` over the non-pad targets with class weights (`n` without them): the weighted
    /// mean's denominator.
    pub weight_sum: f64,
    /// Which mean the reduction stage takes, set by it (`reduce::Reducer::divide`): the mean
    /// over this batch (divided by `n`, or `Σ w_t` with class weights), or none (a sum, each
    /// position's loss, a data-parallel shard's sum). [`Division::None`] until then.
    pub division: Division,
    /// How the token losses are reduced.
    pub reduction: CrossEntropyReduction,
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
}

impl CheckedTargets<'_> {
    /// What each non-pad row's term is divided by: `n`, `Σ w_t`, or 1, as
    /// [`Self::division`] says.
    pub(crate) fn divisor(&self) -> f64 {
        match self.division {
            Division::None => 1.0,
            Division::Mean => self.count as f64,
            Division::WeightedMean => self.weight_sum,
        }
    }

    /// `1 / divisor`: each non-pad row's weight (`1/n` in a local mean).
    pub(crate) fn inv_count(&self) -> f64 {
        1.0 / self.divisor()
    }

    /// The z-term's row weight over the cross-entropy's: `Σ w_t / n` for a local weighted
    /// mean (the z-term's mean divides by the count, as Liger's does), 1 otherwise.
    pub(crate) fn z_ratio(&self) -> f64 {
        match self.division {
            Division::WeightedMean if self.count > 0 => self.weight_sum / self.count as f64,
            _ => 1.0,
        }
    }
}

/// The hypotheses a loss takes, as its caller gave them: one validation
/// (the `*_call` functions below) and one pass (`pipeline`) for every kind.
#[derive(Clone, Copy)]
pub(crate) enum Hypotheses<'a> {
    /// Probabilities `[B, S, V]` (the BLEU loss alone; composed ops).
    Probs(&'a Tensor),
    /// Logits `[B, S, V]`.
    Logits(&'a Tensor),
    /// Hidden states `[B, S, D]`, the output layer and its blocks: the logits are computed and
    /// dropped block by block.
    Hidden {
        hidden: &'a Tensor,
        proj: &'a Linear,
        blocks: &'a HiddenConfig,
    },
}

/// Checked hypotheses of any kind.
pub(crate) enum CheckedInput {
    /// Probabilities or logits `[B, S, V]` in their compute dtype.
    Tensor {
        checked: CheckedHypotheses,
        /// Probabilities (no softmax is taken), not logits.
        probs: bool,
    },
    /// Hidden states as rows and the output layer in the compute dtype, the blocks, and the
    /// hidden states and layer as given (matrix references materialise the logits from them).
    Hidden {
        checked: CheckedHidden,
        blocks: HiddenConfig,
        given: (Tensor, Linear),
    },
}

impl CheckedInput {
    /// The compute dtype.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            CheckedInput::Tensor { checked, .. } => checked.compute_dtype(),
            CheckedInput::Hidden { checked, .. } => checked.dtype,
        }
    }
}

impl Hypotheses<'_> {
    /// The device the hypotheses are on.
    fn device(&self) -> &Device {
        match self {
            Hypotheses::Probs(t) | Hypotheses::Logits(t) => t.device(),
            Hypotheses::Hidden { hidden, .. } => hidden.device(),
        }
    }
}

/// Whether `cfg` asks for an option beyond the plain CUDA kernels' padding and label smoothing:
/// the z-loss, the token accuracy or class weights, which the CPU kernels, the composed ops and
/// the CUDA options kernels (`cuda-unverified`) compute (`Path::for_options`).
fn beyond_plain_kernels(cfg: &CrossEntropyConfig) -> bool {
    cfg.z_loss != 0.0 || cfg.token_accuracy || cfg.class_weights.is_some()
}

/// The name of a tensor input in messages.
fn input_name(probs: bool) -> &'static str {
    if probs {
        "hyp_probs"
    } else {
        "logits"
    }
}

/// The shape checks of any kind of hypotheses, before any conversion: `[B, S, V]` for
/// tensors; for hidden states, [`hidden_call`]'s checks (which also convert them).
enum ShapedInput<'a> {
    Tensor {
        tensor: &'a Tensor,
        probs: bool,
        dims: (usize, usize, usize),
        path: Path,
    },
    Hidden {
        checked: CheckedHidden,
        blocks: HiddenConfig,
        given: (Tensor, Linear),
    },
}

/// Checks the shapes of `input` (and, for hidden states, converts and checks them as
/// [`hidden_call`] does, NaN/Inf with `check_off_cpu` off the CPU).
fn shaped(input: Hypotheses<'_>, path: Path, check_off_cpu: bool) -> Result<ShapedInput<'_>> {
    Ok(match input {
        Hypotheses::Probs(tensor) | Hypotheses::Logits(tensor) => {
            let probs = matches!(input, Hypotheses::Probs(_));
            let (_, dims) = logits_shape(input_name(probs), tensor)?;
            ShapedInput::Tensor {
                tensor,
                probs,
                dims,
                path,
            }
        }
        Hypotheses::Hidden {
            hidden,
            proj,
            blocks,
        } => ShapedInput::Hidden {
            checked: hidden_call(hidden, proj, blocks, path, check_off_cpu)?,
            blocks: *blocks,
            given: (hidden.clone(), proj.clone()),
        },
    })
}

impl ShapedInput<'_> {
    fn shape(&self) -> HypothesisShape<'_> {
        match self {
            ShapedInput::Tensor {
                tensor,
                probs,
                dims,
                ..
            } => HypothesisShape::of(input_name(*probs), tensor, *dims),
            ShapedInput::Hidden { checked, .. } => checked.shape(),
        }
    }

    /// The checked input: tensors converted to their compute dtype and checked for NaN/Inf
    /// (as [`hypotheses`] does); hidden states as they were checked. With `softcap`, the logits
    /// are capped (`c·tanh(z/c)`): logits by one op before any pass (`kernels::softcap`, which
    /// refuses NaN and Inf on the CPU: `tanh` would hide them from the kernels' own check),
    /// hidden states in their blocks.
    fn finish(self, check_off_cpu: bool, softcap: Option<f64>) -> Result<CheckedInput> {
        Ok(match self {
            ShapedInput::Tensor {
                tensor,
                probs,
                path,
                ..
            } => {
                let name = input_name(probs);
                // The CUDA options kernels read 16-bit logits as they are.
                let native = !probs && path.runs_options_kernels(tensor.device());
                let mut checked = hypotheses(name, tensor, path, check_off_cpu, native)?;
                if let Some(cap) = softcap.filter(|_| !probs) {
                    if native {
                        // The CUDA options kernels cap each logit as the row pass reads it.
                        checked.softcap = Some(cap);
                    } else {
                        // The CPU op refuses NaN and Inf itself; elsewhere `hypotheses` checked.
                        let cpu_kernels = path.runs_cpu_kernels(checked.tensor.device());
                        checked.tensor = softcap::softcap(&checked.tensor, cap, cpu_kernels)?;
                    }
                }
                CheckedInput::Tensor { checked, probs }
            }
            ShapedInput::Hidden {
                mut checked,
                blocks,
                given,
            } => {
                checked.softcap = softcap;
                CheckedInput::Hidden {
                    checked,
                    blocks,
                    given,
                }
            }
        })
    }
}

/// Checked hidden states and output layer: `hidden` as `[B·S, D]` rows, the projection's weight
/// `[V, D]` and bias `[V]`, contiguous, in the compute dtype (f32 for f16/bf16).
pub(crate) struct CheckedHidden {
    pub hidden: Tensor,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub batch: usize,
    pub seq: usize,
    pub vocab: usize,
    pub dtype: DType,
    pub path: Path,
    /// `hidden` and `proj`'s shapes, for messages.
    pub described: String,
    /// Logit soft-capping `c` of the cross-entropy's config (`None`: off), applied to each
    /// block of logits.
    pub softcap: Option<f64>,
}

impl CheckedHidden {
    pub(crate) fn shape(&self) -> HypothesisShape<'_> {
        HypothesisShape {
            name: "hidden",
            described: self.described.clone(),
            batch: self.batch,
            seq: self.seq,
            vocab: self.vocab,
            device: self.hidden.device(),
        }
    }
}

/// Checks a hypothesis tensor of logits or probabilities, `name`: float `[B, S, V]` with
/// `B, S, V >= 1`. Returns the compute dtype (f32 for f16/bf16) and `(B, S, V)`.
fn logits_shape(name: &str, t: &Tensor) -> Result<(DType, (usize, usize, usize))> {
    let dims = match t.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("`{name}` must be [B, S, V], got shape {dims:?}"),
    };
    let compute_dtype = float_compute_dtype(name, t)?;
    if dims.0 == 0 || dims.1 == 0 || dims.2 == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, S and V must be >= 1",
            t.dims()
        );
    }
    Ok((compute_dtype, dims))
}

/// The compute dtype of the float tensor `name`, else an error naming it.
fn float_compute_dtype(name: &str, t: &Tensor) -> Result<DType> {
    compute_dtype(t.dtype()).map_err(|_| {
        candle_core::Error::Msg(format!(
            "`{name}` must be a float tensor, got {:?} with shape {:?}",
            t.dtype(),
            t.dims()
        ))
    })
}

/// Checks hypotheses `name` (`[B, S, V]`) and converts them to their compute dtype; with
/// `check_finite`, refuses NaN and Inf unless the path's kernels find them in their own pass
/// (in place on the CPU; off it a copy, only with `check_off_cpu`).
fn hypotheses(
    name: &str,
    t: &Tensor,
    path: Path,
    check_off_cpu: bool,
    keep_16bit: bool,
) -> Result<CheckedHypotheses> {
    let (dtype, _) = logits_shape(name, t)?;
    let tensor = match t.dtype() {
        DType::F16 | DType::BF16 if keep_16bit => t.clone(),
        _ => t.to_dtype(dtype)?,
    };
    if !path.checks_finite(tensor.device()) {
        finite(name, &tensor, check_off_cpu)?;
    }
    Ok(CheckedHypotheses {
        tensor,
        path,
        softcap: None,
    })
}

/// The arguments of a BLEU loss on any kind of hypotheses, checked: [`bleu_loss`](super::bleu_loss),
/// [`bleu_loss_from_logits`](super::bleu_loss_from_logits),
/// [`bleu_loss_from_hidden`](super::bleu_loss_from_hidden) and their data-parallel forms.
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
/// [`cross_entropy_from_logits`](super::cross_entropy_from_logits),
/// [`cross_entropy_from_hidden`](super::cross_entropy_from_hidden) and their data-parallel forms.
pub(crate) fn cross_entropy_call<'a>(
    input: Hypotheses<'_>,
    targets: &'a Tensor,
    cfg: &CrossEntropyConfig,
    path: Path,
) -> Result<(CheckedInput, CheckedTargets<'a>)> {
    let path = path.for_options(input.device(), beyond_plain_kernels(cfg));
    softcap_with_blocks(cfg, &input)?;
    let shaped = shaped(input, path, false)?;
    let targets = input_targets(&shaped.shape(), targets, cfg)?;
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
/// targets, and `bleu_weight` (returned): [`ce_bleu_from_logits`](super::ce_bleu_from_logits),
/// [`ce_bleu_from_hidden`](super::ce_bleu_from_hidden) and their data-parallel forms.
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
        let targets = input_targets(&shape, targets, &cfg.ce)?;
        bleu_arguments(&shape, hyp_lengths, refs, &cfg.bleu)?;
        targets
    };
    // Capping changes the model's distribution: the BLEU term sees the capped logits too.
    let input = shaped.finish(cfg.bleu.check_values, cfg.ce.softcap)?;
    Ok((input, targets, bleu_weight))
}

/// The cross-entropy's targets checked against the hypotheses' `[B, S, V]`.
fn input_targets<'a>(
    shape: &HypothesisShape,
    targets: &'a Tensor,
    cfg: &CrossEntropyConfig,
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
    )
}

/// Checks the hidden states `[B, S, D]` and the output layer (weight `[V, D]`, optional bias
/// `[V]`, the dtype and device of `hidden`) and the block settings; converts them to rows in
/// the compute dtype. With `check_off_cpu`, and on the CPU when the path's kernels do not find
/// non-finite logits themselves, refuses NaN and Inf in each.
pub(crate) fn hidden_call(
    hidden: &Tensor,
    proj: &Linear,
    hidden_cfg: &HiddenConfig,
    path: Path,
    check_off_cpu: bool,
) -> Result<CheckedHidden> {
    hidden_cfg.validate()?;
    let (batch, seq, dim) = match hidden.dims() {
        &[b, s, d] => (b, s, d),
        dims => bail!("`hidden` must be [B, S, D], got shape {dims:?}"),
    };
    let dtype = float_compute_dtype("hidden", hidden)?;
    if batch == 0 || seq == 0 || dim == 0 {
        bail!(
            "`hidden` has an empty dimension: shape {:?}; B, S and D must be >= 1",
            hidden.dims()
        );
    }
    let weight = proj.weight();
    let vocab = match weight.dims() {
        &[v, d] if d == dim && v >= 1 => v,
        dims => bail!(
            "`proj.weight` must be [V, D] with V >= 1 and D = {dim} (the last dimension of `hidden` {:?}), got shape {dims:?}",
            hidden.dims()
        ),
    };
    let same_kind = |name: &str, t: &Tensor| -> Result<()> {
        if t.dtype() != hidden.dtype() {
            bail!(
                "`{name}` is {:?} but `hidden` is {:?}: the projection takes one dtype",
                t.dtype(),
                hidden.dtype()
            );
        }
        if !t.device().same_device(hidden.device()) {
            bail!(
                "`{name}` is on {:?} but `hidden` is on {:?}",
                t.device(),
                hidden.device()
            );
        }
        Ok(())
    };
    same_kind("proj.weight", weight)?;
    if let Some(bias) = proj.bias() {
        if bias.dims() != [vocab] {
            bail!(
                "`proj.bias` must be [V] = [{vocab}] (the V of `proj.weight` {:?}), got shape {:?}",
                weight.dims(),
                bias.dims()
            );
        }
        same_kind("proj.bias", bias)?;
    }
    let prepare = |t: &Tensor| t.to_dtype(dtype)?.contiguous();
    let checked = CheckedHidden {
        hidden: prepare(&hidden.reshape((batch * seq, dim))?)?,
        weight: prepare(weight)?,
        bias: proj.bias().map(prepare).transpose()?,
        batch,
        seq,
        vocab,
        dtype,
        path,
        described: format!(
            "`hidden` shape {:?}, `proj.weight` shape {:?}",
            hidden.dims(),
            weight.dims()
        ),
        softcap: None,
    };
    if !path.checks_finite(hidden.device()) {
        finite("hidden", &checked.hidden, check_off_cpu)?;
        finite("proj.weight", &checked.weight, check_off_cpu)?;
        if let Some(bias) = &checked.bias {
            finite("proj.bias", bias, check_off_cpu)?;
        }
    }
    Ok(checked)
}

/// The logits `proj.forward(hidden)` of checked hidden states, materialised (for matrix
/// references, which are `[B, T, V]` themselves), as checked hypotheses in the compute dtype:
/// finite inputs can still overflow to infinite logits, so they are checked as logits are.
pub(crate) fn materialised_logits(
    inputs: &CheckedHidden,
    logits: Tensor,
    check_off_cpu: bool,
) -> Result<CheckedHypotheses> {
    let mut tensor = logits.to_dtype(inputs.dtype)?;
    if !inputs.path.checks_finite(tensor.device()) {
        finite("logits", &tensor, check_off_cpu)?;
    }
    if let Some(cap) = inputs.softcap {
        // The CPU op refuses NaN and Inf, which `tanh` would hide from the kernels' own check.
        let cpu_kernels = inputs.path.runs_cpu_kernels(tensor.device());
        tensor = softcap::softcap(&tensor, cap, cpu_kernels)?;
    }
    Ok(CheckedHypotheses {
        tensor,
        path: inputs.path,
        softcap: None,
    })
}

/// Checks the lengths, the references and the config's `eos_id` against the hypotheses'
/// `[B, S, V]` (the config itself is checked by the caller).
pub(crate) fn bleu_arguments(
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
fn reference_arguments(hyp: &HypothesisShape, refs: &References) -> Result<()> {
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
/// elsewhere the largest non-pad target and the count come back in one small counted copy (in
/// u32: no f64, which Metal lacks).
fn checked_targets<'a>(
    targets: &'a Tensor,
    (batch, seq, vocab): (usize, usize, usize),
    name: &str,
    described: &str,
    device: &Device,
    cfg: &CrossEntropyConfig,
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
        targets,
        terms: CrossEntropyTerms {
            pad_id,
            label_smoothing: eps,
            class_weights: cfg.class_weights.clone(),
            z_loss: cfg.z_loss,
            token_accuracy: cfg.token_accuracy,
        },
        count,
        weight_sum: if class_weights.is_some() {
            weight_sum
        } else {
            count as f64
        },
        division: Division::None,
        reduction: cfg.reduction,
    })
}

/// `bleu_weight` if it is finite and `>= 0`, else an error naming it.
fn checked_bleu_weight(bleu_weight: f64) -> Result<f64> {
    if !(bleu_weight.is_finite() && bleu_weight >= 0.0) {
        bail!("`bleu_weight` must be finite and >= 0, got {bleu_weight}");
    }
    Ok(bleu_weight)
}

/// Errors if `t` holds NaN or Inf: in place on the CPU, with a copy elsewhere only when
/// `check_off_cpu`.
fn finite(name: &str, t: &Tensor, check_off_cpu: bool) -> Result<()> {
    if host::all_finite(t, check_off_cpu)? == Some(false) {
        bail!(
            "`{name}` contains NaN or infinite values (shape {:?})",
            t.dims()
        );
    }
    Ok(())
}

// =============================================================================================
// Statistics a caller gives: `loss_from_stats`'s, and a data-parallel worker's own before the
// all-reduce (`DataParallel::{bleu_loss_from_stats, global_stats}`, and the group's loss on the
// statistics of its own pass).
// =============================================================================================

/// The arguments of [`loss_from_stats`](super::loss_from_stats), checked: the config; `matches`
/// and `totals` float `[B, N]` with `N = max_order` and `B >= 1`, `hyp_len` and `ref_len` float
/// `[B]`, all on one device; every value finite and `>= 0` ([`stats_values`]). Each message
/// starts with `loss_from_stats: `.
pub(crate) fn stats_call(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<()> {
    let BleuStats {
        matches,
        totals,
        hyp_len,
        ref_len,
    } = stats;
    score::validate_config(cfg)?;
    let (batch, orders) = match matches.dims() {
        &[b, n] => (b, n),
        dims => bail!("loss_from_stats: `stats.matches` must be [B, N], got shape {dims:?}"),
    };
    if orders != cfg.max_order {
        bail!(
            "loss_from_stats: `stats.matches` has {orders} orders (shape {:?}) but `max_order` is {}",
            matches.dims(),
            cfg.max_order
        );
    }
    if totals.dims() != matches.dims() {
        bail!(
            "loss_from_stats: `stats.totals` has shape {:?}, `stats.matches` {:?}",
            totals.dims(),
            matches.dims()
        );
    }
    for (name, t) in [("hyp_len", hyp_len), ("ref_len", ref_len)] {
        if t.dims() != [batch] {
            bail!(
                "loss_from_stats: `stats.{name}` must be [{batch}], got shape {:?}",
                t.dims()
            );
        }
    }
    if batch == 0 {
        bail!(
            "loss_from_stats: empty batch (`stats.matches` has shape {:?})",
            matches.dims()
        );
    }
    for (name, t) in [
        ("matches", matches),
        ("totals", totals),
        ("hyp_len", hyp_len),
        ("ref_len", ref_len),
    ] {
        if !t.dtype().is_float() {
            bail!(
                "loss_from_stats: `stats.{name}` must be a float tensor, got {:?} with shape {:?}",
                t.dtype(),
                t.dims()
            );
        }
        if !t.device().same_device(matches.device()) {
            bail!(
                "loss_from_stats: `stats.{name}` is on {:?} but `stats.matches` on {:?}",
                t.device(),
                matches.device()
            );
        }
    }
    stats_values("loss_from_stats: ", stats, cfg.check_values)
}

/// A data-parallel worker's own statistics, checked before they go into the all-reduce, where
/// another worker's sums could hide them: the shapes ([`shard_stats_shapes`]), every value
/// finite and `>= 0` ([`stats_values`]), the config, and `N = max_order`.
pub(crate) fn shard_stats(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<()> {
    shard_stats_shapes(stats)?;
    stats_values("", stats, cfg.check_values)?;
    score::validate_config(cfg)?;
    let orders = stats.matches.dim(1)?;
    if orders != cfg.max_order {
        bail!(
            "`stats.matches` has {orders} orders (shape {:?}) but `max_order` is {}",
            stats.matches.dims(),
            cfg.max_order
        );
    }
    Ok(())
}

/// Errors unless a worker's statistics are `matches`/`totals` `[B, N]` and `hyp_len`/`ref_len`
/// `[B]` with at least one element (every worker needs one).
pub(crate) fn shard_stats_shapes(stats: &BleuStats) -> Result<()> {
    let (batch, orders) = match stats.matches.dims() {
        &[b, n] => (b, n),
        dims => bail!("`stats.matches` must be [B, N], got shape {dims:?}"),
    };
    if stats.totals.dims() != [batch, orders]
        || stats.hyp_len.dims() != [batch]
        || stats.ref_len.dims() != [batch]
    {
        bail!(
            "`stats` must be matches/totals [B, N] and hyp_len/ref_len [B], got {:?}, {:?}, {:?}, {:?}",
            stats.matches.dims(),
            stats.totals.dims(),
            stats.hyp_len.dims(),
            stats.ref_len.dims()
        );
    }
    if batch == 0 {
        bail!(
            "`stats` of an empty shard (shape {:?}): every worker needs at least one element",
            stats.matches.dims()
        );
    }
    Ok(())
}

/// Errors unless every statistic is finite and `>= 0` (on the CPU always, elsewhere when
/// `check_off_cpu`; see [`BleuLossConfig::check_values`]). No text gives a negative count or
/// length: negative values would be scored as a finite, wrong loss, and a NaN or infinite one
/// would give a NaN loss and NaN gradients. `context` prefixes the message.
fn stats_values(context: &str, stats: &BleuStats, check_off_cpu: bool) -> Result<()> {
    let named = [
        ("matches", &stats.matches),
        ("totals", &stats.totals),
        ("hyp_len", &stats.hyp_len),
        ("ref_len", &stats.ref_len),
    ];
    for (name, t) in named {
        match host::finite_and_nonnegative(t, check_off_cpu)? {
            Some((false, _)) => bail!(
                "{context}`stats.{name}` contains NaN or infinite values (shape {:?})",
                t.dims()
            ),
            Some((true, false)) => bail!(
                "{context}`stats.{name}` contains negative values (shape {:?}): counts and \
                 lengths are >= 0",
                t.dims()
            ),
            _ => {}
        }
    }
    Ok(())
}

// =============================================================================================
// CTC: the arguments of `ctc_loss`, `ctc_loss_from_logits`, their composed references and
// `ctc_greedy_decode`. Lengths and targets are read to the host (counted copies: the alignment
// structure is built there); the pieces below are meant for every CTC entry point.
// =============================================================================================

/// Checked arguments of a CTC loss: the input in its compute dtype, the targets and lengths
/// (read and checked on the host, or left on the device) and the path.
pub(crate) struct CheckedCtc {
    /// The input `[B, T', V]` in its compute dtype (f32 for f16/bf16), contiguous.
    pub input: Tensor,
    pub targets: CtcTargets,
    pub path: Path,
}

/// A CTC loss's targets and lengths, as the loss takes them.
pub(crate) enum CtcTargets {
    /// Read to the host and checked there (three counted copies off the CPU): the alignments
    /// every back-end takes, and each target length (for the mean).
    Host {
        alignments: CtcAlignments,
        target_lengths: Vec<usize>,
    },
    /// Left on the device, never read by the host: the CUDA kernels' training path with
    /// `check_values` off (`cuda-unverified`). Dtypes and shapes are checked, values are not: an
    /// element out of range gets a NaN loss and NaN gradients from the kernels.
    #[cfg(feature = "cuda-unverified")]
    Device(DeviceAlignments),
}

/// Checks a batch-first CTC input `name` (`log_probs` or `logits`): float `[B, T', V]` with
/// `B, T', V >= 1`. Returns the compute dtype (f32 for f16/bf16) and `(B, T', V)`.
pub(crate) fn ctc_input_shape(name: &str, t: &Tensor) -> Result<(DType, (usize, usize, usize))> {
    let dims = match t.dims() {
        &[b, frames, v] => (b, frames, v),
        dims => bail!(
            "`{name}` must be batch-first [B, T', V] (PyTorch's ctc_loss takes time-first [T, B, V]), got shape {dims:?}"
        ),
    };
    let dtype = float_compute_dtype(name, t)?;
    if dims.0 == 0 || dims.1 == 0 || dims.2 == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, T' and V must be >= 1",
            t.dims()
        );
    }
    Ok((dtype, dims))
}

/// Checks that `name` is a u32, i32 or i64 tensor of `shape` (described as `expected`) on
/// `device`, without reading it.
fn ctc_integer_tensor(
    name: &str,
    t: &Tensor,
    shape: &[usize],
    expected: &str,
    device: &Device,
) -> Result<()> {
    if !matches!(t.dtype(), DType::U32 | DType::I32 | DType::I64) || t.dims() != shape {
        bail!(
            "`{name}` must be u32, i32 or i64 {expected}, got {:?} with shape {:?}",
            t.dtype(),
            t.dims()
        );
    }
    if !t.device().same_device(device) {
        bail!(
            "`{name}` is on {:?} but the input is on {device:?}",
            t.device()
        );
    }
    Ok(())
}

/// The values of the integer tensor `name` (u32, i32 or i64, any shape) as i64, in one counted
/// copy to the host, after checking its dtype, its shape (`shape`, described in `expected`) and
/// its device.
fn ctc_integers(
    name: &str,
    t: &Tensor,
    shape: &[usize],
    expected: &str,
    device: &Device,
) -> Result<Vec<i64>> {
    ctc_integer_tensor(name, t, shape, expected, device)?;
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::U32 => host::to_vec1::<u32>(&flat)?
            .into_iter()
            .map(i64::from)
            .collect(),
        DType::I32 => host::to_vec1::<i32>(&flat)?
            .into_iter()
            .map(i64::from)
            .collect(),
        _ => host::to_vec1::<i64>(&flat)?,
    })
}

/// Checked lengths `name` (u32, i32 or i64 `[B]`, each in `0..=limit`, the size of the
/// dimension `limit_name`), on the host.
fn ctc_lengths(
    name: &str,
    lengths: &Tensor,
    batch: usize,
    (limit, limit_name): (usize, &str),
    described: &str,
    device: &Device,
) -> Result<Vec<usize>> {
    let values = ctc_integers(
        name,
        lengths,
        &[batch],
        &format!("[{batch}] ({described})"),
        device,
    )?;
    values
        .iter()
        .enumerate()
        .map(|(b, &length)| {
            if length < 0 {
                bail!("`{name}[{b}]` = {length} is negative");
            }
            if length as usize > limit {
                bail!("`{name}[{b}]` = {length} exceeds {limit_name} = {limit} ({described})");
            }
            Ok(length as usize)
        })
        .collect()
}

/// Checked `input_lengths` of a CTC input `[B, T', V]` (described in `described`): u32, i32 or
/// i64 `[B]` on `device`, each in `0..=T'`, as host values (one counted copy).
pub(crate) fn ctc_input_lengths(
    input_lengths: &Tensor,
    (batch, frames): (usize, usize),
    described: &str,
    device: &Device,
) -> Result<Vec<usize>> {
    ctc_lengths(
        "input_lengths",
        input_lengths,
        batch,
        (frames, "T'"),
        described,
        device,
    )
}

/// Checks that `blank` is in the vocabulary `V` (of the input described in `described`).
pub(crate) fn ctc_blank(blank: u32, vocab: usize, described: &str) -> Result<()> {
    if blank as usize >= vocab {
        bail!("`blank` {blank} is out of the vocabulary (V = {vocab}, {described})");
    }
    Ok(())
}

/// Checked CTC targets: `targets` u32, i32 or i64 `[B, L]` on `device`, `target_lengths` likewise
/// `[B]`, each `<= L`; the first `target_lengths[b]` ids of row `b` each `< V` and not `blank`
/// (the rest is padding, not read). Returns each element's target on the host and the lengths
/// (two counted copies).
pub(crate) fn ctc_targets(
    targets: &Tensor,
    target_lengths: &Tensor,
    (batch, vocab): (usize, usize),
    blank: u32,
    described: &str,
    device: &Device,
) -> Result<(Vec<Vec<u32>>, Vec<usize>)> {
    let width = match targets.dims() {
        &[b, width] if b == batch => width,
        dims => bail!(
            "`targets` must be padded [B, L] with B = {batch} ({described}), got shape {dims:?}"
        ),
    };
    let lengths = ctc_lengths(
        "target_lengths",
        target_lengths,
        batch,
        (width, "L, the width of `targets`"),
        described,
        device,
    )?;
    let ids = ctc_integers(
        "targets",
        targets,
        &[batch, width],
        &format!("[{batch}, {width}]"),
        device,
    )?;
    let mut out = Vec::with_capacity(batch);
    for (b, &length) in lengths.iter().enumerate() {
        let row = &ids[b * width..b * width + length];
        let mut target = Vec::with_capacity(length);
        for (j, &id) in row.iter().enumerate() {
            if id < 0 || id as usize >= vocab {
                bail!("`targets[{b}, {j}]` = {id} is out of the vocabulary (V = {vocab}, {described})");
            }
            if id == i64::from(blank) {
                bail!(
                    "`targets[{b}, {j}]` = {id} is the blank: targets hold labels only (`target_lengths[{b}]` = {length})"
                );
            }
            target.push(id as u32);
        }
        out.push(target);
    }
    Ok((out, lengths))
}

/// The arguments of a CTC loss on `name` (`log_probs`, or `logits` when `from_logits`),
/// checked: the input, the targets and both lengths, each input length `>= 1`, `cfg.blank`.
/// Where the CUDA kernels run with `cfg.check_values` off (`cuda-unverified`), the targets and
/// lengths stay on the device: their dtypes, shapes and device are checked, not their values.
/// The frames within the input lengths are checked for NaN and `+inf` (and `-inf` from logits)
/// where the path's kernel does not find them in its own pass: on the CPU in place, off it
/// only with `cfg.check_values` (one counted copy).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ctc_call(
    name: &str,
    input: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
    from_logits: bool,
    path: Path,
) -> Result<CheckedCtc> {
    let blank = cfg.blank;
    let (dtype, (batch, frames, vocab)) = ctc_input_shape(name, input)?;
    let described = format!("`{name}` shape {:?}", input.dims());
    let device = input.device();
    ctc_blank(blank, vocab, &described)?;
    #[cfg(feature = "cuda-unverified")]
    if path.runs_ctc_kernels(device) && !device.is_cpu() && !cfg.check_values {
        // The training path off the CPU: nothing is read to the host.
        let width = match targets.dims() {
            &[b, width] if b == batch => width,
            dims => bail!(
                "`targets` must be padded [B, L] with B = {batch} ({described}), got shape {dims:?}"
            ),
        };
        ctc_integer_tensor(
            "targets",
            targets,
            &[batch, width],
            &format!("[{batch}, {width}]"),
            device,
        )?;
        for (name, lengths) in [
            ("input_lengths", input_lengths),
            ("target_lengths", target_lengths),
        ] {
            ctc_integer_tensor(
                name,
                lengths,
                &[batch],
                &format!("[{batch}] ({described})"),
                device,
            )?;
        }
        let alignments = DeviceAlignments::unchecked(
            targets,
            (input_lengths, target_lengths),
            blank,
            cfg.zero_infinity,
        )?;
        return Ok(CheckedCtc {
            input: input.to_dtype(dtype)?.contiguous()?,
            targets: CtcTargets::Device(alignments),
            path,
        });
    }
    let lengths = ctc_input_lengths(input_lengths, (batch, frames), &described, device)?;
    if let Some(b) = lengths.iter().position(|&l| l == 0) {
        bail!("`input_lengths[{b}]` = 0: every element needs at least one frame to align");
    }
    let (targets, target_lengths) = ctc_targets(
        targets,
        target_lengths,
        (batch, vocab),
        blank,
        &described,
        device,
    )?;
    let input = input.to_dtype(dtype)?.contiguous()?;
    if !path.runs_cpu_kernels(device) {
        ctc_finite_input(name, &input, &lengths, from_logits, cfg.check_values)?;
    }
    Ok(CheckedCtc {
        input,
        targets: CtcTargets::Host {
            alignments: CtcAlignments {
                targets,
                input_lengths: lengths,
                blank,
                zero_infinity: cfg.zero_infinity,
            },
            target_lengths,
        },
        path,
    })
}

/// Errors if a frame within the input lengths of `input` (`[B, T', V]`, f32 or f64) holds NaN
/// or `+inf`, or from logits `-inf`: read in place on the CPU; off it with `check_off_cpu`
/// from one counted copy to the host, else not checked. Frames beyond the lengths are never
/// read.
fn ctc_finite_input(
    name: &str,
    input: &Tensor,
    lengths: &[usize],
    from_logits: bool,
    check_off_cpu: bool,
) -> Result<()> {
    if input.device().is_cpu() {
        return ctc_finite_frames(name, &input.contiguous()?, lengths, from_logits);
    }
    if !check_off_cpu {
        return Ok(());
    }
    let on_host = match input.dtype() {
        DType::F64 => Tensor::from_vec(
            host::to_vec1::<f64>(&input.flatten_all()?)?,
            input.shape(),
            &Device::Cpu,
        )?,
        _ => Tensor::from_vec(
            host::to_vec1::<f32>(&input.flatten_all()?)?,
            input.shape(),
            &Device::Cpu,
        )?,
    };
    ctc_finite_frames(name, &on_host, lengths, from_logits)
}

/// Errors if a frame within the input lengths of the CPU tensor `input` (`[B, T', V]`, f32 or
/// f64) holds NaN or `+inf`, or from logits `-inf`, read in place.
fn ctc_finite_frames(
    name: &str,
    input: &Tensor,
    lengths: &[usize],
    from_logits: bool,
) -> Result<()> {
    let (_, frames, vocab) = input.dims3()?;
    let bad = |x: f64| x.is_nan() || x == f64::INFINITY || (from_logits && x == f64::NEG_INFINITY);
    fn first_bad(
        mut values: impl Iterator<Item = f64>,
        bad: impl Fn(f64) -> bool,
    ) -> Option<usize> {
        values.position(bad)
    }
    let found = match input.dtype() {
        DType::F64 => host::with_cpu_slice::<f64, _>(input, |s| {
            Ok(lengths.iter().enumerate().find_map(|(b, &l)| {
                let frames_of = &s[b * frames * vocab..(b * frames + l) * vocab];
                first_bad(frames_of.iter().copied(), bad).map(|i| (b, i / vocab))
            }))
        })?,
        _ => host::with_cpu_slice::<f32, _>(input, |s| {
            Ok(lengths.iter().enumerate().find_map(|(b, &l)| {
                let frames_of = &s[b * frames * vocab..(b * frames + l) * vocab];
                first_bad(frames_of.iter().map(|&x| f64::from(x)), bad).map(|i| (b, i / vocab))
            }))
        })?,
    };
    if let Some(frame) = found {
        return Err(non_finite_frame(name, from_logits, frame, input.dims()));
    }
    Ok(())
}

/// The arguments of `ctc_greedy_decode`, checked: `logits` `[B, T', V]` (any float dtype), the
/// blank, and the input lengths (`T'` each without them). Returns the lengths on the host.
pub(crate) fn ctc_decode_call(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    blank: u32,
) -> Result<Vec<usize>> {
    let (_, (batch, frames, vocab)) = ctc_input_shape("logits", logits)?;
    let described = format!("`logits` shape {:?}", logits.dims());
    ctc_blank(blank, vocab, &described)?;
    match input_lengths {
        Some(lengths) => ctc_input_lengths(lengths, (batch, frames), &described, logits.device()),
        None => Ok(vec![frames; batch]),
    }
}

// ---- BLEU on CTC outputs ----------------------------------------------------------------------

/// Checked arguments of the BLEU loss on CTC outputs: the logits in their compute dtype, the
/// frames each element uses (on the host where they can be read in place or were checked), and
/// the `[B, T']` frame mask on the logits' device.
pub(crate) struct CheckedCtcLogits {
    pub logits: CheckedHypotheses,
    /// `frames[b]`: element `b`'s input length; `None` off the CPU without `check_values`
    /// (the composed ops read the lengths on the device).
    pub frames: Option<Vec<usize>>,
    /// `[B, T']` in the compute dtype: 1 at the frames in use, 0 beyond.
    pub frame_mask: Tensor,
}

/// The arguments of the BLEU loss on CTC outputs, checked: `logits` `[B, T', V]`,
/// `input_lengths` (u32, i32 or i64 `[B]`, each `<= T'`), id `refs` none of whose tokens is `blank`,
/// `blank < V`; `cfg` is checked by [`ctc_bleu_config`] (its `max_order` and `check_values`
/// are read here).
pub(crate) fn ctc_bleu_call(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &BleuLossConfig,
    path: Path,
) -> Result<CheckedCtcLogits> {
    ctc_bleu_config(cfg)?;
    let check_values = cfg.check_values;
    let (compute, dims) = logits_shape("logits", logits)?;
    let (batch, frames, vocab) = dims;
    let shape = HypothesisShape::of("logits", logits, dims);
    ctc_blank(blank, vocab, &shape.described)?;
    reference_arguments(&shape, refs)?;
    let Some(ids) = refs.ids() else {
        bail!(
            "ctc_bleu_loss: `refs` must be token ids (References::from_ids): the dynamic programs over the frames count reference n-grams by id"
        );
    };
    for (element, element_refs) in ids.iter().enumerate() {
        for (r, reference) in element_refs.iter().enumerate() {
            if let Some(position) = reference.iter().position(|&id| id == blank) {
                bail!(
                    "`refs`: reference {r} of batch element {element} holds the blank id {blank} at position {position}: a CTC output never emits the blank"
                );
            }
        }
    }
    // The kernel reads the lengths on the host: in place on the CPU. Off the CPU the composed
    // ops read them on the device (the frame mask), so they are copied only to be checked.
    let frame_counts = match input_lengths {
        None => Some(vec![frames; batch]),
        Some(lengths) if logits.device().is_cpu() || check_values => Some(ctc_input_lengths(
            lengths,
            (batch, frames),
            &shape.described,
            logits.device(),
        )?),
        Some(lengths) => {
            ctc_integer_tensor(
                "input_lengths",
                lengths,
                &[batch],
                &format!("[{batch}] ({})", shape.described),
                logits.device(),
            )?;
            None
        }
    };
    // Only the frames in use are checked, as `ctc_loss` does: padding frames may hold anything,
    // NaN included (the composed ops zero them before the softmax). The CPU kernel finds
    // non-finite logits in its own pass over those frames.
    let logits = CheckedHypotheses {
        tensor: logits.to_dtype(compute)?,
        path,
        softcap: None,
    };
    if !path.checks_finite(logits.tensor.device()) {
        if let Some(frames) = &frame_counts {
            ctc_finite_input("logits", &logits.tensor, frames, true, check_values)?;
        }
    }
    let (dtype, device) = (logits.tensor.dtype(), logits.tensor.device());
    let frame_mask = match input_lengths {
        None => Tensor::ones((batch, frames), dtype, device)?,
        Some(lengths) => Tensor::arange(0u32, frames as u32, device)?
            .unsqueeze(0)?
            .broadcast_lt(&lengths.to_dtype(DType::U32)?.unsqueeze(1)?)?
            .to_dtype(dtype)?,
    };
    Ok(CheckedCtcLogits {
        logits,
        frames: frame_counts,
        frame_mask,
    })
}

/// Checks that a BLEU loss config applies to CTC outputs: the `Expected` form (the others pair
/// hypothesis positions, which a collapsed sequence does not have) and `Given` lengths (the
/// collapse decides the length; there is no EOS to stop at).
fn ctc_bleu_config(cfg: &BleuLossConfig) -> Result<()> {
    score::validate_config(cfg)?;
    if cfg.length != LengthModel::Given {
        bail!(
            "ctc_bleu_loss: `length` {:?} does not apply to CTC outputs: the collapsed sequence's length is the expected number of runs, so no EOS length model applies; use LengthModel::Given",
            cfg.length
        );
    }
    if cfg.form != Form::Expected {
        bail!(
            "ctc_bleu_loss: `form` {:?} does not apply to CTC outputs: only Form::Expected (clip each reference n-gram's expected count in the collapsed sequence) has no hypothesis positions to pair",
            cfg.form
        );
    }
    Ok(())
}
