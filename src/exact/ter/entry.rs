//! TER's entry points: corpus and sentence TER, the per-segment statistics of a corpus, the
//! score of summed statistics, and the edit counts of token sequences.

use std::borrow::Borrow;
use std::hash::Hash;

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::config::{score_unchecked, TerConfig, TerScore, TerStats};
use super::edit::{self, beam_edit_distance, TerScratch};
use super::tokenizer::tercom_tokenize;
use crate::exact::config::MetricError;
use crate::exact::corpus::{check_corpus, check_sentence, EmptyCorpus};
use crate::exact::tokenize::{python_rstrip, python_split};

/// Segments per rayon task: TER's cost varies a lot between segments, so small tasks.
const PARALLEL_CHUNK: usize = 8;

/// From this many segments on, the corpus functions work in parallel.
const PARALLEL_MIN_SEGMENTS: usize = 16;

/// Counts TER statistics segment by segment, reusing its buffers.
struct TerCounter<'c> {
    cfg: &'c TerConfig,
    scratch: TerScratch,
    hyp_ids: Vec<u32>,
    ref_ids: Vec<u32>,
}

impl<'c> TerCounter<'c> {
    fn new(cfg: &'c TerConfig) -> Self {
        Self {
            cfg,
            scratch: TerScratch::default(),
            hyp_ids: Vec::new(),
            ref_ids: Vec::new(),
        }
    }

    /// sacrebleu's `_compute_segment_statistics` of `hyp` against `refs` (at least one):
    /// the hypothesis is tokenized once (`tokenizer(hyp.rstrip())`), each reference twice (as
    /// sacrebleu's `_cache_references` and `_extract_reference_info` both preprocess it); the
    /// fewest edits over the references (the first on a tie) and their mean length.
    fn segment<'a>(&mut self, hyp: &str, refs: impl Iterator<Item = &'a str>) -> TerStats {
        let hyp = tercom_tokenize(python_rstrip(hyp), self.cfg);
        let mut ids: FxHashMap<&str, u32> = FxHashMap::default();
        let intern = |w, ids: &mut FxHashMap<_, u32>| {
            let next = ids.len() as u32;
            *ids.entry(w).or_insert(next)
        };
        self.hyp_ids.clear();
        for w in python_split(&hyp) {
            let id = intern(w, &mut ids);
            self.hyp_ids.push(id);
        }
        let refs: Vec<String> = refs
            .map(|r| {
                let once = tercom_tokenize(python_rstrip(r), self.cfg);
                tercom_tokenize(python_rstrip(&once), self.cfg)
            })
            .collect();
        let mut best = 10_000_000_000_000_000u64;
        let mut lengths = 0u64;
        for r in &refs {
            self.ref_ids.clear();
            for w in python_split(r) {
                let id = intern(w, &mut ids);
                self.ref_ids.push(id);
            }
            let (edits, len) =
                edit::translation_edit_rate(&self.hyp_ids, &self.ref_ids, &mut self.scratch);
            lengths += len;
            if edits < best {
                best = edits;
            }
        }
        TerStats {
            edits: best as f64,
            ref_len: lengths as f64 / refs.len() as f64,
        }
    }
}

/// The statistics of every segment of a checked corpus, in order.
fn segments<S: AsRef<str> + Sync>(hyps: &[S], refs: &[Vec<S>], cfg: &TerConfig) -> Vec<TerStats> {
    let count = |h: &[S], r: &[Vec<S>]| -> Vec<TerStats> {
        let mut counter = TerCounter::new(cfg);
        h.iter()
            .zip(r)
            .map(|(h, r)| counter.segment(h.as_ref(), r.iter().map(AsRef::as_ref)))
            .collect()
    };
    if hyps.len() < PARALLEL_MIN_SEGMENTS {
        return count(hyps, refs);
    }
    hyps.par_chunks(PARALLEL_CHUNK)
        .zip(refs.par_chunks(PARALLEL_CHUNK))
        .flat_map_iter(|(h, r)| count(h, r))
        .collect()
}

/// Per-segment TER statistics of a corpus: `stats[i]` are those of `hyps[i]` against its
/// references `refs[i]` (`[segment][reference]`, one or more per segment, any number): the
/// fewest edits over the references and their mean length. Sum them in order
/// (`iter().sum()`) and score the sum with [`score_ter_stats`], or resample them with
/// [`bootstrap`](crate::exact::bootstrap). Lines are detokenized text, as sacrebleu's.
///
/// Errors (naming the argument): `hyps.len() != refs.len()`, a segment with no reference.
///
/// ```
/// use candle_bleu::exact::ter::{corpus_ter, corpus_ter_stats, score_ter_stats, TerConfig, TerStats};
/// let hyps = ["d e a b c", "x y"];
/// let refs = [vec!["a b c d e"], vec!["x y z", "x"]];
/// let stats = corpus_ter_stats(&hyps, &refs, TerConfig::default())?;
/// // One shift of "d e"; one insertion against "x y z" (the best), mean length (3 + 1) / 2.
/// assert_eq!(stats, [TerStats { edits: 1.0, ref_len: 5.0 }, TerStats { edits: 1.0, ref_len: 2.0 }]);
/// let total: TerStats = stats.iter().sum();
/// assert_eq!(score_ter_stats(&total)?, corpus_ter(&hyps, &refs, TerConfig::default())?);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn corpus_ter_stats<S: AsRef<str> + Sync>(
    hyps: &[S],
    refs: &[Vec<S>],
    cfg: impl Borrow<TerConfig>,
) -> Result<Vec<TerStats>, MetricError> {
    check_corpus(hyps.len(), refs, EmptyCorpus::Allowed)?;
    Ok(segments(hyps, refs, cfg.borrow()))
}

/// Corpus TER of `hyps[i]` against the references `refs[i]` (`[segment][reference]`;
/// segments may have different numbers of references): sacrebleu's
/// `TER(...).corpus_score(hyps, refs_by_stream)`. Returns the score (`100 · Σ edits / Σ
/// ref_len`), and the summed edits and reference lengths.
///
/// Errors (naming the argument): `hyps.len() != refs.len()`, a segment with no reference, an
/// empty corpus (sacrebleu raises `IndexError`).
///
/// ```
/// use candle_bleu::exact::ter::{corpus_ter, TerConfig};
/// let hyps = ["The cat sat on the mat.", "A dog barked."];
/// let refs = [vec!["The cat is on the mat."], vec!["The dog barked loudly."]];
/// // sacrebleu: TER().corpus_score(hyps, [[r[0] for r in refs]])
/// let ter = corpus_ter(&hyps, &refs, TerConfig::default())?;
/// // One substitution, then "a"/"the", "barked."/"barked" and "loudly." missing.
/// assert_eq!((ter.edits, ter.ref_len), (4.0, 10.0));
/// assert!((ter.score - 40.0).abs() < 1e-9);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn corpus_ter<S: AsRef<str> + Sync>(
    hyps: &[S],
    refs: &[Vec<S>],
    cfg: impl Borrow<TerConfig>,
) -> Result<TerScore, MetricError> {
    check_corpus(
        hyps.len(),
        refs,
        EmptyCorpus::Refused("sacrebleu raises IndexError"),
    )?;
    let total: TerStats = segments(hyps, refs, cfg.borrow()).iter().sum();
    Ok(score_unchecked(total))
}

/// Sentence TER of `hyp` against `refs` (one or more): sacrebleu's
/// `TER(...).sentence_score(hyp, refs)`, a corpus of one segment.
///
/// Errors: `refs` empty.
///
/// ```
/// use candle_bleu::exact::ter::{sentence_ter, TerConfig};
/// let ter = sentence_ter("the cat sat", &["the cat sat down"], TerConfig::default())?;
/// assert_eq!((ter.edits, ter.ref_len, ter.score), (1.0, 4.0, 25.0));
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn sentence_ter<S: AsRef<str>>(
    hyp: &str,
    refs: &[S],
    cfg: impl Borrow<TerConfig>,
) -> Result<TerScore, MetricError> {
    check_sentence(refs.len())?;
    let stats = TerCounter::new(cfg.borrow()).segment(hyp, refs.iter().map(AsRef::as_ref));
    Ok(score_unchecked(stats))
}

/// Scores summed statistics as sacrebleu's `TER._compute_score_from_stats`: `100 · edits /
/// ref_len`, or 100 when `ref_len` is 0 and `edits` is not, 0 when both are.
///
/// Errors: `stats` with `edits` not a finite whole number >= 0, or `ref_len` not finite and
/// >= 0.
///
/// ```
/// use candle_bleu::exact::ter::{score_ter_stats, TerStats};
/// assert_eq!(score_ter_stats(&TerStats { edits: 3.0, ref_len: 12.0 })?.score, 25.0);
/// assert_eq!(score_ter_stats(&TerStats { edits: 2.0, ref_len: 0.0 })?.score, 100.0);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn score_ter_stats(stats: &TerStats) -> Result<TerScore, MetricError> {
    stats.validate("stats")?;
    Ok(score_unchecked(*stats))
}

/// Interns two token sequences into shared ids.
fn intern<T: Eq + Hash>(hyp: &[T], reference: &[T]) -> (Vec<u32>, Vec<u32>) {
    let mut ids: FxHashMap<&T, u32> = FxHashMap::default();
    let mut id = |t| {
        let next = ids.len() as u32;
        *ids.entry(t).or_insert(next)
    };
    let h = hyp.iter().map(&mut id).collect();
    let r = reference.iter().map(&mut id).collect();
    (h, r)
}

/// sacrebleu's `translation_edit_rate(words_hyp, words_ref)` on already tokenized sequences:
/// `(edits, reference length)`, where the edits are the block shifts tercom's greedy search
/// makes (blocks of at most 10 words moved at most 50 positions, at most 1000 candidate shifts
/// scored) plus the edit distance (insertions, deletions, substitutions, each costing 1;
/// sacrebleu's beam of 25 around the diagonal) of the shifted hypothesis. An empty reference
/// gives `(hyp.len(), 0)`.
///
/// ```
/// use candle_bleu::exact::ter::translation_edit_rate;
/// let h = ["d", "e", "a", "b", "c"];
/// let r = ["a", "b", "c", "d", "e"];
/// assert_eq!(translation_edit_rate(&h, &r), (1, 5)); // one shift
/// ```
pub fn translation_edit_rate<T: Eq + Hash>(hyp: &[T], reference: &[T]) -> (u64, u64) {
    let (h, r) = intern(hyp, reference);
    edit::translation_edit_rate(&h, &r, &mut TerScratch::default())
}

/// sacrebleu's beam edit distance (`BeamEditDistance`) of `hyp` against `reference`, without
/// shifts: the Levenshtein distance over tokens (unit costs), computed in a beam of 25 cells
/// around the diagonal (exact whenever the best path stays in it, e.g. for sequences of up to
/// 25 tokens).
///
/// ```
/// use candle_bleu::exact::ter::edit_distance;
/// assert_eq!(edit_distance(&["a", "b", "c"], &["a", "c", "d"]), 2);
/// ```
pub fn edit_distance<T: Eq + Hash>(hyp: &[T], reference: &[T]) -> u64 {
    let (h, r) = intern(hyp, reference);
    beam_edit_distance(&h, &r, &mut TerScratch::default())
}
