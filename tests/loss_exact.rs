//! docs/loss.md, §14 What the tests prove (properties 1, 3 and 4): at one-hot inputs every form reproduces the discrete BLEU
//! statistics exactly, and batch padding or order changes nothing.

mod common;

use candle_bleu::exact::{self, BleuConfig, SmoothMethod};
use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, BleuLossConfig, Form, LengthModel, LossSmoothing, Reduction,
    References,
};
use candle_core::{DType, Tensor};
use common::*;
use proptest::prelude::*;

/// A random batch: hypotheses `[b][i]` over a small vocabulary (so n-grams repeat), hard
/// lengths, references `[b][r]` (1–4 each, no padding id inside).
#[derive(Debug, Clone)]
struct Batch {
    vocab: usize,
    hyps: Vec<Vec<u32>>,
    lengths: Vec<usize>,
    refs: Vec<Vec<Vec<u32>>>,
    max_order: usize,
}

fn batch_strategy() -> impl Strategy<Value = Batch> {
    (1usize..4, 1usize..9, 3usize..7, 1usize..6).prop_flat_map(|(batch, seq, vocab, max_order)| {
        let token = 1..vocab as u32; // 0 is padding
        let hyps = prop::collection::vec(prop::collection::vec(token.clone(), seq), batch);
        let lengths = prop::collection::vec(0..=seq, batch);
        let refs = prop::collection::vec(
            prop::collection::vec(prop::collection::vec(token, 1..9), 1..5),
            batch,
        );
        (hyps, lengths, refs).prop_map(move |(hyps, lengths, refs)| Batch {
            vocab,
            hyps,
            lengths,
            refs,
            max_order,
        })
    })
}

/// The discrete statistics (docs/loss.md, §2 The target: discrete BLEU) per element, from `exact`.
fn discrete_stats(batch: &Batch) -> Vec<exact::BleuCounts> {
    batch
        .hyps
        .iter()
        .zip(&batch.lengths)
        .zip(&batch.refs)
        .map(|((hyp, &len), refs)| {
            exact::segment_stats(&hyp[..len], refs, batch.max_order).unwrap()
        })
        .collect()
}

fn check_one_hot_equality(batch: &Batch, form: Form) -> Result<(), TestCaseError> {
    let probs = one_hot(&batch.hyps, batch.vocab).unwrap();
    let refs = References::from_ids(&reference_ids(&batch.refs, PAD).unwrap(), PAD).unwrap();
    let lengths: Vec<u32> = batch.lengths.iter().map(|&l| l as u32).collect();
    let lengths = Tensor::new(lengths.as_slice(), &test_device()).unwrap();
    let cfg = BleuLossConfig {
        max_order: batch.max_order,
        form,
        smoothing: LossSmoothing::None,
        ..Default::default()
    };
    let out = bleu_loss(&probs, Some(&lengths), &refs, &cfg).unwrap();
    let expected = discrete_stats(batch);
    let matches = to_vec2(&out.stats.matches);
    let totals = to_vec2(&out.stats.totals);
    let hyp_len = to_vec1(&out.stats.hyp_len);
    let ref_len = to_vec1(&out.stats.ref_len);
    for (b, stats) in expected.iter().enumerate() {
        let want_matches: Vec<f64> = stats.matches.iter().map(|&m| m as f64).collect();
        let want_totals: Vec<f64> = stats.totals.iter().map(|&t| t as f64).collect();
        if form == Form::LowerBound {
            // Each of the c hypothesis positions matching a reference n-gram gets fl(κ/c); their
            // sum is κ up to one rounding (3 · fl(2/3) = 1.9999999999999998), not bit-exact.
            for (got, want) in matches[b].iter().zip(&want_matches) {
                prop_assert!(
                    (got - want).abs() <= 1e-12 * want.max(1.0),
                    "matches of element {}: {} vs {}",
                    b,
                    got,
                    want
                );
            }
        } else {
            prop_assert_eq!(
                &matches[b],
                &want_matches,
                "matches of element {} ({:?})",
                b,
                form
            );
        }
        prop_assert_eq!(&totals[b], &want_totals, "totals of element {}", b);
        prop_assert_eq!(hyp_len[b], stats.hyp_len as f64);
        prop_assert_eq!(ref_len[b], stats.ref_len as f64);
    }
    // Where every order has a match, the loss is exactly -log of the discrete corpus BLEU.
    let corpus: exact::BleuCounts = expected.iter().cloned().sum();
    if corpus.matches.iter().all(|&m| m > 0) {
        let score = exact::score_from_stats(
            &corpus,
            &BleuConfig {
                max_order: batch.max_order,
                smoothing: SmoothMethod::None,
                ..Default::default()
            },
        )
        .unwrap();
        let loss = scalar(&out.loss);
        prop_assert!(
            (loss + score.bleu.ln()).abs() <= 1e-12 * (1.0 + loss.abs()),
            "loss {} vs -ln BLEU {}",
            loss,
            -score.bleu.ln()
        );
    }
    Ok(())
}

proptest! {
    // No cases on Metal, which has no f64 (these are f64 checks); `f64_supported` prints a note.
    #![proptest_config(ProptestConfig::with_cases(if f64_supported("loss_exact properties") {
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(200)
    } else {
        0
    }))]

    #[test]
    fn one_hot_expected_form_is_exact(batch in batch_strategy()) {
        check_one_hot_equality(&batch, Form::Expected)?;
    }

    #[test]
    fn one_hot_paired_form_is_exact(batch in batch_strategy()) {
        check_one_hot_equality(&batch, Form::Paired)?;
    }

    #[test]
    fn one_hot_lower_bound_is_exact(batch in batch_strategy()) {
        check_one_hot_equality(&batch, Form::LowerBound)?;
    }

    /// docs/loss.md, §14 (padding): padding the references, padding the hypotheses past their lengths, and
    /// reversing the batch change no statistic, for every form at soft inputs.
    #[test]
    fn padding_and_batch_order_never_leak(batch in batch_strategy(), seed in 0u64..1000) {
        let (b, s, v) = (batch.hyps.len(), batch.hyps[0].len(), batch.vocab);
        let logits = Tensor::randn(0f64, 1.0, (b, s, v), &test_device()).unwrap();
        let _ = seed;
        let lengths: Vec<u32> = batch.lengths.iter().map(|&l| l as u32).collect();
        for form in [Form::Expected, Form::Paired, Form::LowerBound] {
            let cfg = BleuLossConfig { max_order: batch.max_order, form, ..Default::default() };
            let base = bleu_loss_from_logits(
                &logits,
                Some(&Tensor::new(lengths.as_slice(), &test_device()).unwrap()),
                &References::from_ids(&reference_ids(&batch.refs, PAD).unwrap(), PAD).unwrap(),
                &cfg,
            ).unwrap();
            // Three more padding columns on the references, one more padding reference row.
            let mut padded_refs = batch.refs.clone();
            padded_refs[0].push(vec![]);
            let wide = reference_ids(&padded_refs, PAD).unwrap().pad_with_zeros(2, 0, 3).unwrap();
            // Two more hypothesis positions (junk logits) past every hard length.
            let junk = Tensor::randn(0f64, 3.0, (b, 2, v), &test_device()).unwrap();
            let longer = Tensor::cat(&[&logits, &junk], 1).unwrap();
            let reversed: Vec<u32> = (0..b as u32).rev().collect();
            let reversed = Tensor::new(reversed.as_slice(), &test_device()).unwrap();
            let permuted_lengths: Vec<u32> = lengths.iter().rev().copied().collect();
            let permuted = bleu_loss_from_logits(
                &longer.index_select(&reversed, 0).unwrap(),
                Some(&Tensor::new(permuted_lengths.as_slice(), &test_device()).unwrap()),
                &References::from_ids(&wide.index_select(&reversed, 0).unwrap(), PAD).unwrap(),
                &cfg,
            ).unwrap();
            let unreverse = |t: &Tensor| t.index_select(&reversed, 0).unwrap();
            for (name, x, y) in [
                ("matches", &base.stats.matches, &unreverse(&permuted.stats.matches)),
                ("totals", &base.stats.totals, &unreverse(&permuted.stats.totals)),
            ] {
                let (x, y) = (to_vec2(x), to_vec2(y));
                for (rx, ry) in x.iter().zip(&y) {
                    for (a, c) in rx.iter().zip(ry) {
                        prop_assert!((a - c).abs() <= 1e-12 * (1.0 + a.abs()), "{} {:?}: {} vs {}", name, form, a, c);
                    }
                }
            }
            prop_assert_eq!(to_vec1(&base.stats.ref_len), to_vec1(&unreverse(&permuted.stats.ref_len)));
            let (l1, l2) = (scalar(&base.loss), scalar(&permuted.loss));
            prop_assert!((l1 - l2).abs() <= 1e-12 * (1.0 + l1.abs()), "loss {} vs {}", l1, l2);
        }
    }
}

/// docs/loss.md, §8.5: the forms agree at one-hot inputs, differ at soft ones, and the lower bound is
/// below the expected form there (it shares out each clip count among matching positions).
#[test]
fn forms_agree_at_one_hot_and_differ_at_soft_inputs() -> candle_core::Result<()> {
    if !f64_supported("forms_agree_at_one_hot_and_differ_at_soft_inputs") {
        return Ok(());
    }
    let hyps = vec![vec![1u32, 2, 1, 2, 3, 1], vec![2, 2, 2, 3, 1, 4]];
    let refs = vec![
        vec![vec![1u32, 2, 3, 1, 2]],
        vec![vec![2, 3, 1], vec![2, 2, 4, 1]],
    ];
    let references = References::from_ids(&reference_ids(&refs, PAD)?, PAD)?;
    let probs = one_hot(&hyps, 5)?;
    let losses: Vec<f64> = [Form::Expected, Form::Paired, Form::LowerBound]
        .iter()
        .map(|&form| {
            let cfg = BleuLossConfig {
                form,
                ..Default::default()
            };
            scalar(&bleu_loss(&probs, None, &references, &cfg).unwrap().loss)
        })
        .collect();
    assert_eq!(losses[0], losses[1]);
    // The lower bound sums c copies of fl(κ/c): equal up to rounding.
    assert!((losses[0] - losses[2]).abs() < 1e-14);

    let soft = candle_nn::ops::softmax(&(probs.affine(2.0, 0.0)?), candle_core::D::Minus1)?;
    let matches: Vec<Vec<Vec<f64>>> = [Form::Expected, Form::Paired, Form::LowerBound]
        .iter()
        .map(|&form| {
            let cfg = BleuLossConfig {
                form,
                ..Default::default()
            };
            to_vec2(
                &bleu_loss(&soft, None, &references, &cfg)
                    .unwrap()
                    .stats
                    .matches,
            )
        })
        .collect();
    assert_ne!(matches[0], matches[1]);
    for (lower, expected) in matches[2].iter().flatten().zip(matches[0].iter().flatten()) {
        assert!(
            lower <= &(expected + 1e-12),
            "lower bound {lower} above expected {expected}"
        );
    }
    Ok(())
}

/// `SoftEos` at one-hot inputs: the hypothesis ends at its first EOS, and the statistics are
/// those of the prefix before it (and references end at their first EOS too).
#[test]
fn soft_eos_at_one_hot_scores_the_prefix_before_eos() -> candle_core::Result<()> {
    if !f64_supported("soft_eos_at_one_hot_scores_the_prefix_before_eos") {
        return Ok(());
    }
    let eos = 9u32;
    let hyps = vec![
        vec![1u32, 2, 3, 4, eos, 2, 3, 4],
        vec![5, 5, 6, eos, eos, 1, 1, 1],
    ];
    let refs = vec![
        vec![vec![1u32, 2, 3, 5, 4, eos]],
        vec![vec![5, 6, 7], vec![5, 5, eos, 1]],
    ];
    let references = References::from_ids(&reference_ids(&refs, PAD)?, PAD)?;
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [LengthModel::SoftEos { eos_id: eos }] {
            let cfg = BleuLossConfig {
                form,
                length,
                smoothing: LossSmoothing::None,
                reduction: Reduction::SentenceMean,
                ..Default::default()
            };
            let out = bleu_loss(&one_hot(&hyps, 10)?, None, &references, &cfg)?;
            let prefixes = [vec![1u32, 2, 3, 4], vec![5, 5, 6]];
            let prefix_refs = [
                vec![vec![1u32, 2, 3, 5, 4]],
                vec![vec![5, 6, 7], vec![5, 5]],
            ];
            for b in 0..2 {
                let stats = exact::segment_stats(&prefixes[b], &prefix_refs[b], 4).unwrap();
                let want: Vec<f64> = stats.matches.iter().map(|&m| m as f64).collect();
                assert_eq!(to_vec2(&out.stats.matches)[b], want, "{form:?} element {b}");
                let want: Vec<f64> = stats.totals.iter().map(|&t| t as f64).collect();
                assert_eq!(to_vec2(&out.stats.totals)[b], want);
                assert_eq!(to_vec1(&out.stats.hyp_len)[b], stats.hyp_len as f64);
                assert_eq!(to_vec1(&out.stats.ref_len)[b], stats.ref_len as f64);
            }
        }
    }
    Ok(())
}

/// `from_matrices` with one-hot rows gives the same numbers as `from_ids`.
#[test]
fn one_hot_matrices_equal_ids() -> candle_core::Result<()> {
    if !f64_supported("one_hot_matrices_equal_ids") {
        return Ok(());
    }
    let refs_ids = vec![vec![vec![1u32, 2, 3, 1, 2, 4]], vec![vec![2u32, 2, 5]]];
    let ids = reference_ids(&refs_ids, PAD)?;
    let by_ids = References::from_ids(&ids, PAD)?;
    let flat: Vec<Vec<u32>> = vec![refs_ids[0][0].clone(), {
        let mut r = refs_ids[1][0].clone();
        r.resize(6, 0);
        r
    }];
    let by_matrices = References::from_matrices(
        &one_hot(&flat, 6)?,
        &Tensor::new(&[6u32, 3], &test_device())?,
    )?;
    let logits = Tensor::randn(0f64, 1.5, (2, 5, 6), &test_device())?;
    let probs = candle_nn::ops::softmax(&logits, candle_core::D::Minus1)?;
    for cfg in all_configs(4, 5) {
        let a = bleu_loss(&probs, None, &by_ids, &cfg)?;
        let b = bleu_loss(&probs, None, &by_matrices, &cfg)?;
        assert_eq!(
            to_vec2(&a.stats.matches),
            to_vec2(&b.stats.matches),
            "{cfg:?}"
        );
        assert_eq!(
            to_vec2(&a.stats.totals),
            to_vec2(&b.stats.totals),
            "{cfg:?}"
        );
        assert_eq!(scalar(&a.loss), scalar(&b.loss), "{cfg:?}");
    }
    Ok(())
}

/// A worked example, by hand.
///
/// Hypothesis `a b a` (ids 1 2 1), one reference `a b c` (1 2 3), V = 4, one-hot, Given lengths,
/// N = 2, no smoothing, corpus:
/// - unigrams: hyp counts a:2, b:1; reference a:1, b:1, c:1; clipped m_1 = min(2,1) + 1 = 2,
///   t_1 = 3;
/// - bigrams: hyp `a b`, `b a`; reference `a b`, `b c`: m_2 = 1, t_2 = 2;
/// - c = 3 = L, so BP = 1; BLEU = (2/3 · 1/2)^{1/2} = 1/√3; loss = ln(3)/2 = 0.5493061443340549.
///
/// Hypothesis `a b c` is the reference: m = (3, 2), t = (3, 2), BLEU = 1, loss = 0.
#[test]
fn worked_example_by_hand() -> candle_core::Result<()> {
    if !f64_supported("worked_example_by_hand") {
        return Ok(());
    }
    let refs = References::from_ids(&Tensor::new(&[[1u32, 2, 3]], &test_device())?, PAD)?;
    let cfg = BleuLossConfig {
        max_order: 2,
        smoothing: LossSmoothing::None,
        ..Default::default()
    };
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        let cfg = BleuLossConfig {
            form,
            ..cfg.clone()
        };
        let out = bleu_loss(&one_hot(&[vec![1, 2, 1]], 4)?, None, &refs, &cfg)?;
        assert_eq!(to_vec2(&out.stats.matches), vec![vec![2.0, 1.0]]);
        assert_eq!(to_vec2(&out.stats.totals), vec![vec![3.0, 2.0]]);
        assert!((scalar(&out.loss) - 0.549_306_144_334_054_9).abs() < 1e-15);
        let out = bleu_loss(&one_hot(&[vec![1, 2, 3]], 4)?, None, &refs, &cfg)?;
        assert_eq!(scalar(&out.loss), 0.0);
    }
    // A soft third position: P[2] = 0.5 a + 0.5 c. Expected form by hand:
    // unigram expected counts: a: 1 + 0.5 = 1.5 → min(1, 1.5) = 1; b: 1; c: 0.5 → m_1 = 2.5;
    // bigrams: `a b` at start 0 matches fully (1); `b c` at start 1: 1 · 0.5 → m_2 = 1.5;
    // loss = -(ln(2.5/3) + ln(1.5/2))/2 = 0.23500181462286...
    let probs = Tensor::new(
        &[[
            [0f64, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
            [0.0, 0.5, 0.0, 0.5],
        ]],
        &test_device(),
    )?;
    let out = bleu_loss(&probs, None, &refs, &cfg)?;
    assert_eq!(to_vec2(&out.stats.matches), vec![vec![2.5, 1.5]]);
    let want = -((2.5f64 / 3.0).ln() + (1.5f64 / 2.0).ln()) / 2.0;
    assert!((scalar(&out.loss) - want).abs() < 1e-15);
    let _ = DType::F64;
    Ok(())
}
