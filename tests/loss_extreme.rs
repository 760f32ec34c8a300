//! Issue 5, item 2: extreme but valid inputs give a finite loss and finite gradients (every
//! entry checked) for every form × length model × reduction × smoothing, through
//! `bleu_loss(softmax(x))`, `bleu_loss_from_logits(x)` and `bleu_loss(P)` on probabilities
//! directly; and the loss equals the value derived by hand from the guards of docs/loss.md, §10.3 where the
//! inputs make it easy.

mod common;

use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, loss_from_stats, BleuLossConfig, Form, LengthModel,
    LossSmoothing, Reduction, References, PRECISION_FLOOR,
};
use candle_core::{DType, Result, Tensor, Var, D};
use common::*;

/// How the tensor under test reaches the loss.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Path {
    /// `bleu_loss(candle_nn::ops::softmax(x))`.
    Softmax,
    /// `bleu_loss_from_logits(x)`.
    Logits,
    /// `bleu_loss(x)`: `x` is already the probabilities.
    Probs,
}

/// The loss, its statistics and the gradient with respect to `x`, all as f64.
#[derive(Debug)]
struct Outcome {
    loss: f64,
    grad: Vec<f64>,
    stats: Vec<f64>,
}

fn flat(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// `hyp_lengths` as the length model allows: `SoftEos` takes none.
fn lengths_for<'a>(cfg: &BleuLossConfig, lengths: Option<&'a Tensor>) -> Option<&'a Tensor> {
    match cfg.length {
        LengthModel::SoftEos { .. } => None,
        _ => lengths,
    }
}

fn evaluate(
    x: &Tensor,
    path: Path,
    lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<Outcome> {
    let var = Var::from_tensor(x)?;
    let lengths = lengths_for(cfg, lengths);
    let out = match path {
        Path::Softmax => bleu_loss(
            &candle_nn::ops::softmax(var.as_tensor(), D::Minus1)?,
            lengths,
            refs,
            cfg,
        )?,
        Path::Logits => bleu_loss_from_logits(var.as_tensor(), lengths, refs, cfg)?,
        Path::Probs => bleu_loss(var.as_tensor(), lengths, refs, cfg)?,
    };
    let grads = out.loss.backward()?;
    // A loss that does not depend on `x` at all leaves no gradient: nothing non-finite.
    let grad = grads.get(&var).map(flat).unwrap_or_default();
    let mut stats = flat(&out.stats.matches);
    stats.extend(flat(&out.stats.totals));
    stats.extend(flat(&out.stats.hyp_len));
    stats.extend(flat(&out.stats.ref_len));
    Ok(Outcome {
        loss: scalar(&out.loss),
        grad,
        stats,
    })
}

/// Evaluates and asserts that the loss, every statistic and every gradient entry is finite.
fn assert_finite(
    what: &str,
    x: &Tensor,
    path: Path,
    lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Outcome {
    let outcome = evaluate(x, path, lengths, refs, cfg)
        .unwrap_or_else(|e| panic!("{what}, {path:?}, {cfg:?}: error {e}"));
    assert!(
        outcome.loss.is_finite(),
        "{what}, {path:?}, {cfg:?}: loss {}",
        outcome.loss
    );
    if let Some(s) = outcome.stats.iter().find(|s| !s.is_finite()) {
        panic!("{what}, {path:?}, {cfg:?}: statistic {s}");
    }
    if let Some((k, g)) = outcome
        .grad
        .iter()
        .enumerate()
        .find(|(_, g)| !g.is_finite())
    {
        panic!("{what}, {path:?}, {cfg:?}: gradient[{k}] = {g}");
    }
    outcome
}

/// Every configuration of `common::all_configs`, plus custom weights (with zeros), `AddK(0)`,
/// a small `k`, and unigrams only.
fn configs(max_order: usize, eos_id: u32) -> Vec<BleuLossConfig> {
    let mut configs = all_configs(max_order, eos_id);
    let base = configs.clone();
    for (index, cfg) in base.into_iter().enumerate().step_by(5) {
        let mut weights: Vec<f64> = (0..max_order).map(|n| (n % 2) as f64).collect();
        weights[0] = 0.7;
        configs.push(BleuLossConfig {
            weights: Some(weights),
            smoothing: [LossSmoothing::AddK(0.0), LossSmoothing::AddK(0.1)][index % 2],
            ..cfg.clone()
        });
        configs.push(BleuLossConfig {
            max_order: 1,
            weights: None,
            ..cfg
        });
    }
    configs
}

/// Deterministic pseudo-random values in `[-2.5, 2.5)`.
fn noise(n: usize, seed: u64) -> Vec<f64> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64) * 5.0 - 2.5
        })
        .collect()
}

const EOS: u32 = 6;
const V: usize = 7;

/// Two elements with repeats; the second has two references, one of which holds EOS (so EOS
/// length models truncate it). Returns the id references and one-hot matrices of each
/// element's first reference.
fn fixture_refs() -> (References, References) {
    let refs = vec![
        vec![vec![1u32, 2, 1, 2, 3]],
        vec![vec![2u32, 4, 4, 1], vec![4u32, 1, 6, 2]],
    ];
    let ids = References::from_ids(&reference_ids(&refs, PAD).unwrap(), PAD).unwrap();
    let matrices = References::from_matrices(
        &one_hot(&[vec![1, 2, 1, 2, 3], vec![2, 4, 4, 1, 0]], V).unwrap(),
        &Tensor::new(&[5u32, 4], &test_device()).unwrap(),
    )
    .unwrap();
    (ids, matrices)
}

#[test]
fn logits_scaled_from_1e_minus3_to_1e4() {
    if !f64_supported("logits_scaled_from_1e_minus3_to_1e4") {
        return;
    }
    let (ids, matrices) = fixture_refs();
    let (batch, seq) = (2, 5);
    let base =
        Tensor::from_vec(noise(batch * seq * V, 7), (batch, seq, V), &test_device()).unwrap();
    let lengths = Tensor::new(&[5u32, 3], &test_device()).unwrap();
    for scale in [1e-3, 1e-2, 1e-1, 1.0, 3.0, 10.0, 100.0, 1e3, 1e4] {
        for dtype in [DType::F32, DType::F64] {
            let x = base.affine(scale, 0.0).unwrap().to_dtype(dtype).unwrap();
            for (refs, kind) in [(&ids, "ids"), (&matrices, "matrices")] {
                for cfg in configs(4, EOS) {
                    for path in [Path::Softmax, Path::Logits] {
                        assert_finite(
                            &format!("scale {scale}, {dtype:?}, {kind}"),
                            &x,
                            path,
                            Some(&lengths),
                            refs,
                            &cfg,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn non_contiguous_logits() {
    if !f64_supported("non_contiguous_logits") {
        return;
    }
    let (ids, _) = fixture_refs();
    // [B, V, S] transposed to [B, S, V]: a strided view.
    let x = Tensor::from_vec(noise(2 * V * 5, 3), (2, V, 5), &test_device())
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert!(!x.is_contiguous());
    for cfg in configs(4, EOS) {
        let strided = assert_finite("strided", &x, Path::Logits, None, &ids, &cfg);
        let packed = assert_finite(
            "packed",
            &x.contiguous().unwrap(),
            Path::Logits,
            None,
            &ids,
            &cfg,
        );
        assert_eq!(strided.loss, packed.loss, "{cfg:?}");
        assert_eq!(strided.grad, packed.grad, "{cfg:?}");
    }
}

#[test]
fn exactly_one_hot_probabilities() {
    if !f64_supported("exactly_one_hot_probabilities") {
        return;
    }
    let (ids, matrices) = fixture_refs();
    // Repeats, EOS in the middle of the first element and at the start of the second's tail.
    let hyps = vec![vec![1u32, 2, 6, 2, 3], vec![2, 4, 4, 6, 6]];
    let probs = one_hot(&hyps, V).unwrap();
    let lengths = Tensor::new(&[5u32, 2], &test_device()).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let p = probs.to_dtype(dtype).unwrap();
        // The same one-hot rows as logits: softmax of ±1e4 margins is exactly one-hot.
        let logits = probs.affine(1e4, 0.0).unwrap().to_dtype(dtype).unwrap();
        for (refs, kind) in [(&ids, "ids"), (&matrices, "matrices")] {
            for cfg in configs(4, EOS) {
                let direct = assert_finite(
                    &format!("one-hot P, {dtype:?}, {kind}"),
                    &p,
                    Path::Probs,
                    Some(&lengths),
                    refs,
                    &cfg,
                );
                for path in [Path::Softmax, Path::Logits] {
                    let through = assert_finite(
                        &format!("1e4 one-hot logits, {dtype:?}, {kind}"),
                        &logits,
                        path,
                        Some(&lengths),
                        refs,
                        &cfg,
                    );
                    assert_eq!(through.loss, direct.loss, "{path:?} {cfg:?}");
                }
            }
        }
    }
}

/// Asserts `got` is within `rel` of `want` (relative), for hand-derived values.
fn assert_close(what: &str, got: f64, want: f64, rel: f64) {
    assert!(
        (got - want).abs() <= rel * want.abs().max(1.0),
        "{what}: got {got}, want {want}"
    );
}

fn tolerance(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        1e-12
    } else {
        1e-5
    }
}

fn cfg_with(
    form: Form,
    length: LengthModel,
    reduction: Reduction,
    smoothing: LossSmoothing,
    max_order: usize,
) -> BleuLossConfig {
    BleuLossConfig {
        max_order,
        weights: None,
        form,
        length,
        reduction,
        smoothing,
        ..Default::default()
    }
}

const FORMS: [Form; 3] = [Form::Expected, Form::Paired, Form::LowerBound];
const REDUCTIONS: [Reduction; 2] = [Reduction::Corpus, Reduction::SentenceMean];

#[test]
fn zero_matches_with_disjoint_vocabularies() {
    if !f64_supported("zero_matches_with_disjoint_vocabularies") {
        return;
    }
    // Hypothesis [1 2 1], reference [3 4 3]: every m_n = 0, t = [3, 2, 1, 0], c = L = 3 so
    // β = 0. Smoothing None: orders 1..3 are floored, log p̃_n = ln 1e-30, order 4 has t_4 = 0
    // and contributes 0:  loss = -(3/4) ln 1e-30 = 51.8108...
    // AddK(1): order 1 is still floored (no smoothing on unigrams), p̃_2 = 1/3, p̃_3 = 1/2:
    //   loss = -(1/4) (ln 1e-30 + ln(1/3) + ln(1/2)).
    let floor = PRECISION_FLOOR.ln();
    let none = -0.75 * floor;
    let add_one = -0.25 * (floor + (1.0f64 / 3.0).ln() + 0.5f64.ln());
    let refs =
        References::from_ids(&Tensor::new(&[[3u32, 4, 3]], &test_device()).unwrap(), PAD).unwrap();
    let probs = one_hot(&[vec![1, 2, 1]], 5).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let p = probs.to_dtype(dtype).unwrap();
        let logits = probs.affine(1e4, 0.0).unwrap().to_dtype(dtype).unwrap();
        for form in FORMS {
            for length in [
                LengthModel::Given,
                LengthModel::NotEos { eos_id: 0 },
                LengthModel::SoftEos { eos_id: 0 },
            ] {
                for reduction in REDUCTIONS {
                    for (smoothing, want) in [
                        (LossSmoothing::None, none),
                        (LossSmoothing::AddK(1.0), add_one),
                    ] {
                        let cfg = cfg_with(form, length, reduction, smoothing, 4);
                        for (x, path) in [
                            (&p, Path::Probs),
                            (&logits, Path::Softmax),
                            (&logits, Path::Logits),
                        ] {
                            let out = assert_finite("zero matches", x, path, None, &refs, &cfg);
                            assert_close(
                                &format!("zero matches {dtype:?} {path:?} {cfg:?}"),
                                out.loss,
                                want,
                                tolerance(dtype),
                            );
                        }
                    }
                }
            }
        }
    }
    // Soft inputs over the hypothesis' own vocabulary {1, 2}: still no match at all.
    let soft = Tensor::new(
        &[[
            [-50.0f64, 0.3, 0.9, -50.0, -50.0],
            [-50.0, 2.0, -1.0, -50.0, -50.0],
        ]],
        &test_device(),
    )
    .unwrap();
    let refs =
        References::from_ids(&Tensor::new(&[[3u32, 4]], &test_device()).unwrap(), PAD).unwrap();
    for cfg in configs(4, 0) {
        for path in [Path::Softmax, Path::Logits] {
            assert_finite("soft zero matches", &soft, path, None, &refs, &cfg);
        }
    }
}

#[test]
fn zero_hypothesis_length() {
    if !f64_supported("zero_hypothesis_length") {
        return;
    }
    // Two references of lengths 3 and 5 for the empty element: the effective reference length
    // is the one closest to c = 0, L = 3. Below one token β(C, L) = min(0, 1 - 2L + L C), so
    // β(0, 3) = -5; every t_n = 0 contributes 0: loss = 5 whatever the form or smoothing.
    // With a second element whose hypothesis equals its reference [1 2 3 4] (c = L = 4):
    // - SentenceMean: (5 + 0) / 2 = 2.5;
    // - Corpus: C = 4, L = 3 + 4 = 7, β = 1 - 7/4 = -0.75, every p̃_n = 1: loss = 0.75.
    let dev = &test_device();
    let refs = References::from_ids(
        &reference_ids(
            &[
                vec![vec![1u32, 2, 3], vec![3, 3, 2, 2, 1]],
                vec![vec![1u32, 2, 3, 4]],
            ],
            PAD,
        )
        .unwrap(),
        PAD,
    )
    .unwrap();
    let single = References::from_ids(
        &reference_ids(&[vec![vec![1u32, 2, 3], vec![3, 3, 2, 2, 1]]], PAD).unwrap(),
        PAD,
    )
    .unwrap();
    let probs = one_hot(&[vec![1, 2, 3, 4], vec![1, 2, 3, 4]], 6).unwrap();
    let lengths = Tensor::new(&[0u32, 4], dev).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let p = probs.to_dtype(dtype).unwrap();
        let logits = probs.affine(1e4, 0.0).unwrap().to_dtype(dtype).unwrap();
        let soft = Tensor::from_vec(noise(2 * 4 * 6, 11), (2, 4, 6), dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for form in FORMS {
            for length in [LengthModel::Given, LengthModel::NotEos { eos_id: 5 }] {
                for smoothing in [LossSmoothing::None, LossSmoothing::AddK(1.0)] {
                    for (reduction, want) in
                        [(Reduction::SentenceMean, 2.5), (Reduction::Corpus, 0.75)]
                    {
                        let cfg = cfg_with(form, length, reduction, smoothing, 4);
                        for (x, path) in [
                            (&p, Path::Probs),
                            (&logits, Path::Softmax),
                            (&logits, Path::Logits),
                        ] {
                            let out = assert_finite("empty", x, path, Some(&lengths), &refs, &cfg);
                            assert_close(
                                &format!("empty hypothesis {dtype:?} {path:?} {cfg:?}"),
                                out.loss,
                                want,
                                tolerance(dtype),
                            );
                        }
                        // Soft distributions: the empty element still contributes exactly 5.
                        for path in [Path::Softmax, Path::Logits] {
                            assert_finite("empty soft", &soft, path, Some(&lengths), &refs, &cfg);
                            if reduction == Reduction::SentenceMean && length == LengthModel::Given
                            {
                                let first = evaluate(
                                    &soft.narrow(0, 0, 1).unwrap(),
                                    path,
                                    Some(&Tensor::new(&[0u32], dev).unwrap()),
                                    &single,
                                    &cfg,
                                )
                                .unwrap();
                                assert_close(
                                    "empty soft element",
                                    first.loss,
                                    5.0,
                                    tolerance(dtype),
                                );
                            }
                        }
                    }
                }
            }
        }
        // Both elements empty: C = 0, L = 3 + 4 = 7, β = 1 - 14 = -13 (Corpus); SentenceMean
        // averages 2·3 - 1 = 5 and 2·4 - 1 = 7.
        let none = Tensor::new(&[0u32, 0], dev).unwrap();
        for cfg in configs(4, 5) {
            let want = match cfg.reduction {
                Reduction::Corpus => 13.0,
                Reduction::SentenceMean => 6.0,
            };
            if matches!(cfg.length, LengthModel::SoftEos { .. }) {
                continue;
            }
            for path in [Path::Softmax, Path::Logits] {
                let out = assert_finite("all empty", &soft, path, Some(&none), &refs, &cfg);
                assert_close(
                    &format!("all empty {cfg:?}"),
                    out.loss,
                    want,
                    tolerance(dtype),
                );
            }
        }
    }
}

#[test]
fn soft_eos_with_certain_eos_first() {
    if !f64_supported("soft_eos_with_certain_eos_first") {
        return;
    }
    // P[0, eos] = 1: s_i = 0 everywhere, so c = 0 and every t_n = 0. L = 3 (closest of 3 and 5
    // to 0): loss = 2L - 1 = 5, gradients finite through the exact zeros of the survival product.
    let refs = References::from_ids(
        &reference_ids(&[vec![vec![1u32, 2, 3], vec![3, 3, 2, 2, 1]]], PAD).unwrap(),
        PAD,
    )
    .unwrap();
    let probs = one_hot(&[vec![5, 1, 2, 3]], 6).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let p = probs.to_dtype(dtype).unwrap();
        let logits = probs.affine(1e4, 0.0).unwrap().to_dtype(dtype).unwrap();
        for form in FORMS {
            for reduction in REDUCTIONS {
                for smoothing in [LossSmoothing::None, LossSmoothing::AddK(1.0)] {
                    let cfg = cfg_with(
                        form,
                        LengthModel::SoftEos { eos_id: 5 },
                        reduction,
                        smoothing,
                        4,
                    );
                    for (x, path) in [
                        (&p, Path::Probs),
                        (&logits, Path::Softmax),
                        (&logits, Path::Logits),
                    ] {
                        let out = assert_finite("eos first", x, path, None, &refs, &cfg);
                        assert_close(
                            &format!("eos first {path:?} {cfg:?}"),
                            out.loss,
                            5.0,
                            tolerance(dtype),
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn soft_eos_with_half_a_token() {
    if !f64_supported("soft_eos_with_half_a_token") {
        return;
    }
    // V = 5, EOS = 4, reference [3]. P_0 = ½ token 3 + ½ EOS, P_1 = EOS. Then s_0 = ½, s_1 = 0:
    // c = ½, L = 1, β = 1 - 2·1 + 1·½ = -½. Unigrams: t_1 = s_0 + s_1 = ½; u_0 = 1, u_1 = s_0 = ½;
    // M = P[·, 3] = (½, 0). t_2 = s_1 = 0 contributes 0. With max_order 2 (w = ½ each), None:
    // - Expected: m_1 = min(κ = 1, ½·1) = ½, p_1 = 1: loss = ½.
    // - LowerBound: a_00 = ½, E = ½, share min(1, 1/(1 + ½ - ½)) = 1: m_1 = ½, loss = ½.
    // - Paired: Z[0,0] = ¼ + ¼ = ½, Z[0,1] = ½; μ_0 = 1, c_0 = Z[0,0]u_0 + Z[0,1]u_1 = ¾;
    //   m_1 = min(M κ μ_0, M c_0 ν) = min(½, ⅜) = ⅜, p_1 = ¾: loss = ½ - ½ ln ¾.
    let refs = References::from_ids(&Tensor::new(&[[3u32]], &test_device()).unwrap(), PAD).unwrap();
    let probs = Tensor::new(
        &[[[0.0f64, 0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.0, 0.0, 1.0]]],
        &test_device(),
    )
    .unwrap();
    for dtype in [DType::F32, DType::F64] {
        let p = probs.to_dtype(dtype).unwrap();
        for (form, want) in [
            (Form::Expected, 0.5),
            (Form::LowerBound, 0.5),
            (Form::Paired, 0.5 - 0.5 * 0.75f64.ln()),
        ] {
            for reduction in REDUCTIONS {
                let cfg = cfg_with(
                    form,
                    LengthModel::SoftEos { eos_id: 4 },
                    reduction,
                    LossSmoothing::None,
                    2,
                );
                let out = assert_finite("half a token", &p, Path::Probs, None, &refs, &cfg);
                assert_close(
                    &format!("half a token {cfg:?}"),
                    out.loss,
                    want,
                    tolerance(dtype),
                );
            }
        }
    }
}

#[test]
fn single_position_and_single_reference_token() {
    if !f64_supported("single_position_and_single_reference_token") {
        return;
    }
    // S = 1, T = 1. Hypothesis [2], reference [2]: m_1 = t_1 = 1, t_n = 0 above, c = L = 1:
    // loss 0. Reference [3]: m_1 = 0, floored: loss = -(1/4) ln 1e-30 (β = 0).
    let dev = &test_device();
    let probs = one_hot(&[vec![2]], 4).unwrap();
    for (reference, want) in [(2u32, 0.0), (3, -0.25 * PRECISION_FLOOR.ln())] {
        let refs = References::from_ids(&Tensor::new(&[[reference]], dev).unwrap(), PAD).unwrap();
        for dtype in [DType::F32, DType::F64] {
            let p = probs.to_dtype(dtype).unwrap();
            for form in FORMS {
                for reduction in REDUCTIONS {
                    for length in [
                        LengthModel::Given,
                        LengthModel::NotEos { eos_id: 1 },
                        LengthModel::SoftEos { eos_id: 1 },
                    ] {
                        let cfg = cfg_with(form, length, reduction, LossSmoothing::None, 4);
                        let out = assert_finite("S = T = 1", &p, Path::Probs, None, &refs, &cfg);
                        assert_close(
                            &format!("S = T = 1, ref {reference}, {cfg:?}"),
                            out.loss,
                            want,
                            tolerance(dtype),
                        );
                    }
                }
            }
        }
    }
    // Soft, every scale, every configuration, ids and matrices.
    let refs = References::from_ids(&Tensor::new(&[[2u32], [1]], dev).unwrap(), PAD).unwrap();
    let matrices = References::from_matrices(
        &one_hot(&[vec![2], vec![1]], 4).unwrap(),
        &Tensor::new(&[1u32, 1], dev).unwrap(),
    )
    .unwrap();
    let base = Tensor::from_vec(noise(2 * 4, 5), (2, 1, 4), dev).unwrap();
    for scale in [1e-3, 1.0, 30.0, 1e4] {
        for dtype in [DType::F32, DType::F64] {
            let x = base.affine(scale, 0.0).unwrap().to_dtype(dtype).unwrap();
            for refs in [&refs, &matrices] {
                for cfg in configs(4, 3) {
                    for path in [Path::Softmax, Path::Logits] {
                        assert_finite(&format!("S = 1, scale {scale}"), &x, path, None, refs, &cfg);
                    }
                }
            }
        }
    }
}

#[test]
fn orders_longer_than_the_sequences() {
    if !f64_supported("orders_longer_than_the_sequences") {
        return;
    }
    // max_order 6, S = 2. Hypothesis [1 2], reference [1 2]: p_1 = p_2 = 1, t_3..t_6 = 0,
    // loss 0. Reference [1 2 3]: c = 2, L = 3, β = 1 - 3/2: loss ½.
    let dev = &test_device();
    let probs = one_hot(&[vec![1, 2]], 5).unwrap();
    for (reference, want) in [(vec![1u32, 2], 0.0), (vec![1u32, 2, 3], 0.5)] {
        let refs = References::from_ids(
            &Tensor::new(reference.as_slice(), dev)
                .unwrap()
                .unsqueeze(0)
                .unwrap(),
            PAD,
        )
        .unwrap();
        for dtype in [DType::F32, DType::F64] {
            let p = probs.to_dtype(dtype).unwrap();
            for cfg in configs(6, 4) {
                let out = assert_finite("orders > S", &p, Path::Probs, None, &refs, &cfg);
                if cfg.weights.is_none() {
                    assert_close(
                        &format!("orders > S, {reference:?}, {cfg:?}"),
                        out.loss,
                        want,
                        tolerance(dtype),
                    );
                }
            }
        }
    }
    let refs = References::from_ids(
        &reference_ids(&[vec![vec![1u32, 2]], vec![vec![3u32], vec![2, 2, 3]]], PAD).unwrap(),
        PAD,
    )
    .unwrap();
    let base = Tensor::from_vec(noise(2 * 2 * 5, 9), (2, 2, 5), dev).unwrap();
    for scale in [1e-3, 1.0, 30.0, 1e4] {
        for dtype in [DType::F32, DType::F64] {
            let x = base.affine(scale, 0.0).unwrap().to_dtype(dtype).unwrap();
            for cfg in configs(6, 4) {
                for path in [Path::Softmax, Path::Logits] {
                    assert_finite(
                        &format!("orders > S, scale {scale}"),
                        &x,
                        path,
                        None,
                        &refs,
                        &cfg,
                    );
                }
            }
        }
    }
}

#[test]
fn half_precision_inputs_are_upcast() {
    if !f64_supported("half_precision_inputs_are_upcast") {
        return;
    }
    let (ids, matrices) = fixture_refs();
    let hyps = vec![vec![1u32, 2, 1, 2, 3], vec![2, 4, 4, 1, 6]];
    let probs = one_hot(&hyps, V).unwrap();
    let base = Tensor::from_vec(noise(2 * 5 * V, 13), (2, 5, V), &test_device()).unwrap();
    let lengths = Tensor::new(&[5u32, 4], &test_device()).unwrap();
    for dtype in [DType::F16, DType::BF16] {
        for refs in [&ids, &matrices] {
            for cfg in configs(4, EOS) {
                // One-hot probabilities are exact in half precision: the loss is the f32 loss.
                let half = assert_finite(
                    "one-hot half",
                    &probs.to_dtype(dtype).unwrap(),
                    Path::Probs,
                    Some(&lengths),
                    refs,
                    &cfg,
                );
                let single = assert_finite(
                    "one-hot f32",
                    &probs.to_dtype(DType::F32).unwrap(),
                    Path::Probs,
                    Some(&lengths),
                    refs,
                    &cfg,
                );
                assert_eq!(half.loss, single.loss, "{dtype:?} {cfg:?}");
                // Logits up to 1e4 · 2.5 fit f16 (max 65504).
                for scale in [1e-3, 1.0, 1e2, 1e4] {
                    let x = base.affine(scale, 0.0).unwrap().to_dtype(dtype).unwrap();
                    for path in [Path::Softmax, Path::Logits] {
                        assert_finite(
                            &format!("{dtype:?} scale {scale}"),
                            &x,
                            path,
                            Some(&lengths),
                            refs,
                            &cfg,
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn loss_from_half_precision_statistics() {
    if !f64_supported("loss_from_half_precision_statistics") {
        return;
    }
    // m_1 = 0 is floored at 1e-30, which is 0 in f16: the statistics must be scored in f32.
    // Statistics m = [0, 1, 1, 1], t = [3, 2, 1, 1], c = L = 3, AddK(1):
    //   loss = -(1/4) (ln 1e-30 + ln(2/3) + ln(2/2) + ln(2/2)).
    let dev = &test_device();
    let want = -0.25 * (PRECISION_FLOOR.ln() + (2.0f64 / 3.0).ln());
    for dtype in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        let m = Tensor::new(&[[0.0f64, 1.0, 1.0, 1.0]], dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let t = Tensor::new(&[[3.0f64, 2.0, 1.0, 1.0]], dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let l = Tensor::new(&[3.0f64], dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let m = Var::from_tensor(&m).unwrap();
        let loss = loss_from_stats(
            &stats_of(m.as_tensor(), &t, &l, &l),
            &BleuLossConfig::default(),
        )
        .unwrap();
        assert_close(&format!("{dtype:?}"), scalar(&loss), want, 1e-6);
        let grad = flat(loss.backward().unwrap().get(&m).unwrap());
        assert!(grad.iter().all(|g| g.is_finite()), "{dtype:?}: {grad:?}");
    }
}

/// Every position predicts EOS with margin 16, so `1 - P[eos] ≈ 4.8e-7` is a normal f32 but
/// the order-4 totals `t_4 = Π h ≈ 1.5e-25` are below `sqrt(f32::MIN_POSITIVE)`: the backward
/// of `m_n / t_n` (`grad · m / t²`) would give `t² = 0` in f32 and NaN gradients, which is why
/// `loss_from_stats` scores in f64. Only with `LossSmoothing::None` (AddK keeps `t + k >= k`),
/// under `NotEos` and `SoftEos` (Given totals are integers), in f32.
#[test]
fn f32_tiny_totals_give_finite_gradients() {
    if !f64_supported("f32_tiny_totals_give_finite_gradients") {
        return;
    }
    let dev = &test_device();
    let refs = References::from_ids(&Tensor::new(&[[0u32, 0, 0, 0]], dev).unwrap(), 9).unwrap();
    let logits = Tensor::new(
        &[[[0.0f32, 16.0], [0.0, 16.0], [0.0, 16.0], [0.0, 16.0]]],
        dev,
    )
    .unwrap();
    for length in [
        LengthModel::NotEos { eos_id: 1 },
        LengthModel::SoftEos { eos_id: 1 },
    ] {
        for form in FORMS {
            let cfg = cfg_with(form, length, Reduction::Corpus, LossSmoothing::None, 4);
            for path in [Path::Softmax, Path::Logits] {
                assert_finite("f32 tiny totals", &logits, path, None, &refs, &cfg);
            }
        }
    }
}

/// docs/loss.md, §7 defines the paired form's hypothesis self-match `Z[i,i'] = Π_k P_{i+k}·P_{i'+k}` over
/// the whole vocabulary, EOS column included, so under `SoftEos` the paired form (only it) is
/// not invariant to positions after a certain EOS at soft inputs: EOS mass matches EOS mass in
/// the hypothesis counts `c_i`. At one-hot inputs it is (`M[i_eos, j] = 0`). This pins the
/// literal value of docs/loss.md, derived by hand; the README documents the behaviour.
///
/// V = 3, EOS = 2, reference [0], max_order 1, None. P_0 = (½, 0, ½): s_0 = ½, t_1 = ½,
/// M = P_0[0] = ½, Z[0,0] = ¼ + ¼ = ½, μ_0 = 1, c_0 = Z[0,0] u_0 = ½:
/// m_1 = min(M κ μ_0, M c_0 ν) = min(½, ¼) = ¼, p_1 = ½.
/// Appending P_1 = EOS (s_1 = 0, u_1 = s_0 = ½): Z[0,1] = P_0·P_1 = ½ (EOS with EOS), so
/// c_0 = ½ + ½·½ = ¾ and m_1 = min(½, ⅜) = ⅜, p_1 = ¾. The expected and lower-bound forms
/// (no `Z`) keep their values.
#[test]
fn soft_eos_paired_form_counts_eos_mass_in_the_self_match() {
    if !f64_supported("soft_eos_paired_form_counts_eos_mass_in_the_self_match") {
        return;
    }
    let dev = &test_device();
    let refs = References::from_ids(&Tensor::new(&[[0u32]], dev).unwrap(), 9).unwrap();
    let short = Tensor::new(&[[[0.5f64, 0.0, 0.5]]], dev).unwrap();
    let long = Tensor::new(&[[[0.5f64, 0.0, 0.5], [0.0, 0.0, 1.0]]], dev).unwrap();
    let cfg = |form| {
        cfg_with(
            form,
            LengthModel::SoftEos { eos_id: 2 },
            Reduction::Corpus,
            LossSmoothing::None,
            1,
        )
    };
    let base = assert_finite(
        "short",
        &short,
        Path::Probs,
        None,
        &refs,
        &cfg(Form::Paired),
    );
    let padded = assert_finite("long", &long, Path::Probs, None, &refs, &cfg(Form::Paired));
    // β(½, 1) = 1 - 2 + ½ = -½; loss = ½ - ln p_1.
    assert_close("short", base.loss, 0.5 - 0.5f64.ln(), 1e-12);
    assert_close("long", padded.loss, 0.5 - 0.75f64.ln(), 1e-12);
    for form in [Form::Expected, Form::LowerBound] {
        let base = assert_finite("short", &short, Path::Probs, None, &refs, &cfg(form));
        let padded = assert_finite("long", &long, Path::Probs, None, &refs, &cfg(form));
        assert_close(&format!("{form:?}"), padded.loss, base.loss, 1e-12);
    }
}

/// Under the EOS length models, id references end at their first EOS (docs/loss.md, §5: "reference
/// positions count up to their length, padding and EOS excluded"); one-hot matrix references
/// of the same tokens end at the first row whose argmax is EOS, so `from_matrices` with one-hot
/// rows equals `from_ids`. Reference [1 3 2], EOS = 3: both give the reference [1] (L = 1).
#[test]
fn matrix_references_end_at_eos_like_ids() {
    if !f64_supported("matrix_references_end_at_eos_like_ids") {
        return;
    }
    let dev = &test_device();
    let ids = References::from_ids(&Tensor::new(&[[1u32, 3, 2]], dev).unwrap(), PAD).unwrap();
    let matrices = References::from_matrices(
        &one_hot(&[vec![1, 3, 2]], 4).unwrap(),
        &Tensor::new(&[3u32], dev).unwrap(),
    )
    .unwrap();
    let probs = one_hot(&[vec![1, 2, 2]], 4).unwrap();
    for length in [
        LengthModel::NotEos { eos_id: 3 },
        LengthModel::SoftEos { eos_id: 3 },
    ] {
        let cfg = cfg_with(
            Form::Expected,
            length,
            Reduction::Corpus,
            LossSmoothing::None,
            2,
        );
        let from_ids = assert_finite("ids", &probs, Path::Probs, None, &ids, &cfg);
        let from_matrices = assert_finite("matrices", &probs, Path::Probs, None, &matrices, &cfg);
        assert_eq!(from_ids.stats, from_matrices.stats, "{length:?}");
        assert_eq!(from_ids.loss, from_matrices.loss, "{length:?}");
    }
}
