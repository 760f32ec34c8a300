//! The hidden-state op, [`HiddenRowsOp`]: hidden rows `[B·S, D]`, the output layer's weight
//! `[V, D]` and bias `[V]` to the per-row outputs of their logits `[B·S, C]` —
//! `[Z | x | ce | …]`: the self-match columns (paired form), the softmax gathered at the ids,
//! the row's weighted cross-entropy term (0 without targets), then, from the CPU kernels, their
//! row statistics — without storing the `[B, S, V]` logits, forward or backward. One op for
//! every device: its CPU kernels ([`crate::loss::kernels::hidden::cpu`]) or, on any device,
//! blocks of candle ops ([`crate::loss::kernels::hidden::composed`]: each block's logits by a
//! matmul, then its rows as composed ops or through the row op's kernels), with `cpu_fwd`,
//! `cuda_fwd`, `metal_fwd` and `bwd` side by side.

use crate::loss::kernels::hidden::composed::ComposedBlocks;
use crate::loss::kernels::hidden::cpu::CpuBlocks;
use candle_core::{CpuStorage, CustomOp3, DType, Device, Layout, Result, Shape, Tensor};

/// The hidden-state op, on its CPU kernels or on composed candle ops.
pub(crate) struct HiddenRowsOp {
    pub blocks: HiddenBlocks,
    /// Whether the op's third input is the projection's bias or [`bias_input`]'s placeholder.
    pub has_bias: bool,
}

/// How the op computes its rows.
pub(crate) enum HiddenBlocks {
    /// Raw slices on the CPU, computed in `cpu_fwd`.
    Cpu(CpuBlocks),
    /// Blocks of candle ops on any device (composed rows, or the row op's kernels on each
    /// block), computed before the op and handed back by it.
    Composed(ComposedBlocks),
}

/// The third input of the hidden-state op: the projection's bias, or a one-element placeholder
/// (no gradient) when the layer has none, so that the op is one `CustomOp3`.
pub(crate) fn bias_input(bias: Option<&Tensor>, dtype: DType, device: &Device) -> Result<Tensor> {
    match bias {
        Some(bias) => Ok(bias.clone()),
        None => Tensor::zeros(1, dtype, device),
    }
}

impl CustomOp3 for HiddenRowsOp {
    fn name(&self) -> &'static str {
        match &self.blocks {
            HiddenBlocks::Cpu(_) => "candle-bleu-loss-from-hidden",
            HiddenBlocks::Composed(blocks) => blocks.op_name(),
        }
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
        match &self.blocks {
            HiddenBlocks::Cpu(blocks) => blocks.cpu_forward(
                (hidden, hidden_layout),
                (weight, weight_layout),
                self.has_bias.then_some((bias, bias_layout)),
            ),
            HiddenBlocks::Composed(blocks) => blocks.cpu_out(),
        }
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
        match &self.blocks {
            HiddenBlocks::Composed(blocks) => blocks.cuda_out(),
            HiddenBlocks::Cpu(_) => {
                candle_core::bail!("internal: the hidden-state CPU kernels on CUDA")
            }
        }
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
        match &self.blocks {
            HiddenBlocks::Composed(blocks) => blocks.metal_out(),
            HiddenBlocks::Cpu(_) => {
                candle_core::bail!("internal: the hidden-state CPU kernels on Metal")
            }
        }
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
        let (h, w, b) = match &self.blocks {
            HiddenBlocks::Cpu(blocks) => {
                blocks.cpu_backward(hidden, weight, bias, out, grad_out)?
            }
            HiddenBlocks::Composed(blocks) => blocks.backward(hidden, weight, bias, grad_out)?,
        };
        Ok((Some(h), Some(w), b))
    }
}
