//! Device selection for every research example, candle-examples'
//! convention: the GPU the binary was built for (`--features cuda` or `--features metal`) when
//! one is available, else the CPU; `--cpu` forces the CPU. With `cuda-unverified` a CUDA
//! device's memory pool keeps freed memory (`candle_bleu::cuda_pool`), said on stdout.

use candle_core::{utils, Device, DeviceLocation};

/// The device to run on, printed on stdout as `device: cpu`, `device: cuda:0` or
/// `device: metal:0`. `cpu` (the `--cpu` flag) forces the CPU; otherwise CUDA device 0 when the
/// binary was built with the `cuda` feature and it opens, Metal device 0 likewise with `metal`,
/// else the CPU. A GPU build that finds no GPU says why on stderr and runs on the CPU.
pub fn device(cpu: bool) -> Device {
    let device = if cpu {
        Device::Cpu
    } else if utils::cuda_is_available() {
        Device::new_cuda(0).unwrap_or_else(|e| {
            eprintln!("built with `cuda` but CUDA device 0 did not open ({e}); using the CPU");
            Device::Cpu
        })
    } else if utils::metal_is_available() {
        Device::new_metal(0).unwrap_or_else(|e| {
            eprintln!("built with `metal` but Metal device 0 did not open ({e}); using the CPU");
            Device::Cpu
        })
    } else {
        Device::Cpu
    };
    let name = match device.location() {
        DeviceLocation::Cpu => "cpu".to_string(),
        DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    };
    println!("device: {name}");
    keep_freed_memory(&device);
    device
}

/// Raises a CUDA device's memory-pool release threshold to keep every freed byte, as PyTorch's
/// caching allocator does (candle's default, 0, hands freed memory back to the driver at each
/// synchronisation and allocates it again the next step), and says so on stdout; nothing on
/// other devices or without `cuda-unverified` (the knob has not yet run on a GPU).
fn keep_freed_memory(device: &Device) {
    #[cfg(feature = "cuda-unverified")]
    if device.is_cuda() {
        match candle_bleu::cuda_pool::set_pool_release_threshold(device, u64::MAX) {
            Ok(previous) => println!(
                "CUDA memory pool: release threshold raised from {previous} bytes to the maximum (freed memory is kept for the next step)"
            ),
            Err(e) => eprintln!("CUDA memory pool: the release threshold was left as it is ({e})"),
        }
    }
    let _ = device;
}
