//! The CUDA side of the n-gram programs' op (`CtcNgramOp` and its backward's `cuda_fwd`, in
//! `ngrams.rs`): the kernels of `ngrams.cu` launched from the plans of `ngrams_launch.rs`, the
//! plans the emulator tests run (docs/gpu.md, "The emulator").
//!
//! **Unverified on a GPU**: built only with the `cuda-unverified` feature; without it CUDA
//! tensors take the composed ops. One launch forward (`ctc_ngram_fwd`) and one backward
//! (`ctc_ngram_bwd`), one block per element each. The plan's trie reaches the device as one u32
//! buffer uploaded from the host (a host-to-device copy, no synchronisation); the frame counts
//! are either uploaded the same way or the user's input lengths converted on the device.

use super::ngrams_launch::{self, NgramArgs, NgramInputs};
use crate::loss::kernels::cuda::{alloc, contiguous_view, run, Buf};
use crate::loss::kernels::launch::FloatKind;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::{bail, CudaStorage, Layout, Result, Storage, Tensor};

/// The plan on the device: the trie buffer (`CtcNgramPlan::trie_buffer`) and the frame counts,
/// u32 tensors, with the buffer's node and group counts.
#[derive(Debug, Clone)]
pub(crate) struct DeviceNgramPlan {
    pub trie: Tensor,
    pub frames: Tensor,
    pub nodes: usize,
    pub groups: usize,
}

/// Calls `f` with the u32 views of the trie buffer and the frame counts.
fn with_plan<R>(
    plan: &DeviceNgramPlan,
    f: impl FnOnce(
        &candle_core::cuda_backend::cudarc::driver::CudaView<'_, u32>,
        &candle_core::cuda_backend::cudarc::driver::CudaView<'_, u32>,
    ) -> Result<R>,
) -> Result<R> {
    let (trie, trie_layout) = plan.trie.storage_and_layout();
    let (frames, frames_layout) = plan.frames.storage_and_layout();
    let (Storage::Cuda(trie), Storage::Cuda(frames)) = (&*trie, &*frames) else {
        bail!("internal: the CTC n-gram plan is not on the CUDA device")
    };
    f(
        &contiguous_view(trie.as_cuda_slice::<u32>()?, trie_layout, "trie")?,
        &contiguous_view(frames.as_cuda_slice::<u32>()?, frames_layout, "frames")?,
    )
}

/// The op's `cuda_fwd`: the output `[B, columns]` of the logits `[B, T', V]`.
pub(crate) fn forward(
    args: &NgramArgs,
    plan: &DeviceNgramPlan,
    logits: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    let device = logits.device().clone();
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let logits = contiguous_view($slice, layout, "logits")?;
            let mut out = alloc::<$t>(&device, args.batch * args.columns())?;
            let mut work = alloc::<$t>(&device, args.workspace_len(false))?;
            if args.batch > 0 {
                with_plan(plan, |trie, frames| {
                    let inputs = NgramInputs {
                        logits: Buf::Floats(&logits),
                        frames: Buf::Ids(frames),
                        trie: Buf::Ids(trie),
                    };
                    let launch = ngrams_launch::ctc_ngram_fwd(
                        $float,
                        args,
                        inputs,
                        Buf::Out(&mut out),
                        Buf::Out(&mut work),
                    )?;
                    run(&super::cuda::CTC_MODULE, &device, launch)
                })?;
            }
            CudaStorage::wrap_cuda_slice(out, device.clone())
        }};
    }
    Ok(match &logits.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu CTC n-gram kernels: the logits must be f32 or f64, got {:?}",
            logits.dtype()
        ),
    })
}

/// The backward's `cuda_fwd`: the logits' gradient from `(logits, grad_out)`.
pub(crate) fn backward(
    args: &NgramArgs,
    plan: &DeviceNgramPlan,
    (logits, logits_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device = logits.device().clone();
    macro_rules! body {
        ($slice:expr, $float:expr, $t:ty) => {{
            let logits = contiguous_view($slice, logits_layout, "logits")?;
            let grad_out =
                contiguous_view(grad_out.as_cuda_slice::<$t>()?, grad_layout, "gradient")?;
            let mut grad = alloc::<$t>(&device, args.batch * args.frames * args.vocab)?;
            let mut work = alloc::<$t>(&device, args.workspace_len(true))?;
            if args.batch > 0 {
                with_plan(plan, |trie, frames| {
                    let inputs = NgramInputs {
                        logits: Buf::Floats(&logits),
                        frames: Buf::Ids(frames),
                        trie: Buf::Ids(trie),
                    };
                    let launch = ngrams_launch::ctc_ngram_bwd(
                        $float,
                        args,
                        inputs,
                        (Buf::Floats(&grad_out), Buf::Out(&mut grad)),
                        Buf::Out(&mut work),
                    )?;
                    run(&super::cuda::CTC_MODULE, &device, launch)
                })?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        }};
    }
    Ok(match &logits.slice {
        CudaStorageSlice::F32(slice) => body!(slice, FloatKind::F32, f32),
        CudaStorageSlice::F64(slice) => body!(slice, FloatKind::F64, f64),
        _ => bail!(
            "candle-bleu CTC n-gram kernels: the logits must be f32 or f64, got {:?}",
            logits.dtype()
        ),
    })
}
