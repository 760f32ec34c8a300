//! Properties of `exact::ter` on random text (proptest).
//!
//! - TER is 0 for a hypothesis equal to one of its references (every option), and a sentence
//!   score does not depend on a repeated reference;
//! - the statistics are additive: each segment's `corpus_ter_stats` are its `sentence_ter`
//!   statistics, they sum (in order) to `corpus_ter`'s, on the parallel path too;
//! - the beam edit distance equals an independent brute-force Levenshtein distance on short
//!   sequences, and TER's edits lie between the length difference and that distance (a shift
//!   is only made when it saves at least one edit);
//! - without `case_sensitive`, ASCII case does not matter; how words are spaced never does.

use candle_bleu::exact::ter::{
    corpus_ter, corpus_ter_stats, edit_distance, score_ter_stats, sentence_ter,
    translation_edit_rate, TerConfig, TerStats,
};
use proptest::prelude::*;

/// Words from a small vocabulary, so that words repeat, match and shift: letters, ASCII
/// punctuation, CJK with Asian punctuation, an XML entity, a possessive.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a",
            "b",
            "c",
            "The",
            "cat",
            "sat.",
            "(x)",
            "1,5",
            "2-3",
            "中文",
            "我们。",
            "，",
            "&amp;",
            "Bob's",
            "i.e.",
            "?",
        ]),
        0..16,
    )
    .prop_map(|words| words.join(" "))
}

fn config() -> impl Strategy<Value = TerConfig> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
        |(normalized, no_punct, asian_support, case_sensitive)| TerConfig {
            normalized,
            no_punct,
            asian_support,
            case_sensitive,
        },
    )
}

/// Levenshtein distance by exhaustive recursion (no table): the fewest insertions, deletions
/// and substitutions turning `h` into `r`.
fn brute_levenshtein(h: &[u8], r: &[u8]) -> u64 {
    match (h.split_first(), r.split_first()) {
        (None, _) => r.len() as u64,
        (_, None) => h.len() as u64,
        (Some((x, hs)), Some((y, rs))) => {
            let sub = brute_levenshtein(hs, rs) + u64::from(x != y);
            let del = brute_levenshtein(hs, r) + 1;
            let ins = brute_levenshtein(h, rs) + 1;
            sub.min(del).min(ins)
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn equal_to_a_reference_scores_zero(hyp in text(), other in text(), cfg in config()) {
        let ter = sentence_ter(&hyp, &[hyp.as_str()], cfg).unwrap();
        prop_assert_eq!((ter.score, ter.edits), (0.0, 0.0));
        // With another reference, the equal one is the best (mean length over both).
        let ter = sentence_ter(&hyp, &[other.as_str(), hyp.as_str()], cfg).unwrap();
        prop_assert_eq!(ter.edits, 0.0);
        prop_assert_eq!(ter.score, 0.0);
    }

    #[test]
    fn a_repeated_reference_changes_nothing(hyp in text(), r in text(), cfg in config()) {
        let one = sentence_ter(&hyp, &[r.as_str()], cfg).unwrap();
        let two = sentence_ter(&hyp, &[r.as_str(), r.as_str()], cfg).unwrap();
        prop_assert_eq!(one, two);
    }

    #[test]
    fn statistics_are_additive(
        segments in prop::collection::vec((text(), prop::collection::vec(text(), 1..4)), 1..40),
        cfg in config(),
    ) {
        let hyps: Vec<&str> = segments.iter().map(|(h, _)| h.as_str()).collect();
        let refs: Vec<Vec<&str>> = segments
            .iter()
            .map(|(_, r)| r.iter().map(String::as_str).collect())
            .collect();
        let stats = corpus_ter_stats(&hyps, &refs, cfg).unwrap();
        for (i, s) in stats.iter().enumerate() {
            let one = sentence_ter(hyps[i], &refs[i], cfg).unwrap();
            prop_assert_eq!(*s, TerStats { edits: one.edits, ref_len: one.ref_len });
        }
        let sum: TerStats = stats.iter().sum();
        let corpus = corpus_ter(&hyps, &refs, cfg).unwrap();
        prop_assert_eq!(score_ter_stats(&sum).unwrap(), corpus);
        prop_assert!(corpus.score >= 0.0);
    }

    #[test]
    fn beam_edit_distance_is_levenshtein_on_short_sequences(
        h in prop::collection::vec(0u8..3, 0..8),
        r in prop::collection::vec(0u8..3, 0..8),
    ) {
        let brute = brute_levenshtein(&h, &r);
        prop_assert_eq!(edit_distance(&h, &r), brute);
        let (edits, len) = translation_edit_rate(&h, &r);
        prop_assert_eq!(len, r.len() as u64);
        prop_assert!(edits <= brute, "TER {} above the edit distance {}", edits, brute);
        prop_assert!(edits >= h.len().abs_diff(r.len()) as u64);
    }

    #[test]
    fn case_and_spacing(words in prop::collection::vec("[a-c]{1,3}", 0..10), r in text()) {
        let cfg = TerConfig::default();
        let spaced = words.join(" \t\u{3000} ");
        let plain = words.join(" ");
        let upper = plain.to_ascii_uppercase();
        let base = sentence_ter(&plain, &[r.as_str()], cfg).unwrap();
        prop_assert_eq!(sentence_ter(&spaced, &[r.as_str()], cfg).unwrap(), base);
        prop_assert_eq!(sentence_ter(&upper, &[r.as_str()], cfg).unwrap(), base);
    }
}

#[test]
fn shifts_beat_the_edit_distance() {
    // A block of three moved: the edit distance needs six edits, TER one shift.
    let h = ["d", "e", "f", "a", "b", "c"];
    let r = ["a", "b", "c", "d", "e", "f"];
    assert_eq!(edit_distance(&h, &r), 6);
    assert_eq!(translation_edit_rate(&h, &r), (1, 6));
}
