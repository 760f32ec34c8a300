//! Bad input to the public functions of `exact` and `ngram` gives an error naming the argument,
//! never a panic (issue 10): huge n-gram orders (NLTK's method 4 overflowed `2i64.pow`), the
//! bootstrap on zero segments, buffers too short for the orders asked, ids out of range,
//! hand-made statistics that no corpus produces. Where NLTK itself returns a number, so do we
//! (the values below are NLTK 3.10.4's `corpus_bleu`).

use candle_bleu::exact::bootstrap::{
    bootstrap_confidence, paired_approximate_randomization, paired_bootstrap,
    paired_bootstrap_many, resample_scores, BootstrapConfig,
};
use candle_bleu::exact::{
    corpus_bleu, corpus_stats, nltk_corpus_stats, score_nltk_stats, segment_stats, sentence_bleu,
    BleuConfig, BleuCounts, MetricError, NltkStats, TextStatsConfig, TextStatsCounter, MAX_ORDER,
};

/// The argument an error names (and checks that its message says something).
fn argument<T: std::fmt::Debug>(result: Result<T, MetricError>) -> &'static str {
    match result {
        Err(MetricError::InvalidArgument { argument, message }) => {
            assert!(!message.is_empty());
            argument
        }
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// Text counting of orders `1..=max_order`, sacrebleu's tokenizer.
fn text(max_order: usize) -> TextStatsConfig {
    TextStatsConfig {
        max_order,
        ..TextStatsConfig::default()
    }
}

fn nltk(method: u8, max_order: usize) -> BleuConfig {
    BleuConfig {
        max_order,
        ..BleuConfig::nltk(method)
    }
}

#[test]
fn nltk_with_many_orders_follows_nltk_and_fails_where_nltk_overflows() {
    // NLTK computes `2**k * 5` with Python ints: 100 orders are fine there, and here.
    let hyp = vec![1u32, 2, 3, 4, 5, 6];
    let refs = vec![vec![1u32, 2, 3, 4, 9, 6]];
    for (method, want) in [
        (3, 9.337729511821603e-15),
        (4, 3.4864111779132952e-15),
        (7, 5.129376912834854e-15),
    ] {
        let got = sentence_bleu(&hyp, &refs, &nltk(method, 100)).unwrap().bleu;
        assert_eq!(got, want, "method{method}");
    }
    // Only the unigrams match: method 4's 1022nd zero order is the first whose `2**k * 5`
    // exceeds a float, and NLTK raises OverflowError from there on.
    let hyp = vec![1u32, 3, 5, 7];
    let refs = vec![vec![1u32, 2, 5, 6]];
    let bleu = sentence_bleu(&hyp, &refs, &nltk(4, 1022)).unwrap().bleu;
    assert_eq!(bleu, 5.842003831061346e-155);
    for method in [4, 7] {
        assert_eq!(
            argument(sentence_bleu(&hyp, &refs, &nltk(method, 1023))),
            "cfg.max_order"
        );
        assert_eq!(
            argument(corpus_bleu(
                std::slice::from_ref(&hyp),
                std::slice::from_ref(&refs),
                &nltk(method, MAX_ORDER)
            )),
            "cfg.max_order"
        );
    }
    // Past MAX_ORDER every entry point refuses before allocating anything.
    let (hyps, corpus_refs) = (std::slice::from_ref(&hyp), std::slice::from_ref(&refs));
    for max_order in [MAX_ORDER + 1, 1 << 40, usize::MAX] {
        for cfg in [
            nltk(4, max_order),
            nltk(0, max_order),
            BleuConfig {
                max_order,
                ..BleuConfig::default()
            },
        ] {
            assert_eq!(argument(sentence_bleu(&hyp, &refs, &cfg)), "cfg.max_order");
            assert_eq!(
                argument(corpus_bleu(hyps, corpus_refs, &cfg)),
                "cfg.max_order"
            );
        }
        assert_eq!(
            argument(corpus_stats(hyps, corpus_refs, max_order)),
            "max_order"
        );
        assert_eq!(
            argument(nltk_corpus_stats(hyps, corpus_refs, max_order)),
            "max_order"
        );
        assert_eq!(argument(segment_stats(&hyp, &refs, max_order)), "max_order");
        assert_eq!(
            argument(TextStatsCounter::new(text(max_order)).map(|_| ())),
            "cfg.max_order"
        );
    }
    assert_eq!(argument(segment_stats(&hyp, &refs, 0)), "max_order");
    assert_eq!(
        argument(TextStatsCounter::new(text(0)).map(|_| ())),
        "cfg.max_order"
    );
}

#[test]
fn hand_made_nltk_statistics_are_checked() {
    let cfg = nltk(5, 4);
    // No segment at all: NLTK divides by zero.
    assert_eq!(
        argument(score_nltk_stats(&NltkStats::new(4), &cfg)),
        "stats.denominators"
    );
    let mut stats = NltkStats::new(4);
    stats.push_segment(&segment_stats(&[1u32, 2, 3], &[vec![1u32, 2, 3]], 5).unwrap());
    assert!(score_nltk_stats(&stats, &cfg).is_ok());
    // A 5-gram precision with a zero denominator (NLTK's is max(1, t_5)).
    stats.last_fivegram = Some((1, 0));
    assert_eq!(
        argument(score_nltk_stats(&stats, &cfg)),
        "stats.last_fivegram"
    );
    stats.last_fivegram = None;
    assert_eq!(
        argument(score_nltk_stats(&stats, &cfg)),
        "stats.last_fivegram"
    );
    // Counts at the top of u64: method 2's `(m + 1) / (d + 1)` and method 6's `l + α` are
    // Python ints, not u64 sums that wrap.
    let huge = NltkStats {
        numerators: vec![u64::MAX; 4],
        denominators: vec![u64::MAX; 4],
        hyp_len: u64::MAX,
        ref_len: u64::MAX,
        last_hyp_len: u64::MAX,
        last_fivegram: Some((u64::MAX, u64::MAX)),
    };
    for method in 0..=7 {
        let score = score_nltk_stats(&huge, &nltk(method, 4)).unwrap();
        assert!(score.bleu.is_finite(), "method{method}: {score:?}");
    }
    let wrong_orders = NltkStats {
        denominators: vec![1; 3],
        ..huge.clone()
    };
    assert_eq!(argument(score_nltk_stats(&wrong_orders, &cfg)), "stats");
}

#[test]
fn bootstrap_on_zero_segments_is_an_error() {
    let cfg = BleuConfig::default();
    let ten = BootstrapConfig {
        n_samples: 10,
        seed: 1,
    };
    let zero = BootstrapConfig {
        n_samples: 0,
        ..ten
    };
    let none: [BleuCounts; 0] = [];
    assert_eq!(argument(bootstrap_confidence(&none, &cfg, &ten)), "stats");
    assert_eq!(argument(resample_scores(&none, &cfg, &ten)), "stats");
    assert_eq!(
        argument(paired_bootstrap(&none, &none, &cfg, &ten)),
        "stats"
    );
    assert_eq!(
        argument(paired_bootstrap_many(&none, &[], &cfg, &ten)),
        "stats"
    );
    assert_eq!(
        argument(paired_approximate_randomization(&none, &none, &cfg, &ten)),
        "stats"
    );
    // Zero resamples, and counts whose resample sums would overflow.
    let one = [segment_stats(&[1u32, 2], &[vec![1u32, 2]], 4).unwrap()];
    assert_eq!(
        argument(bootstrap_confidence(&one, &cfg, &zero)),
        "bootstrap.n_samples"
    );
    let huge = [BleuCounts {
        matches: vec![u64::MAX; 4],
        totals: vec![u64::MAX; 4],
        hyp_len: u64::MAX,
        ref_len: 1,
    }];
    assert_eq!(argument(bootstrap_confidence(&huge, &cfg, &ten)), "stats");
    assert_eq!(
        argument(paired_approximate_randomization(&huge, &huge, &cfg, &ten)),
        "stats"
    );
}

#[test]
fn summing_statistics_saturates_instead_of_overflowing() {
    let big = BleuCounts {
        matches: vec![u64::MAX, 1],
        totals: vec![u64::MAX, 2],
        hyp_len: u64::MAX,
        ref_len: 3,
    };
    let sum: BleuCounts = [big.clone(), big.clone()].iter().sum();
    assert_eq!(sum.matches, [u64::MAX, 2]);
    assert_eq!(sum.totals, [u64::MAX, 4]);
    assert_eq!((sum.hyp_len, sum.ref_len), (u64::MAX, 6));
}
