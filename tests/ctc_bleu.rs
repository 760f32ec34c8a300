//! The BLEU loss on CTC outputs (docs/loss.md, §12): the expected statistics equal brute-force
//! enumeration of every alignment, one-hot frames give the exact BLEU of the collapsed sequence,
//! the CPU kernel equals its composed reference in values and gradients, gradients pass the
//! finite-difference check, frames beyond the lengths change nothing, and every bad input is a
//! named error.

mod common;

use candle_bleu::exact::{self, BleuConfig, SmoothMethod};
use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    ctc_bleu_loss_from_logits, ctc_bleu_loss_from_logits_composed, ctc_expected_counts,
    BleuLossConfig, Form, LengthModel, LossSmoothing, Reduction, References,
};
use candle_core::{DType, Tensor, Var};
use common::*;
use rand::{Rng, SeedableRng};

/// One element's expectations by enumeration of all `V^frames` alignments: for each n-gram
/// `ngrams[i]`, `E[count in B(a)]`; `E[|B(a)|]`; `E[max(|B(a)| − n + 1, 0)]` per order.
fn enumerate(
    q: &[Vec<f64>],
    blank: u32,
    ngrams: &[Vec<u32>],
    max_order: usize,
) -> (Vec<f64>, f64, Vec<f64>) {
    let vocab = q.first().map_or(1, Vec::len);
    let mut counts = vec![0.0; ngrams.len()];
    let (mut length, mut totals) = (0.0, vec![0.0; max_order]);
    let mut alignment = vec![0u32; q.len()];
    for code in 0..vocab.pow(q.len() as u32) {
        let (mut rest, mut p) = (code, 1.0);
        for (t, row) in q.iter().enumerate() {
            alignment[t] = (rest % vocab) as u32;
            rest /= vocab;
            p *= row[alignment[t] as usize];
        }
        let y = ctc_collapse(&alignment, blank);
        length += p * y.len() as f64;
        for (n, total) in totals.iter_mut().enumerate() {
            *total += p * y.len().saturating_sub(n) as f64;
        }
        for (g, count) in ngrams.iter().zip(&mut counts) {
            *count += p * y.windows(g.len()).filter(|w| w == g).count() as f64;
        }
    }
    (counts, length, totals)
}

/// Random id references `[b][r]` over the non-blank tokens of `vocab`, 1..=`refs` each, of
/// lengths 1..=`max_len`, with repeats (a small vocabulary).
fn random_refs(
    rng: &mut impl Rng,
    batch: usize,
    refs: usize,
    max_len: usize,
    vocab: usize,
    blank: u32,
) -> Vec<Vec<Vec<u32>>> {
    let tokens: Vec<u32> = (0..vocab as u32).filter(|&v| v != blank).collect();
    (0..batch)
        .map(|_| {
            (0..rng.gen_range(1..=refs))
                .map(|_| {
                    (0..rng.gen_range(1..=max_len))
                        .map(|_| tokens[rng.gen_range(0..tokens.len())])
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// References as a padded id tensor whose padding id is the blank (never a token of theirs).
fn references(refs: &[Vec<Vec<u32>>], blank: u32) -> References {
    References::from_ids(&reference_ids(refs, blank).unwrap(), blank).unwrap()
}

fn random_logits(
    rng: &mut impl Rng,
    shape: (usize, usize, usize),
    scale: f64,
) -> (Vec<f64>, Tensor) {
    let (b, t, v) = shape;
    let values: Vec<f64> = (0..b * t * v)
        .map(|_| rng.gen_range(-scale..scale))
        .collect();
    let tensor = Tensor::from_vec(values.clone(), shape, &test_device()).unwrap();
    (values, tensor)
}

fn lengths_tensor(lengths: &[usize]) -> Tensor {
    let values: Vec<u32> = lengths.iter().map(|&l| l as u32).collect();
    Tensor::new(values.as_slice(), &test_device()).unwrap()
}

#[test]
fn expected_counts_equal_enumeration_over_every_alignment() {
    if !f64_supported("expected_counts_equal_enumeration_over_every_alignment") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let mut checked = 0usize;
    let mut worst = 0f64;
    // Every T' <= 6 and V <= 3 tokens plus the blank (V = 2..=4 symbols), every order <= 4.
    for frames in 1..=6usize {
        for vocab in 2..=4usize {
            for max_order in 1..=4usize {
                let blank = rng.gen_range(0..vocab) as u32;
                let batch = 3;
                let refs = random_refs(&mut rng, batch, 2, 6, vocab, blank);
                let (values, logits) = random_logits(&mut rng, (batch, frames, vocab), 3.0);
                let lengths: Vec<usize> = (0..batch)
                    .map(|b| {
                        if b == 0 {
                            frames
                        } else {
                            rng.gen_range(0..=frames)
                        }
                    })
                    .collect();
                let stats = ctc_expected_counts(
                    &logits,
                    Some(&lengths_tensor(&lengths)),
                    &references(&refs, blank),
                    blank,
                    max_order,
                )
                .unwrap();
                let counts = stats
                    .counts
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec3::<f64>()
                    .unwrap();
                let totals = to_vec2(&stats.totals);
                let hyp_len = to_vec1(&stats.hyp_len);
                for b in 0..batch {
                    let q: Vec<Vec<f64>> = values[b * frames * vocab..][..lengths[b] * vocab]
                        .chunks(vocab)
                        .map(softmax_row)
                        .collect();
                    // Every slot (order, position) of the references laid end to end.
                    let (mut ngrams, mut slots) = (vec![], vec![]);
                    let mut offset = 0;
                    for reference in &refs[b] {
                        for n in 1..=max_order {
                            for j in 0..reference.len() {
                                if j + n <= reference.len() {
                                    ngrams.push(reference[j..j + n].to_vec());
                                    slots.push((n - 1, offset + j));
                                }
                            }
                        }
                        offset += reference.len();
                    }
                    let (want_counts, want_length, want_totals) =
                        enumerate(&q, blank, &ngrams, max_order);
                    for (&(n, j), want) in slots.iter().zip(&want_counts) {
                        worst = worst.max((counts[b][n][j] - want).abs());
                    }
                    // Slots whose n-gram crosses a reference's end hold 0.
                    let valid: std::collections::HashSet<_> = slots.iter().copied().collect();
                    for (n, row) in counts[b].iter().enumerate() {
                        for (j, &c) in row.iter().enumerate() {
                            if !valid.contains(&(n, j)) {
                                assert_eq!(c, 0.0, "slot ({n}, {j}) of element {b}");
                            }
                        }
                    }
                    worst = worst.max((hyp_len[b] - want_length).abs());
                    for (got, want) in totals[b].iter().zip(&want_totals) {
                        worst = worst.max((got - want).abs());
                    }
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 6 * 3 * 4 * 3);
    assert!(
        worst < 1e-12,
        "largest difference from enumeration {worst:e}"
    );
}

#[test]
fn one_hot_frames_give_the_exact_bleu_of_the_collapsed_sequences() {
    if !f64_supported("one_hot_frames_give_the_exact_bleu_of_the_collapsed_sequences") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(34);
    for case in 0..40 {
        let (batch, frames, vocab) = (3, rng.gen_range(4..14usize), rng.gen_range(3..7usize));
        let blank = rng.gen_range(0..vocab) as u32;
        let max_order = rng.gen_range(1..=6usize);
        let refs = random_refs(&mut rng, batch, 3, 8, vocab, blank);
        // Hard alignments, biased towards repeats and blanks as CTC outputs are.
        let mut alignments = vec![vec![0u32; frames]; batch];
        for alignment in alignments.iter_mut() {
            for t in 0..frames {
                alignment[t] = match rng.gen_range(0..3) {
                    0 if t > 0 => alignment[t - 1],
                    1 => blank,
                    _ => rng.gen_range(0..vocab as u32),
                };
            }
        }
        let lengths: Vec<usize> = (0..batch).map(|_| rng.gen_range(1..=frames)).collect();
        let mut values = vec![-1e4f64; batch * frames * vocab];
        for (b, alignment) in alignments.iter().enumerate() {
            for (t, &symbol) in alignment.iter().enumerate() {
                values[(b * frames + t) * vocab + symbol as usize] = 0.0;
            }
        }
        let logits = Tensor::from_vec(values, (batch, frames, vocab), &test_device()).unwrap();
        let hyps: Vec<Vec<u32>> = alignments
            .iter()
            .zip(&lengths)
            .map(|(a, &len)| ctc_collapse(&a[..len], blank))
            .collect();
        let cfg = BleuLossConfig {
            max_order,
            smoothing: LossSmoothing::None,
            ..Default::default()
        };
        let out = ctc_bleu_loss_from_logits(
            &logits,
            Some(&lengths_tensor(&lengths)),
            &references(&refs, blank),
            blank,
            &cfg,
        )
        .unwrap();
        let (matches, totals) = (to_vec2(&out.stats.matches), to_vec2(&out.stats.totals));
        let (hyp_len, ref_len) = (to_vec1(&out.stats.hyp_len), to_vec1(&out.stats.ref_len));
        for b in 0..batch {
            let want = exact::segment_stats(&hyps[b], &refs[b], max_order).unwrap();
            let as_f64 = |v: &[u64]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
            assert_eq!(matches[b], as_f64(&want.matches), "case {case} element {b}");
            assert_eq!(totals[b], as_f64(&want.totals), "case {case} element {b}");
            assert_eq!(hyp_len[b], want.hyp_len as f64, "case {case} element {b}");
            assert_eq!(ref_len[b], want.ref_len as f64, "case {case} element {b}");
        }
        // Where every order matches, the loss is -ln of the exact corpus BLEU.
        let score = exact::corpus_bleu(
            &hyps,
            &refs,
            &BleuConfig {
                max_order,
                smoothing: SmoothMethod::None,
                ..Default::default()
            },
        )
        .unwrap();
        let all_match = (0..max_order).all(|n| matches.iter().map(|m| m[n]).sum::<f64>() > 0.0);
        if all_match {
            let loss = scalar(&out.loss);
            assert!(
                (loss + score.bleu.ln()).abs() < 1e-12,
                "case {case}: loss {loss} vs -ln BLEU {}",
                -score.bleu.ln()
            );
        }
    }
}

/// Configurations the kernel is compared with its composed reference under.
fn configs() -> Vec<BleuLossConfig> {
    let mut out = Vec::new();
    // Up to 4-grams one fused pass per frame does the vocabulary-sized work; 5 and 6 take the
    // pass-per-count path.
    for max_order in [1, 2, 3, 4, 5, 6] {
        for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
            out.push(BleuLossConfig {
                max_order,
                reduction,
                ..Default::default()
            });
        }
    }
    // The bag-of-2-grams objective and unsmoothed BLEU.
    out.push(BleuLossConfig {
        max_order: 2,
        weights: Some(vec![0.0, 1.0]),
        ..Default::default()
    });
    out.push(BleuLossConfig {
        smoothing: LossSmoothing::None,
        ..Default::default()
    });
    // Off the CPU without value checks the input lengths stay on the device (the CUDA
    // kernels read them there); on the CPU this is the first config again.
    out.push(BleuLossConfig {
        check_values: false,
        ..Default::default()
    });
    out
}

fn kernel_against_composed(dtype: DType, tolerance: f64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let (batch, frames, vocab, blank) = (4, 12, 9, 2u32);
    let refs = references(&random_refs(&mut rng, batch, 3, 7, vocab, blank), blank);
    let lengths = lengths_tensor(&[12, 7, 0, 10]);
    for (i, cfg) in configs().iter().enumerate() {
        let (_, logits) = random_logits(&mut rng, (batch, frames, vocab), 2.5);
        let logits = Var::from_tensor(&logits.to_dtype(dtype).unwrap()).unwrap();
        let run = |composed: bool| {
            let f = if composed {
                ctc_bleu_loss_from_logits_composed
            } else {
                ctc_bleu_loss_from_logits
            };
            let out = f(logits.as_tensor(), Some(&lengths), &refs, blank, cfg).unwrap();
            let grad = out.loss.backward().unwrap();
            let grad = grad.get(logits.as_tensor()).unwrap().clone();
            (out, grad)
        };
        let (fast, fast_grad) = run(false);
        let (slow, slow_grad) = run(true);
        let close = |a: f64, b: f64, what: &str| {
            let scale = a.abs().max(b.abs()).max(1.0);
            assert!(
                (a - b).abs() <= tolerance * scale,
                "config {i} {dtype:?} {what}: kernel {a} vs composed {b}"
            );
        };
        close(scalar(&fast.loss), scalar(&slow.loss), "loss");
        for (a, b) in [
            (&fast.stats.matches, &slow.stats.matches),
            (&fast.stats.totals, &slow.stats.totals),
        ] {
            for (ra, rb) in to_vec2(a).iter().zip(to_vec2(b)) {
                for (x, y) in ra.iter().zip(rb) {
                    close(*x, y, "statistic");
                }
            }
        }
        let largest = to_vec1(&slow_grad.abs().unwrap().flatten_all().unwrap())
            .into_iter()
            .fold(0.0, f64::max);
        assert!(largest > 0.0, "config {i}: no gradient");
        let (a, b) = (
            to_vec1(&fast_grad.flatten_all().unwrap()),
            to_vec1(&slow_grad.flatten_all().unwrap()),
        );
        for (x, y) in a.iter().zip(&b) {
            assert!(
                (x - y).abs() <= tolerance * largest,
                "config {i} {dtype:?} gradient: kernel {x} vs composed {y} (largest {largest})"
            );
        }
    }
}

#[test]
fn the_kernel_equals_its_composed_reference_in_f64() {
    if f64_supported("the_kernel_equals_its_composed_reference_in_f64") {
        kernel_against_composed(DType::F64, 1e-10);
    }
}

#[test]
fn the_kernel_equals_its_composed_reference_in_f32() {
    kernel_against_composed(DType::F32, 1e-5);
}

#[test]
fn gradients_pass_the_finite_difference_check() {
    if !f64_supported("gradients_pass_the_finite_difference_check") {
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(36);
    let (batch, frames, vocab, blank) = (2, 7, 5, 0u32);
    let refs = references(&random_refs(&mut rng, batch, 2, 5, vocab, blank), blank);
    let lengths = lengths_tensor(&[7, 5]);
    let (_, logits) = random_logits(&mut rng, (batch, frames, vocab), 2.0);
    for cfg in configs() {
        for composed in [false, true] {
            let f = |x: &Tensor| {
                let out = if composed {
                    ctc_bleu_loss_from_logits_composed(x, Some(&lengths), &refs, blank, &cfg)
                } else {
                    ctc_bleu_loss_from_logits(x, Some(&lengths), &refs, blank, &cfg)
                };
                out.map(|o| o.loss)
            };
            let report = check_gradients(f, &logits, &GradCheckConfig::default()).unwrap();
            assert!(report.passed, "{cfg:?} composed={composed}: {report}");
        }
    }
}

#[test]
fn frames_beyond_the_lengths_change_nothing_and_get_no_gradient() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(37);
    let (batch, frames, vocab, blank) = (2, 9, 6, 5u32);
    let refs = references(&random_refs(&mut rng, batch, 2, 6, vocab, blank), blank);
    let (_, logits) = random_logits(&mut rng, (batch, frames, vocab), 2.0);
    let logits = Var::from_tensor(&logits.to_dtype(DType::F32).unwrap()).unwrap();
    let cfg = BleuLossConfig::default();
    let lengths = lengths_tensor(&[6, 6]);
    let out =
        ctc_bleu_loss_from_logits(logits.as_tensor(), Some(&lengths), &refs, blank, &cfg).unwrap();
    let grads = out.loss.backward().unwrap();
    let grad = grads.get(logits.as_tensor()).unwrap();
    let beyond = to_vec1(&grad.narrow(1, 6, 3).unwrap().flatten_all().unwrap());
    assert!(beyond.iter().all(|&g| g == 0.0), "{beyond:?}");
    let within = to_vec1(&grad.narrow(1, 0, 6).unwrap().flatten_all().unwrap());
    assert!(within.iter().any(|&g| g != 0.0));
    // The same statistics as the logits cut at the length.
    let cut = logits.as_tensor().narrow(1, 0, 6).unwrap();
    let short = ctc_bleu_loss_from_logits(&cut, None, &refs, blank, &cfg).unwrap();
    assert_eq!(scalar(&out.loss), scalar(&short.loss));
    assert_eq!(to_vec2(&out.stats.totals), to_vec2(&short.stats.totals));
}

/// Padding frames (at and beyond `input_lengths[b]`) may hold anything, as in `ctc_loss`: NaN
/// or Inf there gives the same loss and gradient, to the bit, as finite garbage, and a zero
/// gradient there — on the CPU kernel and on the composed path (what runs off the CPU), with
/// and without `check_values`. NaN within the lengths is still refused.
#[test]
fn non_finite_padding_frames_change_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let (batch, frames, vocab, blank) = (2, 9, 6, 5u32);
    let refs = references(&random_refs(&mut rng, batch, 2, 6, vocab, blank), blank);
    let (_, logits) = random_logits(&mut rng, (batch, frames, vocab), 2.0);
    let lengths = lengths_tensor(&[6, 9]);
    let with_padding = |fill: f32| {
        logits
            .to_dtype(DType::F32)
            .unwrap()
            .slice_assign(
                &[0..1, 6..9, 0..vocab],
                &Tensor::full(fill, (1, 3, vocab), &test_device()).unwrap(),
            )
            .unwrap()
    };
    for check_values in [false, true] {
        let cfg = BleuLossConfig {
            check_values,
            ..Default::default()
        };
        for composed in [false, true] {
            let run = |x: &Tensor| {
                let x = Var::from_tensor(x).unwrap();
                let out = if composed {
                    ctc_bleu_loss_from_logits_composed(
                        x.as_tensor(),
                        Some(&lengths),
                        &refs,
                        blank,
                        &cfg,
                    )
                } else {
                    ctc_bleu_loss_from_logits(x.as_tensor(), Some(&lengths), &refs, blank, &cfg)
                }
                .unwrap_or_else(|e| {
                    panic!("composed {composed}, check_values {check_values}: {e}")
                });
                let grads = out.loss.backward().unwrap();
                let grad = grads.get(x.as_tensor()).unwrap().flatten_all().unwrap();
                (scalar(&out.loss), to_vec1(&grad))
            };
            let (loss, grad) = run(&with_padding(1e3));
            assert!(loss.is_finite());
            for fill in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let (bad_loss, bad_grad) = run(&with_padding(fill));
                let what =
                    format!("{fill} in padding, composed {composed}, check_values {check_values}");
                assert_eq!(
                    bad_loss.to_bits(),
                    loss.to_bits(),
                    "{what}: {bad_loss} vs {loss}"
                );
                assert_eq!(bad_grad, grad, "{what}");
                let padding = &bad_grad[6 * vocab..9 * vocab];
                assert!(padding.iter().all(|&g| g == 0.0), "{what}: {padding:?}");
            }
            // NaN within the frames in use is refused.
            let inside = logits
                .to_dtype(DType::F32)
                .unwrap()
                .slice_assign(
                    &[0..1, 5..6, 0..1],
                    &Tensor::new(&[[[f32::NAN]]], &test_device()).unwrap(),
                )
                .unwrap();
            if !check_values && !test_device().is_cpu() {
                continue; // off the CPU values are checked only with `check_values`
            }
            let e = if composed {
                error_of(ctc_bleu_loss_from_logits_composed(
                    &inside,
                    Some(&lengths),
                    &refs,
                    blank,
                    &cfg,
                ))
            } else {
                error_of(ctc_bleu_loss_from_logits(
                    &inside,
                    Some(&lengths),
                    &refs,
                    blank,
                    &cfg,
                ))
            };
            assert!(e.contains("`logits`") && e.contains("NaN"), "{e}");
        }
    }
}

#[test]
fn multi_reference_clips_at_the_largest_count_in_one_reference() {
    if !f64_supported("multi_reference_clips_at_the_largest_count_in_one_reference") {
        return;
    }
    // Certain output "1 1" (frames 1 _ 1): two unigrams "1"; references "1 2" and "1 1 3".
    let blank = 0u32;
    let refs = references(&[vec![vec![1, 2], vec![1, 1, 3]]], blank);
    let mut values = vec![-1e4f64; 3 * 4];
    for (t, v) in [1usize, 0, 1].iter().enumerate() {
        values[t * 4 + v] = 0.0;
    }
    let logits = Tensor::from_vec(values, (1, 3, 4), &test_device()).unwrap();
    let cfg = BleuLossConfig {
        max_order: 2,
        ..Default::default()
    };
    let out = ctc_bleu_loss_from_logits(&logits, None, &refs, blank, &cfg).unwrap();
    // Unigram "1": count 2, clipped at 2 (the second reference); bigram "1 1": 1 of 1.
    assert_eq!(to_vec2(&out.stats.matches), vec![vec![2.0, 1.0]]);
    assert_eq!(to_vec2(&out.stats.totals), vec![vec![2.0, 1.0]]);
    // Length 2: the closest reference length is 2 (a tie with 3 goes to the shorter).
    assert_eq!(to_vec1(&out.stats.ref_len), vec![2.0]);
}

// ---- Bad input: each a named error -------------------------------------------------------------

fn small_case() -> (Tensor, References) {
    let logits = Tensor::zeros((2, 5, 4), DType::F32, &test_device()).unwrap();
    let refs = references(&[vec![vec![1, 2]], vec![vec![3]]], 0);
    (logits, refs)
}

fn error_of(result: candle_core::Result<impl std::fmt::Debug>) -> String {
    result.expect_err("expected an error").to_string()
}

#[test]
fn a_blank_outside_the_vocabulary_is_refused() {
    let (logits, refs) = small_case();
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        None,
        &refs,
        4,
        &BleuLossConfig::default(),
    ));
    assert!(e.contains("`blank` 4") && e.contains("V = 4"), "{e}");
}

#[test]
fn a_reference_holding_the_blank_is_refused() {
    let (logits, _) = small_case();
    let refs = references(&[vec![vec![1, 2]], vec![vec![3]]], 0);
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        None,
        &refs,
        2,
        &BleuLossConfig::default(),
    ));
    assert!(
        e.contains("reference 0 of batch element 0") && e.contains("blank id 2"),
        "{e}"
    );
}

#[test]
fn the_eos_length_models_are_refused() {
    let (logits, refs) = small_case();
    for length in [
        LengthModel::NotEos { eos_id: 3 },
        LengthModel::SoftEos { eos_id: 3 },
    ] {
        let cfg = BleuLossConfig {
            length,
            ..Default::default()
        };
        let e = error_of(ctc_bleu_loss_from_logits(&logits, None, &refs, 0, &cfg));
        assert!(
            e.contains("`length`") && e.contains("does not apply to CTC outputs"),
            "{e}"
        );
    }
}

#[test]
fn the_paired_and_lower_bound_forms_are_refused() {
    let (logits, refs) = small_case();
    for form in [Form::Paired, Form::LowerBound] {
        let cfg = BleuLossConfig {
            form,
            ..Default::default()
        };
        let e = error_of(ctc_bleu_loss_from_logits(&logits, None, &refs, 0, &cfg));
        assert!(e.contains("`form`") && e.contains("Form::Expected"), "{e}");
    }
}

#[test]
fn matrix_references_are_refused() {
    let (logits, _) = small_case();
    let matrices = Tensor::zeros((2, 3, 4), DType::F32, &test_device()).unwrap();
    let lengths = Tensor::new(&[3u32, 2], &test_device()).unwrap();
    let refs = References::from_matrices(&matrices, &lengths).unwrap();
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        None,
        &refs,
        0,
        &BleuLossConfig::default(),
    ));
    assert!(e.contains("`refs` must be token ids"), "{e}");
}

#[test]
fn input_lengths_beyond_the_frames_are_refused() {
    let (logits, refs) = small_case();
    let lengths = Tensor::new(&[5u32, 6], &test_device()).unwrap();
    let cfg = BleuLossConfig {
        check_values: true,
        ..Default::default()
    };
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        Some(&lengths),
        &refs,
        0,
        &cfg,
    ));
    assert!(e.contains("`input_lengths[1]` = 6 exceeds T' = 5"), "{e}");
}

#[test]
fn input_lengths_of_another_dtype_or_shape_are_refused() {
    let (logits, refs) = small_case();
    let cfg = BleuLossConfig::default();
    for lengths in [
        Tensor::new(&[5f32, 5.0], &test_device()).unwrap(),
        Tensor::new(&[5u32, 5, 5], &test_device()).unwrap(),
    ] {
        let e = error_of(ctc_bleu_loss_from_logits(
            &logits,
            Some(&lengths),
            &refs,
            0,
            &cfg,
        ));
        assert!(
            e.contains("`input_lengths` must be u32, i32 or i64 [2]"),
            "{e}"
        );
    }
}

#[test]
fn a_batch_size_mismatch_is_refused() {
    let (_, refs) = small_case();
    let logits = Tensor::zeros((3, 5, 4), DType::F32, &test_device()).unwrap();
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        None,
        &refs,
        0,
        &BleuLossConfig::default(),
    ));
    assert!(
        e.contains("`refs` has 2 batch elements but `logits` has 3"),
        "{e}"
    );
}

#[test]
fn logits_of_the_wrong_rank_or_dtype_are_refused() {
    let (_, refs) = small_case();
    let cfg = BleuLossConfig::default();
    let flat = Tensor::zeros((2, 20), DType::F32, &test_device()).unwrap();
    let e = error_of(ctc_bleu_loss_from_logits(&flat, None, &refs, 0, &cfg));
    assert!(e.contains("`logits` must be [B, S, V]"), "{e}");
    let ids = Tensor::zeros((2, 5, 4), DType::U32, &test_device()).unwrap();
    let e = error_of(ctc_bleu_loss_from_logits(&ids, None, &refs, 0, &cfg));
    assert!(e.contains("`logits` must be a float tensor"), "{e}");
}

#[test]
fn non_finite_logits_are_refused() {
    let (logits, refs) = small_case();
    let bad = logits
        .to_dtype(DType::F32)
        .unwrap()
        .affine(1.0, 0.0)
        .unwrap()
        .slice_assign(
            &[0..1, 2..3, 1..2],
            &Tensor::new(&[[[f32::NAN]]], &test_device()).unwrap(),
        )
        .unwrap();
    let cfg = BleuLossConfig {
        check_values: true,
        ..Default::default()
    };
    let e = error_of(ctc_bleu_loss_from_logits(&bad, None, &refs, 0, &cfg));
    assert!(e.contains("`logits`") && e.contains("NaN"), "{e}");
}

#[test]
fn an_invalid_order_is_refused() {
    let (logits, refs) = small_case();
    let e = error_of(ctc_expected_counts(&logits, None, &refs, 0, 0));
    assert!(e.contains("max_order"), "{e}");
}

#[test]
fn the_worked_example_of_the_docs() {
    if !f64_supported("the_worked_example_of_the_docs") {
        return;
    }
    // docs/loss.md §17.5: frames over {_, a, b} = ids {0, 1, 2}, reference "a b", N = 2.
    let q = [[0.5f64, 0.5, 0.0], [0.2, 0.6, 0.2], [0.5, 0.0, 0.5]];
    // Logits whose softmax is q: ln q, with -1e4 for 0 (exp underflows to exactly 0).
    let values: Vec<f64> = q
        .iter()
        .flatten()
        .map(|&p| if p > 0.0 { p.ln() } else { -1e4 })
        .collect();
    let logits = Tensor::from_vec(values, (1, 3, 3), &test_device()).unwrap();
    let refs = references(&[vec![vec![1, 2]]], 0);
    let stats = ctc_expected_counts(&logits, None, &refs, 0, 2).unwrap();
    let counts = stats.counts.to_vec3::<f64>().unwrap();
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    close(counts[0][0][0], 0.8); // E[a]
    close(counts[0][0][1], 0.6); // E[b]
    close(counts[0][1][0], 0.45); // E[a b]
    close(to_vec1(&stats.hyp_len)[0], 1.4);
    close(to_vec2(&stats.totals)[0][0], 1.4);
    close(to_vec2(&stats.totals)[0][1], 0.45);
    let cfg = BleuLossConfig {
        max_order: 2,
        smoothing: LossSmoothing::None,
        ..Default::default()
    };
    let out = ctc_bleu_loss_from_logits(&logits, None, &refs, 0, &cfg).unwrap();
    close(to_vec2(&out.stats.matches)[0][0], 1.4);
    close(to_vec2(&out.stats.matches)[0][1], 0.45);
    close(scalar(&out.loss), 2.0 / 1.4 - 1.0);
}

#[test]
fn input_lengths_in_i32_and_i64_give_the_same_loss_as_u32() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(38);
    let (batch, frames, vocab, blank) = (2, 7, 5, 0u32);
    let refs = references(&random_refs(&mut rng, batch, 1, 4, vocab, blank), blank);
    let (_, logits) = random_logits(&mut rng, (batch, frames, vocab), 2.0);
    let cfg = BleuLossConfig::default();
    let loss = |lengths: Tensor| {
        scalar(
            &ctc_bleu_loss_from_logits(&logits, Some(&lengths), &refs, blank, &cfg)
                .unwrap()
                .loss,
        )
    };
    let want = loss(Tensor::new(&[7u32, 4], &test_device()).unwrap());
    assert_eq!(loss(Tensor::new(&[7i64, 4], &test_device()).unwrap()), want);
    assert_eq!(loss(Tensor::new(&[7i32, 4], &test_device()).unwrap()), want);
    assert_ne!(loss(Tensor::new(&[7u32, 5], &test_device()).unwrap()), want);
}

#[test]
fn negative_input_lengths_are_refused() {
    let (logits, refs) = small_case();
    let lengths = Tensor::new(&[5i64, -1], &test_device()).unwrap();
    let cfg = BleuLossConfig {
        check_values: true,
        ..Default::default()
    };
    let e = error_of(ctc_bleu_loss_from_logits(
        &logits,
        Some(&lengths),
        &refs,
        0,
        &cfg,
    ));
    assert!(e.contains("`input_lengths[1]` = -1 is negative"), "{e}");
}

/// The host copies of the module docs' table: without `input_lengths` none; with them one on
/// the CPU (the lengths, which the kernel reads on the host), none off it (the composed ops
/// read them on the device); with `check_values` off the CPU one for the lengths and one for
/// the NaN/Inf check.
#[test]
fn host_copies_are_those_documented() {
    let (logits, refs) = small_case();
    let (batch, frames, _) = logits.dims3().unwrap();
    let lengths = lengths_tensor(&vec![frames; batch]);
    let on_cpu = test_device().is_cpu();
    for check_values in [false, true] {
        let cfg = BleuLossConfig {
            check_values,
            ..Default::default()
        };
        for (given, expected) in [
            (None, usize::from(!on_cpu && check_values)),
            (
                Some(&lengths),
                usize::from(on_cpu) + 2 * usize::from(!on_cpu && check_values),
            ),
        ] {
            let before = candle_bleu::loss::host_copies();
            ctc_bleu_loss_from_logits(&logits, given, &refs, 0, &cfg).unwrap();
            let copies = candle_bleu::loss::host_copies() - before;
            assert_eq!(
                copies as usize,
                expected,
                "check_values {check_values}, lengths {}",
                given.is_some()
            );
        }
    }
}
