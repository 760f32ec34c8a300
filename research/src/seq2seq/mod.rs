//! The seq2seq comparison (`cargo run --release --example seq2seq`): cross-entropy against a
//! cross-entropy warm-up then `CE + λ · BLEU loss` on a small Transformer, at equal steps, over
//! seeds. Its command line ([`config`]), one training run ([`train`]), the report and its
//! statistics ([`report`]), the training curves ([`plot`]), and the whole run ([`entry`]).

pub mod config;
pub mod entry;
pub mod plot;
pub mod report;
pub mod train;
