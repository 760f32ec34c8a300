//! The CTC family: the CTC loss's op ([`op::CtcOp`], log-space forward–backward over raw slices)
//! with its CUDA side (`cuda`, `ctc.cu`, feature `cuda-unverified`) and launch plans (`launch`)
//! and its composed twin ([`composed`]); the n-gram programs of the BLEU loss on CTC outputs
//! ([`ngrams::CtcNgramOp`]) with their CUDA side (`ngrams_cuda`, `ngrams.cu`, feature
//! `cuda-unverified`) and launch plans (`ngrams_launch`), and their composed twin
//! ([`ngrams_composed`]). This file only declares the modules.

pub(crate) mod composed;
#[cfg(feature = "cuda-unverified")]
pub(crate) mod cuda;
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod ngrams;
pub(crate) mod ngrams_composed;
#[cfg(feature = "cuda-unverified")]
pub(crate) mod ngrams_cuda;
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) mod ngrams_launch;
pub(crate) mod op;
