//! The launch plans of the crate's CUDA kernels, the types every family's plans share: for each
//! launch, the kernel, the grid, the block, the shared memory and the parameters in the kernel's
//! order ([`Launch`]), over buffers of any back-end. Two back-ends execute them: the CUDA one
//! (`cuda.rs`, cudarc on a GPU) and the emulator of the CUDA execution model (`emu`, the same
//! source compiled as host C++, feature `cuda-emu`), so that the emulator tests launch every
//! kernel exactly as a GPU run does — the same dimensions and parameters, from the families'
//! plans (`row/launch.rs`, `ctc/launch.rs`), not a copy.
//!
//! Built with `cuda` or `cuda-emu`; imports nothing of the crate.

use candle_core::{bail, Result};

/// Threads per block; must equal `BLOCK` in `kernels.cu` (the emulator test reads the source's
/// value and compares).
pub(crate) const BLOCK: u32 = 256;
/// The float type of a launch's logits: the suffix of its kernel and, through
/// [`FloatKind::arithmetic`], the width of its float parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FloatKind {
    F32,
    F64,
    /// IEEE binary16 logits, computed in f32 (the options kernels' row pass only).
    F16,
    /// bfloat16 logits, computed in f32 (the options kernels' row pass only).
    BF16,
}

impl FloatKind {
    /// The kernel name's suffix, `f32`, `f64`, `f16` or `bf16`.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            FloatKind::F32 => "f32",
            FloatKind::F64 => "f64",
            FloatKind::F16 => "f16",
            FloatKind::BF16 => "bf16",
        }
    }

    /// The type the kernel computes in, and of its float parameters and output rows: f32 for
    /// the 16-bit types.
    pub(crate) fn arithmetic(self) -> FloatKind {
        match self {
            FloatKind::F64 => FloatKind::F64,
            _ => FloatKind::F32,
        }
    }

    /// Whether the logits are 16-bit.
    pub(crate) fn is_16bit(self) -> bool {
        matches!(self, FloatKind::F16 | FloatKind::BF16)
    }

    /// Every float type every family is instantiated for.
    pub(crate) const ALL: [FloatKind; 2] = [FloatKind::F32, FloatKind::F64];

    /// The 16-bit types some families are also instantiated for.
    pub(crate) const SIXTEEN_BIT: [FloatKind; 2] = [FloatKind::F16, FloatKind::BF16];
}

/// One kernel parameter, in the kernel's order: a device buffer (`B`, the back-end's handle), a
/// u32, or a float passed as the launch's [`FloatKind`].
#[derive(Debug)]
pub(crate) enum Param<B> {
    Buffer(B),
    U32(u32),
    Float(f64),
}

/// A grid of `grid` blocks of `block` threads with `shared_mem_bytes` of dynamic shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LaunchDims {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem_bytes: u32,
}

/// One kernel launch: `<family>_<float>` over `dims` with `params`.
#[derive(Debug)]
pub(crate) struct Launch<B> {
    pub family: &'static str,
    pub float: FloatKind,
    pub dims: LaunchDims,
    pub params: Vec<Param<B>>,
}

impl<B> Launch<B> {
    /// The kernel's entry-point name, `<family>_<f32|f64>`.
    pub(crate) fn kernel_name(&self) -> String {
        format!("{}_{}", self.family, self.float.suffix())
    }
}

/// One block of [`BLOCK`] threads per row.
pub(crate) fn rows_dims(rows: usize) -> Result<LaunchDims> {
    let grid = match u32::try_from(rows) {
        Ok(grid) if grid <= i32::MAX as u32 => grid,
        _ => bail!("candle-bleu CUDA kernels: {rows} rows exceed a grid of 2^31 - 1 blocks"),
    };
    Ok(LaunchDims {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

pub(crate) fn dim_u32(value: usize, what: &str) -> Result<u32> {
    match u32::try_from(value) {
        Ok(v) => Ok(v),
        Err(_) => bail!("candle-bleu CUDA kernels: {what} = {value} exceeds u32::MAX"),
    }
}
