//! The CUDA side of the CTC loss's op (`CtcOp` and `CtcOpBackward`'s `cuda_fwd`, in
//! `op.rs`): the kernels of `ctc.cu` launched from the plans of `launch.rs`, the plans
//! the emulator tests run (docs/gpu.md, "The emulator").
//!
//! **Unverified on a GPU**: built only with the `cuda-unverified` feature; without it CUDA
//! tensors take the composed ops. Forward: `ctc_lse` (from logits) and `ctc_alpha`, two launches;
//! backward: `ctc_beta` and `ctc_grad_rows`, two launches; f64 workspaces of `[B, T, 2L + 1]`.
//! The alignments reach the device as u32 tensors uploaded from the op's checked host copy (a
//! host-to-device copy, no synchronisation).

use super::launch::{
    self, CtcArgs, CtcInputs, CtcWorkspace, CTC_16BIT_FAMILIES, CTC_FAMILIES, CTC_SOURCE,
};
use crate::loss::kernels::cuda::{alloc, contiguous_view, run, Buf, KernelModule};
use crate::loss::kernels::launch::FloatKind;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::CudaView;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaDevice, CudaStorage, Device, Layout, Result, Storage, Tensor};

/// The CTC loss's kernels: `kernels.cu` (whose helpers they use), then `ctc.cu`.
pub(crate) const CTC_MODULE: KernelModule = KernelModule {
    name: "candle_bleu_ctc_kernels",
    file: "ctc.cu",
    source: CTC_SOURCE,
    families: &CTC_FAMILIES,
    sixteen_bit_families: &CTC_16BIT_FAMILIES,
};

/// Whether the CTC kernels run on `device`: a CUDA device whose CTC module compiled and loaded.
pub(crate) fn ctc_kernels_loaded(device: &Device) -> bool {
    let Device::Cuda(cuda_device) = device else {
        return false;
    };
    crate::loss::kernels::cuda::load(&CTC_MODULE, cuda_device)
}

/// The alignments on the device, as the kernels read them: u32 targets `[B, L]` (padded: row
/// `b`'s first `target_lengths[b]` ids are its target, the rest never read), u32 input and target
/// lengths `[B]`, and the settings.
pub(crate) struct DeviceAlignments {
    pub targets: Tensor,
    pub input_lengths: Tensor,
    pub target_lengths: Tensor,
    /// `L`, the padded width of `targets` (at least 1).
    pub target_max: usize,
    pub blank: u32,
    pub zero_infinity: bool,
}

impl DeviceAlignments {
    /// From checked host alignments (each element's target and input length, the blank and
    /// `zero_infinity`), uploaded to `device` (three host-to-device copies).
    pub(crate) fn upload(
        (targets, input_lengths): (&[Vec<u32>], &[usize]),
        (blank, zero_infinity): (u32, bool),
        device: &Device,
    ) -> Result<Self> {
        let target_max = targets.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut padded = vec![0u32; targets.len() * target_max];
        for (row, target) in padded.chunks_mut(target_max).zip(targets) {
            row[..target.len()].copy_from_slice(target);
        }
        let u32s = |v: Vec<usize>| v.into_iter().map(|l| l as u32).collect::<Vec<u32>>();
        Ok(Self {
            targets: Tensor::from_vec(padded, (targets.len(), target_max), device)?,
            input_lengths: Tensor::from_vec(u32s(input_lengths.to_vec()), targets.len(), device)?,
            target_lengths: Tensor::from_vec(
                u32s(targets.iter().map(Vec::len).collect()),
                targets.len(),
                device,
            )?,
            target_max,
            blank,
            zero_infinity,
        })
    }

    /// The user's `targets` (u32, i32 or i64 `[B, L]`) and lengths (`[B]`) as they are on the
    /// device, converted to u32 there, never read by the host: the training path's alignments
    /// off the CPU with `check_values` off. Their dtypes and shapes are checked by the caller,
    /// their values by nobody: an element out of range (a negative value wraps to a large u32)
    /// gets a NaN loss and NaN gradients from the kernels, never a read outside the buffers.
    pub(crate) fn unchecked(
        targets: &Tensor,
        (input_lengths, target_lengths): (&Tensor, &Tensor),
        blank: u32,
        zero_infinity: bool,
    ) -> Result<Self> {
        let u32s = |t: &Tensor| t.to_dtype(candle_core::DType::U32)?.contiguous();
        let (batch, width) = targets.dims2()?;
        // An empty `[B, 0]` has no buffer to point at: one column of zeros, never read (every
        // target length is then 0, or out of range).
        let targets = if width == 0 {
            Tensor::zeros((batch, 1), candle_core::DType::U32, targets.device())?
        } else {
            u32s(targets)?
        };
        Ok(Self {
            target_max: width.max(1),
            targets,
            input_lengths: u32s(input_lengths)?,
            target_lengths: u32s(target_lengths)?,
            blank,
            zero_infinity,
        })
    }
}

/// The u32 data of a CUDA tensor of the op.
fn u32_view<'a>(
    storage: &'a CudaStorage,
    layout: &Layout,
    what: &str,
) -> Result<CudaView<'a, u32>> {
    contiguous_view(storage.as_cuda_slice::<u32>()?, layout, what)
}

/// Calls `f` with the three u32 views of `alignments`.
fn with_alignments<R>(
    alignments: &DeviceAlignments,
    f: impl FnOnce(&CudaView<'_, u32>, &CudaView<'_, u32>, &CudaView<'_, u32>) -> Result<R>,
) -> Result<R> {
    let (targets, targets_layout) = alignments.targets.storage_and_layout();
    let (inputs, inputs_layout) = alignments.input_lengths.storage_and_layout();
    let (lengths, lengths_layout) = alignments.target_lengths.storage_and_layout();
    let (Storage::Cuda(targets), Storage::Cuda(inputs), Storage::Cuda(lengths)) =
        (&*targets, &*inputs, &*lengths)
    else {
        bail!("internal: the CTC alignments are not on the CUDA device")
    };
    f(
        &u32_view(targets, targets_layout, "targets")?,
        &u32_view(inputs, inputs_layout, "input_lengths")?,
        &u32_view(lengths, lengths_layout, "target_lengths")?,
    )
}

/// `CtcOp`'s `cuda_fwd`: the output `[B, width]` (the loss, then from logits each frame's
/// log-sum-exp) of `x` `[B, T, V]`.
pub(crate) fn forward(
    args: &CtcArgs,
    alignments: &DeviceAlignments,
    x: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    let device = x.device().clone();
    macro_rules! body {
        // `$x_buf` wraps the input's view (f16/bf16 read as they are); `$t` is the output's
        // and the arithmetic's type (f32 for 16-bit inputs).
        ($slice:expr, $x_buf:path, $float:expr, $t:ty) => {{
            let x = contiguous_view($slice, layout, "input")?;
            let mut out = alloc::<$t>(&device, args.batch * args.width())?;
            let mut alpha = alloc::<f64>(&device, args.table_len())?;
            if args.batch > 0 && args.frames > 0 {
                with_alignments(alignments, |targets, input_lengths, target_lengths| {
                    if args.from_logits {
                        let plan = launch::ctc_lse(
                            $float,
                            args,
                            $x_buf(&x),
                            Buf::Ids(input_lengths),
                            Buf::Out(&mut out),
                        )?;
                        run(&CTC_MODULE, &device, plan)?;
                    }
                    let inputs = CtcInputs {
                        x: $x_buf(&x),
                        targets: Buf::Ids(targets),
                        input_lengths: Buf::Ids(input_lengths),
                        target_lengths: Buf::Ids(target_lengths),
                    };
                    let plan = launch::ctc_alpha(
                        $float,
                        args,
                        inputs,
                        Buf::Out(&mut out),
                        Buf::Work(&mut alpha),
                    )?;
                    run(&CTC_MODULE, &device, plan)
                })?;
            }
            CudaStorage::wrap_cuda_slice(out, device.clone())
        }};
    }
    Ok(match &x.slice {
        CudaStorageSlice::F32(slice) => body!(slice, Buf::Floats, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, Buf::Floats, FloatKind::F64, f64),
        CudaStorageSlice::F16(slice) => body!(slice, Buf::F16, FloatKind::F16, f32),
        CudaStorageSlice::BF16(slice) => body!(slice, Buf::BF16, FloatKind::BF16, f32),
        _ => bail!(
            "candle-bleu CTC kernels: the input must be a float (f16, bf16, f32, f64), got {:?}",
            x.dtype()
        ),
    })
}

/// `CtcOpBackward`'s `cuda_fwd`: the gradient with respect to `x` from `(x, out, grad_out)`.
pub(crate) fn backward(
    args: &CtcArgs,
    alignments: &DeviceAlignments,
    (x, x_layout): (&CudaStorage, &Layout),
    (out, out_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device: CudaDevice = x.device().clone();
    macro_rules! body {
        // The input and its gradient in the input's storage type `$s` (wrapped by `$x_buf` and
        // `$grad_buf`), the output and its gradient in `$t` (f32 for 16-bit inputs).
        ($slice:expr, $x_buf:path, $grad_buf:path, $float:expr, $s:ty, $t:ty) => {{
            let x_view = contiguous_view($slice, x_layout, "input")?;
            let out_view = contiguous_view(out.as_cuda_slice::<$t>()?, out_layout, "output")?;
            let grad_view =
                contiguous_view(grad_out.as_cuda_slice::<$t>()?, grad_layout, "gradient")?;
            let mut grad = alloc::<$s>(&device, args.batch * args.frames * args.vocab)?;
            let mut alpha = alloc::<f64>(&device, args.table_len())?;
            let mut beta = alloc::<f64>(&device, args.beta_len())?;
            let mut gamma = alloc::<f64>(&device, args.table_len())?;
            let mut scale = alloc::<f64>(&device, args.batch)?;
            if args.batch > 0 && args.frames > 0 {
                with_alignments(alignments, |targets, input_lengths, target_lengths| {
                    let inputs = || CtcInputs {
                        x: $x_buf(&x_view),
                        targets: Buf::Ids(targets),
                        input_lengths: Buf::Ids(input_lengths),
                        target_lengths: Buf::Ids(target_lengths),
                    };
                    let workspace = CtcWorkspace {
                        alpha: Buf::Work(&mut alpha),
                        beta: Buf::Work(&mut beta),
                        gamma: Buf::Work(&mut gamma),
                        scale: Buf::Work(&mut scale),
                    };
                    let plan = launch::ctc_beta(
                        $float,
                        args,
                        inputs(),
                        (Buf::Floats(&out_view), Buf::Floats(&grad_view)),
                        workspace,
                    )?;
                    run(&CTC_MODULE, &device, plan)?;
                    let plan = launch::ctc_grad_rows(
                        $float,
                        args,
                        inputs(),
                        Buf::Floats(&out_view),
                        (Buf::WorkIn(&gamma), Buf::WorkIn(&scale)),
                        $grad_buf(&mut grad),
                    )?;
                    run(&CTC_MODULE, &device, plan)
                })?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }};
    }
    Ok(match &x.slice {
        CudaStorageSlice::F32(slice) => {
            body!(slice, Buf::Floats, Buf::Out, FloatKind::F32, f32, f32)
        }
        CudaStorageSlice::F64(slice) => {
            body!(slice, Buf::Floats, Buf::Out, FloatKind::F64, f64, f64)
        }
        CudaStorageSlice::F16(slice) => {
            body!(slice, Buf::F16, Buf::F16Out, FloatKind::F16, half::f16, f32)
        }
        CudaStorageSlice::BF16(slice) => {
            body!(
                slice,
                Buf::BF16,
                Buf::BF16Out,
                FloatKind::BF16,
                half::bf16,
                f32
            )
        }
        _ => bail!(
            "candle-bleu CTC kernels: the input must be a float (f16, bf16, f32, f64), got {:?}",
            x.dtype()
        ),
    })
}

/// NVRTC compiles the CTC module (`kernels.cu` then `ctc.cu`): `scripts/build-cuda.sh test
/// --release --features cuda,cuda-unverified --lib kernels`.
#[cfg(test)]
mod tests {
    use crate::loss::kernels::cuda::nvrtc_check;

    #[test]
    fn nvrtc_compiles_every_kernel_family() {
        nvrtc_check::compiles_every_family(&super::CTC_MODULE, false);
    }
}
