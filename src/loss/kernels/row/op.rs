//! The loss's custom op over the logits, [`RowOp`], whose three passes share one backward op,
//! [`RowOpBackward`], of the same shape; the per-row output of each pass is
//! [`RowLayout`](crate::loss::kernels::layout::RowLayout)'s (`[x | ce | max | sum | weight]`,
//! the same after the self-match `Z` columns, or every probability for [`Pass::Softmax`]).
//!
//! Each op has its `cpu_fwd` (the slice kernels of [`cpu`](crate::loss::kernels::cpu)) and its
//! `cuda_fwd` (this family's `cuda` module, `kernels.cu` and `ce_options.cu`, behind the `cuda`
//! feature, given the op's parameters as a `launch::RowArgsIn`, so that it imports nothing of
//! this file) side by side; the forward op's `bwd` only applies the backward op. Whether the
//! kernels or composed candle ops run is decided in one place, the loss's `dispatch::Path`. The
//! kernels take plain parameters (ids, targets, `1/n`) that the loss's validation has checked:
//! they check nothing themselves, except that the CPU kernels report a non-finite logit they
//! meet in their pass. Also here: [`GatherIds`], [`cuda_kernels_loaded`] and
//! [`options_kernels_loaded`].

#[cfg(feature = "cuda")]
use super::cuda;
#[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
use super::launch;
use crate::loss::host::CpuView;
use crate::loss::kernels::backward::apply_backward_op3;
use crate::loss::kernels::cpu::{self, CrossEntropyTerms, Gathered, TargetRows};
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use crate::loss::kernels::layout::{Pass, RowLayout};
use crate::loss::kernels::softcap;
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor,
};

/// Whether the CUDA kernels run on `device`: built with the `cuda` feature, a CUDA
/// device, and the kernels compiled and loaded (a failure to compile or load warns once, then
/// the composed ops run).
#[cfg(feature = "cuda")]
pub(crate) fn cuda_kernels_loaded(device: &candle_core::Device) -> bool {
    let candle_core::Device::Cuda(cuda_device) = device else {
        return false;
    };
    crate::loss::kernels::cuda::load(&cuda::ROW_MODULE, cuda_device)
}

/// Without the `cuda` feature, CUDA tensors take the composed ops.
#[cfg(not(feature = "cuda"))]
pub(crate) fn cuda_kernels_loaded(_device: &candle_core::Device) -> bool {
    false
}

/// Whether the CUDA kernels with the cross-entropy's options (`ce_options.cu`: class weights,
/// z-loss, token accuracy, a soft cap read in the row pass) run on `device`: built with
/// `cuda-unverified` (they have passed the emulator, not a GPU), a CUDA device, and the module
/// compiled and loaded.
#[cfg(feature = "cuda-unverified")]
pub(crate) fn options_kernels_loaded(device: &candle_core::Device) -> bool {
    let candle_core::Device::Cuda(cuda_device) = device else {
        return false;
    };
    crate::loss::kernels::cuda::load(&cuda::OPTIONS_MODULE, cuda_device)
}

/// Without `cuda-unverified`, the options run composed ops off the CPU.
#[cfg(not(feature = "cuda-unverified"))]
pub(crate) fn options_kernels_loaded(_device: &candle_core::Device) -> bool {
    false
}

/// f16 or bf16 logits widened to f32 (contiguous), or `None` for any other dtype.
fn widened_16bit(storage: &CpuStorage, layout: &Layout) -> Result<Option<CpuStorage>> {
    match storage.dtype() {
        candle_core::DType::F16 | candle_core::DType::BF16 => {
            Ok(Some(storage.to_dtype(layout, candle_core::DType::F32)?))
        }
        _ => Ok(None),
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
    /// Logit soft-capping `c` applied as the pass reads the logits (the row pass only): the
    /// CUDA options kernels read each logit through `c·tanh(z/c)`; the CPU caps a copy first,
    /// as `SoftcapOp` would. `None`: the logits come capped, or uncapped.
    softcap: Option<f64>,
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
            softcap: None,
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

    /// The same row pass reading its logits through the soft cap `c·tanh(z/c)` (see the
    /// field); the self-match and softmax passes take capped logits instead.
    pub(crate) fn with_softcap(self, softcap: Option<f64>) -> Result<Self> {
        if softcap.is_some() && self.pass != Pass::Rows {
            bail!("internal: only the row pass reads its logits through the soft cap");
        }
        Ok(Self { softcap, ..self })
    }

    /// A softmax over the last dimension.
    pub(crate) fn softmax() -> Self {
        Self {
            softcap: None,
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
            softcap: self.softcap,
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

    /// The logits the CPU kernels read: a capped copy with the soft cap (`None` on NaN or Inf,
    /// which `tanh` would hide), else the logits themselves.
    fn cpu_capped<'a, T: KernelFloat>(&self, logits: &'a [T]) -> Result<std::borrow::Cow<'a, [T]>> {
        let Some(cap) = self.softcap else {
            return Ok(std::borrow::Cow::Borrowed(logits));
        };
        let mut capped = vec![T::ZERO; logits.len()];
        if !softcap::softcap_into(logits, cap, &mut capped) {
            return Err(cpu::non_finite_error("logits"));
        }
        Ok(std::borrow::Cow::Owned(capped))
    }

    fn cpu_forward<T: KernelFloat>(&self, logits: &[T], shape: &Shape) -> Result<Vec<T>> {
        let logits = &*self.cpu_capped(logits)?;
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
        let logits = &*self.cpu_capped(logits)?;
        let mut grad = self.cpu_backward_capped(logits, shape, out, grad_out)?;
        if let Some(cap) = self.softcap {
            softcap::softcap_backward_in_place(&mut grad, logits, cap);
        }
        Ok(grad)
    }

    /// [`Self::cpu_backward`] with respect to the (capped) logits the kernels read.
    fn cpu_backward_capped<T: KernelFloat>(
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
        if let Some(wide) = widened_16bit(storage, layout)? {
            // 16-bit logits (which the loss widens before the op on the CPU): computed in f32,
            // rows in f32, as the CUDA options kernels do.
            return self.cpu_fwd(&wide, &Layout::contiguous(layout.shape()));
        }
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
        let grad_out = grad_out.contiguous()?;
        let grad = apply_backward_op3(
            &grad_out,
            logits,
            &out.contiguous()?,
            &grad_out,
            RowOpBackward(self.clone()),
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
        if let Some(wide) = widened_16bit(logits, logits_layout)? {
            // 16-bit logits: the gradient computed in f32, then rounded once to their dtype.
            let (grad, shape) = self.cpu_fwd(
                &wide,
                &Layout::contiguous(shape),
                out,
                out_layout,
                grad_out,
                grad_layout,
            )?;
            return Ok((
                grad.to_dtype(&Layout::contiguous(&shape), logits.dtype())?,
                shape,
            ));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::kernels::cpu::CrossEntropyTerms;
    use candle_core::{Device, Var};

    /// The row pass reading its logits through the soft cap (what the CUDA options kernels do)
    /// equals the cap applied by its own op first, bit for bit on the CPU: forward and gradient,
    /// with the cross-entropy's options; NaN logits are refused.
    #[test]
    fn the_row_pass_with_a_soft_cap_equals_the_cap_first() -> Result<()> {
        let device = Device::Cpu;
        let (batch, seq, vocab) = (2, 3, 11);
        let values: Vec<f64> = (0..batch * seq * vocab)
            .map(|i| 30.0 * ((i as f64 * 0.618_033_988_75) % 1.0) - 15.0)
            .collect();
        let logits = Var::from_tensor(&Tensor::from_vec(values, (batch, seq, vocab), &device)?)?;
        let gather = GatherIds::from_host(&[1, 4, 1, 0, 7, 3], (batch, 3), &device)?;
        let targets = Tensor::new(&[[2u32, 0, 5], [10, 3, 0]], &device)?;
        let terms = CrossEntropyTerms {
            pad_id: Some(0),
            label_smoothing: 0.1,
            class_weights: Some((0..vocab).map(|v| 0.5 + v as f64 / 4.0).collect()),
            z_loss: 1e-3,
            token_accuracy: true,
        };
        let op = || {
            RowOp::rows(
                false,
                Some(&gather),
                Some((&targets, terms.clone(), 0.2, 1.3)),
            )
        };
        let cap = 6.0;
        let capped_first = op()?.apply(&softcap::softcap(logits.as_tensor(), cap, true)?)?;
        let fused = op()?.with_softcap(Some(cap))?.apply(logits.as_tensor())?;
        let weights = Tensor::rand(0.0, 1.0, capped_first.shape(), &device)?;
        let gradient = |out: &Tensor| -> Result<Vec<f64>> {
            let grads = (out * &weights)?.sum_all()?.backward()?;
            grads
                .get(logits.as_tensor())
                .expect("a logits gradient")
                .flatten_all()?
                .to_vec1()
        };
        let flat = |t: &Tensor| t.flatten_all()?.to_vec1::<f64>();
        assert_eq!(flat(&fused)?, flat(&capped_first)?);
        assert_eq!(gradient(&fused)?, gradient(&capped_first)?);
        // A cap would hide an infinity from the pass's own check: refused before it.
        let bad = logits
            .as_tensor()
            .broadcast_mul(&Tensor::new(f64::INFINITY, &device)?)?;
        let error = op()?.with_softcap(Some(cap))?.apply(&bad).unwrap_err();
        assert!(error.to_string().contains("NaN or infinite"), "{error}");
        // Only the row pass caps as it reads.
        let error = RowOp::rows(true, Some(&gather), None)?
            .with_softcap(Some(cap))
            .err()
            .expect("the self-match pass refused the cap");
        assert!(error.to_string().contains("only the row pass"), "{error}");
        Ok(())
    }

    /// 16-bit logits on the CPU: computed in f32 on the widened logits (rows in f32), the
    /// gradient rounded once to the logits' dtype — what the CUDA options kernels compute.
    #[test]
    fn sixteen_bit_logits_are_computed_in_f32() -> Result<()> {
        let device = Device::Cpu;
        let values: Vec<f32> = (0..2 * 3 * 7)
            .map(|i| (i as f32 * 0.618_034) % 1.0 * 8.0 - 4.0)
            .collect();
        let gather = GatherIds::from_host(&[1, 4, 1, 0, 6, 3], (2, 3), &device)?;
        let targets = Tensor::new(&[[2u32, 0, 5], [6, 3, 0]], &device)?;
        let op = || {
            let terms = CrossEntropyTerms {
                pad_id: Some(0),
                label_smoothing: 0.1,
                ..Default::default()
            };
            RowOp::rows(false, Some(&gather), Some((&targets, terms, 0.25, 1.0)))
        };
        for dtype in [candle_core::DType::F16, candle_core::DType::BF16] {
            let narrow = Var::from_tensor(
                &Tensor::from_vec(values.clone(), (2, 3, 7), &device)?.to_dtype(dtype)?,
            )?;
            let wide = Var::from_tensor(&narrow.as_tensor().to_dtype(candle_core::DType::F32)?)?;
            let out = op()?.apply(narrow.as_tensor())?;
            let reference = op()?.apply(wide.as_tensor())?;
            assert_eq!(out.dtype(), candle_core::DType::F32);
            let flat = |t: &Tensor| {
                t.flatten_all()?
                    .to_dtype(candle_core::DType::F32)?
                    .to_vec1::<f32>()
            };
            assert_eq!(flat(&out)?, flat(&reference)?);
            let weights = Tensor::rand(0f32, 1.0, out.shape(), &device)?;
            let grad = (&out * &weights)?.sum_all()?.backward()?;
            let grad = grad.get(narrow.as_tensor()).expect("a gradient");
            let reference_grad = (&reference * &weights)?.sum_all()?.backward()?;
            let reference_grad = reference_grad.get(wide.as_tensor()).expect("a gradient");
            assert_eq!(grad.dtype(), dtype);
            assert_eq!(flat(grad)?, flat(&reference_grad.to_dtype(dtype)?)?);
        }
        Ok(())
    }
}
