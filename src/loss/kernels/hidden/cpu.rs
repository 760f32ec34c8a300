//! The CPU side of the hidden-state op ([`crate::loss::kernels::hidden::op::HiddenRowsOp`]): the logits
//! `H Wᵀ + b` of a block of rows computed on raw slices (gemm), passed through the row kernels
//! of [`crate::loss::kernels::cpu`] and dropped; the backward recomputes the logits, runs the row kernels'
//! backward for their gradient `G`, and turns that into `dH = G W`, `dW += Gᵀ H`,
//! `db += Σ_rows G` — in vocabulary tiles when it is exact and row by row
//! ([`CpuBlocks::backward_vocab_tiles`]), else in the forward's blocks of whole rows. With
//! gradient filtering (Cut Cross-Entropy's), tiles of `rows × vocab_tile` whose probabilities
//! all lie below `τ` skip the dense part of `G`; the bound on the error is in
//! `HiddenConfig`'s documentation. The rows' outputs have the row op's columns
//! ([`RowLayout`], held by [`RowSpec`]).

use crate::loss::host::CpuView;
use crate::loss::kernels::cpu::{
    backward_rows_into, backward_rows_tile_into, forward_rows_into, row_gradient_coefficients,
    row_max_checked, self_match_backward_into, self_match_forward_into, vocab_sized_buffer,
    CrossEntropyTerms, Gathered, TargetRows,
};
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use crate::loss::kernels::gemm::{matmul, MatMut, MatRef};
use crate::loss::kernels::layout::RowLayout;
use crate::loss::kernels::softcap::{softcap_backward_in_place, softcap_in_place};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// What one call's rows compute besides the softmax statistics, owned by the CPU op: plain
/// values the loss's validation has checked (ids and targets `< V`, `inv_count = 1/n`).
pub(crate) struct RowSpec {
    /// u32 `[B, layout.gathered]`: the gathered ids of each element (reference ids, then EOS).
    pub ids: Vec<u32>,
    /// The output rows' columns: the self-match `Z` of the paired form, the gathered ids', the
    /// cross-entropy and its statistics ([`RowLayout::rows`] or [`RowLayout::self_match`]).
    pub layout: RowLayout,
    /// u32 `[B·S]` cross-entropy targets; `None` for the BLEU loss alone.
    pub targets: Option<Vec<u32>>,
    /// The cross-entropy's padding id, smoothing, z-loss and metrics (defaults without
    /// targets).
    pub terms: CrossEntropyTerms,
    pub inv_count: f64,
    /// The z-term's row weight over the cross-entropy's (`TargetRows::z_ratio`).
    pub z_ratio: f64,
    pub seq: usize,
    pub vocab: usize,
}

impl RowSpec {
    fn gathered(&self) -> Gathered<'_> {
        Gathered {
            ids: &self.ids,
            width: self.layout.gathered,
            rows_per_batch: self.seq,
        }
    }

    fn target_rows(&self) -> TargetRows<'_> {
        match &self.targets {
            Some(targets) => TargetRows::new(targets, &self.terms, self.inv_count, self.z_ratio),
            None => TargetRows::none(),
        }
    }
}

/// The error for NaN or Inf among the logits the op computes.
fn non_finite_logits() -> candle_core::Error {
    candle_core::Error::Msg(
        "the logits `hidden · proj.weightᵀ + proj.bias` contain NaN or infinite values; the loss needs finite logits".into(),
    )
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

impl<T: KernelFloat> Gradients<T> {
    fn zeros(rows: usize, dim: usize, vocab: usize, has_bias: bool) -> Self {
        Self {
            hidden: vec![T::ZERO; rows * dim],
            weight: vec![T::ZERO; vocab * dim],
            bias: has_bias.then(|| vec![T::ZERO; vocab]),
        }
    }
}

/// The CPU side of the hidden-state op: `[R, D]` hidden rows, the `[V, D]` weight (and the
/// `[V]` bias) to the rows' outputs `[R, stride]` — the same layout as the logits entry points'
/// kernels write — in blocks of `block_rows` rows, on raw slices (gemm + the row kernels).
pub(crate) struct CpuBlocks {
    pub spec: RowSpec,
    pub block_rows: usize,
    /// The most logits one block holds; the exact backward's tiles (`rows × columns`) hold at
    /// most this many, or one `rows × vocab_tile` tile where that is more.
    pub block_elements: usize,
    /// Vocabulary columns per tile of the backward: the unit that gradient filtering skips, and
    /// the narrowest tile of the exact backward.
    pub vocab_tile: usize,
    /// Gradient filtering's threshold `τ` (`None`: exact gradients).
    pub filter_below: Option<f64>,
    /// Logit soft-capping `c` (`z ← c·tanh(z/c)` right after each block's product; `None`:
    /// off). The validation refuses it with filtering, whose skipped tiles assume `dz/dz = 1`.
    pub softcap: Option<f64>,
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
        let (vocab, stride) = (spec.vocab, spec.layout.stride());
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
            if let Some(cap) = self.softcap {
                if !softcap_in_place(logits, cap) {
                    return Err(non_finite_logits());
                }
            }
            let out = &mut out[start * stride..][..n * stride];
            let pass = if spec.layout.paired() {
                self_match_forward_into(logits, vocab, gathered, &target_rows, start, out)
            } else {
                forward_rows_into(logits, vocab, gathered, &target_rows, start, out)
            };
            pass.map_err(|_| non_finite_logits())?;
        }
        Ok(out)
    }

    /// The backward: vocabulary tiles when it is exact and row by row
    /// ([`Self::backward_vocab_tiles`]), else blocks of whole rows
    /// ([`Self::backward_row_blocks`]: the paired form's self-match needs whole rows, and
    /// filtering skips tiles of a block).
    fn backward<T: KernelFloat + 'static>(
        &self,
        hidden: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        out: &[T],
        grad_out: &[T],
        dim: usize,
    ) -> Gradients<T> {
        // The paired form is not filtered (see `HiddenConfig`).
        if self.spec.layout.paired() || self.filter_below.is_some() {
            self.backward_row_blocks(hidden, weight, bias, out, grad_out, dim)
        } else {
            self.backward_vocab_tiles(hidden, weight, bias, out, grad_out, dim)
        }
    }

    /// The backward in blocks of whole vocabulary rows: each block's logits recomputed, the row
    /// kernel's backward (or the self-match's) for their gradient `G_blk`, gradient filtering's
    /// skipped tiles, then `dH_blk = G_blk W`, `dW += G_blkᵀ H_blk`, `db += Σ_rows G_blk`.
    fn backward_row_blocks<T: KernelFloat + 'static>(
        &self,
        hidden: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        out: &[T],
        grad_out: &[T],
        dim: usize,
    ) -> Gradients<T> {
        let spec = &self.spec;
        let (vocab, stride) = (spec.vocab, spec.layout.stride());
        let rows = hidden.len() / dim;
        let block = self.block_rows.min(rows);
        let (gathered, target_rows) = (spec.gathered(), spec.target_rows());
        let mut grads = Gradients::zeros(rows, dim, vocab, bias.is_some());
        // The paired form is not filtered (see `HiddenConfig`).
        let filter = self.filter_below.filter(|_| !spec.layout.paired());
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
            (filter.is_some() && spec.targets.is_some() && spec.terms.label_smoothing != 0.0)
                .then(|| weight_tile_sums(weight, dim, &tiles));
        let mut logits = vocab_sized_buffer::<T>(block * vocab);
        let mut grad_logits = vocab_sized_buffer::<T>(block * vocab);
        for start in (0..rows).step_by(block) {
            let n = block.min(rows - start);
            let logits = &mut logits[..n * vocab];
            let grad_logits = &mut grad_logits[..n * vocab];
            let hidden_block = &hidden[start * dim..][..n * dim];
            block_logits(hidden_block, weight, bias, (n, dim, vocab), logits);
            if let Some(cap) = self.softcap {
                // Finite: the forward checked these logits.
                softcap_in_place(logits, cap);
            }
            let out = &out[start * stride..][..n * stride];
            let grad_out = &grad_out[start * stride..][..n * stride];
            if spec.layout.paired() {
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
            if let Some(cap) = self.softcap {
                softcap_backward_in_place(grad_logits, logits, cap);
            }
            if let Some(tau) = filter {
                mark_skipped(
                    logits,
                    out,
                    (stride, spec.layout.gathered, vocab),
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

    /// The exact backward of the row pass, walking the vocabulary in tiles: for each block of
    /// rows and each tile of columns `v0..v0 + len`, the tile's logits `H_blk W_tileᵀ + b_tile`,
    /// their gradient `G_tile` (the row kernel's, element for element), then
    /// `dH_blk += G_tile W_tile`, `dW_tile (+)= G_tileᵀ H_blk`, `db_tile += Σ_rows G_tile`.
    ///
    /// Why tiles: a block of whole vocabulary rows holds `block_elements / V` rows (131 at
    /// `V = 128 000`), and each block reads `W` twice and reads and writes `dW` — `[V, D]`
    /// each — so the backward moved `4 · (R / rows per block)` weight-sized arrays. Tiles of
    /// `block_elements / R` columns (at least `vocab_tile`) keep every row in one block where
    /// the budget allows: `W` is read twice and `dW` written once, and what is accumulated
    /// across tiles is `dH_blk`, `[rows, D]`. The row coefficients (`scale`, `offset`) come
    /// from the forward's outputs, so a tile needs no other tile, and each element of `G` is
    /// the row kernel's formula on its logit; the results differ from
    /// [`Self::backward_row_blocks`] in rounding only (the products are summed in other
    /// groupings), which the unit tests bound.
    fn backward_vocab_tiles<T: KernelFloat + 'static>(
        &self,
        hidden: &[T],
        weight: &[T],
        bias: Option<&[T]>,
        out: &[T],
        grad_out: &[T],
        dim: usize,
    ) -> Gradients<T> {
        let spec = &self.spec;
        let (vocab, stride) = (spec.vocab, spec.layout.stride());
        let rows = hidden.len() / dim;
        let (gathered, target_rows) = (spec.gathered(), spec.target_rows());
        let tile = vocab.min((self.block_elements / rows.max(1)).max(self.vocab_tile));
        let block = rows.min((self.block_elements / tile).max(1)).max(1);
        let mut grads = Gradients::zeros(rows, dim, vocab, bias.is_some());
        let mut logits = vocab_sized_buffer::<T>(block * tile);
        let mut grad_logits = vocab_sized_buffer::<T>(block * tile);
        let weight_rows = MatRef::row_major(weight, vocab, dim);
        for start in (0..rows).step_by(block) {
            let n = block.min(rows - start);
            let hidden_rows = &hidden[start * dim..][..n * dim];
            let hidden_block = MatRef::row_major(hidden_rows, n, dim);
            let out = &out[start * stride..][..n * stride];
            let grad_out = &grad_out[start * stride..][..n * stride];
            for v0 in (0..vocab).step_by(tile) {
                let len = tile.min(vocab - v0);
                let logits = &mut logits[..n * len];
                let grad_logits = &mut grad_logits[..n * len];
                // The tile's weight rows `v0..v0 + len` are contiguous in the `[V, D]` weight.
                block_logits(
                    hidden_rows,
                    &weight[v0 * dim..][..len * dim],
                    bias.map(|b| &b[v0..v0 + len]),
                    (n, dim, len),
                    logits,
                );
                if let Some(cap) = self.softcap {
                    softcap_in_place(logits, cap);
                }
                backward_rows_tile_into(
                    logits,
                    (v0, len),
                    vocab,
                    gathered,
                    &target_rows,
                    start,
                    out,
                    grad_out,
                    grad_logits,
                );
                if let Some(cap) = self.softcap {
                    softcap_backward_in_place(grad_logits, logits, cap);
                }
                let grad_tile = MatRef::row_major(&*grad_logits, n, len);
                matmul(
                    MatMut::row_major(&mut grads.hidden[start * dim..][..n * dim], n, dim),
                    grad_tile,
                    weight_rows.rows(v0, len),
                    v0 > 0,
                );
                matmul(
                    MatMut::row_major(&mut grads.weight, vocab, dim).rows(v0, len),
                    grad_tile.t(),
                    hidden_block,
                    start > 0,
                );
                if let Some(grad_bias) = &mut grads.bias {
                    add_column_sums(grad_logits, len, (0, len), &mut grad_bias[v0..v0 + len]);
                }
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
        let (vocab, stride, width) = (spec.vocab, spec.layout.stride(), spec.layout.gathered);
        let eps = spec.terms.label_smoothing;
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
            let (_, offset, ce_grad) =
                row_gradient_coefficients(stats, grads_r, width, (&target_rows, row), vocab);
            let hidden_r = &block.hidden_block[r * dim..][..dim];
            let grad_hidden_r = &mut grad_hidden[r * dim..][..dim];
            if offset != T::ZERO {
                if let Some(sum) = &skipped_weight_sum {
                    axpy(grad_hidden_r, offset, sum);
                }
                axpy(&mut offset_hidden, offset, hidden_r);
                offset_total += offset;
            }
            let target_grad = target_rows.target_coefficient(ce_grad, row);
            let target_term = target_rows
                .target(row)
                .map(|t| (t, T::ZERO - target_grad * T::from_f64(1.0 - eps)));
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
        Ok((out, Shape::from((rows, self.spec.layout.stride()))))
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
    let layout = RowLayout::rows(width);
    let thresholds: Vec<T> = out
        .chunks_exact(stride)
        .map(|row| {
            let (max, sum) = (
                row[layout.max_column()].to_f64(),
                row[layout.sum_column()].to_f64(),
            );
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in `[-scale, scale)`.
    fn values(count: usize, scale: f64, phase: f64) -> Vec<f64> {
        (0..count)
            .map(|i| scale * (((i as f64 + phase) * 0.618_033_988_749).fract() * 2.0 - 1.0))
            .collect()
    }

    /// The largest `|a − b|` relative to the largest `|a|`.
    fn relative_difference(a: &[f64], b: &[f64]) -> f64 {
        assert_eq!(a.len(), b.len());
        let scale = a.iter().fold(0f64, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(scale > 0.0, "an all-zero gradient tests nothing");
        diff / scale
    }

    /// The vocabulary-tiled backward against the whole-row blocks, in f64, over tile widths
    /// that do and do not divide `V`, budgets of one and several row blocks, with and without
    /// the bias, targets (padding, label smoothing) and gathered ids.
    #[test]
    fn vocab_tiles_match_row_blocks() {
        let (batch, seq, dim, vocab, width) = (3, 5, 7, 37, 4);
        let rows = batch * seq;
        let hidden = values(rows * dim, 1.3, 0.1);
        let weight = values(vocab * dim, 0.9, 0.2);
        let bias_values = values(vocab, 0.5, 0.3);
        let ids: Vec<u32> = (0..batch * width)
            .map(|i| ((i * 11 + 3) % vocab) as u32)
            .collect();
        let targets: Vec<u32> = (0..rows).map(|i| ((i * 7 + 1) % vocab) as u32).collect();
        let mut cases = 0;
        for with_targets in [false, true] {
            for with_bias in [false, true] {
                let spec = || RowSpec {
                    ids: ids.clone(),
                    layout: RowLayout::rows(width),
                    targets: with_targets.then(|| targets.clone()),
                    terms: CrossEntropyTerms {
                        pad_id: with_targets.then_some(targets[2]),
                        label_smoothing: if with_targets { 0.1 } else { 0.0 },
                        ..Default::default()
                    },
                    inv_count: 1.0 / rows as f64,
                    z_ratio: 1.0,
                    seq,
                    vocab,
                };
                let bias = with_bias.then_some(&bias_values[..]);
                let reference = CpuBlocks {
                    spec: spec(),
                    block_rows: 4,
                    block_elements: 4 * vocab,
                    vocab_tile: vocab,
                    filter_below: None,
                    softcap: None,
                };
                let out = reference.forward(&hidden, &weight, bias, dim).unwrap();
                let grad_out = values(out.len(), 0.7, 0.4);
                let expected =
                    reference.backward_row_blocks(&hidden, &weight, bias, &out, &grad_out, dim);
                // (block_elements, vocab_tile): one tile of whole rows in one block; tiles of
                // 8 (not dividing 37) in one block; tiles of 10 in blocks of 3 rows; tiles of
                // 10 in blocks of 4 rows (the last of 3); a budget below one tile (blocks of
                // one row); tiles of 1.
                for (block_elements, vocab_tile) in [
                    (rows * vocab, 64),
                    (rows * 8, 8),
                    (30, 10),
                    (40, 10),
                    (5, 10),
                    (rows, 1),
                ] {
                    let tiled = CpuBlocks {
                        spec: spec(),
                        block_rows: 4,
                        block_elements,
                        vocab_tile,
                        filter_below: None,
                        softcap: None,
                    };
                    let got =
                        tiled.backward_vocab_tiles(&hidden, &weight, bias, &out, &grad_out, dim);
                    let case = format!(
                        "targets {with_targets}, bias {with_bias}, budget {block_elements}, tile {vocab_tile}"
                    );
                    for (name, a, b) in [
                        ("hidden", &expected.hidden, &got.hidden),
                        ("weight", &expected.weight, &got.weight),
                    ] {
                        let rel = relative_difference(a, b);
                        assert!(rel < 1e-13, "{case}: d{name} differs by {rel:e}");
                    }
                    match (&expected.bias, &got.bias) {
                        (Some(a), Some(b)) => {
                            let rel = relative_difference(a, b);
                            assert!(rel < 1e-13, "{case}: dbias differs by {rel:e}");
                        }
                        (None, None) => {}
                        _ => panic!("{case}: the bias gradient is missing on one side"),
                    }
                    cases += 1;
                }
            }
        }
        assert_eq!(cases, 24);
    }
}
