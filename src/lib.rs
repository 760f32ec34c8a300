//! BLEU as a training signal for [candle](https://github.com/huggingface/candle) 0.11
//! sequence-to-sequence models.
//!
//! - [`loss`]: a **differentiable BLEU loss** on candle tensors. It takes hypothesis
//!   distributions (or logits) `[B, S, V]` and references as token ids or one-hot/soft rows, and
//!   returns `-log BLEU` with its gradient and the differentiable n-gram statistics. It is exact
//!   BLEU at one-hot inputs, and finite with finite gradients everywhere.
//! - [`exact`]: an **exact BLEU** that reproduces sacrebleu 2.6.0 (every smoothing, effective
//!   order, the `none`/`13a`/`intl`/`char`/`zh` tokenizers, bootstrap confidence intervals and
//!   paired tests with sacrebleu's own random numbers) and NLTK 3.10.4 (`method0`–`method7`) to
//!   the last digit, and sacrebleu's **chrF and chrF++** ([`exact::chrf`]) and **TER**
//!   ([`exact::ter`]).
//! - [`gradcheck`]: finite-difference gradient checks for any scalar candle function.
//! - Inside, one n-gram counter (the private `ngram` module) serves both the loss and the
//!   metrics, so they always agree on what a match is.
//!
//! # Quick start
//!
//! A training step with the loss. Here the logits are a `Var` updated by SGD; in a model they
//! come from its forward pass:
//!
//! ```
//! use candle_bleu::loss::{bleu_loss_from_logits, BleuLossConfig, References};
//! use candle_core::{Device, Tensor, Var};
//! use candle_nn::{Optimizer, SGD};
//!
//! let device = Device::Cpu;
//! // Two references, u32 [B, T]; trailing 0s are padding (pad_id = 0).
//! let refs = References::from_ids(&Tensor::new(&[[1u32, 2, 3, 4, 0], [5, 6, 7, 0, 0]], &device)?, 0)?;
//! // Logits [B, S, V] = [2, 5, 8]: two hypotheses of 5 positions over a vocabulary of 8.
//! let logits = Var::randn(0f32, 1.0, (2, 5, 8), &device)?;
//! let cfg = BleuLossConfig::default(); // 4-grams, expected form, corpus BLEU, BLEU+1 smoothing
//! let mut sgd = SGD::new(vec![logits.clone()], 0.5)?;
//!
//! let first = bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?.loss;
//! for _ in 0..20 {
//!     let out = bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?;
//!     sgd.backward_step(&out.loss)?; // out.loss = -log BLEU, a scalar
//! }
//! let last = bleu_loss_from_logits(logits.as_tensor(), None, &refs, &cfg)?.loss;
//! assert!(last.to_scalar::<f32>()? < first.to_scalar::<f32>()?);
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! In a real model, add the loss to cross-entropy (`ce + λ · loss`). Take logits, as above, or
//! probabilities from `candle_nn::ops::softmax(x, D::Minus1)` with [`loss::bleu_loss`].
//! `candle_nn::ops::softmax_last_dim` has no backward, and a loss computed from it gets no
//! gradient.
//!
//! Corpus BLEU as sacrebleu computes it, on text tokenized by sacrebleu's `13a` tokenizer:
//!
//! ```
//! use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
//! use candle_bleu::exact::{corpus_bleu, BleuConfig};
//!
//! let tok = |line: &str| tokenize(line, Tokenizer::V13a, false);
//! let hyps = vec![tok("The cat sat on the mat."), tok("A dog barked at the postman.")];
//! // refs[segment][reference][token]: one reference per segment here.
//! let refs = vec![vec![tok("The cat sat on the mat.")], vec![tok("The dog barked at the mailman.")]];
//! let score = corpus_bleu(&hyps, &refs, &BleuConfig::default())?; // sacrebleu's corpus default
//! assert_eq!(score.counts, vec![12.0, 9.0, 7.0, 5.0]);
//! assert_eq!(score.totals, vec![14.0, 12.0, 10.0, 8.0]);
//! assert_eq!(score.score, 72.82376575609848); // `sacrebleu.corpus_bleu(hyps, [refs]).score`
//! # Ok::<(), candle_bleu::exact::MetricError>(())
//! ```
//!
//! # Modules
//!
//! | module | what it holds |
//! |---|---|
//! | [`loss`] | [`loss::bleu_loss`], [`loss::bleu_loss_from_logits`], [`loss::BleuLossConfig`] (form, length model, reduction, smoothing), [`loss::References`], [`loss::loss_from_stats`] for data-parallel training; [`loss::ce_bleu_from_logits`] and [`loss::ce_bleu_from_hidden`] for a training step (the row kernels they run are private) |
//! | [`exact`] | [`exact::corpus_bleu`], [`exact::sentence_bleu`], [`exact::BleuConfig`] and [`exact::SmoothMethod`] (sacrebleu's or NLTK's semantics), statistics and scoring from statistics, [`exact::TextStatsCounter`] (statistics of lines of text, as the command line counts them) |
//! | [`exact::chrf`] | [`exact::chrf::corpus_chrf`], [`exact::chrf::sentence_chrf`], [`exact::chrf::ChrfConfig`]: sacrebleu's chrF and chrF++ |
//! | [`exact::ter`] | [`exact::ter::corpus_ter`], [`exact::ter::sentence_ter`], [`exact::ter::TerConfig`]: sacrebleu's TER |
//! | [`exact::tokenize`] | sacrebleu's tokenizers, with Python's string semantics |
//! | [`exact::bootstrap`] | bootstrap confidence intervals, paired bootstrap and approximate randomization of BLEU, chrF or TER ([`exact::bootstrap::BootstrapConfig`]: samples and seed), with NumPy's PCG64 |
//! | [`gradcheck`] | [`gradcheck::check_gradients`]: autograd against central finite differences in f64 |
//! | `ngram` (private) | clipped n-gram matches and the reference masks of the loss; the crate's one hash-table probe |
//!
//! Dependencies point one way: the command line uses [`exact`]'s public API only; [`exact`]
//! and [`loss`] use the private `ngram`.
//!
//! # Feature flags
//!
//! | feature | effect |
//! |---|---|
//! | `cli` | builds the `candle-bleu` binary, sacrebleu's BLEU and chrF command line (`cargo install candle-bleu --features cli`); off by default, so the library does not depend on `clap` |
//! | `cuda`, `cudnn`, `metal`, `mkl`, `accelerate` | passed to `candle-core` and `candle-nn` |
//!
//! # The mathematics
//!
//! Two documents in the repository (and in the packaged crate) hold the derivations that the
//! code's names refer to:
//!
//! - `docs/loss.md`: the loss term by term. It covers the token match matrix `X` (`token_match`),
//!   the first-occurrence masks `ν` (`first`) and clip counts `κ` (`clip`), the expected, paired
//!   and lower-bound forms, the length models, the brevity penalty, smoothing, the guards and
//!   the reductions, with a worked example checked by `tests/docs_worked_example.rs`.
//! - `docs/exact.md`: what sacrebleu 2.6 and NLTK 3.10 compute (BLEU and chrF), every quirk
//!   reproduced, and the golden test that covers each.
// Every public item is documented; CI (clippy with warnings denied) keeps it so.
#![warn(missing_docs)]

#[cfg(feature = "cuda-unverified")]
pub mod cuda_pool;
pub mod exact;
pub mod gradcheck;
pub mod loss;
mod ngram;
mod orders;

// The README's Rust blocks are compiled and run as doctests, so its snippets cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
