//! The CTC non-autoregressive translation study (`research/examples/ctc_nat`,
//! `docs/ctc_nat.md`): a NAT whose decoder reads the source upsampled `r` times and is trained
//! with CTC ([`crate::model::ctc_nat`]), then fine-tuned with the BLEU loss on its CTC outputs
//! (`candle_bleu::loss::ctc_bleu_loss_from_logits`: the exact expected n-gram counts of the
//! collapsed sequence) — Gu & Kong (2021) and Shao & Feng (2022) report that CTC with an n-gram
//! objective brings a NAT to its autoregressive teacher.
//!
//! - [`batches`]: which pairs have a CTC alignment, training batches;
//! - [`objective`]: `ctc`, `ctc+bon2`, `ctc+bleu4` and a training step;
//! - [`decode`]: greedy CTC decoding;
//! - [`config`]: the command line; [`study`]: the driver. The teacher, distillation, training
//!   loop, statistics and files are the NAT and translate studies'.

pub mod batches;
pub mod config;
pub mod decode;
pub mod objective;
mod plan;
pub mod study;
