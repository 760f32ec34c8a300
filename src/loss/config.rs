//! The loss's vocabulary, at the bottom of its layers: every configuration and output type, the
//! two dtypes every stage computes in ([`compute_dtype`], [`sum_dtype`]) and the one helper that
//! makes constants. Nothing here computes a loss; every other file of `loss` may import from
//! here, and this file imports from none of them.

use candle_core::{bail, DType, Device, Result, Tensor};

/// How the clipped matches `m_n` are made differentiable (docs/loss.md, §8). All three are exact at
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

/// Which hypothesis positions count as output (docs/loss.md, §5 Length models).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LengthModel {
    /// Hard lengths from `hyp_lengths` (or `S`): exact BLEU at one-hot inputs.
    #[default]
    Given,
    /// Hard lengths, and each position's length weight is `1 - P[i, eos]` (the derivation's
    /// `len_B = (1 - B_eᵀ) ⊗ E`).
    NotEos {
        /// The end-of-sequence token id (`< V`).
        eos_id: u32,
    },
    /// Differentiable stopping: position `i` is output with probability
    /// `s_i = Π_{k<=i} (1 - P[k, eos])`. Takes no hard lengths.
    SoftEos {
        /// The end-of-sequence token id (`< V`).
        eos_id: u32,
    },
}

impl LengthModel {
    pub(crate) fn eos_id(self) -> Option<u32> {
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

/// Configuration of [`bleu_loss`](super::bleu_loss). Default: 4-grams, uniform weights, `Expected`, `Given`,
/// `Corpus`, `AddK(1.0)`.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuLossConfig {
    /// Maximum n-gram order `N` (>= 1).
    pub max_order: usize,
    /// Order weights `w_1..w_N` (finite, >= 0); `None` = `1/N` each.
    pub weights: Option<Vec<f64>>,
    /// How the clipped matches are made differentiable.
    pub form: Form,
    /// Which hypothesis positions count as output.
    pub length: LengthModel,
    /// Corpus BLEU of the batch, or the mean of per-element losses.
    pub reduction: Reduction,
    /// Smoothing of the n-gram precisions.
    pub smoothing: LossSmoothing,
    /// Off the CPU, also run the value checks that need the data on the host: NaN/Inf in the
    /// hypotheses (and in [`loss_from_stats`](super::loss_from_stats)'s statistics), `hyp_lengths <= S`. Each is one
    /// device-to-host copy, which stalls a GPU stream, so the default is `false`: then NaN or
    /// infinite inputs give a NaN loss and a length above `S` counts as `S`. On the CPU these
    /// checks always run, on the data in place (the fused kernels find non-finite logits in the
    /// pass they make anyway). Turn it on while debugging a GPU run.
    pub check_values: bool,
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
            check_values: false,
        }
    }
}

/// The differentiable statistics of a batch, one row per element: everything the loss
/// depends on (docs/loss.md, §Score and loss).
///
/// All four are float tensors in the compute dtype of the call (f32 for f16/bf16 inputs) on the
/// hypotheses' device. `matches`, `totals` and `hyp_len` carry gradients back to the
/// hypotheses; `ref_len` is a constant.
#[derive(Debug, Clone)]
pub struct BleuStats {
    /// `[B, N]`: clipped matches `m_n` of each element.
    pub matches: Tensor,
    /// `[B, N]`: n-gram totals `t_n` of each element.
    pub totals: Tensor,
    /// `[B]`: hypothesis length `c` of each element.
    pub hyp_len: Tensor,
    /// `[B]`: effective reference length of each element (a constant).
    pub ref_len: Tensor,
}

/// The loss and the differentiable statistics it was computed from.
///
/// The statistics let a caller log them, or all-reduce them across data-parallel workers and
/// call [`loss_from_stats`](super::loss_from_stats) on the sums.
#[derive(Debug, Clone)]
pub struct BleuLossOutput {
    /// Scalar: `-log BLEU` (Corpus) or the mean of per-element `-log BLEU` (SentenceMean).
    pub loss: Tensor,
    /// The per-element statistics `loss` was computed from.
    pub stats: BleuStats,
}

/// The expected n-gram statistics of CTC outputs' collapsed sequences
/// ([`ctc_expected_counts`](super::ctc_expected_counts)), before clipping: what the BLEU loss on
/// CTC outputs is computed from. Float tensors in the compute dtype of the call, on the logits'
/// device, differentiable with respect to the logits.
#[derive(Debug, Clone)]
pub struct CtcExpectedCounts {
    /// `[B, N, W]`: `E[count of g in B(a)]` for the reference n-gram `g` of order `n` starting at
    /// position `j` of element `b`'s references laid end to end (reference 0, then 1, …; `W` the
    /// longest such row); 0 where the n-gram would cross the end of a reference. A repeated
    /// n-gram has the same value at each of its positions.
    pub counts: Tensor,
    /// `[B, N]`: `E[max(|B(a)| − n + 1, 0)]`, the expected number of n-grams of order `n`.
    pub totals: Tensor,
    /// `[B]`: `E[|B(a)|]`, the expected length of the collapsed sequence.
    pub hyp_len: Tensor,
}

/// The dtype a loss computes in for inputs of `dtype`: half precision upcast to f32; f32 and
/// f64 stay as they are; anything else is an error.
pub(crate) fn compute_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 | DType::F64 => Ok(dtype),
        DType::F16 | DType::BF16 => Ok(DType::F32),
        other => bail!("expected a float tensor, got {other:?}"),
    }
}

/// The dtype the loss's sums (over a batch, and over a data-parallel group's all-reduce) and its
/// score are taken in: f64 where the device has it, f32 on Metal (whose backend has no f64).
/// On `[B, N]` numbers f64 costs nothing, and the score's floor (1e-30) would be 0 in f16.
pub(crate) fn sum_dtype(device: &Device) -> DType {
    if device.is_metal() {
        DType::F32
    } else {
        DType::F64
    }
}

/// A float tensor of `values` in `dtype`, converted on the host: no f64 tensor is made on the
/// device unless `dtype` is f64 (Metal has no f64).
pub(crate) fn constant(
    values: Vec<f64>,
    shape: impl Into<candle_core::Shape>,
    dtype: DType,
    device: &candle_core::Device,
) -> Result<Tensor> {
    match dtype {
        DType::F64 => Tensor::from_vec(values, shape, device),
        _ => Tensor::from_vec(
            values.into_iter().map(|v| v as f32).collect::<Vec<f32>>(),
            shape,
            device,
        )?
        .to_dtype(dtype),
    }
}

/// How the cross-entropy reduces its token losses (PyTorch's `reduction`): the mean over the
/// non-pad targets, their sum, or none. Not the BLEU loss's [`Reduction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CrossEntropyReduction {
    /// The mean over the non-pad targets (PyTorch's `"mean"`): a scalar; at least one target
    /// must not be padding.
    #[default]
    Mean,
    /// The sum over the non-pad targets (`"sum"`): a scalar, 0 when every target is padding.
    Sum,
    /// Each position's loss (`"none"`): `[B, S]`, 0 at padding. For the cross-entropy entry
    /// points alone: a training step's loss (`ce_bleu_*`) is a scalar, and the data-parallel
    /// functions reduce over the group.
    None,
}

/// Configuration of [`cross_entropy_from_logits`](super::cross_entropy_from_logits) (and of the
/// cross-entropy part of a training step). Default: no padding, no label smoothing, the mean,
/// no option on.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CrossEntropyConfig {
    /// Target id of padding positions: they add nothing to the loss, its gradient or the count
    /// the mean divides by (PyTorch's `ignore_index`). It may lie outside the vocabulary.
    pub pad_id: Option<u32>,
    /// Label smoothing `ε ∈ [0, 1)`: the target distribution is `(1 − ε)·onehot + ε/V`
    /// (PyTorch's `label_smoothing`).
    pub label_smoothing: f64,
    /// The mean, the sum, or each position's loss (PyTorch's `reduction`).
    pub reduction: CrossEntropyReduction,
    /// The z-loss scale `λ` (finite, `>= 0`; 0, the default, is off): each non-pad position's
    /// loss adds `λ·lse²`, `lse = log Σ_v exp(z_v)` (PaLM's auxiliary loss that keeps the
    /// logits from drifting; Liger-Kernel's `lse_square_scale`), reduced with the cross-entropy.
    pub z_loss: f64,
    /// Per-class weights `w` (PyTorch's `weight=`, Liger-Kernel's `ce_weight`): `V` values,
    /// finite and `>= 0`, one per vocabulary entry (`Arc`, so that the config stays cheap to
    /// clone: `Some(vec.into())`). A position's loss becomes
    /// `(1 − ε)·w_t·(−log p_t) + (ε/V)·Σ_v w_v·(−log p_v)` and the mean divides by `Σ w_t` over
    /// the non-pad positions (PyTorch's semantics with `label_smoothing` and `ignore_index`),
    /// which must be `> 0`; with data-parallel training, by the global `Σ w_t`. The z-loss and
    /// the token accuracy stay unweighted (the z-loss's mean divides by the count, as Liger's
    /// does). Weights go into the cross-entropy only, never into the BLEU term. `None`, the
    /// default: every class 1.
    pub class_weights: Option<std::sync::Arc<[f64]>>,
    /// Logit soft-capping `c` (Gemma 2's; Liger-Kernel's and Cut Cross-Entropy's `softcap`):
    /// the logits become `c·tanh(z/c)` before the softmax. `None`, the default, is off; `c` must
    /// be finite and `> 0`. Capping changes the model's distribution, so in a training step
    /// (`ce_bleu_*`) the BLEU term sees the capped logits too, and the token accuracy is that
    /// of the capped logits. On the hidden-state path it is applied to each block of logits in
    /// the loss's own pass, and refused with gradient filtering.
    pub softcap: Option<f64>,
    /// Also report the token accuracy (Liger-Kernel's `return_token_accuracy`): the share of
    /// non-pad positions whose target is the argmax of their logits (the first index among
    /// equal maxima, as `argmax` picks it), computed in the loss's own pass
    /// ([`CrossEntropyOutput::token_accuracy`]). Default `false`: nothing is computed.
    pub token_accuracy: bool,
    /// Off the CPU, also read the targets to the host (one small copy, which stalls a GPU
    /// stream) to check their values and count them: a target `>= V` that is not `pad_id`, and
    /// a mean over only padding, are then errors. Default `false`: nothing is read (with the
    /// `cuda-unverified` feature; without it, off the CPU the targets are still read); the count
    /// stays on the device, a target `>= V` makes the loss NaN (the mean, the sum, or that
    /// position's loss; no kernel reads outside its row) and a mean over only padding is NaN,
    /// as PyTorch's `F.cross_entropy` gives. Class weights always read the targets (the
    /// weighted mean's `Σ w_t`). On the CPU the targets are always checked, in place. In a
    /// training step (`ce_bleu_*`) either this or `BleuLossConfig::check_values` turns the
    /// read on.
    pub check_values: bool,
}

/// The cross-entropy and what it reports besides
/// ([`cross_entropy_from_logits`](super::cross_entropy_from_logits),
/// [`cross_entropy_from_hidden`](super::cross_entropy_from_hidden)).
#[derive(Debug, Clone)]
pub struct CrossEntropyOutput {
    /// The loss, reduced as [`CrossEntropyConfig::reduction`] says: a scalar (`Mean`, `Sum`)
    /// or `[B, S]` (`None`, 0 at padding), in the compute dtype; call `backward` on this one.
    pub loss: Tensor,
    /// With a z-loss scale `λ ≠ 0`: the z-loss's part of `loss`, `λ·lse²` reduced as `loss` is
    /// (the mean over the non-pad positions, their sum, or `[B, S]` for `None`), detached: for
    /// logging (Liger-Kernel's `return_z_loss`). `None` when `λ = 0`.
    pub z_loss: Option<Tensor>,
    /// With [`CrossEntropyConfig::token_accuracy`]: the share of non-pad positions whose target
    /// is the argmax of their logits, a scalar in `[0, 1]` in the compute dtype, detached.
    pub token_accuracy: Option<Tensor>,
}

/// The loss of a training step and its two parts.
#[derive(Debug, Clone)]
pub struct TrainingLoss {
    /// Scalar: `cross_entropy + bleu_weight · bleu.loss`; call `backward` on this one.
    pub loss: Tensor,
    /// Scalar: the mean token cross-entropy (as [`cross_entropy_from_logits`](super::cross_entropy_from_logits)(super::cross_entropy_from_logits)).
    pub cross_entropy: Tensor,
    /// The BLEU loss and its statistics (as [`bleu_loss_from_logits`](super::bleu_loss_from_logits)).
    pub bleu: BleuLossOutput,
    /// With `ce.z_loss` `λ ≠ 0`: the z-loss's part of `cross_entropy`, detached
    /// ([`CrossEntropyOutput::z_loss`]).
    pub z_loss: Option<Tensor>,
    /// With `ce.token_accuracy`: the share of non-pad targets that are their row's argmax,
    /// detached ([`CrossEntropyOutput::token_accuracy`]).
    pub token_accuracy: Option<Tensor>,
}

/// Configuration of a training step's loss: `cross_entropy + bleu_weight · bleu_loss`
/// ([`ce_bleu_from_logits`](super::ce_bleu_from_logits)).
///
/// `Default`: `bleu_weight` 1, no padding and no label smoothing in the cross-entropy, the
/// default BLEU loss ([`BleuLossConfig::default`]). The hidden-state entry points take their
/// blocks ([`HiddenConfig`]) as an argument of their own.
/// Set the fields you need and take the rest from `Default`:
///
/// ```
/// use candle_bleu::loss::{CrossEntropyConfig, TrainingLossConfig};
/// let cfg = TrainingLossConfig {
///     bleu_weight: 0.3,
///     ce: CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.1, ..Default::default() },
///     ..Default::default()
/// };
/// assert_eq!(cfg.bleu.max_order, 4);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingLossConfig {
    /// `λ`, the weight of the BLEU loss: finite, `>= 0`. Default 1.
    pub bleu_weight: f64,
    /// The cross-entropy's padding id and label smoothing.
    pub ce: CrossEntropyConfig,
    /// The BLEU loss: form, length model, reduction, smoothing, orders.
    pub bleu: BleuLossConfig,
}

impl Default for TrainingLossConfig {
    fn default() -> Self {
        Self {
            bleu_weight: 1.0,
            ce: CrossEntropyConfig::default(),
            bleu: BleuLossConfig::default(),
        }
    }
}

/// Block sizes and gradient filtering of the hidden-state entry points (their `blocks`
/// argument).
///
/// The logits of a block of rows (`rows × V`) are computed from the hidden states and the
/// output projection, used and dropped, forward and backward (the backward recomputes them), so
/// the loss's memory does not grow with `B · S · V`.
///
/// `Default`: blocks of at most [`HiddenConfig::DEFAULT_BLOCK_ELEMENTS`] logits, no filtering
/// (exact: the same values and gradients as the logits path, to rounding).
///
/// **Gradient filtering** (`filter_below: Some(τ)`, Cut Cross-Entropy's): in the backward,
/// a tile of `rows of a block × vocab_tile` columns whose softmax probabilities all lie below
/// `τ` skips the dense part of its logits gradient. A row's logits gradient is
/// `G[r,v] = p[r,v]·c_r + o_r + (sparse terms at the target and the gathered reference ids)`
/// with `c_r = h·w − Σ_k g_k x_k` and the label-smoothing offset `o_r = −h·w·ε/V`; the offset
/// (a rank-one term) and the sparse terms are kept exactly, only `p[r,v]·c_r` is dropped in
/// skipped tiles. So the error of the hidden states' gradient is, row by row,
///
/// `‖ΔdH_r‖ ≤ |c_r| · Σ_{v skipped} p[r,v] · max_v ‖W_v‖ ≤ |c_r| · (skipped columns) · τ · max_v ‖W_v‖`
///
/// and that of the weight and bias gradients, column by column,
/// `‖ΔdW_v‖ ≤ Σ_r |c_r| p[r,v] ‖H_r‖ ≤ τ Σ_r |c_r| ‖H_r‖`, `|Δdb_v| ≤ τ Σ_r |c_r|`. The forward
/// (the loss value) is exact. The paired form is not filtered: its dense gradient also carries
/// `((dZ + dZᵀ) P)[r,v]`, which the bound above does not cover. The CPU kernels filter; the
/// composed path (other devices) ignores `filter_below` and is exact.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HiddenConfig {
    /// The most logits one block holds (`rows × V` elements, `>= 1`): a block has
    /// `max(1, block_elements / V)` rows, rounded to whole sequences where the loss needs whole
    /// sequences at once (the paired form). The forward holds one block of logits, the backward
    /// one block of logits and one of their gradient. On the CPU, the exact backward of the
    /// expected and lower-bound forms and of the cross-entropy (not the paired form, which
    /// `ce_bleu_from_hidden` then also takes for its cross-entropy part, and not with
    /// filtering) walks the vocabulary in tiles of `rows × columns` instead: `columns =
    /// min(V, max(vocab_tile, block_elements / (B·S)))`, and as many rows as
    /// `block_elements / columns` allows (at least one), so every row at once while
    /// `block_elements / (B·S) >= vocab_tile`; a tile holds at most `block_elements` logits,
    /// or one row where `block_elements` is below `columns`.
    pub block_elements: usize,
    /// Vocabulary columns per tile in the backward (`>= 1`): the unit that gradient filtering
    /// skips, and the least width of the CPU's exact tiled backward (but at most `V`; the last
    /// tile of a row takes what is left).
    pub vocab_tile: usize,
    /// Gradient filtering: in the backward, skip the dense part of a tile whose softmax
    /// probabilities all lie below this threshold (`0 < τ < 1`). `None` (default): no
    /// filtering, exact gradients.
    pub filter_below: Option<f64>,
}

impl HiddenConfig {
    /// The default block size: 16 Mi logits (64 MiB in f32). Each block of whole rows reads the
    /// whole weight once in the forward (and, in the paired form's and filtering's backward,
    /// reads it and reads and writes its gradient), so fewer, larger blocks are faster at large
    /// vocabularies; the exact tiled backward holds up to 8192 rows of `[B·S, D]` in one block
    /// with it. Measured before that backward, at `[B·S, D] = [2048, 512]`, the step's heap
    /// peak was the same as with 4 Mi-logit blocks at `V = 128 000` (769 MiB) and 16 % higher
    /// at `V = 32 000` (238 against 206 MiB) (BENCHMARKS.md, "The loss from hidden states").
    pub const DEFAULT_BLOCK_ELEMENTS: usize = 16 << 20;

    /// Checks the fields; errors name the field and its value.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.block_elements == 0 {
            bail!("HiddenConfig: `block_elements` must be >= 1, got 0");
        }
        if self.vocab_tile == 0 {
            bail!("HiddenConfig: `vocab_tile` must be >= 1, got 0");
        }
        if let Some(tau) = self.filter_below {
            if !(tau.is_finite() && tau > 0.0 && tau < 1.0) {
                bail!("HiddenConfig: `filter_below` must be in (0, 1), got {tau}");
            }
        }
        Ok(())
    }

    /// Rows per block: a multiple of `group` rows (1, or `S` for whole sequences), at least one
    /// group, and at most `block_elements` logits when one group fits.
    pub(crate) fn block_rows(&self, vocab: usize, group: usize) -> usize {
        group * (self.block_elements / (group * vocab)).max(1)
    }
}

impl Default for HiddenConfig {
    fn default() -> Self {
        Self {
            block_elements: Self::DEFAULT_BLOCK_ELEMENTS,
            vocab_tile: 2048,
            filter_below: None,
        }
    }
}

/// How [`ctc_loss`](super::ctc_loss) reduces the batch (PyTorch's `reduction`). Not the BLEU
/// loss's [`Reduction`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CtcReduction {
    /// Each element's loss divided by its target length (clamped to `>= 1`), then the mean over
    /// the batch: PyTorch's `reduction = "mean"`. A scalar.
    #[default]
    Mean,
    /// The sum of the elements' losses. A scalar.
    Sum,
    /// No reduction: the loss of each element, `[B]`.
    None,
}

/// Configuration of [`ctc_loss`](super::ctc_loss) and
/// [`ctc_loss_from_logits`](super::ctc_loss_from_logits). Default: blank 0, `Mean`,
/// `zero_infinity = false` (PyTorch's defaults), `check_values = false`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CtcConfig {
    /// The blank's id, any `< V`. Default 0.
    pub blank: u32,
    /// How the batch is reduced.
    pub reduction: CtcReduction,
    /// Infinite losses (elements no alignment can produce: too few frames for the target and
    /// its repeats, or zero probabilities) and their gradients become 0. Otherwise such an
    /// element's loss is `+inf` (its gradient is 0; PyTorch gives NaN there). Default `false`.
    pub zero_infinity: bool,
    /// Off the CPU, also refuse NaN and `+inf` in the input's frames in use (and `-inf` in
    /// logits), as the CPU always does in place: one device-to-host copy of the input, which
    /// stalls a GPU stream, so the default is `false` (then such values give a NaN or infinite
    /// loss). Turn it on while debugging a GPU run. With the CUDA kernels (`cuda-unverified`)
    /// it also decides whether the targets and lengths are read to the host and checked (on),
    /// or left on the device with an out-of-range element's loss NaN (off).
    pub check_values: bool,
}

/// Configuration of NMLA's n-gram F-measure on CTC outputs
/// ([`ctc_ngram_f_loss`](super::ctc_ngram_f_loss)).
#[derive(Debug, Clone, PartialEq)]
pub struct CtcNgramFConfig {
    /// The n-gram order `n` (`>= 1`); NMLA's objective is bigrams, 2.
    pub order: usize,
    /// [`Reduction::SentenceMean`] (NMLA's): the loss is `−mean_b F_b`;
    /// [`Reduction::Corpus`]: `−2 Σ M / Σ (T_n(y) + E[T_n])`.
    pub reduction: Reduction,
    /// As [`BleuLossConfig::check_values`]: off the CPU, also check the values (host copies).
    pub check_values: bool,
}

impl Default for CtcNgramFConfig {
    fn default() -> Self {
        Self {
            order: 2,
            reduction: Reduction::SentenceMean,
            check_values: false,
        }
    }
}

/// The n-gram F-measure loss on CTC outputs and what it was computed from, per element `[B]`.
#[derive(Debug, Clone)]
pub struct CtcNgramFOutput {
    /// Scalar: `−mean_b F_b`, or the corpus form (see [`CtcNgramFConfig::reduction`]).
    pub loss: Tensor,
    /// `[B]`: `F_n = 2 M_n / (T_n(y) + E[T_n(B(a))])` (0 where the reference has no n-gram).
    pub f_measure: Tensor,
    /// `[B]`: `M_n`, the clipped expected matches of order `n`.
    pub matches: Tensor,
    /// `[B]`: `E[T_n(B(a))] = E[max(|B(a)| − n + 1, 0)]`, the output's expected n-grams.
    pub hyp_ngrams: Tensor,
    /// `[B]`: `T_n(y) = max(|y| − n + 1, 0)`, the reference's n-grams (a constant).
    pub ref_ngrams: Tensor,
}
