//! The CUDA side of the row op and its backward (`RowOp` and `RowOpBackward`'s `cuda_fwd`, in
//! `row_op.rs`), built only with the `cuda` feature. The op passes what the kernels
//! read as a [`RowArgsIn`] (its parameters and its `RowLayout`): this file imports nothing of
//! the op's. Each launch is a plan of `launch.rs` (kernel, grid, block, parameters in order),
//! the plan the emulator of the CUDA execution model runs in the tests (`emu`, feature
//! `cuda-emu`); [`run`] pushes its parameters to cudarc in that order.
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
//!
//! The cross-entropy's options (class weights, z-loss, token accuracy, a soft cap in the row
//! pass) run `ce_options.cu`'s kernels ([`OPTIONS_MODULE`]), which have passed the emulator but
//! not a GPU: only with the `cuda-unverified` feature; without it the loss sends them to the
//! composed ops (`dispatch::Path::for_options`).

use super::launch::{
    self, row_args, BackwardBuffers, BackwardInput, FloatKind, Launch, Param, RowArgs, RowArgsIn,
    RowPassFwdBuffers, KERNEL_FAMILIES,
};
#[cfg(feature = "cuda-unverified")]
use super::launch::{OPTIONS_16BIT_FAMILIES, OPTIONS_FAMILIES, OPTIONS_SOURCE};
use super::layout::Pass;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaStorageSlice, WrapErr};
use candle_core::{bail, CudaDevice, CudaStorage, Layout, Result, Storage, Tensor, WithDType};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A module of CUDA C kernels: its source, the name it is cached under per device, and its
/// kernel families (each instantiated as `<family>_f32` and `_f64`).
pub(crate) struct KernelModule {
    pub name: &'static str,
    /// The file name NVRTC and its errors report.
    pub file: &'static str,
    pub source: &'static str,
    pub families: &'static [&'static str],
    /// The families also instantiated as `<family>_f16` and `_bf16` (16-bit logits).
    pub sixteen_bit_families: &'static [&'static str],
}

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

/// Compiles `module`'s source to PTX with NVRTC for `compute_{major}{minor}`. Needs `libnvrtc`,
/// not a GPU.
pub(crate) fn compile_ptx(module: &KernelModule, (major, minor): (i32, i32)) -> Result<String> {
    let options = nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
        name: Some(module.file.to_string()),
        ..Default::default()
    };
    match nvrtc::compile_ptx_with_opts(module.source, options) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(error) => bail!(
            "NVRTC failed to compile candle-bleu's {} for compute_{major}{minor}: {error:?}",
            module.file
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

/// The PTX of `module` for the compute capability of `device`, compiled once per capability.
fn ptx(module: &KernelModule, device: &CudaDevice) -> Result<String> {
    type Cache = Mutex<HashMap<(&'static str, (i32, i32)), String>>;
    static PTX: OnceLock<Cache> = OnceLock::new();
    let key = (module.name, compute_capability(device)?);
    let cache = PTX.get_or_init(Default::default);
    if let Some(ptx) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(ptx.clone());
    }
    let ptx = compile_ptx(module, key.1)?;
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, ptx.clone());
    Ok(ptx)
}

/// The kernel `<family>_<suffix>` of `module`, loaded into `device`.
fn kernel(
    module: &KernelModule,
    device: &CudaDevice,
    family: &str,
    suffix: &str,
) -> Result<CudaFunction> {
    let func = device.get_or_load_custom_func(
        &format!("{family}_{suffix}"),
        module.name,
        &ptx(module, device)?,
    )?;
    Ok(func.into_cuda_function())
}

/// Whether every kernel of `module` compiles and loads on `device` (tried once per module and
/// device). The first failure of a module prints one warning; the loss then takes the composed
/// candle ops.
pub(crate) fn load(module: &KernelModule, device: &CudaDevice) -> bool {
    type Loaded = Mutex<HashMap<(&'static str, candle_core::cuda_backend::DeviceId), bool>>;
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    static WARNED: OnceLock<Mutex<Vec<&'static str>>> = OnceLock::new();
    let loaded = LOADED.get_or_init(Default::default);
    let key = (module.name, device.id());
    if let Some(&ok) = loaded.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return ok;
    }
    let instantiated = |families: &'static [&'static str], floats: &'static [FloatKind]| {
        families
            .iter()
            .flat_map(move |family| floats.iter().map(move |float| (*family, *float)))
    };
    let result = instantiated(module.families, &FloatKind::ALL)
        .chain(instantiated(
            module.sixteen_bit_families,
            &FloatKind::SIXTEEN_BIT,
        ))
        .try_for_each(|(family, float)| kernel(module, device, family, float.suffix()).map(drop));
    if let Err(error) = &result {
        let mut warned = WARNED
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !warned.contains(&module.name) {
            warned.push(module.name);
            eprintln!(
                "candle-bleu: the CUDA kernels of {} failed to load ({error}); using composed candle ops",
                module.name
            );
        }
    }
    loaded
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, result.is_ok());
    result.is_ok()
}

/// The contiguous part of `slice` that `layout` addresses.
pub(crate) fn contiguous_view<'a, T>(
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
pub(crate) fn alloc<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
    // SAFETY: every element is written before it is read (each row's block writes its row).
    unsafe { device.alloc::<T>(len.max(1)) }
}

/// The u32 data of a tensor the op holds (ids, links, targets), as a view; a one-element
/// placeholder where the op holds none (the kernels do not read it then).
pub(crate) struct HeldU32 {
    pub tensor: Option<Tensor>,
}

impl HeldU32 {
    pub(crate) fn with<R>(
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

/// A buffer parameter of a launch on the GPU, as cudarc pushes it: data of the launch's
/// arithmetic type `T`, u32 ids or lengths, f64 workspaces, or 16-bit logits and their gradient.
pub(crate) enum Buf<'r, 'v, T> {
    Floats(&'r CudaView<'v, T>),
    Slice(&'r CudaSlice<T>),
    Ids(&'r CudaView<'v, u32>),
    Out(&'r mut CudaSlice<T>),
    /// 16-bit logits and gradients, which only the options kernels take (`cuda-unverified`).
    #[cfg(feature = "cuda-unverified")]
    F16(&'r CudaView<'v, half::f16>),
    #[cfg(feature = "cuda-unverified")]
    F16Out(&'r mut CudaSlice<half::f16>),
    #[cfg(feature = "cuda-unverified")]
    BF16(&'r CudaView<'v, half::bf16>),
    #[cfg(feature = "cuda-unverified")]
    BF16Out(&'r mut CudaSlice<half::bf16>),
    /// f64 workspaces, which only the CTC kernels (`cuda-unverified`) take.
    #[cfg_attr(not(feature = "cuda-unverified"), allow(dead_code))]
    Work(&'r mut CudaSlice<f64>),
    #[cfg_attr(not(feature = "cuda-unverified"), allow(dead_code))]
    WorkIn(&'r CudaSlice<f64>),
}

/// Launches `launch` on `device`'s stream: its parameters pushed in the plan's order, u32s as
/// `u32` and floats as `T` (the launch's arithmetic type: f32 for 16-bit logits).
pub(crate) fn run<T: DeviceRepr + WithDType>(
    module: &KernelModule,
    device: &CudaDevice,
    launch: Launch<Buf<'_, '_, T>>,
) -> Result<()> {
    let expected = match launch.float.arithmetic() {
        FloatKind::F64 => candle_core::DType::F64,
        _ => candle_core::DType::F32,
    };
    if T::DTYPE != expected {
        bail!(
            "internal: a launch of {} over {:?} buffers",
            launch.kernel_name(),
            T::DTYPE
        );
    }
    let func = kernel(module, device, launch.family, launch.float.suffix())?;
    let mut params = launch.params;
    // The scalars live here, at fixed addresses, until the launch has read them.
    let u32s: Vec<u32> = params
        .iter()
        .filter_map(|p| match p {
            Param::U32(v) => Some(*v),
            _ => None,
        })
        .collect();
    let floats: Vec<T> = params
        .iter()
        .filter_map(|p| match p {
            Param::Float(v) => Some(T::from_f64(*v)),
            _ => None,
        })
        .collect();
    let (mut next_u32, mut next_float) = (u32s.iter(), floats.iter());
    let stream = device.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    for param in params.iter_mut() {
        match param {
            Param::Buffer(Buf::Floats(view)) => builder.arg(*view),
            Param::Buffer(Buf::Slice(slice)) => builder.arg(*slice),
            Param::Buffer(Buf::Ids(view)) => builder.arg(*view),
            Param::Buffer(Buf::Out(slice)) => builder.arg(&mut **slice),
            Param::Buffer(Buf::Work(slice)) => builder.arg(&mut **slice),
            Param::Buffer(Buf::WorkIn(slice)) => builder.arg(*slice),
            #[cfg(feature = "cuda-unverified")]
            Param::Buffer(Buf::F16(view)) => builder.arg(*view),
            #[cfg(feature = "cuda-unverified")]
            Param::Buffer(Buf::F16Out(slice)) => builder.arg(&mut **slice),
            #[cfg(feature = "cuda-unverified")]
            Param::Buffer(Buf::BF16(view)) => builder.arg(*view),
            #[cfg(feature = "cuda-unverified")]
            Param::Buffer(Buf::BF16Out(slice)) => builder.arg(&mut **slice),
            Param::U32(_) => match next_u32.next() {
                Some(v) => builder.arg(v),
                None => bail!("internal: a u32 parameter of {} lost", launch.family),
            },
            Param::Float(_) => match next_float.next() {
                Some(v) => builder.arg(v),
                None => bail!("internal: a float parameter of {} lost", launch.family),
            },
        };
    }
    let dims = launch.dims;
    let config = LaunchConfig {
        grid_dim: dims.grid,
        block_dim: dims.block,
        shared_mem_bytes: dims.shared_mem_bytes,
    };
    // SAFETY: the plan (launch.rs) lists the kernel's parameters in its order with its types
    // (the emulator tests check the kinds against the compiled source); each block reads and
    // writes only the rows of its own index (the plan's docs).
    unsafe { builder.launch(config) }.w()?;
    Ok(())
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

/// NVRTC's compile of `kernels.cu`: needs `libnvrtc` (the CUDA toolchain's, on
/// `LD_LIBRARY_PATH`), not a GPU. `scripts/build-cuda.sh test --release --features cuda --lib
/// kernels::cuda`.
#[cfg(test)]
mod tests {
    use super::{compile_ptx, ROW_MODULE};

    /// The `.entry` names of a PTX module.
    fn ptx_entries(ptx: &str) -> Vec<String> {
        ptx.lines()
            .filter_map(|line| {
                let rest = line.trim().split(".entry ").nth(1)?;
                Some(rest.split('(').next()?.trim().to_string())
            })
            .collect()
    }

    /// The modules the build loads: the row op's, and with `cuda-unverified` the CTC loss's and
    /// the options'.
    fn modules() -> Vec<&'static super::KernelModule> {
        #[allow(unused_mut)]
        let mut modules = vec![&ROW_MODULE];
        #[cfg(feature = "cuda-unverified")]
        modules.push(&crate::loss::kernels::ctc_cuda::CTC_MODULE);
        #[cfg(feature = "cuda-unverified")]
        modules.push(&super::OPTIONS_MODULE);
        modules
    }

    /// Every kernel family of every module, in f32 and f64, for a Turing, an Ampere and a Hopper
    /// capability: the PTX targets the capability and holds the `<family>_<dtype>` entry points
    /// that `load` asks for (the row module exactly those).
    #[test]
    fn nvrtc_compiles_every_kernel_family_in_f32_and_f64() {
        for module in modules() {
            let mut expected: Vec<String> =
                module
                    .families
                    .iter()
                    .flat_map(|family| ["f32", "f64"].map(|suffix| format!("{family}_{suffix}")))
                    .chain(module.sixteen_bit_families.iter().flat_map(|family| {
                        ["f16", "bf16"].map(|suffix| format!("{family}_{suffix}"))
                    }))
                    .collect();
            expected.sort();
            for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
                let ptx = compile_ptx(module, (major, minor)).unwrap_or_else(|e| panic!("{e}"));
                assert!(
                    ptx.lines()
                        .any(|line| line.trim() == format!(".target sm_{major}{minor}")),
                    "{}, compute_{major}{minor}: no `.target sm_{major}{minor}` line in the PTX",
                    module.name
                );
                let mut entries = ptx_entries(&ptx);
                entries.sort();
                if module.name == ROW_MODULE.name {
                    assert_eq!(expected.len(), 10);
                    assert_eq!(entries, expected, "PTX entries for compute_{major}{minor}");
                } else {
                    for name in &expected {
                        assert!(
                            entries.contains(name),
                            "{}: no entry {name} in {entries:?}",
                            module.name
                        );
                    }
                }
            }
        }
    }

    /// A capability NVRTC does not know is an error naming it, not a panic or an empty module.
    #[test]
    fn an_unknown_capability_is_an_error() {
        let error = compile_ptx(&ROW_MODULE, (0, 0))
            .expect_err("compute_00 compiled")
            .to_string();
        assert!(
            error.contains("compute_00") && error.contains("kernels.cu"),
            "{error}"
        );
    }
}
