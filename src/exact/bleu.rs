//! Corpus and sentence BLEU as sacrebleu and NLTK compute them: the corpus statistics, the
//! scores from statistics, and the entry points.

use std::hash::Hash;

use super::config::{
    check_max_order, invalid, BleuConfig, BleuCounts, BleuScore, MetricError, SmoothMethod,
};
use super::corpus::{check_corpus, check_sentence, EmptyCorpus};
use super::nltk::{self, NltkStats};
use super::sacre;
use super::stats::StatsCounter;

/// Checks `max_order >= 1`, that `hyps` and `refs` are parallel and every segment has a
/// reference ([`check_corpus`]; an empty corpus has empty statistics).
fn validate_corpus<T>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> Result<(), MetricError> {
    check_max_order("max_order", max_order)?;
    check_corpus(hyps.len(), refs, EmptyCorpus::Allowed)
}

/// Per-segment statistics of a corpus, orders `1..=max_order`: `stats[i]` are those of
/// `hyps[i]` against its references `refs[i]`. For bootstrap resampling ([`bootstrap`](super::bootstrap)), or to
/// sum (`stats.iter().sum()`) and score any subset with [`score_from_stats`]. Corpora of
/// 512 segments or more are counted on rayon's pool (the same numbers).
///
/// Errors: `max_order` outside `1..=`[`MAX_ORDER`](super::MAX_ORDER), `hyps.len() != refs.len()`, a segment
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
    Ok(nltk_stats_unchecked(hyps, refs, max_order))
}

/// [`nltk_corpus_stats`] of a validated corpus.
fn nltk_stats_unchecked<T: Eq + Hash>(
    hyps: &[Vec<T>],
    refs: &[Vec<Vec<T>>],
    max_order: usize,
) -> NltkStats {
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
    stats
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
    check_corpus(
        hyps.len(),
        refs,
        EmptyCorpus::Refused("sacrebleu raises IndexError, NLTK ZeroDivisionError"),
    )?;
    match cfg.smoothing {
        SmoothMethod::Nltk(_) => {
            let stats = nltk_stats_unchecked(hyps, refs, cfg.max_order);
            score_nltk_stats(&stats, cfg)
        }
        _ => score_from_stats(&corpus_stats_sum(hyps, refs, cfg.max_order), cfg),
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
    check_sentence(refs.len())?;
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
