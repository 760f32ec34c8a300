//! chrF and chrF++ (Popović 2015, 2017) exactly as sacrebleu 2.6.0's `CHRF` computes them.
//!
//! chrF is an F-score over character n-grams; chrF++ adds word n-grams. [`corpus_chrf`] and
//! [`sentence_chrf`] take detokenized text, as sacrebleu does, and [`ChrfConfig`] holds
//! sacrebleu's options (`CHRF()` is [`ChrfConfig::default`]; chrF++ is `word_order: 2`,
//! [`ChrfConfig::chrf_plus_plus`]).
//!
//! ```
//! use candle_bleu::exact::chrf::{corpus_chrf, sentence_chrf, ChrfConfig};
//! let hyps = ["The cat sat on the mat.", "A dog barked."];
//! let refs = [vec!["The cat is on the mat."], vec!["The dog barked loudly."]];
//! // sacrebleu: CHRF().corpus_score(hyps, [[r[0] for r in refs]]).score
//! let chrf = corpus_chrf(&hyps, &refs, ChrfConfig::default())?;
//! assert!((chrf.score - 55.429392854736435).abs() < 1e-9);
//! // chrF++: CHRF(word_order=2)
//! let chrf_pp = corpus_chrf(&hyps, &refs, ChrfConfig::chrf_plus_plus())?;
//! assert!((chrf_pp.score - 57.524271314585704).abs() < 1e-9);
//! assert_eq!(chrf_pp.name(), "chrF2++");
//! // sacrebleu's sentence_chrf
//! let one = sentence_chrf("The cat sat on the mat.", &["The cat is on the mat."], ChrfConfig::default())?;
//! assert!((one.score - 67.17273492330233).abs() < 1e-9);
//! # Ok::<(), candle_bleu::exact::MetricError>(())
//! ```
//!
//! # What sacrebleu computes (and this module reproduces)
//! For each segment, after Python's `str.lower` when `lowercase`:
//! - **character n-grams** of orders `1..=char_order` over the code points of the line with
//!   every Python whitespace character removed (`''.join(line.split())`), or of the whole line
//!   when `whitespace` is set;
//! - **word n-grams** of orders `1..=word_order` over `line.split()`, where a word of two or
//!   more code points ending in one of ASCII's 32 punctuation characters is split into the
//!   rest and that character, else one starting with one into that character and the rest
//!   (`_remove_punctuation`; `(hi)` gives `(hi` and `)`);
//! - per order and reference: `hyp` = the hypothesis' n-grams (set to **0 when the reference
//!   has no n-gram of that order**), `ref` = the reference's n-grams, `match` =
//!   `Σ_g min(count_hyp(g), count_ref(g))`;
//! - with several references, the statistics of the reference with the best sentence-level
//!   score (below) are kept; on a tie the earlier reference wins (sacrebleu keeps the first
//!   strictly greater score).
//!
//! A corpus sums the kept statistics ([`ChrfCounts`], additive) and scores the sum with
//! `_compute_f_score`, `β² = factor`, `ε = 1e-16`, for each order `prec = match/hyp` (`ε` if
//! `hyp = 0`) and `rec = match/ref` (`ε` if `ref = 0`):
//! - default (effective order): average `prec` and `rec` over the orders with `hyp > 0` and
//!   `ref > 0`, then `100 · (1+β²)·P·R / (β²·P + R)` (0 when no order qualifies or `P + R = 0`);
//! - `eps_smoothing`: the mean over all orders of `(1+β²)·prec·rec / (β²·prec + rec)` (`ε` when
//!   the denominator is 0), times 100.
//!
//! A sentence is a corpus of one segment. Every floating-point operation is sacrebleu's, in its
//! order, so scores agree to the last bits (the golden test allows 1e-9; see docs/exact.md).
//!
//! # Speed
//! Characters and words are interned into segment-local ids (each hashed once), and n-grams
//! of every order are numbered from their prefix by the crate's n-gram counter
//! (`crate::ngram`): no n-gram is hashed or allocated. Corpora of 128 segments or more are
//! counted on rayon's pool.

pub(super) mod config;
mod entry;
pub(super) mod score;
mod stats;

pub use config::{ChrfConfig, ChrfCounts, ChrfScore};
pub use entry::{corpus_chrf, corpus_chrf_stats, score_chrf_stats, sentence_chrf};
