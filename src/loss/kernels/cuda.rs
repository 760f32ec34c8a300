//! The CUDA machinery every kernel family shares, built only with the `cuda` feature: a module
//! of CUDA C kernels ([`KernelModule`]) compiled at run time with NVRTC, once per compute
//! capability, for the device's own architecture (`--gpu-architecture=compute_XY`), and loaded
//! with `CudaDevice::get_or_load_custom_func`, so the crate needs no nvcc of its own ([`load`]:
//! if compiling or loading fails it returns `false`, prints one warning, and the loss takes the
//! composed candle ops); and [`run`], which pushes a launch plan's parameters (`launch.rs`) to
//! cudarc in the plan's order — the plan the emulator of the CUDA execution model runs in the
//! tests (`emu`, feature `cuda-emu`). The families' CUDA sides are `row/cuda.rs` and
//! `ctc/cuda.rs`.

use crate::loss::kernels::launch::{FloatKind, Launch, Param};
use candle_core::cuda_backend::cudarc::driver::{
    result, sys, CudaFunction, CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, CudaDevice, Layout, Result, Storage, Tensor, WithDType};
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

/// NVRTC's compile of a module, which needs `libnvrtc` (the CUDA toolchain's, on
/// `LD_LIBRARY_PATH`), not a GPU: the families' unit tests (`row/cuda.rs`, `ctc/cuda.rs`) run it
/// on their modules. `scripts/build-cuda.sh test --release --features cuda --lib kernels`.
#[cfg(test)]
pub(crate) mod nvrtc_check {
    use super::{compile_ptx, KernelModule};

    /// The `.entry` names of a PTX module.
    fn ptx_entries(ptx: &str) -> Vec<String> {
        ptx.lines()
            .filter_map(|line| {
                let rest = line.trim().split(".entry ").nth(1)?;
                Some(rest.split('(').next()?.trim().to_string())
            })
            .collect()
    }

    /// Every kernel family of `module`, in f32 and f64 (and its 16-bit families in f16 and bf16),
    /// for a Turing, an Ampere and a Hopper capability: the PTX targets the capability and holds
    /// the `<family>_<dtype>` entry points that `load` asks for — exactly those when `exact`.
    pub(crate) fn compiles_every_family(module: &KernelModule, exact: bool) {
        let mut expected: Vec<String> = module
            .families
            .iter()
            .flat_map(|family| ["f32", "f64"].map(|suffix| format!("{family}_{suffix}")))
            .chain(
                module
                    .sixteen_bit_families
                    .iter()
                    .flat_map(|family| ["f16", "bf16"].map(|suffix| format!("{family}_{suffix}"))),
            )
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
            if exact {
                assert_eq!(
                    entries, expected,
                    "{}: PTX entries for compute_{major}{minor}",
                    module.name
                );
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

    /// A capability NVRTC does not know is an error naming it and the module's file, not a panic
    /// or an empty module.
    pub(crate) fn an_unknown_capability_is_an_error(module: &KernelModule) {
        let error = compile_ptx(module, (0, 0))
            .expect_err("compute_00 compiled")
            .to_string();
        assert!(
            error.contains("compute_00") && error.contains(module.file),
            "{error}"
        );
    }
}
