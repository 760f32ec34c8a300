//! The differentiable BLEU loss (SPEC §2).
//!
//! Hypothesis distributions `[B, S, V]` and references go through candle tensor ops — token
//! matches, n-gram products, first-occurrence masks, clipped counts, lengths, brevity penalty —
//! to `-log BLEU`, with gradients through candle's autograd.
//!
//! - [`references`]: the references and their side of the statistics (`ν`, `κ`), from ids or
//!   matrices;
//! - [`length`](self::length): the length models `Given`, `NotEos`, `SoftEos`;
//! - [`forms`](self::forms): the expected, paired and lower-bound forms of the clipped matches;
//! - [`fused`]: CPU kernels for softmax-gather and softmax with hand-written backwards;
//! - [`cross_entropy_from_logits`]: fused token cross-entropy (PyTorch's `F.cross_entropy`);
//! - [`ce_bleu_from_logits`]: cross-entropy + BLEU of a training step in one pass over the logits;
//! - [`score`]: smoothing, guards, brevity penalty, reductions ([`loss_from_stats`]).

mod cross_entropy;
mod forms;
pub mod fused;
mod length;
mod products;
pub mod references;
pub mod score;
mod training;

#[doc(hidden)]
pub use cross_entropy::exp_nonpositive_in_place;
pub use cross_entropy::{cross_entropy_from_logits, CrossEntropyConfig};
pub use references::References;
pub use score::{log_brevity_penalty, loss_from_stats, PRECISION_FLOOR};
pub use training::{ce_bleu_from_logits, TrainingLoss};

use candle_core::{bail, DType, Result, Tensor};
use forms::FormInputs;
use references::{ReferenceSide, ReferenceTokens};

/// How the clipped matches `m_n` are made differentiable (SPEC §2). All three are exact at
/// one-hot inputs with `Given` lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// `m_n = Σ_j min(κ_j, ν_j Σ_i M[j,i] u_i)`: clip the expected count of each reference
    /// n-gram. No `V`-sized hypothesis self-match; the fused kernel applies.
    #[default]
    Expected,
    /// The derivation's form: hypothesis and reference first-occurrence masks, clipped and
    /// unclipped counts over pairs, their minimum. Needs `Z = P Pᵀ` (a `V`-sized matmul).
    Paired,
    /// Zhukov, Golikov & Kretov (2017): `Σ_{j,i} a_{ji} min(1, κ_j / (1 + E_j - a_{ji}))`.
    LowerBound,
}

/// Which hypothesis positions count as output (SPEC §2 table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LengthModel {
    /// Hard lengths from `hyp_lengths` (or `S`): exact BLEU at one-hot inputs.
    #[default]
    Given,
    /// Hard lengths, and each position's length weight is `1 - P[i, eos]` (the derivation's
    /// `len_B = (1 - B_eᵀ) ⊗ E`).
    NotEos { eos_id: u32 },
    /// Differentiable stopping: position `i` is output with probability
    /// `s_i = Π_{k<=i} (1 - P[k, eos])`. Takes no hard lengths.
    SoftEos { eos_id: u32 },
}

impl LengthModel {
    fn eos_id(self) -> Option<u32> {
        match self {
            LengthModel::Given => None,
            LengthModel::NotEos { eos_id } | LengthModel::SoftEos { eos_id } => Some(eos_id),
        }
    }
}

/// How a batch becomes one loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Sum `m_n`, `t_n`, `c`, `L` over the batch, then one BLEU (corpus BLEU).
    #[default]
    Corpus,
    /// One BLEU per element; the loss is the mean of the per-element losses.
    SentenceMean,
}

/// Smoothing of the n-gram precisions inside the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossSmoothing {
    /// `m_n / t_n` for every order.
    None,
    /// BLEU+1 (Lin & Och 2004): `(m_n + k) / (t_n + k)` for orders `n >= 2`, `m_1 / t_1`.
    AddK(f64),
}

impl Default for LossSmoothing {
    fn default() -> Self {
        LossSmoothing::AddK(1.0)
    }
}

/// Configuration of [`bleu_loss`]. Default: 4-grams, uniform weights, `Expected`, `Given`,
/// `Corpus`, `AddK(1.0)`.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuLossConfig {
    /// Maximum n-gram order `N` (>= 1).
    pub max_order: usize,
    /// Order weights `w_1..w_N` (finite, >= 0); `None` = `1/N` each.
    pub weights: Option<Vec<f64>>,
    pub form: Form,
    pub length: LengthModel,
    pub reduction: Reduction,
    pub smoothing: LossSmoothing,
}

impl Default for BleuLossConfig {
    fn default() -> Self {
        Self {
            max_order: 4,
            weights: None,
            form: Form::Expected,
            length: LengthModel::Given,
            reduction: Reduction::Corpus,
            smoothing: LossSmoothing::AddK(1.0),
        }
    }
}

/// The loss and the differentiable statistics it was computed from.
///
/// The statistics let a caller log them, or all-reduce them across data-parallel workers and
/// call [`loss_from_stats`] on the sums.
#[derive(Debug, Clone)]
pub struct BleuLossOutput {
    /// Scalar: `-log BLEU` (Corpus) or the mean of per-element `-log BLEU` (SentenceMean).
    pub loss: Tensor,
    /// `[B, N]`: clipped matches `m_n` of each element.
    pub matches: Tensor,
    /// `[B, N]`: n-gram totals `t_n` of each element.
    pub totals: Tensor,
    /// `[B]`: hypothesis length `c` of each element.
    pub hyp_len: Tensor,
    /// `[B]`: effective reference length of each element (a constant).
    pub ref_len: Tensor,
}

/// The shapes of a validated call.
struct Checked {
    compute_dtype: DType,
    lengths: Vec<usize>,
}

/// Validates the hypothesis tensor, the lengths and the references against each other.
fn check_inputs(
    name: &str,
    hyp: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<Checked> {
    score::validate_config(cfg)?;
    let (batch, seq, vocab) = match hyp.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("`{name}` must be [B, S, V], got shape {dims:?}"),
    };
    let compute_dtype = score::compute_dtype(hyp.dtype()).map_err(|_| {
        candle_core::Error::Msg(format!(
            "`{name}` must be a float tensor, got {:?} with shape {:?}",
            hyp.dtype(),
            hyp.dims()
        ))
    })?;
    if batch == 0 || seq == 0 || vocab == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, S and V must be >= 1",
            hyp.dims()
        );
    }
    if refs.batch_size() != batch {
        bail!(
            "`refs` has {} batch elements but `{name}` has {batch} (shape {:?})",
            refs.batch_size(),
            hyp.dims()
        );
    }
    if !refs.device().same_device(hyp.device()) {
        bail!(
            "`refs` are on {:?} but `{name}` is on {:?}",
            refs.device(),
            hyp.device()
        );
    }
    refs.check_vocab(vocab)?;
    if let Some(eos) = cfg.length.eos_id() {
        if eos as usize >= vocab {
            bail!(
                "`eos_id` {eos} is out of the vocabulary (V = {vocab}, `{name}` shape {:?})",
                hyp.dims()
            );
        }
    }
    let lengths = match hyp_lengths {
        None => vec![seq; batch],
        Some(_) if matches!(cfg.length, LengthModel::SoftEos { .. }) => bail!(
            "`hyp_lengths` must be None with LengthModel::SoftEos: its lengths come from the EOS probabilities"
        ),
        Some(lengths) => {
            if lengths.dtype() != DType::U32 || lengths.dims() != [batch] {
                bail!(
                    "`hyp_lengths` must be u32 [{batch}], got {:?} with shape {:?}",
                    lengths.dtype(),
                    lengths.dims()
                );
            }
            let lengths: Vec<usize> = lengths.to_vec1::<u32>()?.into_iter().map(|l| l as usize).collect();
            if let Some((element, &length)) = lengths.iter().enumerate().find(|(_, &l)| l > seq) {
                bail!("`hyp_lengths[{element}]` = {length} exceeds S = {seq} (`{name}` shape {:?})", hyp.dims());
            }
            lengths
        }
    };
    Ok(Checked {
        compute_dtype,
        lengths,
    })
}

fn check_finite(name: &str, t: &Tensor) -> Result<()> {
    let total = t.sum_all()?.to_dtype(DType::F64)?.to_scalar::<f64>()?;
    if !total.is_finite() {
        bail!(
            "`{name}` contains NaN or infinite values (shape {:?})",
            t.dims()
        );
    }
    Ok(())
}

/// Everything the statistics need from the hypothesis side.
struct HypothesisInputs {
    /// `X`: `[B, S, W]`.
    token_match: Tensor,
    /// `P[:, :, eos]`: `[B, S]`, for the EOS length models.
    eos_probs: Option<Tensor>,
    /// `Z_1 = P Pᵀ`: `[B, S, S]`, for the paired form.
    hyp_self_match: Option<Tensor>,
}

/// The token matches from full probabilities: a gather for ids, a product for matrices.
fn hypothesis_inputs_from_probs(
    probs: &Tensor,
    side: &ReferenceSide,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    let (batch, seq, _) = probs.dims3()?;
    let token_match = match &side.tokens {
        ReferenceTokens::Ids(ids) => {
            let width = ids.dim(1)?;
            let index = ids
                .unsqueeze(1)?
                .broadcast_as((batch, seq, width))?
                .contiguous()?;
            probs.gather(&index, 2)?
        }
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

/// The statistics and the loss from the hypothesis inputs.
fn finish(
    inputs: HypothesisInputs,
    side: &ReferenceSide,
    lengths: &[usize],
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
        lengths,
        seq,
        cfg.max_order,
        dtype,
        &device,
    )?;
    let form_inputs = FormInputs {
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
    let chosen = score::closest_reference_lengths(
        &hyp_len.to_dtype(DType::F64)?.to_vec1::<f64>()?,
        &side.lengths,
    );
    let ref_len = Tensor::from_vec(chosen, batch, &device)?.to_dtype(dtype)?;
    let matches = Tensor::stack(&matches, 1)?;
    let totals = Tensor::stack(&totals, 1)?;
    let loss = loss_from_stats(&matches, &totals, &hyp_len, &ref_len, cfg)?;
    Ok(BleuLossOutput {
        loss,
        matches,
        totals,
        hyp_len,
        ref_len,
    })
}

/// The reference ids `[B, W]`, with a column of `eos_id` appended under the EOS length models,
/// so that one gather reads both `X` and `P[:, :, eos]`.
fn with_eos_column(ids: &Tensor, cfg: &BleuLossConfig) -> Result<Tensor> {
    match cfg.length.eos_id() {
        Some(eos) => {
            let eos_column = Tensor::full(eos, (ids.dim(0)?, 1), ids.device())?;
            Tensor::cat(&[ids, &eos_column], 1)
        }
        None => Ok(ids.clone()),
    }
}

/// `-log BLEU` of hypothesis distributions against references (SPEC §2).
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
    let checked = check_inputs("hyp_probs", hyp_probs, hyp_lengths, refs, cfg)?;
    let probs = hyp_probs.to_dtype(checked.compute_dtype)?;
    check_finite("hyp_probs", &probs)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), checked.compute_dtype)?;
    let inputs = hypothesis_inputs_from_probs(&probs, &side, cfg)?;
    finish(inputs, &side, &checked.lengths, cfg)
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
    let checked = check_inputs("logits", logits, hyp_lengths, refs, cfg)?;
    let logits = logits.to_dtype(checked.compute_dtype)?;
    if !logits.device().is_cpu() {
        check_finite("logits", &logits)?;
    }
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), checked.compute_dtype)?;
    let inputs = match (&side.tokens, cfg.form) {
        (ReferenceTokens::Ids(ids), Form::Expected | Form::LowerBound) => {
            let width = ids.dim(1)?;
            let gathered = fused::softmax_gather(&logits, &with_eos_column(ids, cfg)?)?;
            HypothesisInputs {
                token_match: gathered.narrow(2, 0, width)?,
                eos_probs: cfg
                    .length
                    .eos_id()
                    .map(|_| gathered.narrow(2, width, 1)?.squeeze(2))
                    .transpose()?,
                hyp_self_match: None,
            }
        }
        (ReferenceTokens::Ids(ids), Form::Paired) => {
            let width = ids.dim(1)?;
            let (self_match, gathered) =
                fused::softmax_self_match_gather(&logits, &with_eos_column(ids, cfg)?)?;
            HypothesisInputs {
                token_match: gathered.narrow(2, 0, width)?,
                eos_probs: cfg
                    .length
                    .eos_id()
                    .map(|_| gathered.narrow(2, width, 1)?.squeeze(2))
                    .transpose()?,
                hyp_self_match: Some(self_match),
            }
        }
        _ => hypothesis_inputs_from_probs(&fused::softmax_last_dim(&logits)?, &side, cfg)?,
    };
    finish(inputs, &side, &checked.lengths, cfg)
}
