//! The CPU side of the hidden-state op ([`super::hidden::HiddenRowsOp`]): the logits
//! `H Wᵀ + b` of a block of rows computed on raw slices (gemm), passed through the row kernels
//! of [`super::cpu`] and dropped; the backward recomputes each block's logits, runs the row
//! kernels' backward for its logits gradient `G`, and turns that into `dH = G W`,
//! `dW += Gᵀ H`, `db += Σ_rows G`. With gradient filtering (Cut Cross-Entropy's), tiles of
//! `rows × vocab_tile` whose probabilities all lie below `τ` skip the dense part of `G`; the
//! bound on the error is in `HiddenConfig`'s documentation.

use super::cpu::{
    backward_rows_into, forward_rows_into, row_gradient_coefficients, row_max_checked,
    self_match_backward_into, self_match_forward_into, vocab_sized_buffer, Gathered, TargetRows,
    CE_COLUMNS,
};
use super::float::KernelFloat;
use super::gemm::{matmul, MatMut, MatRef};
use super::{contiguous_slice, dispatch_float};
use crate::loss::host::CpuView;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// What one call's rows compute besides the softmax statistics, owned by the CPU op: plain
/// values the loss's validation has checked (ids and targets `< V`, `inv_count = 1/n`).
pub(crate) struct RowSpec {
    /// u32 `[B, width]`: the gathered ids of each element (reference ids, then EOS).
    pub ids: Vec<u32>,
    pub width: usize,
    /// u32 `[B·S]` cross-entropy targets; `None` for the BLEU loss alone.
    pub targets: Option<Vec<u32>>,
    pub pad_id: Option<u32>,
    pub label_smoothing: f64,
    pub inv_count: f64,
    pub seq: usize,
    pub vocab: usize,
    /// The self-match pass (`Z = P Pᵀ` columns first) instead of the row pass.
    pub paired: bool,
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

    pub(crate) fn stride(&self) -> usize {
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

/// The CPU side of the hidden-state op: `[R, D]` hidden rows, the `[V, D]` weight (and the
/// `[V]` bias) to the rows' outputs `[R, stride]` — the same layout as the logits entry points'
/// kernels write — in blocks of `block_rows` rows, on raw slices (gemm + the row kernels).
pub(crate) struct CpuBlocks {
    pub spec: RowSpec,
    pub block_rows: usize,
    /// Vocabulary columns per tile of the backward, the unit that gradient filtering skips.
    pub vocab_tile: usize,
    /// Gradient filtering's threshold `τ` (`None`: exact gradients).
    pub filter_below: Option<f64>,
}

impl CpuBlocks {
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

    pub(crate) fn cpu_forward(
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

    pub(crate) fn cpu_backward(
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

/// One block's view for [`CpuBlocks::skipped_tile_terms`].
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
