//! The differentiable BLEU loss: `-log BLEU` of hypothesis distributions against references,
//! with gradients through candle's autograd. The derivation, term by term and in the names the
//! code uses, is `docs/loss.md` in the repository.
//!
//! Hypothesis distributions `[B, S, V]` and references go through candle tensor ops — token
//! matches, n-gram products, first-occurrence masks, clipped counts, lengths, brevity penalty —
//! to `-log BLEU`.
//!
//! # A training step
//!
//! ```
//! use candle_bleu::loss::{bleu_loss_from_logits, BleuLossConfig, References};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
//!
//! let dev = Device::Cpu;
//! let (batch, seq, vocab) = (2, 4, 8);
//! // Target ids u32 [B, T] (or [B, R, T] for several references); trailing 0s are padding.
//! let targets = Tensor::new(&[[1u32, 2, 3, 4], [5, 6, 7, 0]], &dev)?;
//! let refs = References::from_ids(&targets, 0)?; // once per batch: reads the ids to the host
//!
//! // A toy "model": free logits [B, S, V].
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let logits = vb.get_with_hints((batch, seq, vocab), "logits", candle_nn::Init::Randn {
//!     mean: 0.0,
//!     stdev: 1.0,
//! })?;
//! let mut opt = SGD::new(varmap.all_vars(), 1.0)?;
//! let cfg = BleuLossConfig::default(); // 4-grams, expected form, corpus BLEU, BLEU+1
//!
//! let first = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//! for _ in 0..20 {
//!     let out = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//!     opt.backward_step(&out.loss)?; // usually `ce + λ · out.loss`
//! }
//! let last = bleu_loss_from_logits(&logits, None, &refs, &cfg)?;
//! let (first, last) = (first.loss.to_scalar::<f32>()?, last.loss.to_scalar::<f32>()?);
//! assert!(last < first, "-log BLEU {first} -> {last}");
//! println!("soft BLEU {:.3}", (-last).exp());
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! # Device-to-host copies
//!
//! A copy from a GPU to the host waits for the stream, so the loss keeps them off its path.
//! Every one it makes goes through one counted helper ([`host_copies`]); per call, with the
//! default config:
//!
//! | entry point | copies |
//! |---|---|
//! | [`References::from_ids`] | 1 (the ids, once per batch) |
//! | [`References::from_matrices`] | 1 (the lengths) + 1 off the CPU (the NaN/Inf check) |
//! | [`bleu_loss`], [`bleu_loss_from_logits`], id references, `hyp_lengths` given or `None`, any form, length model and reduction | **0**, the first call on a `References` included |
//! | the same with matrix references | 0; under `NotEos`/`SoftEos` 1 on the first call per `(max_order, eos_id, dtype)` (the EOS cut) |
//! | [`bleu_loss_from_hidden`], id references | 0, as from logits |
//! | [`ce_bleu_from_hidden`], [`cross_entropy_from_hidden`] | 0 on the CPU; off it 1 (the targets' largest id and count, checked) |
//! | [`loss_from_stats`] | 0 |
//! | backward passes | 0 |
//!
//! The reference side is built on the host from the ids `from_ids` read, uploaded once and
//! cached in the `References`; the closest reference length and the hypothesis length masks
//! are tensor ops on the device. The value checks that need the data (NaN/Inf in the inputs,
//! `hyp_lengths <= S`) run in place on the CPU, always — the fused CPU kernels find
//! non-finite logits in the pass they make anyway — and off the CPU only with
//! [`BleuLossConfig::check_values`] (one copy per checked tensor). The counts are asserted by
//! `tests/loss_host_copies.rs`, on any test device.
//!
//! # Dtypes and devices
//!
//! f32 and f64 hypotheses are computed in their dtype, f16 and bf16 in f32. The score
//! ([`loss_from_stats`]) runs in f64 where the device has it and in f32 on Metal, with the same
//! guards ([`BleuLossConfig::force_f32_score`] runs that path anywhere). The fused kernels are
//! CPU kernels; elsewhere composed candle ops give the same numbers.
//!
//! # Modules
//!
//! - [`references`]: the references and their side of the statistics (`ν`, `κ`), from ids or
//!   matrices;
//! - `length`: the length models `Given`, `NotEos`, `SoftEos`;
//! - `forms`: the expected, paired and lower-bound forms of the clipped matches;
//! - `pipeline`: validation, the one choice between the kernels and composed candle ops, the
//!   pass over the logits and the statistics from it;
//! - `kernels`: the row kernels over the logits (CPU, and CUDA behind the `cuda` feature and
//!   [`set_cuda_kernels`]), each a candle custom op with a hand-written backward op;
//! - [`cross_entropy_from_logits`]: fused token cross-entropy (PyTorch's `F.cross_entropy`);
//! - [`ce_bleu_from_logits`]: cross-entropy + BLEU of a training step in one pass over the logits;
//! - [`ce_bleu_from_hidden`], [`cross_entropy_from_hidden`], [`bleu_loss_from_hidden`]: the same
//!   from the hidden states and the output layer, in blocks of rows, never storing the
//!   `[B, S, V]` logits ([`HiddenConfig`]);
//! - [`score`]: smoothing, guards, brevity penalty, reductions ([`loss_from_stats`]);
//! - [`distributed`]: data-parallel training — the loss of the global batch from each worker's
//!   shard over a sum all-reduce (MPI, NCCL, threads).

mod cross_entropy;
pub mod distributed;
mod forms;
mod gemm;
mod hidden;
mod host;
mod kernels;
mod length;
mod pipeline;
mod products;
pub mod references;
pub mod score;
mod training;

pub use cross_entropy::{cross_entropy_from_logits, CrossEntropyConfig};
pub use hidden::{
    bleu_loss_from_hidden, ce_bleu_from_hidden, cross_entropy_from_hidden, HiddenConfig,
};
pub use host::host_copies;
pub use kernels::{cuda_kernels_enabled, set_cuda_kernels};
/// Not part of the API: the kernel ops with their own validation, and the composed-path
/// switch, for the crate's tests, examples and benches.
#[doc(hidden)]
pub use pipeline::{testing, with_composed_path};
pub use references::References;
pub use score::{log_brevity_penalty, loss_from_stats, PRECISION_FLOOR};
pub use training::{ce_bleu_from_logits, TrainingLoss, TrainingLossConfig};

use candle_core::{DType, Result, Tensor};
use pipeline::{check_finite, check_inputs, finish, hypothesis_inputs_from_probs};

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
    /// How the clipped matches are made differentiable.
    pub form: Form,
    /// Which hypothesis positions count as output.
    pub length: LengthModel,
    /// Corpus BLEU of the batch, or the mean of per-element losses.
    pub reduction: Reduction,
    /// Smoothing of the n-gram precisions.
    pub smoothing: LossSmoothing,
    /// Off the CPU, also run the value checks that need the data on the host: NaN/Inf in the
    /// hypotheses (and in [`loss_from_stats`]'s statistics), `hyp_lengths <= S`. Each is one
    /// device-to-host copy, which stalls a GPU stream, so the default is `false`: then NaN or
    /// infinite inputs give a NaN loss and a length above `S` counts as `S`. On the CPU these
    /// checks always run, on the data in place (the fused kernels find non-finite logits in the
    /// pass they make anyway). Turn it on while debugging a GPU run.
    pub check_values: bool,
    /// Compute the score ([`loss_from_stats`]) in f32 even where the device has f64. The score
    /// runs in f64 where the device supports it and in f32 on Metal, which has no f64; this
    /// switch runs the f32 path anywhere, to test it (the suite compares both on the CPU).
    /// Default `false`.
    pub force_f32_score: bool,
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
            force_f32_score: false,
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
/// call [`loss_from_stats`] on the sums.
#[derive(Debug, Clone)]
pub struct BleuLossOutput {
    /// Scalar: `-log BLEU` (Corpus) or the mean of per-element `-log BLEU` (SentenceMean).
    pub loss: Tensor,
    /// The per-element statistics `loss` was computed from.
    pub stats: BleuStats,
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
    let compute_dtype = check_inputs("hyp_probs", hyp_probs, hyp_lengths, refs, cfg)?;
    let probs = hyp_probs.to_dtype(compute_dtype)?;
    check_finite("hyp_probs", &probs, cfg)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), compute_dtype)?;
    let inputs = hypothesis_inputs_from_probs(&probs, &side, cfg)?;
    finish(inputs, &side, hyp_lengths, cfg)
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
    let compute_dtype = check_inputs("logits", logits, hyp_lengths, refs, cfg)?;
    let logits = logits.to_dtype(compute_dtype)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), compute_dtype)?;
    let (inputs, _) = pipeline::hypothesis_pass(&logits, &side, cfg, None)?;
    finish(inputs, &side, hyp_lengths, cfg)
}
