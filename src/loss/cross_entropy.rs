//! Token-level cross-entropy from logits, fused: PyTorch's
//! `F.cross_entropy(logits, targets, ignore_index = pad, label_smoothing = ε)` in one read of the
//! logits forward and one write of their gradient backward.
//!
//! The CPU kernel below also serves [`ce_bleu_from_logits`](super::ce_bleu_from_logits): the
//! same row pass can gather the softmax at the reference ids, so that one custom op carries both
//! the cross-entropy terms and the BLEU token matches, and its backward receives both gradients
//! in one call.

use super::fused::{
    contiguous_slice, dispatch_float, non_finite_error, row_exp_sum, row_max_checked,
    vocab_sized_buffer, KernelFloat, LANES,
};
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp2, DType, Layout, Result, Shape, Storage,
    Tensor, WithDType, D,
};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// Configuration of [`cross_entropy_from_logits`]. Default: no padding, no label smoothing.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CrossEntropyConfig {
    /// Target id of padding positions: they add nothing to the loss, its gradient or the count
    /// the mean divides by (PyTorch's `ignore_index`). It may lie outside the vocabulary.
    pub pad_id: Option<u32>,
    /// Label smoothing `ε ∈ [0, 1)`: the target distribution is `(1 − ε)·onehot + ε/V`
    /// (PyTorch's `label_smoothing`).
    pub label_smoothing: f64,
}

/// Columns each row of the kernel output carries after the gathered probabilities: the row's
/// (scaled) cross-entropy term, then what the backward needs — the row's maximum logit, its sum
/// of `exp(logit − max)`, and the row's weight `1/n` (0 at padding).
pub(crate) const CE_COLUMNS: usize = 4;

/// The float operations of the kernels here: those of the BLEU kernels plus conversions.
pub(crate) trait CeFloat: KernelFloat + WithDType {}
impl CeFloat for f32 {}
impl CeFloat for f64 {}

/// What the row pass needs to know about the targets.
#[derive(Clone, Copy)]
pub(crate) struct TargetRows<'a> {
    /// `[rows]` target ids; `None` when the pass computes no cross-entropy (every weight 0).
    pub targets: Option<&'a [u32]>,
    pub pad_id: Option<u32>,
    pub label_smoothing: f64,
    /// `1 / (number of non-pad rows)`.
    pub inv_count: f64,
}

impl<'a> TargetRows<'a> {
    /// Validates the targets against the vocabulary and counts the non-pad rows.
    pub(crate) fn new(
        targets: &'a [u32],
        vocab: usize,
        seq: usize,
        cfg: &CrossEntropyConfig,
    ) -> Result<Self> {
        let mut count = 0usize;
        for (row, &target) in targets.iter().enumerate() {
            if Some(target) == cfg.pad_id {
                continue;
            }
            if target as usize >= vocab {
                bail!(
                    "`targets[{}, {}]` = {target} is out of the vocabulary (V = {vocab}) and is not `pad_id` ({:?})",
                    row / seq.max(1),
                    row % seq.max(1),
                    cfg.pad_id
                );
            }
            count += 1;
        }
        if count == 0 {
            bail!(
                "every one of the {} `targets` is `pad_id` ({:?}): the mean cross-entropy over no positions is undefined",
                targets.len(),
                cfg.pad_id
            );
        }
        Ok(Self {
            targets: Some(targets),
            pad_id: cfg.pad_id,
            label_smoothing: cfg.label_smoothing,
            inv_count: 1.0 / count as f64,
        })
    }

    /// No cross-entropy: the row pass only gathers (the BLEU loss alone).
    pub(crate) fn none() -> Self {
        Self {
            targets: None,
            pad_id: None,
            label_smoothing: 0.0,
            inv_count: 0.0,
        }
    }

    /// The target of `row`, unless it is padding (or there are no targets).
    pub(crate) fn target(&self, row: usize) -> Option<u32> {
        let target = self.targets?[row];
        (Some(target) != self.pad_id).then_some(target)
    }

    pub(crate) fn weight(&self, row: usize) -> f64 {
        match self.target(row) {
            Some(_) => self.inv_count,
            None => 0.0,
        }
    }
}

/// `Σ_v row[v]`, in lanes so that the loop vectorises.
#[inline]
fn row_sum<T: KernelFloat>(row: &[T]) -> T {
    let mut lanes = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            lanes[lane] += chunk[lane];
        }
    }
    let mut sum = T::ZERO;
    for lane in lanes {
        sum += lane;
    }
    for &x in rest {
        sum += x;
    }
    sum
}

/// The row's maximum, `Σ_v exp(row[v] − max)` and (when `with_logit_sum`) `Σ_v row[v]`, in
/// one read of the row from memory: each L1-sized block is scanned for its maximum, then summed,
/// rescaling the running sum when the maximum grows (online softmax). Also whether every entry
/// is finite.
#[inline]
pub(crate) fn row_softmax_stats<T: KernelFloat>(
    row: &[T],
    with_logit_sum: bool,
) -> (T, T, T, bool) {
    const BLOCK: usize = 2048;
    let mut max = T::NEG_INFINITY;
    let mut sum = T::ZERO;
    let mut logit_sum = T::ZERO;
    let mut finite = true;
    for block in row.chunks(BLOCK) {
        let (block_max, block_finite) = row_max_checked(block);
        finite &= block_finite;
        if block_max > max {
            sum = sum * T::exp_nonpositive(max - block_max);
            max = block_max;
        }
        sum += row_exp_sum(block, max);
        if with_logit_sum {
            logit_sum += row_sum(block);
        }
    }
    (max, sum, logit_sum, finite)
}

/// The row's cross-entropy term `w·(lse − (1 − ε)·x_t − ε·mean_v x_v)` from its statistics.
#[inline]
pub(crate) fn row_cross_entropy<T: CeFloat>(
    row: &[T],
    rows: &TargetRows,
    row_index: usize,
    stats: (T, T, T),
) -> T {
    let weight = rows.weight(row_index);
    if weight == 0.0 {
        return T::ZERO;
    }
    let (max, sum, logit_sum) = stats;
    let Some(target) = rows.target(row_index) else {
        return T::ZERO;
    };
    let eps = rows.label_smoothing;
    let lse = max.to_f64() + sum.to_f64().ln();
    let target_logit = row[target as usize].to_f64();
    let mean_logit = logit_sum.to_f64() / row.len() as f64;
    T::from_f64(weight * (lse - (1.0 - eps) * target_logit - eps * mean_logit))
}

/// The columns a row pass gathers: `softmax(logits[r])[ids[r / rows_per_batch, k]]`, `k < width`.
#[derive(Clone, Copy)]
pub(crate) struct Gathered<'a> {
    /// u32 `[B, width]`.
    pub ids: &'a [u32],
    pub width: usize,
    /// `S`: the rows of one batch element.
    pub rows_per_batch: usize,
}

impl Gathered<'_> {
    /// No gathered columns (cross-entropy alone).
    pub(crate) fn none(rows_per_batch: usize) -> Self {
        Gathered {
            ids: &[],
            width: 0,
            rows_per_batch,
        }
    }

    pub(crate) fn row_ids(&self, row: usize) -> &[u32] {
        &self.ids[(row / self.rows_per_batch) * self.width..][..self.width]
    }
}

/// Row layout of the forward output: `[x_0 … x_{K−1} | ce | max | sum | weight]`.
///
/// `x_k = softmax(logits[r])[ids[r / rows_per_batch, k]]` (none when `width` = 0).
pub(crate) fn forward_rows<T: CeFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
) -> Result<Vec<T>> {
    let mut out = vec![T::ZERO; logits.len() / vocab * (gathered.width + CE_COLUMNS)];
    forward_rows_into(logits, vocab, gathered, rows, 0, &mut out)?;
    Ok(out)
}

/// [`forward_rows`] of the rows `first_row..` of the batch, whose logits are `logits`, into
/// `out` (one output row per logits row).
pub(crate) fn forward_rows_into<T: CeFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &mut [T],
) -> Result<()> {
    let width = gathered.width;
    let stride = width + CE_COLUMNS;
    let all_finite = AtomicBool::new(true);
    let with_logit_sum = rows.label_smoothing != 0.0;
    out.par_chunks_mut(stride)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (out_row, row))| {
            let row_index = first_row + local;
            let (max, sum, logit_sum, finite) = row_softmax_stats(row, with_logit_sum);
            if !finite {
                all_finite.store(false, Ordering::Relaxed);
                return;
            }
            let inv_sum = T::ONE / sum;
            let row_ids = gathered.row_ids(row_index);
            for (o, &id) in out_row[..width].iter_mut().zip(row_ids) {
                *o = T::exp_nonpositive(row[id as usize] - max) * inv_sum;
            }
            out_row[width] = row_cross_entropy(row, rows, row_index, (max, sum, logit_sum));
            out_row[width + 1] = max;
            out_row[width + 2] = sum;
            out_row[width + 3] = T::from_f64(rows.weight(row_index));
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    Ok(())
}

/// The coefficients of one row's logits gradient (see [`backward_rows`]): `(scale, offset,
/// ce_grad)` with `scale = (h·w − Σ_k g_k x_k) / sum`, `offset = −h·w·ε/V` and `ce_grad = h·w`,
/// from the row's forward output `stats` and its incoming gradient `grads` (same layout).
#[inline]
pub(crate) fn row_gradient_coefficients<T: CeFloat>(
    stats: &[T],
    grads: &[T],
    width: usize,
    label_smoothing: f64,
    vocab: usize,
) -> (T, T, T) {
    let (sum, weight) = (stats[width + 2], stats[width + 3]);
    let ce_grad = grads[width] * weight;
    let mut weighted = T::ZERO;
    for k in 0..width {
        weighted += grads[k] * stats[k];
    }
    let scale = (ce_grad - weighted) / sum;
    let offset = T::ZERO - ce_grad * T::from_f64(label_smoothing / vocab as f64);
    (scale, offset, ce_grad)
}

/// The logits gradient of [`forward_rows`]'s output, in one pass over each row:
///
/// `dlogits[v] = p_v·(h·w − Σ_k g_k x_k) − h·w·ε/V − h·w·(1 − ε)·[v = t] + Σ_k g_k x_k·[v = id_k]`
///
/// with `h` the gradient of the row's cross-entropy term, `w` its weight and `g_k` the
/// gradients of the gathered probabilities (the softmax Jacobian applied to both at once).
pub(crate) fn backward_rows<T: CeFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    out: &[T],
    grad_out: &[T],
) -> Vec<T> {
    let mut grad = vocab_sized_buffer::<T>(logits.len());
    backward_rows_into(
        logits, vocab, gathered, rows, 0, out, grad_out, &mut grad, true,
    );
    grad
}

/// [`backward_rows`] of the rows `first_row..` (their logits, forward outputs and incoming
/// gradients) into `grad`; `zeroed` says whether `grad` holds zeros already (then rows
/// without a dense part leave their zeros, and their pages, untouched).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_rows_into<T: CeFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &[T],
    grad_out: &[T],
    grad: &mut [T],
    zeroed: bool,
) {
    let width = gathered.width;
    let stride = width + CE_COLUMNS;
    let eps = rows.label_smoothing;
    grad.par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (grad_row, row))| {
            let row_index = first_row + local;
            let stats = &out[local * stride..][..stride];
            let grads = &grad_out[local * stride..][..stride];
            let max = stats[width + 1];
            let (scale, offset, ce_grad) =
                row_gradient_coefficients(stats, grads, width, eps, vocab);
            let row_ids = gathered.row_ids(row_index);
            if scale == T::ZERO && offset == T::ZERO {
                // No dense part (padding without BLEU gradient, or a cross-entropy gradient
                // that the gathered ones cancel): zeros, and the sparse terms, which need not
                // vanish one by one.
                if !zeroed {
                    grad_row.fill(T::ZERO);
                }
                if let (Some(target), true) = (rows.target(row_index), ce_grad != T::ZERO) {
                    grad_row[target as usize] += T::ZERO - ce_grad * T::from_f64(1.0 - eps);
                }
                for k in 0..width {
                    let term = grads[k] * stats[k];
                    if term != T::ZERO {
                        grad_row[row_ids[k] as usize] += term;
                    }
                }
                return;
            }
            let mut grad_chunks = grad_row.chunks_exact_mut(LANES);
            let mut row_chunks = row.chunks_exact(LANES);
            for (g, chunk) in (&mut grad_chunks).zip(&mut row_chunks) {
                for lane in 0..LANES {
                    g[lane] = scale * T::exp_nonpositive(chunk[lane] - max) + offset;
                }
            }
            for (g, &x) in grad_chunks
                .into_remainder()
                .iter_mut()
                .zip(row_chunks.remainder())
            {
                *g = scale * T::exp_nonpositive(x - max) + offset;
            }
            if let Some(target) = rows.target(row_index) {
                grad_row[target as usize] += T::ZERO - ce_grad * T::from_f64(1.0 - eps);
            }
            for k in 0..width {
                grad_row[row_ids[k] as usize] += grads[k] * stats[k];
            }
        });
}

/// Runs `f` on the contiguous CPU data of `t` (made contiguous first if needed).
pub(crate) fn with_cpu_slice<T: WithDType, R>(
    t: &Tensor,
    what: &str,
    f: impl FnOnce(&[T]) -> Result<R>,
) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        bail!("{what}: the fused kernel needs a CPU tensor")
    };
    f(contiguous_slice::<T>(cpu, layout, what)?)
}

/// The fused cross-entropy over `[B, S, V]` logits and u32 `[B, S]` targets; output
/// `[B, S, CE_COLUMNS]` (see [`forward_rows`], with no gathered columns).
struct CrossEntropyOp {
    cfg: CrossEntropyConfig,
}

impl CrossEntropyOp {
    fn forward<T: CeFloat>(
        &self,
        logits: &[T],
        targets: &[u32],
        (seq, vocab): (usize, usize),
    ) -> Result<Vec<T>> {
        let rows = TargetRows::new(targets, vocab, seq, &self.cfg)?;
        forward_rows(logits, vocab, Gathered::none(seq), &rows)
    }

    fn backward<T: CeFloat>(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<Tensor> {
        let (_, seq, vocab) = logits.dims3()?;
        let grad = with_cpu_slice::<T, _>(logits, "logits", |logits_data| {
            with_cpu_slice::<u32, _>(targets, "targets", |target_data| {
                let rows = TargetRows::new(target_data, vocab, seq, &self.cfg)?;
                with_cpu_slice::<T, _>(out, "output", |out_data| {
                    with_cpu_slice::<T, _>(grad_out, "gradient", |grad_data| {
                        Ok(backward_rows(
                            logits_data,
                            vocab,
                            Gathered::none(seq),
                            &rows,
                            out_data,
                            grad_data,
                        ))
                    })
                })
            })
        })?;
        Tensor::from_vec(grad, logits.shape(), logits.device())
    }
}

impl CustomOp2 for CrossEntropyOp {
    fn name(&self) -> &'static str {
        "candle-bleu-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        targets: &CpuStorage,
        targets_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let targets = contiguous_slice::<u32>(targets, targets_layout, "targets")?;
        let dims = (seq, vocab);
        let out = dispatch_float!(logits.dtype(), "cross_entropy_from_logits", <T> => {
            let logits = contiguous_slice::<T>(logits, logits_layout, "logits")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.forward(logits, targets, dims)?))
        })?;
        Ok((out, Shape::from((batch, seq, CE_COLUMNS))))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = dispatch_float!(logits.dtype(), "cross_entropy_from_logits backward", <T> => {
            self.backward::<T>(logits, targets, out, grad_out)
        })?;
        Ok((Some(grad), None))
    }
}

/// Validates everything but the target values; returns the compute dtype.
pub(crate) fn check_cross_entropy_inputs(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<DType> {
    let (batch, seq, vocab) = match logits.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("`logits` must be [B, S, V], got shape {dims:?}"),
    };
    let dtype = super::score::compute_dtype(logits.dtype()).map_err(|_| {
        candle_core::Error::Msg(format!(
            "`logits` must be a float tensor, got {:?} with shape {:?}",
            logits.dtype(),
            logits.dims()
        ))
    })?;
    if batch == 0 || seq == 0 || vocab == 0 {
        bail!(
            "`logits` has an empty dimension: shape {:?}; B, S and V must be >= 1",
            logits.dims()
        );
    }
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

/// Validates the targets' dtype, shape and device against the hypotheses' `[B, S]` (from the
/// argument `name`, described in `described`), and the label smoothing.
pub(crate) fn check_targets(
    targets: &Tensor,
    (batch, seq): (usize, usize),
    name: &str,
    described: &str,
    device: &candle_core::Device,
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
    let summary = super::host::to_vec1::<u32>(&Tensor::stack(
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

/// Composed candle ops with the kernel's semantics, for devices without the fused kernel.
fn cross_entropy_composed(
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

/// Mean cross-entropy of `softmax(logits)` against `targets`: PyTorch's
/// `F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index = pad_id,
/// label_smoothing = ε)`.
///
/// `loss = (1/n) Σ_{(b,i): t ≠ pad} [(1 − ε)·(−log p[t]) + ε·mean_v(−log p[v])]`, with `n` the
/// number of non-pad positions. At `ε = 0` without padding it equals
/// `candle_nn::loss::cross_entropy` on the flattened logits.
///
/// On the CPU one custom op reads the logits once (online softmax per row: log-sum-exp, target
/// logit, mean logit) and its hand-written backward writes the logits gradient in one pass; no
/// `[B, S, V]` intermediate is stored. Elsewhere composed candle ops give the same numbers.
///
/// # Arguments
/// * `logits` - float `[B, S, V]`; f32 and f64 are computed in their dtype, f16 and bf16 in f32.
/// * `targets` - u32 `[B, S]`, each `< V` or equal to `cfg.pad_id`; not all padding.
/// * `cfg` - padding id and label smoothing `ε ∈ [0, 1)`.
///
/// Returns a scalar in the compute dtype. Errors (naming the argument and its shape or value) on
/// a wrong rank, dtype or shape, a target outside the vocabulary, an all-padding batch, `ε`
/// outside `[0, 1)`, or NaN/Inf in `logits`.
///
/// ```
/// use candle_bleu::loss::{cross_entropy_from_logits, CrossEntropyConfig};
/// use candle_core::{Device, Tensor};
/// let logits = Tensor::new(&[[[2f32, 0.0, 0.0], [0.0, 0.0, 0.0]]], &Device::Cpu)?;
/// let targets = Tensor::new(&[[0u32, 2]], &Device::Cpu)?;
/// let cfg = CrossEntropyConfig { pad_id: Some(2), ..Default::default() };
/// let loss = cross_entropy_from_logits(&logits, &targets, &cfg)?.to_scalar::<f32>()?;
/// // Only position 0 counts: -log(e² / (e² + 2)).
/// assert!((loss - (1.0 + 2.0 * (-2f32).exp()).ln()).abs() < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn cross_entropy_from_logits(
    logits: &Tensor,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
) -> Result<Tensor> {
    let dtype = check_cross_entropy_inputs(logits, targets, cfg)?;
    let logits = logits.to_dtype(dtype)?;
    if !logits.device().is_cpu() {
        return cross_entropy_composed(&logits, targets, cfg);
    }
    let out = logits
        .contiguous()?
        .apply_op2(&targets.contiguous()?, CrossEntropyOp { cfg: *cfg })?;
    out.narrow(2, 0, 1)?.sum_all()
}

/// `values[i] = exp(values[i])` for `values[i] <= 0`, with the kernels' vectorised f32 `exp`
/// and their lane loop: exposed (hidden) only so that `benches/stream.rs` can measure its
/// throughput, the exponential rate in the kernels' floor.
#[doc(hidden)]
pub fn exp_nonpositive_in_place(values: &mut [f32]) {
    let mut chunks = values.chunks_exact_mut(LANES);
    for chunk in &mut chunks {
        for value in chunk.iter_mut() {
            *value = f32::exp_nonpositive(*value);
        }
    }
    for v in chunks.into_remainder() {
        *v = f32::exp_nonpositive(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A row whose dense gradient part cancels (`scale` and `offset` both 0) still gets its
    /// sparse terms: the kernel once returned early there and left the row zero.
    #[test]
    fn backward_keeps_sparse_terms_when_the_dense_part_cancels() {
        let logits = [0f64; 4]; // p = 1/4 everywhere
        let ids = [1u32, 2];
        let gathered = Gathered {
            ids: &ids,
            width: 2,
            rows_per_batch: 1,
        };
        // A padding row (no cross-entropy gradient) and gathered gradients g = (1, -1): the
        // gradient of p_1 - p_2 is p_1 (e_1 - p) - p_2 (e_2 - p) = (0, 1/4, -1/4, 0).
        let padded = [0u32];
        let cfg = CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.0,
        };
        let non_pad = [3u32];
        let rows = TargetRows::new(&non_pad, 4, 1, &cfg).unwrap();
        let pad_rows = TargetRows {
            targets: Some(&padded),
            ..rows
        };
        let out = forward_rows(&logits, 4, gathered, &pad_rows).unwrap();
        let grad = backward_rows(
            &logits,
            4,
            gathered,
            &pad_rows,
            &out,
            &[1.0, -1.0, 0.0, 0.0, 0.0, 0.0],
        );
        assert_eq!(grad, [0.0, 0.25, -0.25, 0.0]);
        // A cross-entropy gradient (h w = 1, target 3) cancelled by a gathered one (g x = 4/4):
        // the gradient of CE + 4 p_1 is (p - e_3) + (e_1 - p) = e_1 - e_3.
        let gathered = Gathered {
            ids: &ids[..1],
            width: 1,
            rows_per_batch: 1,
        };
        let out = forward_rows(&logits, 4, gathered, &rows).unwrap();
        let grad = backward_rows(
            &logits,
            4,
            gathered,
            &rows,
            &out,
            &[4.0, 1.0, 0.0, 0.0, 0.0],
        );
        assert_eq!(grad, [0.0, 1.0, 0.0, -1.0]);
    }

    #[test]
    fn composed_path_matches_the_kernel() -> Result<()> {
        let logits = Tensor::randn(0f64, 2.0, (2, 3, 7), &Device::Cpu)?;
        let targets = Tensor::new(&[[1u32, 6, 0], [3, 0, 5]], &Device::Cpu)?;
        for cfg in [
            CrossEntropyConfig::default(),
            CrossEntropyConfig {
                pad_id: Some(0),
                label_smoothing: 0.2,
            },
        ] {
            let fused = cross_entropy_from_logits(&logits, &targets, &cfg)?.to_scalar::<f64>()?;
            let composed = cross_entropy_composed(&logits, &targets, &cfg)?.to_scalar::<f64>()?;
            assert!((fused - composed).abs() < 1e-12, "{fused} vs {composed}");
        }
        Ok(())
    }
}
