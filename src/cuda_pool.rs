//! The CUDA memory pool's release threshold (feature `cuda-unverified`: not yet run on a GPU).
//!
//! candle 0.11 allocates CUDA buffers with `cuMemAllocAsync` from the device's current memory
//! pool. With the pool's default release threshold (0), every stream synchronisation returns the
//! freed memory to the driver, and the next step allocates it again: on the one GPU run so far
//! (an H200) most of a step's time was host time, allocation and synchronisation among it.
//! PyTorch's caching allocator keeps freed blocks instead. [`set_pool_release_threshold`] is the
//! same knob for candle: keep up to `bytes` of freed memory in the pool. Nothing in the crate
//! sets it by itself; call it once after creating the device, as the `cuda` bench does with
//! `--pool-threshold`.

use candle_core::cuda_backend::cudarc::driver::{result, sys};
use candle_core::cuda_backend::WrapErr;
use candle_core::{bail, Device, Result};
use std::ffi::c_void;

/// Sets the release threshold of `device`'s current memory pool to `bytes` (`u64::MAX`: keep
/// every freed byte until the process ends) and returns the previous threshold.
///
/// Errors, naming the argument, when `device` is not a CUDA device, and when the driver refuses
/// (a device without memory pools).
pub fn set_pool_release_threshold(device: &Device, bytes: u64) -> Result<u64> {
    let Device::Cuda(cuda) = device else {
        bail!(
            "`device`: the memory pool's release threshold is a CUDA setting, got a {:?} device",
            device.location()
        );
    };
    let cu_device = cuda.cuda_stream().context().cu_device();
    // SAFETY: `cu_device` is the device of candle's own context.
    let pool = unsafe { result::device::get_mem_pool(cu_device) }.w()?;
    let attribute = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
    let mut previous: u64 = 0;
    // SAFETY: RELEASE_THRESHOLD is a cuuint64_t, which `previous` and `value` are.
    unsafe {
        result::mem_pool::get_attribute(pool, attribute, &mut previous as *mut u64 as *mut c_void)
    }
    .w()?;
    let mut value = bytes;
    // SAFETY: as above.
    unsafe {
        result::mem_pool::set_attribute(pool, attribute, &mut value as *mut u64 as *mut c_void)
    }
    .w()?;
    Ok(previous)
}
