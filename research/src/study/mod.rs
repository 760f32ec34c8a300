//! The study (`cargo run --release --example study`): every form and length model of the BLEU
//! loss next to cross-entropy, BLEU alone and the loss on a soft free-running decode, from the
//! same warm-up, over seeds, on `task::agreement` (docs/study.md). Its command line
//! ([`config`]), the objectives and one training run ([`arms`]), a seed's warm-up and an
//! objective's run with its measures ([`run`]), the report ([`report`]), the figures
//! ([`plots`]) and the whole study ([`entry`]).

pub mod arms;
pub mod config;
pub mod entry;
pub mod plots;
pub mod report;
pub mod run;
