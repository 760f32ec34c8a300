//! The non-autoregressive translation study (`research/examples/nat`, `docs/nat.md`): does the
//! BLEU loss help where its expected n-gram counts are exact, in a NAT whose output positions
//! are independent given the source and the length?
//!
//! - [`batches`]: NAT training batches (targets without BOS/EOS, uniform-copy decoder inputs,
//!   length classes);
//! - [`objective`]: the fine-tuning objectives (`ce`, `bon2`, `bleu4`) and a training step;
//! - [`decode`]: length candidates, argmax decoding, the reported variants, speed;
//! - [`teacher`]: the autoregressive teacher (reused from a translate run or trained) and the
//!   sequence-level distillation of the training sources;
//! - [`files`]: gzipped line files and SHA-256;
//! - [`config`]: the study's command line; [`study`]: its driver and phases; [`report`]:
//!   statistics, results.json and the table.

pub mod batches;
pub mod config;
pub mod decode;
pub mod files;
pub mod objective;
mod plan;
pub mod report;
pub mod study;
pub mod teacher;
