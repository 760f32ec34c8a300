//! The library the research examples of [candle-bleu](candle_bleu) share, as candle-examples
//! holds what its examples share; the examples (`research/examples/`) keep only their own
//! objectives, training phases, reports and figures.
//!
//! - [`data`]: real human-translated parallel text from gettext `.mo` catalogues, its
//!   deterministic train/dev/test split and byte-level BPE subwords; token-level pairs and
//!   vocabularies; batches of ids.
//! - [`model`]: the Transformer encoder–decoder every example trains, its greedy decoding,
//!   the non-autoregressive model on its layers, its CTC variant (`model::ctc_nat`) and the
//!   soft (differentiable) free-running decoder.
//! - [`nat`], [`ctc_nat`]: the non-autoregressive translation studies (vanilla NAT with a
//!   length predictor; CTC NAT), their teacher, distillation, objectives and reports.
//! - [`task`]: the synthetic translation tasks of the `seq2seq` and `study` examples.
//! - [`train`]: learning-rate schedule, optimiser, in-memory checkpoints, step timing.
//! - [`eval`]: exact BLEU (`candle_bleu::exact`), sacrebleu's paired bootstrap, the
//!   averaging-effect measures, mean ± sd.
//! - [`plot`], [`progress`]: figure pieces and progress bars; [`device`]: the GPU the binary
//!   was built for, else the CPU; [`cli`]: the flags and checks the examples share.
//!
//! This crate is not published; it lives in the candle-bleu repository's workspace
//! (`research/`), and its examples run from the repository root
//! (`cargo run --release --example NAME`).

#![warn(missing_docs)]

pub mod checkpoint;
pub mod cli;
pub mod ctc_nat;
pub mod data;
pub mod decode;
pub mod device;
pub mod eval;
pub mod model;
pub mod mrt;
pub mod nat;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod seq2seq;
pub mod stats;
pub mod study;
pub mod task;
pub mod train;
pub mod translate;
