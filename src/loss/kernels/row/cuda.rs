//! The CUDA side of the row op and its backward (`RowOp` and `RowOpBackward`'s `cuda_fwd`, in
//! `op.rs`), built only with the `cuda` feature. The op passes what the kernels read as a
//! [`RowArgsIn`] (its parameters and its `RowLayout`): this file imports nothing of the op's.
//! Each launch is a plan of `launch.rs` (kernel, grid, block, parameters in order), the plan the
//! emulator of the CUDA execution model runs in the tests; the shared machinery (`kernels/cuda.rs`)
//! pushes it to cudarc.
//!
//! Verified on a GPU (an H200, 2026-11-27: `tests/cuda_kernels.rs` against the CPU and the
//! composed ops; docs/gpu.md), so CUDA tensors take them by default. The kernels
//! (`kernels.cu` beside this file) are CUDA C compiled at run time with NVRTC.
//!
//! Dtypes: f32 and f64 (the loss converts f16/bf16 logits to f32 first, except for the options
//! kernels below). A row holding a NaN or infinite logit gives NaN outputs (the CPU op errors; an
//! error here would need a copy to the host).
//!
//! The cross-entropy's options (class weights, z-loss, token accuracy, a soft cap in the row
//! pass) and 16-bit logits run `ce_options.cu`'s kernels ([`OPTIONS_MODULE`]), which have passed
//! the emulator but not a GPU: only with the `cuda-unverified` feature; without it the loss sends
//! the options to the composed ops (`dispatch::Path::for_options`) and widens 16-bit logits.

use super::launch::{
    self, row_args, BackwardBuffers, BackwardInput, RowArgs, RowArgsIn, RowPassFwdBuffers,
    KERNEL_FAMILIES,
};
#[cfg(feature = "cuda-unverified")]
use super::launch::{OPTIONS_16BIT_FAMILIES, OPTIONS_FAMILIES, OPTIONS_SOURCE};
use crate::loss::kernels::cuda::{alloc, contiguous_view, run, Buf, HeldU32, KernelModule};
use crate::loss::kernels::launch::FloatKind;
use crate::loss::kernels::layout::Pass;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, CudaView, DeviceRepr};
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, Tensor, WithDType};

/// The row op's kernels, `kernels.cu` (verified on an H200).
pub(crate) const ROW_MODULE: KernelModule = KernelModule {
    name: "candle_bleu_kernels",
    file: "kernels.cu",
    source: include_str!("kernels.cu"),
    families: &KERNEL_FAMILIES,
    sixteen_bit_families: &[],
};

/// The row op's passes with the cross-entropy's options, `ce_options.cu` after `kernels.cu`
/// (tested on the emulator, not yet on a GPU: feature `cuda-unverified`).
#[cfg(feature = "cuda-unverified")]
pub(crate) const OPTIONS_MODULE: KernelModule = KernelModule {
    name: "candle_bleu_ce_options_kernels",
    file: "ce_options.cu",
    source: OPTIONS_SOURCE,
    families: &OPTIONS_FAMILIES,
    sixteen_bit_families: &OPTIONS_16BIT_FAMILIES,
};

/// The module of `op`'s row-pass and backward launches over `float` logits: `ce_options.cu`'s
/// with the options or 16-bit logits (`cuda-unverified`), `kernels.cu`'s otherwise.
fn row_pass_module(op: &RowArgsIn<'_>, float: FloatKind) -> Result<&'static KernelModule> {
    if !op.takes_options_kernels(float) {
        return Ok(&ROW_MODULE);
    }
    #[cfg(feature = "cuda-unverified")]
    return Ok(&OPTIONS_MODULE);
    #[cfg(not(feature = "cuda-unverified"))]
    bail!("internal: the cross-entropy's options on CUDA need the `cuda-unverified` kernels; `Path::for_options` sends them to composed ops")
}

/// The class weights of `op` on the device in the launch's arithmetic type `T`, or a
/// one-element placeholder (read by no thread) when its launches over `float` logits take the
/// options kernels without weights; `None` when they take the plain kernels. One host-to-device
/// copy of `V` values per launch.
fn class_weights_buffer<T: DeviceRepr + WithDType>(
    device: &CudaDevice,
    op: &RowArgsIn<'_>,
    float: FloatKind,
) -> Result<Option<CudaSlice<T>>> {
    if !op.takes_options_kernels(float) {
        return Ok(None);
    }
    let weights: Vec<T> = match op.class_weights() {
        Some(weights) => weights.iter().map(|&w| T::from_f64(w)).collect(),
        None => vec![T::from_f64(0.0)],
    };
    Ok(Some(device.clone_htod(&weights)?))
}

/// Evaluates `$body` with `$slice` the typed slice of a float storage, `$float` its
/// [`FloatKind`] and `$t` its element type.
macro_rules! with_float_slice {
    ($storage:expr, |$slice:ident, $float:ident, $t:ident| $body:expr) => {
        match &$storage.slice {
            CudaStorageSlice::F32($slice) => {
                type $t = f32;
                let $float = FloatKind::F32;
                $body
            }
            CudaStorageSlice::F64($slice) => {
                type $t = f64;
                let $float = FloatKind::F64;
                $body
            }
            _ => bail!(
                "candle-bleu CUDA kernels: logits must be f32 or f64, got {:?}",
                $storage.dtype()
            ),
        }
    };
}

/// Launches `softmax_fwd` over `args.rows` rows of `args.vocab` logits into a new buffer.
fn softmax_rows<T: DeviceRepr + WithDType>(
    device: &CudaDevice,
    logits: &CudaView<'_, T>,
    float: FloatKind,
    args: &RowArgs,
) -> Result<CudaSlice<T>> {
    let mut probs = alloc::<T>(device, args.rows * args.vocab as usize)?;
    if args.rows > 0 {
        let plan = launch::softmax_fwd(float, args, Buf::Floats(logits), Buf::Out(&mut probs))?;
        run(&ROW_MODULE, device, plan)?;
    }
    Ok(probs)
}

/// `RowOp`'s `cuda_fwd`: the output of `op`'s pass in the logits' dtype (f32 for 16-bit
/// logits), rows of `op.layout` (every probability for the softmax pass).
pub(crate) fn forward(
    op: &RowArgsIn<'_>,
    logits: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    if matches!(
        logits.dtype(),
        candle_core::DType::F16 | candle_core::DType::BF16
    ) {
        return forward_16bit(op, logits, layout);
    }
    let device = logits.device().clone();
    let args = row_args(op, layout.shape())?;
    let stride = op.layout.stride();
    // The softmax pass returns its probabilities before this is used.
    let out_len = match op.pass {
        Pass::Softmax => 0,
        _ => {
            let (batch, seq, _) = layout.shape().dims3()?;
            batch * seq * stride
        }
    };
    let ids = HeldU32 {
        tensor: op.ids.cloned(),
    };
    let targets = HeldU32 {
        tensor: op.targets.cloned(),
    };
    let (probs, out) = with_float_slice!(logits, |slice, float, T| {
        let view = contiguous_view(slice, layout, "logits")?;
        if op.pass == Pass::Softmax {
            let probs = softmax_rows(&device, &view, float, &args)?;
            return Ok(CudaStorage::wrap_cuda_slice(probs, device.clone()));
        }
        let mut out = alloc::<T>(&device, out_len)?;
        if args.rows > 0 {
            let weights = class_weights_buffer::<T>(&device, op, float)?;
            ids.with(&device, |ids| {
                targets.with(&device, |targets| {
                    let buffers = RowPassFwdBuffers {
                        logits: Buf::Floats(&view),
                        ids: Buf::Ids(ids),
                        targets: Buf::Ids(targets),
                        out: Buf::Out(&mut out),
                        class_weights: weights.as_ref().map(Buf::Slice),
                    };
                    run(
                        row_pass_module(op, float)?,
                        &device,
                        launch::row_pass_fwd(float, op, &args, buffers)?,
                    )
                })
            })?;
        }
        let probs = (op.pass == Pass::SelfMatch)
            .then(|| softmax_rows(&device, &view, float, &args))
            .transpose()?
            .map(|p| CudaStorage::wrap_cuda_slice(p, device.clone()));
        (probs, CudaStorage::wrap_cuda_slice(out, device.clone()))
    });
    let mut out = out;
    if let Some(probs) = probs {
        // Z = P Pᵀ by cuBLAS, into the first `seq` columns of each output row.
        let (batch, seq, vocab) = layout.shape().dims3()?;
        if args.rows > 0 {
            let probs_layout = Layout::contiguous((batch, seq, vocab));
            let self_match = probs.matmul(
                &probs,
                (batch, seq, seq, vocab),
                &probs_layout,
                &probs_layout.transpose(1, 2)?,
            )?;
            self_match.copy2d(&mut out, args.rows, seq, seq, stride, 0, 0)?;
        }
    }
    Ok(out)
}

/// `RowOpBackward`'s `cuda_fwd`: the logits gradient of `op`'s pass from
/// `(logits, out, grad_out)`, in the logits' dtype.
pub(crate) fn backward(
    op: &RowArgsIn<'_>,
    (logits, logits_layout): (&CudaStorage, &Layout),
    (out, out_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    if matches!(
        logits.dtype(),
        candle_core::DType::F16 | candle_core::DType::BF16
    ) {
        return backward_16bit(
            op,
            (logits, logits_layout),
            (out, out_layout),
            (grad_out, grad_layout),
        );
    }
    let device = logits.device().clone();
    let args = row_args(op, logits_layout.shape())?;
    let held = |t: Option<&Tensor>| HeldU32 { tensor: t.cloned() };
    let (ids, links, targets) = (held(op.ids), held(op.links), held(op.targets));
    // The dense gradient of P for the self-match pass: (dZ + dZᵀ) P, with P recomputed.
    let dense_and_probs = match op.pass {
        Pass::SelfMatch => Some(self_match_dense(
            &device,
            op,
            logits,
            logits_layout,
            grad_out,
            grad_layout,
            &args,
        )?),
        _ => None,
    };
    let grad = with_float_slice!(logits, |slice, float, T| {
        let logits_view = contiguous_view(slice, logits_layout, "logits")?;
        let out_view = contiguous_view(out.as_cuda_slice::<T>()?, out_layout, "output")?;
        let grad_view = contiguous_view(grad_out.as_cuda_slice::<T>()?, grad_layout, "gradient")?;
        let mut grad = alloc::<T>(&device, args.rows * args.vocab as usize)?;
        if args.rows > 0 {
            let weights = class_weights_buffer::<T>(&device, op, float)?;
            ids.with(&device, |ids| {
                links.with(&device, |links| {
                    targets.with(&device, |targets| {
                        let input = match (op.pass, &dense_and_probs) {
                            (Pass::Rows, _) => BackwardInput::Logits(Buf::Floats(&logits_view)),
                            // The softmax's output is its probabilities, its gradient the dense part.
                            (Pass::Softmax, _) => BackwardInput::Jacobian {
                                probs: Buf::Floats(&out_view),
                                dense: Buf::Floats(&grad_view),
                            },
                            (Pass::SelfMatch, Some((dense, probs))) => BackwardInput::Jacobian {
                                probs: Buf::Slice(probs.as_cuda_slice::<T>()?),
                                dense: Buf::Slice(dense.as_cuda_slice::<T>()?),
                            },
                            (Pass::SelfMatch, None) => bail!("internal: no dense gradient"),
                        };
                        let buffers = BackwardBuffers {
                            input,
                            ids: Buf::Ids(ids),
                            links: Buf::Ids(links),
                            targets: Buf::Ids(targets),
                            out: Buf::Floats(&out_view),
                            grad_out: Buf::Floats(&grad_view),
                            grad: Buf::Out(&mut grad),
                            class_weights: weights.as_ref().map(Buf::Slice),
                        };
                        run(
                            row_pass_module(op, float)?,
                            &device,
                            launch::backward(float, op, &args, buffers)?,
                        )
                    })
                })
            })?;
        }
        CudaStorage::wrap_cuda_slice(grad, device.clone())
    });
    Ok(grad)
}

/// The row pass over 16-bit logits (`cuda-unverified`): `ce_options.cu`'s `row_options_fwd`
/// reads them as they are and writes its rows in f32; no f32 copy of the logits.
#[cfg(feature = "cuda-unverified")]
fn forward_16bit(op: &RowArgsIn<'_>, logits: &CudaStorage, layout: &Layout) -> Result<CudaStorage> {
    if op.pass != Pass::Rows {
        bail!("internal: only the row pass reads 16-bit logits");
    }
    let device = logits.device().clone();
    let args = row_args(op, layout.shape())?;
    let mut out = alloc::<f32>(&device, args.rows * op.layout.stride())?;
    if args.rows > 0 {
        let held = |t: Option<&Tensor>| HeldU32 { tensor: t.cloned() };
        let (ids, targets) = (held(op.ids), held(op.targets));
        let launch_over = |float: FloatKind, logits: Buf<'_, '_, f32>, out: &mut CudaSlice<f32>| {
            let weights = class_weights_buffer::<f32>(&device, op, float)?;
            ids.with(&device, |ids| {
                targets.with(&device, |targets| {
                    let buffers = RowPassFwdBuffers {
                        logits,
                        ids: Buf::Ids(ids),
                        targets: Buf::Ids(targets),
                        out: Buf::Out(out),
                        class_weights: weights.as_ref().map(Buf::Slice),
                    };
                    run(
                        &OPTIONS_MODULE,
                        &device,
                        launch::row_pass_fwd(float, op, &args, buffers)?,
                    )
                })
            })
        };
        match &logits.slice {
            CudaStorageSlice::F16(slice) => {
                let view = contiguous_view(slice, layout, "logits")?;
                launch_over(FloatKind::F16, Buf::F16(&view), &mut out)?;
            }
            CudaStorageSlice::BF16(slice) => {
                let view = contiguous_view(slice, layout, "logits")?;
                launch_over(FloatKind::BF16, Buf::BF16(&view), &mut out)?;
            }
            _ => bail!("internal: 16-bit logits expected"),
        }
    }
    Ok(CudaStorage::wrap_cuda_slice(out, device))
}

/// Without `cuda-unverified` the loss converts 16-bit logits to f32 before the op.
#[cfg(not(feature = "cuda-unverified"))]
fn forward_16bit(_: &RowArgsIn<'_>, logits: &CudaStorage, _: &Layout) -> Result<CudaStorage> {
    bail!(
        "internal: {:?} logits reach the CUDA row op without `cuda-unverified`",
        logits.dtype()
    )
}

/// The row pass's backward over 16-bit logits (`cuda-unverified`): `row_options_bwd` reads the
/// f32 rows and their gradient and writes the logits gradient in the logits' dtype.
#[cfg(feature = "cuda-unverified")]
fn backward_16bit(
    op: &RowArgsIn<'_>,
    (logits, logits_layout): (&CudaStorage, &Layout),
    (out, out_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    if op.pass != Pass::Rows {
        bail!("internal: only the row pass reads 16-bit logits");
    }
    let device = logits.device().clone();
    let args = row_args(op, logits_layout.shape())?;
    let len = args.rows * args.vocab as usize;
    let out_view = contiguous_view(out.as_cuda_slice::<f32>()?, out_layout, "output")?;
    let grad_view = contiguous_view(grad_out.as_cuda_slice::<f32>()?, grad_layout, "gradient")?;
    let held = |t: Option<&Tensor>| HeldU32 { tensor: t.cloned() };
    let (ids, links, targets) = (held(op.ids), held(op.links), held(op.targets));
    let launch_over = |float: FloatKind, logits: Buf<'_, '_, f32>, grad: Buf<'_, '_, f32>| {
        let weights = class_weights_buffer::<f32>(&device, op, float)?;
        ids.with(&device, |ids| {
            links.with(&device, |links| {
                targets.with(&device, |targets| {
                    let buffers = BackwardBuffers {
                        input: BackwardInput::Logits(logits),
                        ids: Buf::Ids(ids),
                        links: Buf::Ids(links),
                        targets: Buf::Ids(targets),
                        out: Buf::Floats(&out_view),
                        grad_out: Buf::Floats(&grad_view),
                        grad,
                        class_weights: weights.as_ref().map(Buf::Slice),
                    };
                    run(
                        &OPTIONS_MODULE,
                        &device,
                        launch::backward(float, op, &args, buffers)?,
                    )
                })
            })
        })
    };
    Ok(match &logits.slice {
        CudaStorageSlice::F16(slice) => {
            let view = contiguous_view(slice, logits_layout, "logits")?;
            let mut grad = alloc::<half::f16>(&device, len)?;
            if args.rows > 0 {
                launch_over(FloatKind::F16, Buf::F16(&view), Buf::F16Out(&mut grad))?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }
        CudaStorageSlice::BF16(slice) => {
            let view = contiguous_view(slice, logits_layout, "logits")?;
            let mut grad = alloc::<half::bf16>(&device, len)?;
            if args.rows > 0 {
                launch_over(FloatKind::BF16, Buf::BF16(&view), Buf::BF16Out(&mut grad))?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }
        _ => bail!("internal: 16-bit logits expected"),
    })
}

/// Without `cuda-unverified` the loss converts 16-bit logits to f32 before the op.
#[cfg(not(feature = "cuda-unverified"))]
fn backward_16bit(
    _: &RowArgsIn<'_>,
    (logits, _): (&CudaStorage, &Layout),
    _: (&CudaStorage, &Layout),
    _: (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    bail!(
        "internal: {:?} logits reach the CUDA row op without `cuda-unverified`",
        logits.dtype()
    )
}

/// `((dZ + dZᵀ) P, P)` for the self-match pass's backward: `P` recomputed from the logits, the
/// symmetrised `dZ` by a kernel from the first `seq` columns of `grad_out`, the product by
/// cuBLAS.
fn self_match_dense(
    device: &CudaDevice,
    op: &RowArgsIn<'_>,
    logits: &CudaStorage,
    logits_layout: &Layout,
    grad_out: &CudaStorage,
    grad_layout: &Layout,
    args: &RowArgs,
) -> Result<(CudaStorage, CudaStorage)> {
    let (batch, seq, vocab) = logits_layout.shape().dims3()?;
    let (probs, sym) = with_float_slice!(logits, |slice, float, T| {
        let view = contiguous_view(slice, logits_layout, "logits")?;
        let probs = softmax_rows(device, &view, float, args)?;
        let grad_view = contiguous_view(grad_out.as_cuda_slice::<T>()?, grad_layout, "gradient")?;
        let mut sym = alloc::<T>(device, batch * seq * seq)?;
        if args.rows > 0 {
            let plan = launch::symmetrize(
                float,
                op,
                args,
                seq,
                Buf::Floats(&grad_view),
                Buf::Out(&mut sym),
            )?;
            run(&ROW_MODULE, device, plan)?;
        }
        (
            CudaStorage::wrap_cuda_slice(probs, device.clone()),
            CudaStorage::wrap_cuda_slice(sym, device.clone()),
        )
    });
    let dense = sym.matmul(
        &probs,
        (batch, seq, vocab, seq),
        &Layout::contiguous((batch, seq, seq)),
        &Layout::contiguous((batch, seq, vocab)),
    )?;
    Ok((dense, probs))
}

/// The public `log_softmax`'s forward on CUDA (`log_softmax_fwd`, in the options module): `x`
/// (f32 or f64, rows of its last dimension) into a new buffer of its shape.
#[cfg(feature = "cuda-unverified")]
pub(crate) fn log_softmax_forward(x: &CudaStorage, layout: &Layout) -> Result<CudaStorage> {
    let device = x.device().clone();
    let classes = layout.dims().last().copied().unwrap_or(1).max(1);
    let rows = layout.shape().elem_count() / classes;
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let view = contiguous_view($slice, layout, "x")?;
            let mut y = alloc::<$t>(&device, rows * classes)?;
            if rows > 0 {
                let plan = launch::log_softmax_fwd(
                    $float,
                    (rows, classes),
                    Buf::Floats(&view),
                    Buf::Out(&mut y),
                )?;
                run(&OPTIONS_MODULE, &device, plan)?;
            }
            CudaStorage::wrap_cuda_slice(y, device.clone())
        }};
    }
    Ok(match &x.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu log_softmax kernels: `x` must be f32 or f64 here, got {:?}",
            x.dtype()
        ),
    })
}

/// The public `log_softmax`'s backward on CUDA (`log_softmax_bwd`), in place on `grad` (the
/// output's gradient, contiguous from its buffer's start) with the forward's output `y`.
#[cfg(feature = "cuda-unverified")]
pub(crate) fn log_softmax_backward(
    grad: &mut CudaStorage,
    grad_layout: &Layout,
    y: &CudaStorage,
    y_layout: &Layout,
) -> Result<()> {
    let device = y.device().clone();
    let classes = y_layout.dims().last().copied().unwrap_or(1).max(1);
    let rows = y_layout.shape().elem_count() / classes;
    if grad_layout.start_offset() != 0
        || !grad_layout.is_contiguous()
        || grad_layout.shape() != y_layout.shape()
    {
        bail!("internal: the log_softmax backward needs a contiguous gradient of the output's shape at its buffer's start");
    }
    macro_rules! body {
        ($t:ty, $float:expr) => {{
            let y_view = contiguous_view(y.as_cuda_slice::<$t>()?, y_layout, "y")?;
            let grad = grad.as_cuda_slice_mut::<$t>()?;
            if rows > 0 {
                let plan = launch::log_softmax_bwd(
                    $float,
                    (rows, classes),
                    Buf::Out(grad),
                    Buf::Floats(&y_view),
                )?;
                run(&OPTIONS_MODULE, &device, plan)?;
            }
            Ok(())
        }};
    }
    match y.dtype() {
        candle_core::DType::F32 => body!(f32, FloatKind::F32),
        candle_core::DType::F64 => body!(f64, FloatKind::F64),
        other => bail!("candle-bleu log_softmax kernels: f32 or f64 here, got {other:?}"),
    }
}

/// NVRTC compiles the row op's modules: `scripts/build-cuda.sh test --release --features cuda
/// --lib kernels` (with `cuda-unverified`, the options module too).
#[cfg(test)]
mod tests {
    use crate::loss::kernels::cuda::nvrtc_check;

    #[test]
    fn nvrtc_compiles_every_kernel_family() {
        nvrtc_check::compiles_every_family(&super::ROW_MODULE, true);
        #[cfg(feature = "cuda-unverified")]
        nvrtc_check::compiles_every_family(&super::OPTIONS_MODULE, false);
    }

    #[test]
    fn an_unknown_capability_is_an_error() {
        nvrtc_check::an_unknown_capability_is_an_error(&super::ROW_MODULE);
    }
}
