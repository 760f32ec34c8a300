//! The one n-gram counter of the crate.
//!
//! Both the exact BLEU ([`crate::exact`]) and the reference side of the differentiable
//! loss ([`crate::loss`]) count n-grams here, so the two can never disagree about what an
//! n-gram match is. N-grams are keyed by the slice of the token sequence they cover: each
//! n-gram is hashed once, with no allocation per token, and n-grams of different orders
//! never collide (slices of different lengths are different keys), so one map holds every
//! order of a sequence.

use rustc_hash::FxHashMap;
use std::hash::Hash;

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
}
