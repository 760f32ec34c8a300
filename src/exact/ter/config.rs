//! TER's vocabulary: the configuration ([`TerConfig`]), the additive statistics
//! ([`TerStats`]) and the score ([`TerScore`]).

use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::exact::config::{invalid, MetricError};

/// What to compute: sacrebleu's `TER(normalized, no_punct, asian_support, case_sensitive)`
/// (the CLI's `--ter-normalized`, `--ter-no-punct`, `--ter-asian-support`,
/// `--ter-case-sensitive`). Every field is `false` by default, as in sacrebleu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TerConfig {
    /// Tercom's normalization: line joins, four XML entities, ASCII punctuation split off
    /// (`.` and `,` unless next to a digit), possessive `'s` split off; with `asian_support`
    /// also CJK characters and punctuation split off.
    pub normalized: bool,
    /// Remove the punctuation `.,?:;!"()` (and with `asian_support` the Asian and full-width
    /// punctuation).
    pub no_punct: bool,
    /// Asian (CJK) support for `normalized` and `no_punct`; alone it changes nothing.
    pub asian_support: bool,
    /// Keep the case; by default every line goes through Python's `str.lower`.
    pub case_sensitive: bool,
}

impl TerConfig {
    /// sacrebleu's signature fields after `nrefs`:
    /// `case:{mixed|lc}|tok:tercom|norm:{yes|no}|punct:{yes|no}|asian:{yes|no}` (`punct` is
    /// `yes` when punctuation is kept).
    pub fn signature_fields(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" };
        format!(
            "case:{}|tok:tercom|norm:{}|punct:{}|asian:{}",
            if self.case_sensitive { "mixed" } else { "lc" },
            yes(self.normalized),
            yes(!self.no_punct),
            yes(self.asian_support)
        )
    }
}

/// The additive statistics of TER: sacrebleu's `[num_edits, ref_length]` of a segment or their
/// sums over a corpus.
///
/// For one segment, `edits` is the fewest edits (shifts, insertions, deletions, substitutions)
/// over its references and `ref_len` the **mean** length of its references (in words, a
/// Python float: `sum / count`). A corpus sums its segments' statistics in segment order
/// (`+`, `+=`, `iter().sum()`; `f64` additions in sacrebleu's order give sacrebleu's sums),
/// which is what [`score_ter_stats`](super::score_ter_stats) scores and what
/// [`bootstrap`](crate::exact::bootstrap) resamples.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TerStats {
    /// Edits (a whole number).
    pub edits: f64,
    /// Reference length (per segment, the mean over its references).
    pub ref_len: f64,
}

impl TerStats {
    /// Checks that `edits` is a whole number and `ref_len` a number, both finite and >= 0;
    /// `argument` names the statistics in the error.
    pub(crate) fn validate(&self, argument: &'static str) -> Result<(), MetricError> {
        if !(self.edits.is_finite() && self.edits >= 0.0 && self.edits.fract() == 0.0) {
            return Err(invalid(
                argument,
                format!(
                    "edits must be a finite whole number >= 0, got {}",
                    self.edits
                ),
            ));
        }
        if !(self.ref_len.is_finite() && self.ref_len >= 0.0) {
            return Err(invalid(
                argument,
                format!("ref_len must be finite and >= 0, got {}", self.ref_len),
            ));
        }
        Ok(())
    }
}

impl AddAssign<&TerStats> for TerStats {
    fn add_assign(&mut self, other: &TerStats) {
        self.edits += other.edits;
        self.ref_len += other.ref_len;
    }
}

impl AddAssign for TerStats {
    fn add_assign(&mut self, other: TerStats) {
        *self += &other;
    }
}

impl Add for TerStats {
    type Output = TerStats;
    fn add(mut self, other: TerStats) -> TerStats {
        self += &other;
        self
    }
}

impl Add<&TerStats> for TerStats {
    type Output = TerStats;
    fn add(mut self, other: &TerStats) -> TerStats {
        self += other;
        self
    }
}

/// Sums in iteration order, from 0 (sacrebleu's `sum_of_lists`).
impl Sum for TerStats {
    fn sum<I: Iterator<Item = TerStats>>(iter: I) -> Self {
        iter.fold(TerStats::default(), |acc, s| acc + s)
    }
}

impl<'a> Sum<&'a TerStats> for TerStats {
    fn sum<I: Iterator<Item = &'a TerStats>>(iter: I) -> Self {
        iter.fold(TerStats::default(), |acc, s| acc + s)
    }
}

/// A TER score and the statistics it was computed from (sacrebleu's `TERScore`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TerScore {
    /// TER on 0..: `100 · edits / ref_len` (sacrebleu's `score`; above 100 when the hypothesis
    /// needs more edits than the reference has words). 100 when `ref_len` is 0 and `edits` is
    /// not, 0 when both are.
    pub score: f64,
    /// The summed edits (sacrebleu's `num_edits`).
    pub edits: f64,
    /// The summed (per segment, mean) reference lengths (sacrebleu's `ref_length`).
    pub ref_len: f64,
}

impl TerScore {
    /// sacrebleu's score name, `TER`.
    pub fn name(&self) -> &'static str {
        "TER"
    }
}

/// sacrebleu's `TER._compute_score_from_stats` (statistics validated).
pub(super) fn score_unchecked(stats: TerStats) -> TerScore {
    let TerStats { edits, ref_len } = stats;
    let score = if ref_len > 0.0 {
        edits / ref_len
    } else if edits > 0.0 {
        1.0
    } else {
        0.0
    };
    TerScore {
        score: 100.0 * score,
        edits,
        ref_len,
    }
}
