//! The one n-gram counter of the crate (crate-internal).
//!
//! Both the exact metrics ([`crate::exact`]: BLEU's clipped matches, chrF's character and word
//! n-gram matches) and the reference side of the differentiable loss ([`crate::loss`]) count
//! n-grams here, so they can never disagree about what an n-gram match is.
//!
//! - [`ClippedMatcher`]: the clipped matches of one segment against its references, orders
//!   `1..=N`, with every token hashed once and longer n-grams numbered from their prefix
//!   (no n-gram is hashed or allocated); [`InternedMatcher`] for tokens already interned.
//! - [`reference_ngram_masks`]: the first-occurrence masks and clip counts of the loss.
//! - [`Slots`]: the open addressing of every hash table of the crate ([`IdTable`], the token
//!   table of [`ClippedMatcher`], the line vocabulary of the text counter in `exact`), written
//!   once.
//!
//! Every function here is internal: its callers size `matches` (one entry per order) and make
//! the ids they pass, so nothing is checked twice in the hot loops.

use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};

/// The reference-side statistics of one order for references laid end to end (docs/loss.md, the first-occurrence masks).
///
/// Positions run over the concatenation of the references, reference `r` on its own
/// `lengths[r]` positions. For the n-gram starting at position `j`:
/// - `inside[j]` (`e_j`): the n-gram lies entirely inside its reference;
/// - `first[j]` (`ν_j`): it is inside and is the first occurrence of its n-gram over all
///   references;
/// - `clip[j]` (`κ_j`): at first occurrences, the largest count of the n-gram in any one
///   reference; 0 elsewhere.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ReferenceNgramMasks {
    /// `e_j`: the n-gram starting at `j` lies inside its reference.
    pub inside: Vec<bool>,
    /// `ν_j`: it does, and is the first occurrence of its n-gram over all references.
    pub first: Vec<bool>,
    /// `κ_j`: at first occurrences, the n-gram's largest count in any one reference; else 0.
    pub clip: Vec<u32>,
}

/// Computes [`ReferenceNgramMasks`] of order `order` for `references`.
///
/// Order 0 has no n-gram, as in every counter of this module (orders run from 1): its masks
/// are all `false` and its clipping counts 0 (one entry per position all the same).
pub(crate) fn reference_ngram_masks<T: Hash + Eq>(
    references: &[&[T]],
    order: usize,
) -> ReferenceNgramMasks {
    let total: usize = references.iter().map(|r| r.len()).sum();
    let mut masks = ReferenceNgramMasks {
        inside: vec![false; total],
        first: vec![false; total],
        clip: vec![0; total],
    };
    if order == 0 {
        return masks;
    }
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

/// The open addressing of every hash table of the crate, written once: slots
/// `(hash, id, stamp)` (one 16-byte load per probe), linear probing from the top bits of the
/// hash times a Fibonacci constant, a slot occupied when its stamp is the table's. A table is
/// sized for what it will hold before it is filled (load factor <= 1/2) and cleared in O(1) by
/// bumping the stamp. The tables keep the keys themselves where a key is more than its hash
/// ([`TokenTable`], `exact`'s line vocabulary) and compare them in [`Slots::probe`]'s `same`.
#[derive(Default)]
pub(crate) struct Slots {
    slots: Vec<(u64, u32, u32)>,
    stamp: u32,
    /// `64 - log2(slots.len())`.
    shift: u32,
}

/// Where [`Slots::probe`] stopped.
pub(crate) enum Probe {
    /// The key is present, with this id.
    Found(u32),
    /// The key is absent; this empty slot is where it belongs ([`Slots::fill`]).
    Vacant(usize),
}

impl Slots {
    /// Empties the table, with room for `entries` keys at load factor <= 1/2 and at least
    /// `min_slots` slots (a power of two). Returns whether the slots were reallocated (to
    /// [`Slots::capacity`] slots), for tables that keep a key per slot.
    pub(crate) fn reset(&mut self, entries: usize, min_slots: usize) -> bool {
        let capacity = (2 * entries).next_power_of_two().max(min_slots);
        let reallocated = capacity > self.slots.len();
        if reallocated {
            self.slots = vec![(0, 0, 0); capacity];
            self.stamp = 0;
            self.shift = 64 - capacity.trailing_zeros();
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.slots.fill((0, 0, 0));
            self.stamp = 1;
        }
        reallocated
    }

    /// The number of slots.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Probes for the key of hash `hash`: the first slot of equal hash for which
    /// `same(id, slot)` holds (the key stored there is the key), else the empty slot that ends
    /// the run. The table must have been [`Slots::reset`].
    #[inline(always)]
    pub(crate) fn probe(&self, hash: u64, mut same: impl FnMut(u32, usize) -> bool) -> Probe {
        let mask = self.slots.len() - 1;
        let mut slot = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        loop {
            let (h, id, stamp) = self.slots[slot];
            if stamp != self.stamp {
                return Probe::Vacant(slot);
            }
            if h == hash && same(id, slot) {
                return Probe::Found(id);
            }
            slot = (slot + 1) & mask;
        }
    }

    /// Occupies `slot` (a [`Probe::Vacant`] of the current stamp) with `(hash, id)`.
    #[inline(always)]
    pub(crate) fn fill(&mut self, slot: usize, hash: u64, id: u32) {
        self.slots[slot] = (hash, id, self.stamp);
    }

    /// Reallocates to `capacity` slots (a power of two) holding `entries` `(hash, id)`, all
    /// distinct keys: the growth of a table that cannot be sized in advance.
    pub(crate) fn rebuild(&mut self, capacity: usize, entries: impl Iterator<Item = (u64, u32)>) {
        self.slots = vec![(0, 0, 0); capacity];
        self.shift = 64 - capacity.trailing_zeros();
        self.stamp = 1;
        for (hash, id) in entries {
            if let Probe::Vacant(slot) = self.probe(hash, |_, _| false) {
                self.fill(slot, hash, id);
            }
        }
    }
}

/// A map `u64 -> u32` (keys are their own hashes) for [`IdMatcher`]'s long segments and
/// chrF's characters: [`Slots`], sized for the whole segment before it is filled.
#[derive(Default)]
pub(crate) struct IdTable {
    slots: Slots,
}

impl IdTable {
    /// Empties the table and makes room for `entries` keys at load factor <= 1/2.
    pub(crate) fn reset(&mut self, entries: usize) {
        self.slots.reset(entries, 16);
    }

    /// The id of `key`, 0 if absent.
    #[inline]
    pub(crate) fn get(&self, key: u64) -> u32 {
        match self.slots.probe(key, |_, _| true) {
            Probe::Found(id) => id,
            Probe::Vacant(_) => 0,
        }
    }

    /// The id of `key`, inserting `new_id()` if absent.
    #[inline]
    pub(crate) fn get_or_insert(&mut self, key: u64, new_id: impl FnOnce() -> u32) -> u32 {
        match self.slots.probe(key, |_, _| true) {
            Probe::Found(id) => id,
            Probe::Vacant(slot) => {
                let id = new_id();
                self.slots.fill(slot, key, id);
                id
            }
        }
    }
}

/// The map from `(id of an (n-1)-gram prefix, id of a last token)` to the id of an n-gram of
/// the hypothesis, for one order of one segment (see [`IdMatcher`]).
trait NgramTable {
    /// Empties the table for prefixes `0..rows`, last tokens `0..cols` and at most `entries`
    /// n-grams.
    fn begin(&mut self, rows: usize, cols: usize, entries: usize);
    /// The id of `(prefix, last)`, 0 if absent (always for a prefix or last token 0).
    fn get(&self, prefix: u32, last: u32) -> u32;
    /// The id of `(prefix, last)`, `*next` (then incremented) if it is new.
    fn get_or_insert(&mut self, prefix: u32, last: u32, next: &mut u32) -> u32;
}

impl NgramTable for IdTable {
    fn begin(&mut self, _rows: usize, _cols: usize, entries: usize) {
        self.reset(entries);
    }

    #[inline]
    fn get(&self, prefix: u32, last: u32) -> u32 {
        IdTable::get(self, (u64::from(prefix) << 32) | u64::from(last))
    }

    #[inline]
    fn get_or_insert(&mut self, prefix: u32, last: u32, next: &mut u32) -> u32 {
        IdTable::get_or_insert(self, (u64::from(prefix) << 32) | u64::from(last), || {
            *next += 1;
            *next - 1
        })
    }
}

/// [`NgramTable`] as a `rows × cols` array of `(stamp, id)`, for segments short enough that
/// the array stays small (see [`DIRECT_MAX_ENTRIES`]): one load per lookup, no hashing, no
/// probing, no branch. Cleared in O(1) by bumping the stamp.
#[derive(Default)]
struct DirectTable {
    entries: Vec<(u32, u32)>,
    stamp: u32,
    cols: usize,
}

/// The largest `rows × cols` served by a [`DirectTable`] (128 KiB); a segment needing more (a
/// hypothesis of more than ~127 tokens) uses the hashed [`IdTable`].
const DIRECT_MAX_ENTRIES: usize = 1 << 14;

impl NgramTable for DirectTable {
    fn begin(&mut self, rows: usize, cols: usize, _entries: usize) {
        let need = rows * cols;
        if need > self.entries.len() {
            self.entries.resize(need, (0, 0));
        }
        self.cols = cols;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.entries.fill((0, 0));
            self.stamp = 1;
        }
    }

    #[inline]
    fn get(&self, prefix: u32, last: u32) -> u32 {
        let (stamp, id) = self.entries[prefix as usize * self.cols + last as usize];
        // Arithmetic, not a branch (whether a reference n-gram is in the hypothesis is a coin
        // toss that a branch predictor loses): all ones iff the stamps agree.
        let keep = (u64::from(stamp ^ self.stamp).wrapping_sub(1) >> 32) as u32;
        id & keep
    }

    #[inline]
    fn get_or_insert(&mut self, prefix: u32, last: u32, next: &mut u32) -> u32 {
        let entry = &mut self.entries[prefix as usize * self.cols + last as usize];
        let hit = entry.0 == self.stamp;
        let id = if hit { entry.1 } else { *next };
        *next += u32::from(!hit);
        *entry = (self.stamp, id);
        id
    }
}

/// A map `token -> u32` for [`ClippedMatcher`], on [`Slots`]: each token is hashed once
/// (FxHash), probed linearly, and compared with `==` only when the full 64-bit hashes agree.
struct TokenTable<'a, T> {
    slots: Slots,
    /// The token of each occupied slot.
    tokens: Vec<Option<&'a T>>,
}

impl<T> Default for TokenTable<'_, T> {
    fn default() -> Self {
        Self {
            slots: Slots::default(),
            tokens: Vec::new(),
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
        if self.slots.reset(entries, 16) {
            self.tokens = vec![None; self.slots.capacity()];
        }
    }

    /// The id of `token`, 0 if absent.
    #[inline]
    fn get(&self, token: &T) -> u32 {
        match self.slots.probe(Self::hash(token), |_, slot| {
            self.tokens[slot] == Some(token)
        }) {
            Probe::Found(id) => id,
            Probe::Vacant(_) => 0,
        }
    }

    /// The id of `token`, inserting `new_id()` if absent.
    #[inline]
    fn get_or_insert(&mut self, token: &'a T, new_id: impl FnOnce() -> u32) -> u32 {
        let hash = Self::hash(token);
        match self
            .slots
            .probe(hash, |_, slot| self.tokens[slot] == Some(token))
        {
            Probe::Found(id) => id,
            Probe::Vacant(slot) => {
                let id = new_id();
                self.slots.fill(slot, hash, id);
                self.tokens[slot] = Some(token);
                id
            }
        }
    }
}

/// The token-independent core of [`ClippedMatcher`] and [`InternedMatcher`]: clipped matches
/// of one segment whose tokens are already segment-local ids (hypothesis tokens `1..=vocab`,
/// reference tokens the id of the equal hypothesis token or 0).
///
/// Order by order, every n-gram of the HYPOTHESIS gets a dense id `1..=m_n` from a table keyed
/// by `(id of its (n-1)-gram prefix, id of its last token)`, so ids are exact (no hash
/// collision can merge two n-grams). A reference n-gram is only looked up: it has an id iff
/// the hypothesis holds it (its prefix must then have one too, so a reference position whose
/// prefix has none is 0 without a lookup). Then, with `h_g` the hypothesis count and `c_g^r`
/// the count in reference `r`, the order adds `Σ_{g=1..=m_n} min(h_g, max_r c_g^r)`. Id 0
/// absorbs everything that is not in the hypothesis. Once an order has no match, no longer
/// n-gram can match, and the counting stops.
#[derive(Default)]
struct IdMatcher {
    direct: DirectTable,
    hashed: IdTable,
    /// Per hypothesis start: the id of the n-gram of the previous / current order.
    hyp_prev: Vec<u32>,
    hyp_cur: Vec<u32>,
    /// The references' unigram ids laid end to end, and each one's `(offset, len)`.
    ref_uni: Vec<u32>,
    ref_bounds: Vec<(usize, usize)>,
    /// Per reference position: the id of the n-gram of the previous / current order starting
    /// there (0 if the hypothesis does not hold it or it runs past its reference).
    ref_prev: Vec<u32>,
    ref_cur: Vec<u32>,
    /// Per id of the current order: count in the hypothesis, clipping limit, count in the
    /// current reference.
    hyp_count: Vec<u32>,
    limit: Vec<u32>,
    count: Vec<u32>,
}

impl IdMatcher {
    /// Starts a segment: no reference yet.
    fn clear_refs(&mut self) {
        self.ref_uni.clear();
        self.ref_bounds.clear();
    }

    /// Adds a reference as unigram ids (`0..=vocab`).
    fn push_ref(&mut self, ids: impl IntoIterator<Item = u32>) {
        let offset = self.ref_uni.len();
        self.ref_uni.extend(ids);
        self.ref_bounds.push((offset, self.ref_uni.len() - offset));
    }

    /// Adds the clipped matches of `hyp_uni` (ids `1..=vocab`) against the references pushed
    /// since [`IdMatcher::clear_refs`] to `matches[n-1]`, orders `1..=max_order`
    /// (`matches.len() >= max_order`).
    fn matches(&mut self, hyp_uni: &[u32], vocab: usize, max_order: usize, matches: &mut [u64]) {
        if max_order == 0 || hyp_uni.is_empty() {
            return;
        }
        self.hyp_count.clear();
        self.hyp_count.resize(vocab + 1, 0);
        for &id in hyp_uni {
            self.hyp_count[id as usize] += 1;
        }
        matches[0] += clipped_sum(
            &self.ref_uni,
            &self.ref_bounds,
            &self.hyp_count,
            &mut self.limit,
            &mut self.count,
        );
        if matches[0] == 0 {
            return;
        }
        self.hyp_prev.clear();
        self.hyp_prev.extend_from_slice(hyp_uni);
        self.ref_prev.clear();
        self.ref_prev.extend_from_slice(&self.ref_uni);
        // Distinct ids of the previous order (the unigrams: at most `vocab`).
        let mut distinct = vocab;
        for order in 2..=max_order.min(hyp_uni.len()) {
            let rows = distinct + 1;
            let cols = vocab + 1;
            let added = if rows * cols <= DIRECT_MAX_ENTRIES {
                let mut table = std::mem::take(&mut self.direct);
                let added = self.order_pass(&mut table, hyp_uni, order, rows, cols);
                self.direct = table;
                added
            } else {
                let mut table = std::mem::take(&mut self.hashed);
                let added = self.order_pass(&mut table, hyp_uni, order, rows, cols);
                self.hashed = table;
                added
            };
            let (m, order_matches) = added;
            matches[order - 1] += order_matches;
            if order_matches == 0 {
                break;
            }
            distinct = m;
            std::mem::swap(&mut self.hyp_prev, &mut self.hyp_cur);
            std::mem::swap(&mut self.ref_prev, &mut self.ref_cur);
        }
    }

    /// One order `n >= 2`: ids of the hypothesis n-grams (from `hyp_prev`), reference n-grams
    /// looked up (from `ref_prev`), and the clipped sum. Returns `(m_n, matches)`.
    fn order_pass<Tb: NgramTable>(
        &mut self,
        table: &mut Tb,
        hyp_uni: &[u32],
        order: usize,
        rows: usize,
        cols: usize,
    ) -> (usize, u64) {
        let starts = hyp_uni.len() + 1 - order;
        table.begin(rows, cols, starts);
        let mut next = 1u32;
        self.hyp_cur.clear();
        self.hyp_cur.resize(starts, 0);
        // Iterators rather than indices: no bounds check or capacity test in the hot loops.
        for ((id, &prefix), &last) in self
            .hyp_cur
            .iter_mut()
            .zip(&self.hyp_prev[..starts])
            .zip(&hyp_uni[order - 1..])
        {
            *id = table.get_or_insert(prefix, last, &mut next);
        }
        let m = (next - 1) as usize;
        self.hyp_count.clear();
        self.hyp_count.resize(m + 1, 0);
        for &id in &self.hyp_cur {
            self.hyp_count[id as usize] += 1;
        }
        self.ref_cur.clear();
        self.ref_cur.resize(self.ref_uni.len(), 0);
        for &(offset, len) in &self.ref_bounds {
            let ref_starts = (len + 1).saturating_sub(order);
            if ref_starts == 0 {
                continue;
            }
            let (cur, prev) = (
                &mut self.ref_cur[offset..offset + ref_starts],
                &self.ref_prev[offset..offset + ref_starts],
            );
            let lasts = &self.ref_uni[offset + order - 1..offset + len];
            for ((id, &prefix), &last) in cur.iter_mut().zip(prev).zip(lasts) {
                *id = table.get(prefix, last);
            }
        }
        let sum = clipped_sum(
            &self.ref_cur,
            &self.ref_bounds,
            &self.hyp_count,
            &mut self.limit,
            &mut self.count,
        );
        (m, sum)
    }
}

/// `Σ_{g >= 1} min(hyp_count[g], max_r count of g in reference r)`, the references' ids being
/// `ref_ids` split by `bounds` (ids below `hyp_count.len()`; id 0 is ignored).
fn clipped_sum(
    ref_ids: &[u32],
    bounds: &[(usize, usize)],
    hyp_count: &[u32],
    limit: &mut Vec<u32>,
    count: &mut Vec<u32>,
) -> u64 {
    let ids = hyp_count.len();
    limit.clear();
    limit.resize(ids, 0);
    if bounds.len() == 1 {
        for &id in ref_ids {
            limit[id as usize] += 1;
        }
    } else {
        count.clear();
        count.resize(ids, 0);
        for &(offset, len) in bounds {
            for &id in &ref_ids[offset..offset + len] {
                count[id as usize] += 1;
            }
            for (l, c) in limit.iter_mut().zip(count.iter_mut()) {
                *l = (*l).max(*c);
                *c = 0;
            }
        }
    }
    hyp_count
        .iter()
        .zip(limit.iter())
        .skip(1)
        .map(|(&h, &l)| u64::from(h.min(l)))
        .sum()
}

/// Clipped matches of one segment, computed without hashing any n-gram longer than one token:
/// `Σ_g min(count_hyp(g), max_r count_{ρ^r}(g))` per order, the numbers a map of n-gram
/// counts per sequence gives (a test checks it against one), several times faster.
///
/// Every hypothesis token gets a dense id from a map of tokens (each token hashed once); the
/// reference tokens are looked up in it; the n-grams of each order are then numbered from
/// their `(n-1)`-gram prefix's id and their last token's id.
///
/// The maps are cleared, never reallocated, between segments. They borrow the tokens, so every
/// segment given to one matcher must outlive it.
pub(crate) struct ClippedMatcher<'a, T> {
    /// Hypothesis token -> unigram id (ids start at 1; 0 means "not in the hypothesis").
    unigram_ids: TokenTable<'a, T>,
    /// Per position of the hypothesis: the unigram id of its token.
    hyp_token_ids: Vec<u32>,
    core: IdMatcher,
}

impl<T> Default for ClippedMatcher<'_, T> {
    fn default() -> Self {
        Self {
            unigram_ids: TokenTable::default(),
            hyp_token_ids: Vec::new(),
            core: IdMatcher::default(),
        }
    }
}

impl<'a, T: Hash + Eq> ClippedMatcher<'a, T> {
    /// An empty matcher; its maps grow to the largest segment it is given.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds the clipped matches of `hyp` against `refs` to `matches[n-1]`, orders
    /// `1..=max_order`: `Σ_g min(count_hyp(g), max_r count_{refs[r]}(g))` per order. The
    /// caller sizes `matches` (`matches.len() >= max_order`, else it panics on the index).
    pub(crate) fn add_clipped_matches<R: AsRef<[T]>>(
        &mut self,
        hyp: &'a [T],
        refs: &'a [R],
        max_order: usize,
        matches: &mut [u64],
    ) {
        self.unigram_ids.reset(hyp.len());
        self.hyp_token_ids.clear();
        let mut vocab = 0u32;
        for token in hyp {
            let id = self.unigram_ids.get_or_insert(token, || {
                vocab += 1;
                vocab
            });
            self.hyp_token_ids.push(id);
        }
        self.core.clear_refs();
        for reference in refs {
            let table = &self.unigram_ids;
            self.core
                .push_ref(reference.as_ref().iter().map(|t| table.get(t)));
        }
        self.core
            .matches(&self.hyp_token_ids, vocab as usize, max_order, matches);
    }
}

/// Clipped matches of one segment whose tokens the caller has already interned into
/// segment-local ids: the hypothesis tokens are `1..=vocab` (equal ids for equal tokens), and
/// each reference token is the id of the equal hypothesis token, or 0 when the hypothesis has
/// no such token. This is [`ClippedMatcher`] without its token map, for callers that hash
/// their tokens once themselves (`exact`'s text counter interns each line's `&str` tokens
/// while it tokenizes them; chrF interns characters and words).
///
/// Its tables are cleared, never reallocated, between segments; it borrows nothing.
#[derive(Default)]
pub(crate) struct InternedMatcher {
    core: IdMatcher,
}

impl InternedMatcher {
    /// An empty matcher; its tables grow to the largest segment it is given.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds the clipped matches of `hyp` against `refs` to `matches[n-1]`, orders
    /// `1..=max_order` (the numbers [`ClippedMatcher::add_clipped_matches`] gives on the
    /// tokens the ids stand for). The caller makes the ids and sizes `matches`
    /// (`matches.len() >= max_order`, hypothesis ids in `1..=vocab`, reference ids in
    /// `0..=vocab`; else it panics on an index).
    pub(crate) fn add_clipped_matches<R: AsRef<[u32]>>(
        &mut self,
        hyp: &[u32],
        refs: &[R],
        vocab: u32,
        max_order: usize,
        matches: &mut [u64],
    ) {
        self.core.clear_refs();
        for reference in refs {
            self.core.push_ref(reference.as_ref().iter().copied());
        }
        self.core.matches(hyp, vocab as usize, max_order, matches);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts of n-grams, keyed by the slice they cover. Orders share one map: the order of a
    /// key is `key.len()`.
    type NgramCounts<'a, T> = FxHashMap<&'a [T], u32>;

    /// Adds the counts of every n-gram of order `1..=max_order` in `tokens` to `counts`.
    fn count_ngrams_into<'a, T: Hash + Eq>(
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
    fn count_ngrams<T: Hash + Eq>(tokens: &[T], max_order: usize) -> NgramCounts<'_, T> {
        let mut counts = NgramCounts::default();
        count_ngrams_into(tokens, max_order, &mut counts);
        counts
    }

    /// Raises `max_counts` to the counts of `reference` wherever they are larger: after one
    /// call per reference, `max_counts[g] = max_r count_{ρ^r}(g)`, the clipping limit of BLEU.
    ///
    /// `scratch` holds the counts of this one reference; it is cleared and reused so that a
    /// caller scoring many segments allocates once.
    fn merge_max_counts<'a, T: Hash + Eq>(
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

    /// Clipped matches per order from the maps (the reference the matchers are tested against).
    fn add_clipped_matches<T: Hash + Eq>(
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

    /// The example of the old public documentation of `reference_ngram_masks`.
    #[test]
    fn reference_masks_of_two_references() {
        let (a, b) = ([5u32, 6, 5, 6], [5u32, 6]);
        let masks = reference_ngram_masks(&[&a[..], &b[..]], 2);
        // Bigrams start at positions 0, 1, 2 (reference a) and 4 (reference b).
        assert_eq!(masks.inside, [true, true, true, false, true, false]);
        // (5, 6) first occurs at 0, (6, 5) at 1; the (5, 6) at 2 and 4 are repeats.
        assert_eq!(masks.first, [true, true, false, false, false, false]);
        // (5, 6) occurs twice in a, once in b: it may be matched twice.
        assert_eq!(masks.clip, [2, 1, 0, 0, 0, 0]);
    }

    /// Order 0 has no n-gram: all-false masks, no panic (was in tests/exact_errors.rs).
    #[test]
    fn reference_masks_of_order_zero_are_empty() {
        let masks = reference_ngram_masks(&[&[1u32, 2][..], &[3u32][..]], 0);
        assert_eq!(masks.inside, [false; 3]);
        assert_eq!(masks.first, [false; 3]);
        assert_eq!(masks.clip, [0; 3]);
    }

    /// The example of the old public documentation of `ClippedMatcher::add_clipped_matches`.
    #[test]
    fn clipped_matcher_example() {
        let hyp = [1u32, 1, 1, 2];
        let refs = [vec![1u32, 2], vec![1, 1, 3]];
        let mut matcher = ClippedMatcher::new();
        let mut matches = [0u64; 2];
        matcher.add_clipped_matches(&hyp, &refs, 2, &mut matches);
        // 1: min(3, max(1, 2)) = 2, 2: 1; (1, 1): 1, (1, 2): 1.
        assert_eq!(matches, [3, 2]);
    }

    /// [`Slots::rebuild`] keeps every entry findable, and `reset` forgets them.
    #[test]
    fn slots_rebuild_and_reset() {
        let mut slots = Slots::default();
        slots.reset(4, 16);
        let hashes: Vec<u64> = (0..7u64)
            .map(|k| k.wrapping_mul(0x1234_5678_9abc_def1))
            .collect();
        for (id, &h) in hashes.iter().enumerate() {
            match slots.probe(h, |_, _| true) {
                Probe::Vacant(slot) => slots.fill(slot, h, id as u32 + 1),
                Probe::Found(_) => panic!("a new key was found"),
            }
        }
        slots.rebuild(
            64,
            hashes.iter().enumerate().map(|(id, &h)| (h, id as u32 + 1)),
        );
        assert_eq!(slots.capacity(), 64);
        for (id, &h) in hashes.iter().enumerate() {
            assert!(matches!(slots.probe(h, |_, _| true), Probe::Found(x) if x == id as u32 + 1));
        }
        assert!(!slots.reset(4, 16), "no reallocation below the capacity");
        assert!(matches!(
            slots.probe(hashes[0], |_, _| true),
            Probe::Vacant(_)
        ));
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

    /// Long segments with many distinct tokens: the n-gram ids come from the hashed table
    /// (more than `DIRECT_MAX_ENTRIES` prefix × token pairs), and must agree with the map.
    #[test]
    fn long_segments_use_the_hashed_table_and_agree() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        let mut matcher = ClippedMatcher::new();
        let mut segments = Vec::new();
        for _ in 0..20 {
            let vocab = 150 + next(200);
            let hyp: Vec<u64> = (0..300 + next(300)).map(|_| next(vocab)).collect();
            let refs: Vec<Vec<u64>> = (0..1 + next(3))
                .map(|_| {
                    // Copies of hypothesis stretches, so that long n-grams match.
                    let mut r = Vec::new();
                    while r.len() < 400 {
                        let start = next(hyp.len() as u64 - 10) as usize;
                        r.extend_from_slice(&hyp[start..start + 1 + next(9) as usize]);
                        r.push(next(vocab));
                    }
                    r
                })
                .collect();
            segments.push((hyp, refs));
        }
        for (hyp, refs) in &segments {
            let distinct = hyp.iter().collect::<std::collections::HashSet<_>>().len();
            assert!((distinct + 1) * (distinct + 1) > DIRECT_MAX_ENTRIES);
            let mut max_counts = NgramCounts::default();
            let mut scratch = NgramCounts::default();
            for r in refs {
                merge_max_counts(r, 6, &mut scratch, &mut max_counts);
            }
            let mut want = vec![0u64; 6];
            add_clipped_matches(&count_ngrams(hyp, 6), &max_counts, &mut want);
            assert!(want[5] > 0, "the test must reach order 6: {want:?}");
            let mut got = vec![0u64; 6];
            matcher.add_clipped_matches(hyp, refs, 6, &mut got);
            assert_eq!(got, want);
        }
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
        let mut interned = InternedMatcher::new();
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
            // The same segment interned by hand: first-occurrence ids, 0 for other tokens.
            let mut local: Vec<u64> = Vec::new();
            let hyp_ids: Vec<u32> = hyp
                .iter()
                .map(|t| match local.iter().position(|x| x == t) {
                    Some(i) => i as u32 + 1,
                    None => {
                        local.push(*t);
                        local.len() as u32
                    }
                })
                .collect();
            let ref_ids: Vec<Vec<u32>> = refs
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|t| {
                            local
                                .iter()
                                .position(|x| x == t)
                                .map_or(0, |i| i as u32 + 1)
                        })
                        .collect()
                })
                .collect();
            let mut interned_got = vec![0u64; *max_order];
            interned.add_clipped_matches(
                &hyp_ids,
                &ref_ids,
                local.len() as u32,
                *max_order,
                &mut interned_got,
            );
            assert_eq!(interned_got, want, "interned: hyp {hyp:?} refs {refs:?}");
        }
    }
}
