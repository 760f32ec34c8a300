//! The loss's one validation. Every kind of hypotheses
//! ([`Hypotheses`](hypotheses::Hypotheses): probabilities, logits, or hidden states with the
//! output layer and its blocks) goes through the same three calls —
//! [`bleu_call`](calls::bleu_call), [`cross_entropy_call`](calls::cross_entropy_call),
//! [`training_call`](calls::training_call) — once, into checked values that the passes consume
//! without checking again: the hypotheses in their compute dtype
//! ([`CheckedInput`](hypotheses::CheckedInput)) and the cross-entropy's targets with their count
//! ([`CheckedTargets`](targets::CheckedTargets)). Every error names the argument and its shape
//! or value.
//!
//! Value checks that need the data run in place on the CPU, always; off the CPU they take a
//! counted copy to the host only where the config asks for it
//! ([`BleuLossConfig::check_values`](crate::loss::config::BleuLossConfig::check_values)),
//! except the targets' largest id and count (one small copy, which the mean needs anyway). The
//! CPU kernels report a non-finite logit from the pass they make anyway
//! ([`Path::checks_finite`](crate::loss::dispatch::Path::checks_finite)), so the separate
//! finiteness check is skipped there.
//!
//! One file per kind of input, each imported from directly (this face only declares them):
//! `logits.rs` (probabilities and logits, and the `[B, S, V]` every kind reports), `hidden.rs`
//! (hidden states and the output layer), `hypotheses.rs` (any kind: shaped, then finished),
//! `targets.rs` (the cross-entropy's targets; the BLEU loss's references, lengths and `eos_id`),
//! `calls.rs` (the three calls, which combine them with the config's checks), `stats.rs` (the
//! statistics a caller gives) and `ctc.rs` (the CTC losses' and the BLEU loss on CTC outputs'
//! arguments). None imports a file that imports it: `logits.rs` ← `hidden.rs` ←
//! `hypotheses.rs` ← `calls.rs`, `logits.rs` ← `targets.rs` ← `calls.rs` and `ctc.rs`;
//! `stats.rs` imports none of them.

pub(super) mod calls;
pub(super) mod ctc;
pub(super) mod hidden;
pub(super) mod hypotheses;
pub(super) mod logits;
pub(super) mod stats;
pub(super) mod targets;
