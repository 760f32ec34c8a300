//! The loss of a training step that mixes cross-entropy and BLEU: [`ce_bleu_from_logits`].
//!
//! Computed apart, the two losses each read the `[B, S, V]` logits forward and each write a
//! `[B, S, V]` logits gradient backward, which candle's autograd then adds up (one more
//! `zeros_like` + `add` pass over `[B, S, V]`). Here one CPU custom op per step carries both:
//! its output holds, for every row, the gathered BLEU probabilities and the row's cross-entropy
//! term, so that its backward receives both gradients in one call and writes one logits
//! gradient.

use super::cross_entropy::{
    backward_rows, check_cross_entropy_inputs, cross_entropy_from_logits, forward_rows,
    row_cross_entropy, with_cpu_slice, CeFloat, CrossEntropyConfig, Gathered, TargetRows,
    CE_COLUMNS,
};
use super::fused::{
    contiguous_slice, dispatch_float, non_finite_error, row_exp_into, row_max_checked,
    vocab_sized_buffer, LANES,
};
use super::gemm::{matmul, MatMut, MatRef};
use super::host::CpuView;
use super::references::ReferenceTokens;
use super::{
    bleu_loss_from_logits, check_inputs, finish, fused, hypothesis_inputs_from_probs,
    with_eos_column, BleuLossConfig, BleuLossOutput, Form, HiddenConfig, HypothesisInputs,
    References,
};
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

/// The loss of a training step and its two parts.
#[derive(Debug, Clone)]
pub struct TrainingLoss {
    /// Scalar: `cross_entropy + bleu_weight · bleu.loss`; call `backward` on this one.
    pub loss: Tensor,
    /// Scalar: the mean token cross-entropy (as [`cross_entropy_from_logits`]).
    pub cross_entropy: Tensor,
    /// The BLEU loss and its statistics (as [`bleu_loss_from_logits`]).
    pub bleu: BleuLossOutput,
}

/// `[x_0 … x_{K−1} | ce | max | sum | weight]` per row: the softmax gathered at the reference
/// ids and the cross-entropy terms, from `[B, S, V]` logits, u32 `[B, K]` ids and u32 `[B, S]`
/// targets.
struct GatherCrossEntropyOp {
    cfg: CrossEntropyConfig,
}

impl GatherCrossEntropyOp {
    fn forward<T: CeFloat>(
        &self,
        logits: &[T],
        ids: &[u32],
        targets: &[u32],
        (seq, vocab, width): (usize, usize, usize),
    ) -> Result<Vec<T>> {
        let rows = TargetRows::new(targets, vocab, seq, &self.cfg)?;
        forward_rows(
            logits,
            vocab,
            Gathered {
                ids,
                width,
                rows_per_batch: seq,
            },
            &rows,
        )
    }

    fn backward<T: CeFloat>(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<Tensor> {
        let (_, seq, vocab) = logits.dims3()?;
        let width = ids.dim(1)?;
        let grad = with_cpu_slice::<T, _>(logits, "logits", |logits_data| {
            with_cpu_slice::<u32, _>(ids, "ids", |id_data| {
                with_cpu_slice::<u32, _>(targets, "targets", |target_data| {
                    let rows = TargetRows::new(target_data, vocab, seq, &self.cfg)?;
                    with_cpu_slice::<T, _>(out, "output", |out_data| {
                        with_cpu_slice::<T, _>(grad_out, "gradient", |grad_data| {
                            Ok(backward_rows(
                                logits_data,
                                vocab,
                                Gathered {
                                    ids: id_data,
                                    width,
                                    rows_per_batch: seq,
                                },
                                &rows,
                                out_data,
                                grad_data,
                            ))
                        })
                    })
                })
            })
        })?;
        Tensor::from_vec(grad, logits.shape(), logits.device())
    }
}

impl CustomOp3 for GatherCrossEntropyOp {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-gather-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
        targets: &CpuStorage,
        targets_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let (_, width) = ids_layout.shape().dims2()?;
        let ids = contiguous_slice::<u32>(ids, ids_layout, "ids")?;
        let targets = contiguous_slice::<u32>(targets, targets_layout, "targets")?;
        let dims = (seq, vocab, width);
        let out = dispatch_float!(logits.dtype(), "ce_bleu_from_logits", <T> => {
            let logits = contiguous_slice::<T>(logits, logits_layout, "logits")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.forward(logits, ids, targets, dims)?))
        })?;
        Ok((out, Shape::from((batch, seq, width + CE_COLUMNS))))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = dispatch_float!(logits.dtype(), "ce_bleu_from_logits backward", <T> => {
            self.backward::<T>(logits, ids, targets, out, grad_out)
        })?;
        Ok((Some(grad), None, None))
    }
}

/// `[Z | X | ce | max | sum | weight]` per row, for the paired form: the hypothesis self-match
/// `Z = P Pᵀ` (`S` columns), `P` gathered at the reference ids (`K`) and the cross-entropy terms.
struct SelfMatchCrossEntropyOp {
    cfg: CrossEntropyConfig,
}

impl SelfMatchCrossEntropyOp {
    fn forward<T: CeFloat + 'static>(
        &self,
        logits: &[T],
        ids: &[u32],
        targets: &[u32],
        (_, seq, vocab, width): (usize, usize, usize, usize),
    ) -> Result<Vec<T>> {
        let rows = TargetRows::new(targets, vocab, seq, &self.cfg)?;
        let gathered = Gathered {
            ids,
            width,
            rows_per_batch: seq,
        };
        let mut out = vec![T::ZERO; logits.len() / vocab * (seq + width + CE_COLUMNS)];
        self_match_forward_into(logits, vocab, gathered, &rows, 0, &mut out)?;
        Ok(out)
    }

    fn backward<T: CeFloat + 'static>(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<Tensor> {
        let (_, seq, vocab) = logits.dims3()?;
        let width = ids.dim(1)?;
        let (logits_c, ids, targets) = (
            logits.contiguous()?,
            ids.contiguous()?,
            targets.contiguous()?,
        );
        let (out, grad_out) = (out.contiguous()?, grad_out.contiguous()?);
        let views = [
            CpuView::new(&logits_c, "logits")?,
            CpuView::new(&ids, "ids")?,
            CpuView::new(&targets, "targets")?,
            CpuView::new(&out, "output")?,
            CpuView::new(&grad_out, "gradient")?,
        ];
        let rows = TargetRows::new(views[2].slice::<u32>()?, vocab, seq, &self.cfg)?;
        let gathered = Gathered {
            ids: views[1].slice::<u32>()?,
            width,
            rows_per_batch: seq,
        };
        let logits_data = views[0].slice::<T>()?;
        let mut grad = vocab_sized_buffer::<T>(logits_data.len());
        self_match_backward_into(
            logits_data,
            vocab,
            gathered,
            &rows,
            0,
            views[3].slice::<T>()?,
            views[4].slice::<T>()?,
            &mut grad,
        );
        Tensor::from_vec(grad, logits.shape(), logits.device())
    }
}

/// The self-match pass over the rows `first_row..` of whole batch elements (`logits` holds a
/// multiple of `S = gathered.rows_per_batch` rows), into `out`, one row per logits row:
/// `[Z_0 … Z_{S−1} | x_0 … x_{K−1} | ce | max | sum | weight]`, with `Z = P Pᵀ` within each
/// element, `x_k` the softmax at the gathered ids and the cross-entropy columns of
/// [`forward_rows`](super::cross_entropy::forward_rows).
pub(crate) fn self_match_forward_into<T: CeFloat + 'static>(
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
    let stride = seq + width + CE_COLUMNS;
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
            let (max, finite) = row_max_checked(row);
            if !finite {
                all_finite.store(false, Ordering::Relaxed);
                return;
            }
            let sum = row_exp_into(row, max, p);
            let inv_sum = T::ONE / sum;
            let mut logit_sum = T::ZERO;
            for (pv, &x) in p.iter_mut().zip(row) {
                *pv *= inv_sum;
                if with_logit_sum {
                    logit_sum += x;
                }
            }
            for (o, &id) in out_row[seq..seq + width]
                .iter_mut()
                .zip(gathered.row_ids(row_index))
            {
                *o = p[id as usize];
            }
            let ce = &mut out_row[seq + width..];
            ce[0] = row_cross_entropy(row, rows, row_index, (max, sum, logit_sum));
            ce[1] = max;
            ce[2] = sum;
            ce[3] = T::from_f64(rows.weight(row_index));
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
/// sparse part in the last) and `h`, `w` as in
/// [`backward_rows`](super::cross_entropy::backward_rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn self_match_backward_into<T: CeFloat + 'static>(
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
    let stride = seq + width + CE_COLUMNS;
    let eps = rows.label_smoothing;
    // P again, from the logits and each row's max and sum kept in the output.
    let mut probs = vocab_sized_buffer::<T>(logits.len());
    probs
        .par_chunks_mut(vocab)
        .zip(logits.par_chunks(vocab))
        .enumerate()
        .for_each(|(local, (p, row))| {
            let stats = &out[local * stride + seq + width..][..CE_COLUMNS];
            let (max, inv_sum) = (stats[1], T::ONE / stats[2]);
            for (pv, &x) in p.iter_mut().zip(row) {
                *pv = T::exp_nonpositive(x - max) * inv_sum;
            }
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
            let row_ids = gathered.row_ids(row_index);
            let grads = &grad_out[local * stride..][..stride];
            let stats = &out[local * stride..][..stride];
            let sparse = &grads[seq..seq + width];
            let ce_grad = grads[seq + width] * stats[seq + width + 3];
            let mut dot_lanes = [T::ZERO; LANES];
            let p_chunks = p.chunks_exact(LANES);
            let d_chunks = g.chunks_exact(LANES);
            let (p_rest, d_rest) = (p_chunks.remainder(), d_chunks.remainder());
            for (pc, dc) in p_chunks.zip(d_chunks) {
                for lane in 0..LANES {
                    dot_lanes[lane] += pc[lane] * dc[lane];
                }
            }
            let mut dot = T::ZERO;
            for lane in dot_lanes {
                dot += lane;
            }
            for (&a, &b) in p_rest.iter().zip(d_rest) {
                dot += a * b;
            }
            for (&id, &s) in row_ids.iter().zip(sparse) {
                dot += p[id as usize] * s;
            }
            let shift = ce_grad - dot;
            let offset = T::ZERO - ce_grad * T::from_f64(eps / vocab as f64);
            for (o, &pv) in g.iter_mut().zip(p) {
                *o = pv * (*o + shift) + offset;
            }
            if let Some(target) = rows.target(row_index) {
                g[target as usize] += T::ZERO - ce_grad * T::from_f64(1.0 - eps);
            }
            for (&id, &s) in row_ids.iter().zip(sparse) {
                g[id as usize] += p[id as usize] * s;
            }
        });
}

impl CustomOp3 for SelfMatchCrossEntropyOp {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-self-match-cross-entropy"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        ids: &CpuStorage,
        ids_layout: &Layout,
        targets: &CpuStorage,
        targets_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let (_, width) = ids_layout.shape().dims2()?;
        let ids = contiguous_slice::<u32>(ids, ids_layout, "ids")?;
        let targets = contiguous_slice::<u32>(targets, targets_layout, "targets")?;
        let dims = (batch, seq, vocab, width);
        let out = dispatch_float!(logits.dtype(), "ce_bleu_from_logits (paired)", <T> => {
            let logits = contiguous_slice::<T>(logits, logits_layout, "logits")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.forward(logits, ids, targets, dims)?))
        })?;
        Ok((out, Shape::from((batch, seq, seq + width + CE_COLUMNS))))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        ids: &Tensor,
        targets: &Tensor,
        out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let grad = dispatch_float!(logits.dtype(), "ce_bleu_from_logits (paired) backward", <T> => {
            self.backward::<T>(logits, ids, targets, out, grad_out)
        })?;
        Ok((Some(grad), None, None))
    }
}

/// The token matches (and EOS probabilities) from the gathered columns `[X | eos]`.
pub(crate) fn inputs_from_gathered(
    gathered: &Tensor,
    width: usize,
    self_match: Option<Tensor>,
    cfg: &BleuLossConfig,
) -> Result<HypothesisInputs> {
    Ok(HypothesisInputs {
        token_match: gathered.narrow(2, 0, width)?,
        eos_probs: cfg
            .length
            .eos_id()
            .map(|_| gathered.narrow(2, width, 1)?.squeeze(2))
            .transpose()?,
        hyp_self_match: self_match,
    })
}

/// Configuration of a training step's loss: `cross_entropy + bleu_weight · bleu_loss`
/// ([`ce_bleu_from_logits`]).
///
/// `Default`: `bleu_weight` 1, no padding and no label smoothing in the cross-entropy, the
/// default BLEU loss ([`BleuLossConfig::default`]), default blocks for the hidden-state path.
/// Set the fields you need and take the rest from `Default`:
///
/// ```
/// use candle_bleu::loss::{CrossEntropyConfig, TrainingLossConfig};
/// let cfg = TrainingLossConfig {
///     bleu_weight: 0.3,
///     ce: CrossEntropyConfig { pad_id: Some(0), label_smoothing: 0.1 },
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
    /// Block sizes and gradient filtering of the hidden-state entry points; the logits entry
    /// points ignore it.
    pub hidden: HiddenConfig,
}

impl Default for TrainingLossConfig {
    fn default() -> Self {
        Self {
            bleu_weight: 1.0,
            ce: CrossEntropyConfig::default(),
            bleu: BleuLossConfig::default(),
            hidden: HiddenConfig::default(),
        }
    }
}

/// Cross-entropy plus weighted BLEU loss of one training step, from the logits:
/// `loss = cross_entropy + cfg.bleu_weight · bleu.loss`.
///
/// The parts equal [`cross_entropy_from_logits`]`(logits, targets, &cfg.ce)` and
/// [`bleu_loss_from_logits`]`(logits, hyp_lengths, refs, &cfg.bleu)` computed apart, values and
/// gradients. On the CPU, with id references, one custom op reads the logits once forward
/// (every form and length model; the paired form's self-match `P Pᵀ` included) and its backward
/// writes one logits gradient for both losses. With matrix references the BLEU side needs every
/// probability: a fused softmax feeds it and the cross-entropy kernel reads the logits a second
/// time. Off the CPU, composed candle ops.
///
/// # Arguments
/// * `logits` - float `[B, S, V]`.
/// * `hyp_lengths`, `refs` - as [`bleu_loss_from_logits`].
/// * `targets` - as [`cross_entropy_from_logits`] (u32 `[B, S]`).
/// * `cfg` - the weight `λ` (finite, `>= 0`) and the two losses' configurations.
///
/// Errors as the two functions do, and on a negative or non-finite `cfg.bleu_weight`.
pub fn ce_bleu_from_logits(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    targets: &Tensor,
    cfg: &TrainingLossConfig,
) -> Result<TrainingLoss> {
    let TrainingLossConfig {
        bleu_weight,
        ce,
        bleu,
        ..
    } = cfg;
    let bleu_weight = check_bleu_weight(*bleu_weight)?;
    check_cross_entropy_inputs(logits, targets, ce)?;
    let compute_dtype = check_inputs("logits", logits, hyp_lengths, refs, bleu)?;
    let logits = logits.to_dtype(compute_dtype)?.contiguous()?;
    let combine = |cross_entropy, bleu_out| combine(cross_entropy, bleu_out, bleu_weight);
    if !logits.device().is_cpu() {
        let cross_entropy = cross_entropy_from_logits(&logits, targets, ce)?;
        let bleu_out = bleu_loss_from_logits(&logits, hyp_lengths, refs, bleu)?;
        return combine(cross_entropy, bleu_out);
    }
    let side = refs.side(bleu.max_order, bleu.length.eos_id(), compute_dtype)?;
    let targets = targets.contiguous()?;
    let (inputs, cross_entropy) = match (&side.tokens, bleu.form) {
        (ReferenceTokens::Ids(ids), Form::Expected | Form::LowerBound) => {
            let width = ids.dim(1)?;
            let gather_ids = with_eos_column(ids, bleu)?.contiguous()?;
            let gather_width = gather_ids.dim(1)?;
            let out = logits.apply_op3(&gather_ids, &targets, GatherCrossEntropyOp { cfg: *ce })?;
            let inputs = inputs_from_gathered(&out.narrow(2, 0, gather_width)?, width, None, bleu)?;
            (inputs, out.narrow(2, gather_width, 1)?.sum_all()?)
        }
        (ReferenceTokens::Ids(ids), Form::Paired) => {
            let (_, seq, _) = logits.dims3()?;
            let width = ids.dim(1)?;
            let gather_ids = with_eos_column(ids, bleu)?.contiguous()?;
            let gather_width = gather_ids.dim(1)?;
            let out =
                logits.apply_op3(&gather_ids, &targets, SelfMatchCrossEntropyOp { cfg: *ce })?;
            let self_match = out.narrow(2, 0, seq)?;
            let gathered = out.narrow(2, seq, gather_width)?;
            let inputs = inputs_from_gathered(&gathered, width, Some(self_match), bleu)?;
            (inputs, out.narrow(2, seq + gather_width, 1)?.sum_all()?)
        }
        (ReferenceTokens::Matrices(_), _) => {
            let probs = fused::softmax_last_dim(&logits)?;
            let inputs = hypothesis_inputs_from_probs(&probs, &side, bleu)?;
            (inputs, cross_entropy_from_logits(&logits, &targets, ce)?)
        }
    };
    let bleu_out = finish(inputs, &side, hyp_lengths, bleu)?;
    combine(cross_entropy, bleu_out)
}

/// `bleu_weight` if it is finite and `>= 0`, else an error naming it.
pub(crate) fn check_bleu_weight(bleu_weight: f64) -> Result<f64> {
    if !(bleu_weight.is_finite() && bleu_weight >= 0.0) {
        bail!("`bleu_weight` must be finite and >= 0, got {bleu_weight}");
    }
    Ok(bleu_weight)
}

/// `cross_entropy + bleu_weight · bleu.loss` and its parts.
pub(crate) fn combine(
    cross_entropy: Tensor,
    bleu: BleuLossOutput,
    bleu_weight: f64,
) -> Result<TrainingLoss> {
    let loss = (&cross_entropy + bleu.loss.affine(bleu_weight, 0.0)?)?;
    Ok(TrainingLoss {
        loss,
        cross_entropy,
        bleu,
    })
}
