//! Issue 5, item 1 (loss side): every bad input to the loss API is an `Err` whose message names
//! the argument and its shape, dtype or value — never a panic (every call runs under
//! `catch_unwind`), never a loss.

mod common;

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, loss_from_stats, BleuLossConfig, BleuLossOutput, Form,
    LengthModel, LossSmoothing, Reduction, References,
};
use candle_core::{DType, Result, Tensor};
use common::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

type LossFn = fn(&Tensor, Option<&Tensor>, &References, &BleuLossConfig) -> Result<BleuLossOutput>;

/// Both entry points, with the name their first argument has in error messages.
const PATHS: [(&str, LossFn); 2] = [("hyp_probs", bleu_loss), ("logits", bleu_loss_from_logits)];

const B: usize = 2;
const S: usize = 5;
const V: usize = 6;

/// Runs `f` under `catch_unwind` and returns its error message; fails the test if `f` panics
/// or succeeds, or if the message lacks any of `needles`.
fn assert_err<T>(what: &str, f: impl FnOnce() -> Result<T>, needles: &[&str]) -> String {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Err(_) => panic!("{what}: panicked instead of returning an error"),
        Ok(Ok(_)) => panic!("{what}: accepted a bad input"),
        Ok(Err(e)) => e.to_string(),
    };
    for needle in needles {
        assert!(
            message.contains(needle),
            "{what}: error {message:?} does not mention {needle:?}"
        );
    }
    message
}

/// Runs `f` under `catch_unwind` and fails the test if it panics or errs.
fn assert_ok<T>(what: &str, f: impl FnOnce() -> Result<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Err(_) => panic!("{what}: panicked"),
        Ok(Err(e)) => panic!("{what}: unexpected error {e}"),
        Ok(Ok(value)) => value,
    }
}

/// Two elements over a vocabulary of 6: references `[1 2 3]` and `[2 4]` (pad 0).
fn refs() -> References {
    let ids = Tensor::new(&[[1u32, 2, 3, 0], [2, 4, 0, 0]], &test_device()).unwrap();
    References::from_ids(&ids, PAD).unwrap()
}

/// Logits `[2, 5, 6]` in f64 (also a valid probability-like input: the checks under test come
/// before any arithmetic).
fn logits(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let values: Vec<f64> = (0..n).map(|i| ((i * 7) % 11) as f64 / 11.0).collect();
    Tensor::from_vec(values, shape, &test_device()).unwrap()
}

fn probs() -> Tensor {
    candle_nn::ops::softmax(&logits(&[B, S, V]), candle_core::D::Minus1).unwrap()
}

fn valid_input(name: &str) -> Tensor {
    if name == "logits" {
        logits(&[B, S, V])
    } else {
        probs()
    }
}

fn lengths(values: &[u32]) -> Tensor {
    Tensor::new(values, &test_device()).unwrap()
}

#[test]
fn the_fixture_itself_is_valid() {
    if !f64_supported("the_fixture_itself_is_valid") {
        return;
    }
    for (name, loss) in PATHS {
        for cfg in all_configs(4, 5) {
            let hyp_lengths = lengths(&[5, 3]);
            let given =
                (!matches!(cfg.length, LengthModel::SoftEos { .. })).then_some(&hyp_lengths);
            let out = assert_ok(name, || loss(&valid_input(name), given, &refs(), &cfg));
            assert!(scalar(&out.loss).is_finite());
        }
    }
}

#[test]
fn wrong_rank_of_the_hypotheses() {
    if !f64_supported("wrong_rank_of_the_hypotheses") {
        return;
    }
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        for shape in [vec![B, V], vec![1, B, S, V], vec![V]] {
            assert_err(
                &format!("{name} of shape {shape:?}"),
                || loss(&logits(&shape), None, &refs(), &cfg),
                &[&format!("`{name}`"), "[B, S, V]", &format!("{shape:?}")],
            );
        }
        let scalar_input = Tensor::new(1.0f64, &test_device()).unwrap();
        assert_err(
            &format!("scalar {name}"),
            || loss(&scalar_input, None, &refs(), &cfg),
            &[&format!("`{name}`"), "[B, S, V]", "[]"],
        );
    }
}

#[test]
fn wrong_dtype_of_the_hypotheses() {
    if !f64_supported("wrong_dtype_of_the_hypotheses") {
        return;
    }
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        for dtype in [DType::U32, DType::I64, DType::U8] {
            let input = Tensor::zeros((B, S, V), dtype, &test_device()).unwrap();
            assert_err(
                &format!("{name} of dtype {dtype:?}"),
                || loss(&input, None, &refs(), &cfg),
                &[&format!("`{name}`"), "float", &format!("{dtype:?}")],
            );
        }
    }
}

#[test]
fn batch_mismatch_between_hypotheses_and_references() {
    if !f64_supported("batch_mismatch_between_hypotheses_and_references") {
        return;
    }
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        for batch in [1, 3] {
            let shape = [batch, S, V];
            assert_err(
                &format!("{name} with batch {batch}"),
                || loss(&logits(&shape), None, &refs(), &cfg),
                &[
                    "`refs`",
                    "2 batch elements",
                    &format!("`{name}`"),
                    &format!("{shape:?}"),
                ],
            );
        }
    }
}

#[test]
fn bad_hyp_lengths() {
    if !f64_supported("bad_hyp_lengths") {
        return;
    }
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        let input = valid_input(name);
        // Batch mismatch between hypotheses and lengths.
        for bad in [lengths(&[5]), lengths(&[5, 3, 1])] {
            let dims = format!("{:?}", bad.dims());
            assert_err(
                &format!("{name}: hyp_lengths {dims}"),
                || loss(&input, Some(&bad), &refs(), &cfg),
                &["`hyp_lengths`", "u32 [2]", &dims],
            );
        }
        // Wrong rank.
        let matrix = Tensor::new(&[[5u32], [3]], &test_device()).unwrap();
        assert_err(
            &format!("{name}: hyp_lengths [2, 1]"),
            || loss(&input, Some(&matrix), &refs(), &cfg),
            &["`hyp_lengths`", "[2, 1]"],
        );
        // Wrong dtype.
        for dtype in [DType::F32, DType::I64, DType::F64] {
            let bad = lengths(&[5, 3]).to_dtype(dtype).unwrap();
            assert_err(
                &format!("{name}: hyp_lengths {dtype:?}"),
                || loss(&input, Some(&bad), &refs(), &cfg),
                &["`hyp_lengths`", "u32", &format!("{dtype:?}")],
            );
        }
        // Longer than S (checked in place on the CPU; elsewhere with `check_values`).
        let cfg = BleuLossConfig {
            check_values: true,
            ..Default::default()
        };
        let too_long = lengths(&[5, 6]);
        assert_err(
            &format!("{name}: hyp_lengths > S"),
            || loss(&input, Some(&too_long), &refs(), &cfg),
            &["`hyp_lengths[1]` = 6", "S = 5"],
        );
        let far_too_long = lengths(&[u32::MAX, 1]);
        assert_err(
            &format!("{name}: hyp_lengths = u32::MAX"),
            || loss(&input, Some(&far_too_long), &refs(), &cfg),
            &["`hyp_lengths[0]` = 4294967295", "S = 5"],
        );
    }
}

#[test]
fn reference_id_outside_the_vocabulary() {
    if !f64_supported("reference_id_outside_the_vocabulary") {
        return;
    }
    let cfg = BleuLossConfig::default();
    let out_of_vocab = Tensor::new(&[[1u32, 2, 3], [2, 6, 0]], &test_device()).unwrap();
    let refs = References::from_ids(&out_of_vocab, PAD).unwrap();
    for (name, loss) in PATHS {
        assert_err(
            &format!("{name}: reference id 6 with V = 6"),
            || loss(&valid_input(name), None, &refs, &cfg),
            &["`refs`", "id 6", "batch element 1", "V = 6"],
        );
    }
    // The same through several references per element.
    let three_d = Tensor::new(
        &[[[1u32, 2, 0], [0, 0, 0]], [[2, 4, 0], [3, 1000, 1]]],
        &test_device(),
    )
    .unwrap();
    let refs = References::from_ids(&three_d, PAD).unwrap();
    for (name, loss) in PATHS {
        assert_err(
            &format!("{name}: reference id 1000"),
            || loss(&valid_input(name), None, &refs, &cfg),
            &[
                "`refs`",
                "id 1000",
                "reference 1",
                "batch element 1",
                "V = 6",
            ],
        );
    }
}

#[test]
fn eos_id_outside_the_vocabulary() {
    if !f64_supported("eos_id_outside_the_vocabulary") {
        return;
    }
    for (name, loss) in PATHS {
        for length in [
            LengthModel::NotEos { eos_id: 6 },
            LengthModel::SoftEos { eos_id: 6 },
        ] {
            let cfg = BleuLossConfig {
                length,
                ..Default::default()
            };
            assert_err(
                &format!("{name}: {length:?}"),
                || loss(&valid_input(name), None, &refs(), &cfg),
                &["`eos_id` 6", "V = 6", &format!("`{name}`")],
            );
        }
    }
}

#[test]
fn soft_eos_takes_no_hard_lengths() {
    if !f64_supported("soft_eos_takes_no_hard_lengths") {
        return;
    }
    let cfg = BleuLossConfig {
        length: LengthModel::SoftEos { eos_id: 5 },
        ..Default::default()
    };
    for (name, loss) in PATHS {
        let given = lengths(&[5, 3]);
        assert_err(
            &format!("{name}: SoftEos with lengths"),
            || loss(&valid_input(name), Some(&given), &refs(), &cfg),
            &["`hyp_lengths`", "None", "SoftEos"],
        );
    }
}

/// Invalid configurations, checked by both entry points and by `loss_from_stats`.
fn bad_configs() -> Vec<(BleuLossConfig, Vec<&'static str>)> {
    let with =
        |max_order: usize, weights: Option<Vec<f64>>, smoothing: LossSmoothing| BleuLossConfig {
            max_order,
            weights,
            smoothing,
            ..Default::default()
        };
    let add1 = LossSmoothing::AddK(1.0);
    vec![
        (with(0, None, add1), vec!["`max_order`", "0"]),
        (with(0, Some(vec![]), add1), vec!["`max_order`", "0"]),
        (
            with(4, Some(vec![0.5, 0.5]), add1),
            vec!["`weights`", "2 entries", "`max_order` is 4"],
        ),
        (
            with(2, Some(vec![0.25; 4]), add1),
            vec!["`weights`", "4 entries", "`max_order` is 2"],
        ),
        (
            with(3, Some(vec![0.5, -0.5, 1.0]), add1),
            vec!["`weights`", "weights[1] = -0.5"],
        ),
        (
            with(3, Some(vec![0.5, 0.5, f64::NAN]), add1),
            vec!["`weights`", "weights[2] = NaN"],
        ),
        (
            with(2, Some(vec![f64::INFINITY, 0.5]), add1),
            vec!["`weights`", "weights[0] = inf"],
        ),
        (
            with(4, None, LossSmoothing::AddK(-1.0)),
            vec!["AddK(-1)", "k >= 0"],
        ),
        (
            with(4, None, LossSmoothing::AddK(f64::NAN)),
            vec!["AddK(NaN)", "finite"],
        ),
        (
            with(4, None, LossSmoothing::AddK(f64::INFINITY)),
            vec!["AddK(inf)", "finite"],
        ),
    ]
}

#[test]
fn invalid_configurations() {
    if !f64_supported("invalid_configurations") {
        return;
    }
    for (cfg, needles) in bad_configs() {
        for (name, loss) in PATHS {
            assert_err(
                &format!("{name}: {cfg:?}"),
                || loss(&valid_input(name), None, &refs(), &cfg),
                &needles,
            );
        }
        let n = cfg.max_order.max(1);
        let stats = Tensor::ones((B, n), DType::F64, &test_device()).unwrap();
        let lens = Tensor::ones(B, DType::F64, &test_device()).unwrap();
        assert_err(
            &format!("loss_from_stats: {cfg:?}"),
            || loss_from_stats(&stats_of(&stats, &stats, &lens, &lens), &cfg),
            &needles,
        );
    }
}

/// A row of 37 entries (not a multiple of any SIMD width) with one bad value at `position`.
fn poisoned(dtype: DType, bad: f64, position: usize) -> Tensor {
    let (batch, seq, vocab) = (B, 3, 37);
    let mut values: Vec<f64> = (0..batch * seq * vocab)
        .map(|i| ((i * 13) % 17) as f64 / 17.0)
        .collect();
    values[position] = bad;
    Tensor::from_vec(values, (batch, seq, vocab), &test_device())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[test]
fn nan_or_inf_in_probabilities_or_logits() {
    if !f64_supported("nan_or_inf_in_probabilities_or_logits") {
        return;
    }
    let refs37 = References::from_ids(
        &Tensor::new(&[[1u32, 30, 36, 0], [2, 4, 0, 0]], &test_device()).unwrap(),
        PAD,
    )
    .unwrap();
    let one_hot_refs = References::from_matrices(
        &one_hot(&[vec![1, 30, 36], vec![2, 4, 36]], 37).unwrap(),
        &lengths(&[3, 2]),
    )
    .unwrap();
    let positions = [0, 36, 37 + 18, 2 * 3 * 37 - 1];
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            for &position in &positions {
                let input = poisoned(dtype, bad, position);
                for (name, loss) in PATHS {
                    // Each form and reference kind reaches a different kernel on the logits
                    // path: softmax-gather, softmax-self-match-gather, plain softmax.
                    for (form, refs) in [
                        (Form::Expected, &refs37),
                        (Form::Paired, &refs37),
                        (Form::LowerBound, &refs37),
                        (Form::Expected, &one_hot_refs),
                    ] {
                        for length in [LengthModel::Given, LengthModel::SoftEos { eos_id: 36 }] {
                            // Off the CPU the check is the opt-in `check_values`.
                            let cfg = BleuLossConfig {
                                form,
                                length,
                                check_values: true,
                                ..Default::default()
                            };
                            assert_err(
                                &format!(
                                    "{name} {dtype:?} with {bad} at {position}, {form:?}, {length:?}, ids {}",
                                    refs.is_ids()
                                ),
                                || loss(&input, None, refs, &cfg),
                                &[&format!("`{name}`"), "NaN or infinite"],
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn empty_batch_or_empty_dimensions() {
    if !f64_supported("empty_batch_or_empty_dimensions") {
        return;
    }
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        for shape in [[0, S, V], [B, 0, V], [B, S, 0], [0, 0, 0]] {
            assert_err(
                &format!("{name} of shape {shape:?}"),
                || loss(&logits(&shape), None, &refs(), &cfg),
                &[&format!("`{name}`"), &format!("{shape:?}")],
            );
        }
        // Lengths that fit S = 0 do not make it valid.
        let zero_lengths = lengths(&[0, 0]);
        assert_err(
            &format!("{name} with S = 0 and lengths 0"),
            || loss(&logits(&[B, 0, V]), Some(&zero_lengths), &refs(), &cfg),
            &[&format!("`{name}`"), "[2, 0, 6]"],
        );
    }
}

#[test]
fn from_ids_rejects_bad_tensors() {
    if !f64_supported("from_ids_rejects_bad_tensors") {
        return;
    }
    let dev = &test_device();
    for dtype in [DType::F32, DType::I64, DType::U8, DType::F64] {
        let ids = Tensor::ones((B, 4), dtype, dev).unwrap();
        assert_err(
            &format!("from_ids {dtype:?}"),
            || References::from_ids(&ids, PAD),
            &["`ids`", "u32", &format!("{dtype:?}"), "[2, 4]"],
        );
    }
    for shape in [vec![4], vec![1, 2, 3, 4], vec![]] {
        let n: usize = shape.iter().product();
        let ids = Tensor::from_vec(vec![1u32; n], shape.as_slice(), dev).unwrap();
        assert_err(
            &format!("from_ids of shape {shape:?}"),
            || References::from_ids(&ids, PAD),
            &["`ids`", "[B, T] or [B, R, T]", &format!("{shape:?}")],
        );
    }
    for shape in [vec![0, 4], vec![0, 2, 4], vec![0, 0]] {
        let ids = Tensor::zeros(shape.as_slice(), DType::U32, dev).unwrap();
        assert_err(
            &format!("from_ids of shape {shape:?}"),
            || References::from_ids(&ids, PAD),
            &["empty batch", &format!("{shape:?}")],
        );
    }
}

#[test]
fn from_ids_rejects_an_element_with_only_padding() {
    if !f64_supported("from_ids_rejects_an_element_with_only_padding") {
        return;
    }
    let dev = &test_device();
    let cases: Vec<(Tensor, u32, usize)> = vec![
        // Second element's single reference is padding.
        (Tensor::new(&[[1u32, 2, 0], [0, 0, 0]], dev).unwrap(), 0, 1),
        // Padding id other than 0.
        (Tensor::new(&[[9u32, 9, 9], [1, 9, 9]], dev).unwrap(), 9, 0),
        // Every reference row of element 0 is padding.
        (
            Tensor::new(&[[[0u32, 0], [0, 0]], [[1, 0], [0, 0]]], dev).unwrap(),
            0,
            0,
        ),
        // T = 0: nothing at all.
        (Tensor::zeros((B, 0), DType::U32, dev).unwrap(), 0, 0),
        // R = 0: no reference rows.
        (Tensor::zeros((B, 0, 3), DType::U32, dev).unwrap(), 0, 0),
    ];
    for (ids, pad, element) in cases {
        let dims = format!("{:?}", ids.dims());
        assert_err(
            &format!("from_ids {dims} pad {pad}"),
            || References::from_ids(&ids, pad),
            &[
                &format!("batch element {element} has no reference"),
                &format!("padding {pad}"),
                &dims,
            ],
        );
    }
    // A padding id before the last real token is a token, not padding: accepted.
    let inner = Tensor::new(&[[0u32, 0, 3], [1, 0, 0]], dev).unwrap();
    assert_ok("inner padding", || References::from_ids(&inner, 0));
}

#[test]
fn from_matrices_rejects_bad_tensors() {
    if !f64_supported("from_matrices_rejects_bad_tensors") {
        return;
    }
    let dev = &test_device();
    let good = one_hot(&[vec![1, 2, 3], vec![2, 4, 0]], V).unwrap();
    let good_lengths = lengths(&[3, 2]);
    assert_ok("valid matrices", || {
        References::from_matrices(&good, &good_lengths)
    });
    for shape in [vec![B, V], vec![1, B, 3, V]] {
        let refs = Tensor::zeros(shape.as_slice(), DType::F64, dev).unwrap();
        assert_err(
            &format!("from_matrices of shape {shape:?}"),
            || References::from_matrices(&refs, &good_lengths),
            &["`refs`", "[B, T, V]", &format!("{shape:?}")],
        );
    }
    let ints = good.to_dtype(DType::U32).unwrap();
    assert_err(
        "from_matrices u32",
        || References::from_matrices(&ints, &good_lengths),
        &["`refs`", "float", "U32"],
    );
    let empty = Tensor::zeros((0, 3, V), DType::F64, dev).unwrap();
    assert_err(
        "from_matrices empty batch",
        || References::from_matrices(&empty, &lengths(&[])),
        &["empty batch", "[0, 3, 6]"],
    );
    // Lengths: wrong dtype, shape, batch; 0; above T.
    for (bad, needles) in [
        (
            good_lengths.to_dtype(DType::I64).unwrap(),
            vec!["`lengths`", "u32 [2]", "I64"],
        ),
        (
            good_lengths.to_dtype(DType::F32).unwrap(),
            vec!["`lengths`", "u32 [2]", "F32"],
        ),
        (lengths(&[3]), vec!["`lengths`", "u32 [2]", "[1]"]),
        (lengths(&[3, 2, 1]), vec!["`lengths`", "u32 [2]", "[3]"]),
        (
            Tensor::new(&[[3u32, 2]], dev).unwrap(),
            vec!["`lengths`", "[1, 2]"],
        ),
        (lengths(&[3, 0]), vec!["`lengths[1]` = 0", "1..=3"]),
        (lengths(&[4, 2]), vec!["`lengths[0]` = 4", "1..=3"]),
    ] {
        assert_err(
            &format!("from_matrices lengths {bad:?}"),
            || References::from_matrices(&good, &bad),
            &needles,
        );
    }
    // T = 0: no length is valid.
    let no_rows = Tensor::zeros((B, 0, V), DType::F64, dev).unwrap();
    assert_err(
        "from_matrices T = 0",
        || References::from_matrices(&no_rows, &lengths(&[0, 0])),
        &["`lengths[0]` = 0", "1..=0"],
    );
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for dtype in [DType::F32, DType::F64] {
            let mut values = good.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            values[7] = bad;
            let poisoned = Tensor::from_vec(values, good.dims(), dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            assert_err(
                &format!("from_matrices with {bad} ({dtype:?})"),
                || References::from_matrices(&poisoned, &good_lengths),
                &["`refs`", "NaN or infinite"],
            );
        }
    }
}

#[test]
fn matrix_references_of_another_vocabulary() {
    if !f64_supported("matrix_references_of_another_vocabulary") {
        return;
    }
    let refs = References::from_matrices(
        &one_hot(&[vec![1, 2, 3], vec![2, 4, 0]], V + 1).unwrap(),
        &lengths(&[3, 2]),
    )
    .unwrap();
    let cfg = BleuLossConfig::default();
    for (name, loss) in PATHS {
        assert_err(
            &format!("{name}: matrices with V = 7"),
            || loss(&valid_input(name), None, &refs, &cfg),
            &["`refs`", "vocabulary 7", "[2, 3, 7]", "V = 6"],
        );
    }
}

#[test]
fn loss_from_stats_rejects_bad_statistics() {
    if !f64_supported("loss_from_stats_rejects_bad_statistics") {
        return;
    }
    let dev = &test_device();
    let cfg = BleuLossConfig::default();
    let ok_stats = Tensor::ones((B, 4), DType::F64, dev).unwrap();
    let ok_len = Tensor::ones(B, DType::F64, dev).unwrap();
    assert_ok("valid statistics", || {
        loss_from_stats(&stats_of(&ok_stats, &ok_stats, &ok_len, &ok_len), &cfg)
    });
    let zeros = |shape: &[usize], dtype: DType| Tensor::zeros(shape, dtype, dev).unwrap();
    // `matches` of the wrong rank or order count.
    for shape in [vec![4], vec![B, 4, 1]] {
        let m = zeros(&shape, DType::F64);
        assert_err(
            &format!("matches {shape:?}"),
            || loss_from_stats(&stats_of(&m, &ok_stats, &ok_len, &ok_len), &cfg),
            &["`stats.matches`", "[B, N]", &format!("{shape:?}")],
        );
    }
    let three_orders = zeros(&[B, 3], DType::F64);
    assert_err(
        "matches with 3 orders",
        || {
            loss_from_stats(
                &stats_of(&three_orders, &three_orders, &ok_len, &ok_len),
                &cfg,
            )
        },
        &["`stats.matches`", "3 orders", "[2, 3]", "`max_order` is 4"],
    );
    // `totals` of another shape.
    for shape in [vec![B, 3], vec![3, 4], vec![B * 4]] {
        let t = zeros(&shape, DType::F64);
        assert_err(
            &format!("totals {shape:?}"),
            || loss_from_stats(&stats_of(&ok_stats, &t, &ok_len, &ok_len), &cfg),
            &["`stats.totals`", &format!("{shape:?}"), "[2, 4]"],
        );
    }
    // Lengths of another batch or rank.
    for shape in [vec![3], vec![B, 1], vec![]] {
        let l = zeros(&shape, DType::F64);
        assert_err(
            &format!("hyp_len {shape:?}"),
            || loss_from_stats(&stats_of(&ok_stats, &ok_stats, &l, &ok_len), &cfg),
            &["`stats.hyp_len`", "[2]", &format!("{shape:?}")],
        );
        assert_err(
            &format!("ref_len {shape:?}"),
            || loss_from_stats(&stats_of(&ok_stats, &ok_stats, &ok_len, &l), &cfg),
            &["`stats.ref_len`", "[2]", &format!("{shape:?}")],
        );
    }
    // Integer statistics.
    for dtype in [DType::U32, DType::I64] {
        let m = zeros(&[B, 4], dtype);
        assert_err(
            &format!("matches {dtype:?}"),
            || loss_from_stats(&stats_of(&m, &ok_stats, &ok_len, &ok_len), &cfg),
            &["`stats.matches`", "float", &format!("{dtype:?}")],
        );
    }
    // An empty batch, under both reductions.
    for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
        let cfg = BleuLossConfig {
            reduction,
            ..Default::default()
        };
        let m = zeros(&[0, 4], DType::F64);
        let l = zeros(&[0], DType::F64);
        assert_err(
            &format!("empty batch, {reduction:?}"),
            || loss_from_stats(&stats_of(&m, &m, &l, &l), &cfg),
            &["empty batch", "`stats.matches`", "[0, 4]"],
        );
    }
    // NaN or infinite statistics (in place on the CPU, with `check_values` elsewhere).
    let cfg = BleuLossConfig {
        check_values: true,
        ..cfg
    };
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let poisoned_stats = Tensor::new(&[[1.0, 1.0, bad, 1.0], [1.0; 4]], dev).unwrap();
        let poisoned_len = Tensor::new(&[1.0, bad], dev).unwrap();
        for dtype in [DType::F32, DType::F64] {
            let s = poisoned_stats.to_dtype(dtype).unwrap();
            let l = poisoned_len.to_dtype(dtype).unwrap();
            let good_s = ok_stats.to_dtype(dtype).unwrap();
            let good_l = ok_len.to_dtype(dtype).unwrap();
            assert_err(
                &format!("matches with {bad}"),
                || loss_from_stats(&stats_of(&s, &good_s, &good_l, &good_l), &cfg),
                &["`stats.matches`", "NaN or infinite"],
            );
            assert_err(
                &format!("totals with {bad}"),
                || loss_from_stats(&stats_of(&good_s, &s, &good_l, &good_l), &cfg),
                &["`stats.totals`", "NaN or infinite"],
            );
            assert_err(
                &format!("hyp_len with {bad}"),
                || loss_from_stats(&stats_of(&good_s, &good_s, &l, &good_l), &cfg),
                &["`stats.hyp_len`", "NaN or infinite"],
            );
            assert_err(
                &format!("ref_len with {bad}"),
                || loss_from_stats(&stats_of(&good_s, &good_s, &good_l, &l), &cfg),
                &["`stats.ref_len`", "NaN or infinite"],
            );
        }
    }
    // Negative statistics: no text gives them, and they used to be scored as a finite loss
    // (matches −1, hyp_len −5).
    for dtype in [DType::F32, DType::F64] {
        let good_s = ok_stats.to_dtype(dtype).unwrap();
        let good_l = ok_len.to_dtype(dtype).unwrap();
        let negative_s = Tensor::new(&[[1.0, -1.0, 1.0, 1.0], [1.0; 4]], dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let negative_l = Tensor::new(&[-5.0, 1.0], dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for (name, stats) in [
            ("matches", stats_of(&negative_s, &good_s, &good_l, &good_l)),
            ("totals", stats_of(&good_s, &negative_s, &good_l, &good_l)),
            ("hyp_len", stats_of(&good_s, &good_s, &negative_l, &good_l)),
            ("ref_len", stats_of(&good_s, &good_s, &good_l, &negative_l)),
        ] {
            assert_err(
                &format!("negative {name} {dtype:?}"),
                || loss_from_stats(&stats, &cfg),
                &[&format!("`stats.{name}`"), "negative"],
            );
        }
    }
    // Large finite f32 statistics whose f32 sum overflows are finite, not refused as "NaN or
    // infinite": the finiteness check is exact for every finite value.
    let huge = Tensor::new(
        &[[f32::MAX, f32::MAX, 1.0, 1.0], [f32::MAX, 1.0, 1.0, 1.0]],
        dev,
    )
    .unwrap();
    let huge_len = Tensor::new(&[f32::MAX, f32::MAX], dev).unwrap();
    assert_ok("statistics near f32::MAX", || {
        loss_from_stats(&stats_of(&huge, &huge, &huge_len, &huge_len), &cfg)
    });
}
