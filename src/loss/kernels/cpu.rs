//! The CPU row kernels, on raw slices: the `cpu_fwd` of the row op ([`crate::loss::kernels::row::op::RowOp`])
//! and the blocks of the hidden-state loss run these. Each pass writes rows of
//! [`RowLayout`]'s columns (`[Z | x | ce | max | sum | weight]`), whose widths and offsets it
//! takes from there.
//!
//! Two passes over rows of `V` logits, each with its backward:
//!
//! - the **row pass** ([`forward_rows_into`], [`backward_rows_into`]): the row's softmax
//!   statistics, the probabilities at optional gathered ids and an optional cross-entropy term,
//!   in one read of the row; the backward writes the row's logits gradient in one pass;
//! - the **self-match pass** ([`self_match_forward_into`], [`self_match_backward_into`]): every
//!   probability of the rows of whole batch elements, their self-match `Z = P Pᵀ`, the same
//!   gathered and cross-entropy columns; the backward applies the softmax Jacobian once to the
//!   dense and sparse gradients.
//!
//! The full softmax ([`softmax_forward`], [`softmax_backward`]) is the self-match pass's first
//! half and the Jacobian of its backward. f32 uses a vectorisable `exp` (Cephes' polynomial,
//! about 1 ulp); f64 the standard library's.

pub(crate) use crate::loss::kernels::float::KernelFloat;
use crate::loss::kernels::gemm::{matmul, MatMut, MatRef};
use crate::loss::kernels::layout::{RowLayout, CE_COLUMNS};
use candle_core::Result;
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// A zeroed buffer for a `[B, S, V]` kernel output. Buffers this large are fresh pages from
/// the OS (glibc serves them by `mmap`), and first-touch page faults cost about as much as the
/// kernel's arithmetic: at `[32,64,64,32000]` f32, 64 000 faults of 4 KiB per 250 MiB. On Linux
/// we ask for transparent huge pages (`madvise(MADV_HUGEPAGE)`, honoured when THP is in
/// `madvise` or `always` mode), which makes them 512 times fewer. Advice only: the contents
/// and the result do not change.
pub(crate) fn vocab_sized_buffer<T: KernelFloat>(len: usize) -> Vec<T> {
    let buffer = vec![T::ZERO; len];
    #[cfg(target_os = "linux")]
    advise_huge_pages(&buffer);
    buffer
}

#[cfg(target_os = "linux")]
fn advise_huge_pages<T>(buffer: &[T]) {
    const HUGE_PAGE: usize = 2 << 20;
    let bytes = std::mem::size_of_val(buffer);
    if bytes < 8 * HUGE_PAGE {
        return;
    }
    let start = buffer.as_ptr() as usize;
    let aligned_start = (start + HUGE_PAGE - 1) & !(HUGE_PAGE - 1);
    let aligned_end = (start + bytes) & !(HUGE_PAGE - 1);
    if aligned_end > aligned_start {
        // SAFETY: madvise only advises the kernel on how to back pages of the range, which lies
        // inside `buffer`'s live allocation; MADV_HUGEPAGE never changes memory contents. A
        // failure (e.g. THP disabled) leaves ordinary pages, so the result is ignored.
        unsafe {
            libc::madvise(
                aligned_start as *mut libc::c_void,
                aligned_end - aligned_start,
                libc::MADV_HUGEPAGE,
            );
        }
    }
}

/// Accumulator lanes: lane arrays let the loops vectorise (a float fold in one accumulator would
/// not, its order being fixed).
pub(crate) const LANES: usize = 8;

/// Whether the CPU has AVX2, detected once at run time: the row loops then run compiled for
/// 8-lane vectors instead of the x86-64 baseline's 4 (SSE2). Their lane order and operations are
/// the same either way and nothing fuses a multiply and an add, so the results are
/// bit-identical (`examples/fingerprint.rs` before and after: equal).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn avx2_detected() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `fn $name(args) -> ret = $body;`: `$name` runs `$body` (an `#[inline(always)]` row function
/// generic over `T: KernelFloat`) compiled for AVX2 when [`avx2_detected`], else as compiled for
/// the baseline. The body is inlined into each copy, so each copy vectorises its loops for its
/// own target.
macro_rules! wide_vectors {
    ($(#[$doc:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $body:ident;) => {
        $(#[$doc])*
        #[inline(always)]
        #[allow(clippy::too_many_arguments, clippy::unused_unit)]
        $vis fn $name<T: KernelFloat>($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments, clippy::unused_unit)]
                unsafe fn avx2<T: KernelFloat>($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if $crate::loss::kernels::cpu::avx2_detected() {
                    // SAFETY: `avx2_detected` checked that the CPU has AVX2.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use wide_vectors;

/// The row's maximum, and whether every entry is finite.
#[inline(always)]
pub(crate) fn row_max_checked<T: KernelFloat>(row: &[T]) -> (T, bool) {
    let mut max_lanes = [T::NEG_INFINITY; LANES];
    // x * 0 is 0 for finite x and NaN for NaN or ±inf: one NaN check per row instead of a branch.
    let mut finite_lanes = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            max_lanes[lane] = max_lanes[lane].larger(chunk[lane]);
            finite_lanes[lane] += chunk[lane] * T::ZERO;
        }
    }
    let mut max = T::NEG_INFINITY;
    let mut finite = T::ZERO;
    for lane in 0..LANES {
        max = max.larger(max_lanes[lane]);
        finite += finite_lanes[lane];
    }
    for &x in rest {
        max = max.larger(x);
        finite += x * T::ZERO;
    }
    (max, finite.is_finite() && max.is_finite())
}

/// `Σ_v f(row[v])` in lanes.
#[inline(always)]
fn lane_sum<T: KernelFloat>(row: &[T], f: impl Fn(T) -> T) -> T {
    let mut sum_lanes = [T::ZERO; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            sum_lanes[lane] += f(chunk[lane]);
        }
    }
    let mut sum = T::ZERO;
    for lane in sum_lanes {
        sum += lane;
    }
    for &x in rest {
        sum += f(x);
    }
    sum
}

/// `Σ_v a[v]·b[v]` in lanes.
#[inline(always)]
pub(crate) fn dot<T: KernelFloat>(a: &[T], b: &[T]) -> T {
    let mut dot_lanes = [T::ZERO; LANES];
    let a_chunks = a.chunks_exact(LANES);
    let b_chunks = b.chunks_exact(LANES);
    let (a_rest, b_rest) = (a_chunks.remainder(), b_chunks.remainder());
    for (ac, bc) in a_chunks.zip(b_chunks) {
        for lane in 0..LANES {
            dot_lanes[lane] += ac[lane] * bc[lane];
        }
    }
    let mut dot = T::ZERO;
    for lane in dot_lanes {
        dot += lane;
    }
    for (&x, &y) in a_rest.iter().zip(b_rest) {
        dot += x * y;
    }
    dot
}

/// The row's maximum, `Σ_v exp(row[v] − max)` and (when `with_logit_sum`) `Σ_v row[v]`, in
/// one read of the row from memory: each L1-sized block is scanned for its maximum, then summed,
/// rescaling the running sum when the maximum grows (online softmax). Also whether every entry
/// is finite.
#[inline(always)]
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
            // max < block_max, so the exponent is <= 0 (and exp(-inf) = 0 at the first block).
            sum *= T::exp_nonpositive(max - block_max);
            max = block_max;
        }
        sum += lane_sum(block, |x| T::exp_nonpositive(x - max));
        if with_logit_sum {
            logit_sum += lane_sum(block, |x| x);
        }
    }
    (max, sum, logit_sum, finite)
}

/// Writes `softmax(row)` into `p`; returns the row's `(max, exp-sum, logit sum)` (the logit sum
/// only when `with_logit_sum`, else 0), or `None` if the row holds NaN or Inf.
#[inline(always)]
fn softmax_row_into_body<T: KernelFloat>(
    row: &[T],
    p: &mut [T],
    with_logit_sum: bool,
) -> Option<(T, T, T)> {
    let (max, finite) = row_max_checked(row);
    if !finite {
        return None;
    }
    let mut sum_lanes = [T::ZERO; LANES];
    let mut out_chunks = p.chunks_exact_mut(LANES);
    let mut row_chunks = row.chunks_exact(LANES);
    for (o, chunk) in (&mut out_chunks).zip(&mut row_chunks) {
        for lane in 0..LANES {
            let e = T::exp_nonpositive(chunk[lane] - max);
            o[lane] = e;
            sum_lanes[lane] += e;
        }
    }
    let mut sum = T::ZERO;
    for lane in sum_lanes {
        sum += lane;
    }
    for (o, &x) in out_chunks
        .into_remainder()
        .iter_mut()
        .zip(row_chunks.remainder())
    {
        let e = T::exp_nonpositive(x - max);
        *o = e;
        sum += e;
    }
    let inv_sum = T::ONE / sum;
    let mut logit_sum = T::ZERO;
    for (pv, &x) in p.iter_mut().zip(row) {
        *pv *= inv_sum;
        if with_logit_sum {
            logit_sum += x;
        }
    }
    Some((max, sum, logit_sum))
}

wide_vectors! {
    /// Writes `softmax(row)` into `p` (see [`softmax_row_into_body`]).
    pub(crate) fn softmax_row_into(row: &[T], p: &mut [T], with_logit_sum: bool) -> Option<(T, T, T)>
        = softmax_row_into_body;
}

pub(crate) fn non_finite_error(argument: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "`{argument}` contains NaN or infinite values; the BLEU loss needs finite logits"
    ))
}

/// The cross-entropy's settings as the kernels take them: the padding id (rows with this target
/// add nothing), the label smoothing `ε`, the class weights, the z-loss and the metrics.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CrossEntropyTerms {
    pub pad_id: Option<u32>,
    pub label_smoothing: f64,
    /// `V` per-class weights, checked finite and `>= 0` (`None`: every class 1).
    pub class_weights: Option<std::sync::Arc<[f64]>>,
    /// The z-loss scale `λ`: each non-pad row's term adds `λ·lse²` (0: off).
    pub z_loss: f64,
    /// Whether the rows report whether their target is the argmax (the token accuracy).
    pub token_accuracy: bool,
}

impl CrossEntropyTerms {
    /// Whether each row also writes its metric columns `[z | correct]`
    /// ([`RowLayout::with_metrics`]): with a z-loss or the token accuracy.
    pub(crate) fn metrics(&self) -> bool {
        self.z_loss != 0.0 || self.token_accuracy
    }
}

/// Per-class weights as the rows use them: `w` (`V` values) and `W = Σ_v w_v`.
#[derive(Clone, Copy)]
pub(crate) struct ClassWeights<'a> {
    pub weights: &'a [f64],
    pub total: f64,
}

/// What the row pass needs to know about the targets.
#[derive(Clone, Copy)]
pub(crate) struct TargetRows<'a> {
    /// `[rows]` target ids; `None` when the pass computes no cross-entropy (every weight 0).
    pub targets: Option<&'a [u32]>,
    pub pad_id: Option<u32>,
    pub label_smoothing: f64,
    /// `1 / divisor`: each non-pad row's weight (`1/n` for the mean, `1/Σ w_t` with class
    /// weights).
    pub inv_count: f64,
    /// The z-loss scale `λ` (0: off).
    pub z_loss: f64,
    /// The z-term's row weight over the cross-entropy's: `divisor / n` for a weighted mean
    /// (whose z-term still divides by the count), else 1 (and unused).
    pub z_ratio: f64,
    /// Per-class weights (`None`: every class 1).
    pub class_weights: Option<ClassWeights<'a>>,
    /// Whether each row writes the metric columns `[z | correct]` after its statistics.
    pub metrics: bool,
}

impl<'a> TargetRows<'a> {
    /// Checked targets (each `< V` or `terms.pad_id`) with `inv_count = 1 / divisor` and the
    /// z-term's `z_ratio` (see the fields).
    pub(crate) fn new(
        targets: &'a [u32],
        terms: &'a CrossEntropyTerms,
        inv_count: f64,
        z_ratio: f64,
    ) -> Self {
        Self {
            targets: Some(targets),
            pad_id: terms.pad_id,
            label_smoothing: terms.label_smoothing,
            inv_count,
            z_loss: terms.z_loss,
            z_ratio,
            class_weights: terms.class_weights.as_deref().map(|weights| ClassWeights {
                weights,
                total: weights.iter().sum(),
            }),
            metrics: terms.metrics(),
        }
    }

    /// No cross-entropy: the row pass only gathers (the BLEU loss alone).
    pub(crate) fn none() -> Self {
        Self {
            targets: None,
            pad_id: None,
            label_smoothing: 0.0,
            inv_count: 0.0,
            z_loss: 0.0,
            z_ratio: 1.0,
            class_weights: None,
            metrics: false,
        }
    }

    /// The coefficient of `p_v` in the row's gradient, from `ce_grad = h·w` (the incoming
    /// gradient of the row's term times its weight): `h·w` unweighted, `h·w·(1 − ε)·w_t + h·w·ε·W/V`
    /// with class weights, plus the z-loss's `h·w·2λ·lse` (times `z_ratio` with class weights);
    /// `lse = max + ln(sum)` from the row's statistics.
    #[inline]
    fn dense_coefficient<T: KernelFloat>(&self, ce_grad: T, row: usize, max: T, sum: T) -> T {
        let Some(cw) = self.class_weights else {
            return z_dense(ce_grad, self.z_loss, max, sum);
        };
        let Some(target) = self.target(row) else {
            return T::ZERO;
        };
        let (eps, vocab) = (self.label_smoothing, cw.weights.len() as f64);
        let mut coefficient = (1.0 - eps) * cw.weights[target as usize] + eps * cw.total / vocab;
        if self.z_loss != 0.0 {
            let lse = max.to_f64() + sum.to_f64().ln();
            coefficient += self.z_ratio * 2.0 * self.z_loss * lse;
        }
        ce_grad * T::from_f64(coefficient)
    }

    /// The coefficient of the target's sparse term (`−coefficient·(1 − ε)` at `t`): `h·w`,
    /// times `w_t` with class weights.
    #[inline]
    pub(crate) fn target_coefficient<T: KernelFloat>(&self, ce_grad: T, row: usize) -> T {
        match (self.class_weights, self.target(row)) {
            (Some(cw), Some(target)) => ce_grad * T::from_f64(cw.weights[target as usize]),
            _ => ce_grad,
        }
    }

    /// The output layout of a row pass gathering `width` columns: [`RowLayout::rows`] with the
    /// metric columns when the rows write them.
    pub(crate) fn rows_layout(&self, width: usize) -> RowLayout {
        RowLayout::rows(width).with_metrics(self.metrics)
    }

    /// The self-match pass's layout over elements of `seq` rows (see [`Self::rows_layout`]).
    pub(crate) fn self_match_layout(&self, seq: usize, width: usize) -> RowLayout {
        RowLayout::self_match(seq, width).with_metrics(self.metrics)
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

    /// The CE columns of `row` (`[ce | max | sum | weight]`) from its statistics.
    #[inline]
    fn columns<T: KernelFloat>(
        &self,
        row: &[T],
        row_index: usize,
        stats: (T, T, T),
        out: &mut [T],
    ) {
        let (max, sum, _) = stats;
        out[0] = self.cross_entropy(row, row_index, stats);
        out[1] = max;
        out[2] = sum;
        out[3] = T::from_f64(self.weight(row_index));
        if self.metrics {
            let (z, correct) = self.metric_columns(row, row_index, (max, sum));
            out[CE_COLUMNS] = z;
            out[CE_COLUMNS + 1] = correct;
        }
    }

    /// The row's metric columns: `λ·lse²` (unweighted) and 1 where the target is the row's
    /// argmax — its logit is the maximum and no earlier column reaches it, the first index
    /// among equal maxima as `argmax` picks it — both 0 at padding.
    #[inline]
    fn metric_columns<T: KernelFloat>(
        &self,
        row: &[T],
        row_index: usize,
        (max, sum): (T, T),
    ) -> (T, T) {
        let Some(target) = self.target(row_index) else {
            return (T::ZERO, T::ZERO);
        };
        let lse = max.to_f64() + sum.to_f64().ln();
        let t = target as usize;
        let is_argmax = row[t] == max && !row[..t].contains(&max);
        (
            T::from_f64(self.z_loss * lse * lse),
            if is_argmax { T::ONE } else { T::ZERO },
        )
    }

    /// The row's cross-entropy term `w·(lse − (1 − ε)·x_t − ε·mean_v x_v + λ·lse²)` from its
    /// statistics (the z-loss `λ·lse²` only when `λ ≠ 0`).
    #[inline]
    fn cross_entropy<T: KernelFloat>(&self, row: &[T], row_index: usize, stats: (T, T, T)) -> T {
        let weight = self.weight(row_index);
        if weight == 0.0 {
            return T::ZERO;
        }
        let (max, sum, logit_sum) = stats;
        let Some(target) = self.target(row_index) else {
            return T::ZERO;
        };
        let eps = self.label_smoothing;
        let lse = max.to_f64() + sum.to_f64().ln();
        let target_logit = row[target as usize].to_f64();
        if let Some(cw) = self.class_weights {
            // PyTorch's weighted terms: (1 − ε)·w_t·(lse − x_t) + (ε/V)·(W·lse − Σ_v w_v x_v).
            let mut term = (1.0 - eps) * cw.weights[target as usize] * (lse - target_logit);
            if eps != 0.0 {
                let weighted_logits: f64 = row
                    .iter()
                    .zip(cw.weights)
                    .map(|(&x, &w)| w * x.to_f64())
                    .sum();
                term += eps / row.len() as f64 * (cw.total * lse - weighted_logits);
            }
            if self.z_loss != 0.0 {
                term += self.z_ratio * self.z_loss * lse * lse;
            }
            return T::from_f64(weight * term);
        }
        let mean_logit = logit_sum.to_f64() / row.len() as f64;
        let term = lse - (1.0 - eps) * target_logit - eps * mean_logit;
        if self.z_loss == 0.0 {
            T::from_f64(weight * term)
        } else {
            T::from_f64(weight * (term + self.z_loss * lse * lse))
        }
    }
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
    pub(crate) fn row_ids(&self, row: usize) -> &[u32] {
        &self.ids[(row / self.rows_per_batch) * self.width..][..self.width]
    }
}

/// One row of [`forward_rows_into`]; `false` if the row holds NaN or Inf.
#[inline(always)]
fn forward_row<T: KernelFloat>(
    row: &[T],
    row_ids: &[u32],
    rows: &TargetRows,
    row_index: usize,
    with_logit_sum: bool,
    out_row: &mut [T],
) -> bool {
    let width = row_ids.len();
    let (max, sum, logit_sum, finite) = row_softmax_stats(row, with_logit_sum);
    if !finite {
        return false;
    }
    let inv_sum = T::ONE / sum;
    for (o, &id) in out_row[..width].iter_mut().zip(row_ids) {
        *o = T::exp_nonpositive(row[id as usize] - max) * inv_sum;
    }
    let ce_column = rows.rows_layout(width).ce_column();
    rows.columns(
        row,
        row_index,
        (max, sum, logit_sum),
        &mut out_row[ce_column..],
    );
    true
}

wide_vectors! {
    /// One row of [`forward_rows_into`] (see [`forward_row`]).
    fn forward_row_dispatch(
        row: &[T],
        row_ids: &[u32],
        rows: &TargetRows,
        row_index: usize,
        with_logit_sum: bool,
        out_row: &mut [T],
    ) -> bool = forward_row;
}

/// The row pass over the rows `first_row..` of the batch, whose logits are `logits`, into `out`
/// (one output row per logits row): `[x_0 … x_{K−1} | ce | max | sum | weight]` with
/// `x_k = softmax(logits[r])[ids[r / rows_per_batch, k]]` (none when `width` = 0) and the
/// cross-entropy columns ([`CE_COLUMNS`](crate::loss::kernels::layout::CE_COLUMNS)). Errors on NaN or Inf in `logits`.
pub(crate) fn forward_rows_into<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &mut [T],
) -> Result<()> {
    let width = gathered.width;
    let stride = rows.rows_layout(width).stride();
    let all_finite = AtomicBool::new(true);
    let with_logit_sum = rows.label_smoothing != 0.0;
    out.par_chunks_mut(stride)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (out_row, row))| {
            let row_index = first_row + local;
            let row_ids = gathered.row_ids(row_index);
            if !forward_row_dispatch(row, row_ids, rows, row_index, with_logit_sum, out_row) {
                all_finite.store(false, Ordering::Relaxed);
            }
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    Ok(())
}

/// The coefficients of one row's logits gradient (see [`backward_rows_into`]): `(scale, offset,
/// ce_grad)` with `scale = (d − Σ_k g_k x_k) / sum`, `offset = −h·w·ε/V` (times `w_v` in column
/// `v` with class weights) and `ce_grad = h·w`, `d` the coefficient of `p_v`
/// ([`TargetRows::dense_coefficient`]: `h·w·(1 + 2λ·lse)` unweighted), from the row's forward
/// output `stats` and its incoming gradient `grads` (same layout).
#[inline]
pub(crate) fn row_gradient_coefficients<T: KernelFloat>(
    stats: &[T],
    grads: &[T],
    width: usize,
    (rows, row): (&TargetRows, usize),
    vocab: usize,
) -> (T, T, T) {
    let layout = RowLayout::rows(width);
    let (sum, weight) = (stats[layout.sum_column()], stats[layout.weight_column()]);
    let ce_grad = grads[layout.ce_column()] * weight;
    let mut weighted = T::ZERO;
    for k in 0..width {
        weighted += grads[k] * stats[k];
    }
    let dense = rows.dense_coefficient(ce_grad, row, stats[layout.max_column()], sum);
    let scale = (dense - weighted) / sum;
    let offset = T::ZERO - ce_grad * T::from_f64(rows.label_smoothing / vocab as f64);
    (scale, offset, ce_grad)
}

/// The coefficient of `p_v` in a row's cross-entropy gradient: `h·w`, times `1 + 2λ·lse` with
/// the z-loss (`∂(λ·lse²)/∂z_v = 2λ·lse·p_v`), `lse = max + ln(sum)` from the row's statistics.
#[inline]
fn z_dense<T: KernelFloat>(ce_grad: T, z_loss: f64, max: T, sum: T) -> T {
    if z_loss == 0.0 {
        ce_grad
    } else {
        let lse = max.to_f64() + sum.to_f64().ln();
        ce_grad * T::from_f64(1.0 + 2.0 * z_loss * lse)
    }
}

/// The sparse terms of a row's logits gradient: `−h·w·(1 − ε)` at the target and `s_k` at
/// `id_k`, added to `grad_row`.
#[inline]
fn add_sparse_terms<T: KernelFloat>(
    grad_row: &mut [T],
    target: Option<u32>,
    ce_grad: T,
    eps: f64,
    ids: &[u32],
    terms: impl Iterator<Item = T>,
) {
    // A whole row holds every column: ids and targets are checked `< V` before any pass.
    debug_assert!(
        target.is_none_or(|t| (t as usize) < grad_row.len())
            && ids.iter().all(|&id| (id as usize) < grad_row.len())
    );
    add_sparse_terms_in_columns(grad_row, 0, target, ce_grad, eps, ids, terms);
}

/// [`add_sparse_terms`] for the columns `first_column..first_column + grad_columns.len()` of a
/// row: the terms whose column lies there, in the same order, so each element gets the same
/// sums as in the whole row.
#[inline]
fn add_sparse_terms_in_columns<T: KernelFloat>(
    grad_columns: &mut [T],
    first_column: usize,
    target: Option<u32>,
    ce_grad: T,
    eps: f64,
    ids: &[u32],
    terms: impl Iterator<Item = T>,
) {
    let mut add = |column: u32, term: T| {
        if let Some(g) = (column as usize)
            .checked_sub(first_column)
            .and_then(|local| grad_columns.get_mut(local))
        {
            *g += term;
        }
    };
    if let Some(target) = target {
        add(target, T::ZERO - ce_grad * T::from_f64(1.0 - eps));
    }
    for (&id, term) in ids.iter().zip(terms) {
        add(id, term);
    }
}

/// The logits gradient of [`forward_rows_into`]'s rows `first_row..` (their logits, forward
/// outputs and incoming gradients) into `grad`, in one pass over each row:
///
/// `dlogits[v] = p_v·(h·w − Σ_k g_k x_k) − h·w·ε/V − h·w·(1 − ε)·[v = t] + Σ_k g_k x_k·[v = id_k]`
///
/// with `h` the gradient of the row's cross-entropy term, `w` its weight and `g_k` the
/// gradients of the gathered probabilities (the softmax Jacobian applied to both at once).
/// `zeroed` says whether `grad` holds zeros already (then rows without a dense part leave their
/// zeros, and their pages, untouched).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_rows_into<T: KernelFloat>(
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
    backward_rows_columns_into(
        logits,
        (0, vocab),
        vocab,
        gathered,
        rows,
        first_row,
        out,
        grad_out,
        grad,
        zeroed,
    );
}

/// The columns `v0..v0 + len` of [`backward_rows_into`]'s gradient for the rows
/// `first_row..`, from those columns of their logits (`logits_tile`, `[rows, len]`) into
/// `grad_tile` (`[rows, len]`): every element the same value as the whole-row pass gives it.
/// A backward that walks the vocabulary in tiles (the hidden-state path's) calls it once per
/// tile; the row coefficients come from the forward's outputs, so no tile needs the others.
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_rows_tile_into<T: KernelFloat>(
    logits_tile: &[T],
    columns: (usize, usize),
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &[T],
    grad_out: &[T],
    grad_tile: &mut [T],
) {
    backward_rows_columns_into(
        logits_tile,
        columns,
        vocab,
        gathered,
        rows,
        first_row,
        out,
        grad_out,
        grad_tile,
        false,
    );
}

/// The one body of [`backward_rows_into`] (all `V` columns) and [`backward_rows_tile_into`]
/// (columns `v0..v0 + len`); `zeroed` as in [`backward_rows_into`].
#[allow(clippy::too_many_arguments)]
fn backward_rows_columns_into<T: KernelFloat>(
    logits: &[T],
    (v0, len): (usize, usize),
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
    let layout = rows.rows_layout(width);
    let stride = layout.stride();
    let eps = rows.label_smoothing;
    grad.par_chunks_mut(len)
        .zip(logits.par_chunks(len))
        .enumerate()
        .for_each(|(local, (grad_columns, columns))| {
            let row_index = first_row + local;
            let stats = &out[local * stride..][..stride];
            let grads = &grad_out[local * stride..][..stride];
            let max = stats[layout.max_column()];
            let (scale, offset, ce_grad) =
                row_gradient_coefficients(stats, grads, width, (rows, row_index), vocab);
            let ce_grad = rows.target_coefficient(ce_grad, row_index);
            let row_ids = gathered.row_ids(row_index);
            let target = rows.target(row_index);
            let terms = (0..width).map(|k| grads[k] * stats[k]);
            if scale == T::ZERO && offset == T::ZERO {
                // No dense part (padding without BLEU gradient, or a cross-entropy gradient
                // that the gathered ones cancel): zeros, and the sparse terms, which need not
                // vanish one by one.
                if !zeroed {
                    grad_columns.fill(T::ZERO);
                }
                let target = target.filter(|_| ce_grad != T::ZERO);
                add_sparse_terms_in_columns(grad_columns, v0, target, ce_grad, eps, row_ids, terms);
                return;
            }
            match rows.class_weights {
                // With class weights the smoothing offset of column `v` is `offset·w_v`.
                Some(cw) if offset != T::ZERO => {
                    let weights = &cw.weights[v0..v0 + len];
                    weighted_dense_gradient(grad_columns, columns, scale, max, offset, weights);
                }
                _ => dense_gradient_dispatch(grad_columns, columns, scale, max, offset),
            }
            add_sparse_terms_in_columns(grad_columns, v0, target, ce_grad, eps, row_ids, terms);
        });
}

/// `grad_row[v] = scale · exp(row[v] − max) + offset`: the dense part of a row's logits
/// gradient in [`backward_rows_into`].
#[inline(always)]
fn dense_gradient<T: KernelFloat>(grad_row: &mut [T], row: &[T], scale: T, max: T, offset: T) {
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
}

/// [`dense_gradient`] with the offset of column `v` times the class weight `weights[v]`.
fn weighted_dense_gradient<T: KernelFloat>(
    grad_row: &mut [T],
    row: &[T],
    scale: T,
    max: T,
    offset: T,
    weights: &[f64],
) {
    for ((g, &x), &w) in grad_row.iter_mut().zip(row).zip(weights) {
        *g = scale * T::exp_nonpositive(x - max) + offset * T::from_f64(w);
    }
}

wide_vectors! {
    /// The dense part of a row's logits gradient (see [`dense_gradient`]).
    fn dense_gradient_dispatch(grad_row: &mut [T], row: &[T], scale: T, max: T, offset: T) -> ()
        = dense_gradient;
}

/// `grad_row[v] = scale · exp(row[v] − lse)` for `lse >= max(row)`: `scale · softmax(row)` when
/// `lse` is the row's log-sum-exp (the CTC kernel's dense gradient term).
pub(crate) fn scaled_softmax_into<T: KernelFloat>(grad_row: &mut [T], row: &[T], scale: T, lse: T) {
    dense_gradient_dispatch(grad_row, row, scale, lse, T::ZERO);
}

#[inline(always)]
fn row_stats_body<T: KernelFloat>(row: &[T]) -> (T, T, T, bool) {
    row_softmax_stats(row, false)
}

wide_vectors! {
    /// [`row_softmax_stats`] without the logit sum.
    fn row_stats_dispatch(row: &[T]) -> (T, T, T, bool) = row_stats_body;
}

/// `log Σ_v exp(row[v])` (in f64, from the row's maximum and exp-sum in `T`) in one read of the
/// row, or `None` if the row holds NaN or Inf.
pub(crate) fn row_log_sum_exp<T: KernelFloat>(row: &[T]) -> Option<f64> {
    let (max, sum, _, finite) = row_stats_dispatch(row);
    finite.then(|| max.to_f64() + sum.to_f64().ln())
}

/// The softmax Jacobian applied in place to one row's gradient: `g` holds the dense gradient of
/// the probabilities `p` and becomes the logits gradient
/// `p ⊙ (g + d − Σ_v p_v g_v − Σ_k p[id_k] s_k) − h·w·ε/V·w_v − c_t·(1 − ε)·[v = t] + Σ_k p[id_k] s_k·[v = id_k]`
/// for sparse gradients `s_k` at `ids` and the cross-entropy gradients
/// `ce_grads = (h·w, c_t, d)`: `c_t` the target's coefficient (`h·w`, times `w_t` with class
/// weights) and `d` the coefficient of `p` ([`TargetRows::dense_coefficient`]); `w_v` the class
/// weights (1 without them).
#[inline(always)]
fn jacobian_row_in_place_body<T: KernelFloat>(
    p: &[T],
    g: &mut [T],
    ids: &[u32],
    sparse: &[T],
    (ce_grad, target_grad, ce_dense): (T, T, T),
    (target, eps, class_weights): (Option<u32>, f64, Option<&[f64]>),
) {
    let mut dot = dot(p, g);
    for (&id, &s) in ids.iter().zip(sparse) {
        dot += p[id as usize] * s;
    }
    let shift = ce_dense - dot;
    let offset = T::ZERO - ce_grad * T::from_f64(eps / p.len() as f64);
    match class_weights {
        Some(weights) if offset != T::ZERO => {
            for ((o, &pv), &w) in g.iter_mut().zip(p).zip(weights) {
                *o = pv * (*o + shift) + offset * T::from_f64(w);
            }
        }
        _ => {
            for (o, &pv) in g.iter_mut().zip(p) {
                *o = pv * (*o + shift) + offset;
            }
        }
    }
    let terms = ids.iter().zip(sparse).map(|(&id, &s)| p[id as usize] * s);
    add_sparse_terms(g, target, target_grad, eps, ids, terms);
}

wide_vectors! {
    /// The softmax Jacobian applied in place to one row's gradient (see
    /// [`jacobian_row_in_place_body`]).
    fn jacobian_row_in_place(
        p: &[T],
        g: &mut [T],
        ids: &[u32],
        sparse: &[T],
        ce_grads: (T, T, T),
        target: (Option<u32>, f64, Option<&[f64]>),
    ) -> () = jacobian_row_in_place_body;
}

/// `softmax(logits)` row by row (rows of `vocab`); errors on NaN or Inf.
pub(crate) fn softmax_forward<T: KernelFloat>(logits: &[T], vocab: usize) -> Result<Vec<T>> {
    let mut probs = vocab_sized_buffer(logits.len());
    let all_finite = AtomicBool::new(true);
    probs
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .for_each(|(p, row)| {
            if softmax_row_into(row, p, false).is_none() {
                all_finite.store(false, Ordering::Relaxed);
            }
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    Ok(probs)
}

/// `dlogits = p ⊙ (dp − Σ_v p_v dp_v)` row by row.
pub(crate) fn softmax_backward<T: KernelFloat>(
    probs: &[T],
    grad_probs: &[T],
    vocab: usize,
) -> Vec<T> {
    let mut grad = vocab_sized_buffer(probs.len());
    grad.par_chunks_mut(vocab)
        .zip(probs.par_chunks(vocab).zip(grad_probs.par_chunks(vocab)))
        .for_each(|(g, (p, dp))| {
            g.copy_from_slice(dp);
            jacobian_row_in_place(
                p,
                g,
                &[],
                &[],
                (T::ZERO, T::ZERO, T::ZERO),
                (None, 0.0, None),
            );
        });
    grad
}

/// The self-match pass over the rows `first_row..` of whole batch elements (`logits` holds a
/// multiple of `S = gathered.rows_per_batch` rows), into `out`, one row per logits row:
/// `[Z_0 … Z_{S−1} | x_0 … x_{K−1} | ce | max | sum | weight]`, with `Z = P Pᵀ` within each
/// element, `x_k` the softmax at the gathered ids and the cross-entropy columns of
/// [`forward_rows_into`].
pub(crate) fn self_match_forward_into<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &mut [T],
) -> Result<()> {
    let seq = gathered.rows_per_batch;
    let width = gathered.width;
    let row_count = logits.len() / vocab;
    let layout = rows.self_match_layout(seq, width);
    let stride = layout.stride();
    let with_logit_sum = rows.label_smoothing != 0.0;
    let mut probs = vocab_sized_buffer::<T>(logits.len());
    let all_finite = AtomicBool::new(true);
    probs
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .zip(out.par_chunks_mut(stride))
        .enumerate()
        .for_each(|(local, ((p, row), out_row))| {
            let row_index = first_row + local;
            let Some(stats) = softmax_row_into(row, p, with_logit_sum) else {
                all_finite.store(false, Ordering::Relaxed);
                return;
            };
            for (o, &id) in out_row[layout.gathered_start()..layout.ce_column()]
                .iter_mut()
                .zip(gathered.row_ids(row_index))
            {
                *o = p[id as usize];
            }
            rows.columns(row, row_index, stats, &mut out_row[layout.ce_column()..]);
        });
    if !all_finite.load(Ordering::Relaxed) {
        return Err(non_finite_error("logits"));
    }
    for element in 0..row_count / seq {
        let element_probs = MatRef::row_major(&probs[element * seq * vocab..], seq, vocab);
        matmul(
            MatMut::with_row_stride(&mut out[element * seq * stride..], seq, seq, stride),
            element_probs,
            element_probs.t(),
            false,
        );
    }
    Ok(())
}

/// The logits gradient of [`self_match_forward_into`]'s rows, into `grad`:
///
/// `dlogits = p ⊙ (d + h·w − Σ_v p_v d_v) − h·w·ε/V − h·w·(1 − ε)·[v = t] + Σ_k g_k x_k·[v = id_k]`
///
/// with `d = (dZ + dZᵀ) P + scatter(g at ids)` (the dense part of `d` in the first term, its
/// sparse part in the last) and `h`, `w` as in [`backward_rows_into`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn self_match_backward_into<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    gathered: Gathered,
    rows: &TargetRows,
    first_row: usize,
    out: &[T],
    grad_out: &[T],
    grad: &mut [T],
) {
    let seq = gathered.rows_per_batch;
    let width = gathered.width;
    let row_count = logits.len() / vocab;
    let layout = rows.self_match_layout(seq, width);
    let stride = layout.stride();
    let eps = rows.label_smoothing;
    // P again, from the logits and each row's max and sum kept in the output.
    let mut probs = vocab_sized_buffer::<T>(logits.len());
    probs
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (p, row))| {
            let stats = &out[local * stride..][..stride];
            let (max, inv_sum) = (
                stats[layout.max_column()],
                T::ONE / stats[layout.sum_column()],
            );
            // `p = exp(row − max) · inv_sum`: the dense loop of `dense_gradient` with offset 0.
            dense_gradient_dispatch(p, row, inv_sum, max, T::ZERO);
        });
    // Z = P Pᵀ: the dense gradient of P is (dZ + dZᵀ) P, written into `grad` first.
    let mut symmetric = vec![T::ZERO; seq * seq];
    for element in 0..row_count / seq {
        let grad_self = &grad_out[element * seq * stride..];
        for i in 0..seq {
            for j in 0..seq {
                symmetric[i * seq + j] = grad_self[i * stride + j] + grad_self[j * stride + i];
            }
        }
        matmul(
            MatMut::row_major(&mut grad[element * seq * vocab..], seq, vocab),
            MatRef::row_major(&symmetric, seq, seq),
            MatRef::row_major(&probs[element * seq * vocab..], seq, vocab),
            false,
        );
    }
    grad.par_chunks_mut(vocab)
        .zip(probs.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (g, p))| {
            let row_index = first_row + local;
            let grads = &grad_out[local * stride..][..stride];
            let stats = &out[local * stride..][..stride];
            let ce_grad = grads[layout.ce_column()] * stats[layout.weight_column()];
            let (max, sum) = (stats[layout.max_column()], stats[layout.sum_column()]);
            let dense = rows.dense_coefficient(ce_grad, row_index, max, sum);
            let target_grad = rows.target_coefficient(ce_grad, row_index);
            jacobian_row_in_place(
                p,
                g,
                gathered.row_ids(row_index),
                &grads[layout.gathered_start()..layout.ce_column()],
                (ce_grad, target_grad, dense),
                (
                    rows.target(row_index),
                    eps,
                    rows.class_weights.map(|cw| cw.weights),
                ),
            );
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate_on_the_kernel_range() {
        let mut worst = 0.0f64;
        for step in 0..200_000 {
            let x = -87.0 * step as f32 / 200_000.0;
            let fast = f32::exp_nonpositive(x) as f64;
            let exact = (x as f64).exp();
            worst = worst.max(((fast - exact) / exact).abs());
        }
        assert!(worst < 3e-7, "relative error {worst}");
        assert_eq!(f32::exp_nonpositive(-100.0), 0.0);
        assert_eq!(f32::exp_nonpositive(0.0), 1.0);
    }

    fn forward_rows<T: KernelFloat>(
        logits: &[T],
        vocab: usize,
        gathered: Gathered,
        rows: &TargetRows,
    ) -> Vec<T> {
        let stride = rows.rows_layout(gathered.width).stride();
        let mut out = vec![T::ZERO; logits.len() / vocab * stride];
        forward_rows_into(logits, vocab, gathered, rows, 0, &mut out).unwrap();
        out
    }

    fn backward_rows<T: KernelFloat>(
        logits: &[T],
        vocab: usize,
        gathered: Gathered,
        rows: &TargetRows,
        out: &[T],
        grad_out: &[T],
    ) -> Vec<T> {
        let mut grad = vec![T::ZERO; logits.len()];
        backward_rows_into(
            logits, vocab, gathered, rows, 0, out, grad_out, &mut grad, true,
        );
        grad
    }

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
        let terms = CrossEntropyTerms {
            pad_id: Some(0),
            ..Default::default()
        };
        let non_pad = [3u32];
        let rows = TargetRows::new(&non_pad, &terms, 1.0, 1.0);
        let pad_rows = TargetRows {
            targets: Some(&padded),
            ..rows
        };
        let out = forward_rows(&logits, 4, gathered, &pad_rows);
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
        let out = forward_rows(&logits, 4, gathered, &rows);
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
}
