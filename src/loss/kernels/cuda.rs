//! The CUDA side of the row op and its backward (`RowOp` and `RowOpBackward`'s `cuda_fwd`, in
//! `row_op.rs`), built only with the `cuda` feature. The op passes what the kernels
//! read as a [`RowArgsIn`] (its parameters and its [`RowLayout`]): this file imports nothing of
//! the op's.
//!
//! Verified on a GPU (an H200, 2026-11-27: `tests/cuda_kernels.rs` against the CPU and the
//! composed ops; docs/gpu.md), so CUDA tensors take them by default. The kernels (`kernels.cu` beside this file) are CUDA C compiled at run time
//! with NVRTC, once per compute capability, for the device's own architecture
//! (`--gpu-architecture=compute_XY`), and loaded with `CudaDevice::get_or_load_custom_func`, so
//! the crate needs no nvcc of its own. If compiling or loading fails, [`load`] returns `false`,
//! prints one warning, and the loss takes the composed candle ops.
//!
//! Dtypes: f32 and f64 (the loss converts f16/bf16 logits to f32 first). A row holding a NaN or
//! infinite logit gives NaN outputs (the CPU op errors; an error here would need a copy to the
//! host).

use super::cpu::CrossEntropyTerms;
use super::layout::{Pass, RowLayout};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, Storage, Tensor};
use std::collections::HashMap;
use std::sync::{Mutex, Once, OnceLock};

/// The CUDA C source of every kernel.
const SOURCE: &str = include_str!("kernels.cu");

/// Threads per block; must equal `BLOCK` in `kernels.cu`.
const BLOCK: u32 = 256;

/// The name the compiled module is cached under, per device.
const MODULE: &str = "candle_bleu_kernels";

/// The kernel families in `kernels.cu`; each is instantiated as `<family>_f32` and `_f64`.
const KERNEL_FAMILIES: [&str; 5] = [
    "row_pass_fwd",
    "row_pass_bwd",
    "softmax_fwd",
    "symmetrize",
    "jacobian_bwd",
];

/// Compiles [`SOURCE`] to PTX with NVRTC for `compute_{major}{minor}`. Needs `libnvrtc`, not a
/// GPU.
pub(crate) fn compile_ptx((major, minor): (i32, i32)) -> Result<String> {
    let options = nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some("kernels.cu".to_string()),
        ..Default::default()
    };
    match nvrtc::compile_ptx_with_opts(SOURCE, options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(error) => bail!(
            "NVRTC failed to compile candle-bleu's kernels.cu for compute_{major}{minor}: {error:?}"
        ),
    }
}

/// The device's compute capability `(major, minor)`.
fn compute_capability(device: &CudaDevice) -> Result<(i32, i32)> {
    let cu_device = device.cuda_stream().context().cu_device();
    let attribute = |a| {
        // SAFETY: reads a device attribute of a valid device handle from candle's context.
        unsafe { result::device::get_attribute(cu_device, a) }.w()
    };
    Ok((
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
        attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

/// The PTX for the compute capability of `device`, compiled once per capability.
fn ptx(device: &CudaDevice) -> Result<String> {
    static PTX: OnceLock<Mutex<HashMap<(i32, i32), String>>> = OnceLock::new();
    let capability = compute_capability(device)?;
    let cache = PTX.get_or_init(Default::default);
    if let Some(ptx) = cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&capability)
    {
        return Ok(ptx.clone());
    }
    let ptx = compile_ptx(capability)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(capability, ptx.clone());
    Ok(ptx)
}

/// The kernel `<family>_<suffix>`, from the module loaded into `device`.
fn kernel(device: &CudaDevice, family: &str, suffix: &str) -> Result<CudaFunction> {
    let func =
        device.get_or_load_custom_func(&format!("{family}_{suffix}"), MODULE, &ptx(device)?)?;
    Ok(func.into_cuda_function())
}

/// Whether every kernel compiles and loads on `device` (tried once per device). The first
/// failure in the process prints one warning; the loss then takes the composed candle ops.
pub(crate) fn load(device: &CudaDevice) -> bool {
    static LOADED: OnceLock<Mutex<HashMap<candle_core::cuda_backend::DeviceId, bool>>> =
        OnceLock::new();
    static WARNED: Once = Once::new();
    let loaded = LOADED.get_or_init(Default::default);
    if let Some(&ok) = loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&device.id())
    {
        return ok;
    }
    let result = KERNEL_FAMILIES.iter().try_for_each(|family| {
        ["f32", "f64"]
            .iter()
            .try_for_each(|suffix| kernel(device, family, suffix).map(drop))
    });
    if let Err(error) = &result {
        WARNED.call_once(|| {
            eprintln!(
                "candle-bleu: the CUDA kernels failed to load ({error}); using composed candle ops"
            )
        });
    }
    loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(device.id(), result.is_ok());
    result.is_ok()
}

/// One block of [`BLOCK`] threads per row.
fn rows_config(rows: usize) -> Result<LaunchConfig> {
    let grid = match u32::try_from(rows) {
        Ok(grid) if grid <= i32::MAX as u32 => grid,
        _ => bail!("candle-bleu CUDA kernels: {rows} rows exceed a grid of 2^31 - 1 blocks"),
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
        Err(_) => bail!("candle-bleu CUDA kernels: {what} = {value} exceeds u32::MAX"),
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
        None => bail!("`{what}`: the CUDA kernel needs a contiguous tensor"),
    }
}

/// An uninitialised device buffer of `len` elements, each written by the kernel launched next.
fn alloc<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written before it is read (each row's block writes its row).
    unsafe { device.alloc::<T>(len.max(1)) }
}

/// The u32 data of a tensor the op holds (ids, links, targets), as a view; a one-element
/// placeholder where the op holds none (the kernels do not read it then).
struct HeldU32 {
    tensor: Option<Tensor>,
}

impl HeldU32 {
    fn with<R>(
        &self,
        device: &CudaDevice,
        f: impl FnOnce(&CudaView<'_, u32>) -> Result<R>,
    ) -> Result<R> {
        match &self.tensor {
            Some(t) => {
                let (storage, layout) = t.storage_and_layout();
                let Storage::Cuda(cuda) = &*storage else {
                    bail!("internal: a tensor of the CUDA op is on {:?}", t.device())
                };
                f(&contiguous_view(
                    cuda.as_cuda_slice::<u32>()?,
                    layout,
                    "ids",
                )?)
            }
            None => {
                let placeholder = device.alloc_zeros::<u32>(1)?;
                f(&placeholder.slice(0..1))
            }
        }
    }
}

/// What the kernels read of a row op: its pass, the output layout, the tensors it holds (u32
/// ids `[B, K]`, their first-occurrence links, targets `[B, S]`) and its cross-entropy terms.
pub(crate) struct RowArgsIn<'a> {
    pub pass: Pass,
    pub layout: RowLayout,
    pub ids: Option<&'a Tensor>,
    pub links: Option<&'a Tensor>,
    pub targets: Option<&'a Tensor>,
    pub ce: CrossEntropyTerms,
    /// `1 / n` for the `n` non-pad targets (0 without targets).
    pub inv_count: f64,
}

/// The scalar arguments every row kernel shares.
struct RowArgs {
    rows: usize,
    rows_per_batch: u32,
    vocab: u32,
    width: u32,
    has_targets: u32,
    has_pad: u32,
    pad_id: u32,
}

fn row_args(op: &RowArgsIn<'_>, layout: &Layout) -> Result<RowArgs> {
    let dims = layout.shape().dims();
    let vocab = dims.last().copied().unwrap_or(1);
    let rows = layout.shape().elem_count() / vocab.max(1);
    let seq = match op.pass {
        Pass::Softmax => 1,
        _ => layout.shape().dims3()?.1.max(1),
    };
    Ok(RowArgs {
        rows,
        rows_per_batch: dim_u32(seq, "sequence length")?,
        vocab: dim_u32(vocab, "vocabulary size")?,
        width: dim_u32(op.layout.gathered, "id width")?,
        has_targets: u32::from(op.targets.is_some()),
        has_pad: u32::from(op.ce.pad_id.is_some()),
        pad_id: op.ce.pad_id.unwrap_or(0),
    })
}

/// Evaluates `$body` with `$slice` the typed slice of a float storage, `$suffix` its kernel
/// suffix and `$t` its element type.
macro_rules! with_float_slice {
    ($storage:expr, |$slice:ident, $suffix:ident, $t:ident| $body:expr) => {
        match &$storage.slice {
            CudaStorageSlice::F32($slice) => {
                type $t = f32;
                let $suffix = "f32";
                $body
            }
            CudaStorageSlice::F64($slice) => {
                type $t = f64;
                let $suffix = "f64";
                $body
            }
            _ => bail!(
                "candle-bleu CUDA kernels: logits must be f32 or f64, got {:?}",
                $storage.dtype()
            ),
        }
    };
}

/// Launches `softmax_fwd` over `rows` rows of `vocab` logits into a new buffer.
fn softmax_rows<T: DeviceRepr>(
    device: &CudaDevice,
    logits: &CudaView<'_, T>,
    suffix: &str,
    args: &RowArgs,
) -> Result<CudaSlice<T>> {
    let mut probs = alloc::<T>(device, args.rows * args.vocab as usize)?;
    if args.rows > 0 {
        let func = kernel(device, "softmax_fwd", suffix)?;
        let stream = device.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        builder.arg(logits);
        builder.arg(&mut probs);
        builder.arg(&args.vocab);
        // SAFETY: the arguments match the kernel's signature; each block reads and writes its
        // own row of `vocab` elements.
        unsafe { builder.launch(rows_config(args.rows)?) }.w()?;
    }
    Ok(probs)
}

/// `RowOp`'s `cuda_fwd`: the output of `op`'s pass in the logits' dtype, rows of
/// `op.layout` (every probability for the softmax pass).
pub(crate) fn forward(
    op: &RowArgsIn<'_>,
    logits: &CudaStorage,
    layout: &Layout,
) -> Result<CudaStorage> {
    let device = logits.device().clone();
    let args = row_args(op, layout)?;
    let (self_columns, stride) = (op.layout.self_match_columns(), op.layout.stride());
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
    let (probs, out) = with_float_slice!(logits, |slice, suffix, T| {
        let view = contiguous_view(slice, layout, "logits")?;
        if op.pass == Pass::Softmax {
            let probs = softmax_rows(&device, &view, suffix, &args)?;
            return Ok(CudaStorage::wrap_cuda_slice(probs, device.clone()));
        }
        let mut out = alloc::<T>(&device, out_len)?;
        if args.rows > 0 {
            let func = kernel(&device, "row_pass_fwd", suffix)?;
            let (stride_arg, offset_arg) = (dim_u32(stride, "row")?, dim_u32(self_columns, "row")?);
            let eps = op.ce.label_smoothing as T;
            let inv_count = op.inv_count as T;
            ids.with(&device, |ids| {
                targets.with(&device, |targets| {
                    let stream = device.cuda_stream();
                    let mut builder = stream.launch_builder(&func);
                    builder.arg(&view);
                    builder.arg(ids);
                    builder.arg(targets);
                    builder.arg(&mut out);
                    builder.arg(&args.rows_per_batch);
                    builder.arg(&args.vocab);
                    builder.arg(&args.width);
                    builder.arg(&stride_arg);
                    builder.arg(&offset_arg);
                    builder.arg(&args.has_targets);
                    builder.arg(&args.has_pad);
                    builder.arg(&args.pad_id);
                    builder.arg(&eps);
                    builder.arg(&inv_count);
                    // SAFETY: the arguments match the kernel's signature; row r reads its
                    // logits, the ids of its batch element and its target, and writes columns
                    // offset.. of its output row (rows × stride).
                    unsafe { builder.launch(rows_config(args.rows)?) }.w()?;
                    Ok(())
                })
            })?;
        }
        let probs = (op.pass == Pass::SelfMatch)
            .then(|| softmax_rows(&device, &view, suffix, &args))
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
/// `(logits, out, grad_out)`.
pub(crate) fn backward(
    op: &RowArgsIn<'_>,
    (logits, logits_layout): (&CudaStorage, &Layout),
    (out, out_layout): (&CudaStorage, &Layout),
    (grad_out, grad_layout): (&CudaStorage, &Layout),
) -> Result<CudaStorage> {
    let device = logits.device().clone();
    let args = row_args(op, logits_layout)?;
    let stride = dim_u32(op.layout.stride(), "row")?;
    let offset = dim_u32(op.layout.gathered_start(), "row")?;
    let eps_f64 = op.ce.label_smoothing;
    let held = |t: Option<&Tensor>| HeldU32 { tensor: t.cloned() };
    let (ids, links, targets) = (held(op.ids), held(op.links), held(op.targets));
    // The dense gradient of P for the self-match pass: (dZ + dZᵀ) P, with P recomputed.
    let dense_and_probs = match op.pass {
        Pass::SelfMatch => Some(self_match_dense(
            &device,
            logits,
            logits_layout,
            grad_out,
            grad_layout,
            &args,
            stride,
        )?),
        _ => None,
    };
    let grad = with_float_slice!(logits, |slice, suffix, T| {
        let logits_view = contiguous_view(slice, logits_layout, "logits")?;
        let out_view = contiguous_view(out.as_cuda_slice::<T>()?, out_layout, "output")?;
        let grad_view = contiguous_view(grad_out.as_cuda_slice::<T>()?, grad_layout, "gradient")?;
        let mut grad = alloc::<T>(&device, args.rows * args.vocab as usize)?;
        let eps = eps_f64 as T;
        if args.rows > 0 {
            ids.with(&device, |ids| {
                links.with(&device, |links| {
                    targets.with(&device, |targets| {
                        let stream = device.cuda_stream();
                        let func;
                        let mut builder;
                        match op.pass {
                            Pass::Rows => {
                                func = kernel(&device, "row_pass_bwd", suffix)?;
                                builder = stream.launch_builder(&func);
                                builder.arg(&logits_view);
                            }
                            Pass::Softmax => {
                                // probs = out, dense = grad_out.
                                func = kernel(&device, "jacobian_bwd", suffix)?;
                                builder = stream.launch_builder(&func);
                                builder.arg(&out_view);
                                builder.arg(&grad_view);
                            }
                            Pass::SelfMatch => {
                                let Some((dense, probs)) = &dense_and_probs else {
                                    bail!("internal: no dense gradient")
                                };
                                func = kernel(&device, "jacobian_bwd", suffix)?;
                                builder = stream.launch_builder(&func);
                                builder.arg(probs.as_cuda_slice::<T>()?);
                                builder.arg(dense.as_cuda_slice::<T>()?);
                            }
                        }
                        builder.arg(ids);
                        builder.arg(links);
                        builder.arg(targets);
                        builder.arg(&out_view);
                        builder.arg(&grad_view);
                        builder.arg(&mut grad);
                        builder.arg(&args.rows_per_batch);
                        builder.arg(&args.vocab);
                        builder.arg(&args.width);
                        builder.arg(&stride);
                        if op.pass != Pass::Rows {
                            builder.arg(&offset);
                        }
                        builder.arg(&args.has_targets);
                        builder.arg(&args.has_pad);
                        builder.arg(&args.pad_id);
                        builder.arg(&eps);
                        // SAFETY: the arguments match the kernel's signature (row_pass_bwd or
                        // jacobian_bwd); row r reads its rows of the [rows, vocab] inputs and of
                        // out / grad_out (rows × stride), the ids and links of its batch element
                        // and its target, and writes its gradient row.
                        unsafe { builder.launch(rows_config(args.rows)?) }.w()?;
                        Ok(())
                    })
                })
            })?;
        }
        CudaStorage::wrap_cuda_slice(grad, device.clone())
    });
    Ok(grad)
}

/// `((dZ + dZᵀ) P, P)` for the self-match pass's backward: `P` recomputed from the logits, the
/// symmetrised `dZ` by a kernel from the first `seq` columns of `grad_out`, the product by
/// cuBLAS.
fn self_match_dense(
    device: &CudaDevice,
    logits: &CudaStorage,
    logits_layout: &Layout,
    grad_out: &CudaStorage,
    grad_layout: &Layout,
    args: &RowArgs,
    stride: u32,
) -> Result<(CudaStorage, CudaStorage)> {
    let (batch, seq, vocab) = logits_layout.shape().dims3()?;
    let seq_arg = dim_u32(seq, "sequence length")?;
    let (probs, sym) = with_float_slice!(logits, |slice, suffix, T| {
        let view = contiguous_view(slice, logits_layout, "logits")?;
        let probs = softmax_rows(device, &view, suffix, args)?;
        let grad_view = contiguous_view(grad_out.as_cuda_slice::<T>()?, grad_layout, "gradient")?;
        let mut sym = alloc::<T>(device, batch * seq * seq)?;
        if args.rows > 0 {
            let func = kernel(device, "symmetrize", suffix)?;
            let stream = device.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&grad_view);
            builder.arg(&mut sym);
            builder.arg(&seq_arg);
            builder.arg(&stride);
            // SAFETY: the arguments match the kernel's signature; row b·S + i reads rows of its
            // batch element of grad_out (S × stride) and writes its row of sym (S).
            unsafe { builder.launch(rows_config(args.rows)?) }.w()?;
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

/// NVRTC's compile of `kernels.cu`: needs `libnvrtc` (the CUDA toolchain's, on
/// `LD_LIBRARY_PATH`), not a GPU. `scripts/build-cuda.sh test --release --features cuda --lib
/// kernels::cuda`.
#[cfg(test)]
mod tests {
    use super::{compile_ptx, KERNEL_FAMILIES};

    /// The `.entry` names of a PTX module.
    fn ptx_entries(ptx: &str) -> Vec<String> {
        ptx.lines()
            .filter_map(|line| {
                let rest = line.trim().split(".entry ").nth(1)?;
                Some(rest.split('(').next()?.trim().to_string())
            })
            .collect()
    }

    /// Every kernel family, in f32 and f64, for a Turing, an Ampere and a Hopper capability:
    /// the PTX targets the capability and holds exactly the `<family>_<dtype>` entry points that
    /// `load` asks for.
    #[test]
    fn nvrtc_compiles_every_kernel_family_in_f32_and_f64() {
        let mut expected: Vec<String> = KERNEL_FAMILIES
            .iter()
            .flat_map(|family| ["f32", "f64"].map(|suffix| format!("{family}_{suffix}")))
            .collect();
        expected.sort();
        assert_eq!(expected.len(), 10);
        for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
            let ptx = compile_ptx((major, minor)).unwrap_or_else(|e| panic!("{e}"));
            assert!(
                ptx.lines()
                    .any(|line| line.trim() == format!(".target sm_{major}{minor}")),
                "compute_{major}{minor}: no `.target sm_{major}{minor}` line in the PTX"
            );
            let mut entries = ptx_entries(&ptx);
            entries.sort();
            assert_eq!(entries, expected, "PTX entries for compute_{major}{minor}");
        }
    }

    /// A capability NVRTC does not know is an error naming it, not a panic or an empty module.
    #[test]
    fn an_unknown_capability_is_an_error() {
        let error = compile_ptx((0, 0))
            .expect_err("compute_00 compiled")
            .to_string();
        assert!(
            error.contains("compute_00") && error.contains("kernels.cu"),
            "{error}"
        );
    }
}
