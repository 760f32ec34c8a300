//! NMLA's n-gram F-measure on CTC outputs (docs/loss.md, §17.6): equal to brute-force
//! enumeration of every alignment, exact at one-hot frames, the kernel path equal to its
//! composed reference, gradients through the finite-difference check, the same statistics as
//! the BLEU loss on CTC outputs, and named errors.

mod common;

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    ctc_bleu_loss_from_logits, ctc_ngram_f_loss, ctc_ngram_f_loss_composed, BleuLossConfig,
    CtcNgramFConfig, Reduction, References,
};
use candle_core::{DType, Tensor};
use common::*;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

/// The n-grams of order `n` of `y` with their counts.
fn ngram_counts(y: &[u32], n: usize) -> HashMap<Vec<u32>, f64> {
    let mut counts = HashMap::new();
    for w in y.windows(n) {
        *counts.entry(w.to_vec()).or_insert(0.0) += 1.0;
    }
    counts
}

/// `(M_n, E[T_n(B(a))], T_n(y))` of one element with one reference, by enumerating every
/// alignment of `q` (`[frames][V]` probabilities): `M_n = Σ_g min(E[count_g], count_g(y))`.
fn enumerate(q: &[Vec<f64>], blank: u32, reference: &[u32], n: usize) -> (f64, f64, f64) {
    let vocab = q[0].len();
    let reference_counts = ngram_counts(reference, n);
    let mut expected: HashMap<Vec<u32>, f64> = HashMap::new();
    let mut hyp_ngrams = 0.0;
    let mut alignment = vec![0u32; q.len()];
    for code in 0..vocab.pow(q.len() as u32) {
        let (mut rest, mut p) = (code, 1.0);
        for (t, row) in q.iter().enumerate() {
            alignment[t] = (rest % vocab) as u32;
            rest /= vocab;
            p *= row[alignment[t] as usize];
        }
        let y = ctc_collapse(&alignment, blank);
        hyp_ngrams += p * (y.len() + 1).saturating_sub(n) as f64;
        for (g, c) in ngram_counts(&y, n) {
            *expected.entry(g).or_insert(0.0) += p * c;
        }
    }
    let matches = reference_counts
        .iter()
        .map(|(g, &clip)| expected.get(g).copied().unwrap_or(0.0).min(clip))
        .sum();
    (
        matches,
        hyp_ngrams,
        (reference.len() + 1).saturating_sub(n) as f64,
    )
}

fn f_measure(matches: f64, hyp: f64, reference: f64) -> f64 {
    if reference == 0.0 {
        0.0
    } else {
        2.0 * matches / (reference + hyp)
    }
}

fn references(refs: &[Vec<u32>], blank: u32) -> References {
    let nested: Vec<Vec<Vec<u32>>> = refs.iter().map(|r| vec![r.clone()]).collect();
    References::from_ids(&reference_ids(&nested, blank).unwrap(), blank).unwrap()
}

fn lengths_tensor(lengths: &[usize]) -> Tensor {
    let values: Vec<u32> = lengths.iter().map(|&l| l as u32).collect();
    Tensor::new(values.as_slice(), &test_device()).unwrap()
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * (1.0 + b.abs())
}

#[test]
fn the_f_measure_equals_enumeration_over_every_alignment() {
    if !f64_supported("the_f_measure_equals_enumeration_over_every_alignment") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let (batch, frames, vocab) = (3, 5, 4);
    for blank in [0u32, 3] {
        let tokens: Vec<u32> = (0..vocab as u32).filter(|&v| v != blank).collect();
        // References of 1 to 5 tokens with repeats; the first is shorter than some orders.
        let refs: Vec<Vec<u32>> = (0..batch)
            .map(|b| {
                let len = if b == 0 { 1 } else { rng.gen_range(2..=5) };
                (0..len)
                    .map(|_| tokens[rng.gen_range(0..tokens.len())])
                    .collect()
            })
            .collect();
        let input_lengths = [5usize, 4, 3];
        let values: Vec<f64> = (0..batch * frames * vocab)
            .map(|_| rng.gen_range(-2.0..2.0))
            .collect();
        let logits =
            Tensor::from_vec(values.clone(), (batch, frames, vocab), &test_device()).unwrap();
        let lengths = lengths_tensor(&input_lengths);
        for order in 1..=3 {
            let per_element: Vec<(f64, f64, f64)> = (0..batch)
                .map(|b| {
                    let q: Vec<Vec<f64>> = (0..input_lengths[b])
                        .map(|t| softmax_row(&values[(b * frames + t) * vocab..][..vocab]))
                        .collect();
                    enumerate(&q, blank, &refs[b], order)
                })
                .collect();
            let fs: Vec<f64> = per_element
                .iter()
                .map(|&(m, h, r)| f_measure(m, h, r))
                .collect();
            let sentence = -fs.iter().sum::<f64>() / batch as f64;
            let corpus = {
                let m: f64 = per_element.iter().map(|e| e.0).sum();
                let d: f64 = per_element.iter().map(|e| e.1 + e.2).sum();
                -2.0 * m / d.max(1.0)
            };
            for (reduction, want) in [
                (Reduction::SentenceMean, sentence),
                (Reduction::Corpus, corpus),
            ] {
                let cfg = CtcNgramFConfig {
                    order,
                    reduction,
                    ..Default::default()
                };
                for composed in [false, true] {
                    let f = if composed {
                        ctc_ngram_f_loss_composed
                    } else {
                        ctc_ngram_f_loss
                    };
                    let out = f(
                        &logits,
                        Some(&lengths),
                        &references(&refs, blank),
                        blank,
                        &cfg,
                    )
                    .unwrap();
                    let what =
                        format!("blank {blank}, n = {order}, {reduction:?}, composed {composed}");
                    let loss = out.loss.to_scalar::<f64>().unwrap();
                    assert!(close(loss, want, 1e-10), "{what}: loss {loss} vs {want}");
                    let got = |t: &Tensor| t.to_vec1::<f64>().unwrap();
                    for (b, &(m, h, r)) in per_element.iter().enumerate() {
                        assert!(close(got(&out.matches)[b], m, 1e-10), "{what}: M[{b}]");
                        assert!(
                            close(got(&out.hyp_ngrams)[b], h, 1e-10),
                            "{what}: E[T][{b}]"
                        );
                        assert_eq!(got(&out.ref_ngrams)[b], r, "{what}: T(y)[{b}]");
                        assert!(
                            close(got(&out.f_measure)[b], fs[b], 1e-10),
                            "{what}: F[{b}]"
                        );
                    }
                }
            }
        }
    }
}

/// At one-hot frames the F-measure is the discrete one of the collapsed sequence, which here
/// is shorter than the reference, then equal to it, then longer: the loss penalises both ways.
#[test]
fn one_hot_frames_give_the_discrete_f_measure_penalising_length_both_ways() {
    let blank = 0u32;
    let reference = vec![1u32, 2, 3, 4];
    let refs = references(std::slice::from_ref(&reference), blank);
    let mut previous = None;
    for frames in [
        vec![1u32, 2, 0, 0, 0, 0],
        vec![1, 2, 3, 4, 0, 0],
        vec![1, 2, 3, 4, 1, 2],
    ] {
        let vocab = 5;
        let mut values = vec![-40f64; frames.len() * vocab];
        for (t, &v) in frames.iter().enumerate() {
            values[t * vocab + v as usize] = 40.0;
        }
        let logits = Tensor::from_vec(values, (1, frames.len(), vocab), &test_device())
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let out =
            ctc_ngram_f_loss(&logits, None, &refs, blank, &CtcNgramFConfig::default()).unwrap();
        let y = ctc_collapse(&frames, blank);
        let hyp = ngram_counts(&y, 2);
        let matches: f64 = ngram_counts(&reference, 2)
            .iter()
            .map(|(g, &c)| hyp.get(g).copied().unwrap_or(0.0).min(c))
            .sum();
        let want = -f_measure(matches, (y.len() - 1) as f64, 3.0);
        let loss = out.loss.to_scalar::<f32>().unwrap() as f64;
        assert!((loss - want).abs() < 1e-5, "{frames:?}: {loss} vs {want}");
        previous = match previous {
            None => Some(loss),
            Some(p) => Some(p.min(loss)),
        };
    }
    // "1 2" scores 2/4, "1 2 3 4" 6/6, "1 2 3 4 1 2" 6/8: the exact length is best.
    assert!((previous.unwrap() + 1.0).abs() < 1e-5);
}

/// The statistics are the BLEU loss on CTC outputs' own (multi-reference clipping and reference
/// length included).
#[test]
fn the_statistics_are_those_of_the_bleu_loss_on_ctc_outputs() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let blank = 0u32;
    let refs = vec![
        vec![vec![1u32, 2, 2, 3], vec![2, 2, 3]],
        vec![vec![4u32, 1, 4, 1, 4], vec![1, 4]],
    ];
    let refs = References::from_ids(&reference_ids(&refs, blank).unwrap(), blank).unwrap();
    let values: Vec<f32> = (0..2 * 9 * 5).map(|_| rng.gen_range(-2.0..2.0)).collect();
    let logits = Tensor::from_vec(values, (2, 9, 5), &test_device()).unwrap();
    for order in 1..=3 {
        let cfg = CtcNgramFConfig {
            order,
            ..Default::default()
        };
        let f = ctc_ngram_f_loss(&logits, None, &refs, blank, &cfg).unwrap();
        let bleu_cfg = BleuLossConfig {
            max_order: order,
            ..Default::default()
        };
        let bleu = ctc_bleu_loss_from_logits(&logits, None, &refs, blank, &bleu_cfg).unwrap();
        let column = |t: &Tensor| {
            t.narrow(1, order - 1, 1)
                .unwrap()
                .squeeze(1)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        };
        assert_eq!(
            f.matches.to_vec1::<f32>().unwrap(),
            column(&bleu.stats.matches),
            "n = {order}"
        );
        assert_eq!(
            f.hyp_ngrams.to_vec1::<f32>().unwrap(),
            column(&bleu.stats.totals),
            "n = {order}"
        );
        let ref_len = bleu.stats.ref_len.to_vec1::<f32>().unwrap();
        let want: Vec<f32> = ref_len
            .iter()
            .map(|&l| (l - (order - 1) as f32).max(0.0))
            .collect();
        assert_eq!(f.ref_ngrams.to_vec1::<f32>().unwrap(), want, "n = {order}");
    }
}

#[test]
fn the_kernel_path_equals_its_composed_reference_and_passes_gradcheck() {
    if !f64_supported("the_kernel_path_equals_its_composed_reference_and_passes_gradcheck") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let (batch, frames, vocab, blank) = (2, 7, 5, 0u32);
    let refs = references(&[vec![1, 2, 2, 3], vec![4, 3]], blank);
    let lengths = lengths_tensor(&[7, 5]);
    let values: Vec<f64> = (0..batch * frames * vocab)
        .map(|_| rng.gen_range(-2.0..2.0))
        .collect();
    let logits = Tensor::from_vec(values, (batch, frames, vocab), &test_device()).unwrap();
    for order in [1, 2, 3] {
        for reduction in [Reduction::SentenceMean, Reduction::Corpus] {
            let cfg = CtcNgramFConfig {
                order,
                reduction,
                ..Default::default()
            };
            for dtype in [DType::F64, DType::F32] {
                let x = logits.to_dtype(dtype).unwrap();
                let fast = ctc_ngram_f_loss(&x, Some(&lengths), &refs, blank, &cfg).unwrap();
                let slow =
                    ctc_ngram_f_loss_composed(&x, Some(&lengths), &refs, blank, &cfg).unwrap();
                let (a, b) = (
                    fast.loss
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap(),
                    slow.loss
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_scalar::<f64>()
                        .unwrap(),
                );
                let tolerance = if dtype == DType::F64 { 1e-12 } else { 1e-5 };
                assert!(
                    close(a, b, tolerance),
                    "n = {order} {reduction:?} {dtype:?}: {a} vs {b}"
                );
            }
            for composed in [false, true] {
                let f = |x: &Tensor| {
                    let out = if composed {
                        ctc_ngram_f_loss_composed(x, Some(&lengths), &refs, blank, &cfg)
                    } else {
                        ctc_ngram_f_loss(x, Some(&lengths), &refs, blank, &cfg)
                    };
                    out.map(|o| o.loss)
                };
                let report = check_gradients(f, &logits, &GradCheckConfig::default()).unwrap();
                assert!(
                    report.passed,
                    "n = {order} {reduction:?} composed={composed}: {report}"
                );
            }
        }
    }
}

#[test]
fn an_order_of_zero_is_a_named_error() {
    let refs = references(&[vec![1, 2]], 0);
    let logits = Tensor::zeros((1, 3, 4), DType::F32, &test_device()).unwrap();
    let cfg = CtcNgramFConfig {
        order: 0,
        ..Default::default()
    };
    let error = ctc_ngram_f_loss(&logits, None, &refs, 0, &cfg)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("cfg.order") && error.contains('0'),
        "{error}"
    );
    // A blank outside the vocabulary is refused as for the BLEU loss on CTC outputs.
    let error = ctc_ngram_f_loss(&logits, None, &refs, 9, &CtcNgramFConfig::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("blank"), "{error}");
}
