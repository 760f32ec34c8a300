//! The library the research examples of [candle-bleu](candle_bleu) share, as candle-examples
//! holds what its examples share.
//!
//! - [`data`]: real human-translated parallel text from gettext `.mo` catalogues, its
//!   deterministic train/dev/test split, and byte-level BPE subwords.
//!
//! This crate is not published; it lives in the candle-bleu repository's workspace
//! (`research/`), and its examples run from the repository root
//! (`cargo run --release --example NAME`).

#![warn(missing_docs)]

pub mod data;
