//! `candle_bleu::exact` beyond the golden vectors: argument validation (each error names its
//! argument), no panics, the statistics API (sums, per-segment stats, the parallel path, NLTK
//! statistics), the weights extension, and small examples computed by hand.

use candle_bleu::exact::{
    corpus_bleu, corpus_stats, nltk_corpus_stats, score_from_stats, score_nltk_stats,
    segment_stats, sentence_bleu, BleuConfig, BleuCounts, MetricError, SmoothMethod,
};

fn argument(result: Result<impl std::fmt::Debug, MetricError>) -> &'static str {
    match result {
        Err(MetricError::InvalidArgument { argument, message }) => {
            assert!(!message.is_empty());
            argument
        }
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

/// Hypotheses and their references (`[segment][reference]`), as `corpus_bleu` takes them.
type Corpus = (Vec<Vec<u32>>, Vec<Vec<Vec<u32>>>);

fn ids(s: &str) -> Vec<u32> {
    s.split_whitespace().map(|t| t.parse().unwrap()).collect()
}

#[test]
fn invalid_arguments_are_named() {
    let hyps = vec![ids("1 2 3 4")];
    let refs = vec![vec![ids("1 2 3 4")]];
    let cfg = BleuConfig::default();
    assert_eq!(argument(corpus_bleu(&hyps, &[], &cfg)), "refs");
    assert_eq!(argument(corpus_bleu(&hyps, &[vec![]], &cfg)), "refs");
    assert_eq!(argument(corpus_bleu::<u32>(&[], &[], &cfg)), "hyps");
    assert_eq!(
        argument(corpus_bleu::<u32>(&[], &[], &BleuConfig::nltk(0))),
        "hyps"
    );
    assert_eq!(argument(sentence_bleu(&hyps[0], &[], &cfg)), "refs");
    let bad = |cfg: BleuConfig| argument(corpus_bleu(&hyps, &refs, &cfg));
    assert_eq!(
        bad(BleuConfig {
            max_order: 0,
            ..cfg.clone()
        }),
        "cfg.max_order"
    );
    assert_eq!(
        bad(BleuConfig {
            weights: Some(vec![0.5; 3]),
            ..cfg.clone()
        }),
        "cfg.weights"
    );
    assert_eq!(
        bad(BleuConfig {
            weights: Some(vec![0.5, -0.1, 0.3, 0.3]),
            ..cfg.clone()
        }),
        "cfg.weights"
    );
    assert_eq!(
        bad(BleuConfig {
            weights: Some(vec![0.25, f64::NAN, 0.25, 0.25]),
            ..cfg.clone()
        }),
        "cfg.weights"
    );
    assert_eq!(bad(BleuConfig::nltk(8)), "cfg.smoothing");
    assert_eq!(
        bad(BleuConfig {
            smoothing: SmoothMethod::Floor(-0.1),
            ..cfg.clone()
        }),
        "cfg.smoothing"
    );
    assert_eq!(
        bad(BleuConfig {
            smoothing: SmoothMethod::AddK(f64::NAN),
            ..cfg.clone()
        }),
        "cfg.smoothing"
    );
    // NLTK method6: needs order >= 3 and a trigram match, as NLTK raises otherwise.
    assert_eq!(
        bad(BleuConfig {
            max_order: 2,
            ..BleuConfig::nltk(6)
        }),
        "cfg.max_order"
    );
    let no_trigram = sentence_bleu(&ids("1 2 9 3 4"), &[ids("1 2 3 4 5")], &BleuConfig::nltk(6));
    assert_eq!(argument(no_trigram), "cfg.smoothing");
    // ... but NLTK returns 0 before smoothing when nothing matches, and so do we.
    let nothing = sentence_bleu(
        &ids("7 8"),
        &[ids("1 2")],
        &BleuConfig {
            max_order: 2,
            ..BleuConfig::nltk(6)
        },
    );
    assert_eq!(nothing.unwrap().bleu, 0.0);
    // Statistics of the wrong order, and the wrong semantics for a stats scorer.
    let stats = segment_stats(&hyps[0], &refs[0], 3).unwrap();
    assert_eq!(argument(score_from_stats(&stats, &cfg)), "stats");
    let stats4 = segment_stats(&hyps[0], &refs[0], 4).unwrap();
    assert_eq!(
        argument(score_from_stats(&stats4, &BleuConfig::nltk(1))),
        "cfg.smoothing"
    );
    let nltk_stats = nltk_corpus_stats(&hyps, &refs, 4).unwrap();
    assert_eq!(
        argument(score_nltk_stats(&nltk_stats, &cfg)),
        "cfg.smoothing"
    );
    assert_eq!(argument(corpus_stats(&hyps, &refs, 0)), "max_order");
    // Display names the argument.
    let e = corpus_bleu(&hyps, &[], &cfg).unwrap_err();
    assert!(e.to_string().contains("`refs`"), "{e}");
}

#[test]
fn no_public_function_panics_on_odd_input() {
    let odd_configs = [
        BleuConfig {
            max_order: 0,
            ..BleuConfig::default()
        },
        BleuConfig {
            max_order: 9,
            ..BleuConfig::default()
        },
        BleuConfig {
            max_order: 1,
            smoothing: SmoothMethod::AddK(0.0),
            effective_order: true,
            weights: None,
        },
        BleuConfig {
            weights: Some(vec![0.0; 4]),
            ..BleuConfig::default()
        },
        BleuConfig {
            smoothing: SmoothMethod::Floor(f64::INFINITY),
            ..BleuConfig::default()
        },
        BleuConfig {
            max_order: 1,
            ..BleuConfig::nltk(5)
        },
        BleuConfig {
            max_order: 7,
            ..BleuConfig::nltk(7)
        },
        BleuConfig {
            max_order: 3,
            ..BleuConfig::nltk(6)
        },
        BleuConfig::nltk(200),
    ];
    let corpora: Vec<Corpus> = vec![
        (vec![], vec![]),
        (vec![vec![]], vec![vec![vec![]]]),
        (vec![vec![]], vec![vec![]]),
        (vec![vec![1]], vec![]),
        (
            vec![vec![1, 1, 1]],
            vec![vec![vec![1], vec![], vec![1, 1, 1, 1]]],
        ),
        (
            vec![vec![], vec![2, 3]],
            vec![vec![vec![2]], vec![vec![2, 3], vec![3]]],
        ),
    ];
    for cfg in &odd_configs {
        for (h, r) in &corpora {
            let outcome = std::panic::catch_unwind(|| {
                let _ = corpus_bleu(h, r, cfg);
                let _ = corpus_stats(h, r, cfg.max_order);
                if let (Some(h0), Some(r0)) = (h.first(), r.first()) {
                    let _ = sentence_bleu(h0, r0, cfg);
                    if let Ok(s) = segment_stats(h0, r0, cfg.max_order) {
                        let _ = score_from_stats(&s, cfg);
                    }
                }
                if let Ok(s) = nltk_corpus_stats(h, r, cfg.max_order) {
                    let _ = score_nltk_stats(&s, cfg);
                }
                let _ = score_from_stats(&BleuCounts::default(), cfg);
            });
            assert!(outcome.is_ok(), "panic for {cfg:?} on {h:?} / {r:?}");
        }
    }
}

/// A small corpus with repeats, 1-3 references per segment, empty hypothesis and reference.
fn corpus() -> Corpus {
    let hyps = vec![
        ids("1 2 3 4 5 6"),
        ids("7 7 7 7"),
        vec![],
        ids("1 2 1 2 1 2 9"),
        ids("5"),
    ];
    let refs = vec![
        vec![ids("1 2 3 4 5 6 7")],
        vec![ids("7 7 8"), ids("7 9 7 7"), vec![]],
        vec![ids("3 3")],
        vec![ids("1 2 1 9"), ids("2 1 2 1 2")],
        vec![ids("5 5"), ids("6")],
    ];
    (hyps, refs)
}

#[test]
fn statistics_by_hand() {
    let (hyps, refs) = corpus();
    let per_segment = corpus_stats(&hyps, &refs, 4).unwrap();
    // Segment 1: "7 7 7 7" vs {"7 7 8", "7 9 7 7", ""}: unigram 7 clipped to max(2, 3) = 3;
    // bigram "7 7" clipped to max(1, 1) = 1; length 4, closest reference 4.
    assert_eq!(
        per_segment[1],
        BleuCounts {
            matches: vec![3, 1, 0, 0],
            totals: vec![4, 3, 2, 1],
            hyp_len: 4,
            ref_len: 4
        }
    );
    // Segment 3: "1 2 1 2 1 2 9" (7) vs "1 2 1 9" (4), "2 1 2 1 2" (5): 1 -> min(3, 2),
    // 2 -> min(3, 3), 9 -> 1 = 6; "1 2" -> min(3, 2), "2 1" -> min(2, 2), "2 9" -> 0 = 4;
    // "1 2 1" -> min(2, 1), "2 1 2" -> min(2, 2) = 3; "1 2 1 2" -> 1, "2 1 2 1" -> 1 = 2.
    assert_eq!(
        per_segment[3],
        BleuCounts {
            matches: vec![6, 4, 3, 2],
            totals: vec![7, 6, 5, 4],
            hyp_len: 7,
            ref_len: 5
        }
    );
    // Segment 2: empty hypothesis, reference length 2.
    assert_eq!(
        per_segment[2],
        BleuCounts {
            matches: vec![0; 4],
            totals: vec![0; 4],
            hyp_len: 0,
            ref_len: 2
        }
    );
    // Segment 4: "5" vs "5 5" (2) and "6" (1): tie at distance 1 -> the shorter, 1.
    assert_eq!(per_segment[4].ref_len, 1);

    let sum: BleuCounts = per_segment.iter().sum();
    let owned_sum: BleuCounts = per_segment.clone().into_iter().sum();
    assert_eq!(sum, owned_sum);
    let mut acc = BleuCounts::default();
    for s in &per_segment {
        acc += s;
    }
    assert_eq!(acc, sum);
    assert_eq!(sum.to_sacrebleu_vec()[..2], [sum.hyp_len, sum.ref_len]);

    // One segment at a time gives the same per-segment statistics.
    for ((h, r), want) in hyps.iter().zip(&refs).zip(&per_segment) {
        assert_eq!(&segment_stats(h, r, 4).unwrap(), want);
    }

    // A corpus large enough for the parallel paths (the corpus 300 times): the same
    // per-segment statistics, and corpus_bleu is the score of their sum.
    let big_hyps: Vec<Vec<u32>> = (0..300).flat_map(|_| hyps.clone()).collect();
    let big_refs: Vec<Vec<Vec<u32>>> = (0..300).flat_map(|_| refs.clone()).collect();
    let big = corpus_stats(&big_hyps, &big_refs, 4).unwrap();
    assert_eq!(big.len(), 300 * hyps.len());
    for (k, s) in big.iter().enumerate() {
        assert_eq!(s, &per_segment[k % hyps.len()]);
    }
    let big_sum: BleuCounts = big.iter().sum();
    assert_eq!(
        big_sum.matches,
        sum.matches.iter().map(|m| 300 * m).collect::<Vec<_>>()
    );
    let cfg = BleuConfig::default();
    assert_eq!(
        corpus_bleu(&big_hyps, &big_refs, &cfg).unwrap(),
        score_from_stats(&big_sum, &cfg).unwrap()
    );

    // Scoring the sum is corpus_bleu, for every sacrebleu smoothing.
    for smoothing in [
        SmoothMethod::None,
        SmoothMethod::Floor(0.1),
        SmoothMethod::AddK(1.0),
        SmoothMethod::Exp,
    ] {
        for effective_order in [false, true] {
            let cfg = BleuConfig {
                smoothing,
                effective_order,
                ..BleuConfig::default()
            };
            let direct = corpus_bleu(&hyps, &refs, &cfg).unwrap();
            assert_eq!(score_from_stats(&sum, &cfg).unwrap(), direct);
        }
    }
    // NLTK statistics: floored denominators. Totals are [18, 14, 11, 8]; the empty
    // hypothesis adds 1 to every order, the one-token "5" to orders 2-4.
    assert_eq!(sum.totals, vec![18, 14, 11, 8]);
    let nltk = nltk_corpus_stats(&hyps, &refs, 4).unwrap();
    assert_eq!(nltk.numerators, sum.matches);
    assert_eq!(nltk.denominators, vec![18 + 1, 14 + 2, 11 + 2, 8 + 2]);
    assert_eq!(nltk.last_hyp_len, 1);
    assert_eq!(nltk.last_fivegram, Some((0, 1)));
    for k in 0..=7 {
        let cfg = BleuConfig::nltk(k);
        assert_eq!(
            score_nltk_stats(&nltk, &cfg),
            corpus_bleu(&hyps, &refs, &cfg),
            "method{k}"
        );
    }
}

#[test]
fn sacrebleu_quirks_by_hand() {
    // Identical strings: 100.00000000000004 on sacrebleu's 0-100 scale.
    let s = sentence_bleu(
        &ids("1 2 3 4 5"),
        &[ids("1 2 3 4 5")],
        &BleuConfig::default(),
    )
    .unwrap();
    assert_eq!(s.score, 100.00000000000004);
    // A 3-token hypothesis without effective order: the zero total of order 4 stops the loop,
    // p_4 stays 0 and the score is 0 even with exp smoothing; with effective order it is the
    // geometric mean of the first three orders.
    let h = ids("1 2 3");
    let r = [ids("1 2 3")];
    assert_eq!(
        sentence_bleu(&h, &r, &BleuConfig::default()).unwrap().score,
        0.0
    );
    let eff = sentence_bleu(&h, &r, &BleuConfig::sacrebleu_sentence()).unwrap();
    assert!((eff.score - 100.0).abs() < 1e-12 && eff.effective_order == 3);
    // add-k on an order with no n-gram: (0 + k) / (0 + k) = 100%, counts mutated as reported.
    let addk = BleuConfig {
        smoothing: SmoothMethod::AddK(1.0),
        ..BleuConfig::default()
    };
    let s = sentence_bleu(&h, &r, &addk).unwrap();
    assert_eq!(s.counts, vec![3.0, 3.0, 2.0, 1.0]);
    assert_eq!(s.totals, vec![3.0, 3.0, 2.0, 1.0]);
    assert_eq!(s.precisions_pct[3], 100.0);
}

#[test]
fn weights_extension_for_sacrebleu_semantics() {
    let (hyps, refs) = corpus();
    for smoothing in [
        SmoothMethod::Floor(0.1),
        SmoothMethod::Exp,
        SmoothMethod::AddK(1.0),
    ] {
        let plain = BleuConfig {
            smoothing,
            ..BleuConfig::default()
        };
        let uniform = BleuConfig {
            weights: Some(vec![0.25; 4]),
            ..plain.clone()
        };
        let a = corpus_bleu(&hyps, &refs, &plain).unwrap().bleu;
        let b = corpus_bleu(&hyps, &refs, &uniform).unwrap().bleu;
        assert!((a - b).abs() <= 1e-15 * a, "{a} vs {b}");
    }
    // BLEU-2 as a weighted BLEU-4: weights (1/2, 1/2, 0, 0) ignore orders 3 and 4 even when
    // their precision is 0 under `none`, and equal max_order 2.
    let h = ids("1 2 9 3 4 8");
    let r = [ids("1 2 3 4 5 8")];
    let none4 = BleuConfig {
        smoothing: SmoothMethod::None,
        ..BleuConfig::default()
    };
    assert_eq!(sentence_bleu(&h, &r, &none4).unwrap().score, 0.0);
    let bleu2w = BleuConfig {
        weights: Some(vec![0.5, 0.5, 0.0, 0.0]),
        ..none4.clone()
    };
    let bleu2 = BleuConfig {
        max_order: 2,
        ..none4
    };
    let a = sentence_bleu(&h, &r, &bleu2w).unwrap().bleu;
    let b = sentence_bleu(&h, &r, &bleu2).unwrap().bleu;
    assert!(a > 0.0 && (a - b).abs() <= 1e-15, "{a} vs {b}");
    // Custom weights with effective order are renormalised over the orders that enter.
    let short = ids("1 2");
    let w = BleuConfig {
        weights: Some(vec![0.1, 0.3, 0.3, 0.3]),
        effective_order: true,
        ..BleuConfig::default()
    };
    let s = sentence_bleu(&short, &[ids("1 2")], &w).unwrap();
    assert!((s.bleu - 1.0).abs() < 1e-12 && s.effective_order == 2);
}

#[test]
fn any_hashable_token_type() {
    let text_h = vec!["the", "the", "the", "cat", "mat"];
    let text_r = vec![vec!["the", "cat", "is", "on", "the", "mat"]];
    let cfg = BleuConfig {
        max_order: 1,
        smoothing: SmoothMethod::None,
        ..BleuConfig::default()
    };
    // Clipped unigram precision 4/5 (the seed's worked example).
    let s = sentence_bleu(&text_h, &text_r, &cfg).unwrap();
    assert_eq!(s.precisions, vec![0.8]);
    let owned_h: Vec<String> = text_h.iter().map(|t| t.to_string()).collect();
    let owned_r: Vec<Vec<String>> = vec![text_r[0].iter().map(|t| t.to_string()).collect()];
    assert_eq!(sentence_bleu(&owned_h, &owned_r, &cfg).unwrap(), s);
    let big_h: Vec<u64> = vec![u64::MAX, u64::MAX, u64::MAX, 4_000_000_000, 5];
    let big_r = vec![vec![u64::MAX, 4_000_000_000, 7, 8, u64::MAX, 5]];
    assert_eq!(sentence_bleu(&big_h, &big_r, &cfg).unwrap(), s);
}
