//! The loss's kernels by family, each family a folder with its op, its CPU and CUDA sides and its
//! composed twin side by side, over a shared bottom:
//!
//! - the shared bottom: the float types and the CPU ops' dtype dispatch ([`float`]), whether a
//!   custom op's backward records its backward op ([`backward`]), the row
//!   ops' per-row output layout ([`layout::RowLayout`]), the CPU slice kernels every family
//!   computes with ([`cpu`]: softmax statistics, the row pass over slices, its backward) and the
//!   same row math as composed candle ops ([`composed`]), the CPU matrix products ([`gemm`]), logit soft-capping ([`softcap`]), the launch plans' shared types
//!   (`launch`, with `cuda` or `cuda-emu`), the CUDA module machinery (`cuda`, feature `cuda`)
//!   and the emulator of the CUDA execution model (`emu`, tests with `cuda-emu`);
//! - [`row`]: the custom op over the logits (`row::op::RowOp`, its backward, the ids it gathers
//!   at), its CUDA side (`kernels.cu`, `ce_options.cu`) and `log_softmax`;
//! - [`hidden`]: the hidden-state op (`hidden::op::HiddenRowsOp`) with its CPU and composed
//!   blocks, which run the bottom's row kernels on tiles of logits;
//! - [`ctc`]: the CTC loss's op (`ctc::op::CtcOp`) with its CUDA side (`ctc.cu`) and composed
//!   twin, and the n-gram programs of the BLEU loss on CTC outputs (`ctc::ngrams`) with theirs;
//! - [`score`]: `-log BLEU` of finished statistics rows as one op (`score::op::ScoreOp`), with its
//!   CUDA side (`score.cu`).
//!
//! A family imports only the shared bottom, never another family. This file only declares the
//! modules.

pub(crate) mod backward;
pub(crate) mod composed;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(all(test, feature = "cuda-emu"))]
mod emu;
pub(crate) mod float;
pub(crate) mod gemm;
#[cfg(any(feature = "cuda", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod layout;
pub(crate) mod softcap;

pub(crate) mod ctc;
pub(crate) mod hidden;
pub(crate) mod matches;
pub(crate) mod row;
pub(crate) mod score;
