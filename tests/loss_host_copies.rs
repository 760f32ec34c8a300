//! Issue 9, item 2: how many device-to-host copies each entry point of the loss makes, counted
//! by `candle_bleu::loss::host_copies()` (every read of tensor data by the loss, on any device,
//! CPU included, so the count on the CPU is what a GPU would see).
//!
//! The default path — id references, `Given` lengths or none — makes none per loss call once
//! the `References` are built, including the first call (the reference side is built from the
//! ids `from_ids` already read). On the CPU the value checks read the data in place (no copy);
//! elsewhere they copy only with `check_values`.

mod common;

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, host_copies, loss_from_stats, BleuLossConfig, Form,
    LengthModel, Reduction, References,
};
use candle_core::{DType, Result, Tensor, D};
use common::*;

/// Copies made by `f`, and its result.
fn copies<T>(f: impl FnOnce() -> Result<T>) -> (u64, T) {
    let before = host_copies();
    let value = f().unwrap();
    (host_copies() - before, value)
}

const B: usize = 2;
const S: usize = 5;
const V: usize = 7;

fn inputs() -> (Tensor, Tensor) {
    let dev = test_device();
    let logits = Tensor::randn(0f32, 1.0, (B, S, V), &dev).unwrap();
    let probs = candle_nn::ops::softmax(&logits, D::Minus1).unwrap();
    (logits, probs)
}

#[test]
fn from_ids_reads_the_ids_once() {
    let dev = test_device();
    let two = Tensor::new(&[[1u32, 2, 3, 0], [4, 5, 0, 0]], &dev).unwrap();
    let three = Tensor::new(&[[[1u32, 2, 3], [1, 2, 0]], [[4, 5, 6], [0, 0, 0]]], &dev).unwrap();
    assert_eq!(copies(|| References::from_ids(&two, PAD)).0, 1);
    assert_eq!(copies(|| References::from_ids(&three, PAD)).0, 1);
}

#[test]
fn from_matrices_reads_the_lengths_and_checks_the_values_off_the_cpu() {
    let dev = test_device();
    let refs = one_hot(&[vec![1, 2, 3], vec![4, 5, 0]], V)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let lengths = Tensor::new(&[3u32, 2], &dev).unwrap();
    // The lengths; the NaN/Inf check of `refs` reads them in place on the CPU, copies elsewhere.
    let check = u64::from(!dev.is_cpu());
    assert_eq!(
        copies(|| References::from_matrices(&refs, &lengths)).0,
        1 + check
    );
}

/// Id references with `Given` lengths (given or `None`), every form and reduction, through
/// both entry points: zero copies on every call, the first included. Under the EOS models id
/// references need none either.
#[test]
fn the_default_path_makes_no_copy() {
    let dev = test_device();
    let ids = Tensor::new(&[[1u32, 2, 3, 4, 0], [2, 5, 6, 0, 0]], &dev).unwrap();
    let refs = References::from_ids(&ids, PAD).unwrap();
    let lengths = Tensor::new(&[5u32, 3], &dev).unwrap();
    let (logits, probs) = inputs();
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
            for length in [
                LengthModel::Given,
                LengthModel::NotEos { eos_id: 6 },
                LengthModel::SoftEos { eos_id: 6 },
            ] {
                let cfg = BleuLossConfig {
                    form,
                    reduction,
                    length,
                    ..Default::default()
                };
                let given = (!matches!(length, LengthModel::SoftEos { .. })).then_some(&lengths);
                for hyp_lengths in [None, given] {
                    for _ in 0..2 {
                        let (n, out) =
                            copies(|| bleu_loss_from_logits(&logits, hyp_lengths, &refs, &cfg));
                        assert_eq!(n, 0, "bleu_loss_from_logits {cfg:?} {hyp_lengths:?}");
                        let (n, _) = copies(|| bleu_loss(&probs, hyp_lengths, &refs, &cfg));
                        assert_eq!(n, 0, "bleu_loss {cfg:?} {hyp_lengths:?}");
                        let (n, _) = copies(|| out.loss.backward());
                        assert_eq!(n, 0, "backward {cfg:?}");
                        let (n, _) = copies(|| loss_from_stats(&out.stats, &cfg));
                        assert_eq!(n, 0, "loss_from_stats {cfg:?}");
                    }
                }
            }
        }
    }
}

/// `check_values` turns on the checks that need the data on the host: in place on the CPU (no
/// copy), one copy per checked tensor elsewhere.
#[test]
fn check_values_copies_only_off_the_cpu() {
    let dev = test_device();
    let refs =
        References::from_ids(&Tensor::new(&[[1u32, 2, 3], [2, 5, 0]], &dev).unwrap(), PAD).unwrap();
    let lengths = Tensor::new(&[5u32, 3], &dev).unwrap();
    let (logits, probs) = inputs();
    let cfg = BleuLossConfig {
        check_values: true,
        ..Default::default()
    };
    let per_check = u64::from(!dev.is_cpu());
    // The probabilities (or logits), then the lengths.
    let (n, out) = copies(|| bleu_loss(&probs, Some(&lengths), &refs, &cfg));
    assert_eq!(n, 2 * per_check);
    assert_eq!(
        copies(|| bleu_loss_from_logits(&logits, None, &refs, &cfg)).0,
        per_check
    );
    // Four statistics, one copy each: the sum, the sum of `t · 0` and the minimum come back
    // together (two reads each, 8 copies, until the H200 run of 2026-11-27 found it).
    assert_eq!(
        copies(|| loss_from_stats(&out.stats, &cfg)).0,
        4 * per_check
    );
}

/// Matrix references under an EOS length model cut each reference at its first EOS row: one
/// copy (an argmax) the first time, none once that side is cached.
#[test]
fn matrix_references_copy_once_per_eos_side() {
    let dev = test_device();
    let refs = one_hot(&[vec![1, 2, 6, 3], vec![4, 5, 0, 0]], V)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let refs = References::from_matrices(&refs, &Tensor::new(&[4u32, 2], &dev).unwrap()).unwrap();
    let (logits, _) = inputs();
    let given = BleuLossConfig::default();
    assert_eq!(
        copies(|| bleu_loss_from_logits(&logits, None, &refs, &given)).0,
        0
    );
    let eos = BleuLossConfig {
        length: LengthModel::NotEos { eos_id: 6 },
        ..Default::default()
    };
    assert_eq!(
        copies(|| bleu_loss_from_logits(&logits, None, &refs, &eos)).0,
        1
    );
    assert_eq!(
        copies(|| bleu_loss_from_logits(&logits, None, &refs, &eos)).0,
        0
    );
}

/// The cached reference side gives the same numbers as a freshly built one, for each key.
#[test]
fn cached_sides_equal_fresh_ones() {
    let dev = test_device();
    let ids = Tensor::new(
        &[
            [[1u32, 2, 6, 3], [1, 2, 0, 0]],
            [[4, 5, 6, 6], [4, 0, 0, 0]],
        ],
        &dev,
    )
    .unwrap();
    let shared = References::from_ids(&ids, PAD).unwrap();
    let (logits, _) = inputs();
    for max_order in [2, 4] {
        for length in [LengthModel::Given, LengthModel::NotEos { eos_id: 6 }] {
            for dtype in [DType::F32, DType::F64] {
                if dtype == DType::F64 && !f64_supported("cached_sides_equal_fresh_ones f64") {
                    continue;
                }
                let cfg = BleuLossConfig {
                    max_order,
                    length,
                    ..Default::default()
                };
                let x = logits.to_dtype(dtype).unwrap();
                let cached = bleu_loss_from_logits(&x, None, &shared, &cfg).unwrap();
                let fresh_refs = References::from_ids(&ids, PAD).unwrap();
                let fresh = bleu_loss_from_logits(&x, None, &fresh_refs, &cfg).unwrap();
                assert_eq!(
                    scalar(&cached.loss),
                    scalar(&fresh.loss),
                    "{cfg:?} {dtype:?}"
                );
                assert_eq!(
                    to_vec2(&cached.stats.matches),
                    to_vec2(&fresh.stats.matches)
                );
                assert_eq!(
                    to_vec1(&cached.stats.ref_len),
                    to_vec1(&fresh.stats.ref_len)
                );
            }
        }
    }
}

/// The effective reference length is chosen on the device: nearest to `c`, the shorter on a
/// tie, padding (elements with fewer references) never chosen.
#[test]
fn closest_reference_length_on_the_device() {
    let dev = test_device();
    // Element 0: references of lengths 3 and 7 around c = 5 (a tie: 3); element 1: one
    // reference of length 2 (the second row is padding) and c = 5.
    let ids = Tensor::new(
        &[
            [[1u32, 2, 3, 0, 0, 0, 0], [1, 2, 3, 4, 5, 6, 1]],
            [[4, 5, 0, 0, 0, 0, 0], [0; 7]],
        ],
        &dev,
    )
    .unwrap();
    let refs = References::from_ids(&ids, PAD).unwrap();
    let (logits, _) = inputs();
    let out = bleu_loss_from_logits(&logits, None, &refs, &BleuLossConfig::default()).unwrap();
    assert_eq!(to_vec1(&out.stats.ref_len), [3.0, 2.0]);
    // c = 4 and 6: nearest 3 and 7 (element 0), 2 (element 1).
    for (length, want) in [(4u32, 3.0), (6, 7.0)] {
        let lengths = Tensor::new(&[length, length], &dev).unwrap();
        let out = bleu_loss_from_logits(
            &logits.pad_with_zeros(1, 0, 2).unwrap(),
            Some(&lengths),
            &refs,
            &BleuLossConfig::default(),
        )
        .unwrap();
        assert_eq!(to_vec1(&out.stats.ref_len), [want, 2.0], "c = {length}");
    }
}

/// The BLEU loss on CTC outputs with its input lengths. Off the CPU, no copy with
/// `check_values` off (the lengths stay on the device: the frame mask, or with
/// `cuda-unverified` the n-gram kernels read them there), and with it on one copy of the
/// lengths and one of the logits. On the CPU the kernel reads the `B` lengths (one read, the
/// same with the checks on, which read the logits in place).
#[test]
fn the_bleu_loss_on_ctc_outputs_copies_nothing_off_the_cpu_without_value_checks() {
    use candle_bleu::loss::ctc_bleu_loss_from_logits;
    let dev = test_device();
    let refs =
        References::from_ids(&Tensor::new(&[[1u32, 2, 3], [2, 5, 0]], &dev).unwrap(), PAD).unwrap();
    let logits = Tensor::randn(0f32, 1.0, (B, 6, V), &dev).unwrap();
    let lengths = Tensor::new(&[6u32, 4], &dev).unwrap();
    let blank = 6;
    let expected = if dev.is_cpu() {
        [(false, 1), (true, 1)]
    } else {
        [(false, 0), (true, 2)]
    };
    for (check_values, expected) in expected {
        let cfg = BleuLossConfig {
            check_values,
            ..Default::default()
        };
        let (n, out) =
            copies(|| ctc_bleu_loss_from_logits(&logits, Some(&lengths), &refs, blank, &cfg));
        assert!(out
            .loss
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            .is_finite());
        assert_eq!(n, expected, "check_values {check_values}");
    }
}

/// The cross-entropy and a training step read no target to the host with the value checks off
/// (the count stays on the device; off the CPU with `cuda-unverified`), and one small copy per
/// call off the CPU with them on (in place on the CPU) or with class weights, whose mean needs
/// `Σ w_t`.
#[test]
fn the_cross_entropy_reads_its_targets_only_with_value_checks_or_class_weights() {
    use candle_bleu::loss::{
        ce_bleu_from_logits, cross_entropy_from_logits, CrossEntropyConfig, TrainingLossConfig,
        TrainingTargets,
    };
    let dev = test_device();
    let (logits, _) = inputs();
    let targets = Tensor::new(&[[1u32, 2, 3, 0, 0], [2, 5, 6, 1, 0]], &dev).unwrap();
    let refs = References::from_ids(&targets, PAD).unwrap();
    let per_check = u64::from(!dev.is_cpu());
    // Counted on the device only in the `cuda-unverified` build (not yet run on a GPU).
    let unchecked = if cfg!(feature = "cuda-unverified") {
        0
    } else {
        per_check
    };
    for (check_values, class_weights, expected) in [
        (false, None, unchecked),
        (true, None, per_check),
        (false, Some(vec![1.0; V].into()), per_check),
    ] {
        let ce = CrossEntropyConfig {
            pad_id: Some(PAD),
            check_values,
            class_weights,
            ..Default::default()
        };
        let what = format!(
            "check_values {check_values}, class weights {}",
            ce.class_weights.is_some()
        );
        assert_eq!(
            copies(|| cross_entropy_from_logits(&logits, &targets, &ce)).0,
            expected,
            "cross_entropy_from_logits, {what}"
        );
        let cfg = TrainingLossConfig {
            ce,
            ..Default::default()
        };
        let step_targets = TrainingTargets::new(&targets, &refs);
        assert_eq!(
            copies(|| ce_bleu_from_logits(&logits, &step_targets, &cfg)).0,
            expected,
            "ce_bleu_from_logits, {what}"
        );
    }
}
