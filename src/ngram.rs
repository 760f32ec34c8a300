//! The one n-gram counter of the crate.
//!
//! Both the exact BLEU ([`crate::exact`]) and the reference side of the differentiable
//! loss ([`crate::loss`]) count n-grams here, so the two can never disagree about what an
//! n-gram match is. N-grams are keyed by the slice of the token sequence they cover: each
//! n-gram is hashed once, with no allocation per token, and n-grams of different orders
//! never collide (slices of different lengths are different keys), so one map holds every
//! order of a sequence.

use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};

/// Counts of n-grams, keyed by the slice they cover. Orders share one map: the order of a
/// key is `key.len()`.
pub type NgramCounts<'a, T> = FxHashMap<&'a [T], u32>;

/// Adds the counts of every n-gram of order `1..=max_order` in `tokens` to `counts`.
pub fn count_ngrams_into<'a, T: Hash + Eq>(
    tokens: &'a [T],
    max_order: usize,
    counts: &mut NgramCounts<'a, T>,
) {
    for order in 1..=max_order.min(tokens.len()) {
        for ngram in tokens.windows(order) {
            *counts.entry(ngram).or_insert(0) += 1;
        }
    }
}

/// Counts of every n-gram of order `1..=max_order` in `tokens`.
pub fn count_ngrams<T: Hash + Eq>(tokens: &[T], max_order: usize) -> NgramCounts<'_, T> {
    let mut counts = NgramCounts::default();
    count_ngrams_into(tokens, max_order, &mut counts);
    counts
}

/// Raises `max_counts` to the counts of `reference` wherever they are larger: after one
/// call per reference, `max_counts[g] = max_r count_{ρ^r}(g)`, the clipping limit of BLEU.
///
/// `scratch` holds the counts of this one reference; it is cleared and reused so that a
/// caller scoring many segments allocates once.
pub fn merge_max_counts<'a, T: Hash + Eq>(
    reference: &'a [T],
    max_order: usize,
    scratch: &mut NgramCounts<'a, T>,
    max_counts: &mut NgramCounts<'a, T>,
) {
    scratch.clear();
    count_ngrams_into(reference, max_order, scratch);
    for (&ngram, &count) in scratch.iter() {
        let entry = max_counts.entry(ngram).or_insert(0);
        if *entry < count {
            *entry = count;
        }
    }
}

/// Clipped matches per order: `matches[n-1] += Σ_{g of order n in hyp} min(count_hyp(g), max_ref(g))`.
///
/// `matches` must have at least as many entries as the largest order in `hyp_counts`.
pub fn add_clipped_matches<T: Hash + Eq>(
    hyp_counts: &NgramCounts<'_, T>,
    max_ref_counts: &NgramCounts<'_, T>,
    matches: &mut [u64],
) {
    for (ngram, &count) in hyp_counts.iter() {
        if let Some(&limit) = max_ref_counts.get(ngram) {
            matches[ngram.len() - 1] += u64::from(count.min(limit));
        }
    }
}

/// The reference-side statistics of one order for references laid end to end (SPEC §2).
///
/// Positions run over the concatenation of the references, reference `r` on its own
/// `lengths[r]` positions. For the n-gram starting at position `j`:
/// - `inside[j]` (`e_j`): the n-gram lies entirely inside its reference;
/// - `first[j]` (`ν_j`): it is inside and is the first occurrence of its n-gram over all
///   references;
/// - `clip[j]` (`κ_j`): at first occurrences, the largest count of the n-gram in any one
///   reference; 0 elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReferenceNgramMasks {
    pub inside: Vec<bool>,
    pub first: Vec<bool>,
    pub clip: Vec<u32>,
}

/// Computes [`ReferenceNgramMasks`] of order `order` (>= 1) for `references`.
pub fn reference_ngram_masks<T: Hash + Eq>(
    references: &[&[T]],
    order: usize,
) -> ReferenceNgramMasks {
    assert!(order >= 1, "reference_ngram_masks: order must be >= 1");
    let total: usize = references.iter().map(|r| r.len()).sum();
    let mut masks = ReferenceNgramMasks {
        inside: vec![false; total],
        first: vec![false; total],
        clip: vec![0; total],
    };
    let mut max_counts: FxHashMap<&[T], u32> = FxHashMap::default();
    let mut per_reference: FxHashMap<&[T], u32> = FxHashMap::default();
    for reference in references {
        per_reference.clear();
        for ngram in reference.windows(order) {
            *per_reference.entry(ngram).or_insert(0) += 1;
        }
        for (&ngram, &count) in per_reference.iter() {
            let entry = max_counts.entry(ngram).or_insert(0);
            *entry = (*entry).max(count);
        }
    }
    let mut seen: FxHashMap<&[T], ()> = FxHashMap::default();
    let mut offset = 0;
    for reference in references {
        for (start, ngram) in reference.windows(order).enumerate() {
            let j = offset + start;
            masks.inside[j] = true;
            if seen.insert(ngram, ()).is_none() {
                masks.first[j] = true;
                masks.clip[j] = max_counts[ngram];
            }
        }
        offset += reference.len();
    }
    masks
}

/// A map `u64 -> u32` for [`ClippedMatcher`]: open addressing with linear probing, sized
/// for the whole segment before it is filled (no growth while counting), cleared in O(1) by
/// bumping a generation stamp. A slot is `(key, id, stamp)`, one 16-byte load per probe.
#[derive(Default)]
struct IdTable {
    /// Occupied when the stamp equals `stamp`.
    slots: Vec<(u64, u32, u32)>,
    stamp: u32,
    shift: u32,
}

impl IdTable {
    /// Empties the table and makes room for `entries` keys at load factor <= 1/2.
    fn reset(&mut self, entries: usize) {
        let capacity = (2 * entries).next_power_of_two().max(16);
        if capacity > self.slots.len() {
            self.slots = vec![(0, 0, 0); capacity];
            self.stamp = 0;
            self.shift = 64 - capacity.trailing_zeros();
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.fill((0, 0, 0));
            self.stamp = 1;
        }
    }

    #[inline]
    fn slot(&self, key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The id of `key`, 0 if absent.
    #[inline]
    fn get(&self, key: u64) -> u32 {
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(key);
        loop {
            let (k, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                return 0;
            }
            if k == key {
                return id;
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The id of `key`, inserting `new_id()` if absent.
    #[inline]
    fn get_or_insert(&mut self, key: u64, new_id: impl FnOnce() -> u32) -> u32 {
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(key);
        loop {
            let (k, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                let id = new_id();
                self.slots[slot] = (key, id, self.stamp);
                return id;
            }
            if k == key {
                return id;
            }
            slot = (slot + 1) & mask;
        }
    }
}

/// A map `token -> u32` for [`ClippedMatcher`], like [`IdTable`]: each token is hashed once
/// (FxHash), probed linearly, and compared with `==` only when the full 64-bit hashes agree.
struct TokenTable<'a, T> {
    /// (hash, id, stamp) per slot; occupied when its stamp equals `stamp`.
    slots: Vec<(u64, u32, u32)>,
    tokens: Vec<Option<&'a T>>,
    stamp: u32,
    shift: u32,
}

impl<T> Default for TokenTable<'_, T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            tokens: Vec::new(),
            stamp: 0,
            shift: 64,
        }
    }
}

impl<'a, T: Hash + Eq> TokenTable<'a, T> {
    fn hash(token: &T) -> u64 {
        let mut hasher = rustc_hash::FxHasher::default();
        token.hash(&mut hasher);
        hasher.finish()
    }

    /// Empties the table and makes room for `entries` tokens at load factor <= 1/2.
    fn reset(&mut self, entries: usize) {
        let capacity = (2 * entries).next_power_of_two().max(16);
        if capacity > self.slots.len() {
            self.slots = vec![(0, 0, 0); capacity];
            self.tokens = vec![None; capacity];
            self.stamp = 0;
            self.shift = 64 - capacity.trailing_zeros();
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.fill((0, 0, 0));
            self.stamp = 1;
        }
    }

    #[inline]
    fn slot(&self, hash: u64) -> usize {
        (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// The id of `token`, 0 if absent.
    #[inline]
    fn get(&self, token: &T) -> u32 {
        let hash = Self::hash(token);
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(hash);
        loop {
            let (h, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                return 0;
            }
            if h == hash && self.tokens[slot] == Some(token) {
                return id;
            }
            slot = (slot + 1) & mask;
        }
    }

    /// The id of `token`, inserting `new_id()` if absent.
    #[inline]
    fn get_or_insert(&mut self, token: &'a T, new_id: impl FnOnce() -> u32) -> u32 {
        let hash = Self::hash(token);
        let mask = self.slots.len() - 1;
        let mut slot = self.slot(hash);
        loop {
            let (h, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                let id = new_id();
                self.slots[slot] = (hash, id, self.stamp);
                self.tokens[slot] = Some(token);
                return id;
            }
            if h == hash && self.tokens[slot] == Some(token) {
                return id;
            }
            slot = (slot + 1) & mask;
        }
    }
}

/// Clipped matches of one segment, computed without hashing any n-gram longer than one token:
/// the same numbers as [`count_ngrams_into`] + [`merge_max_counts`] + [`add_clipped_matches`]
/// (a test checks it), several times faster, for scoring large corpora.
///
/// Every hypothesis token gets a dense id from a map of tokens; an n-gram gets an id from a map
/// keyed by `(id of its (n-1)-gram prefix, id of its last token)`, two `u32`s packed in a
/// `u64`, so ids are exact (no hash collision can merge two n-grams). Only reference n-grams
/// made of hypothesis tokens are stored, and a hypothesis n-gram whose prefix occurs in no
/// reference is skipped without a lookup. Each hypothesis occurrence of an n-gram consumes one
/// unit of `max_r count_{ρ^r}(g)`, so the matches of `g` add up to
/// `min(count_hyp(g), max_r count_{ρ^r}(g))`.
///
/// The maps are cleared, never reallocated, between segments. They borrow the tokens, so every
/// segment given to one matcher must outlive it.
pub struct ClippedMatcher<'a, T> {
    /// Hypothesis token -> unigram id (ids start at 1; 0 means "not in the hypothesis").
    unigram_ids: TokenTable<'a, T>,
    /// (prefix id << 32 | last-token id) -> id of a reference n-gram (0 = absent).
    extension_ids: IdTable,
    /// Per id: clipping limit `max_r count`, consumed by the hypothesis.
    limit: Vec<u32>,
    /// Per id: count in the current reference (multi-reference segments only).
    count: Vec<u32>,
    /// Ids counted in the current reference, to reset `count`.
    touched: Vec<u32>,
    /// Per position of the hypothesis: the unigram id of its token.
    hyp_token_ids: Vec<u32>,
    /// Per position of the current reference: the unigram id of its token (0 if not in the
    /// hypothesis).
    token_ids: Vec<u32>,
    /// Per start position: the id of the n-gram of the current order starting there.
    ngram_ids: Vec<u32>,
}

impl<T> Default for ClippedMatcher<'_, T> {
    fn default() -> Self {
        Self {
            unigram_ids: TokenTable::default(),
            extension_ids: IdTable::default(),
            limit: Vec::new(),
            count: Vec::new(),
            touched: Vec::new(),
            hyp_token_ids: Vec::new(),
            token_ids: Vec::new(),
            ngram_ids: Vec::new(),
        }
    }
}

impl<'a, T: Hash + Eq> ClippedMatcher<'a, T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts the n-grams of `reference` made of hypothesis tokens into `limit` (one
    /// reference) or `count` (several; merged into `limit` by max afterwards).
    fn add_reference(&mut self, reference: &'a [T], max_order: usize, single: bool) {
        self.token_ids.clear();
        self.token_ids
            .extend(reference.iter().map(|t| self.unigram_ids.get(t)));
        if max_order == 0 {
            return;
        }
        // Unigrams, branch-free for one reference: id 0 (not in the hypothesis) absorbs the
        // counts of the other tokens and is reset to 0 by the caller.
        if single {
            for &id in &self.token_ids {
                self.limit[id as usize] += 1;
            }
        } else {
            for &id in &self.token_ids {
                if id != 0 {
                    if self.count[id as usize] == 0 {
                        self.touched.push(id);
                    }
                    self.count[id as usize] += 1;
                }
            }
        }
        self.ngram_ids.clear();
        self.ngram_ids.extend_from_slice(&self.token_ids);
        for order in 2..=max_order.min(reference.len()) {
            let starts = reference.len() - order + 1;
            let mut alive = false;
            for start in 0..starts {
                let prefix = self.ngram_ids[start];
                if prefix == 0 {
                    continue;
                }
                let last = self.token_ids[start + order - 1];
                let id = if last == 0 {
                    0
                } else {
                    let key = (u64::from(prefix) << 32) | u64::from(last);
                    let (limit, count) = (&mut self.limit, &mut self.count);
                    self.extension_ids.get_or_insert(key, || {
                        limit.push(0);
                        count.push(0);
                        (limit.len() - 1) as u32
                    })
                };
                self.ngram_ids[start] = id;
                if id == 0 {
                    continue;
                }
                alive = true;
                if single {
                    self.limit[id as usize] += 1;
                } else {
                    if self.count[id as usize] == 0 {
                        self.touched.push(id);
                    }
                    self.count[id as usize] += 1;
                }
            }
            if !alive {
                break;
            }
            // Positions past the last start of this order cannot start a longer n-gram.
            self.ngram_ids[starts..].fill(0);
        }
        if !single {
            for &id in &self.touched {
                let id = id as usize;
                self.limit[id] = self.limit[id].max(self.count[id]);
                self.count[id] = 0;
            }
            self.touched.clear();
        }
    }

    /// Adds the clipped matches of `hyp` against `refs` to `matches[n-1]`, orders
    /// `1..=max_order` (`matches.len() >= max_order`).
    pub fn add_clipped_matches<R: AsRef<[T]>>(
        &mut self,
        hyp: &'a [T],
        refs: &'a [R],
        max_order: usize,
        matches: &mut [u64],
    ) {
        self.unigram_ids.reset(hyp.len());
        self.limit.clear();
        self.count.clear();
        self.limit.push(0); // id 0: "absent"
        self.count.push(0);
        self.hyp_token_ids.clear();
        for token in hyp {
            let (limit, count) = (&mut self.limit, &mut self.count);
            let id = self.unigram_ids.get_or_insert(token, || {
                limit.push(0);
                count.push(0);
                (limit.len() - 1) as u32
            });
            self.hyp_token_ids.push(id);
        }
        let ref_ngrams: usize = refs
            .iter()
            .map(|r| {
                let len = r.as_ref().len();
                (2..=max_order.min(len)).map(|n| len - n + 1).sum::<usize>()
            })
            .sum();
        self.extension_ids.reset(ref_ngrams);
        let single = refs.len() == 1;
        for reference in refs {
            self.add_reference(reference.as_ref(), max_order, single);
        }
        self.limit[0] = 0;

        if max_order == 0 {
            return;
        }
        // Unigrams: a hypothesis token extends to longer n-grams only if some reference has it.
        let limit = &mut self.limit;
        self.ngram_ids.clear();
        self.ngram_ids.extend(self.hyp_token_ids.iter().map(|&id| {
            if limit[id as usize] > 0 {
                id
            } else {
                0
            }
        }));
        // Per position: its token's id if some reference has the token, else 0.
        self.token_ids.clear();
        self.token_ids.extend_from_slice(&self.ngram_ids);
        for &id in &self.hyp_token_ids {
            let limit = &mut limit[id as usize];
            let take = u32::from(*limit > 0);
            *limit -= take;
            matches[0] += u64::from(take);
        }
        for order in 2..=max_order.min(hyp.len()) {
            let starts = hyp.len() - order + 1;
            let mut alive = false;
            for start in 0..starts {
                let prefix = self.ngram_ids[start];
                if prefix == 0 {
                    continue; // the (n-1)-gram prefix is in no reference: neither is the n-gram
                }
                let last = self.token_ids[start + order - 1];
                let id = if last == 0 {
                    0
                } else {
                    self.extension_ids
                        .get((u64::from(prefix) << 32) | u64::from(last))
                };
                self.ngram_ids[start] = id;
                // Only an n-gram present in some reference can extend to a longer match; id 0
                // has limit 0, so it takes nothing.
                alive |= id != 0;
                let limit = &mut self.limit[id as usize];
                let take = u32::from(*limit > 0);
                *limit -= take;
                matches[order - 1] += u64::from(take);
            }
            if !alive {
                break;
            }
            self.ngram_ids[starts..].fill(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_order_in_one_map() {
        let tokens = [1u32, 2, 1, 2];
        let counts = count_ngrams(&tokens, 3);
        assert_eq!(counts[&[1u32][..]], 2);
        assert_eq!(counts[&[2u32][..]], 2);
        assert_eq!(counts[&[1u32, 2][..]], 2);
        assert_eq!(counts[&[2u32, 1][..]], 1);
        assert_eq!(counts[&[1u32, 2, 1][..]], 1);
        assert_eq!(counts.len(), 2 + 2 + 2);
    }

    #[test]
    fn clipping_takes_the_max_over_references_not_the_sum() {
        let hyp = ["the", "the", "the", "cat"];
        let ref_a = ["the", "cat"];
        let ref_b = ["the", "the", "dog"];
        let hyp_counts = count_ngrams(&hyp, 2);
        let mut max_counts = NgramCounts::default();
        let mut scratch = NgramCounts::default();
        merge_max_counts(&ref_a, 2, &mut scratch, &mut max_counts);
        merge_max_counts(&ref_b, 2, &mut scratch, &mut max_counts);
        let mut matches = [0u64; 2];
        add_clipped_matches(&hyp_counts, &max_counts, &mut matches);
        // "the": min(3, max(1, 2)) = 2, "cat": 1; bigrams "the the" 1, "the cat" 1.
        assert_eq!(matches, [3, 2]);
    }

    #[test]
    fn reference_masks_mark_first_occurrences_and_clip_counts() {
        let ref_a = [5u32, 6, 5, 6];
        let ref_b = [5u32, 6, 7];
        let masks = reference_ngram_masks(&[&ref_a[..], &ref_b[..]], 2);
        // positions: a = 0..4, b = 4..7; bigrams start at 0,1,2 (a) and 4,5 (b).
        assert_eq!(
            masks.inside,
            vec![true, true, true, false, true, true, false]
        );
        assert_eq!(
            masks.first,
            vec![true, true, false, false, false, true, false]
        );
        // (5,6): 2 in a, 1 in b -> 2; (6,5): 1; (6,7): 1.
        assert_eq!(masks.clip, vec![2, 1, 0, 0, 0, 1, 0]);
    }

    #[test]
    fn clipped_matcher_equals_the_map_counter() {
        // Random segments with repeats, 1-4 references, empty sequences, orders 1-7.
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        let mut matcher = ClippedMatcher::new();
        let mut segments = Vec::new();
        for _ in 0..3000 {
            let vocab = 1 + next(8);
            let hyp: Vec<u64> = (0..next(14)).map(|_| next(vocab)).collect();
            let refs: Vec<Vec<u64>> = (0..1 + next(4))
                .map(|_| (0..next(14)).map(|_| next(vocab)).collect())
                .collect();
            segments.push((hyp, refs, 1 + next(7) as usize));
        }
        for (hyp, refs, max_order) in &segments {
            let mut max_counts = NgramCounts::default();
            let mut scratch = NgramCounts::default();
            for r in refs {
                merge_max_counts(r, *max_order, &mut scratch, &mut max_counts);
            }
            let mut want = vec![0u64; *max_order];
            add_clipped_matches(&count_ngrams(hyp, *max_order), &max_counts, &mut want);
            let mut got = vec![0u64; *max_order];
            matcher.add_clipped_matches(hyp, refs, *max_order, &mut got);
            assert_eq!(got, want, "hyp {hyp:?} refs {refs:?} order {max_order}");
        }
    }
}
