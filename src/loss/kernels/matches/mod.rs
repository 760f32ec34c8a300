//! The matches family: the expected form's clipped matches as one op ([`op::ExpectedMatchesOp`]:
//! its CPU kernel and backward; settings in [`args::MatchArgs`]), with its CUDA side (`cuda`,
//! `matches.cu`, feature `cuda-unverified`) and launch plans (`launch`). Its composed twin is the
//! statistics layer's `forms::expected`. This file only declares the modules.

pub(crate) mod args;
#[cfg(feature = "cuda-unverified")]
pub(crate) mod cuda;
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod op;
