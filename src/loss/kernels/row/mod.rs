//! The row op family: the custom op over the logits ([`op::RowOp`], its backward op, the ids it
//! gathers at), its CUDA side (`cuda`, `kernels.cu` and `ce_options.cu`, feature `cuda`) and
//! launch plans (`launch`), and the crate's `log_softmax` with its backward ([`log_softmax`]);
//! its composed twin is the bottom's `composed` (the row math as candle ops, which the hidden
//! family's composed blocks use too). This file only declares the modules.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod log_softmax;
pub(crate) mod op;
