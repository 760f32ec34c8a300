//! The loss's custom op over the logits, [`RowOp`], whose three passes share one backward op,
//! [`RowOpBackward`], of the same shape; the per-row output of each pass is
//! [`RowLayout`](super::layout::RowLayout)'s (`[x | ce | max | sum | weight]`, the same after
//! the self-match `Z` columns, or every probability for [`Pass::Softmax`]).
//!
//! Each op has its `cpu_fwd` (the slice kernels of [`cpu`](super::cpu)) and its `cuda_fwd`
//! (the `cuda` module, `kernels.cu`, behind the `cuda` feature, given the op's
//! parameters as a `cuda::RowArgsIn`, so that it imports nothing of this file)
//! side by side; the forward op's `bwd` only applies the backward op. Whether the kernels or
//! composed candle ops run is decided in one place, the loss's `dispatch::Path`. The kernels
//! take plain parameters (ids, targets, `1/n`) that the loss's validation has checked: they
//! check nothing themselves, except that the CPU kernels report a non-finite logit they meet in
//! their pass. Also here: [`GatherIds`], the f32/f64 dispatch `dispatch_float!` and
//! [`contiguous_slice`] that every CPU op of the kernels uses, and [`cuda_kernels_loaded`].

use super::cpu::{self, CrossEntropyTerms, Gathered, TargetRows};
#[cfg(feature = "cuda")]
use super::cuda;
use super::float::KernelFloat;
#[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
use super::launch;
use super::layout::{Pass, RowLayout};
use crate::loss::host::CpuView;
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape,
    Tensor,
};

/// Whether the CUDA kernels run on `device`: built with the `cuda` feature, a CUDA
/// device, and the kernels compiled and loaded (a failure to compile or load warns once, then
/// the composed ops run).
#[cfg(feature = "cuda")]
pub(crate) fn cuda_kernels_loaded(device: &candle_core::Device) -> bool {
    let candle_core::Device::Cuda(cuda_device) = device else {
        return false;
    };
    cuda::load(&cuda::ROW_MODULE, cuda_device)
}

/// Without the `cuda` feature, CUDA tensors take the composed ops.
#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_kernels_loaded(_device: &candle_core::Device) -> bool {
    false
}

/// The one f32/f64 dispatch of the CPU kernels: `<T> => body` evaluates the body with `T` the
/// kernel's float type for `$dtype`; another dtype is an error naming the operation.
macro_rules! dispatch_float {
    ($dtype:expr, $what:expr, <$float:ident> => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $float = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $float = f64;
                $body
            }
            other => Err($crate::loss::kernels::row_op::unsupported_dtype(
                $what, other,
            )),
        }
    };
}
pub(crate) use dispatch_float;

pub(crate) fn unsupported_dtype(what: &str, dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{what}: the CPU kernel takes f32 or f64 `logits`, got {dtype:?}"
    ))
}

/// The contiguous data of a CPU storage under `layout`.
pub(crate) fn contiguous_slice<'a, T: candle_core::WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [T]> {
    let data = storage.as_slice::<T>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("`{what}`: the kernel needs a contiguous tensor"),
    }
}

/// Bit 31 of a first-occurrence link: the position is its id's first in the row.
const FIRST: u32 = 1 << 31;
/// A link's low 31 bits when no later position holds the same id.
const NONE: u32 = FIRST - 1;

/// u32 `[B, K]` ids a pass gathers at, and their first-occurrence links (u32 `[B, K]`): for
/// position `k` of a row, the next position with the same id in the low 31 bits (or all ones)
/// and in bit 31 whether `k` is the id's first position. Built once on the host (the loss's
/// references cache theirs), so that the CUDA backward writes each id's gradient once, with no
/// atomics, in `O(K)` per row.
#[derive(Debug, Clone)]
pub(crate) struct GatherIds {
    pub ids: Tensor,
    pub links: Tensor,
}

impl GatherIds {
    /// From row-major host ids of shape `(batch, width)`, on `device`.
    pub(crate) fn from_host(
        ids: &[u32],
        (batch, width): (usize, usize),
        device: &candle_core::Device,
    ) -> Result<Self> {
        if width >= NONE as usize {
            bail!("{width} ids per row exceed the kernels' limit of 2^31 - 1");
        }
        let mut links = vec![NONE; ids.len()];
        for (row, row_links) in ids.chunks(width.max(1)).zip(links.chunks_mut(width.max(1))) {
            let mut next = std::collections::HashMap::new();
            for k in (0..row.len()).rev() {
                row_links[k] = next.insert(row[k], k as u32).unwrap_or(NONE);
            }
            for &k in next.values() {
                row_links[k as usize] |= FIRST;
            }
        }
        Ok(Self {
            ids: Tensor::from_vec(ids.to_vec(), (batch, width), device)?,
            links: Tensor::from_vec(links, (batch, width), device)?,
        })
    }
}

/// A pass over the rows of `[B, S, V]` logits (any rank for [`Pass::Softmax`]), with the ids to
/// gather at (u32 `[B, K]`) and the cross-entropy targets (u32 `[B, S]`) it reads besides them.
/// Apply it with [`RowOp::apply`]; the ids and targets must have been validated against the
/// logits by the caller (their values are checked by the CPU kernel: targets in the vocabulary
/// or padding).
#[derive(Clone)]
pub(crate) struct RowOp {
    pass: Pass,
    ids: Option<Tensor>,
    /// The first-occurrence links of `ids` ([`GatherIds`]), for the CUDA backward.
    #[cfg_attr(
        not(any(feature = "cuda", all(test, feature = "cuda-emu"))),
        allow(dead_code)
    )]
    links: Option<Tensor>,
    targets: Option<Tensor>,
    ce: CrossEntropyTerms,
    /// `1 / n` for the `n` non-pad targets, counted by the caller (0 without targets).
    inv_count: f64,
    /// The z-term's row weight over the cross-entropy's (`TargetRows::z_ratio`; 1 without
    /// targets).
    z_ratio: f64,
}

impl RowOp {
    /// The row pass or the self-match pass (`self_match`), gathering at `ids` when given and
    /// computing the cross-entropy against checked `targets` when given: every target `< V` or
    /// the padding id, and `inv_count` `1 / n` for the `n` non-pad ones.
    pub(crate) fn rows(
        self_match: bool,
        gather: Option<&GatherIds>,
        targets: Option<(&Tensor, CrossEntropyTerms, f64, f64)>,
    ) -> Result<Self> {
        Ok(Self {
            pass: if self_match {
                Pass::SelfMatch
            } else {
                Pass::Rows
            },
            ids: gather.map(|g| g.ids.contiguous()).transpose()?,
            links: gather.map(|g| g.links.contiguous()).transpose()?,
            targets: targets
                .as_ref()
                .map(|(t, _, _, _)| t.contiguous())
                .transpose()?,
            inv_count: targets
                .as_ref()
                .map_or(0.0, |(_, _, inv_count, _)| *inv_count),
            z_ratio: targets.as_ref().map_or(1.0, |(_, _, _, z_ratio)| *z_ratio),
            ce: targets.map(|(_, terms, _, _)| terms).unwrap_or_default(),
        })
    }

    /// A softmax over the last dimension.
    pub(crate) fn softmax() -> Self {
        Self {
            pass: Pass::Softmax,
            ids: None,
            links: None,
            targets: None,
            ce: CrossEntropyTerms::default(),
            inv_count: 0.0,
            z_ratio: 1.0,
        }
    }

    /// The columns of each output row over elements of `seq` rows (see [`RowLayout`]).
    pub(crate) fn layout(&self, seq: usize) -> Result<RowLayout> {
        let width = match &self.ids {
            Some(ids) => ids.dim(1)?,
            None => 0,
        };
        let metrics = self.pass != Pass::Softmax && self.ce.metrics();
        Ok(RowLayout::of_pass(self.pass, seq, width).with_metrics(metrics))
    }

    /// The op on `logits`, differentiable with respect to them.
    pub(crate) fn apply(self, logits: &Tensor) -> Result<Tensor> {
        logits.contiguous()?.apply_op1(self)
    }

    /// What the CUDA kernels read of the op on logits of shape `logits`: its parameters and
    /// the output layout.
    #[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
    pub(crate) fn cuda_args(&self, logits: &Shape) -> Result<launch::RowArgsIn<'_>> {
        let seq = match self.pass {
            Pass::Softmax => 1,
            _ => logits.dims3()?.1.max(1),
        };
        Ok(launch::RowArgsIn {
            pass: self.pass,
            layout: self.layout(seq)?,
            ids: self.ids.as_ref(),
            links: self.links.as_ref(),
            targets: self.targets.as_ref(),
            ce: self.ce.clone(),
            inv_count: self.inv_count,
            z_ratio: self.z_ratio,
            softcap: None,
        })
    }

    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Rows => "candle-bleu-row-pass",
            Pass::SelfMatch => "candle-bleu-self-match-pass",
            Pass::Softmax => "candle-bleu-softmax",
        }
    }

    /// `(rows per batch element, vocab)` of logits of shape `shape`.
    fn row_dims(&self, shape: &Shape) -> Result<(usize, usize)> {
        Ok(match self.pass {
            Pass::Softmax => (1, shape.dims().last().copied().unwrap_or(1).max(1)),
            _ => {
                let (_, seq, vocab) = shape.dims3()?;
                (seq.max(1), vocab.max(1))
            }
        })
    }

    fn out_shape(&self, logits: &Shape) -> Result<Shape> {
        if self.pass == Pass::Softmax {
            return Ok(logits.clone());
        }
        let (batch, seq, _) = logits.dims3()?;
        Ok(Shape::from((batch, seq, self.layout(seq)?.stride())))
    }

    /// Calls `f` with the vocabulary size, the gathered ids and the target rows, read in place
    /// from the CPU tensors the op holds.
    fn with_rows<R>(
        &self,
        logits: &Shape,
        f: impl FnOnce(usize, Gathered, &TargetRows) -> Result<R>,
    ) -> Result<R> {
        let (seq, vocab) = self.row_dims(logits)?;
        let ids = self
            .ids
            .as_ref()
            .map(|t| CpuView::new(t, "ids"))
            .transpose()?;
        let targets = self
            .targets
            .as_ref()
            .map(|t| CpuView::new(t, "targets"))
            .transpose()?;
        let gathered = match &ids {
            Some(view) => Gathered {
                ids: view.slice::<u32>()?,
                width: self.layout(seq)?.gathered,
                rows_per_batch: seq,
            },
            None => Gathered {
                ids: &[],
                width: 0,
                rows_per_batch: seq,
            },
        };
        let rows = match &targets {
            Some(view) => {
                TargetRows::new(view.slice::<u32>()?, &self.ce, self.inv_count, self.z_ratio)
            }
            None => TargetRows::none(),
        };
        f(vocab, gathered, &rows)
    }

    fn cpu_forward<T: KernelFloat>(&self, logits: &[T], shape: &Shape) -> Result<Vec<T>> {
        let out_len = self.out_shape(shape)?.elem_count();
        self.with_rows(shape, |vocab, gathered, rows| match self.pass {
            Pass::Softmax => cpu::softmax_forward(logits, vocab),
            Pass::Rows => {
                let mut out = vec![T::ZERO; out_len];
                cpu::forward_rows_into(logits, vocab, gathered, rows, 0, &mut out)?;
                Ok(out)
            }
            Pass::SelfMatch => {
                let mut out = vec![T::ZERO; out_len];
                cpu::self_match_forward_into(logits, vocab, gathered, rows, 0, &mut out)?;
                Ok(out)
            }
        })
    }

    fn cpu_backward<T: KernelFloat>(
        &self,
        logits: &[T],
        shape: &Shape,
        out: &[T],
        grad_out: &[T],
    ) -> Result<Vec<T>> {
        self.with_rows(shape, |vocab, gathered, rows| {
            Ok(match self.pass {
                Pass::Softmax => cpu::softmax_backward(out, grad_out, vocab),
                Pass::Rows => {
                    let mut grad = cpu::vocab_sized_buffer(logits.len());
                    cpu::backward_rows_into(
                        logits, vocab, gathered, rows, 0, out, grad_out, &mut grad, true,
                    );
                    grad
                }
                Pass::SelfMatch => {
                    let mut grad = cpu::vocab_sized_buffer(logits.len());
                    cpu::self_match_backward_into(
                        logits, vocab, gathered, rows, 0, out, grad_out, &mut grad,
                    );
                    grad
                }
            })
        })
    }
}

impl CustomOp1 for RowOp {
    fn name(&self) -> &'static str {
        RowOp::name(self)
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let logits = contiguous_slice::<T>(storage, layout, "logits")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.cpu_forward(logits, layout.shape())?))
        })?;
        Ok((out, self.out_shape(layout.shape())?))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = cuda::forward(&self.cuda_args(layout.shape())?, storage, layout)?;
        Ok((out, self.out_shape(layout.shape())?))
    }

    fn bwd(&self, logits: &Tensor, out: &Tensor, grad_out: &Tensor) -> Result<Option<Tensor>> {
        let grad = logits.apply_op3_no_bwd(
            &out.contiguous()?,
            &grad_out.contiguous()?,
            &RowOpBackward(self.clone()),
        )?;
        Ok(Some(grad))
    }
}

/// The backward of a [`RowOp`]: `(logits, out, grad_out)` to the logits gradient, in one pass
/// over each row.
pub(crate) struct RowOpBackward(RowOp);

impl CustomOp3 for RowOpBackward {
    fn name(&self) -> &'static str {
        match self.0.pass {
            Pass::Rows => "candle-bleu-row-pass-backward",
            Pass::SelfMatch => "candle-bleu-self-match-pass-backward",
            Pass::Softmax => "candle-bleu-softmax-backward",
        }
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        out: &CpuStorage,
        out_layout: &Layout,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = logits_layout.shape();
        let grad = dispatch_float!(logits.dtype(), self.name(), <T> => {
            let grad = self.0.cpu_backward(
                contiguous_slice::<T>(logits, logits_layout, "logits")?,
                shape,
                contiguous_slice::<T>(out, out_layout, "output")?,
                contiguous_slice::<T>(grad_out, grad_layout, "gradient")?,
            )?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((grad, shape.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        logits: &candle_core::CudaStorage,
        logits_layout: &Layout,
        out: &candle_core::CudaStorage,
        out_layout: &Layout,
        grad_out: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let grad = cuda::backward(
            &self.0.cuda_args(logits_layout.shape())?,
            (logits, logits_layout),
            (out, out_layout),
            (grad_out, grad_layout),
        )?;
        Ok((grad, logits_layout.shape().clone()))
    }
}
