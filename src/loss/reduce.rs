//! The reduction stage of every loss, between the statistics and the score. What a batch sums —
//! the cross-entropy's row terms and its count of non-pad targets, the BLEU statistics of its
//! elements — is summed over this process ([`Reducer::Local`]) or over every worker of a
//! data-parallel group ([`Reducer::Group`], one all-reduce); then the rule that some target
//! counts is checked on the sum; then the score.
//!
//! A global quantity `G = Σ_w g_w` is computed on worker `w` as
//! `allreduce_sum(g_w) + (g_w − g_w.detach())` ([`global_sum`]): its value is `G`, the same bits
//! on every worker, and its gradient is that of `g_w` alone. So every worker gets the loss of the
//! global batch and the gradient of its own share, and the sum of the workers' parameter
//! gradients is the single-process gradient of the global batch (docs/distributed.md).
//!
//! | quantity | `Local` | `Group` |
//! |---|---|---|
//! | cross-entropy | each non-pad row's term divided by this batch's count `n` (`1/n` in the kernels; with class weights `Σ w_t`, the z-term's part still by `n`), summed: the mean | the row terms summed (weight 1), all-reduced with the count (and `Σ w_t` with class weights), divided by the global count (`Σ w_t`); class weights with a z-loss are refused |
//! | corpus BLEU | the elements' statistics summed ([`score_rows`]), scored | the same sums over the shard, checked (`checked::stats::shard_stats`), all-reduced, scored |
//! | `SentenceMean` BLEU | each element's statistics scored, the mean of their losses | the shard's sum of sentence losses and its size, all-reduced, divided |
//!
//! The stage hands finished sums down to `score` (`score::neg_log_bleu`), once per loss; the
//! score sums nothing and never calls back. For `SentenceMean` in a group what is summed is the
//! sentences' losses, so they are scored before the all-reduce and only divided after it.
//! `Local` is the single-process loss, bit for bit what it was before the stage existed.

use super::all_reduce::AllReduce;
use super::checked::stats::shard_stats;
use super::checked::targets::{CheckedTargets, Division, TargetCount};
use super::config::{
    compute_dtype, constant, sum_dtype, BleuLossConfig, BleuLossOutput, BleuStats,
    CrossEntropyOutput, CrossEntropyReduction, Reduction, TrainingLoss,
};
use super::dispatch::Path;
use super::host;
use super::pipeline::{TokenLosses, TokenMetrics};
use super::score::{neg_log_bleu, neg_log_bleu_packed, packed_rows};
use candle_core::{bail, DType, Result, Tensor};

/// Where a loss's sums are taken.
#[derive(Clone, Copy)]
pub(crate) enum Reducer<'a> {
    /// Over this process's batch: the single-process loss.
    Local,
    /// Over every worker of a data-parallel group, each holding a shard of the global batch.
    Group(&'a dyn AllReduce),
}

impl Reducer<'_> {
    /// The targets with the mean of their row terms set ([`Division`]): over the batch's count
    /// `n` (or `Σ w_t` with class weights) for a local mean, whose `n` must be `>= 1` (the rule
    /// that some target counts), or none for a shard's sum,
    /// which may hold only padding (the rule is checked on the global count).
    pub(crate) fn divide<'t>(self, targets: CheckedTargets<'t>) -> Result<CheckedTargets<'t>> {
        match (self, targets.reduction) {
            (Reducer::Group(_), CrossEntropyReduction::None) => bail!(
                "`reduction` None with data-parallel training: each worker's per-position losses are its own shard's, with no global meaning; reduce with Mean or Sum over the group, or call the single-process entry point"
            ),
            (Reducer::Group(_), CrossEntropyReduction::Mean)
                if targets.terms.class_weights.is_some() && targets.terms.z_loss != 0.0 =>
            {
                bail!(
                    "`class_weights` with `z_loss` in data-parallel training: the weighted mean divides by the global Σ w_t and the z-term by the global count, which a shard cannot weigh its rows by before the all-reduce; use one of them, or `Sum`"
                )
            }
            // A sum, or each position's loss: no division, and no target needs to count.
            (_, CrossEntropyReduction::Sum | CrossEntropyReduction::None) => Ok(CheckedTargets {
                division: Division::None,
                ..targets
            }),
            (Reducer::Local, CrossEntropyReduction::Mean)
                if matches!(targets.count, TargetCount::Device { .. }) =>
            {
                // Unread: the count divides on the device (a batch of only padding gives NaN).
                Ok(CheckedTargets {
                    division: Division::MeanOnDevice,
                    ..targets
                })
            }
            (Reducer::Local, CrossEntropyReduction::Mean) => {
                let (count, weight_sum) = match targets.count {
                    TargetCount::Host { count, weight_sum } => (count, weight_sum),
                    TargetCount::Device { .. } => bail!("internal: a device count in a host mean"),
                };
                if count == 0 {
                    bail!(
                        "every one of the {} `targets` is `pad_id` ({:?}): the mean cross-entropy over no positions is undefined",
                        targets.targets.elem_count(),
                        targets.terms.pad_id,
                    );
                }
                if targets.terms.class_weights.is_some() && weight_sum <= 0.0 {
                    bail!(
                        "the `class_weights` of the {count} non-pad `targets` sum to {weight_sum}: the weighted mean over them is undefined",
                    );
                }
                let division = if targets.terms.class_weights.is_some() {
                    Division::WeightedMean
                } else {
                    Division::Mean
                };
                Ok(CheckedTargets {
                    division,
                    ..targets
                })
            }
            (Reducer::Group(_), CrossEntropyReduction::Mean) => Ok(CheckedTargets {
                division: Division::None,
                ..targets
            }),
        }
    }

    /// The cross-entropy from the pass's token terms (divided as [`Self::divide`] set), as
    /// `targets.reduction` says: locally the mean or the sum as it is, or each position's loss;
    /// in a group the global sum, over the global count for the mean. The metrics the terms
    /// ask for (the z-loss's part, the token accuracy) are reduced alike, in the same
    /// all-reduce.
    pub(crate) fn cross_entropy(
        self,
        losses: TokenLosses,
        targets: &CheckedTargets,
    ) -> Result<CrossEntropyOutput> {
        if targets.reduction == CrossEntropyReduction::None {
            // Single-process only: `divide` refuses `None` in a group.
            let metrics = losses.metrics.as_ref();
            let z_loss = match metrics {
                Some(m) if targets.terms.z_loss != 0.0 => Some(per_position(&m.z)?),
                _ => None,
            };
            return Ok(CrossEntropyOutput {
                loss: poisoned(&per_position(&losses.terms)?, targets)?,
                z_loss,
                token_accuracy: local_accuracy(metrics, targets)?,
            });
        }
        let share = token_sum(&losses, targets)?;
        match self {
            Reducer::Local => {
                let (z_loss, token_accuracy) = losses
                    .metrics
                    .as_ref()
                    .map(|m| local_metrics(m, targets))
                    .transpose()?
                    .unwrap_or_default();
                Ok(CrossEntropyOutput {
                    loss: share,
                    z_loss,
                    token_accuracy,
                })
            }
            Reducer::Group(reduce) => {
                let out_dtype = share.dtype();
                let mut parts = cross_entropy_parts(&share, targets)?;
                let ce_parts = parts.len();
                parts.extend(metric_parts(losses.metrics.as_ref())?);
                let g = global_sums(&parts, reduce)?;
                let loss = group_cross_entropy(&g[..ce_parts], targets, out_dtype)?;
                let (z_loss, token_accuracy) =
                    group_metrics(&g[ce_parts..], &g[1], targets, out_dtype)?;
                Ok(CrossEntropyOutput {
                    loss,
                    z_loss,
                    token_accuracy,
                })
            }
        }
    }

    /// The BLEU loss from the elements' statistics `stats` (returned with it: this process's or
    /// this worker's own, `[B, N]` and `[B]`), scored on `path` (`Path::runs_score_kernel`).
    pub(crate) fn bleu(
        self,
        stats: BleuStats,
        cfg: &BleuLossConfig,
        path: Path,
    ) -> Result<BleuLossOutput> {
        let loss = self.bleu_loss(&stats, cfg, path)?;
        Ok(BleuLossOutput { loss, stats })
    }

    /// The BLEU loss of `stats` (`[B, N]` and `[B]`, float): locally the score of their rows
    /// ([`score_rows`]); in a group the score of the global batch, from one all-reduce of
    /// `2·N + 2` numbers (`Corpus`) or 2 (`SentenceMean`). A scalar in the statistics' compute
    /// dtype (f32 for f16/bf16). The score runs as one op where `path` has its kernel
    /// (`Path::runs_score_kernel`), else as composed ops.
    pub(crate) fn bleu_loss(
        self,
        stats: &BleuStats,
        cfg: &BleuLossConfig,
        path: Path,
    ) -> Result<Tensor> {
        let out_dtype = compute_dtype(stats.matches.dtype())?;
        let on_kernel = path.runs_score_kernel(stats.matches.device(), cfg.max_order);
        match self {
            Reducer::Local if on_kernel => {
                // Packed first, then cast and summed once (not field by field): each op here is
                // a launch on CUDA, each way.
                let packed = packed_rows(stats)?.to_dtype(sum_dtype(stats.matches.device()))?;
                let rows = match cfg.reduction {
                    Reduction::Corpus => packed.sum_keepdim(0)?,
                    Reduction::SentenceMean => packed,
                };
                neg_log_bleu_packed(&rows, cfg, out_dtype)?.to_dtype(out_dtype)
            }
            Reducer::Local => {
                let rows = score_rows(stats, sum_dtype(stats.matches.device()), cfg.reduction)?;
                neg_log_bleu(&rows, cfg, out_dtype, on_kernel)?.to_dtype(out_dtype)
            }
            Reducer::Group(reduce) => {
                let parts = global_sums(&bleu_parts(stats, cfg, on_kernel)?, reduce)?;
                group_bleu_loss(&parts, cfg, out_dtype, on_kernel)
            }
        }
    }

    /// `cross_entropy + bleu_weight · bleu` from the pass's cross-entropy `share` and the
    /// elements' statistics: in a group, one all-reduce carries both.
    pub(crate) fn training(
        self,
        losses: TokenLosses,
        targets: &CheckedTargets,
        stats: BleuStats,
        cfg: &BleuLossConfig,
        (bleu_weight, path): (f64, Path),
    ) -> Result<TrainingLoss> {
        let share = token_sum(&losses, targets)?;
        let on_kernel = path.runs_score_kernel(stats.matches.device(), cfg.max_order);
        let metrics = losses.metrics.as_ref();
        let (cross_entropy, bleu_loss, (z_loss, token_accuracy)) = match self {
            Reducer::Local => (
                share,
                self.bleu_loss(&stats, cfg, path)?,
                // Without metrics (none asked for) there is nothing to reduce.
                metrics
                    .map(|m| local_metrics(m, targets))
                    .transpose()?
                    .unwrap_or_default(),
            ),
            Reducer::Group(reduce) => {
                let out_dtype = share.dtype();
                let mut parts = cross_entropy_parts(&share, targets)?;
                let ce_parts = parts.len();
                let metric_parts = metric_parts(metrics)?;
                let bleu_start = ce_parts + metric_parts.len();
                parts.extend(metric_parts);
                parts.extend(bleu_parts(&stats, cfg, on_kernel)?);
                let g = global_sums(&parts, reduce)?;
                let cross_entropy = group_cross_entropy(&g[..ce_parts], targets, out_dtype)?;
                let measured = group_metrics(&g[ce_parts..bleu_start], &g[1], targets, out_dtype)?;
                let bleu_loss = group_bleu_loss(&g[bleu_start..], cfg, out_dtype, on_kernel)?;
                (cross_entropy, bleu_loss, measured)
            }
        };
        let loss = (&cross_entropy + bleu_loss.affine(bleu_weight, 0.0)?)?;
        Ok(TrainingLoss {
            loss,
            cross_entropy,
            bleu: BleuLossOutput {
                loss: bleu_loss,
                stats,
            },
            z_loss,
            token_accuracy,
        })
    }
}

/// The cross-entropy's token terms summed, a scalar: divided by `targets`' divisor unless each
/// term is divided already ([`TokenLosses::divided`]), then by the count on the device for
/// [`Division::MeanOnDevice`]; NaN where a target was out of the vocabulary ([`poisoned`]).
pub(crate) fn token_sum(losses: &TokenLosses, targets: &CheckedTargets) -> Result<Tensor> {
    let sum = token_sum_by(losses, targets.divisor())?;
    let sum = match (&targets.count, targets.division) {
        (TargetCount::Device { count, .. }, Division::MeanOnDevice) => {
            sum.div(&count.to_dtype(sum.dtype())?)?
        }
        _ => sum,
    };
    poisoned(&sum, targets)
}

/// The token terms summed, divided by `divisor` unless each term is divided already.
pub(crate) fn token_sum_by(losses: &TokenLosses, divisor: f64) -> Result<Tensor> {
    let sum = losses.terms.sum_all()?;
    if losses.divided {
        Ok(sum)
    } else {
        sum / divisor
    }
}

/// `loss` (a scalar, or `[B, S]` per position) made NaN where a target counted on the device
/// was out of the vocabulary: plus `sqrt(−m)` (0, or NaN where `m = 1`; `[B, S]`, or their
/// maximum for a scalar). Unchanged for targets read on the host, which refused such a target.
fn poisoned(loss: &Tensor, targets: &CheckedTargets) -> Result<Tensor> {
    let TargetCount::Device { out_of_vocab, .. } = &targets.count else {
        return Ok(loss.clone());
    };
    let marks = if loss.rank() == 0 {
        out_of_vocab.max_all()?
    } else {
        out_of_vocab.reshape(loss.shape())?
    };
    loss + marks.neg()?.sqrt()?.to_dtype(loss.dtype())?
}

/// Each position's term, `[B, S]`, from `[B, S, 1]` or `[B, S]` terms (with a divisor of 1:
/// the position's loss).
fn per_position(terms: &Tensor) -> Result<Tensor> {
    let (batch, seq) = (terms.dim(0)?, terms.dim(1)?);
    terms.reshape((batch, seq))
}

/// The sum of `local` over every worker, differentiable in this worker's term:
/// `allreduce_sum(local) + (local − local.detach())`: the value `Σ_w local_w` as the
/// all-reduce returns it (the same bits on every worker), the gradient of `local` alone. Public
/// as [`DataParallel::global_sum`](crate::loss::distributed::DataParallel::global_sum), whose
/// docs show it on two workers.
pub(crate) fn global_sum(local: &Tensor, reduce: &(impl AllReduce + ?Sized)) -> Result<Tensor> {
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

/// One all-reduce for several float tensors: each is flattened into one buffer of the sum
/// dtype, summed with [`global_sum`], and split back into its shape (in the sum dtype).
pub(crate) fn global_sums(
    parts: &[Tensor],
    reduce: &(impl AllReduce + ?Sized),
) -> Result<Vec<Tensor>> {
    let Some(first) = parts.first() else {
        return Ok(Vec::new());
    };
    let dtype = sum_dtype(first.device());
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

/// What the cross-entropy contributes to the all-reduce: the shard's sum of row terms and its
/// count of non-pad targets, and with class weights under `Mean` its `Σ w_t` (the weighted
/// mean's denominator; the metrics keep the count), `[1]` each in the sum dtype.
fn cross_entropy_parts(share: &Tensor, targets: &CheckedTargets) -> Result<Vec<Tensor>> {
    let dtype = sum_dtype(share.device());
    // Made in `dtype` on the host: no f64 tensor on a device without f64 (Metal).
    let count = match &targets.count {
        TargetCount::Host { count, .. } => constant(vec![*count as f64], 1, dtype, share.device())?,
        TargetCount::Device { count, .. } => count.to_dtype(dtype)?.reshape(1)?,
    };
    let mut parts = vec![share.to_dtype(dtype)?.reshape(1)?, count];
    if weighted_mean(targets) {
        let TargetCount::Host { weight_sum, .. } = targets.count else {
            bail!("internal: class weights without their Σ w_t read on the host");
        };
        parts.push(constant(vec![weight_sum], 1, dtype, share.device())?);
    }
    Ok(parts)
}

/// Whether the cross-entropy is a mean weighted by class weights (its denominator `Σ w_t`).
fn weighted_mean(targets: &CheckedTargets) -> bool {
    targets.terms.class_weights.is_some() && targets.reduction == CrossEntropyReduction::Mean
}

/// The z-loss's part and the token accuracy of one process's batch (a mean or a sum, as
/// `targets.division` says), from the pass's metrics `m`; each `None` unless asked for.
fn local_metrics(
    m: &TokenMetrics,
    targets: &CheckedTargets,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    // The z-term's mean divides by the count, also under class weights (as Liger's does).
    let z_loss = if targets.terms.z_loss != 0.0 {
        let sum = m.z.sum_all()?;
        Some(match targets.reduction {
            CrossEntropyReduction::Mean => divided_by_count(&sum, targets)?,
            _ => sum,
        })
    } else {
        None
    };
    Ok((z_loss, local_accuracy(Some(m), targets)?))
}

/// The token accuracy of one process's batch, `Σ correct / n`, when asked for; an error where
/// no position counts (a sum, or each position's loss, of only padding).
fn local_accuracy(
    metrics: Option<&TokenMetrics>,
    targets: &CheckedTargets,
) -> Result<Option<Tensor>> {
    match metrics {
        Some(m) if targets.terms.token_accuracy => {
            if targets.host_count() == Some(0) {
                bail!(
                    "`token_accuracy` over no positions: every one of the {} `targets` is `pad_id` ({:?})",
                    targets.targets.elem_count(),
                    targets.terms.pad_id,
                );
            }
            Ok(Some(divided_by_count(&m.correct.sum_all()?, targets)?))
        }
        _ => Ok(None),
    }
}

/// `sum / n`, with `n` the host count or the device's (NaN over only padding there).
fn divided_by_count(sum: &Tensor, targets: &CheckedTargets) -> Result<Tensor> {
    match &targets.count {
        TargetCount::Host { count, .. } => sum / *count as f64,
        TargetCount::Device { count, .. } => sum.div(&count.to_dtype(sum.dtype())?),
    }
}

/// What the metrics contribute to the all-reduce: the shard's sums of `λ·lse²` and of correct
/// positions (none without metrics).
fn metric_parts(metrics: Option<&TokenMetrics>) -> Result<Vec<Tensor>> {
    let Some(m) = metrics else {
        return Ok(Vec::new());
    };
    let dtype = sum_dtype(m.z.device());
    let sum = |t: &Tensor| t.to_dtype(dtype)?.sum_all()?.reshape(1);
    Ok(vec![sum(&m.z)?, sum(&m.correct)?])
}

/// The group's z-loss part and token accuracy from the globally summed [`metric_parts`]
/// (`parts`, empty without metrics) and the global count, in `out_dtype`. The accuracy divides
/// by the count: under `Mean` the cross-entropy has refused a count of 0 already; under `Sum`
/// it is read here (one copy to the host) and 0 is refused — unless the targets were counted on
/// the device (value checks off), where nothing is read and a count of 0 gives NaN.
fn group_metrics(
    parts: &[Tensor],
    count: &Tensor,
    targets: &CheckedTargets,
    out_dtype: DType,
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let [z, correct] = parts else {
        return Ok((None, None));
    };
    let z_loss = match (targets.terms.z_loss != 0.0, targets.reduction) {
        (false, _) => None,
        (true, CrossEntropyReduction::Sum) => Some(z.squeeze(0)?.to_dtype(out_dtype)?),
        (true, _) => Some(z.div(count)?.squeeze(0)?.to_dtype(out_dtype)?),
    };
    let token_accuracy = if targets.terms.token_accuracy {
        if targets.reduction == CrossEntropyReduction::Sum && targets.host_count().is_some() {
            let value = host::to_scalar::<f32>(&count.to_dtype(DType::F32)?.sum_all()?)?;
            if value <= 0.0 {
                bail!(
                    "`token_accuracy` over no positions: every `targets` position of every worker is `pad_id`"
                );
            }
        }
        Some(correct.div(count)?.squeeze(0)?.to_dtype(out_dtype)?)
    } else {
        None
    };
    Ok((z_loss, token_accuracy))
}

/// The group's cross-entropy from its globally summed [`cross_entropy_parts`] (`[sum, count]`,
/// or `[sum, count, Σ w_t]` for a weighted mean), in `out_dtype`: the sum itself for `Sum`,
/// else [`global_mean`] over the count or `Σ w_t`.
fn group_cross_entropy(
    parts: &[Tensor],
    targets: &CheckedTargets,
    out_dtype: DType,
) -> Result<Tensor> {
    match (targets.reduction, parts) {
        (CrossEntropyReduction::Sum, [sum, ..]) => sum.squeeze(0)?.to_dtype(out_dtype),
        (_, [sum, _, weight_sum]) => global_mean(sum, weight_sum, out_dtype),
        // Counted on the device: no read to refuse a global count of 0 (NaN then).
        (_, [sum, count]) if targets.host_count().is_none() => {
            sum.div(count)?.squeeze(0)?.to_dtype(out_dtype)
        }
        (_, [sum, count]) => global_mean(sum, count, out_dtype),
        _ => bail!("internal: {} cross-entropy parts", parts.len()),
    }
}

/// `sum / count` of the globally summed cross-entropy, in `out_dtype`, after the rule that some
/// target counts: one read of the global count to the host (counted by
/// [`super::host_copies`]); every worker holds the same count, so every worker errors alike.
fn global_mean(sum: &Tensor, count: &Tensor, out_dtype: DType) -> Result<Tensor> {
    let value = host::to_scalar::<f32>(&count.to_dtype(DType::F32)?.sum_all()?)?;
    if value <= 0.0 {
        bail!(
            "every `targets` position of every worker is `pad_id` (or, with class weights, their weights sum to 0): the mean cross-entropy over no positions is undefined"
        );
    }
    sum.div(count)?.squeeze(0)?.to_dtype(out_dtype)
}

/// The rows the score takes from one process's statistics (`[B, N]` and `[B]`), in `dtype`
/// (`sum_dtype`: summed there, not in the caller's dtype): the statistics summed over its
/// elements for `Corpus` (`matches`, `totals` `[1, N]`, `hyp_len`, `ref_len` `[1]`), each
/// element's own for `SentenceMean`.
pub(crate) fn score_rows(
    stats: &BleuStats,
    dtype: DType,
    reduction: Reduction,
) -> Result<BleuStats> {
    let rows = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(dtype)?;
        match reduction {
            Reduction::Corpus => t.sum_keepdim(0),
            Reduction::SentenceMean => Ok(t),
        }
    };
    Ok(BleuStats {
        matches: rows(&stats.matches)?,
        totals: rows(&stats.totals)?,
        hyp_len: rows(&stats.hyp_len)?,
        ref_len: rows(&stats.ref_len)?,
    })
}

/// What the BLEU loss contributes to the all-reduce, in the sum dtype, after the worker's own
/// statistics are checked (a negative one could hide in the global sums): the corpus sums
/// `[matches, totals, hyp_len, ref_len]` (`Corpus`, [`score_rows`]), or the sum of the shard's
/// sentence losses and its size, `[1]` each (`SentenceMean`: what is summed is the losses, so
/// they are scored here, before the all-reduce).
/// `on_kernel`: whether the score runs as one op.
fn bleu_parts(local: &BleuStats, cfg: &BleuLossConfig, on_kernel: bool) -> Result<Vec<Tensor>> {
    shard_stats(local, cfg)?;
    let dtype = sum_dtype(local.matches.device());
    let rows = score_rows(local, dtype, cfg.reduction)?;
    match cfg.reduction {
        Reduction::Corpus => Ok(vec![rows.matches, rows.totals, rows.hyp_len, rows.ref_len]),
        Reduction::SentenceMean => {
            let batch = rows.matches.dim(0)?;
            let mean = neg_log_bleu(&rows, cfg, dtype, on_kernel)?;
            let count = constant(vec![batch as f64], 1, dtype, rows.matches.device())?;
            Ok(vec![mean.affine(batch as f64, 0.0)?.reshape(1)?, count])
        }
    }
}

/// The group's BLEU loss from the globally summed [`bleu_parts`], in `out_dtype`: the score of
/// the global corpus sums (statistics of the sum dtype, scored with its guards), or the global
/// sum of sentence losses over the global count of sentences.
fn group_bleu_loss(
    parts: &[Tensor],
    cfg: &BleuLossConfig,
    out_dtype: DType,
    on_kernel: bool,
) -> Result<Tensor> {
    let loss = match (cfg.reduction, parts) {
        (Reduction::Corpus, [matches, totals, hyp_len, ref_len]) => {
            let sums = BleuStats {
                matches: matches.clone(),
                totals: totals.clone(),
                hyp_len: hyp_len.clone(),
                ref_len: ref_len.clone(),
            };
            neg_log_bleu(&sums, cfg, sums.matches.dtype(), on_kernel)?
        }
        (Reduction::SentenceMean, [sum, count]) => sum.div(count)?.squeeze(0)?,
        _ => bail!("internal: {} BLEU parts", parts.len()),
    };
    loss.to_dtype(out_dtype)
}

/// The corpus statistics of the group's global batch from this worker's (`[B_w, N]`, `[B_w]`,
/// shapes checked by the caller): `matches`, `totals` `[1, N]` and `hyp_len`, `ref_len` `[1]`,
/// each summed over every worker's elements in the sum dtype ([`global_sums`], one all-reduce of
/// `2·N + 2` numbers), differentiable in this worker's share.
pub(crate) fn global_corpus_sums(
    local: &BleuStats,
    reduce: &(impl AllReduce + ?Sized),
) -> Result<BleuStats> {
    let rows = score_rows(local, sum_dtype(local.matches.device()), Reduction::Corpus)?;
    let parts = [rows.matches, rows.totals, rows.hyp_len, rows.ref_len];
    let [matches, totals, hyp_len, ref_len]: [Tensor; 4] = global_sums(&parts, reduce)?
        .try_into()
        .map_err(|_| candle_core::Error::Msg("internal: four sums".into()))?;
    Ok(BleuStats {
        matches,
        totals,
        hyp_len,
        ref_len,
    })
}
