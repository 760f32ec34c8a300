//! Data-parallel training with the BLEU loss: each worker computes the loss of its shard of the
//! global batch, and one sum all-reduce per step turns the shard's outputs into the loss of the
//! **whole** batch, with the gradient of this worker's share.
//!
//! Corpus BLEU is not a mean over sentences: it depends on the batch through its summed n-gram
//! statistics, so averaging per-worker losses (what data-parallel cross-entropy does) would
//! give a different, wrong loss. The same holds, less visibly, for the mean cross-entropy when
//! shards hold different numbers of non-pad tokens, and for [`Reduction::SentenceMean`] when
//! they hold different numbers of sentences. Here every global quantity `G = Σ_w g_w` (a sum
//! over workers `w`) is computed on worker `w` as
//!
//! ```text
//! G_w = allreduce_sum(g_w) + (g_w − g_w.detach())
//! ```
//!
//! whose value is `G` — the all-reduce's result, bit-identical on every worker — and whose
//! gradient is that of `g_w` alone: the other workers' terms are constants ([`global_sum`]). Then
//!
//! - corpus BLEU: `g_w` = the shard's statistics summed over its elements, and the loss is
//!   [`loss_from_stats`] of the global sums ([`global_stats`], [`bleu_loss_from_stats`]);
//! - `SentenceMean`: `Σ_w (sum of the shard's sentence losses) / Σ_w (shard size)`;
//! - cross-entropy: `Σ_w (sum of the shard's token losses) / Σ_w (shard's non-pad tokens)`; a
//!   shard may hold only padding ([`cross_entropy_sum_and_count`]).
//!
//! Every worker gets the loss of the global batch, and the gradient of its own shard's share.
//! Summing the parameter gradients over workers ([`sum_gradients`]: a **sum**, not a mean) then
//! gives exactly the gradient of the single-process loss on the global batch, to round-off —
//! so N workers × B/N elements train like one process × B (the same parameters after every
//! step, with dropout off or seeded alike). [`ce_bleu_from_logits`] is the training step's loss
//! of [`crate::loss::ce_bleu_from_logits`] with all of this and one small all-reduce.
//!
//! # A data-parallel step
//!
//! ```
//! use candle_bleu::loss::distributed::{self, AllReduce, SingleWorker};
//! use candle_bleu::loss::{CrossEntropyConfig, References, TrainingLossConfig, TrainingTargets};
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{Optimizer, VarBuilder, VarMap, SGD};
//!
//! // One worker here; `MpiAllReduce` (feature `mpi`) or `NcclAllReduce` (feature `nccl`) in a
//! // real job, where each rank holds its own shard.
//! let reduce = SingleWorker;
//! let dev = Device::Cpu;
//! let targets = Tensor::new(&[[1u32, 2, 3, 0], [4, 5, 0, 0]], &dev)?; // this rank's shard
//! let refs = References::from_ids(&targets, 0)?;
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
//! let logits = vb.get_with_hints((2, 4, 8), "logits", candle_nn::Init::Const(0.0))?;
//! let cfg = TrainingLossConfig {
//!     bleu_weight: 0.5,
//!     ce: CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.0 },
//!     ..Default::default()
//! };
//! // The same variables in the same order on every worker, starting from worker 0's values.
//! let vars = distributed::vars_by_name(&varmap);
//! distributed::broadcast_parameters(&vars, &reduce)?;
//! let mut opt = SGD::new(vars.clone(), 0.1)?;
//! let step = distributed::ce_bleu_from_logits(&logits, &TrainingTargets::new(&targets, &refs), &cfg, &reduce)?;
//! let mut grads = step.loss.backward()?;
//! distributed::sum_gradients(&mut grads, &vars, &reduce)?; // Σ over workers
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
//! [`ce_bleu_from_logits`] adds one all-reduce of `2·N + 4` numbers (corpus BLEU; 4 with
//! `SentenceMean`) per call, a few scalar tensor ops, and one read of one number to the host
//! (the global token count, checked to be non-zero; counted by [`super::host_copies`]). The gradient
//! all-reduce of [`sum_gradients`] moves the parameters' size once per step, in one call.
//!
//! # Errors and collectives
//!
//! A collective completes only when every worker calls it. Validation errors that depend on a
//! worker's own input (a bad shape, an out-of-vocabulary id) are raised **before** the
//! all-reduce, on that worker only, so the others wait for it forever: abort the whole job on an
//! error (`MPI_Abort`, as `examples/data_parallel.rs` does). Errors on the reduced values (no
//! non-pad token in the global batch) are raised on every worker alike.

mod all_reduce;
mod thread;

#[cfg(feature = "mpi")]
mod mpi_impl;
#[cfg(feature = "nccl")]
mod nccl_impl;

/// The rsmpi crate this module was built with (feature `mpi`), re-exported so that a program
/// initialises MPI with the same version: `candle_bleu::loss::distributed::mpi::initialize()`.
#[cfg(feature = "mpi")]
pub use ::mpi;
pub use all_reduce::{AllReduce, SingleWorker};
/// cudarc's NCCL bindings (feature `nccl`), as candle re-exports them: `Comm` and `Id` for
/// [`NcclAllReduce::new`].
#[cfg(feature = "nccl")]
pub use candle_core::cuda_backend::cudarc::nccl;
#[cfg(feature = "mpi")]
pub use mpi_impl::MpiAllReduce;
#[cfg(feature = "nccl")]
pub use nccl_impl::NcclAllReduce;
pub use thread::ThreadAllReduce;

use super::config::{
    BleuLossConfig, BleuLossOutput, BleuStats, CrossEntropyConfig, Reduction, TrainingLoss,
    TrainingLossConfig,
};
use super::references::TrainingTargets;
use super::score::{self, loss_from_stats};
use candle_core::backprop::GradStore;
use candle_core::{bail, DType, Device, Result, Tensor, Var};

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

/// The dtype of the numbers the loss all-reduces: f64 where the device has it, f32 on Metal.
fn reduce_dtype(device: &Device) -> DType {
    if device.is_metal() {
        DType::F32
    } else {
        DType::F64
    }
}

/// The sum of `local` over every worker, differentiable in this worker's term:
/// `allreduce_sum(local) + (local − local.detach())`.
///
/// Its value is `Σ_w local_w` as the all-reduce returns it (the same bits on every worker);
/// its gradient with
/// respect to anything `local` depends on is that of `local` itself — the other workers' terms
/// are constants. Any shape and float dtype the [`AllReduce`] supports.
///
/// ```
/// use candle_bleu::loss::distributed::{global_sum, ThreadAllReduce};
/// use candle_core::{Device, Tensor, Var};
///
/// let results = std::thread::scope(|s| {
///     let handles: Vec<_> = ThreadAllReduce::group(2)
///         .into_iter()
///         .enumerate()
///         .map(|(w, reduce)| s.spawn(move || -> candle_core::Result<(f64, f64)> {
///             let x = Var::new(&[1f64 + w as f64], &Device::Cpu)?; // worker 0: 1, worker 1: 2
///             let total = global_sum(&x.sqr()?, &reduce)?.sum_all()?; // 1² + 2² = 5
///             let grad = total.backward()?.get(&x).unwrap().sum_all()?.to_scalar::<f64>()?;
///             Ok((total.to_scalar::<f64>()?, grad)) // d/dx of this worker's x² only
///         }))
///         .collect();
///     handles.into_iter().map(|h| h.join().unwrap()).collect::<candle_core::Result<Vec<_>>>()
/// })?;
/// assert_eq!(results, vec![(5.0, 2.0), (5.0, 4.0)]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn global_sum(local: &Tensor, reduce: &(impl AllReduce + ?Sized)) -> Result<Tensor> {
    let detached = local.detach();
    let total = reduce.sum(&detached)?;
    if total.dims() != local.dims() || total.dtype() != local.dtype() {
        bail!(
            "the all-reduce returned {:?} {:?} for a {:?} {:?} input",
            total.dtype(),
            total.dims(),
            local.dtype(),
            local.dims()
        );
    }
    // `total` carries the value (bit-identical on every worker); `local − local` adds 0 and
    // the gradient of `local`.
    total + (local - detached)?
}

/// One all-reduce for several float tensors: each is flattened into one buffer of the reduce
/// dtype, summed with [`global_sum`], and split back into its shape and dtype.
fn global_sums(parts: &[Tensor], reduce: &(impl AllReduce + ?Sized)) -> Result<Vec<Tensor>> {
    let Some(first) = parts.first() else {
        return Ok(Vec::new());
    };
    let dtype = reduce_dtype(first.device());
    let flat: Vec<Tensor> = parts
        .iter()
        .map(|p| p.to_dtype(dtype)?.flatten_all())
        .collect::<Result<_>>()?;
    let total = global_sum(&Tensor::cat(&flat, 0)?, reduce)?;
    let mut offset = 0;
    parts
        .iter()
        .map(|p| {
            let n = p.elem_count();
            let part = total.narrow(0, offset, n)?.reshape(p.shape())?;
            offset += n;
            Ok(part)
        })
        .collect()
}

/// The corpus statistics of the global batch, differentiable in this worker's shard: `matches`
/// and `totals` `[1, N]`, `hyp_len` and `ref_len` `[1]`, each the sum over every worker's
/// elements ([`global_sum`]), in f64 (f32 on Metal).
///
/// [`loss_from_stats`] of the result under [`Reduction::Corpus`] is the corpus loss of the
/// global batch. `local` is this worker's [`BleuStats`] (`[B_w, N]`, `[B_w]`, `B_w >= 1`).
/// One all-reduce of `2·N + 2` numbers.
pub fn global_stats(local: &BleuStats, reduce: &(impl AllReduce + ?Sized)) -> Result<BleuStats> {
    check_stats(local)?;
    let local = stats_in(local, reduce_dtype(local.matches.device()))?;
    let sums = [
        local.matches.sum(0)?,
        local.totals.sum(0)?,
        local.hyp_len.sum_keepdim(0)?,
        local.ref_len.sum_keepdim(0)?,
    ];
    let mut g = global_sums(&sums, reduce)?.into_iter();
    let mut next = || g.next().expect("four sums");
    Ok(BleuStats {
        matches: next().unsqueeze(0)?,
        totals: next().unsqueeze(0)?,
        hyp_len: next(),
        ref_len: next(),
    })
}

/// Errors unless the statistics have the shapes [`loss_from_stats`] takes.
fn check_stats(stats: &BleuStats) -> Result<()> {
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

/// The statistics in the reduce dtype, so that the per-sentence losses of `SentenceMean` are
/// summed without rounding to the caller's dtype first.
fn stats_in(stats: &BleuStats, dtype: DType) -> Result<BleuStats> {
    Ok(BleuStats {
        matches: stats.matches.to_dtype(dtype)?,
        totals: stats.totals.to_dtype(dtype)?,
        hyp_len: stats.hyp_len.to_dtype(dtype)?,
        ref_len: stats.ref_len.to_dtype(dtype)?,
    })
}

/// The float dtype the crate computes `dtype` in (f16/bf16 in f32).
fn compute_dtype(dtype: DType) -> DType {
    match dtype {
        DType::F64 => DType::F64,
        _ => DType::F32,
    }
}

/// What the BLEU loss contributes to the one all-reduce: the corpus sums, or the sum of the
/// shard's sentence losses and its size.
fn bleu_parts(local: &BleuStats, cfg: &BleuLossConfig) -> Result<Vec<Tensor>> {
    check_stats(local)?;
    // Each worker's own statistics: a negative one could hide in the global sums.
    score::check_stats_values("", local, cfg.check_values)?;
    let dtype = reduce_dtype(local.matches.device());
    // Summed in the reduce dtype (f64), as the single-process score sums them.
    let local = stats_in(local, dtype)?;
    match cfg.reduction {
        Reduction::Corpus => Ok(vec![
            local.matches.sum(0)?,
            local.totals.sum(0)?,
            local.hyp_len.sum_keepdim(0)?,
            local.ref_len.sum_keepdim(0)?,
        ]),
        Reduction::SentenceMean => {
            let batch = local.matches.dim(0)?;
            let mean = loss_from_stats(&local, cfg)?;
            let count = Tensor::full(batch as f64, 1, local.matches.device())?.to_dtype(dtype)?;
            Ok(vec![mean.affine(batch as f64, 0.0)?.reshape(1)?, count])
        }
    }
}

/// The global BLEU loss from the globally summed [`bleu_parts`], in `out_dtype`.
fn bleu_from_parts(parts: &[Tensor], cfg: &BleuLossConfig, out_dtype: DType) -> Result<Tensor> {
    let loss = match cfg.reduction {
        Reduction::Corpus => loss_from_stats(
            &BleuStats {
                matches: parts[0].unsqueeze(0)?,
                totals: parts[1].unsqueeze(0)?,
                hyp_len: parts[2].clone(),
                ref_len: parts[3].clone(),
            },
            cfg,
        )?,
        Reduction::SentenceMean => parts[0].div(&parts[1])?.squeeze(0)?,
    };
    loss.to_dtype(out_dtype)
}

/// The BLEU loss of the global batch from this worker's statistics, with the gradient of this
/// worker's share.
///
/// * `local` - this worker's [`BleuStats`] (`out.stats` of `bleu_loss_from_logits` on its
///   shard: `[B_w, N]` and `[B_w]`, `B_w >= 1`).
/// * `cfg` - the configuration the statistics were computed with; `reduction` decides:
///   `Corpus` scores the globally summed statistics (one corpus BLEU over every worker's
///   elements), `SentenceMean` averages the sentence losses over the global batch
///   (`Σ_w Σ_b loss_b / Σ_w B_w`).
///
/// Returns a scalar in the statistics' dtype (f32 for f16/bf16), the same on every worker. One
/// all-reduce of `2·N + 2` numbers (corpus) or 2 (`SentenceMean`).
pub fn bleu_loss_from_stats(
    local: &BleuStats,
    cfg: &BleuLossConfig,
    reduce: &(impl AllReduce + ?Sized),
) -> Result<Tensor> {
    let out_dtype = compute_dtype(local.matches.dtype());
    let parts = global_sums(&bleu_parts(local, cfg)?, reduce)?;
    bleu_from_parts(&parts, cfg, out_dtype)
}

/// Targets with at least one non-pad position, and the number of non-pad positions of the
/// original (a constant scalar in `dtype`); tensor ops only, no copy to the host.
///
/// When every target is `pad_id`, every position is replaced by a non-pad id (0, or 1 when
/// `pad_id` is 0), so that the mean cross-entropy is defined; its weight, the count, is 0.
fn count_and_fillable_targets(
    targets: &Tensor,
    vocab: usize,
    cfg: &CrossEntropyConfig,
    dtype: DType,
) -> Result<(Tensor, Tensor)> {
    if targets.dtype() != DType::U32 || targets.rank() != 2 {
        bail!(
            "`targets` must be u32 [B, S], got {:?} with shape {:?}",
            targets.dtype(),
            targets.dims()
        );
    }
    let device = targets.device();
    match cfg.pad_id {
        None => {
            let count = Tensor::full(targets.elem_count() as f64, (), device)?.to_dtype(dtype)?;
            Ok((targets.clone(), count))
        }
        Some(pad) => {
            let filler = u32::from(pad == 0);
            if filler as usize >= vocab {
                bail!(
                    "`pad_id` {pad} is the only id of the vocabulary (V = {vocab}): no target can count"
                );
            }
            let count = targets.ne(pad)?.to_dtype(DType::U32)?.sum_all()?;
            let all_padding = count.eq(0u32)?.broadcast_as(targets.shape())?;
            let filled = Tensor::full(filler, targets.shape(), device)?;
            let targets = all_padding.where_cond(&filled, targets)?;
            Ok((targets, count.to_dtype(dtype)?))
        }
    }
}

/// The vocabulary size of `[B, S, V]` logits, or the error the loss functions give.
fn vocab_of(logits: &Tensor) -> Result<usize> {
    match logits.dims() {
        &[_, _, v] => Ok(v),
        dims => bail!("`logits` must be [B, S, V], got shape {dims:?}"),
    }
}

/// This worker's cross-entropy **sum** over its non-pad target positions and their count —
/// what the global mean is made of — defined on a shard of only padding (sum 0 with a zero
/// gradient, count 0), where [`crate::loss::cross_entropy_from_logits`] (a mean) errors.
///
/// * `logits` - float `[B, S, V]`; `targets` u32 `[B, S]`; `cfg` as
///   [`crate::loss::cross_entropy_from_logits`].
///
/// Returns `(sum, count)`: scalars, `sum` in the compute dtype of the logits (f32 for
/// f16/bf16) with the gradient of the sum, `count` in f64 (f32 on Metal), a constant. The
/// count comes from tensor ops: no copy to the host. On a shard of only padding the targets
/// are replaced by a non-pad id before the fused kernel runs (so the kernel's work is done and
/// multiplied by 0).
pub fn cross_entropy_sum_and_count(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<(Tensor, Tensor)> {
    let vocab = vocab_of(logits)?;
    let count_dtype = reduce_dtype(logits.device());
    let (targets, count) = count_and_fillable_targets(targets, vocab, cfg, count_dtype)?;
    let mean = super::cross_entropy::cross_entropy_from_logits(logits, &targets, cfg)?;
    let sum = mean.mul(&count.to_dtype(mean.dtype())?)?;
    Ok((sum, count))
}

/// Errors unless the global count of non-pad targets is positive: one read of one number,
/// counted by [`super::host_copies`] (a device-to-host copy off the CPU). Every worker holds
/// the same count, so every worker errors alike.
fn check_global_count(count: &Tensor) -> Result<()> {
    let value = super::host::to_scalar::<f32>(&count.to_dtype(DType::F32)?.sum_all()?)?;
    if value <= 0.0 {
        bail!(
            "every `targets` position of every worker is `pad_id`: the mean cross-entropy over no positions is undefined"
        );
    }
    Ok(())
}

/// The mean cross-entropy of the global batch from this worker's shard:
/// `Σ_w (shard w's token losses) / Σ_w (shard w's non-pad targets)`, with the gradient of this
/// worker's share. A shard may hold only padding, as long as the global batch does not.
///
/// Arguments as [`crate::loss::cross_entropy_from_logits`] (`logits` `[B_w, S, V]`, `targets`
/// u32 `[B_w, S]`). Returns a scalar in the logits' compute dtype, the same on every worker.
/// One all-reduce of 2 numbers and one read of the global count to the host (one number,
/// counted by [`crate::loss::host_copies`]). Errors as that function does on this
/// worker's input, except on all padding, and on every worker when no worker has a non-pad
/// target.
pub fn cross_entropy_from_logits(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    reduce: &(impl AllReduce + ?Sized),
) -> Result<Tensor> {
    let (sum, count) = cross_entropy_sum_and_count(logits, targets, cfg)?;
    let out_dtype = sum.dtype();
    let g = global_sums(&[sum.reshape(1)?, count.reshape(1)?], reduce)?;
    check_global_count(&g[1])?;
    g[0].div(&g[1])?.squeeze(0)?.to_dtype(out_dtype)
}

/// The training step's loss of the **global** batch, `cross_entropy + cfg.bleu_weight · bleu`,
/// from this worker's shard: [`crate::loss::ce_bleu_from_logits`] for data-parallel workers.
///
/// Each part is the single-process value on the concatenation of every worker's shard (to
/// round-off): the cross-entropy is the mean over the global batch's non-pad targets (a shard
/// may hold only padding), the BLEU loss scores the globally summed statistics (`Corpus`) or
/// averages over the global batch's sentences (`SentenceMean`). The gradient is that of this
/// worker's share: after [`sum_gradients`], the parameters' gradients equal the single-process
/// ones.
///
/// # Arguments
/// * `logits` - float `[B_w, S, V]`, this worker's shard (`B_w >= 1`; the shards may differ in
///   size).
/// * `targets`, `cfg` - as [`crate::loss::ce_bleu_from_logits`], for the shard (`targets.refs`
///   holds the shard's `B_w` elements, `targets.tokens` is u32 `[B_w, S]`).
/// * `reduce` - the group's [`AllReduce`].
///
/// Returns a [`TrainingLoss`]: `loss` and `cross_entropy` of the global batch (scalars in the
/// logits' compute dtype, equal on every worker); `bleu.loss` the global BLEU loss, and
/// `bleu.stats` **this worker's** per-element statistics (`[B_w, N]`, `[B_w]`).
///
/// Cost over the single-process call: one all-reduce of `2·N + 4` numbers (`Corpus`) or 4
/// (`SentenceMean`), one read of the global token count to the host (one number, counted by
/// [`crate::loss::host_copies`]), and on a shard of only padding nothing more (its cross-entropy is
/// computed on filler targets and weighted by 0). Errors as the single-process function on
/// this worker's input (before the all-reduce: see the module docs on errors), and on every
/// worker when no worker has a non-pad target.
pub fn ce_bleu_from_logits(
    logits: &Tensor,
    targets: &TrainingTargets,
    cfg: &TrainingLossConfig,
    reduce: &(impl AllReduce + ?Sized),
) -> Result<TrainingLoss> {
    let vocab = vocab_of(logits)?;
    let count_dtype = reduce_dtype(logits.device());
    let (filled, count) = count_and_fillable_targets(targets.tokens, vocab, &cfg.ce, count_dtype)?;
    let shard = TrainingTargets {
        tokens: &filled,
        ..*targets
    };
    let local = super::training::ce_bleu_from_logits(logits, &shard, cfg)?;
    let out_dtype = local.cross_entropy.dtype();
    let ce_sum = local.cross_entropy.to_dtype(count_dtype)?.mul(&count)?;
    let mut parts = vec![ce_sum.reshape(1)?, count.reshape(1)?];
    parts.extend(bleu_parts(&local.bleu.stats, &cfg.bleu)?);
    let g = global_sums(&parts, reduce)?;
    check_global_count(&g[1])?;
    let cross_entropy = g[0].div(&g[1])?.squeeze(0)?.to_dtype(out_dtype)?;
    let bleu = bleu_from_parts(&g[2..], &cfg.bleu, out_dtype)?;
    let loss = (&cross_entropy + bleu.affine(cfg.bleu_weight, 0.0)?)?;
    Ok(TrainingLoss {
        loss,
        cross_entropy,
        bleu: BleuLossOutput {
            loss: bleu,
            stats: local.bleu.stats,
        },
    })
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

/// Replaces the gradient of every variable in `vars` by its sum over all workers, in one
/// all-reduce per dtype (the gradients flattened into one buffer).
///
/// A variable with no gradient on this worker contributes zeros (and receives the sum, so that
/// every worker applies the same update). Every worker must pass the same variables in the same
/// order: [`vars_by_name`] gives that order for a `VarMap` (`VarMap::all_vars` does not: it
/// lists a `HashMap`, whose order differs between processes). After this,
/// `optimizer.step(grads)` applies the gradient of the global batch's loss.
pub fn sum_gradients(
    grads: &mut GradStore,
    vars: &[Var],
    reduce: &(impl AllReduce + ?Sized),
) -> Result<()> {
    for group in by_dtype(vars) {
        let flat: Vec<Tensor> = group
            .iter()
            .map(|var| match grads.get(var.as_tensor()) {
                Some(g) => g.detach().flatten_all(),
                None => var.as_tensor().zeros_like()?.flatten_all(),
            })
            .collect::<Result<_>>()?;
        let total = reduce.sum(&Tensor::cat(&flat, 0)?)?;
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

/// The variables of `varmap` sorted by name: the same order in every process, as
/// [`sum_gradients`] and [`broadcast_parameters`] need (`VarMap::all_vars` lists a `HashMap`,
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

/// Sets every variable to worker 0's value, so that all workers start from the same
/// parameters (random initialisation differs between processes): one sum all-reduce per
/// dtype in which the other workers contribute zeros (exact: `x + 0 = x`).
///
/// Every worker must pass the same variables in the same order ([`vars_by_name`]).
pub fn broadcast_parameters(vars: &[Var], reduce: &(impl AllReduce + ?Sized)) -> Result<()> {
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
