//! Sufficient statistics of BLEU: clipped matches and totals per order, hypothesis and
//! effective reference lengths, counted per segment with the crate's one n-gram counter
//! ([`crate::ngram`]) and summed over a corpus.

use std::hash::Hash;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::ngram::ClippedMatcher;

use super::BleuStats;

impl BleuStats {
    /// All-zero statistics for orders `1..=max_order`.
    pub fn zeros(max_order: usize) -> Self {
        Self {
            matches: vec![0; max_order],
            totals: vec![0; max_order],
            hyp_len: 0,
            ref_len: 0,
        }
    }

    /// The largest n-gram order these statistics hold (`matches.len()`).
    pub fn max_order(&self) -> usize {
        self.matches.len()
    }

    /// sacrebleu's flat layout of segment statistics: `[c, r, m_1..m_N, t_1..t_N]`.
    pub fn to_sacrebleu_vec(&self) -> Vec<u64> {
        let mut flat = Vec::with_capacity(2 + self.matches.len() + self.totals.len());
        flat.push(self.hyp_len);
        flat.push(self.ref_len);
        flat.extend_from_slice(&self.matches);
        flat.extend_from_slice(&self.totals);
        flat
    }
}

/// Element-wise `a += b`, growing `a` with zeros where `b` is longer.
fn add_counts(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// Sums statistics element-wise. Both sides normally have the same `max_order`; where they do
/// not (e.g. adding to `BleuStats::default()`), the shorter one counts as zero in the missing
/// orders, so the sum never panics.
impl AddAssign<&BleuStats> for BleuStats {
    fn add_assign(&mut self, other: &BleuStats) {
        add_counts(&mut self.matches, &other.matches);
        add_counts(&mut self.totals, &other.totals);
        self.hyp_len += other.hyp_len;
        self.ref_len += other.ref_len;
    }
}

impl AddAssign for BleuStats {
    fn add_assign(&mut self, other: BleuStats) {
        *self += &other;
    }
}

impl Add for BleuStats {
    type Output = BleuStats;
    fn add(mut self, other: BleuStats) -> BleuStats {
        self += &other;
        self
    }
}

impl Add<&BleuStats> for BleuStats {
    type Output = BleuStats;
    fn add(mut self, other: &BleuStats) -> BleuStats {
        self += other;
        self
    }
}

impl Sum for BleuStats {
    fn sum<I: Iterator<Item = BleuStats>>(iter: I) -> Self {
        iter.fold(BleuStats::default(), |acc, s| acc + s)
    }
}

impl<'a> Sum<&'a BleuStats> for BleuStats {
    fn sum<I: Iterator<Item = &'a BleuStats>>(iter: I) -> Self {
        iter.fold(BleuStats::default(), |acc, s| acc + s)
    }
}

/// The effective reference length of a segment: the reference length closest to `hyp_len`,
/// the shorter one on a tie (sacrebleu `_get_closest_ref_len` and NLTK `closest_ref_length`
/// agree). An empty reference counts, with length 0. `None` when there is no reference.
pub fn closest_ref_len(hyp_len: usize, ref_lens: impl IntoIterator<Item = usize>) -> Option<usize> {
    ref_lens
        .into_iter()
        .min_by_key(|&r| (r.abs_diff(hyp_len), r))
}

/// Counts BLEU statistics segment by segment with the crate's n-gram matcher
/// ([`ClippedMatcher`]), keeping its maps between segments (`clear()`, never reallocated), so
/// a corpus allocates only while the maps grow to the largest segment.
///
/// The maps borrow the tokens, so every segment given to one counter must outlive it: create
/// one counter per corpus.
pub struct StatsCounter<'a, T> {
    max_order: usize,
    matcher: ClippedMatcher<'a, T>,
}

impl<'a, T: Eq + Hash> StatsCounter<'a, T> {
    /// A counter of the orders `1..=max_order`.
    pub fn new(max_order: usize) -> Self {
        Self {
            max_order,
            matcher: ClippedMatcher::new(),
        }
    }

    /// The largest order counted.
    pub fn max_order(&self) -> usize {
        self.max_order
    }

    /// Adds the statistics of one segment to `stats` (grown to `max_order` orders if shorter):
    /// clipped matches `m_n = Σ_g min(count_hyp(g), max_r count_ref_r(g))`, totals
    /// `t_n = max(0, c - n + 1)`, `c = hyp.len()`, and the closest reference length (tie:
    /// shorter). A segment with no reference adds `ref_len` 0 and no match (the corpus
    /// functions reject such segments before counting).
    pub fn add_segment<R: AsRef<[T]>>(
        &mut self,
        hyp: &'a [T],
        refs: &'a [R],
        stats: &mut BleuStats,
    ) {
        let n = self.max_order;
        if stats.matches.len() < n {
            stats.matches.resize(n, 0);
        }
        if stats.totals.len() < n {
            stats.totals.resize(n, 0);
        }
        self.matcher
            .add_clipped_matches(hyp, refs, n, &mut stats.matches);

        let c = hyp.len();
        for (order, total) in stats.totals.iter_mut().take(n).enumerate() {
            *total += c.saturating_sub(order) as u64;
        }
        stats.hyp_len += c as u64;
        stats.ref_len +=
            closest_ref_len(c, refs.iter().map(|r| r.as_ref().len())).unwrap_or(0) as u64;
    }

    /// The statistics of one segment (see [`StatsCounter::add_segment`]).
    pub fn segment<R: AsRef<[T]>>(&mut self, hyp: &'a [T], refs: &'a [R]) -> BleuStats {
        let mut stats = BleuStats::zeros(self.max_order);
        self.add_segment(hyp, refs, &mut stats);
        stats
    }
}

/// The statistics of one segment, orders `1..=max_order` (see [`StatsCounter::add_segment`];
/// to score many segments, reuse a [`StatsCounter`]).
pub fn segment_stats<T: Eq + Hash, R: AsRef<[T]>>(
    hyp: &[T],
    refs: &[R],
    max_order: usize,
) -> BleuStats {
    StatsCounter::new(max_order).segment(hyp, refs)
}
