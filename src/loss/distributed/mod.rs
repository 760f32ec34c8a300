//! Data-parallel training with the BLEU loss: each worker computes the loss of its shard of the
//! global batch, and one sum all-reduce per step turns the shard's outputs into the loss of the
//! **whole** batch, with the gradient of this worker's share.
//!
//! Corpus BLEU is not a mean over sentences: it depends on the batch through its summed n-gram
//! statistics, so averaging per-worker losses (what data-parallel cross-entropy does) would
//! give a different, wrong loss. The same holds, less visibly, for the mean cross-entropy when
//! shards hold different numbers of non-pad tokens, and for [`Reduction::SentenceMean`](crate::loss::Reduction::SentenceMean) when
//! they hold different numbers of sentences. Here every global quantity `G = Σ_w g_w` (a sum
//! over workers `w`) is computed on worker `w` as
//!
//! ```text
//! G_w = allreduce_sum(g_w) + (g_w − g_w.detach())
//! ```
//!
//! whose value is `G` — the all-reduce's result, bit-identical on every worker — and whose
//! gradient is that of `g_w` alone: the other workers' terms are constants
//! ([`DataParallel::global_sum`]). Then
//!
//! - corpus BLEU: `g_w` = the shard's statistics summed over its elements, and the loss is
//!   [`loss_from_stats`](crate::loss::loss_from_stats) of the global sums
//!   ([`DataParallel::global_stats`], [`DataParallel::bleu_loss_from_stats`]);
//! - `SentenceMean`: `Σ_w (sum of the shard's sentence losses) / Σ_w (shard size)`;
//! - cross-entropy: `Σ_w (sum of the shard's token losses) / Σ_w (shard's non-pad tokens)`
//!   (with class weights, `/ Σ_w (shard's Σ w_t)`, PyTorch's weighted mean; with a z-loss too,
//!   refused under `Mean`); a shard may hold only padding
//!   ([`cross_entropy_sum_and_count`]).
//!
//! Every worker gets the loss of the global batch, and the gradient of its own shard's share.
//! Summing the parameter gradients over workers ([`DataParallel::sum_gradients`]: a **sum**, not
//! a mean) then gives exactly the gradient of the single-process loss on the global batch, to
//! round-off — so N workers × B/N elements train like one process × B (the same parameters
//! after every step, with dropout off or seeded alike).
//!
//! [`DataParallel`] holds the group's [`AllReduce`]; its loss methods have the single-process
//! functions' names and signatures, so a training loop changes only the receiver:
//! `loss::ce_bleu_from_logits(&logits, &targets, &cfg)` becomes
//! `dp.ce_bleu_from_logits(&logits, &targets, &cfg)`, the training step's loss of
//! [`crate::loss::ce_bleu_from_logits`] with all of this and one small all-reduce.
//!
//! # A data-parallel step
//!
//! ```
//! use candle_bleu::loss::distributed::{self, DataParallel, SingleWorker};
//! use candle_bleu::loss::{CrossEntropyConfig, References, TrainingLossConfig, TrainingTargets};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
//!
//! // One worker here; `MpiAllReduce` (feature `mpi`) or `NcclAllReduce` (feature `nccl`) in a
//! // real job, where each rank holds its own shard.
//! let reduce = SingleWorker;
//! let dp = DataParallel::new(&reduce);
//! let dev = Device::Cpu;
//! let targets = Tensor::new(&[[1u32, 2, 3, 0], [4, 5, 0, 0]], &dev)?; // this rank's shard
//! let refs = References::from_ids(&targets, 0)?;
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let logits = vb.get_with_hints((2, 4, 8), "logits", candle_nn::Init::Const(0.0))?;
//! let cfg = TrainingLossConfig {
//!     bleu_weight: 0.5,
//!     ce: CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.0, ..Default::default() },
//!     ..Default::default()
//! };
//! // The same variables in the same order on every worker, starting from worker 0's values.
//! let vars = distributed::vars_by_name(&varmap);
//! dp.broadcast_parameters(&vars)?;
//! let mut opt = SGD::new(vars.clone(), 0.1)?;
//! let step = dp.ce_bleu_from_logits(&logits, &TrainingTargets::new(&targets, &refs), &cfg)?;
//! let mut grads = step.loss.backward()?;
//! dp.sum_gradients(&mut grads, &vars)?; // Σ over workers
//! opt.step(&grads)?;
//! // The loss of the global batch, the same on every rank.
//! assert!(step.loss.to_scalar::<f32>()? > 0.0);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! # Implementations of [`AllReduce`]
//!
//! The core library has no collective; it defines the trait and two in-process
//! implementations:
//!
//! | type | feature | what it reduces over | where the data goes |
//! |---|---|---|---|
//! | [`SingleWorker`] | — | one worker: the identity | nowhere |
//! | [`ThreadAllReduce`] | — | threads of one process (tests, examples) | summed on the tensors' device |
//! | `MpiAllReduce` | `mpi` | the ranks of an MPI communicator (rsmpi) | copied to the host, `MPI_Allreduce`, copied back |
//! | `NcclAllReduce` | `nccl` | the ranks of an NCCL communicator (candle's cudarc) | stays on the GPU: `ncclAllReduce` on the device's stream |
//!
//! `NcclAllReduce` ran with one rank on one GPU (an H200, 2026-11-27); **more than one rank has
//! not run**; see `docs/distributed.md`.
//!
//! # Costs
//!
//! [`DataParallel::ce_bleu_from_logits`] adds one all-reduce of `2·N + 4` numbers (corpus BLEU; 4 with
//! `SentenceMean`) per call, a few scalar tensor ops, and one read of one number to the host
//! (the global token count, checked to be non-zero; counted by [`super::host_copies`]). The gradient
//! all-reduce of [`DataParallel::sum_gradients`] moves the parameters' size once per step, in one call.
//!
//! # Errors and collectives
//!
//! A collective completes only when every worker calls it. Validation errors that depend on a
//! worker's own input (a bad shape, an out-of-vocabulary id) are raised **before** the
//! all-reduce, on that worker only, so the others wait for it forever: abort the whole job on an
//! error (`MPI_Abort`, as `examples/data_parallel.rs` does). Errors on the reduced values (no
//! non-pad token in the global batch) are raised on every worker alike.

mod thread;

#[cfg(feature = "mpi")]
mod mpi_impl;
#[cfg(feature = "nccl")]
mod nccl_impl;

pub use super::all_reduce::{AllReduce, SingleWorker};
/// The rsmpi crate this module was built with (feature `mpi`), re-exported so that a program
/// initialises MPI with the same version: `candle_bleu::loss::distributed::mpi::initialize()`.
#[cfg(feature = "mpi")]
pub use ::mpi;
/// cudarc's NCCL bindings (feature `nccl`), as candle re-exports them: `Comm` and `Id` for
/// [`NcclAllReduce::new`].
#[cfg(feature = "nccl")]
pub use candle_core::cuda_backend::cudarc::nccl;
#[cfg(feature = "mpi")]
pub use mpi_impl::MpiAllReduce;
#[cfg(feature = "nccl")]
pub use nccl_impl::NcclAllReduce;
pub use thread::ThreadAllReduce;

use super::checked::hypotheses::Hypotheses;
use super::checked::stats::shard_stats_shapes;
use super::config::{
    constant, sum_dtype, BleuLossConfig, BleuLossOutput, BleuStats, CrossEntropyConfig,
    CrossEntropyOutput, HiddenConfig, TrainingLoss, TrainingLossConfig,
};
use super::ctc_bleu::ctc_bleu_on;
use super::dispatch::Path;
use super::hidden::hidden_input;
use super::reduce::{global_corpus_sums, global_sum, Reducer};
use super::references::{References, TrainingTargets};
use super::run;
use candle_core::backprop::GradStore;
use candle_core::{bail, Result, Tensor, Var};
use candle_nn::Linear;

/// The range of elements `rank` holds when `total` elements are split over `world_size`
/// workers as evenly as possible (the first `total % world_size` workers hold one more).
///
/// Returns `(start, len)`; `len` is 0 when `total < world_size` and `rank >= total`.
/// Errors if `world_size` is 0 or `rank >= world_size`.
///
/// ```
/// use candle_bleu::loss::distributed::shard_range;
/// assert_eq!(shard_range(10, 0, 3)?, (0, 4));
/// assert_eq!(shard_range(10, 1, 3)?, (4, 3));
/// assert_eq!(shard_range(10, 2, 3)?, (7, 3));
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn shard_range(total: usize, rank: usize, world_size: usize) -> Result<(usize, usize)> {
    if world_size == 0 || rank >= world_size {
        bail!(
            "shard_range: `rank` {rank} must be < `world_size` {world_size} (and world_size >= 1)"
        );
    }
    let (base, extra) = (total / world_size, total % world_size);
    let len = base + usize::from(rank < extra);
    let start = rank * base + rank.min(extra);
    Ok((start, len))
}

/// This worker's cross-entropy **sum** over its non-pad target positions and their count —
/// what the global mean is made of — defined on a shard of only padding (sum 0 with a zero
/// gradient, count 0), where [`crate::loss::cross_entropy_from_logits`] (a mean) errors.
/// A free function, not a method of [`DataParallel`]: it makes no all-reduce (the caller sums
/// the two over the group).
///
/// * `logits` - float `[B, S, V]`; `targets` u32 `[B, S]`; `cfg` as
///   [`crate::loss::cross_entropy_from_logits`].
///
/// Returns `(sum, count)`: scalars, `sum` in the compute dtype of the logits (f32 for
/// f16/bf16) with the gradient of the sum, `count` in f64 (f32 on Metal), a constant. The
/// count is the one the validation makes (in place on the CPU, one small counted copy off
/// it, as every cross-entropy entry point): the number of non-pad targets, or with
/// `cfg.class_weights` their weights' sum `Σ w_t`, so that `Σ_w sum_w / Σ_w count_w` over
/// the workers is the mean (weighted, as PyTorch's `weight=`) of the global batch. Class
/// weights with a z-loss are an error: the weighted mean divides by `Σ w_t` and the
/// z-term's mean by the number of targets, which no one count serves.
pub fn cross_entropy_sum_and_count(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<(Tensor, Tensor)> {
    let path = Path::for_device(logits.device());
    let input = Hypotheses::Logits(logits);
    let (sum, count) = run::cross_entropy_sum_and_count(input, targets, cfg, path)?;
    let device = logits.device();
    let count = constant(vec![count], (), sum_dtype(device), device)?;
    Ok((sum, count))
}

/// The data-parallel entry points: the losses of [`crate::loss`] over a group of workers, each
/// call on this worker's shard of the global batch.
///
/// Holds a borrow of the group's [`AllReduce`]. Each loss method has the signature of the
/// single-process function of the same name in [`crate::loss`], so a training loop switches by
/// its receiver alone: `loss::ce_bleu_from_logits(&logits, &targets, &cfg)` becomes
/// `dp.ce_bleu_from_logits(&logits, &targets, &cfg)`. The losses are those of the **global**
/// batch (the same on every worker) with the gradient of this worker's share; the other
/// methods are the group's helpers (gradients, parameters, statistics).
///
/// Every worker must call the same methods in the same order (each reducing method is a
/// collective: see the module docs on errors). Cheap to copy: a reference.
///
/// ```
/// use candle_bleu::loss::distributed::{DataParallel, SingleWorker};
/// use candle_bleu::loss::{self, CrossEntropyConfig};
/// use candle_core::{Device, Tensor};
///
/// let logits = Tensor::new(&[[[0.5f32, -1.0, 2.0], [0.0, 1.0, 0.0]]], &Device::Cpu)?; // [1, 2, 3]
/// let targets = Tensor::new(&[[2u32, 1]], &Device::Cpu)?; // [1, 2]
/// let cfg = CrossEntropyConfig::default();
/// let dp = DataParallel::new(&SingleWorker);
/// let alone = loss::cross_entropy_from_logits(&logits, &targets, &cfg)?.loss;
/// let group = dp.cross_entropy_from_logits(&logits, &targets, &cfg)?.loss;
/// assert_eq!(alone.to_scalar::<f32>()?, group.to_scalar::<f32>()?);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub struct DataParallel<'a, R: AllReduce + ?Sized> {
    all_reduce: &'a R,
}

// Not derived: a derive would require `R: Clone` (or `R: Debug`), where only the reference is
// copied.
impl<R: AllReduce + ?Sized> Clone for DataParallel<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: AllReduce + ?Sized> Copy for DataParallel<'_, R> {}

impl<R: AllReduce + ?Sized> std::fmt::Debug for DataParallel<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataParallel")
            .field("rank", &self.all_reduce.rank())
            .field("world_size", &self.all_reduce.world_size())
            .finish()
    }
}

impl<'a, R: AllReduce + ?Sized> DataParallel<'a, R> {
    /// The entry points over the group that `all_reduce` reduces over (this worker's handle:
    /// [`SingleWorker`], [`ThreadAllReduce`], `MpiAllReduce`, `NcclAllReduce`, or any
    /// [`AllReduce`]).
    pub fn new(all_reduce: &'a R) -> Self {
        Self { all_reduce }
    }

    /// The group's all-reduce, for the program's own collectives and its `rank()` and
    /// `world_size()`.
    pub fn all_reduce(&self) -> &'a R {
        self.all_reduce
    }

    /// The reduction stage's view of the group.
    fn group(&self) -> Reducer<'_> {
        Reducer::Group(&self.all_reduce)
    }

    /// The sum of `local` over every worker, differentiable in this worker's term:
    /// `allreduce_sum(local) + (local − local.detach())`.
    ///
    /// Its value is `Σ_w local_w` as the all-reduce returns it (the same bits on every worker);
    /// its gradient with respect to anything `local` depends on is that of `local` itself — the
    /// other workers' terms are constants. Any shape and float dtype the [`AllReduce`]
    /// supports; the result has `local`'s shape and dtype.
    ///
    /// ```
    /// use candle_bleu::loss::distributed::{DataParallel, ThreadAllReduce};
    /// use candle_core::{Device, Tensor, Var};
    ///
    /// let results = std::thread::scope(|s| {
    ///     let handles: Vec<_> = ThreadAllReduce::group(2)
    ///         .into_iter()
    ///         .enumerate()
    ///         .map(|(w, reduce)| s.spawn(move || -> candle_core::Result<(f64, f64)> {
    ///             let dp = DataParallel::new(&reduce);
    ///             let x = Var::new(&[1f64 + w as f64], &Device::Cpu)?; // worker 0: 1, worker 1: 2
    ///             let total = dp.global_sum(&x.sqr()?)?.sum_all()?; // 1² + 2² = 5
    ///             let grad = total.backward()?.get(&x).unwrap().sum_all()?.to_scalar::<f64>()?;
    ///             Ok((total.to_scalar::<f64>()?, grad)) // d/dx of this worker's x² only
    ///         }))
    ///         .collect();
    ///     handles.into_iter().map(|h| h.join().unwrap()).collect::<candle_core::Result<Vec<_>>>()
    /// })?;
    /// assert_eq!(results, vec![(5.0, 2.0), (5.0, 4.0)]);
    /// # Ok::<(), candle_core::Error>(())
    /// ```
    pub fn global_sum(&self, local: &Tensor) -> Result<Tensor> {
        global_sum(local, self.all_reduce)
    }

    /// The corpus statistics of the global batch, differentiable in this worker's shard:
    /// `matches` and `totals` `[1, N]`, `hyp_len` and `ref_len` `[1]`, each the sum over every
    /// worker's elements ([`DataParallel::global_sum`]), in f64 (f32 on Metal).
    ///
    /// [`loss_from_stats`](crate::loss::loss_from_stats) of the result under
    /// [`Reduction::Corpus`](crate::loss::Reduction::Corpus) is the corpus loss of the global
    /// batch. `local` is this worker's [`BleuStats`] (`[B_w, N]`, `[B_w]`, `B_w >= 1`). One
    /// all-reduce of `2·N + 2` numbers.
    pub fn global_stats(&self, local: &BleuStats) -> Result<BleuStats> {
        shard_stats_shapes(local)?;
        global_corpus_sums(local, self.all_reduce)
    }

    /// The BLEU loss of the global batch from this worker's statistics, with the gradient of
    /// this worker's share.
    ///
    /// * `local` - this worker's [`BleuStats`] (`out.stats` of
    ///   [`DataParallel::bleu_loss_from_logits`] on its shard: `[B_w, N]` and `[B_w]`,
    ///   `B_w >= 1`).
    /// * `cfg` - the configuration the statistics were computed with; `reduction` decides:
    ///   `Corpus` scores the globally summed statistics (one corpus BLEU over every worker's
    ///   elements), `SentenceMean` averages the sentence losses over the global batch
    ///   (`Σ_w Σ_b loss_b / Σ_w B_w`).
    ///
    /// Returns a scalar in the statistics' dtype (f32 for f16/bf16), the same on every worker.
    /// One all-reduce of `2·N + 2` numbers (corpus) or 2 (`SentenceMean`).
    pub fn bleu_loss_from_stats(&self, local: &BleuStats, cfg: &BleuLossConfig) -> Result<Tensor> {
        self.group()
            .bleu_loss(local, cfg, Path::for_device(local.matches.device()))
    }

    /// The mean cross-entropy of the global batch from this worker's shard:
    /// `Σ_w (shard w's token losses) / Σ_w (shard w's non-pad targets)`, with the gradient of
    /// this worker's share. A shard may hold only padding, as long as the global batch does
    /// not.
    ///
    /// Arguments as [`crate::loss::cross_entropy_from_logits`] (`logits` `[B_w, S, V]`,
    /// `targets` u32 `[B_w, S]`). Returns the loss, a scalar in the logits' compute dtype, the
    /// same on every worker, and the z-loss's part and token accuracy of the global batch when
    /// `cfg` asks for them ([`CrossEntropyOutput`]). One all-reduce of 2 numbers (4 with
    /// those) and one read of the global count to the host (one number, counted by
    /// [`crate::loss::host_copies`]; under `Sum` only with `token_accuracy`). Errors as that
    /// function does on this worker's input, except on all padding, and on every worker when
    /// no worker has a non-pad target.
    pub fn cross_entropy_from_logits(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        cfg: &CrossEntropyConfig,
    ) -> Result<CrossEntropyOutput> {
        let path = Path::for_device(logits.device());
        let input = Hypotheses::Logits(logits);
        run::cross_entropy(input, targets, cfg, path, self.group())
    }

    /// [`DataParallel::cross_entropy_from_logits`] from the hidden states and the output
    /// layer: [`crate::loss::cross_entropy_from_hidden`] for data-parallel workers, the logits
    /// never stored. Arguments as that function, for this worker's shard.
    pub fn cross_entropy_from_hidden(
        &self,
        hidden: &Tensor,
        proj: &Linear,
        targets: &Tensor,
        cfg: &CrossEntropyConfig,
        blocks: &HiddenConfig,
    ) -> Result<CrossEntropyOutput> {
        let path = Path::for_device(hidden.device());
        let input = hidden_input(hidden, proj, blocks);
        run::cross_entropy(input, targets, cfg, path, self.group())
    }

    /// The BLEU loss of the global batch from this worker's shard of logits:
    /// [`crate::loss::bleu_loss_from_logits`] followed by
    /// [`DataParallel::bleu_loss_from_stats`], in one call. Returns the global loss and
    /// **this worker's** per-element statistics.
    pub fn bleu_loss_from_logits(
        &self,
        logits: &Tensor,
        hyp_lengths: Option<&Tensor>,
        refs: &References,
        cfg: &BleuLossConfig,
    ) -> Result<BleuLossOutput> {
        let path = Path::for_device(logits.device());
        let input = Hypotheses::Logits(logits);
        run::bleu(input, hyp_lengths, refs, cfg, path, self.group())
    }

    /// The BLEU loss of the global batch from this worker's shard of probabilities:
    /// [`crate::loss::bleu_loss`] for data-parallel workers (composed ops, as that function).
    /// Returns the global loss and **this worker's** per-element statistics.
    pub fn bleu_loss(
        &self,
        hyp_probs: &Tensor,
        hyp_lengths: Option<&Tensor>,
        refs: &References,
        cfg: &BleuLossConfig,
    ) -> Result<BleuLossOutput> {
        let input = Hypotheses::Probs(hyp_probs);
        run::bleu(input, hyp_lengths, refs, cfg, Path::Composed, self.group())
    }

    /// The BLEU loss on CTC outputs of the global batch from this worker's shard:
    /// [`crate::loss::ctc_bleu_loss_from_logits`] for data-parallel workers (the globally
    /// summed expected statistics, scored once). Returns the global loss and **this worker's**
    /// per-element statistics.
    pub fn ctc_bleu_loss_from_logits(
        &self,
        logits: &Tensor,
        input_lengths: Option<&Tensor>,
        refs: &References,
        blank: u32,
        cfg: &BleuLossConfig,
    ) -> Result<BleuLossOutput> {
        let path = Path::for_device(logits.device());
        ctc_bleu_on(logits, input_lengths, refs, blank, cfg, path, self.group())
    }

    /// [`DataParallel::bleu_loss_from_logits`] from the hidden states and the output layer:
    /// [`crate::loss::bleu_loss_from_hidden`] for data-parallel workers.
    pub fn bleu_loss_from_hidden(
        &self,
        hidden: &Tensor,
        proj: &Linear,
        hyp_lengths: Option<&Tensor>,
        refs: &References,
        cfg: &BleuLossConfig,
        blocks: &HiddenConfig,
    ) -> Result<BleuLossOutput> {
        let path = Path::for_device(hidden.device());
        let input = hidden_input(hidden, proj, blocks);
        run::bleu(input, hyp_lengths, refs, cfg, path, self.group())
    }

    /// The training step's loss of the **global** batch, `cross_entropy + cfg.bleu_weight ·
    /// bleu`, from this worker's shard: [`crate::loss::ce_bleu_from_logits`] for data-parallel
    /// workers.
    ///
    /// Each part is the single-process value on the concatenation of every worker's shard (to
    /// round-off): the cross-entropy is the mean over the global batch's non-pad targets (a
    /// shard may hold only padding), the BLEU loss scores the globally summed statistics
    /// (`Corpus`) or averages over the global batch's sentences (`SentenceMean`). The gradient
    /// is that of this worker's share: after [`DataParallel::sum_gradients`], the parameters'
    /// gradients equal the single-process ones.
    ///
    /// # Arguments
    /// * `logits` - float `[B_w, S, V]`, this worker's shard (`B_w >= 1`; the shards may
    ///   differ in size).
    /// * `targets`, `cfg` - as [`crate::loss::ce_bleu_from_logits`], for the shard
    ///   (`targets.refs` holds the shard's `B_w` elements, `targets.tokens` is u32 `[B_w, S]`).
    ///
    /// Returns a [`TrainingLoss`]: `loss` and `cross_entropy` of the global batch (scalars in
    /// the logits' compute dtype, equal on every worker); `bleu.loss` the global BLEU loss, and
    /// `bleu.stats` **this worker's** per-element statistics (`[B_w, N]`, `[B_w]`).
    ///
    /// Cost over the single-process call: one all-reduce of `2·N + 4` numbers (`Corpus`) or 4
    /// (`SentenceMean`) and one read of the global token count to the host (one number,
    /// counted by [`crate::loss::host_copies`]); a shard of only padding costs nothing more
    /// (its row terms are 0). Errors as the single-process function on this worker's input
    /// (before the all-reduce: see the module docs on errors), and on every worker when no
    /// worker has a non-pad target.
    pub fn ce_bleu_from_logits(
        &self,
        logits: &Tensor,
        targets: &TrainingTargets,
        cfg: &TrainingLossConfig,
    ) -> Result<TrainingLoss> {
        let path = Path::for_device(logits.device());
        let input = Hypotheses::Logits(logits);
        run::training(input, targets, cfg, path, self.group())
    }

    /// [`DataParallel::ce_bleu_from_logits`] from the hidden states and the output layer:
    /// [`crate::loss::ce_bleu_from_hidden`] for data-parallel workers, the fastest and leanest
    /// path (the `[B_w, S, V]` logits are never stored). Arguments as that function, for this
    /// worker's shard; the same costs and errors as [`DataParallel::ce_bleu_from_logits`].
    pub fn ce_bleu_from_hidden(
        &self,
        hidden: &Tensor,
        proj: &Linear,
        targets: &TrainingTargets,
        cfg: &TrainingLossConfig,
        blocks: &HiddenConfig,
    ) -> Result<TrainingLoss> {
        let path = Path::for_device(hidden.device());
        let input = hidden_input(hidden, proj, blocks);
        run::training(input, targets, cfg, path, self.group())
    }

    /// Replaces the gradient of every variable in `vars` by its sum over all workers, in one
    /// all-reduce per dtype (the gradients flattened into one buffer).
    ///
    /// A variable with no gradient on this worker contributes zeros (and receives the sum, so
    /// that every worker applies the same update). Every worker must pass the same variables
    /// in the same order: [`vars_by_name`] gives that order for a `VarMap`
    /// (`VarMap::all_vars` does not: it lists a `HashMap`, whose order differs between
    /// processes). After this, `optimizer.step(grads)` applies the gradient of the global
    /// batch's loss.
    pub fn sum_gradients(&self, grads: &mut GradStore, vars: &[Var]) -> Result<()> {
        for group in by_dtype(vars) {
            let flat: Vec<Tensor> = group
                .iter()
                .map(|var| match grads.get(var.as_tensor()) {
                    Some(g) => g.detach().flatten_all(),
                    None => var.as_tensor().zeros_like()?.flatten_all(),
                })
                .collect::<Result<_>>()?;
            let total = self.all_reduce.sum(&Tensor::cat(&flat, 0)?)?;
            let mut offset = 0;
            for var in group {
                let n = var.elem_count();
                let g = total.narrow(0, offset, n)?.reshape(var.shape())?;
                offset += n;
                grads.insert(var.as_tensor(), g);
            }
        }
        Ok(())
    }

    /// Sets every variable to worker 0's value, so that all workers start from the same
    /// parameters (random initialisation differs between processes): one sum all-reduce per
    /// dtype in which the other workers contribute zeros (exact: `x + 0 = x`).
    ///
    /// Every worker must pass the same variables in the same order ([`vars_by_name`]).
    pub fn broadcast_parameters(&self, vars: &[Var]) -> Result<()> {
        let reduce = self.all_reduce;
        if reduce.world_size() == 1 {
            return Ok(()); // worker 0's values are already everyone's
        }
        let first = reduce.rank() == 0;
        for group in by_dtype(vars) {
            let flat: Vec<Tensor> = group
                .iter()
                .map(|var| {
                    let t = var.as_tensor().detach().flatten_all()?;
                    if first {
                        Ok(t)
                    } else {
                        t.zeros_like()
                    }
                })
                .collect::<Result<_>>()?;
            let values = reduce.sum(&Tensor::cat(&flat, 0)?)?;
            let mut offset = 0;
            for var in group {
                let n = var.elem_count();
                var.set(&values.narrow(0, offset, n)?.reshape(var.shape())?)?;
                offset += n;
            }
        }
        Ok(())
    }
}

/// `vars` grouped by dtype, in order of first appearance, each group in the order of `vars`.
fn by_dtype(vars: &[Var]) -> Vec<Vec<&Var>> {
    let mut groups: Vec<Vec<&Var>> = Vec::new();
    for var in vars {
        match groups.iter_mut().find(|g| g[0].dtype() == var.dtype()) {
            Some(group) => group.push(var),
            None => groups.push(vec![var]),
        }
    }
    groups
}

/// The variables of `varmap` sorted by name: the same order in every process, as
/// [`DataParallel::sum_gradients`] and [`DataParallel::broadcast_parameters`] need (`VarMap::all_vars` lists a `HashMap`,
/// whose order differs between processes).
pub fn vars_by_name(varmap: &candle_nn::VarMap) -> Vec<Var> {
    let data = varmap
        .data()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut named: Vec<(&String, &Var)> = data.iter().collect();
    named.sort_by(|a, b| a.0.cmp(b.0));
    named.into_iter().map(|(_, v)| v.clone()).collect()
}
