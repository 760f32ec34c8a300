//! CUDA kernels for the fused ops, behind the `cuda` feature and opt-in at run time.
//!
//! The kernels (`fused.cu` beside this file) are the `cuda_fwd` of the same custom ops as the
//! CPU kernels, plus backward ops that the CPU ops' `bwd` dispatch to on CUDA. They are CUDA C
//! compiled at run time with NVRTC (once per process) and loaded with
//! `CudaDevice::get_or_load_custom_func`, so the crate needs no nvcc of its own.
//!
//! **They have not run on a GPU yet.** They are used only when the environment variable
//! [`ENABLE_VAR`] (`CANDLE_BLEU_CUDA_KERNELS`) is `1`; otherwise tensors on CUDA take the composed
//! candle-op path. docs/gpu.md lists the runs that remain before they can be the default.
//!
//! Dtypes: f32 and f64 logits are computed in their own type. f16 and bf16 logits are read as
//! such and accumulated in f32; [`super::softmax_gather`] then returns **f32** probabilities (the
//! row statistics need f32), while [`super::softmax_last_dim`], the paired form's outputs and
//! every gradient keep the logits' dtype. A row holding a NaN or infinite logit gives NaN outputs
//! (the CPU op errors; an error here would need a device-to-host copy).

use super::ROW_STATS;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDType, CudaStorageSlice, WrapErr};
use candle_core::{
    bail, CpuStorage, CudaDevice, CudaStorage, CustomOp2, CustomOp3, Layout, Result, Shape,
    Storage, Tensor,
};
use std::sync::OnceLock;

/// The environment variable that turns the kernels on: `CANDLE_BLEU_CUDA_KERNELS=1`.
pub const ENABLE_VAR: &str = "CANDLE_BLEU_CUDA_KERNELS";

/// The CUDA C source of every kernel.
pub const SOURCE: &str = include_str!("fused.cu");

/// Threads per block; must equal `BLOCK` in `fused.cu`.
const BLOCK: u32 = 256;

/// The NVRTC target: PTX for the oldest architecture CUDA 13 supports, which the driver
/// compiles for the GPU at hand when the module is loaded (H100/H200: sm_90).
pub const DEFAULT_ARCH: &str = "compute_75";

/// The name the compiled module is cached under, per device.
const MODULE: &str = "candle_bleu_fused";

/// The kernel families in `fused.cu`; each is instantiated as `<family>_<dtype>`.
pub const KERNEL_FAMILIES: [&str; 6] = [
    "softmax_gather_fwd",
    "softmax_gather_bwd",
    "softmax_fwd",
    "softmax_bwd",
    "gather_rows",
    "self_match_bwd",
];

/// The dtype suffixes each family is instantiated for.
pub const DTYPE_SUFFIXES: [&str; 4] = ["f32", "f64", "f16", "bf16"];

/// Every kernel entry point in `fused.cu`.
pub fn kernel_names() -> Vec<String> {
    KERNEL_FAMILIES
        .iter()
        .flat_map(|family| DTYPE_SUFFIXES.iter().map(move |s| format!("{family}_{s}")))
        .collect()
}

/// Whether an [`ENABLE_VAR`] value turns the kernels on: exactly `"1"`.
pub fn enabled_by(value: Option<&str>) -> bool {
    value == Some("1")
}

/// Whether the kernels are on in this process (read at each call).
pub fn kernels_enabled() -> bool {
    enabled_by(std::env::var(ENABLE_VAR).ok().as_deref())
}

/// Compiles [`SOURCE`] to PTX with NVRTC for `arch` (e.g. `"compute_90"`). Needs `libnvrtc` but
/// no GPU.
pub fn compile_ptx(arch: &'static str) -> Result<String> {
    let options = nvrtc::CompileOptions {
        arch: Some(arch),
        name: Some("fused.cu".to_string()),
        ..Default::default()
    };
    match nvrtc::compile_ptx_with_opts(SOURCE, options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(error) => bail!("NVRTC failed to compile candle-bleu's fused.cu for {arch}: {error:?}"),
    }
}

/// The PTX for [`DEFAULT_ARCH`], compiled on first use.
fn ptx() -> Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    match PTX.get_or_init(|| compile_ptx(DEFAULT_ARCH).map_err(|e| e.to_string())) {
        Ok(ptx) => Ok(ptx),
        Err(message) => bail!("{message}"),
    }
}

/// The kernel `<family>_<suffix>`, loaded into `device` from the PTX on first use.
fn kernel(device: &CudaDevice, family: &str, suffix: &str) -> Result<CudaFunction> {
    let func = device.get_or_load_custom_func(&format!("{family}_{suffix}"), MODULE, ptx()?)?;
    Ok(func.into_cuda_function())
}

/// One block of [`BLOCK`] threads per row.
fn rows_config(rows: usize) -> Result<LaunchConfig> {
    // CUDA grids hold at most 2^31 - 1 blocks in x.
    let grid = match u32::try_from(rows) {
        Ok(grid) if grid <= i32::MAX as u32 => grid,
        _ => bail!("fused CUDA kernels: {rows} rows exceed a grid of 2^31 - 1 blocks"),
    };
    Ok(LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn dim_u32(value: usize, what: &str) -> Result<u32> {
    match u32::try_from(value) {
        Ok(v) => Ok(v),
        Err(_) => bail!("fused CUDA kernels: {what} = {value} exceeds u32::MAX"),
    }
}

/// The contiguous part of `slice` that `layout` addresses.
fn contiguous_view<'a, T>(
    slice: &'a CudaSlice<T>,
    layout: &Layout,
    what: &str,
) -> Result<CudaView<'a, T>> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(slice.slice(start..end)),
        None => bail!("{what}: the fused CUDA kernel needs a contiguous tensor"),
    }
}

/// The slice of `storage` typed like `_like` (same dtype, checked).
fn typed_like<'a, T: CudaDType>(
    _like: &CudaSlice<T>,
    storage: &'a CudaStorage,
) -> Result<&'a CudaSlice<T>> {
    storage.as_cuda_slice::<T>()
}

/// Evaluates `$body` with `$slice` bound to the typed slice of a float storage, `$suffix` to its
/// kernel suffix and `$acc` to its accumulator type (f64 for f64, f32 otherwise).
macro_rules! with_float_slice {
    ($storage:expr, $what:expr, |$slice:ident, $suffix:ident, $acc:ident| $body:expr) => {
        match &$storage.slice {
            CudaStorageSlice::F32($slice) => {
                type $acc = f32;
                let $suffix = "f32";
                $body
            }
            CudaStorageSlice::F64($slice) => {
                type $acc = f64;
                let $suffix = "f64";
                $body
            }
            CudaStorageSlice::F16($slice) => {
                type $acc = f32;
                let $suffix = "f16";
                $body
            }
            CudaStorageSlice::BF16($slice) => {
                type $acc = f32;
                let $suffix = "bf16";
                $body
            }
            _ => bail!(
                "{}: logits must be f32, f64, f16 or bf16, got {:?}",
                $what,
                $storage.dtype()
            ),
        }
    };
}

/// An uninitialised device buffer of `len` elements.
fn alloc<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written by the kernel launched next (each row's block writes
    // its whole row), before the buffer is read.
    unsafe { device.alloc::<T>(len.max(1)) }
}

/// An uninitialised device buffer of `len` elements of `_like`'s element type.
fn alloc_like<T: DeviceRepr>(
    _like: &CudaSlice<T>,
    device: &CudaDevice,
    len: usize,
) -> Result<CudaSlice<T>> {
    alloc::<T>(device, len)
}

/// `(rows_per_batch, vocab, width)` as kernel arguments.
fn gather_dims(seq: usize, vocab: usize, width: usize) -> Result<(u32, u32, u32)> {
    Ok((
        dim_u32(seq.max(1), "sequence length")?,
        dim_u32(vocab, "vocabulary size")?,
        dim_u32(width, "id width")?,
    ))
}

/// `cuda_fwd` of `SoftmaxGather`: `[B, S, V]` logits and u32 `[B, K]` ids to
/// `[B, S, K + ROW_STATS]` (gathered probabilities, row max, row exp-sum), f64 for f64 logits
/// and f32 otherwise.
pub(super) fn softmax_gather_forward(
    logits: &CudaStorage,
    logits_layout: &Layout,
    ids: &CudaStorage,
    ids_layout: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let (batch, seq, vocab) = logits_layout.shape().dims3()?;
    let (_, width) = ids_layout.shape().dims2()?;
    let device = logits.device();
    let ids = contiguous_view(ids.as_cuda_slice::<u32>()?, ids_layout, "ids")?;
    let rows = batch * seq;
    let (rows_per_batch, vocab_arg, width_arg) = gather_dims(seq, vocab, width)?;
    let storage = with_float_slice!(logits, "softmax_gather", |slice, suffix, Acc| {
        let logits = contiguous_view(slice, logits_layout, "logits")?;
        let mut out = alloc::<Acc>(device, rows * (width + ROW_STATS))?;
        if rows > 0 {
            let func = kernel(device, "softmax_gather_fwd", suffix)?;
            let stream = device.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&logits);
            builder.arg(&ids);
            builder.arg(&mut out);
            builder.arg(&rows_per_batch);
            builder.arg(&vocab_arg);
            builder.arg(&width_arg);
            // SAFETY: the arguments match the kernel's signature; every index it reads or
            // writes is inside the buffers (rows × vocab, batch × width, rows × (width + 2)).
            unsafe { builder.launch(rows_config(rows)?) }.w()?;
        }
        CudaStorage::wrap_cuda_slice(out, device.clone())
    });
    Ok((storage, Shape::from((batch, seq, width + ROW_STATS))))
}

/// The backward of `SoftmaxGather` on CUDA: `(logits, ids, packed)` to the logits gradient,
/// with `packed[b, i] = (g_k x_k for k < K, max, exp-sum)` in the forward output's dtype.
struct SoftmaxGatherBackward;

impl CustomOp3 for SoftmaxGatherBackward {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-gather-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("softmax_gather backward op: CUDA only (the CPU op computes its own backward)")
    }

    fn cuda_fwd(
        &self,
        logits: &CudaStorage,
        logits_layout: &Layout,
        ids: &CudaStorage,
        ids_layout: &Layout,
        packed: &CudaStorage,
        packed_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (batch, seq, vocab) = logits_layout.shape().dims3()?;
        let (_, width) = ids_layout.shape().dims2()?;
        let device = logits.device();
        let ids = contiguous_view(ids.as_cuda_slice::<u32>()?, ids_layout, "ids")?;
        let rows = batch * seq;
        let (rows_per_batch, vocab_arg, width_arg) = gather_dims(seq, vocab, width)?;
        let storage = with_float_slice!(logits, "softmax_gather backward", |slice, suffix, Acc| {
            let logits = contiguous_view(slice, logits_layout, "logits")?;
            let packed = contiguous_view(
                packed.as_cuda_slice::<Acc>()?,
                packed_layout,
                "packed gradient",
            )?;
            let mut grad = alloc_like(slice, device, rows * vocab)?;
            if rows > 0 {
                let func = kernel(device, "softmax_gather_bwd", suffix)?;
                let stream = device.cuda_stream();
                let mut builder = stream.launch_builder(&func);
                builder.arg(&logits);
                builder.arg(&ids);
                builder.arg(&packed);
                builder.arg(&mut grad);
                builder.arg(&rows_per_batch);
                builder.arg(&vocab_arg);
                builder.arg(&width_arg);
                // SAFETY: as in the forward; the gradient has the logits' rows × vocab elements.
                unsafe { builder.launch(rows_config(rows)?) }.w()?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        });
        Ok((storage, logits_layout.shape().clone()))
    }
}

/// The backward of `SoftmaxGather` on CUDA, called by its `bwd`: `gathered` and `grad_gathered`
/// are the forward's `[B, S, K + ROW_STATS]` output and its gradient.
pub(super) fn softmax_gather_backward(
    logits: &Tensor,
    ids: &Tensor,
    gathered: &Tensor,
    grad_gathered: &Tensor,
) -> Result<Tensor> {
    let width = ids.dim(1)?;
    let weighted = grad_gathered
        .narrow(2, 0, width)?
        .mul(&gathered.narrow(2, 0, width)?)?;
    let packed = Tensor::cat(&[&weighted, &gathered.narrow(2, width, ROW_STATS)?], 2)?;
    logits.apply_op3_no_bwd(ids, &packed, &SoftmaxGatherBackward)
}

/// Launches `softmax_fwd` over the rows of `slice` (rows × vocab, contiguous) into a new buffer.
fn softmax_rows<T: DeviceRepr>(
    device: &CudaDevice,
    logits: &CudaView<'_, T>,
    suffix: &str,
    rows: usize,
    vocab: usize,
) -> Result<CudaSlice<T>> {
    let mut probs = alloc::<T>(device, rows * vocab)?;
    if rows > 0 && vocab > 0 {
        let vocab_arg = dim_u32(vocab, "vocabulary size")?;
        let func = kernel(device, "softmax_fwd", suffix)?;
        let stream = device.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(logits);
        builder.arg(&mut probs);
        builder.arg(&vocab_arg);
        // SAFETY: the arguments match the kernel's signature; each block reads and writes
        // its own row of `vocab` elements.
        unsafe { builder.launch(rows_config(rows)?) }.w()?;
    }
    Ok(probs)
}

/// `cuda_fwd` of `SoftmaxLastDim`: softmax over the last dimension, in the logits' dtype.
pub(super) fn softmax_forward(
    logits: &CudaStorage,
    layout: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let vocab = layout.shape().dims().last().copied().unwrap_or(1);
    let rows = layout.shape().elem_count() / vocab.max(1);
    let device = logits.device();
    let storage = with_float_slice!(logits, "softmax", |slice, suffix, _Acc| {
        let view = contiguous_view(slice, layout, "logits")?;
        let probs = softmax_rows(device, &view, suffix, rows, vocab)?;
        CudaStorage::wrap_cuda_slice(probs, device.clone())
    });
    Ok((storage, layout.shape().clone()))
}

/// `(probs, grad_probs)` to the logits gradient `p ⊙ (dp - Σ p dp)` (CUDA only).
struct SoftmaxBackward;

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("softmax backward op: CUDA only (the CPU op computes its own backward)")
    }

    fn cuda_fwd(
        &self,
        probs: &CudaStorage,
        probs_layout: &Layout,
        grad_probs: &CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let vocab = probs_layout.shape().dims().last().copied().unwrap_or(1);
        let rows = probs_layout.shape().elem_count() / vocab.max(1);
        let device = probs.device();
        let storage = with_float_slice!(probs, "softmax backward", |slice, suffix, _Acc| {
            let probs = contiguous_view(slice, probs_layout, "probs")?;
            let grad_probs = contiguous_view(
                typed_like(slice, grad_probs)?,
                grad_layout,
                "softmax gradient",
            )?;
            let mut grad = alloc_like(slice, device, rows * vocab)?;
            if rows > 0 && vocab > 0 {
                let vocab_arg = dim_u32(vocab, "vocabulary size")?;
                let func = kernel(device, "softmax_bwd", suffix)?;
                let stream = device.cuda_stream();
                let mut builder = stream.launch_builder(&func);
                builder.arg(&probs);
                builder.arg(&grad_probs);
                builder.arg(&mut grad);
                builder.arg(&vocab_arg);
                // SAFETY: the arguments match the kernel's signature; each block reads and
                // writes its own row of `vocab` elements of same-shaped buffers.
                unsafe { builder.launch(rows_config(rows)?) }.w()?;
            }
            CudaStorage::wrap_cuda_slice(grad, device.clone())
        });
        Ok((storage, probs_layout.shape().clone()))
    }
}

/// The backward of `SoftmaxLastDim` on CUDA, called by its `bwd`.
pub(super) fn softmax_backward(probs: &Tensor, grad_probs: &Tensor) -> Result<Tensor> {
    probs
        .contiguous()?
        .apply_op2_no_bwd(&grad_probs.contiguous()?, &SoftmaxBackward)
}

/// `cuda_fwd` of `SoftmaxSelfMatch`: `[Z | X]` (`[B, S, S + K]`, the logits' dtype) with
/// `Z = P Pᵀ` by candle's batched matmul (cuBLAS) and `X = P` gathered at the ids by a kernel.
pub(super) fn softmax_self_match_forward(
    logits: &CudaStorage,
    logits_layout: &Layout,
    ids: &CudaStorage,
    ids_layout: &Layout,
) -> Result<(CudaStorage, Shape)> {
    let (batch, seq, vocab) = logits_layout.shape().dims3()?;
    let (_, width) = ids_layout.shape().dims2()?;
    let device = logits.device();
    let ids = contiguous_view(ids.as_cuda_slice::<u32>()?, ids_layout, "ids")?;
    let rows = batch * seq;
    let stride = seq + width;
    let (rows_per_batch, vocab_arg, width_arg) = gather_dims(seq, vocab, width)?;
    let (stride_arg, offset_arg) = (dim_u32(stride, "output width")?, dim_u32(seq, "sequence")?);
    let (probs, mut out) =
        with_float_slice!(logits, "softmax_self_match", |slice, suffix, _Acc| {
            let logits = contiguous_view(slice, logits_layout, "logits")?;
            let probs = softmax_rows(device, &logits, suffix, rows, vocab)?;
            let mut out = alloc_like(slice, device, rows * stride)?;
            if rows > 0 && width > 0 {
                let func = kernel(device, "gather_rows", suffix)?;
                let stream = device.cuda_stream();
                let mut builder = stream.launch_builder(&func);
                builder.arg(&probs);
                builder.arg(&ids);
                builder.arg(&mut out);
                builder.arg(&rows_per_batch);
                builder.arg(&vocab_arg);
                builder.arg(&width_arg);
                builder.arg(&stride_arg);
                builder.arg(&offset_arg);
                // SAFETY: the arguments match the kernel's signature; row r writes columns
                // seq..seq + width of its row of `out` (rows × (seq + width)).
                unsafe { builder.launch(rows_config(rows)?) }.w()?;
            }
            (
                CudaStorage::wrap_cuda_slice(probs, device.clone()),
                CudaStorage::wrap_cuda_slice(out, device.clone()),
            )
        });
    if rows > 0 && seq > 0 {
        let probs_layout = Layout::contiguous((batch, seq, vocab));
        let self_match = probs.matmul(
            &probs,
            (batch, seq, seq, vocab),
            &probs_layout,
            &probs_layout.transpose(1, 2)?,
        )?;
        // Z's rows of `seq` into the first `seq` columns of each output row.
        self_match.copy2d(&mut out, rows, seq, seq, stride, 0, 0)?;
    }
    Ok((out, Shape::from((batch, seq, stride))))
}

/// `(probs, dense, weighted)` to the logits gradient of the paired form (CUDA only), with the
/// ids held by the op: `dense = (dZ + dZᵀ) P` (`[B, S, V]`), `weighted = X ⊙ dX` (`[B, S, K]`).
struct SelfMatchBackward {
    ids: Tensor,
}

impl CustomOp3 for SelfMatchBackward {
    fn name(&self) -> &'static str {
        "candle-bleu-softmax-self-match-backward"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("softmax_self_match backward op: CUDA only (the CPU op computes its own backward)")
    }

    fn cuda_fwd(
        &self,
        probs: &CudaStorage,
        probs_layout: &Layout,
        dense: &CudaStorage,
        dense_layout: &Layout,
        weighted: &CudaStorage,
        weighted_layout: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (batch, seq, vocab) = probs_layout.shape().dims3()?;
        let (_, width) = self.ids.dims2()?;
        let device = probs.device();
        let (ids_storage, ids_layout) = self.ids.storage_and_layout();
        let Storage::Cuda(ids) = &*ids_storage else {
            bail!("softmax_self_match backward: ids are not on the CUDA device")
        };
        let ids = contiguous_view(ids.as_cuda_slice::<u32>()?, ids_layout, "ids")?;
        let rows = batch * seq;
        let (rows_per_batch, vocab_arg, width_arg) = gather_dims(seq, vocab, width)?;
        let storage = with_float_slice!(
            probs,
            "softmax_self_match backward",
            |slice, suffix, _Acc| {
                let probs = contiguous_view(slice, probs_layout, "probs")?;
                let dense =
                    contiguous_view(typed_like(slice, dense)?, dense_layout, "dense gradient")?;
                let weighted = contiguous_view(
                    typed_like(slice, weighted)?,
                    weighted_layout,
                    "gather gradient",
                )?;
                let mut grad = alloc_like(slice, device, rows * vocab)?;
                if rows > 0 && vocab > 0 {
                    let func = kernel(device, "self_match_bwd", suffix)?;
                    let stream = device.cuda_stream();
                    let mut builder = stream.launch_builder(&func);
                    builder.arg(&probs);
                    builder.arg(&dense);
                    builder.arg(&ids);
                    builder.arg(&weighted);
                    builder.arg(&mut grad);
                    builder.arg(&rows_per_batch);
                    builder.arg(&vocab_arg);
                    builder.arg(&width_arg);
                    // SAFETY: the arguments match the kernel's signature; row r reads rows of
                    // probs/dense (vocab), weighted (width) and ids (width), writes its gradient row.
                    unsafe { builder.launch(rows_config(rows)?) }.w()?;
                }
                CudaStorage::wrap_cuda_slice(grad, device.clone())
            }
        );
        Ok((storage, probs_layout.shape().clone()))
    }
}

/// The backward of `SoftmaxSelfMatch` on CUDA, called by its `bwd`: `out` is the forward's
/// `[Z | X]` and `grad_out` its gradient. `P` is recomputed (one softmax kernel), the dense part
/// `(dZ + dZᵀ) P` is a cuBLAS matmul, and one kernel applies the softmax Jacobian to the sum.
pub(super) fn softmax_self_match_backward(
    logits: &Tensor,
    ids: &Tensor,
    out: &Tensor,
    grad_out: &Tensor,
) -> Result<Tensor> {
    let (_, seq, _) = logits.dims3()?;
    let width = ids.dim(1)?;
    let probs = logits
        .contiguous()?
        .apply_op1_no_bwd(&super::SoftmaxLastDim)?;
    let grad_self = grad_out.narrow(2, 0, seq)?;
    let dense = grad_self
        .add(&grad_self.t()?)?
        .contiguous()?
        .matmul(&probs)?;
    let weighted = out
        .narrow(2, seq, width)?
        .mul(&grad_out.narrow(2, seq, width)?)?
        .contiguous()?;
    probs.apply_op3_no_bwd(
        &dense,
        &weighted,
        &SelfMatchBackward {
            ids: ids.contiguous()?,
        },
    )
}
