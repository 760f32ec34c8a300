//! chrF's vocabulary: the configuration ([`ChrfConfig`]), the additive statistics
//! ([`ChrfCounts`]) and the score ([`ChrfScore`]). Every other file of `chrf` imports these
//! from here.

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::exact::config::{invalid, MetricError, MAX_ORDER};

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
/// its segments' counts (`+`, `+=`, `iter().sum()`), which is what
/// [`score_chrf_stats`](super::score_chrf_stats) scores and what
/// [`bootstrap`](crate::exact::bootstrap) resamples.
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
