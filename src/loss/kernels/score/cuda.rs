//! The CUDA side of the score's op (`ScoreOp` and its backward's `cuda_fwd`, in `op.rs`): the
//! kernels of `score.cu` launched from the plans of `launch.rs`, the plans the emulator tests run
//! (docs/gpu.md, "The emulator").
//!
//! **Unverified on a GPU**: built only with the `cuda-unverified` feature; without it CUDA
//! tensors take the composed ops. One launch forward (`score_fwd`) and one backward
//! (`score_bwd`); nothing is read back to the host.

use super::args::ScoreArgs;
use super::launch::{self, SCORE_FAMILIES, SCORE_SOURCE};
use crate::loss::kernels::cuda::{alloc, contiguous_view, run, Buf, KernelModule};
use crate::loss::kernels::launch::FloatKind;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaStorage, Device, Layout, Result};

/// The score's kernels: `kernels.cu` (whose block sum they use), then `score.cu`.
pub(crate) const SCORE_MODULE: KernelModule = KernelModule {
    name: "candle_bleu_score_kernels",
    file: "score.cu",
    source: SCORE_SOURCE,
    families: &SCORE_FAMILIES,
    sixteen_bit_families: &[],
};

/// Whether the score's kernels run on `device`: a CUDA device whose score module compiled and
/// loaded.
pub(crate) fn score_kernels_loaded(device: &Device) -> bool {
    let Device::Cuda(cuda_device) = device else {
        return false;
    };
    crate::loss::kernels::cuda::load(&SCORE_MODULE, cuda_device)
}

/// The op's `cuda_fwd`: the loss `[1]` (a scalar to the op) of `count` rows.
pub(crate) fn forward(
    args: &ScoreArgs,
    count: usize,
    rows: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    let device = rows.device().clone();
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let rows = contiguous_view($slice, layout, "rows")?;
            let mut out = alloc::<$t>(&device, 1)?;
            let launch = launch::score_fwd(
                $float,
                args,
                count,
                (Buf::Floats(&rows), Buf::Out(&mut out)),
            )?;
            run(&SCORE_MODULE, &device, launch)?;
            CudaStorage::wrap_cuda_slice(out, device.clone())
        }};
    }
    Ok(match &rows.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu score kernels: the statistics must be f32 or f64, got {:?}",
            rows.dtype()
        ),
    })
}

/// The backward's `cuda_fwd`: the rows' gradient from `(rows, grad_out)`.
pub(crate) fn backward(
    args: &ScoreArgs,
    count: usize,
    (rows, rows_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device = rows.device().clone();
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let rows = contiguous_view($slice, rows_layout, "rows")?;
            let grad_out =
                contiguous_view(grad_out.as_cuda_slice::<$t>()?, grad_layout, "gradient")?;
            let mut grad = alloc::<$t>(&device, count * args.columns())?;
            let launch = launch::score_bwd(
                $float,
                args,
                count,
                (
                    Buf::Floats(&rows),
                    Buf::Floats(&grad_out),
                    Buf::Out(&mut grad),
                ),
            )?;
            run(&SCORE_MODULE, &device, launch)?;
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }};
    }
    Ok(match &rows.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu score kernels: the statistics must be f32 or f64, got {:?}",
            rows.dtype()
        ),
    })
}

/// NVRTC compiles the score module (`kernels.cu` then `score.cu`): `scripts/build-cuda.sh test
/// --release --features cuda,cuda-unverified --lib kernels`.
#[cfg(test)]
mod tests {
    use crate::loss::kernels::cuda::nvrtc_check;

    #[test]
    fn nvrtc_compiles_every_kernel_family() {
        nvrtc_check::compiles_every_family(&super::SCORE_MODULE, false);
    }
}
