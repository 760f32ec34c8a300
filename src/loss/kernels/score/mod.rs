//! The score family: its settings ([`args::ScoreArgs`]), `-log BLEU` of finished statistics rows
//! as one op ([`op::ScoreOp`]: its CPU kernel and closed-form backward), with its CUDA side
//! (`cuda`, `score.cu`, feature `cuda-unverified`) and launch plans (`launch`). Its composed twin is the statistics layer's
//! `score::neg_log_bleu_composed`. This file only declares the modules.

pub(crate) mod args;
#[cfg(feature = "cuda-unverified")]
pub(crate) mod cuda;
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) mod launch;
pub(crate) mod op;
