//! Exact (discrete) BLEU that reproduces sacrebleu 2.6.0 and NLTK 3.10.4 to the last digit.
//!
//! Tokens are any `T: Eq + Hash` (`u32` ids, `String`s, `&str`s). N-grams are counted by the
//! crate's one counter (its internal `ngram` module), so the loss and the metric agree on what
//! a match is. Lines of text are counted as sacrebleu's BLEU counts them by
//! [`TextStatsCounter`].
//!
//! # Semantics
//! Statistics, for a segment with hypothesis `y` (length `c`) and references `ρ^1..ρ^R`:
//! clipped matches `m_n = Σ_g min(count_y(g), max_r count_{ρ^r}(g))` (the max over references,
//! not the sum), totals `t_n = max(0, c - n + 1)`, and the reference length closest to `c`
//! (the shorter one on a tie; an empty reference counts, with length 0). A corpus sums them
//! over segments and computes one score; a sentence is a corpus of one segment. Segments may
//! have different numbers of references (sacrebleu's variable reference count).
//!
//! The [`SmoothMethod`] chooses whose score formula applies:
//! - [`SmoothMethod::None`], [`SmoothMethod::Floor`], [`SmoothMethod::AddK`], [`SmoothMethod::Exp`]:
//!   sacrebleu's `BLEU.compute_bleu`, operation for operation (see [`score_from_stats`]);
//!   [`BleuScore::score`] is bit-for-bit sacrebleu's 0–100 `score` under uniform weights.
//! - [`SmoothMethod::Nltk`]`(k)`: the whole computation follows NLTK's `corpus_bleu` with
//!   `SmoothingFunction().method{k}` (see [`NltkStats`] and [`score_nltk_stats`]).
//!
//! # Edge cases and whose behaviour is followed
//! | input | sacrebleu smoothings | `Nltk(k)` |
//! |---|---|---|
//! | no unigram match anywhere | score 0.0 (sacrebleu #141) | score 0 before smoothing (NLTK) |
//! | an order with `t_n = 0` (hypothesis shorter than `n`) | the order loop stops there (sacrebleu `break`): later precisions 0; score 0 without effective order | denominator floored at 1 per segment (NLTK `max(1, t)`) |
//! | empty hypothesis | counts length 0; `t_n = 0` | adds 1 to every denominator (NLTK) |
//! | empty reference | length 0, no n-grams (both) | same |
//! | tie in reference length | shorter reference (both) | same |
//! | empty corpus (`hyps == []`) | error (sacrebleu raises `IndexError`) | error (NLTK raises `ZeroDivisionError`) |
//! | a segment with no reference | error (sacrebleu `TypeError`) | error (NLTK `KeyError`/`ValueError`) |
//! | `hyps`/`refs` of different lengths | error | error (NLTK `AssertionError`) |
//! | `effective_order` | stop at the first order with zero total (sacrebleu) | ignored (NLTK has none) |
//! | custom `weights` | extension: weighted mean of the logs over the orders that enter, renormalised (see [`score_from_stats`]) | NLTK's weights, not renormalised; orders whose smoothed precision is 0 are dropped (NLTK) |
//! | `Nltk(6)` with `max_order < 3` or no trigram match | — | error (NLTK raises `IndexError` / `AssertionError`), unless there is no unigram match (NLTK returns 0 first) |
//!
//! Scores: [`BleuScore::bleu`] is on 0..=1 (NLTK methods 5–7 can exceed 1, as in NLTK);
//! [`BleuScore::score`] is on 0..=100.
//!
//! # Statistics and speed
//! [`corpus_stats`] gives the statistics of every segment ([`BleuCounts`], additive: sum them
//! with `iter().sum()`), for bootstrap resampling ([`bootstrap`]) or to score any subset with
//! [`score_from_stats`]; [`segment_stats`] counts one segment. [`corpus_bleu`] counts corpora
//! of 512 segments or more on rayon's pool (3000 segments of 26 ids: ~3.1 ms on one core,
//! ~1.6 ms on two; sacrebleu ~230 ms; BENCHMARKS.md).
//!
//! # chrF and chrF++
//! [`chrf`] reproduces sacrebleu's `CHRF` ([`chrf::corpus_chrf`], [`chrf::sentence_chrf`],
//! [`chrf::ChrfConfig`]), with additive per-segment statistics ([`chrf::ChrfCounts`]) that
//! [`bootstrap`] resamples as it does BLEU's.
//!
//! # TER
//! [`ter`] reproduces sacrebleu's `TER` ([`ter::corpus_ter`], [`ter::sentence_ter`],
//! [`ter::TerConfig`]), with additive per-segment statistics ([`ter::TerStats`]) that
//! [`bootstrap`] resamples too.

mod bleu;
pub mod bootstrap;
pub mod chrf;
mod config;
mod corpus;
mod nltk;
mod numpy_rng;
mod sacre;
mod stats;
pub mod ter;
mod text_stats;
pub mod tokenize;

pub use bleu::{
    corpus_bleu, corpus_stats, nltk_corpus_stats, score_from_stats, score_nltk_stats, sentence_bleu,
};
pub use config::{BleuConfig, BleuCounts, BleuScore, MetricError, SmoothMethod, MAX_ORDER};
pub use nltk::NltkStats;
pub use stats::segment_stats;
pub use text_stats::{TextStatsConfig, TextStatsCounter};
