//! The loss's kernels, one concern a file: the custom op over the logits
//! ([`row_op::RowOp`], with its backward op, the ids it gathers at and the CPU ops' f32/f64
//! dispatch), the one owner of its per-row output layout ([`layout::RowLayout`]), its CPU
//! slice kernels ([`cpu`]) and CUDA kernels (`cuda`, `kernels.cu`, behind the `cuda`
//! feature), the same rows as composed candle ops ([`composed`]), the hidden-state op
//! ([`hidden`]) with its CPU and composed blocks, logit soft-capping ([`softcap`]), the CTC
//! n-gram op, and `log_softmax` with its backward ([`log_softmax`]). This file only
//! declares the modules.

pub(crate) mod composed;
pub(crate) mod cpu;
pub(crate) mod ctc_composed;
pub(crate) mod ctc_cpu;
#[cfg(feature = "cuda-unverified")]
pub(crate) mod ctc_cuda;
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) mod ctc_launch;
pub(crate) mod ctc_ngrams;
pub(crate) mod ctc_ngrams_composed;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(all(test, feature = "cuda-emu"))]
mod emu;
pub(crate) mod float;
pub(crate) mod gemm;
pub(crate) mod hidden;
pub(crate) mod hidden_composed;
pub(crate) mod hidden_cpu;
#[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod layout;
pub(crate) mod log_softmax;
pub(crate) mod row_op;
pub(crate) mod softcap;
