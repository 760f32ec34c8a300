//! The hidden-state op family: the op ([`op::HiddenRowsOp`], one op for every device), its
//! raw-slice CPU blocks ([`cpu`]: the GEMM per vocabulary tile, the bottom's row kernels on the
//! tile, gradient filtering) and its candle-op blocks ([`composed`]). This file only declares the
//! modules.

pub(crate) mod composed;
pub(crate) mod cpu;
pub(crate) mod op;
