//! chrF's entry points: corpus and sentence chrF, the per-segment statistics of a corpus, and
//! the score of summed statistics.

use std::borrow::Borrow;

use rayon::prelude::*;

use super::config::{ChrfConfig, ChrfCounts, ChrfScore};
use super::score::score_unchecked;
use super::stats::ChrfCounter;
use crate::exact::config::{invalid, MetricError};
use crate::exact::corpus::{check_corpus, check_sentence, EmptyCorpus};

/// Segments per rayon task: about four tasks per thread, at least 64 segments each.
fn parallel_chunk(segments: usize) -> usize {
    (segments / (4 * rayon::current_num_threads()).max(1)).max(64)
}

/// From this many segments on, the corpus functions count in parallel.
const PARALLEL_MIN_SEGMENTS: usize = 128;

/// Per-segment chrF statistics of a corpus: `stats[i]` are those of `hyps[i]` against its
/// best reference in `refs[i]` (`[segment][reference]`; segments may have different numbers
/// of references). Sum them (`iter().sum()`) and score the sum with [`score_chrf_stats`], or
/// resample them with [`bootstrap`](crate::exact::bootstrap). `cfg` is a [`ChrfConfig`] or a reference to one.
///
/// Errors: invalid `cfg`, `hyps.len() != refs.len()`, a segment with no reference.
///
/// ```
/// use candle_bleu::exact::chrf::{
///     corpus_chrf, corpus_chrf_stats, score_chrf_stats, ChrfConfig, ChrfCounts,
/// };
/// let hyps = ["a b", "c"];
/// let refs = [vec!["a c"], vec!["c", "d"]];
/// let cfg = ChrfConfig::default();
/// let stats = corpus_chrf_stats(&hyps, &refs, cfg)?;
/// // "ab" against "ac": unigrams a, b (2) vs a, c (2), one match; bigrams ab vs ac.
/// assert_eq!(stats[0].matches[..2], [1, 0]);
/// let total: ChrfCounts = stats.iter().sum();
/// assert_eq!(score_chrf_stats(&total, cfg)?, corpus_chrf(&hyps, &refs, cfg)?);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn corpus_chrf_stats<S: AsRef<str> + Sync>(
    hyps: &[S],
    refs: &[Vec<S>],
    cfg: impl Borrow<ChrfConfig>,
) -> Result<Vec<ChrfCounts>, MetricError> {
    let cfg = cfg.borrow();
    cfg.validate()?;
    check_corpus(hyps.len(), refs, EmptyCorpus::Allowed)?;
    let count = |h: &[S], r: &[Vec<S>]| -> Vec<ChrfCounts> {
        let mut counter = ChrfCounter::new(cfg);
        h.iter()
            .zip(r)
            .map(|(h, r)| {
                let mut out = ChrfCounts::zeros(cfg.orders());
                counter.add_segment(h.as_ref(), r.iter().map(AsRef::as_ref), &mut out);
                out
            })
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

/// The summed statistics of a validated corpus.
fn corpus_sum<S: AsRef<str> + Sync>(hyps: &[S], refs: &[Vec<S>], cfg: &ChrfConfig) -> ChrfCounts {
    let sum = |h: &[S], r: &[Vec<S>]| -> ChrfCounts {
        let mut counter = ChrfCounter::new(cfg);
        let mut total = ChrfCounts::zeros(cfg.orders());
        for (h, r) in h.iter().zip(r) {
            counter.add_segment(h.as_ref(), r.iter().map(AsRef::as_ref), &mut total);
        }
        total
    };
    if hyps.len() < PARALLEL_MIN_SEGMENTS {
        return sum(hyps, refs);
    }
    let chunk = parallel_chunk(hyps.len());
    hyps.par_chunks(chunk)
        .zip(refs.par_chunks(chunk))
        .map(|(h, r)| sum(h, r))
        .reduce(|| ChrfCounts::zeros(cfg.orders()), |a, b| a + b)
}

/// Corpus chrF of `hyps[i]` against the references `refs[i]` (`[segment][reference]`;
/// segments may have different numbers of references): sacrebleu's
/// `CHRF(...).corpus_score(hyps, refs_by_stream)`. Each segment contributes the statistics of
/// its best reference; the sums are scored once. `cfg` is a [`ChrfConfig`] or a reference to
/// one.
///
/// Errors (naming the argument): invalid `cfg` (`char_order` and `word_order` both 0 or above
/// [`MAX_ORDER`](crate::exact::MAX_ORDER), `beta` not finite or <= 0), `hyps.len() != refs.len()`, a
/// segment with no reference, an empty corpus (sacrebleu raises `IndexError`).
pub fn corpus_chrf<S: AsRef<str> + Sync>(
    hyps: &[S],
    refs: &[Vec<S>],
    cfg: impl Borrow<ChrfConfig>,
) -> Result<ChrfScore, MetricError> {
    let cfg = cfg.borrow();
    cfg.validate()?;
    check_corpus(
        hyps.len(),
        refs,
        EmptyCorpus::Refused("sacrebleu raises IndexError"),
    )?;
    Ok(score_unchecked(corpus_sum(hyps, refs, cfg), cfg))
}

/// Sentence chrF of `hyp` against `refs`: sacrebleu's `CHRF(...).sentence_score(hyp, refs)`
/// (and `sacrebleu.sentence_chrf`), a corpus of one segment. `cfg` is a [`ChrfConfig`] or a
/// reference to one.
///
/// Errors: invalid `cfg`, `refs` empty.
pub fn sentence_chrf<S: AsRef<str>>(
    hyp: &str,
    refs: &[S],
    cfg: impl Borrow<ChrfConfig>,
) -> Result<ChrfScore, MetricError> {
    let cfg = cfg.borrow();
    cfg.validate()?;
    check_sentence(refs.len())?;
    let mut counts = ChrfCounts::zeros(cfg.orders());
    ChrfCounter::new(cfg).add_segment(hyp, refs.iter().map(AsRef::as_ref), &mut counts);
    Ok(score_unchecked(counts, cfg))
}

/// Scores summed statistics as sacrebleu's `CHRF._compute_score_from_stats` (see the module
/// docs for the formula).
///
/// Errors: invalid `cfg`, `counts` without `cfg.orders()` orders in each vector.
///
/// ```
/// use candle_bleu::exact::chrf::{score_chrf_stats, ChrfConfig, ChrfCounts};
/// // One character order: 4 hypothesis unigrams, 5 reference unigrams, 3 matches.
/// let counts = ChrfCounts { hyp_ngrams: vec![4], ref_ngrams: vec![5], matches: vec![3] };
/// let cfg = ChrfConfig { char_order: 1, ..ChrfConfig::default() };
/// let (p, r) = (3.0 / 4.0, 3.0 / 5.0);
/// let want = 100.0 * ((1.0 + 4.0) * p * r / (4.0 * p + r));
/// assert_eq!(score_chrf_stats(&counts, cfg)?.score, want);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn score_chrf_stats(
    counts: &ChrfCounts,
    cfg: impl Borrow<ChrfConfig>,
) -> Result<ChrfScore, MetricError> {
    let cfg = cfg.borrow();
    cfg.validate()?;
    if !counts.has_orders(cfg.orders()) {
        return Err(invalid(
            "counts",
            format!(
                "must hold cfg.char_order + cfg.word_order = {} orders, got {} hyp_ngrams, {} \
                 ref_ngrams and {} matches",
                cfg.orders(),
                counts.hyp_ngrams.len(),
                counts.ref_ngrams.len(),
                counts.matches.len()
            ),
        ));
    }
    // Matches are `Σ_g min(count_hyp(g), count_ref(g))`: no text gives more than either side's
    // n-grams, and a larger value would score above 100.
    let orders = counts
        .matches
        .iter()
        .zip(&counts.hyp_ngrams)
        .zip(&counts.ref_ngrams);
    for (order, ((&matches, &hyp), &reference)) in orders.enumerate() {
        if matches > hyp.min(reference) {
            return Err(invalid(
                "counts",
                format!(
                    "order {} (index {order}) has {matches} matches but {hyp} hypothesis and \
                     {reference} reference n-grams: matches must be at most both",
                    order + 1
                ),
            ));
        }
    }
    Ok(score_unchecked(counts.clone(), cfg))
}
