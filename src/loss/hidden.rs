//! The loss from hidden states and the output projection, without storing the `[B, S, V]`
//! logits: [`cross_entropy_from_hidden`], [`bleu_loss_from_hidden`], [`ce_bleu_from_hidden`].
//!
//! The logits `H Wᵀ + b` of a block of rows (positions) are computed, passed through the same
//! row kernels as the logits entry points, and dropped; the backward recomputes each block's
//! logits, runs the row kernel's backward for its logits gradient `G`, and turns that into
//! `dH = G W`, `dW += Gᵀ H`, `db += Σ_rows G`. At most one block of logits (and one of their
//! gradient) is alive, so the loss's memory is `O(block)`, flat in `V` and in `B·S`; what
//! candle's autograd stores and accumulates is `[B, S, D]` and `[V, D]`, never `[B, S, V]`
//! (Wijmans et al. 2024, *Cut Your Losses in Large-Vocabulary Language Models*; Liger-Kernel's
//! fused linear cross-entropy).
//!
//! Each block holds whole vocabulary rows, so every row's softmax is exact in one pass and the
//! per-row output is the logits path's, to rounding. The paired form needs all `S` rows of an
//! element at once (its self-match `P Pᵀ`): its blocks are whole sequences.
//!
//! On the CPU one custom op per call runs the blocks on raw slices (gemm + the row kernels).
//! Elsewhere the same blocks run as candle ops: the forward is computed detached, block by
//! block, and attached to `hidden`, the weight and the bias by an op whose backward recomputes
//! each block as candle ops and back-propagates through it alone — so the GPU path keeps the
//! `O(block)` memory too.

use super::bleu::bleu_loss_from_logits;
use super::config::{
    BleuLossConfig, BleuLossOutput, CrossEntropyConfig, Form, HiddenConfig, TrainingLoss,
    TrainingLossConfig,
};
use super::host::CpuView;
use super::kernels::cpu::{
    backward_rows_into, forward_rows_into, row_gradient_coefficients, row_max_checked,
    self_match_backward_into, self_match_forward_into, vocab_sized_buffer, Gathered, TargetRows,
    CE_COLUMNS,
};
use super::kernels::float::KernelFloat;
use super::kernels::gemm::{matmul, MatMut, MatRef};
use super::kernels::{contiguous_slice, dispatch_float};
use super::pipeline::{
    check_bleu_arguments, check_bleu_weight, check_finite, check_targets, combine, cpu_kernels,
    device_targets, finish, inputs_from_gathered, kernel_terms, HypothesisInputs, HypothesisShape,
};
use super::references::{ReferenceSide, ReferenceTokens, References};
use super::score;
use super::training::ce_bleu_from_logits;
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp3, DType, Layout, Module, Result, Shape,
    Storage, Tensor, Var, D,
};
use candle_nn::Linear;
use rayon::prelude::*;

/// The validated inputs: `hidden` as `[B·S, D]` rows, the projection's weight `[V, D]` and
/// bias `[V]`, contiguous, in the compute dtype (f32 for f16/bf16).
struct HiddenInputs {
    hidden: Tensor,
    weight: Tensor,
    bias: Option<Tensor>,
    batch: usize,
    seq: usize,
    vocab: usize,
    dtype: DType,
    /// `hidden` and `proj`'s shapes, for messages.
    described: String,
}

impl HiddenInputs {
    fn new(hidden: &Tensor, proj: &Linear, cfg: &HiddenConfig) -> Result<Self> {
        cfg.validate()?;
        let (batch, seq, dim) = match hidden.dims() {
            &[b, s, d] => (b, s, d),
            dims => bail!("`hidden` must be [B, S, D], got shape {dims:?}"),
        };
        let dtype = score::compute_dtype(hidden.dtype()).map_err(|_| {
            candle_core::Error::Msg(format!(
                "`hidden` must be a float tensor, got {:?} with shape {:?}",
                hidden.dtype(),
                hidden.dims()
            ))
        })?;
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
        Ok(Self {
            hidden: prepare(&hidden.reshape((batch * seq, dim))?)?,
            weight: prepare(weight)?,
            bias: proj.bias().map(prepare).transpose()?,
            batch,
            seq,
            vocab,
            dtype,
            described: format!(
                "`hidden` shape {:?}, `proj.weight` shape {:?}",
                hidden.dims(),
                weight.dims()
            ),
        })
    }

    fn shape(&self) -> HypothesisShape<'_> {
        HypothesisShape {
            name: "hidden",
            described: self.described.clone(),
            batch: self.batch,
            seq: self.seq,
            vocab: self.vocab,
            device: self.hidden.device(),
        }
    }

    /// Off the CPU kernels, the value check of the inputs (in place on the CPU; a copy each
    /// elsewhere, only with `check_values`); the CPU kernels find non-finite logits themselves.
    fn check_finite(&self, cfg: &BleuLossConfig) -> Result<()> {
        if cpu_kernels(self.hidden.device()) {
            return Ok(());
        }
        check_finite("hidden", &self.hidden, cfg)?;
        check_finite("proj.weight", &self.weight, cfg)?;
        if let Some(bias) = &self.bias {
            check_finite("proj.bias", bias, cfg)?;
        }
        Ok(())
    }
}

/// What one call's rows compute besides the softmax statistics, owned by the CPU op.
struct RowSpec {
    /// u32 `[B, width]`: the gathered ids of each element (reference ids, then EOS).
    ids: Vec<u32>,
    width: usize,
    /// u32 `[B·S]` cross-entropy targets; `None` for the BLEU loss alone.
    targets: Option<Vec<u32>>,
    pad_id: Option<u32>,
    label_smoothing: f64,
    inv_count: f64,
    seq: usize,
    vocab: usize,
    /// The self-match pass (`Z = P Pᵀ` columns first) instead of the row pass.
    paired: bool,
}

impl RowSpec {
    /// Columns before the gathered ones: the self-match `Z` of the paired form.
    fn self_match_columns(&self) -> usize {
        if self.paired {
            self.seq
        } else {
            0
        }
    }

    fn stride(&self) -> usize {
        self.self_match_columns() + self.width + CE_COLUMNS
    }

    fn gathered(&self) -> Gathered<'_> {
        Gathered {
            ids: &self.ids,
            width: self.width,
            rows_per_batch: self.seq,
        }
    }

    fn target_rows(&self) -> TargetRows<'_> {
        match &self.targets {
            Some(targets) => TargetRows {
                targets: Some(targets),
                pad_id: self.pad_id,
                label_smoothing: self.label_smoothing,
                inv_count: self.inv_count,
            },
            None => TargetRows::none(),
        }
    }
}

/// `logits = hidden_block · weightᵀ (+ bias)`, `[rows, V]`, as `candle_nn::Linear` computes it.
fn block_logits<T: KernelFloat + 'static>(
    hidden_block: &[T],
    weight: &[T],
    bias: Option<&[T]>,
    (rows, dim, vocab): (usize, usize, usize),
    logits: &mut [T],
) {
    matmul(
        MatMut::row_major(logits, rows, vocab),
        MatRef::row_major(hidden_block, rows, dim),
        MatRef::row_major(weight, vocab, dim).t(),
        false,
    );
    if let Some(bias) = bias {
        logits.par_chunks_mut(vocab).for_each(|row| {
            for (x, &b) in row.iter_mut().zip(bias) {
                *x += b;
            }
        });
    }
}

/// `grad_bias[v0..v0 + len] += Σ_r grad_logits[r, v0..v0 + len]`.
fn add_column_sums<T: KernelFloat>(
    grad_logits: &[T],
    vocab: usize,
    (v0, len): (usize, usize),
    grad_bias: &mut [T],
) {
    const CHUNK: usize = 512;
    grad_bias[v0..v0 + len]
        .par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(chunk, sums)| {
            let (first, len) = (v0 + chunk * CHUNK, sums.len());
            for row in grad_logits.chunks_exact(vocab) {
                for (s, &g) in sums.iter_mut().zip(&row[first..first + len]) {
                    *s += g;
                }
            }
        });
}

/// `y += a · x`.
#[inline]
fn axpy<T: KernelFloat>(y: &mut [T], a: T, x: &[T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// The gradients of one backward: `hidden` `[R, D]`, weight `[V, D]`, bias `[V]`.
struct Gradients<T> {
    hidden: Vec<T>,
    weight: Vec<T>,
    bias: Option<Vec<T>>,
}

/// The CPU op: `[R, D]` hidden rows, the `[V, D]` weight (and the `[V]` bias) to the rows'
/// outputs `[R, stride]` — the same layout as the logits entry points' kernels write.
struct FromHidden {
    spec: RowSpec,
    block_rows: usize,
    vocab_tile: usize,
    filter_below: Option<f64>,
    /// Whether the op's third input is the projection's bias or [`bias_input`]'s placeholder.
    has_bias: bool,
}

impl FromHidden {
    fn forward<T: KernelFloat + 'static>(
        &self,
        hidden: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        dim: usize,
    ) -> Result<Vec<T>> {
        let spec = &self.spec;
        let (vocab, stride) = (spec.vocab, spec.stride());
        let rows = hidden.len() / dim;
        let block = self.block_rows.min(rows);
        let (gathered, target_rows) = (spec.gathered(), spec.target_rows());
        let mut out = vec![T::ZERO; rows * stride];
        let mut logits = vocab_sized_buffer::<T>(block * vocab);
        for start in (0..rows).step_by(block) {
            let n = block.min(rows - start);
            let logits = &mut logits[..n * vocab];
            let hidden_block = &hidden[start * dim..][..n * dim];
            block_logits(hidden_block, weight, bias, (n, dim, vocab), logits);
            let out = &mut out[start * stride..][..n * stride];
            let pass = if spec.paired {
                self_match_forward_into(logits, vocab, gathered, &target_rows, start, out)
            } else {
                forward_rows_into(logits, vocab, gathered, &target_rows, start, out)
            };
            pass.map_err(|_| {
                candle_core::Error::Msg(
                    "the logits `hidden · proj.weightᵀ + proj.bias` contain NaN or infinite values; the loss needs finite logits".into(),
                )
            })?;
        }
        Ok(out)
    }

    fn backward<T: KernelFloat + 'static>(
        &self,
        hidden: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        out: &[T],
        grad_out: &[T],
        dim: usize,
    ) -> Gradients<T> {
        let spec = &self.spec;
        let (vocab, stride) = (spec.vocab, spec.stride());
        let rows = hidden.len() / dim;
        let block = self.block_rows.min(rows);
        let (gathered, target_rows) = (spec.gathered(), spec.target_rows());
        let mut grads = Gradients {
            hidden: vec![T::ZERO; rows * dim],
            weight: vec![T::ZERO; vocab * dim],
            bias: bias.map(|_| vec![T::ZERO; vocab]),
        };
        // The paired form is not filtered (see `HiddenConfig`).
        let filter = self.filter_below.filter(|_| !spec.paired);
        // Without filtering one product spans the whole vocabulary (running them a tile at a
        // time measured the same within noise, BENCHMARKS.md, and sums `dH` in another order).
        let tile = match filter {
            Some(_) => self.vocab_tile.min(vocab),
            None => vocab,
        };
        let tiles: Vec<(usize, usize)> = (0..vocab)
            .step_by(tile)
            .map(|v0| (v0, tile.min(vocab - v0)))
            .collect();
        let mut skipped = vec![false; tiles.len()];
        // Σ_{v in tile} W_v per tile, for the label-smoothing offset of skipped tiles.
        let weight_tile_sums =
            (filter.is_some() && spec.targets.is_some() && spec.label_smoothing != 0.0)
                .then(|| weight_tile_sums(weight, dim, &tiles));
        let mut logits = vocab_sized_buffer::<T>(block * vocab);
        let mut grad_logits = vocab_sized_buffer::<T>(block * vocab);
        for start in (0..rows).step_by(block) {
            let n = block.min(rows - start);
            let logits = &mut logits[..n * vocab];
            let grad_logits = &mut grad_logits[..n * vocab];
            let hidden_block = &hidden[start * dim..][..n * dim];
            block_logits(hidden_block, weight, bias, (n, dim, vocab), logits);
            let out = &out[start * stride..][..n * stride];
            let grad_out = &grad_out[start * stride..][..n * stride];
            if spec.paired {
                self_match_backward_into(
                    logits,
                    vocab,
                    gathered,
                    &target_rows,
                    start,
                    out,
                    grad_out,
                    grad_logits,
                );
            } else {
                backward_rows_into(
                    logits,
                    vocab,
                    gathered,
                    &target_rows,
                    start,
                    out,
                    grad_out,
                    grad_logits,
                    false,
                );
            }
            if let Some(tau) = filter {
                mark_skipped(
                    logits,
                    out,
                    (stride, spec.width, vocab),
                    tau,
                    &tiles,
                    &mut skipped,
                );
            }
            let grad_hidden = &mut grads.hidden[start * dim..][..n * dim];
            let grad_block = MatRef::row_major(&*grad_logits, n, vocab);
            let weight_rows = MatRef::row_major(weight, vocab, dim);
            let mut first_tile = true;
            for (&(v0, len), _) in tiles.iter().zip(&skipped).filter(|(_, &skip)| !skip) {
                matmul(
                    MatMut::row_major(&mut *grad_hidden, n, dim),
                    grad_block.columns(v0, len),
                    weight_rows.rows(v0, len),
                    !first_tile,
                );
                first_tile = false;
                matmul(
                    MatMut::row_major(&mut grads.weight, vocab, dim).rows(v0, len),
                    grad_block.columns(v0, len).t(),
                    MatRef::row_major(hidden_block, n, dim),
                    start > 0,
                );
                if let Some(grad_bias) = &mut grads.bias {
                    add_column_sums(grad_logits, vocab, (v0, len), grad_bias);
                }
            }
            if skipped.contains(&true) {
                self.skipped_tile_terms(
                    SkippedBlock {
                        start,
                        hidden_block,
                        out,
                        grad_out,
                        tile,
                        skipped: &skipped,
                        weight_tile_sums: weight_tile_sums.as_deref(),
                    },
                    weight,
                    &mut grads,
                );
            }
        }
        grads
    }

    /// The terms of skipped tiles that filtering keeps: the label-smoothing offset (rank one)
    /// and the sparse terms at the target and the gathered ids.
    fn skipped_tile_terms<T: KernelFloat>(
        &self,
        block: SkippedBlock<'_, T>,
        weight: &[T],
        grads: &mut Gradients<T>,
    ) {
        let spec = &self.spec;
        let (vocab, stride, width) = (spec.vocab, spec.stride(), spec.width);
        let eps = spec.label_smoothing;
        let dim = weight.len() / vocab;
        let n = block.hidden_block.len() / dim;
        let target_rows = spec.target_rows();
        let gathered = spec.gathered();
        let is_skipped = |v: usize| block.skipped[v / block.tile];
        let grad_hidden = &mut grads.hidden[block.start * dim..][..n * dim];
        let mut offset_hidden = vec![T::ZERO; dim];
        let mut offset_total = T::ZERO;
        let skipped_weight_sum = block.weight_tile_sums.map(|sums| {
            let mut total = vec![T::ZERO; dim];
            for (t, _) in block.skipped.iter().enumerate().filter(|(_, &s)| s) {
                axpy(&mut total, T::ONE, &sums[t * dim..][..dim]);
            }
            total
        });
        for r in 0..n {
            let row = block.start + r;
            let stats = &block.out[r * stride..][..stride];
            let grads_r = &block.grad_out[r * stride..][..stride];
            let (_, offset, ce_grad) = row_gradient_coefficients(stats, grads_r, width, eps, vocab);
            let hidden_r = &block.hidden_block[r * dim..][..dim];
            let grad_hidden_r = &mut grad_hidden[r * dim..][..dim];
            if offset != T::ZERO {
                if let Some(sum) = &skipped_weight_sum {
                    axpy(grad_hidden_r, offset, sum);
                }
                axpy(&mut offset_hidden, offset, hidden_r);
                offset_total += offset;
            }
            let target_term = target_rows
                .target(row)
                .map(|t| (t, T::ZERO - ce_grad * T::from_f64(1.0 - eps)));
            let id_terms = gathered
                .row_ids(row)
                .iter()
                .enumerate()
                .map(|(k, &id)| (id, grads_r[k] * stats[k]));
            for (v, c) in target_term.into_iter().chain(id_terms) {
                let v = v as usize;
                if c == T::ZERO || !is_skipped(v) {
                    continue;
                }
                axpy(grad_hidden_r, c, &weight[v * dim..][..dim]);
                axpy(&mut grads.weight[v * dim..][..dim], c, hidden_r);
                if let Some(grad_bias) = &mut grads.bias {
                    grad_bias[v] += c;
                }
            }
        }
        if offset_total != T::ZERO || offset_hidden.iter().any(|&x| x != T::ZERO) {
            for v in (0..vocab).filter(|&v| is_skipped(v)) {
                axpy(&mut grads.weight[v * dim..][..dim], T::ONE, &offset_hidden);
                if let Some(grad_bias) = &mut grads.bias {
                    grad_bias[v] += offset_total;
                }
            }
        }
    }

    fn cpu_forward(
        &self,
        hidden: (&CpuStorage, &Layout),
        weight: (&CpuStorage, &Layout),
        bias: Option<(&CpuStorage, &Layout)>,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, dim) = hidden.1.shape().dims2()?;
        let out = dispatch_float!(hidden.0.dtype(), "the loss from hidden states", <T> => {
            let h = contiguous_slice::<T>(hidden.0, hidden.1, "hidden")?;
            let w = contiguous_slice::<T>(weight.0, weight.1, "proj.weight")?;
            let b = bias.map(|(s, l)| contiguous_slice::<T>(s, l, "proj.bias")).transpose()?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.forward(h, w, b, dim)?))
        })?;
        Ok((out, Shape::from((rows, self.spec.stride()))))
    }

    fn cpu_backward(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let (grad_out, out) = (grad_out.contiguous()?, out.contiguous()?);
        let bias_view = bias.map(|b| CpuView::new(b, "proj.bias")).transpose()?;
        let views = [
            CpuView::new(hidden, "hidden")?,
            CpuView::new(weight, "proj.weight")?,
            CpuView::new(&out, "output")?,
            CpuView::new(&grad_out, "gradient")?,
        ];
        let dim = hidden.dim(1)?;
        let device = hidden.device();
        dispatch_float!(hidden.dtype(), "the loss from hidden states (backward)", <T> => {
            let grads = self.backward::<T>(
                views[0].slice()?,
                views[1].slice()?,
                bias_view.as_ref().map(|v| v.slice()).transpose()?,
                views[2].slice()?,
                views[3].slice()?,
                dim,
            );
            Ok((
                Tensor::from_vec(grads.hidden, hidden.shape(), device)?,
                Tensor::from_vec(grads.weight, weight.shape(), device)?,
                grads.bias.map(|b| Tensor::from_vec(b, self.spec.vocab, device)).transpose()?,
            ))
        })
    }
}

/// One block's view for [`FromHidden::skipped_tile_terms`].
struct SkippedBlock<'a, T> {
    start: usize,
    hidden_block: &'a [T],
    out: &'a [T],
    grad_out: &'a [T],
    tile: usize,
    skipped: &'a [bool],
    weight_tile_sums: Option<&'a [T]>,
}

/// `Σ_{v in tile} W_v` for every tile: `[tiles, D]`.
fn weight_tile_sums<T: KernelFloat>(weight: &[T], dim: usize, tiles: &[(usize, usize)]) -> Vec<T> {
    let mut sums = vec![T::ZERO; tiles.len() * dim];
    sums.par_chunks_mut(dim)
        .zip(tiles.par_iter())
        .for_each(|(sum, &(v0, len))| {
            for v in v0..v0 + len {
                axpy(sum, T::ONE, &weight[v * dim..][..dim]);
            }
        });
    sums
}

/// Marks the tiles whose probabilities are all below `tau` in every row of the block:
/// `p[r,v] < τ` ⟺ `logit[r,v] < max_r + ln(τ · sum_r)`, from the row statistics the forward
/// kept (`max`, `sum` after the gathered columns).
fn mark_skipped<T: KernelFloat>(
    logits: &[T],
    out: &[T],
    (stride, width, vocab): (usize, usize, usize),
    tau: f64,
    tiles: &[(usize, usize)],
    skipped: &mut [bool],
) {
    let thresholds: Vec<T> = out
        .chunks_exact(stride)
        .map(|row| {
            let (max, sum) = (row[width + 1].to_f64(), row[width + 2].to_f64());
            T::from_f64(max + (tau * sum).ln())
        })
        .collect();
    skipped
        .par_iter_mut()
        .zip(tiles.par_iter())
        .for_each(|(skip, &(v0, len))| {
            *skip = logits
                .chunks_exact(vocab)
                .zip(&thresholds)
                .all(|(row, &threshold)| row_max_checked(&row[v0..v0 + len]).0 < threshold);
        });
}

impl CustomOp3 for FromHidden {
    fn name(&self) -> &'static str {
        "candle-bleu-loss-from-hidden"
    }

    fn cpu_fwd(
        &self,
        hidden: &CpuStorage,
        hidden_layout: &Layout,
        weight: &CpuStorage,
        weight_layout: &Layout,
        bias: &CpuStorage,
        bias_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu_forward(
            (hidden, hidden_layout),
            (weight, weight_layout),
            self.has_bias.then_some((bias, bias_layout)),
        )
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let bias = self.has_bias.then_some(bias);
        let (h, w, b) = self.cpu_backward(hidden, weight, bias, out, grad_out)?;
        Ok((Some(h), Some(w), b))
    }
}

/// The third input of the hidden-state ops: the projection's bias, or a one-element
/// placeholder (no gradient) when the layer has none, so that each op is one `CustomOp3`.
fn bias_input(inputs: &HiddenInputs) -> Result<Tensor> {
    match &inputs.bias {
        Some(bias) => Ok(bias.clone()),
        None => Tensor::zeros(1, inputs.dtype, inputs.hidden.device()),
    }
}

/// The rows' outputs as candle ops, for devices without the CPU kernels:
/// `[Z (paired form) | x | ce]` per row, the kernels' layout without their statistics.
struct ComposedRows {
    /// u32 `[R, width]`: each row's gathered ids.
    ids: Option<Tensor>,
    /// u32 `[R]` targets (padding replaced by 0) and float `[R]` weights (`1/n`, 0 at
    /// padding).
    targets: Option<(Tensor, Tensor)>,
    label_smoothing: f64,
    seq: usize,
    paired: bool,
}

impl ComposedRows {
    /// The outputs of rows `start..start + n` from their logits `[n, V]`.
    fn rows(&self, logits: &Tensor, start: usize) -> Result<Tensor> {
        let n = logits.dim(0)?;
        let mut columns = Vec::with_capacity(3);
        if self.paired || self.ids.is_some() {
            let probs = candle_nn::ops::softmax(logits, D::Minus1)?;
            if self.paired {
                let element_probs = probs.reshape((n / self.seq, self.seq, ()))?;
                let self_match = element_probs.matmul(&element_probs.t()?)?;
                columns.push(self_match.reshape((n, self.seq))?);
            }
            if let Some(ids) = &self.ids {
                columns.push(probs.gather(&ids.narrow(0, start, n)?.contiguous()?, 1)?);
            }
        }
        columns.push(match &self.targets {
            Some((targets, weights)) => {
                let eps = self.label_smoothing;
                let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
                let target_index = targets.narrow(0, start, n)?.unsqueeze(1)?.contiguous()?;
                let mut row = log_probs
                    .gather(&target_index, 1)?
                    .affine(-(1.0 - eps), 0.0)?;
                if eps != 0.0 {
                    row = (row - log_probs.mean_keepdim(1)?.affine(eps, 0.0)?)?;
                }
                row.broadcast_mul(&weights.narrow(0, start, n)?.unsqueeze(1)?)?
            }
            None => Tensor::zeros((n, 1), logits.dtype(), logits.device())?,
        });
        Tensor::cat(&columns, 1)
    }
}

/// `hidden · weightᵀ (+ bias)` as candle ops (`candle_nn::Linear` on rows).
fn linear(hidden: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let logits = hidden.matmul(&weight.t()?)?;
    match bias {
        Some(bias) => logits.broadcast_add(bias),
        None => Ok(logits),
    }
}

/// The composed path's outputs, computed detached block by block and attached to `hidden`,
/// the weight and the bias: the forward hands back the stored outputs; the backward
/// recomputes each block as candle ops and back-propagates through that block alone.
struct AttachBlocks {
    out: Tensor,
    rows: ComposedRows,
    block_rows: usize,
    /// Whether the op's third input is the projection's bias or [`bias_input`]'s placeholder.
    has_bias: bool,
}

impl AttachBlocks {
    fn stored(&self) -> (candle_core::StorageRef<'_>, &Layout) {
        self.out.storage_and_layout()
    }

    fn cpu_out(&self) -> Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Cpu(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_out(&self) -> Result<(candle_core::CudaStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the CUDA device"),
        }
    }

    #[cfg(feature = "metal")]
    fn metal_out(&self) -> Result<(candle_core::MetalStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Metal(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the Metal device"),
        }
    }

    fn backward(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        grad_out: &Tensor,
    ) -> Result<(Tensor, Tensor, Option<Tensor>)> {
        let rows = hidden.dim(0)?;
        let grad_out = grad_out.detach();
        // A variable is used as it is; anything else is copied into one (once per backward).
        let weight = Var::from_tensor(weight)?;
        let bias = bias.map(Var::from_tensor).transpose()?;
        let mut grad_hidden = Vec::with_capacity(rows.div_ceil(self.block_rows));
        let mut grad_weight: Option<Tensor> = None;
        let mut grad_bias: Option<Tensor> = None;
        let add = |total: &mut Option<Tensor>, part: Option<&Tensor>| -> Result<()> {
            if let Some(part) = part {
                *total = Some(match total.take() {
                    Some(total) => (total + part)?,
                    None => part.clone(),
                });
            }
            Ok(())
        };
        for start in (0..rows).step_by(self.block_rows) {
            let n = self.block_rows.min(rows - start);
            let hidden_block = Var::from_tensor(&hidden.narrow(0, start, n)?.detach())?;
            let logits = linear(
                hidden_block.as_tensor(),
                weight.as_tensor(),
                bias.as_ref().map(Var::as_tensor),
            )?;
            let out = self.rows.rows(&logits, start)?;
            let grads = (out * grad_out.narrow(0, start, n)?)?
                .sum_all()?
                .backward()?;
            grad_hidden.push(match grads.get(hidden_block.as_tensor()) {
                Some(g) => g.clone(),
                None => hidden_block.zeros_like()?,
            });
            add(&mut grad_weight, grads.get(weight.as_tensor()))?;
            if let Some(bias) = &bias {
                add(&mut grad_bias, grads.get(bias.as_tensor()))?;
            }
        }
        let grad_weight = match grad_weight {
            Some(g) => g,
            None => weight.zeros_like()?,
        };
        let grad_bias = match (grad_bias, &bias) {
            (Some(g), _) => Some(g),
            (None, Some(bias)) => Some(bias.zeros_like()?),
            (None, None) => None,
        };
        Ok((Tensor::cat(&grad_hidden, 0)?, grad_weight, grad_bias))
    }
}

impl CustomOp3 for AttachBlocks {
    fn name(&self) -> &'static str {
        "candle-bleu-loss-from-hidden-composed"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.cpu_out()
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.cuda_out()
    }

    #[cfg(feature = "metal")]
    fn metal_fwd(
        &self,
        _: &candle_core::MetalStorage,
        _: &Layout,
        _: &candle_core::MetalStorage,
        _: &Layout,
        _: &candle_core::MetalStorage,
        _: &Layout,
    ) -> Result<(candle_core::MetalStorage, Shape)> {
        self.metal_out()
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        _: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let bias = self.has_bias.then_some(bias);
        let (h, w, b) = self.backward(hidden, weight, bias, grad_out)?;
        Ok((Some(h), Some(w), b))
    }
}

/// The per-row outputs `[B, S, C]` of the hidden states' logits: `[Z | x | ce | …]` — the
/// self-match columns (paired form), the softmax gathered at `ids`, the row's weighted
/// cross-entropy term against `targets` (0 without), then, from the CPU kernels, their row
/// statistics. The one place that chooses the CPU kernels or the composed ops for the
/// hidden-state path.
fn hidden_rows(
    inputs: &HiddenInputs,
    ids: Option<&Tensor>,
    targets: Option<(&Tensor, &CrossEntropyConfig)>,
    paired: bool,
    cfg: &HiddenConfig,
) -> Result<Tensor> {
    let (batch, seq, vocab) = (inputs.batch, inputs.seq, inputs.vocab);
    let block_rows = cfg.block_rows(vocab, if paired { seq } else { 1 });
    let width = ids.map_or(Ok(0), |ids| ids.dim(1))?;
    let out = if cpu_kernels(inputs.hidden.device()) {
        let read = |t: &Tensor, what: &str| -> Result<Vec<u32>> {
            let t = t.contiguous()?;
            let view = CpuView::new(&t, what)?;
            Ok(view.slice::<u32>()?.to_vec())
        };
        let ids = ids.map(|ids| read(ids, "ids")).transpose()?;
        let (targets, pad_id, label_smoothing, inv_count) = match targets {
            Some((targets, ce)) => {
                let targets = read(targets, "targets")?;
                let inv_count = TargetRows::new(&targets, vocab, seq, kernel_terms(ce))?.inv_count;
                (Some(targets), ce.pad_id, ce.label_smoothing, inv_count)
            }
            None => (None, None, 0.0, 0.0),
        };
        let op = FromHidden {
            spec: RowSpec {
                ids: ids.unwrap_or_default(),
                width,
                targets,
                pad_id,
                label_smoothing,
                inv_count,
                seq,
                vocab,
                paired,
            },
            block_rows,
            vocab_tile: cfg.vocab_tile,
            filter_below: cfg.filter_below,
            has_bias: inputs.bias.is_some(),
        };
        inputs
            .hidden
            .apply_op3(&inputs.weight, &bias_input(inputs)?, op)?
    } else {
        let rows = ComposedRows {
            ids: ids
                .map(|ids| {
                    ids.unsqueeze(1)?
                        .broadcast_as((batch, seq, width))?
                        .reshape((batch * seq, width))
                })
                .transpose()?,
            targets: targets
                .map(|(targets, ce)| -> Result<(Tensor, Tensor)> {
                    let (safe, mask, count) = device_targets(targets, vocab, ce)?;
                    let weights = mask
                        .to_dtype(inputs.dtype)?
                        .affine(1.0 / f64::from(count), 0.0)?;
                    Ok((safe.flatten_all()?, weights.flatten_all()?))
                })
                .transpose()?,
            label_smoothing: targets.map_or(0.0, |(_, ce)| ce.label_smoothing),
            seq,
            paired,
        };
        let (hidden, weight) = (inputs.hidden.detach(), inputs.weight.detach());
        let bias = inputs.bias.as_ref().map(Tensor::detach);
        let rows_total = batch * seq;
        let mut blocks = Vec::with_capacity(rows_total.div_ceil(block_rows));
        for start in (0..rows_total).step_by(block_rows) {
            let n = block_rows.min(rows_total - start);
            let logits = linear(&hidden.narrow(0, start, n)?, &weight, bias.as_ref())?;
            blocks.push(rows.rows(&logits, start)?);
        }
        let out = Tensor::cat(&blocks, 0)?.contiguous()?;
        let out = if out.layout().start_offset() == 0 {
            out
        } else {
            out.copy()?
        };
        let op = AttachBlocks {
            out,
            rows,
            block_rows,
            has_bias: inputs.bias.is_some(),
        };
        inputs
            .hidden
            .apply_op3(&inputs.weight, &bias_input(inputs)?, op)?
    };
    out.reshape((batch, seq, ()))
}

/// The hypothesis inputs (and the cross-entropy column) from [`hidden_rows`]'s output.
fn split_rows(
    out: &Tensor,
    ids_width: usize,
    gather_width: usize,
    paired: bool,
    cfg: &BleuLossConfig,
) -> Result<(HypothesisInputs, Tensor)> {
    let seq = out.dim(1)?;
    let first = if paired { seq } else { 0 };
    let self_match = paired.then(|| out.narrow(2, 0, seq)).transpose()?;
    let gathered = out.narrow(2, first, gather_width)?;
    let inputs = inputs_from_gathered(&gathered, ids_width, self_match, cfg)?;
    Ok((inputs, out.narrow(2, first + gather_width, 1)?))
}

/// The logits of `proj` on `hidden`, materialised: the fallback for matrix references, which
/// are `[B, T, V]` themselves.
fn materialised_logits(hidden: &Tensor, proj: &Linear) -> Result<Tensor> {
    proj.forward(hidden)
}

/// Mean token cross-entropy of `softmax(proj(hidden))` against `targets`, without storing the
/// `[B, S, V]` logits: [`cross_entropy_from_logits`](super::cross_entropy_from_logits) of
/// `proj.forward(hidden)`, the same values and gradients (to rounding; 1e-10 in f64).
///
/// # Arguments
/// * `hidden` - float `[B, S, D]`: the decoder's states before the output layer. f32 and f64
///   are computed in their dtype, f16 and bf16 in f32.
/// * `proj` - the output layer, weight `[V, D]` and an optional bias `[V]`, in the dtype of
///   `hidden`, on its device. Tied embeddings: `Linear::new(embeddings.clone(), None)`.
/// * `targets` - u32 `[B, S]`, each `< V` or equal to `cfg.pad_id`; not all padding.
/// * `cfg` - padding id and label smoothing, as [`cross_entropy_from_logits`](super::cross_entropy_from_logits).
/// * `hidden_cfg` - block size and gradient filtering ([`HiddenConfig`]).
///
/// Returns a scalar in the compute dtype, differentiable with respect to `hidden`, the weight
/// and the bias. Errors (naming the argument and its shape or value) as the logits function
/// does, on a `proj` whose weight is not `[V, D]` with the `D` of `hidden` or whose dtype or
/// device differs, on an invalid `hidden_cfg`, and on non-finite logits (CPU).
///
/// ```
/// use candle_bleu::loss::{cross_entropy_from_hidden, cross_entropy_from_logits, CrossEntropyConfig, HiddenConfig};
/// use candle_core::{Device, Module, Tensor};
/// use candle_nn::Linear;
///
/// let dev = Device::Cpu;
/// let hidden = Tensor::randn(0f64, 1.0, (2, 3, 4), &dev)?; // [B, S, D]
/// let embeddings = Tensor::randn(0f64, 1.0, (10, 4), &dev)?; // [V, D], tied output layer
/// let proj = Linear::new(embeddings, None);
/// let targets = Tensor::new(&[[1u32, 2, 3], [4, 5, 0]], &dev)?;
/// let cfg = CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.1 };
/// let from_hidden = cross_entropy_from_hidden(&hidden, &proj, &targets, &cfg, &HiddenConfig::default())?;
/// let from_logits = cross_entropy_from_logits(&proj.forward(&hidden)?, &targets, &cfg)?;
/// assert!((from_hidden.to_scalar::<f64>()? - from_logits.to_scalar::<f64>()?).abs() < 1e-12);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn cross_entropy_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    targets: &Tensor,
    cfg: &CrossEntropyConfig,
    hidden_cfg: &HiddenConfig,
) -> Result<Tensor> {
    let inputs = HiddenInputs::new(hidden, proj, hidden_cfg)?;
    let batch_seq = (inputs.batch, inputs.seq);
    check_targets(
        targets,
        batch_seq,
        "hidden",
        &inputs.described,
        hidden.device(),
        cfg,
    )?;
    let out = hidden_rows(&inputs, None, Some((targets, cfg)), false, hidden_cfg)?;
    out.narrow(2, 0, 1)?.sum_all()
}

/// The ids the blocks gather at, `[B, W]` with the `eos_id` column under the EOS length models:
/// the ones the reference side caches.
fn cached_gather_ids(side: &ReferenceSide) -> Result<&Tensor> {
    match &side.gather {
        Some(gather) => Ok(&gather.ids),
        None => bail!("internal: id references without gather ids"),
    }
}

/// The BLEU loss of `softmax(proj(hidden))`, without storing the `[B, S, V]` logits:
/// [`bleu_loss_from_logits`] of `proj.forward(hidden)`, the same values, statistics and
/// gradients (to rounding; 1e-10 in f64).
///
/// With id references every form and length model runs blocked: the expected and
/// lower-bound forms in blocks of rows, the paired form in blocks of whole sequences (its
/// self-match `P Pᵀ` needs every row of an element). Matrix references
/// ([`References::from_matrices`]) are `[B, T, V]` themselves, as large as the logits: with
/// them the logits are materialised (`proj.forward(hidden)`) and the logits path runs.
///
/// # Arguments
/// * `hidden`, `proj`, `hidden_cfg` - as [`cross_entropy_from_hidden`].
/// * `hyp_lengths`, `refs`, `cfg` - as [`bleu_loss_from_logits`].
///
/// Errors as [`bleu_loss_from_logits`] and [`cross_entropy_from_hidden`] do.
pub fn bleu_loss_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
    hidden_cfg: &HiddenConfig,
) -> Result<BleuLossOutput> {
    score::validate_config(cfg)?;
    let inputs = HiddenInputs::new(hidden, proj, hidden_cfg)?;
    check_bleu_arguments(&inputs.shape(), hyp_lengths, refs, cfg)?;
    inputs.check_finite(cfg)?;
    let side = refs.side(cfg.max_order, cfg.length.eos_id(), inputs.dtype)?;
    let ReferenceTokens::Ids(ids) = &side.tokens else {
        let logits = materialised_logits(hidden, proj)?;
        return bleu_loss_from_logits(&logits, hyp_lengths, refs, cfg);
    };
    let paired = cfg.form == Form::Paired;
    let gather_ids = cached_gather_ids(&side)?;
    let out = hidden_rows(&inputs, Some(gather_ids), None, paired, hidden_cfg)?;
    let (hyp, _) = split_rows(&out, ids.dim(1)?, gather_ids.dim(1)?, paired, cfg)?;
    finish(hyp, &side, hyp_lengths, cfg)
}

/// Cross-entropy plus weighted BLEU loss of one training step, from the hidden states and the
/// output layer, without storing the `[B, S, V]` logits:
/// [`ce_bleu_from_logits`] of `proj.forward(hidden)`, the same values and gradients (to
/// rounding; 1e-10 in f64) for `hidden`, the weight and the bias.
///
/// One op computes both losses' per-row terms from each block of logits (one recompute in the
/// backward serves both gradients). Block sizes and gradient filtering come from
/// `cfg.hidden` ([`HiddenConfig`]); matrix references fall back to materialised logits, as in
/// [`bleu_loss_from_hidden`].
///
/// # Arguments
/// * `hidden`, `proj` - as [`cross_entropy_from_hidden`].
/// * `hyp_lengths`, `refs`, `targets`, `cfg` - as [`ce_bleu_from_logits`].
///
/// Errors as [`ce_bleu_from_logits`] and [`cross_entropy_from_hidden`] do.
///
/// ```
/// use candle_bleu::loss::{ce_bleu_from_hidden, References, TrainingLossConfig};
/// use candle_core::{DType, Device, Tensor};
/// use candle_nn::{Linear, VarBuilder, VarMap};
///
/// let dev = Device::Cpu;
/// let varmap = VarMap::new();
/// let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
/// let proj = candle_nn::linear(16, 50, vb.pp("out"))?; // D = 16 → V = 50, with a bias
/// let hidden = Tensor::randn(0f32, 1.0, (2, 5, 16), &dev)?; // the decoder's states [B, S, D]
/// let targets = Tensor::new(&[[3u32, 4, 5, 6, 2], [7, 8, 2, 0, 0]], &dev)?;
/// let refs = References::from_ids(&targets, 0)?;
/// let step = ce_bleu_from_hidden(&hidden, &proj, None, &refs, &targets, &TrainingLossConfig::default())?;
/// let grads = step.loss.backward()?;
/// assert!(grads.get(proj.weight()).is_some());
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ce_bleu_from_hidden(
    hidden: &Tensor,
    proj: &Linear,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    targets: &Tensor,
    cfg: &TrainingLossConfig,
) -> Result<TrainingLoss> {
    let TrainingLossConfig {
        bleu_weight,
        ce,
        bleu,
        hidden: hidden_cfg,
    } = cfg;
    let bleu_weight = check_bleu_weight(*bleu_weight)?;
    let inputs = HiddenInputs::new(hidden, proj, hidden_cfg)?;
    let batch_seq = (inputs.batch, inputs.seq);
    check_targets(
        targets,
        batch_seq,
        "hidden",
        &inputs.described,
        hidden.device(),
        ce,
    )?;
    score::validate_config(bleu)?;
    check_bleu_arguments(&inputs.shape(), hyp_lengths, refs, bleu)?;
    inputs.check_finite(bleu)?;
    let side = refs.side(bleu.max_order, bleu.length.eos_id(), inputs.dtype)?;
    let ReferenceTokens::Ids(ids) = &side.tokens else {
        let logits = materialised_logits(hidden, proj)?;
        return ce_bleu_from_logits(&logits, hyp_lengths, refs, targets, cfg);
    };
    let paired = bleu.form == Form::Paired;
    let gather_ids = cached_gather_ids(&side)?;
    let out = hidden_rows(
        &inputs,
        Some(gather_ids),
        Some((targets, ce)),
        paired,
        hidden_cfg,
    )?;
    let (hyp, ce_column) = split_rows(&out, ids.dim(1)?, gather_ids.dim(1)?, paired, bleu)?;
    let cross_entropy = ce_column.sum_all()?;
    let bleu_out = finish(hyp, &side, hyp_lengths, bleu)?;
    combine(cross_entropy, bleu_out, bleu_weight)
}
