//! Exact (discrete) BLEU that reproduces sacrebleu 2.6.0 and NLTK 3.10.4 to the last digit.
//!
//! Tokens are any `T: Eq + Hash` (`u32` ids, `String`s, `&str`s). N-grams are counted by the
//! crate's one counter ([`crate::ngram`]), so the loss and the metric agree on what a match is.
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

use std::hash::Hash;

pub mod bootstrap;
pub mod chrf;
mod nltk;
mod sacre;
mod stats;
pub mod tokenize;

pub use nltk::NltkStats;
pub use stats::segment_stats;

pub(crate) use stats::StatsCounter;

/// Not part of the API: what the `candle-bleu` binary, the fuzz targets and the tests need
/// besides it (Python's string functions, the literal reference tokenizer, the interned
/// counter). It may change in any release.
#[doc(hidden)]
pub mod cli_support {
    pub use super::stats::InternedStatsCounter;
    pub use super::tokenize::python::{
        is_python_whitespace, python_lower, python_lower_into, python_rstrip, python_split,
        python_strip,
    };
    use super::tokenize::Tokenizer;

    /// The tokens of `exact::tokenize::tokenize` computed the slow, literal way (every regular
    /// expression of 13a and zh applied as a whole-line pass, as sacrebleu does), for
    /// differential tests of the one-scan tokenizers.
    pub fn tokenize_reference(text: &str, tok: Tokenizer, lowercase: bool) -> Vec<String> {
        super::tokenize::tokenize_reference(text, tok, lowercase)
    }
}

/// Errors of the exact metrics (BLEU and chrF): each names the offending argument and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricError {
    /// A malformed argument: which one, and what is wrong with it.
    InvalidArgument {
        /// The argument's name as in the signature (`"refs"`, `"cfg.max_order"`, ...).
        argument: &'static str,
        /// What is wrong with it, with the offending value, length or index.
        message: String,
    },
}

impl std::fmt::Display for MetricError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricError::InvalidArgument { argument, message } => {
                write!(f, "invalid `{argument}`: {message}")
            }
        }
    }
}

impl std::error::Error for MetricError {}

impl From<crate::ngram::NgramError> for MetricError {
    fn from(e: crate::ngram::NgramError) -> Self {
        MetricError::InvalidArgument {
            argument: e.argument,
            message: e.message,
        }
    }
}

/// The largest n-gram order accepted (`max_order` and [`BleuConfig::max_order`]).
///
/// BLEU uses 4; an order beyond the longest hypothesis only adds zero totals. The bound keeps
/// every per-order vector small, and lies past the order where NLTK's smoothing method 4
/// stops being computable (it raises `OverflowError` from its 1022nd order without a match).
pub const MAX_ORDER: usize = 1024;

/// Checks `1 <= max_order <= MAX_ORDER`, naming `argument` in the error.
fn check_max_order(argument: &'static str, max_order: usize) -> Result<(), MetricError> {
    if !(1..=MAX_ORDER).contains(&max_order) {
        return Err(invalid(
            argument,
            format!("must be in 1..={MAX_ORDER}, got {max_order}"),
        ));
    }
    Ok(())
}

pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> MetricError {
    MetricError::InvalidArgument {
        argument,
        message: message.into(),
    }
}

/// How zero n-gram precisions are smoothed (sacrebleu's `smooth_method`), and with it whose
/// semantics apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmoothMethod {
    /// sacrebleu `none`: a zero-match order makes the score 0.
    None,
    /// sacrebleu `floor` (Chen & Cherry method 1): a zero-match order gets precision
    /// `value / t_n`. sacrebleu's default value is 0.1.
    Floor(f64),
    /// sacrebleu `add-k` (method 2): `(m_n + k) / (t_n + k)` for orders `n >= 2`, applied before
    /// the zero-total test (so `k > 0` makes an empty order 100%, `k = 0` stops there).
    /// sacrebleu's default `k` is 1.
    AddK(f64),
    /// sacrebleu `exp` (NIST, method 3): the i-th zero-match order gets `1 / (2^i · t_n)`.
    Exp,
    /// NLTK `SmoothingFunction().methodK`, K in 0..=7; the whole computation follows NLTK.
    Nltk(u8),
}

/// What to compute.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuConfig {
    /// Largest n-gram order `N` (>= 1).
    pub max_order: usize,
    /// Per-order weights, `max_order` of them, finite and >= 0; `None` = uniform `1/N`.
    pub weights: Option<Vec<f64>>,
    /// How zero precisions are smoothed, and with it whose semantics apply (sacrebleu's or
    /// NLTK's).
    pub smoothing: SmoothMethod,
    /// sacrebleu's `effective_order`: average only over the orders before the first one with
    /// zero total. Ignored under [`SmoothMethod::Nltk`].
    pub effective_order: bool,
}

/// sacrebleu's corpus default (`BLEU()`, `sacrebleu.corpus_bleu`): 4, uniform, `exp`, no
/// effective order.
impl Default for BleuConfig {
    fn default() -> Self {
        Self {
            max_order: 4,
            weights: None,
            smoothing: SmoothMethod::Exp,
            effective_order: false,
        }
    }
}

impl BleuConfig {
    /// sacrebleu's sentence default (`sacrebleu.sentence_bleu`): 4, `exp`, effective order.
    pub fn sacrebleu_sentence() -> Self {
        Self {
            effective_order: true,
            ..Self::default()
        }
    }

    /// NLTK's `corpus_bleu`/`sentence_bleu` with `SmoothingFunction().method{method}` and
    /// default weights `(0.25,) * 4`.
    pub fn nltk(method: u8) -> Self {
        Self {
            smoothing: SmoothMethod::Nltk(method),
            ..Self::default()
        }
    }

    /// Checks `max_order`, `weights` and the smoothing parameters.
    pub fn validate(&self) -> Result<(), MetricError> {
        check_max_order("cfg.max_order", self.max_order)?;
        crate::orders::check_orders(self.max_order, self.weights.as_deref()).map_err(|e| {
            let argument = match e.field {
                "max_order" => "cfg.max_order",
                _ => "cfg.weights",
            };
            invalid(argument, e.message)
        })?;
        match self.smoothing {
            SmoothMethod::Floor(v) if !v.is_finite() || v < 0.0 => Err(invalid(
                "cfg.smoothing",
                format!("Floor value must be finite and >= 0, got {v}"),
            )),
            SmoothMethod::AddK(k) if !k.is_finite() || k < 0.0 => Err(invalid(
                "cfg.smoothing",
                format!("AddK k must be finite and >= 0, got {k}"),
            )),
            SmoothMethod::Nltk(k) if k > 7 => Err(invalid(
                "cfg.smoothing",
                format!("NLTK smoothing method must be 0..=7, got {k}"),
            )),
            _ => Ok(()),
        }
    }

    /// The weights in use: the given ones, or uniform `1/N` (NLTK's `(0.25,) * 4` for N = 4).
    pub fn effective_weights(&self) -> Vec<f64> {
        match &self.weights {
            Some(w) => w.clone(),
            None => vec![1.0 / self.max_order as f64; self.max_order],
        }
    }
}

/// Sufficient statistics of BLEU, summable over segments (`+`, `+=`, `.sum()`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BleuCounts {
    /// Clipped matches `m_n`, orders `1..=N`.
    pub matches: Vec<u64>,
    /// Totals `t_n = max(0, c - n + 1)`, orders `1..=N`.
    pub totals: Vec<u64>,
    /// Hypothesis length `c`.
    pub hyp_len: u64,
    /// Effective (closest) reference length.
    pub ref_len: u64,
}

/// A BLEU score with everything sacrebleu and NLTK report.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// BLEU on 0..=1 (sacrebleu: `score / 100`; NLTK: its float, which methods 5–7 can push
    /// above 1).
    pub bleu: f64,
    /// BLEU on 0..=100: sacrebleu's `score` exactly (identical strings give
    /// `100.00000000000004`, as in sacrebleu); NLTK: `100 · bleu`.
    pub score: f64,
    /// Smoothed precision per order, 0..=1 (orders after sacrebleu's zero-total stop are 0;
    /// NLTK: its smoothed `p_n` as floats, method0's zero orders as `2.2e-308`).
    pub precisions: Vec<f64>,
    /// The same on 0..=100; under sacrebleu semantics exactly sacrebleu's `precisions`.
    pub precisions_pct: Vec<f64>,
    /// Brevity penalty.
    pub bp: f64,
    /// `hyp_len / ref_len`, 0 when `ref_len == 0`.
    pub ratio: f64,
    /// Hypothesis length `c`, summed over the corpus.
    pub hyp_len: u64,
    /// Effective reference length `r` (closest per segment), summed over the corpus.
    pub ref_len: u64,
    /// Matches per order as the reference implementation reports them: sacrebleu's
    /// `counts` (add-k adds `k` to orders >= 2 up to the last order it reached, as sacrebleu
    /// mutates its list), NLTK's corpus numerators.
    pub counts: Vec<f64>,
    /// Totals per order as reported: sacrebleu's `totals` (add-k as above), NLTK's corpus
    /// denominators `Σ max(1, t_n)`.
    pub totals: Vec<f64>,
    /// Number of orders that entered the geometric mean: sacrebleu's `eff_order` (N without
    /// effective order); NLTK: orders with a positive smoothed precision.
    pub effective_order: usize,
}

/// Checks `max_order >= 1`, that `hyps` and `refs` are parallel and every segment has a
/// reference.
fn validate_corpus<T>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> Result<(), MetricError> {
    check_max_order("max_order", max_order)?;
    if hyps.len() != refs.len() {
        return Err(invalid(
            "refs",
            format!(
                "must have one entry (a list of references) per hypothesis: {} hypotheses, {} \
                 reference lists",
                hyps.len(),
                refs.len()
            ),
        ));
    }
    if let Some(i) = refs.iter().position(|r| r.is_empty()) {
        return Err(invalid(
            "refs",
            format!("segment {i} has no reference (refs[{i}] is empty)"),
        ));
    }
    Ok(())
}

/// Per-segment statistics of a corpus, orders `1..=max_order`: `stats[i]` are those of
/// `hyps[i]` against its references `refs[i]`. For bootstrap resampling ([`bootstrap`]), or to
/// sum (`stats.iter().sum()`) and score any subset with [`score_from_stats`]. Corpora of
/// 512 segments or more are counted on rayon's pool (the same numbers).
///
/// Errors: `max_order` outside `1..=`[`MAX_ORDER`], `hyps.len() != refs.len()`, a segment
/// with no reference.
///
/// ```
/// use candle_bleu::exact::{corpus_stats, score_from_stats, BleuConfig, BleuCounts};
/// let hyps = [vec!["the", "cat", "sat"], vec!["a", "dog"]];
/// let refs = [vec![vec!["the", "cat", "sat", "down"]], vec![vec!["a", "dog"]]];
/// let stats = corpus_stats(&hyps, &refs, 2)?;
/// assert_eq!((stats[0].matches.clone(), stats[0].totals.clone()), (vec![3, 2], vec![3, 2]));
/// assert_eq!((stats[0].hyp_len, stats[0].ref_len), (3, 4));
/// let total: BleuCounts = stats.iter().sum();
/// let cfg = BleuConfig { max_order: 2, ..BleuConfig::default() };
/// assert_eq!(score_from_stats(&total, &cfg)?.bp, (1.0f64 - 6.0 / 5.0).exp());
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn corpus_stats<T: Eq + Hash + Sync>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> Result<Vec<BleuCounts>, MetricError> {
    use rayon::prelude::*;
    validate_corpus(hyps, refs, max_order)?;
    let count = |h: &[Vec<T>], r: &[Vec<Vec<T>>]| -> Vec<BleuCounts> {
        let mut counter = StatsCounter::new_unchecked(max_order);
        h.iter()
            .zip(r)
            .map(|(h, r)| counter.segment(h, r))
            .collect()
    };
    if hyps.len() < PARALLEL_MIN_SEGMENTS {
        return Ok(count(hyps, refs));
    }
    let chunk = parallel_chunk(hyps.len());
    Ok(hyps
        .par_chunks(chunk)
        .zip(refs.par_chunks(chunk))
        .flat_map_iter(|(h, r)| count(h, r))
        .collect())
}

/// Segments per rayon task: about four tasks per thread, at least 256 segments each.
fn parallel_chunk(segments: usize) -> usize {
    (segments / (4 * rayon::current_num_threads()).max(1)).max(256)
}

/// The summed statistics of already validated segments, counted by one [`StatsCounter`].
fn sum_segment_stats<T: Eq + Hash>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> BleuCounts {
    let mut counter = StatsCounter::new_unchecked(max_order);
    let mut total = BleuCounts::zeros(max_order);
    for (h, r) in hyps.iter().zip(refs) {
        counter.add_segment(h, r, &mut total);
    }
    total
}

/// The summed statistics of a validated corpus, on rayon's pool from
/// [`PARALLEL_MIN_SEGMENTS`] segments on (integer sums: the same numbers).
fn corpus_stats_sum<T: Eq + Hash + Sync>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> BleuCounts {
    use rayon::prelude::*;
    if hyps.len() < PARALLEL_MIN_SEGMENTS {
        return sum_segment_stats(hyps, refs, max_order);
    }
    let chunk = parallel_chunk(hyps.len());
    hyps.par_chunks(chunk)
        .zip(refs.par_chunks(chunk))
        .map(|(h, r)| sum_segment_stats(h, r, max_order))
        .reduce(|| BleuCounts::zeros(max_order), |a, b| a + b)
}

/// NLTK's corpus statistics (see [`NltkStats`]): per-segment floored denominators, and the
/// last segment's length and 5-gram precision. Errors as [`corpus_stats`].
pub fn nltk_corpus_stats<T: Eq + Hash>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> Result<NltkStats, MetricError> {
    validate_corpus(hyps, refs, max_order)?;
    let mut stats = NltkStats::new(max_order);
    let mut counter = StatsCounter::new_unchecked(max_order);
    let mut segment = BleuCounts::zeros(max_order);
    let last = hyps.len().saturating_sub(1);
    for (i, (h, r)) in hyps.iter().zip(refs).enumerate() {
        if i == last && max_order < 5 {
            // NLTK's methods 5 and 7 read the last segment's 5-gram precision.
            // `push_segment` sums the first `max_order` orders and keeps order 5 as
            // `last_fivegram`.
            stats.push_segment(&StatsCounter::new_unchecked(5).segment(h, r));
        } else {
            segment.matches.fill(0);
            segment.totals.fill(0);
            segment.hyp_len = 0;
            segment.ref_len = 0;
            counter.add_segment(h, r, &mut segment);
            stats.push_segment(&segment);
        }
    }
    Ok(stats)
}

/// Checks that summed statistics have `cfg.max_order` orders.
fn check_stats_orders(matches: usize, totals: usize, cfg: &BleuConfig) -> Result<(), MetricError> {
    if matches != cfg.max_order || totals != cfg.max_order {
        return Err(invalid(
            "stats",
            format!(
                "must hold cfg.max_order = {} orders, got {} matches and {} totals",
                cfg.max_order, matches, totals
            ),
        ));
    }
    Ok(())
}

/// Scores summed statistics under sacrebleu's `compute_bleu` (0..=100 arithmetic, then
/// `bleu = score / 100`):
/// 1. `BP = 1` if `c >= r`, `0` if `c == 0 < r`, else `exp(1 - r/c)`.
/// 2. No match in any order: score 0.
/// 3. For n = 1..=N: add-k adds `k` to `m_n` and `t_n` for n >= 2; `t_n == 0` stops the
///    loop (later precisions stay 0); with `effective_order` the mean runs over the orders
///    reached; a zero-match order gets `exp`'s `1/(2^i t_n)`, `floor`'s `v/t_n`, else 0.
/// 4. `score = BP · exp(mean of ln p_n)`, `ln 0 = -9999999999` (score 0).
///
/// With `cfg.weights = Some(w)` (an extension: sacrebleu has only uniform weights), step 4
/// uses `Σ_{n<=eff} w_n ln p_n / Σ_{n<=eff} w_n`, the weighted geometric mean renormalised
/// over the orders that enter (an order with weight 0 is ignored, even at precision 0; if
/// all weights that enter are 0, the mean is 1 and the score is BP). Uniform weights give
/// sacrebleu's value up to rounding; `None` gives its bits.
///
/// Errors: invalid `cfg`, `stats` without `cfg.max_order` orders, and `SmoothMethod::Nltk`
/// (NLTK needs per-segment information: use [`nltk_corpus_stats`] and [`score_nltk_stats`]).
pub fn score_from_stats(stats: &BleuCounts, cfg: &BleuConfig) -> Result<BleuScore, MetricError> {
    cfg.validate()?;
    if let SmoothMethod::Nltk(_) = cfg.smoothing {
        return Err(invalid(
            "cfg.smoothing",
            "NLTK semantics need per-segment floored denominators and the last segment: \
             score NltkStats (nltk_corpus_stats) with score_nltk_stats",
        ));
    }
    check_stats_orders(stats.matches.len(), stats.totals.len(), cfg)?;
    Ok(sacre::score(
        stats,
        cfg.weights.as_deref(),
        cfg.smoothing,
        cfg.effective_order,
    ))
}

/// Scores NLTK statistics as NLTK's `corpus_bleu(..., weights, smoothing_function=
/// SmoothingFunction().method{k})` (`cfg.smoothing` must be `Nltk(k)`):
/// `p_n = numerators[n] / denominators[n]` as fractions; no unigram match → 0; smoothing as
/// NLTK (method0: a zero numerator gives `f64::MIN_POSITIVE`; method1: `0.1/d`; method2:
/// `(m+1)/(d+1)` for orders >= 2; method3: `1/(2^k d)`; method4: `ln(L)/(2^k·5)/d`, nothing
/// if `L <= 1`; method5: three-point average with the last segment's 5-gram precision;
/// method6: interpolation with `α = 5`; method7: 4 then 5); then
/// `bleu = BP · exp(fsum(w_n ln p_n for p_n > 0))`, with NLTK's BP (`1` if `c > r`, `0` if
/// `c == 0`, else `exp(1 - r/c)`). Rationals are exact (big integers) as in Python.
///
/// Errors: invalid `cfg`, a non-NLTK smoothing, stats without `cfg.max_order` orders or with
/// a zero denominator (no segment), method6 with `max_order < 3` or no trigram match, methods
/// 5/7 without a valid `last_fivegram`, method 4/7 past NLTK's float overflow (1022 orders
/// without a match; NLTK raises `OverflowError`).
///
/// ```
/// use candle_bleu::exact::{nltk_corpus_stats, score_nltk_stats, BleuConfig};
/// let hyps = [vec!["the", "cat", "sat", "on", "the", "mat"], vec!["a", "dog", "ran"]];
/// let refs = [
///     vec![vec!["the", "cat", "is", "on", "the", "mat"]],
///     vec![vec!["a", "dog", "runs"]],
/// ];
/// let stats = nltk_corpus_stats(&hyps, &refs, 4)?;
/// assert_eq!(stats.denominators, [9, 7, 5, 4]); // Σ max(1, t_n) per segment
/// let score = score_nltk_stats(&stats, &BleuConfig::nltk(4))?;
/// assert_eq!(score.bleu, 0.2643415812880757); // NLTK's corpus_bleu, method4
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn score_nltk_stats(stats: &NltkStats, cfg: &BleuConfig) -> Result<BleuScore, MetricError> {
    cfg.validate()?;
    let SmoothMethod::Nltk(method) = cfg.smoothing else {
        return Err(invalid(
            "cfg.smoothing",
            format!(
                "score_nltk_stats needs SmoothMethod::Nltk(k), got {:?}",
                cfg.smoothing
            ),
        ));
    };
    check_stats_orders(stats.numerators.len(), stats.denominators.len(), cfg)?;
    nltk::score(stats, &cfg.effective_weights(), method)
}

/// Corpus BLEU of `hyps[i]` against the references `refs[i]` (`[segment][reference]`;
/// segments may have different numbers of references): statistics summed over segments,
/// then one score — sacrebleu's `BLEU(...).corpus_score` on the same tokens, or NLTK's
/// `corpus_bleu` under [`SmoothMethod::Nltk`] (see the module docs for every edge case).
///
/// Errors (naming the argument): invalid `cfg` (`max_order` 0, weights of the wrong length,
/// negative or not finite, NLTK method > 7, negative or non-finite smoothing values),
/// `hyps.len() != refs.len()`, a segment with no reference, an empty corpus (sacrebleu raises
/// `IndexError`, NLTK `ZeroDivisionError`), and NLTK method6 where NLTK raises.
///
/// Speed: corpora of 512 segments or more are counted on rayon's thread pool (integer sums,
/// so the result is identical), which is why `T` must be `Sync` (every token type in
/// practice: ids, `String`, `&str`).
///
/// ```
/// use candle_bleu::exact::{corpus_bleu, BleuConfig};
/// let hyps = [vec!["the", "cat", "sat", "on", "the", "mat"], vec!["a", "dog", "ran"]];
/// let refs = [
///     vec![vec!["the", "cat", "is", "on", "the", "mat"]],
///     vec![vec!["a", "dog", "runs"]],
/// ];
/// // sacrebleu: BLEU().corpus_score(hyps, [refs]).score on the same tokens.
/// let sacre = corpus_bleu(&hyps, &refs, &BleuConfig::default())?;
/// assert_eq!(sacre.score, 34.88783797973686);
/// // NLTK: corpus_bleu(refs, hyps, smoothing_function=SmoothingFunction().method4).
/// let nltk = corpus_bleu(&hyps, &refs, &BleuConfig::nltk(4))?;
/// assert_eq!(nltk.bleu, 0.2643415812880757);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn corpus_bleu<T: Eq + Hash + Sync>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    cfg: &BleuConfig,
) -> Result<BleuScore, MetricError> {
    cfg.validate()?;
    if hyps.is_empty() {
        return Err(invalid(
            "hyps",
            "the corpus is empty (sacrebleu raises IndexError, NLTK ZeroDivisionError)",
        ));
    }
    match cfg.smoothing {
        SmoothMethod::Nltk(_) => {
            let stats = nltk_corpus_stats(hyps, refs, cfg.max_order)?;
            score_nltk_stats(&stats, cfg)
        }
        _ => {
            validate_corpus(hyps, refs, cfg.max_order)?;
            score_from_stats(&corpus_stats_sum(hyps, refs, cfg.max_order), cfg)
        }
    }
}

/// From this many segments on, [`corpus_bleu`] and [`corpus_stats`] count in parallel: below
/// it a thread pool's start-up costs more than the counting (about 1 µs a segment).
const PARALLEL_MIN_SEGMENTS: usize = 512;

/// Sentence BLEU of `hyp` against `refs`: [`corpus_bleu`] of a one-segment corpus, as both
/// sacrebleu's `sentence_score` and NLTK's `sentence_bleu` define it. Note that sacrebleu's
/// `sentence_bleu` function defaults to effective order ([`BleuConfig::sacrebleu_sentence`]),
/// while `BleuConfig::default()` does not.
///
/// Errors: as [`corpus_bleu`]; `refs` empty.
///
/// ```
/// use candle_bleu::exact::{sentence_bleu, BleuConfig};
/// let hyp = ["the", "cat", "sat", "on", "the", "mat"];
/// let refs = [vec!["the", "cat", "is", "on", "the", "mat"]];
/// // sacrebleu.sentence_bleu (effective order) and NLTK's sentence_bleu with method1.
/// let sacre = sentence_bleu(&hyp, &refs, &BleuConfig::sacrebleu_sentence())?;
/// assert_eq!(sacre.score, 37.99178428257963);
/// let nltk = sentence_bleu(&hyp, &refs, &BleuConfig::nltk(1))?;
/// assert_eq!(nltk.bleu, 0.25406637407730737);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn sentence_bleu<T: Eq + Hash>(
    hyp: &[T],
    refs: &[Vec<T>],
    cfg: &BleuConfig,
) -> Result<BleuScore, MetricError> {
    cfg.validate()?;
    if refs.is_empty() {
        return Err(invalid(
            "refs",
            "the sentence has no reference (refs is empty)",
        ));
    }
    let mut counter = StatsCounter::new_unchecked(cfg.max_order);
    match cfg.smoothing {
        SmoothMethod::Nltk(_) => {
            let seg = if cfg.max_order < 5 {
                StatsCounter::new_unchecked(5).segment(hyp, refs)
            } else {
                counter.segment(hyp, refs)
            };
            let mut stats = NltkStats::new(cfg.max_order);
            stats.push_segment(&seg);
            score_nltk_stats(&stats, cfg)
        }
        _ => score_from_stats(&counter.segment(hyp, refs), cfg),
    }
}
