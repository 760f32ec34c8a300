//! Device selection for every research example, candle-examples'
//! convention: the GPU the binary was built for (`--features cuda` or `--features metal`) when
//! one is available, else the CPU; `--cpu` forces the CPU.

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
    device
}
