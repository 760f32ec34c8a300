//! Properties of `exact::chrf` on random text (proptest), and its errors.
//!
//! - the score is in [0, 100], and exactly 100 for a hypothesis equal to its reference (with
//!   at least one character that is not whitespace, under sacrebleu's default effective-order
//!   averaging);
//! - a sentence score does not depend on the order of the references, nor on a repeated
//!   reference (sacrebleu keeps the best one); a corpus score does not depend on the order of
//!   the segments (integer sums);
//! - the statistics are additive: the per-segment statistics sum to the corpus statistics, and
//!   scoring the sum is `corpus_chrf`, on the parallel path too;
//! - without `whitespace`, how words are spaced does not matter; `lowercase` on ASCII text is
//!   the default on lowercased text;
//! - bad input is an error naming the argument.

use candle_bleu::exact::bootstrap::{bootstrap_confidence, BootstrapConfig};
use candle_bleu::exact::chrf::{
    corpus_chrf, corpus_chrf_stats, score_chrf_stats, sentence_chrf, ChrfConfig, ChrfCounts,
};
use candle_bleu::exact::{MetricError, MAX_ORDER};
use proptest::prelude::*;

/// Text from a small alphabet, so that n-grams repeat and match: letters, spaces, ASCII
/// punctuation, accented and CJK characters, a tab and U+3000.
fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a", "b", "c", "ab", " ", " ", "  ", ",", ".", "(", ")", "é", "中", "\t", "\u{3000}",
        ]),
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

fn config() -> impl Strategy<Value = ChrfConfig> {
    (
        0usize..=7,
        0usize..=3,
        prop::sample::select(vec![0.5, 1.0, 2.0, 3.0]),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_filter("at least one order", |(c, w, ..)| c + w > 0)
        .prop_map(
            |(char_order, word_order, beta, lowercase, whitespace, eps_smoothing)| ChrfConfig {
                char_order,
                word_order,
                beta,
                lowercase,
                whitespace,
                eps_smoothing,
            },
        )
}

fn segment() -> impl Strategy<Value = (String, Vec<String>)> {
    (text(), prop::collection::vec(text(), 1..4))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn score_is_a_percentage((hyp, refs) in segment(), cfg in config()) {
        let s = sentence_chrf(&hyp, &refs, cfg).unwrap().score;
        prop_assert!((0.0..=100.0 + 1e-9).contains(&s), "{s}");
    }

    #[test]
    fn identical_text_scores_100(hyp in text(), word_order in 0usize..=2, beta in 1u32..=3) {
        prop_assume!(hyp.chars().any(|c| !c.is_whitespace() && c != '\u{3000}'));
        let cfg = ChrfConfig { word_order, beta: f64::from(beta), ..ChrfConfig::default() };
        prop_assert_eq!(sentence_chrf(&hyp, std::slice::from_ref(&hyp), cfg).unwrap().score, 100.0);
        let corpus = corpus_chrf(&[hyp.clone(), hyp.clone()], &[vec![hyp.clone()], vec![hyp]], cfg);
        prop_assert_eq!(corpus.unwrap().score, 100.0);
    }

    #[test]
    fn sentence_score_ignores_reference_order_and_repeats(
        (hyp, refs) in segment(),
        cfg in config(),
        rotate in 0usize..3,
    ) {
        let want = sentence_chrf(&hyp, &refs, cfg).unwrap().score;
        let mut rotated = refs.clone();
        let k = rotate % rotated.len();
        rotated.rotate_left(k);
        prop_assert_eq!(sentence_chrf(&hyp, &rotated, cfg).unwrap().score, want);
        let mut repeated = refs.clone();
        repeated.extend(refs.iter().cloned());
        prop_assert_eq!(sentence_chrf(&hyp, &repeated, cfg).unwrap().score, want);
    }

    #[test]
    fn statistics_are_additive_and_segment_order_free(
        corpus in prop::collection::vec(segment(), 1..8),
        cfg in config(),
    ) {
        let (hyps, refs): (Vec<String>, Vec<Vec<String>>) = corpus.into_iter().unzip();
        let whole = corpus_chrf(&hyps, &refs, cfg).unwrap();
        let segments = corpus_chrf_stats(&hyps, &refs, cfg).unwrap();
        let sum: ChrfCounts = segments.iter().sum();
        prop_assert_eq!(&sum, &whole.counts);
        prop_assert_eq!(score_chrf_stats(&sum, cfg).unwrap().score, whole.score);
        // Each segment's statistics are its sentence's.
        for ((h, r), s) in hyps.iter().zip(&refs).zip(&segments) {
            prop_assert_eq!(&sentence_chrf(h, r, cfg).unwrap().counts, s);
        }
        let (mut rh, mut rr) = (hyps.clone(), refs.clone());
        rh.reverse();
        rr.reverse();
        prop_assert_eq!(corpus_chrf(&rh, &rr, cfg).unwrap().score, whole.score);
    }

    #[test]
    fn spacing_does_not_matter_without_whitespace((hyp, refs) in segment(), word_order in 0usize..=2) {
        let cfg = ChrfConfig { word_order, ..ChrfConfig::default() };
        let spaced: String = hyp.split(' ').collect::<Vec<_>>().join("   ");
        prop_assert_eq!(
            sentence_chrf(&spaced, &refs, cfg).unwrap().counts,
            sentence_chrf(&hyp, &refs, cfg).unwrap().counts
        );
    }

    #[test]
    fn lowercase_is_lowercasing_ascii(
        hyp in "[a-cA-C ,.]{0,20}",
        reference in "[a-cA-C ,.]{0,20}",
        word_order in 0usize..=2,
    ) {
        let lc = ChrfConfig { lowercase: true, word_order, ..ChrfConfig::default() };
        let plain = ChrfConfig { word_order, ..ChrfConfig::default() };
        prop_assert_eq!(
            sentence_chrf(&hyp, std::slice::from_ref(&reference), lc).unwrap(),
            sentence_chrf(&hyp.to_lowercase(), &[reference.to_lowercase()], plain).unwrap()
        );
    }
}

/// A corpus large enough for the parallel path (128+ segments) gives the per-segment
/// statistics one at a time would, and the bootstrap accepts them.
#[test]
fn parallel_corpus_equals_segment_by_segment() {
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "(hi)", "dog.", "中文", "é",
    ];
    let line = |i: usize, salt: usize| -> String {
        (0..3 + (i * 7 + salt) % 11)
            .map(|k| words[(i * 3 + k * (salt + 1)) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let hyps: Vec<String> = (0..700).map(|i| line(i, 1)).collect();
    let refs: Vec<Vec<String>> = (0..700)
        .map(|i| (0..1 + i % 3).map(|r| line(i, 2 + r)).collect())
        .collect();
    for cfg in [ChrfConfig::default(), ChrfConfig::chrf_plus_plus()] {
        let segments = corpus_chrf_stats(&hyps, &refs, cfg).unwrap();
        for (i, s) in segments.iter().enumerate() {
            assert_eq!(s, &sentence_chrf(&hyps[i], &refs[i], cfg).unwrap().counts);
        }
        let whole = corpus_chrf(&hyps, &refs, cfg).unwrap();
        assert_eq!(whole.counts, segments.iter().sum::<ChrfCounts>());
        assert!(whole.score > 0.0 && whole.score < 100.0);
        let ci = bootstrap_confidence(
            &segments,
            &cfg,
            &BootstrapConfig {
                n_samples: 50,
                seed: 12345,
            },
        )
        .unwrap();
        assert!(ci.lower <= ci.upper && ci.score == whole.score);
    }
}

fn argument<T: std::fmt::Debug>(result: Result<T, MetricError>) -> &'static str {
    match result {
        Err(MetricError::InvalidArgument { argument, message }) => {
            assert!(!message.is_empty());
            argument
        }
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn bad_input_is_an_error_naming_the_argument() {
    let cfg = ChrfConfig::default();
    let hyps = ["a b", "c"];
    let refs = [vec!["a b"], vec!["c"]];
    assert_eq!(argument(corpus_chrf(&hyps, &refs[..1], cfg)), "refs");
    assert_eq!(
        argument(corpus_chrf(&hyps, &[vec!["a"], vec![]], cfg)),
        "refs"
    );
    assert_eq!(argument(corpus_chrf_stats(&hyps, &refs[..1], cfg)), "refs");
    assert_eq!(argument(corpus_chrf::<&str>(&[], &[], cfg)), "hyps");
    assert_eq!(argument(sentence_chrf::<&str>("a", &[], cfg)), "refs");
    let no_orders = ChrfConfig {
        char_order: 0,
        word_order: 0,
        ..cfg
    };
    assert_eq!(
        argument(corpus_chrf(&hyps, &refs, no_orders)),
        "cfg.char_order"
    );
    assert_eq!(
        argument(sentence_chrf("a", &["a"], no_orders)),
        "cfg.char_order"
    );
    for beta in [0.0, -2.0, f64::NAN, f64::INFINITY, 1e200] {
        let bad = ChrfConfig { beta, ..cfg };
        assert_eq!(
            argument(corpus_chrf(&hyps, &refs, bad)),
            "cfg.beta",
            "{beta}"
        );
        assert_eq!(argument(sentence_chrf("a", &["a"], bad)), "cfg.beta");
        assert_eq!(
            argument(score_chrf_stats(&ChrfCounts::zeros(6), bad)),
            "cfg.beta"
        );
    }
    let huge = ChrfConfig {
        char_order: MAX_ORDER + 1,
        ..cfg
    };
    assert_eq!(argument(corpus_chrf(&hyps, &refs, huge)), "cfg.char_order");
    let huge = ChrfConfig {
        word_order: MAX_ORDER + 1,
        ..cfg
    };
    assert_eq!(argument(corpus_chrf(&hyps, &refs, huge)), "cfg.word_order");
    // Statistics of another configuration.
    assert_eq!(
        argument(score_chrf_stats(&ChrfCounts::zeros(8), cfg)),
        "counts"
    );
    // Matches above an order's hypothesis or reference n-grams: no text gives them (this
    // scored chrF 250 before it was refused), and the message names the order.
    for (hyp, reference) in [(2, 8), (8, 2)] {
        let mut impossible = ChrfCounts::zeros(cfg.char_order + cfg.word_order);
        impossible.hyp_ngrams[3] = hyp;
        impossible.ref_ngrams[3] = reference;
        impossible.matches[3] = 5;
        let error = score_chrf_stats(&impossible, cfg).unwrap_err();
        assert!(error.to_string().contains("order 4"), "{error}");
        assert_eq!(argument(score_chrf_stats(&impossible, cfg)), "counts");
    }
    let stats = corpus_chrf_stats(&hyps, &refs, cfg).unwrap();
    let ten = BootstrapConfig {
        n_samples: 10,
        seed: 1,
    };
    let zero = BootstrapConfig {
        n_samples: 0,
        ..ten
    };
    assert_eq!(
        argument(bootstrap_confidence(
            &stats,
            &ChrfConfig::chrf_plus_plus(),
            &ten
        )),
        "stats"
    );
    assert_eq!(
        argument(bootstrap_confidence(&stats, &cfg, &zero)),
        "bootstrap.n_samples"
    );
    assert_eq!(
        argument(bootstrap_confidence(&stats[..0], &cfg, &ten)),
        "stats"
    );
    // The message says what is wrong.
    let e = corpus_chrf(&hyps, &refs[..1], cfg).unwrap_err();
    assert!(
        e.to_string().contains("2 hypotheses, 1 reference lists"),
        "{e}"
    );
}

/// Empty text: sacrebleu's numbers (an empty hypothesis has no n-gram, so every order has
/// precision ε and no order qualifies: 0; an empty reference zeroes the hypothesis counts).
#[test]
fn empty_text() {
    let cfg = ChrfConfig::default();
    let empty_hyp = sentence_chrf("", &["abc"], cfg).unwrap();
    assert_eq!(empty_hyp.score, 0.0);
    assert_eq!(empty_hyp.counts.ref_ngrams, [3, 2, 1, 0, 0, 0]);
    let empty_ref = sentence_chrf("abc", &[""], cfg).unwrap();
    assert_eq!(empty_ref.score, 0.0);
    assert_eq!(empty_ref.counts, ChrfCounts::zeros(6));
    // ε smoothing, every order with hyp = ref = 0: each adds (1+β²)·ε·ε/(β²·ε + ε), summed in
    // order, times 100 over 6 orders; sacrebleu's CHRF(eps_smoothing=True).sentence_score('',
    // ['']) is 1.0000000000000002e-14.
    let eps = ChrfConfig {
        eps_smoothing: true,
        ..cfg
    };
    assert_eq!(
        sentence_chrf("", &[""], eps).unwrap().score,
        1.0000000000000002e-14
    );
}
