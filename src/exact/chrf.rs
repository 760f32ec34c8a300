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

use std::borrow::Borrow;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use rayon::prelude::*;
use rustc_hash::FxHashMap;

use super::config::{invalid, MetricError, MAX_ORDER};
use super::tokenize::{is_python_whitespace, python_lower_into};
use crate::ngram::{IdTable, InternedMatcher};

/// What to compute: sacrebleu's `CHRF(char_order, word_order, beta, lowercase, whitespace,
/// eps_smoothing)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChrfConfig {
    /// Largest character n-gram order (sacrebleu's `char_order`, default 6).
    pub char_order: usize,
    /// Largest word n-gram order (`word_order`, default 0; chrF++ is 2).
    pub word_order: usize,
    /// Weight of recall against precision (`beta`, default 2): finite and > 0.
    pub beta: f64,
    /// Case-insensitive: Python's `str.lower` on every line first.
    pub lowercase: bool,
    /// Keep whitespace in the character n-grams.
    pub whitespace: bool,
    /// Average the per-order F-scores with `ε` smoothing (chrF++.py, NLTK, Moses) instead of
    /// sacrebleu's default effective-order averaging of precision and recall.
    pub eps_smoothing: bool,
}

/// sacrebleu 2.6.0's `CHRF()`: 6 character orders, no word order, β = 2, case-sensitive,
/// whitespace removed, effective-order averaging.
impl Default for ChrfConfig {
    fn default() -> Self {
        Self {
            char_order: 6,
            word_order: 0,
            beta: 2.0,
            lowercase: false,
            whitespace: false,
            eps_smoothing: false,
        }
    }
}

impl ChrfConfig {
    /// chrF++: sacrebleu's `CHRF(word_order=2)`.
    pub fn chrf_plus_plus() -> Self {
        Self {
            word_order: 2,
            ..Self::default()
        }
    }

    /// Number of orders scored: `char_order + word_order` (the length of every
    /// [`ChrfCounts`] vector).
    pub fn orders(&self) -> usize {
        self.char_order + self.word_order
    }

    /// sacrebleu's score name: `chrF{β}` and one `+` per word order (`chrF2`, `chrF2++`); β is
    /// written as an integer when it is one.
    pub fn name(&self) -> String {
        let beta = if self.beta.fract() == 0.0 && self.beta.abs() < 1e15 {
            format!("{}", self.beta as i64)
        } else {
            format!("{}", self.beta)
        };
        format!("chrF{beta}{}", "+".repeat(self.word_order))
    }

    /// Checks the orders (`char_order` and `word_order` at most
    /// [`MAX_ORDER`], not both 0) and `beta` (finite, > 0, `β²` finite).
    pub fn validate(&self) -> Result<(), MetricError> {
        for (argument, order) in [
            ("cfg.char_order", self.char_order),
            ("cfg.word_order", self.word_order),
        ] {
            if order > MAX_ORDER {
                return Err(invalid(
                    argument,
                    format!("must be at most {MAX_ORDER}, got {order}"),
                ));
            }
        }
        if self.orders() == 0 {
            return Err(invalid(
                "cfg.char_order",
                "char_order and word_order are both 0: there is no n-gram to score",
            ));
        }
        if !(self.beta.is_finite() && self.beta > 0.0 && (self.beta * self.beta).is_finite()) {
            return Err(invalid(
                "cfg.beta",
                format!(
                    "must be finite and > 0 (and its square finite), got {}",
                    self.beta
                ),
            ));
        }
        Ok(())
    }
}

/// The additive statistics of chrF: per order, the n-grams of the hypothesis and of the
/// reference and their matches, indexed `n - 1` for the character orders `n = 1..=char_order`
/// and `char_order + n - 1` for the word orders `n = 1..=word_order` (sacrebleu's order).
///
/// One segment's counts are those of its best reference (see the module docs); a corpus sums
/// its segments' counts (`+`, `+=`, `iter().sum()`), which is what [`score_chrf_stats`] scores
/// and what [`super::bootstrap`] resamples.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChrfCounts {
    /// Hypothesis n-grams per order (0 where the reference has none of that order).
    pub hyp_ngrams: Vec<u64>,
    /// Reference n-grams per order.
    pub ref_ngrams: Vec<u64>,
    /// `Σ_g min(count_hyp(g), count_ref(g))` per order.
    pub matches: Vec<u64>,
}

impl ChrfCounts {
    /// All-zero counts for `orders` orders.
    pub fn zeros(orders: usize) -> Self {
        Self {
            hyp_ngrams: vec![0; orders],
            ref_ngrams: vec![0; orders],
            matches: vec![0; orders],
        }
    }

    /// Number of orders held (`matches.len()`).
    pub fn orders(&self) -> usize {
        self.matches.len()
    }

    /// sacrebleu's flat layout of chrF statistics: `[hyp, ref, match]` per order.
    pub fn to_sacrebleu_vec(&self) -> Vec<u64> {
        let mut flat = Vec::with_capacity(3 * self.orders());
        for ((&h, &r), &m) in self
            .hyp_ngrams
            .iter()
            .zip(&self.ref_ngrams)
            .zip(&self.matches)
        {
            flat.extend_from_slice(&[h, r, m]);
        }
        flat
    }

    /// Whether all three vectors hold `orders` orders.
    pub(crate) fn has_orders(&self, orders: usize) -> bool {
        self.hyp_ngrams.len() == orders
            && self.ref_ngrams.len() == orders
            && self.matches.len() == orders
    }
}

/// Element-wise `a += b`, growing `a` with zeros where `b` is longer (saturating).
fn add_counts(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

/// Sums counts element-wise; a shorter side counts as zero in its missing orders.
impl AddAssign<&ChrfCounts> for ChrfCounts {
    fn add_assign(&mut self, other: &ChrfCounts) {
        add_counts(&mut self.hyp_ngrams, &other.hyp_ngrams);
        add_counts(&mut self.ref_ngrams, &other.ref_ngrams);
        add_counts(&mut self.matches, &other.matches);
    }
}

impl AddAssign for ChrfCounts {
    fn add_assign(&mut self, other: ChrfCounts) {
        *self += &other;
    }
}

impl Add for ChrfCounts {
    type Output = ChrfCounts;
    fn add(mut self, other: ChrfCounts) -> ChrfCounts {
        self += &other;
        self
    }
}

impl Add<&ChrfCounts> for ChrfCounts {
    type Output = ChrfCounts;
    fn add(mut self, other: &ChrfCounts) -> ChrfCounts {
        self += other;
        self
    }
}

impl Sum for ChrfCounts {
    fn sum<I: Iterator<Item = ChrfCounts>>(iter: I) -> Self {
        iter.fold(ChrfCounts::default(), |acc, s| acc + s)
    }
}

impl<'a> Sum<&'a ChrfCounts> for ChrfCounts {
    fn sum<I: Iterator<Item = &'a ChrfCounts>>(iter: I) -> Self {
        iter.fold(ChrfCounts::default(), |acc, s| acc + s)
    }
}

/// A chrF score and the statistics it was computed from.
#[derive(Debug, Clone, PartialEq)]
pub struct ChrfScore {
    /// chrF on 0..=100 (sacrebleu's `score`).
    pub score: f64,
    /// The summed statistics.
    pub counts: ChrfCounts,
    /// The configuration's `char_order`.
    pub char_order: usize,
    /// The configuration's `word_order`.
    pub word_order: usize,
    /// The configuration's `beta`.
    pub beta: f64,
}

impl ChrfScore {
    /// sacrebleu's score name (`chrF2`, `chrF2++`; see [`ChrfConfig::name`]).
    pub fn name(&self) -> String {
        ChrfConfig {
            char_order: self.char_order,
            word_order: self.word_order,
            beta: self.beta,
            ..ChrfConfig::default()
        }
        .name()
    }
}

/// sacrebleu's `_compute_f_score` on integer statistics (Python floats): `hyp`, `refs`,
/// `matches` per order, `β² = factor`.
pub(crate) fn f_score(
    hyp: &[u64],
    refs: &[u64],
    matches: &[u64],
    factor: f64,
    eps_smoothing: bool,
) -> f64 {
    const EPS: f64 = 1e-16;
    let mut score = 0.0f64;
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (0.0f64, 0.0f64);
    for ((&n_hyp, &n_ref), &n_match) in hyp.iter().zip(refs).zip(matches) {
        let prec = if n_hyp > 0 {
            n_match as f64 / n_hyp as f64
        } else {
            EPS
        };
        let rec = if n_ref > 0 {
            n_match as f64 / n_ref as f64
        } else {
            EPS
        };
        let denom = factor * prec + rec;
        score += if denom > 0.0 {
            (1.0 + factor) * prec * rec / denom
        } else {
            EPS
        };
        if n_hyp > 0 && n_ref > 0 {
            avg_prec += prec;
            avg_rec += rec;
            effective_order += 1;
        }
    }
    if eps_smoothing {
        return 100.0 * score / hyp.len() as f64;
    }
    if effective_order == 0 {
        return 0.0;
    }
    avg_prec /= effective_order as f64;
    avg_rec /= effective_order as f64;
    if avg_prec + avg_rec != 0.0 {
        let mut score = (1.0 + factor) * avg_prec * avg_rec;
        score /= (factor * avg_prec) + avg_rec;
        100.0 * score
    } else {
        0.0
    }
}

/// A number in sacrebleu's bootstrap arithmetic: a Python `float` (`f64`) or a NumPy
/// `float32`. Under NumPy 2's promotion rules a Python float meeting a `float32` is converted
/// to `float32` first, and the operation is done in `float32`.
#[derive(Debug, Clone, Copy)]
enum Num {
    Py(f64),
    F32(f32),
}

impl Num {
    fn op(self, other: Num, f: fn(f64, f64) -> f64, g: fn(f32, f32) -> f32) -> Num {
        match (self, other) {
            (Num::Py(a), Num::Py(b)) => Num::Py(f(a, b)),
            (Num::F32(a), Num::Py(b)) => Num::F32(g(a, b as f32)),
            (Num::Py(a), Num::F32(b)) => Num::F32(g(a as f32, b)),
            (Num::F32(a), Num::F32(b)) => Num::F32(g(a, b)),
        }
    }
    fn add(self, o: Num) -> Num {
        self.op(o, |a, b| a + b, |a, b| a + b)
    }
    fn mul(self, o: Num) -> Num {
        self.op(o, |a, b| a * b, |a, b| a * b)
    }
    fn div(self, o: Num) -> Num {
        self.op(o, |a, b| a / b, |a, b| a / b)
    }
    fn positive(self) -> bool {
        match self {
            Num::Py(a) => a > 0.0,
            Num::F32(a) => a > 0.0,
        }
    }
}

/// `_compute_f_score` as sacrebleu's bootstrap runs it: on a NumPy `float32` vector of summed
/// statistics (`flat`, `[hyp, ref, match]` per order, exact integers below 2^24), so that every
/// precision, recall and F-score is a `float32` under NumPy 2's promotion, except where only
/// Python floats meet (ε terms, and the `0.0` returned when nothing qualifies). Returns the
/// score and whether it is a `float32`.
pub(crate) fn f_score_f32(flat: &[u64], factor: f64, eps_smoothing: bool) -> (f64, bool) {
    const EPS: Num = Num::Py(1e-16);
    let factor_n = Num::Py(factor);
    let one_plus = Num::Py(1.0 + factor);
    let orders = flat.len() / 3;
    let mut score = Num::Py(0.0);
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (Num::Py(0.0), Num::Py(0.0));
    for stats in flat.chunks_exact(3) {
        let (n_hyp, n_ref, n_match) = (stats[0] as f32, stats[1] as f32, stats[2] as f32);
        let prec = if n_hyp > 0.0 {
            Num::F32(n_match / n_hyp)
        } else {
            EPS
        };
        let rec = if n_ref > 0.0 {
            Num::F32(n_match / n_ref)
        } else {
            EPS
        };
        let denom = factor_n.mul(prec).add(rec);
        score = score.add(if denom.positive() {
            one_plus.mul(prec).mul(rec).div(denom)
        } else {
            EPS
        });
        if n_hyp > 0.0 && n_ref > 0.0 {
            avg_prec = avg_prec.add(prec);
            avg_rec = avg_rec.add(rec);
            effective_order += 1;
        }
    }
    let done = |n: Num| match n {
        Num::Py(x) => (x, false),
        Num::F32(x) => (f64::from(x), true),
    };
    if eps_smoothing {
        return done(Num::Py(100.0).mul(score).div(Num::Py(orders as f64)));
    }
    if effective_order == 0 {
        return (0.0, false);
    }
    let eo = Num::Py(effective_order as f64);
    avg_prec = avg_prec.div(eo);
    avg_rec = avg_rec.div(eo);
    let nonzero = match avg_prec.add(avg_rec) {
        Num::Py(x) => x != 0.0,
        Num::F32(x) => x != 0.0,
    };
    if nonzero {
        let score = one_plus.mul(avg_prec).mul(avg_rec);
        let score = score.div(factor_n.mul(avg_prec).add(avg_rec));
        done(Num::Py(100.0).mul(score))
    } else {
        (0.0, false)
    }
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

/// Scores `counts` (validated) under `cfg` (validated).
fn score_unchecked(counts: ChrfCounts, cfg: &ChrfConfig) -> ChrfScore {
    let score = f_score(
        &counts.hyp_ngrams,
        &counts.ref_ngrams,
        &counts.matches,
        cfg.beta * cfg.beta,
        cfg.eps_smoothing,
    );
    ChrfScore {
        score,
        counts,
        char_order: cfg.char_order,
        word_order: cfg.word_order,
        beta: cfg.beta,
    }
}

/// ASCII's punctuation (Python's `string.punctuation`), sacrebleu's `CHRF._PUNCTS`.
fn is_punct(b: u8) -> bool {
    b.is_ascii_punctuation()
}

/// One pass over a line: calls `on_char(c)` for every character that enters the character
/// n-grams (all of them with `keep_whitespace`, else those that are not Python whitespace),
/// and, with `words`, appends the byte ranges of sacrebleu's `_remove_punctuation(line)`: the
/// words of `line.split()`, with one ASCII punctuation character split off the end, else off
/// the start, of words of two or more code points. ASCII is handled byte by byte.
fn scan(
    text: &str,
    keep_whitespace: bool,
    mut words: Option<&mut Vec<(u32, u32)>>,
    mut on_char: impl FnMut(char),
) {
    let bytes = text.as_bytes();
    // The current word: its start and its number of code points.
    let mut word: Option<(usize, usize)> = None;
    let close = |start: usize, chars: usize, end: usize, out: &mut Vec<(u32, u32)>| {
        let (s, e) = (start as u32, end as u32);
        if chars == 1 {
            out.push((s, e));
        } else if is_punct(bytes[end - 1]) {
            out.extend_from_slice(&[(s, e - 1), (e - 1, e)]);
        } else if is_punct(bytes[start]) {
            out.extend_from_slice(&[(s, s + 1), (s + 1, e)]);
        } else {
            out.push((s, e));
        }
    };
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let (c, len) = if b < 0x80 {
            (b as char, 1)
        } else {
            let c = text[i..].chars().next().unwrap_or('\u{fffd}');
            (c, c.len_utf8())
        };
        let space = is_python_whitespace(c);
        if !space || keep_whitespace {
            on_char(c);
        }
        if let Some(out) = words.as_deref_mut() {
            match (space, word) {
                (true, Some((start, chars))) => {
                    close(start, chars, i, out);
                    word = None;
                }
                (false, Some((start, chars))) => word = Some((start, chars + 1)),
                (false, None) => word = Some((i, 1)),
                (true, None) => {}
            }
        }
        i += len;
    }
    if let (Some(out), Some((start, chars))) = (words, word) {
        close(start, chars, bytes.len(), out);
    }
}

/// Segment-local character ids: ASCII in a direct array, the rest in a hashed table.
struct CharIds {
    ascii: [u32; 128],
    other: IdTable,
    vocab: u32,
}

impl CharIds {
    fn new() -> Self {
        Self {
            ascii: [0; 128],
            other: IdTable::default(),
            vocab: 0,
        }
    }

    /// Forgets every id; room for a line of `bytes` bytes.
    fn reset(&mut self, bytes: usize) {
        self.ascii = [0; 128];
        self.other.reset(bytes);
        self.vocab = 0;
    }

    /// The id of `c`, a new one (`vocab + 1`) if it has none.
    #[inline]
    fn intern(&mut self, c: char) -> u32 {
        let vocab = &mut self.vocab;
        if (c as u32) < 128 {
            let slot = &mut self.ascii[c as usize];
            if *slot == 0 {
                *vocab += 1;
                *slot = *vocab;
            }
            *slot
        } else {
            self.other.get_or_insert(u64::from(c), || {
                *vocab += 1;
                *vocab
            })
        }
    }

    /// The id of `c`, 0 if it has none.
    #[inline]
    fn get(&self, c: char) -> u32 {
        if (c as u32) < 128 {
            self.ascii[c as usize]
        } else {
            self.other.get(u64::from(c))
        }
    }
}

/// Counts chrF statistics segment by segment, reusing its buffers and tables.
pub(crate) struct ChrfCounter {
    cfg: ChrfConfig,
    factor: f64,
    hyp_text: String,
    ref_text: String,
    char_ids: CharIds,
    hyp_chars: Vec<u32>,
    ref_chars: Vec<u32>,
    hyp_spans: Vec<(u32, u32)>,
    ref_spans: Vec<(u32, u32)>,
    hyp_words: Vec<u32>,
    ref_words: Vec<u32>,
    matcher: InternedMatcher,
    matches: Vec<u64>,
    current: ChrfCounts,
    best: ChrfCounts,
}

impl ChrfCounter {
    /// A counter for a validated `cfg`.
    pub(crate) fn new(cfg: &ChrfConfig) -> Self {
        let orders = cfg.orders();
        Self {
            cfg: *cfg,
            factor: cfg.beta * cfg.beta,
            hyp_text: String::new(),
            ref_text: String::new(),
            char_ids: CharIds::new(),
            hyp_chars: Vec::new(),
            ref_chars: Vec::new(),
            hyp_spans: Vec::new(),
            ref_spans: Vec::new(),
            hyp_words: Vec::new(),
            ref_words: Vec::new(),
            matcher: InternedMatcher::new(),
            matches: vec![0; orders],
            current: ChrfCounts::zeros(orders),
            best: ChrfCounts::zeros(orders),
        }
    }

    /// Adds the statistics of `hyp` against its best reference among `refs` to `out` (which
    /// holds `cfg.orders()` orders). A segment without a reference adds nothing (the public
    /// functions reject it first).
    pub(crate) fn add_segment<'r>(
        &mut self,
        hyp: &str,
        refs: impl IntoIterator<Item = &'r str>,
        out: &mut ChrfCounts,
    ) {
        let Self {
            cfg,
            factor,
            hyp_text,
            ref_text,
            char_ids,
            hyp_chars,
            ref_chars,
            hyp_spans,
            ref_spans,
            hyp_words,
            ref_words,
            matcher,
            matches,
            current,
            best,
        } = self;
        let (char_order, word_order) = (cfg.char_order, cfg.word_order);
        let hyp: &str = if cfg.lowercase {
            hyp_text.clear();
            python_lower_into(hyp, hyp_text);
            hyp_text
        } else {
            hyp
        };
        // Characters (segment-local ids 1..=char_vocab) and words, in one pass.
        char_ids.reset(hyp.len());
        hyp_chars.clear();
        hyp_spans.clear();
        scan(
            hyp,
            cfg.whitespace,
            (word_order > 0).then_some(&mut *hyp_spans),
            |c| {
                if char_order > 0 {
                    hyp_chars.push(char_ids.intern(c));
                }
            },
        );
        let char_vocab = char_ids.vocab;
        // Words: segment-local ids 1..=word_vocab.
        let mut word_ids: FxHashMap<&str, u32> = FxHashMap::default();
        hyp_words.clear();
        if word_order > 0 {
            word_ids.reserve(hyp_spans.len());
            for &(s, e) in hyp_spans.iter() {
                let next = word_ids.len() as u32 + 1;
                let id = *word_ids.entry(&hyp[s as usize..e as usize]).or_insert(next);
                hyp_words.push(id);
            }
        }
        let word_vocab = word_ids.len() as u32;
        let mut best_score = -1.0f64;
        let mut any = false;
        for reference in refs {
            let reference: &str = if cfg.lowercase {
                ref_text.clear();
                python_lower_into(reference, ref_text);
                ref_text
            } else {
                reference
            };
            matches.fill(0);
            ref_chars.clear();
            ref_spans.clear();
            scan(
                reference,
                cfg.whitespace,
                (word_order > 0).then_some(&mut *ref_spans),
                |c| {
                    if char_order > 0 {
                        ref_chars.push(char_ids.get(c));
                    }
                },
            );
            let ref_char_len = ref_chars.len();
            if char_order > 0 {
                matcher.add_clipped_matches(
                    hyp_chars,
                    std::slice::from_ref(ref_chars),
                    char_vocab,
                    char_order,
                    &mut matches[..char_order],
                );
            }
            let mut ref_word_len = 0usize;
            if word_order > 0 {
                ref_words.clear();
                ref_words.extend(ref_spans.iter().map(|&(s, e)| {
                    word_ids
                        .get(&reference[s as usize..e as usize])
                        .copied()
                        .unwrap_or(0)
                }));
                ref_word_len = ref_words.len();
                matcher.add_clipped_matches(
                    hyp_words,
                    std::slice::from_ref(ref_words),
                    word_vocab,
                    word_order,
                    &mut matches[char_order..],
                );
            }
            let lengths = (0..char_order)
                .map(|i| (hyp_chars.len(), ref_char_len, i))
                .chain((0..word_order).map(|i| (hyp_words.len(), ref_word_len, i)));
            for (k, (h, r, i)) in lengths.enumerate() {
                let hyp_n = h.saturating_sub(i) as u64;
                let ref_n = r.saturating_sub(i) as u64;
                current.hyp_ngrams[k] = if ref_n > 0 { hyp_n } else { 0 };
                current.ref_ngrams[k] = ref_n;
                current.matches[k] = matches[k];
            }
            let score = f_score(
                &current.hyp_ngrams,
                &current.ref_ngrams,
                &current.matches,
                *factor,
                cfg.eps_smoothing,
            );
            if score > best_score {
                best_score = score;
                std::mem::swap(best, current);
            }
            any = true;
        }
        if any {
            *out += &*best;
        }
    }
}

/// Segments per rayon task: about four tasks per thread, at least 64 segments each.
fn parallel_chunk(segments: usize) -> usize {
    (segments / (4 * rayon::current_num_threads()).max(1)).max(64)
}

/// From this many segments on, the corpus functions count in parallel.
const PARALLEL_MIN_SEGMENTS: usize = 128;

/// Checks `cfg`, that `hyps` and `refs` are parallel and every segment has a reference.
fn validate_corpus<S>(hyps: &[S], refs: &[Vec<S>], cfg: &ChrfConfig) -> Result<(), MetricError> {
    cfg.validate()?;
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

/// Per-segment chrF statistics of a corpus: `stats[i]` are those of `hyps[i]` against its
/// best reference in `refs[i]` (`[segment][reference]`; segments may have different numbers
/// of references). Sum them (`iter().sum()`) and score the sum with [`score_chrf_stats`], or
/// resample them with [`super::bootstrap`]. `cfg` is a [`ChrfConfig`] or a reference to one.
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
    validate_corpus(hyps, refs, cfg)?;
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
/// [`MAX_ORDER`], `beta` not finite or <= 0), `hyps.len() != refs.len()`, a
/// segment with no reference, an empty corpus (sacrebleu raises `IndexError`).
pub fn corpus_chrf<S: AsRef<str> + Sync>(
    hyps: &[S],
    refs: &[Vec<S>],
    cfg: impl Borrow<ChrfConfig>,
) -> Result<ChrfScore, MetricError> {
    let cfg = cfg.borrow();
    validate_corpus(hyps, refs, cfg)?;
    if hyps.is_empty() {
        return Err(invalid(
            "hyps",
            "the corpus is empty (sacrebleu raises IndexError)",
        ));
    }
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
    if refs.is_empty() {
        return Err(invalid(
            "refs",
            "the sentence has no reference (refs is empty)",
        ));
    }
    let mut counts = ChrfCounts::zeros(cfg.orders());
    ChrfCounter::new(cfg).add_segment(hyp, refs.iter().map(AsRef::as_ref), &mut counts);
    Ok(score_unchecked(counts, cfg))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        let mut spans = Vec::new();
        scan(text, false, Some(&mut spans), |_| {});
        spans
            .iter()
            .map(|&(s, e)| &text[s as usize..e as usize])
            .collect()
    }

    #[test]
    fn punctuation_splitting_follows_sacrebleu() {
        // sacrebleu's CHRF()._remove_punctuation on the same strings.
        assert_eq!(
            words("(hi) \"ok\" a , x. .y ..  é! ¡no"),
            ["(hi", ")", "\"ok", "\"", "a", ",", "x", ".", ".", "y", ".", ".", "é", "!", "¡no"]
        );
        assert_eq!(words("  "), Vec::<&str>::new());
    }

    #[test]
    fn f_score_follows_sacrebleu_by_hand() {
        // One order, p = 3/4, r = 3/5, β = 2.
        let (p, r) = (0.75f64, 0.6f64);
        let want = 100.0 * ((5.0 * p * r) / (4.0 * p + r));
        assert_eq!(f_score(&[4], &[5], &[3], 4.0, false), want);
        // ε smoothing: the mean of per-order F-scores; an order with hyp = ref = 0 gives ε.
        let eps = f_score(&[4, 0], &[5, 0], &[3, 0], 4.0, true);
        assert_eq!(
            eps,
            100.0 * ((5.0 * p * r / (4.0 * p + r)) + 1e-16 * 5.0 * 1e-16 / 5e-16) / 2.0
        );
        // No qualifying order: 0.
        assert_eq!(f_score(&[0, 0], &[3, 2], &[0, 0], 4.0, false), 0.0);
    }

    #[test]
    fn counter_keeps_the_best_reference_and_zeroes_orders_it_lacks() {
        let cfg = ChrfConfig::default();
        let mut counter = ChrfCounter::new(&cfg);
        let mut a = ChrfCounts::zeros(6);
        counter.add_segment("abc", ["xyz", "abc", "abc"], &mut a);
        assert_eq!(a.matches, [3, 2, 1, 0, 0, 0]);
        assert_eq!(a.hyp_ngrams, [3, 2, 1, 0, 0, 0]);
        // A reference shorter than an order zeroes the hypothesis count of that order.
        let mut b = ChrfCounts::zeros(6);
        counter.add_segment("abcd", ["ab"], &mut b);
        assert_eq!(b.hyp_ngrams, [4, 3, 0, 0, 0, 0]);
        assert_eq!(b.ref_ngrams, [2, 1, 0, 0, 0, 0]);
    }
}
