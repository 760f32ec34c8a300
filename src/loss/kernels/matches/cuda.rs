//! The CUDA side of the matches op (`ExpectedMatchesOp` and its backward's `cuda_fwd`, in
//! `op.rs`): the kernels of `matches.cu` launched from the plans of `launch.rs`, the plans the
//! emulator tests run (docs/gpu.md, "The emulator").
//!
//! **Unverified on a GPU**: built only with the `cuda-unverified` feature; without it CUDA
//! tensors take the composed ops. One launch forward (`matches_fwd`) and one backward
//! (`matches_bwd`), one block per element each; the reference counts are the id references'
//! packed tensor, uploaded once when the references' side was built, and nothing is read back.

use super::args::MatchArgs;
use super::launch::{self, MatchInputs, MATCHES_FAMILIES, MATCHES_SOURCE};
use crate::loss::kernels::cuda::{alloc, contiguous_view, run, Buf, KernelModule};
use crate::loss::kernels::launch::FloatKind;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaStorage, Device, Layout, Result, Storage, Tensor};

/// The matches kernels: `kernels.cu` (whose block sum they use), then `matches.cu`.
pub(crate) const MATCHES_MODULE: KernelModule = KernelModule {
    name: "candle_bleu_matches_kernels",
    file: "matches.cu",
    source: MATCHES_SOURCE,
    families: &MATCHES_FAMILIES,
    sixteen_bit_families: &[],
};

/// Whether the matches kernels run on `device`: a CUDA device whose module compiled and loaded.
pub(crate) fn matches_kernels_loaded(device: &Device) -> bool {
    let Device::Cuda(cuda_device) = device else {
        return false;
    };
    crate::loss::kernels::cuda::load(&MATCHES_MODULE, cuda_device)
}

/// The op's `cuda_fwd`: `m [B, N]` from `X` and `U`, with the reference `counts`.
pub(crate) fn forward(
    args: &MatchArgs,
    counts: &Tensor,
    (x, x_layout): (&CudaStorage, &Layout),
    (u, u_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device = x.device().clone();
    let (counts_storage, counts_layout) = counts.storage_and_layout();
    let Storage::Cuda(counts_storage) = &*counts_storage else {
        bail!("internal: the matches op's reference counts are not on the CUDA device")
    };
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let x = contiguous_view($slice, x_layout, "token matches")?;
            let u = contiguous_view(u.as_cuda_slice::<$t>()?, u_layout, "match weights")?;
            let counts = contiguous_view(
                counts_storage.as_cuda_slice::<$t>()?,
                counts_layout,
                "reference counts",
            )?;
            let mut out = alloc::<$t>(&device, args.batch * args.orders)?;
            let mut work = alloc::<$t>(&device, args.workspace_len(false))?;
            if args.batch > 0 {
                let inputs = MatchInputs {
                    token_match: Buf::Floats(&x),
                    weights: Buf::Floats(&u),
                    counts: Buf::Floats(&counts),
                };
                let plan = launch::matches_fwd(
                    $float,
                    args,
                    inputs,
                    (Buf::Out(&mut out), Buf::Out(&mut work)),
                )?;
                run(&MATCHES_MODULE, &device, plan)?;
            }
            CudaStorage::wrap_cuda_slice(out, device.clone())
        }};
    }
    Ok(match &x.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu matches kernels: the token matches must be f32 or f64, got {:?}",
            x.dtype()
        ),
    })
}

/// The backward's `cuda_fwd`: `[B, S, W + 1]` (`dX`, then `dU`) from `grad_out [B, N]`.
pub(crate) fn backward(
    args: &MatchArgs,
    counts: &Tensor,
    (x, x_layout): (&CudaStorage, &Layout),
    (u, u_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device = x.device().clone();
    let (counts_storage, counts_layout) = counts.storage_and_layout();
    let Storage::Cuda(counts_storage) = &*counts_storage else {
        bail!("internal: the matches op's reference counts are not on the CUDA device")
    };
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let x = contiguous_view($slice, x_layout, "token matches")?;
            let u = contiguous_view(u.as_cuda_slice::<$t>()?, u_layout, "match weights")?;
            let counts = contiguous_view(
                counts_storage.as_cuda_slice::<$t>()?,
                counts_layout,
                "reference counts",
            )?;
            let grad_out =
                contiguous_view(grad_out.as_cuda_slice::<$t>()?, grad_layout, "gradient")?;
            let mut grad = alloc::<$t>(&device, args.batch * args.seq * (args.width + 1))?;
            let mut work = alloc::<$t>(&device, args.workspace_len(true))?;
            if args.batch > 0 {
                let inputs = MatchInputs {
                    token_match: Buf::Floats(&x),
                    weights: Buf::Floats(&u),
                    counts: Buf::Floats(&counts),
                };
                let plan = launch::matches_bwd(
                    $float,
                    args,
                    inputs,
                    (
                        Buf::Floats(&grad_out),
                        Buf::Out(&mut grad),
                        Buf::Out(&mut work),
                    ),
                )?;
                run(&MATCHES_MODULE, &device, plan)?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }};
    }
    Ok(match &x.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu matches kernels: the token matches must be f32 or f64, got {:?}",
            x.dtype()
        ),
    })
}

/// NVRTC compiles the matches module (`kernels.cu` then `matches.cu`): `scripts/build-cuda.sh
/// test --release --features cuda,cuda-unverified --lib kernels`.
#[cfg(test)]
mod tests {
    use crate::loss::kernels::cuda::nvrtc_check;

    #[test]
    fn nvrtc_compiles_every_kernel_family() {
        nvrtc_check::compiles_every_family(&super::MATCHES_MODULE, false);
    }
}
