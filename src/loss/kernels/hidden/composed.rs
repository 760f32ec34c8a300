//! The hidden-state op's rows as blocks of candle ops, for devices without its CPU kernels:
//! the outputs are computed detached, block by block, and attached to `hidden`, the weight and
//! the bias by the op ([`crate::loss::kernels::hidden::op::HiddenRowsOp`]), whose backward recomputes each block
//! as candle ops and back-propagates through that block alone — so this path keeps the
//! `O(block)` memory too. `filter_below` does not apply here: the gradients are exact.
//!
//! What a block computes from its logits is a [`BlockRows`]: [`ComposedRows`] here (a row holds
//! [`RowLayout`]'s columns without the kernels' statistics, `[Z | x | ce]`), or, given by the
//! loss's hidden pass, which sees every family, the row op's kernels on the block.

use crate::loss::kernels::composed::{softcap, token_metrics};
use crate::loss::kernels::cpu::CrossEntropyTerms;
use crate::loss::kernels::layout::RowLayout;
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, Layout, Result, Shape, Storage, Tensor, Var, D};

/// What a block of rows computes from its logits, differentiably: the per-row outputs.
pub(crate) trait BlockRows: Send + Sync {
    /// The outputs `[n, C]` of rows `start..start + n` of the `[B·S]` rows from their logits
    /// `[n, V]`. A block holds whole elements when the outputs pair positions (the self-match
    /// columns).
    fn rows(&self, logits: &Tensor, start: usize) -> Result<Tensor>;

    /// The hidden-state op's name with these rows.
    fn op_name(&self) -> &'static str;
}

/// The rows' outputs as candle ops, for devices without the CPU kernels:
/// `[Z (paired form) | x | ce]` per row, the kernels' layout without their statistics
/// ([`RowLayout::without_statistics`]).
pub(crate) struct ComposedRows {
    /// u32 `[R, width]`: each row's gathered ids.
    pub ids: Option<Tensor>,
    /// u32 `[R]` targets (padding replaced by 0) and float `[R]` weights (`1/n`, 0 at
    /// padding).
    pub targets: Option<(Tensor, Tensor)>,
    /// The cross-entropy's smoothing and z-loss scale `λ` (each row's term adds `λ·lse²`).
    pub terms: CrossEntropyTerms,
    /// The class weights `[V]` in the rows' dtype (`None`: every class 1), and the z-term's
    /// row weight over the cross-entropy's (`TargetRows::z_ratio`).
    pub class_weights: Option<Tensor>,
    pub z_ratio: f64,
    /// Logit soft-capping `c`: each block's logits become `c·tanh(z/c)` first.
    pub softcap: Option<f64>,
    /// The columns of a row: `Z` (`S` of them, paired form), the gathered ids', `ce` and the
    /// metric columns `z | correct` when it has them; no statistics.
    pub layout: RowLayout,
}

impl BlockRows for ComposedRows {
    fn op_name(&self) -> &'static str {
        "candle-bleu-loss-from-hidden-composed"
    }

    fn rows(&self, logits: &Tensor, start: usize) -> Result<Tensor> {
        let capped;
        let logits = match self.softcap {
            Some(cap) => {
                capped = softcap(logits, cap)?;
                &capped
            }
            None => logits,
        };
        let n = logits.dim(0)?;
        let mut columns = Vec::with_capacity(5);
        let mut metrics = None;
        if self.layout.paired() || self.ids.is_some() {
            let probs = candle_nn::ops::softmax(logits, D::Minus1)?;
            if let Some(seq) = self.layout.self_match {
                let element_probs = probs.reshape((n / seq, seq, ()))?;
                let self_match = element_probs.matmul(&element_probs.t()?)?;
                columns.push(self_match.reshape((n, seq))?);
            }
            if let Some(ids) = &self.ids {
                columns.push(probs.gather(&ids.narrow(0, start, n)?.contiguous()?, 1)?);
            }
        }
        columns.push(match &self.targets {
            Some((targets, weights)) => {
                let eps = self.terms.label_smoothing;
                let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
                let target_index = targets.narrow(0, start, n)?.unsqueeze(1)?.contiguous()?;
                let target_log_probs = log_probs.gather(&target_index, 1)?;
                let z_loss = self.terms.z_loss;
                let row = match &self.class_weights {
                    None => {
                        let mut row = target_log_probs.affine(-(1.0 - eps), 0.0)?;
                        if eps != 0.0 {
                            row = (row - log_probs.mean_keepdim(1)?.affine(eps, 0.0)?)?;
                        }
                        if z_loss != 0.0 {
                            let lse = logits.log_sum_exp(1)?.unsqueeze(1)?;
                            row = (row + lse.sqr()?.affine(z_loss, 0.0)?)?;
                        }
                        row
                    }
                    Some(class_weights) => {
                        // PyTorch's weighted terms; the z-term weighed by `z_ratio`.
                        let vocab = class_weights.dim(0)?;
                        let target_weights = class_weights
                            .index_select(&targets.narrow(0, start, n)?.contiguous()?, 0)?
                            .unsqueeze(1)?;
                        let mut row =
                            (target_log_probs * target_weights)?.affine(-(1.0 - eps), 0.0)?;
                        if eps != 0.0 {
                            let smooth = log_probs.broadcast_mul(class_weights)?.sum_keepdim(1)?;
                            row = (row - smooth.affine(eps / vocab as f64, 0.0)?)?;
                        }
                        if z_loss != 0.0 {
                            let lse = logits.log_sum_exp(1)?.unsqueeze(1)?;
                            row = (row + lse.sqr()?.affine(z_loss * self.z_ratio, 0.0)?)?;
                        }
                        row
                    }
                };
                let weights = weights.narrow(0, start, n)?;
                if self.layout.has_metrics() {
                    let mask = weights.ne(0.0)?.to_dtype(logits.dtype())?;
                    let targets = targets.narrow(0, start, n)?;
                    let (z, correct) = token_metrics(logits, &targets, &mask, z_loss)?;
                    metrics = Some([z.unsqueeze(1)?, correct.unsqueeze(1)?]);
                }
                row.broadcast_mul(&weights.unsqueeze(1)?)?
            }
            None => Tensor::zeros((n, 1), logits.dtype(), logits.device())?,
        });
        columns.extend(metrics.into_iter().flatten());
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

/// The blocks' outputs, computed detached block by block and attached to `hidden`, the weight
/// and the bias: the forward hands back the stored outputs; the backward recomputes each
/// block's logits and rows as candle ops and back-propagates through that block alone.
pub(crate) struct ComposedBlocks {
    out: Tensor,
    rows: Box<dyn BlockRows>,
    block_rows: usize,
}

impl ComposedBlocks {
    /// Computes the outputs of every block of `block_rows` rows, detached: the logits `[n, V]`
    /// by one matmul (cuBLAS on CUDA) and the bias, then `rows`.
    pub(crate) fn forward(
        hidden: &Tensor,
        weight: &Tensor,
        bias: Option<&Tensor>,
        rows: Box<dyn BlockRows>,
        block_rows: usize,
    ) -> Result<Self> {
        let (hidden, weight) = (hidden.detach(), weight.detach());
        let bias = bias.map(Tensor::detach);
        let rows_total = hidden.dim(0)?;
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
        Ok(Self {
            out,
            rows,
            block_rows,
        })
    }

    /// The hidden-state op's name with these blocks' rows.
    pub(crate) fn op_name(&self) -> &'static str {
        self.rows.op_name()
    }

    fn stored(&self) -> (candle_core::StorageRef<'_>, &Layout) {
        self.out.storage_and_layout()
    }

    pub(crate) fn cpu_out(&self) -> Result<(CpuStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Cpu(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
    pub(crate) fn cuda_out(&self) -> Result<(candle_core::CudaStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Cuda(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the CUDA device"),
        }
    }

    #[cfg(feature = "metal")]
    pub(crate) fn metal_out(&self) -> Result<(candle_core::MetalStorage, Shape)> {
        let (storage, layout) = self.stored();
        match &*storage {
            Storage::Metal(s) => Ok((s.try_clone(layout)?, layout.shape().clone())),
            _ => bail!("internal: the loss's stored outputs are not on the Metal device"),
        }
    }

    pub(crate) fn backward(
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
