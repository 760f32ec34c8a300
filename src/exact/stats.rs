//! Sufficient statistics of BLEU: clipped matches and totals per order, hypothesis and
//! effective reference lengths, counted per segment with the crate's one n-gram counter
//! (`crate::ngram`) and summed over a corpus.

use std::hash::Hash;
use std::iter::Sum;
use std::ops::{Add, AddAssign};

use crate::ngram::ClippedMatcher;

use super::config::{check_max_order, BleuCounts, MetricError};

impl BleuCounts {
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

/// Element-wise `a += b`, growing `a` with zeros where `b` is longer. Saturates at `u64::MAX`
/// rather than wrapping (no real corpus comes near).
fn add_counts(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, y) in a.iter_mut().zip(b) {
        *x = x.saturating_add(*y);
    }
}

/// Sums statistics element-wise. Both sides normally have the same `max_order`; where they do
/// not (e.g. adding to `BleuCounts::default()`), the shorter one counts as zero in the missing
/// orders, so the sum never panics.
impl AddAssign<&BleuCounts> for BleuCounts {
    fn add_assign(&mut self, other: &BleuCounts) {
        add_counts(&mut self.matches, &other.matches);
        add_counts(&mut self.totals, &other.totals);
        self.hyp_len = self.hyp_len.saturating_add(other.hyp_len);
        self.ref_len = self.ref_len.saturating_add(other.ref_len);
    }
}

impl AddAssign for BleuCounts {
    fn add_assign(&mut self, other: BleuCounts) {
        *self += &other;
    }
}

impl Add for BleuCounts {
    type Output = BleuCounts;
    fn add(mut self, other: BleuCounts) -> BleuCounts {
        self += &other;
        self
    }
}

impl Add<&BleuCounts> for BleuCounts {
    type Output = BleuCounts;
    fn add(mut self, other: &BleuCounts) -> BleuCounts {
        self += other;
        self
    }
}

impl Sum for BleuCounts {
    fn sum<I: Iterator<Item = BleuCounts>>(iter: I) -> Self {
        iter.fold(BleuCounts::default(), |acc, s| acc + s)
    }
}

impl<'a> Sum<&'a BleuCounts> for BleuCounts {
    fn sum<I: Iterator<Item = &'a BleuCounts>>(iter: I) -> Self {
        iter.fold(BleuCounts::default(), |acc, s| acc + s)
    }
}

/// The effective reference length of a segment: the reference length closest to `hyp_len`,
/// the shorter one on a tie (sacrebleu `_get_closest_ref_len` and NLTK `closest_ref_length`
/// agree). An empty reference counts, with length 0. `None` when there is no reference.
pub(crate) fn closest_ref_len(
    hyp_len: usize,
    ref_lens: impl IntoIterator<Item = usize>,
) -> Option<usize> {
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
pub(crate) struct StatsCounter<'a, T> {
    max_order: usize,
    matcher: ClippedMatcher<'a, T>,
}

impl<'a, T: Eq + Hash> StatsCounter<'a, T> {
    /// A counter of the orders `1..=max_order` (validated by the caller).
    pub(crate) fn new_unchecked(max_order: usize) -> Self {
        Self {
            max_order,
            matcher: ClippedMatcher::new(),
        }
    }

    /// Adds the statistics of one segment to `stats` (grown to `max_order` orders if shorter):
    /// clipped matches `m_n = Σ_g min(count_hyp(g), max_r count_ref_r(g))`, totals
    /// `t_n = max(0, c - n + 1)`, `c = hyp.len()`, and the closest reference length (tie:
    /// shorter). A segment with no reference adds `ref_len` 0 and no match (the corpus
    /// functions reject such segments before counting).
    pub(crate) fn add_segment<R: AsRef<[T]>>(
        &mut self,
        hyp: &'a [T],
        refs: &'a [R],
        stats: &mut BleuCounts,
    ) {
        let n = self.max_order;
        grow_orders(stats, n);
        self.matcher
            .add_clipped_matches(hyp, refs, n, &mut stats.matches);
        add_lengths(stats, n, hyp.len(), refs.iter().map(|r| r.as_ref().len()));
    }

    /// The statistics of one segment (see [`StatsCounter::add_segment`]).
    pub(crate) fn segment<R: AsRef<[T]>>(&mut self, hyp: &'a [T], refs: &'a [R]) -> BleuCounts {
        let mut stats = BleuCounts::zeros(self.max_order);
        self.add_segment(hyp, refs, &mut stats);
        stats
    }
}

/// Grows `stats` to `n` orders (with zeros) if it holds fewer.
pub(super) fn grow_orders(stats: &mut BleuCounts, n: usize) {
    if stats.matches.len() < n {
        stats.matches.resize(n, 0);
    }
    if stats.totals.len() < n {
        stats.totals.resize(n, 0);
    }
}

/// Adds everything of one segment but its matches: totals `t_n = max(0, c - n + 1)` for orders
/// `1..=n`, `c` and the closest reference length (0 without a reference).
pub(super) fn add_lengths(
    stats: &mut BleuCounts,
    n: usize,
    c: usize,
    ref_lens: impl Iterator<Item = usize>,
) {
    for (order, total) in stats.totals.iter_mut().take(n).enumerate() {
        *total += c.saturating_sub(order) as u64;
    }
    stats.hyp_len += c as u64;
    stats.ref_len += closest_ref_len(c, ref_lens).unwrap_or(0) as u64;
}

/// The statistics of one segment, orders `1..=max_order`: clipped matches
/// `m_n = Σ_g min(count_hyp(g), max_r count_ref_r(g))`, totals `t_n = max(0, c - n + 1)`,
/// `c = hyp.len()`, and the reference length closest to `c` (the shorter on a tie). For a
/// corpus, [`corpus_stats`](super::corpus_stats) reuses its tables across segments.
///
/// Errors: `max_order` outside `1..=`[`MAX_ORDER`](super::MAX_ORDER).
///
/// ```
/// use candle_bleu::exact::segment_stats;
/// let stats = segment_stats(&[1u32, 2, 3, 1], &[vec![1u32, 2, 1], vec![3u32]], 2)?;
/// assert_eq!(stats.matches, [4, 1]); // 1 twice, 2, 3; the bigram (1, 2)
/// assert_eq!(stats.totals, [4, 3]);
/// assert_eq!((stats.hyp_len, stats.ref_len), (4, 3));
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn segment_stats<T: Eq + Hash, R: AsRef<[T]>>(
    hyp: &[T],
    refs: &[R],
    max_order: usize,
) -> Result<BleuCounts, MetricError> {
    check_max_order("max_order", max_order)?;
    Ok(StatsCounter::new_unchecked(max_order).segment(hyp, refs))
}
