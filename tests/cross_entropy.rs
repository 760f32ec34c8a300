//! `cross_entropy_from_logits`: against candle-nn's `cross_entropy`, against PyTorch's
//! semantics (`ignore_index`, `label_smoothing`) computed from the definition on the host,
//! finite differences, and its input validation. Every tensor is on `test_device()`
//! (`CANDLE_BLEU_TEST_DEVICE`).

mod common;

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{cross_entropy_from_logits, CrossEntropyConfig, CrossEntropyOutput};
use candle_core::{DType, Result, Tensor, Var};
use common::test_device;

fn random_case(
    dtype: DType,
    batch: usize,
    seq: usize,
    vocab: usize,
    seed: u64,
) -> Result<(Tensor, Tensor)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let values: Vec<f64> = (0..batch * seq * vocab)
        .map(|_| rng.gen_range(-6.0..6.0))
        .collect();
    let ids: Vec<u32> = (0..batch * seq)
        .map(|_| rng.gen_range(0..vocab as u32))
        .collect();
    let logits = Tensor::from_vec(values, (batch, seq, vocab), &test_device())?.to_dtype(dtype)?;
    let targets = Tensor::from_vec(ids, (batch, seq), &test_device())?;
    Ok((logits, targets))
}

/// The loss and the logits gradient.
fn value_and_grad(f: impl Fn(&Tensor) -> Result<Tensor>, logits: &Tensor) -> Result<(f64, Tensor)> {
    let var = Var::from_tensor(logits)?;
    let loss = f(var.as_tensor())?;
    let grads = loss.backward()?;
    let grad = grads
        .get(var.as_tensor())
        .expect("a logits gradient")
        .clone();
    Ok((loss.to_dtype(DType::F64)?.to_scalar::<f64>()?, grad))
}

fn max_rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let a = a.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let b = b.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let scale = a.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-300);
    Ok(a.iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()))
        / scale)
}

#[test]
fn equals_candle_nn_cross_entropy_without_pad_or_smoothing() -> Result<()> {
    // Off the CPU (the CUDA kernels against candle-nn's composed ops there) f32 sums in other
    // orders.
    let f32_tol = if test_device().is_cpu() { 1e-6 } else { 1e-5 };
    for (dtype, tol) in [(DType::F32, f32_tol), (DType::F64, 1e-12)] {
        for (batch, seq, vocab, seed) in
            [(2, 3, 11, 1), (4, 7, 300, 2), (1, 1, 1, 3), (3, 5, 5000, 4)]
        {
            let (logits, targets) = random_case(dtype, batch, seq, vocab, seed)?;
            let (ours, our_grad) = value_and_grad(
                |x| {
                    cross_entropy_from_logits(x, &targets, &CrossEntropyConfig::default())
                        .map(|o| o.loss)
                },
                &logits,
            )?;
            let (theirs, their_grad) = value_and_grad(
                |x| {
                    candle_nn::loss::cross_entropy(
                        &x.reshape((batch * seq, vocab))?,
                        &targets.flatten_all()?,
                    )
                },
                &logits,
            )?;
            assert!(
                (ours - theirs).abs() <= tol * theirs.abs().max(1e-300),
                "{dtype:?} [{batch},{seq},{vocab}]: {ours} vs candle-nn {theirs}"
            );
            let grad_diff = max_rel_diff(&our_grad, &their_grad.reshape((batch, seq, vocab))?)?;
            assert!(
                grad_diff <= 10.0 * tol,
                "{dtype:?} [{batch},{seq},{vocab}]: gradient differs by {grad_diff}"
            );
        }
    }
    Ok(())
}

/// PyTorch's `F.cross_entropy(ignore_index = pad, label_smoothing = ε, reduction = "mean")`
/// from its definition, in f64 on the host.
fn torch_semantics(logits: &[Vec<f64>], targets: &[u32], pad: Option<u32>, eps: f64) -> f64 {
    let (mut total, mut count) = (0.0, 0.0);
    for (row, &t) in logits.iter().zip(targets) {
        if Some(t) == pad {
            continue;
        }
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        let log_p: Vec<f64> = row.iter().map(|x| x - lse).collect();
        let smooth = -log_p.iter().sum::<f64>() / row.len() as f64;
        total += (1.0 - eps) * -log_p[t as usize] + eps * smooth;
        count += 1.0;
    }
    total / count
}

#[test]
fn padding_and_label_smoothing_follow_pytorch() -> Result<()> {
    let (batch, seq, vocab) = (3, 6, 17);
    let (logits, targets) = random_case(DType::F64, batch, seq, vocab, 7)?;
    // Make some positions padding (id 0) and keep one target equal to the pad id in range.
    let mut target_rows = targets.flatten_all()?.to_vec1::<u32>()?;
    for i in [0, 4, 5, 11, 17] {
        target_rows[i] = 0;
    }
    let targets = Tensor::from_vec(target_rows.clone(), (batch, seq), &test_device())?;
    let rows: Vec<Vec<f64>> = logits.reshape((batch * seq, vocab))?.to_vec2::<f64>()?;
    for pad in [None, Some(0u32), Some(999)] {
        for eps in [0.0, 0.1, 0.5, 0.95] {
            let cfg = CrossEntropyConfig {
                pad_id: pad,
                label_smoothing: eps,
                ..Default::default()
            };
            let ours = cross_entropy_from_logits(&logits, &targets, &cfg)?
                .loss
                .to_scalar::<f64>()?;
            let expected = torch_semantics(&rows, &target_rows, pad, eps);
            assert!(
                (ours - expected).abs() <= 1e-12 * expected.abs(),
                "pad {pad:?} ε {eps}: {ours} vs {expected}"
            );
            let ours32 = cross_entropy_from_logits(&logits.to_dtype(DType::F32)?, &targets, &cfg)?
                .loss
                .to_scalar::<f32>()? as f64;
            assert!(
                (ours32 - expected).abs() <= 1e-5 * expected.abs(),
                "f32 pad {pad:?} ε {eps}: {ours32} vs {expected}"
            );
        }
    }
    Ok(())
}

/// A case computed by hand in closed form: `F.cross_entropy(L, [2, 0, 1, 1], ignore_index = 1,
/// label_smoothing = 0.25)` on the rows below.
#[test]
fn hand_computed_small_case() -> Result<()> {
    // Rows: [0, 0, ln 2] (target 2), [1, 0, 0] (target 0), two pad rows (target 1).
    let logits = Tensor::new(
        &[
            [[0f64, 0.0, std::f64::consts::LN_2], [1.0, 0.0, 0.0]],
            [[5.0, -3.0, 2.0], [0.0, 1.0, 2.0]],
        ],
        &test_device(),
    )?;
    let targets = Tensor::new(&[[2u32, 0], [1, 1]], &test_device())?;
    let cfg = CrossEntropyConfig {
        pad_id: Some(1),
        label_smoothing: 0.25,
        ..Default::default()
    };
    let ours = cross_entropy_from_logits(&logits, &targets, &cfg)?
        .loss
        .to_scalar::<f64>()?;
    // Row 1: lse = ln 4, -log p = [ln 4, ln 4, ln 2]: nll = ln 2, smooth = (5 ln 2)/3.
    // Row 2: lse = ln(e + 2), -log p = [lse - 1, lse, lse]: nll = lse - 1, smooth = lse - 1/3.
    let ln2 = std::f64::consts::LN_2;
    let lse2 = (std::f64::consts::E + 2.0).ln();
    let row1 = 0.75 * ln2 + 0.25 * 5.0 * ln2 / 3.0;
    let row2 = 0.75 * (lse2 - 1.0) + 0.25 * (lse2 - 1.0 / 3.0);
    let expected = (row1 + row2) / 2.0;
    assert!((ours - expected).abs() < 1e-14, "{ours} vs {expected}");
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let (logits, targets) = random_case(DType::F64, 2, 4, 9, 11)?;
    let mut target_rows = targets.flatten_all()?.to_vec1::<u32>()?;
    target_rows[1] = 3;
    target_rows[6] = 3;
    let targets = Tensor::from_vec(target_rows, (2, 4), &test_device())?;
    for cfg in [
        CrossEntropyConfig::default(),
        CrossEntropyConfig {
            pad_id: Some(3),
            label_smoothing: 0.0,
            ..Default::default()
        },
        CrossEntropyConfig {
            pad_id: Some(3),
            label_smoothing: 0.3,
            ..Default::default()
        },
        CrossEntropyConfig {
            pad_id: None,
            label_smoothing: 0.7,
            ..Default::default()
        },
    ] {
        let report = check_gradients(
            |x| cross_entropy_from_logits(x, &targets, &cfg).map(|o| o.loss),
            &logits,
            &GradCheckConfig::default(),
        )?;
        assert!(
            report.passed && !report.gradient_missing,
            "{cfg:?}: {report}"
        );
    }
    Ok(())
}

#[test]
fn pad_rows_get_zero_gradient() -> Result<()> {
    let (logits, _) = random_case(DType::F64, 1, 3, 5, 5)?;
    let targets = Tensor::new(&[[4u32, 2, 4]], &test_device())?;
    let cfg = CrossEntropyConfig {
        pad_id: Some(4),
        label_smoothing: 0.2,
        ..Default::default()
    };
    let (_, grad) = value_and_grad(
        |x| cross_entropy_from_logits(x, &targets, &cfg).map(|o| o.loss),
        &logits,
    )?;
    let grad = grad.to_vec3::<f64>()?;
    assert!(grad[0][0].iter().chain(&grad[0][2]).all(|&g| g == 0.0));
    // The one counted row: its gradient sums to 0 (softmax minus a distribution).
    assert!(grad[0][1].iter().sum::<f64>().abs() < 1e-15);
    Ok(())
}

fn error_of(result: Result<CrossEntropyOutput>) -> String {
    match result {
        Ok(t) => panic!("expected an error, got a loss of shape {:?}", t.loss.dims()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_are_clear_errors() -> Result<()> {
    let device = test_device();
    let logits = Tensor::zeros((2, 3, 5), DType::F32, &device)?;
    let targets = Tensor::zeros((2, 3), DType::U32, &device)?;
    let ok = CrossEntropyConfig::default();

    let out_of_vocab = Tensor::new(&[[0u32, 1, 2], [3, 5, 4]], &device)?;
    let message = error_of(cross_entropy_from_logits(&logits, &out_of_vocab, &ok));
    // On the CPU the first bad target is named; elsewhere one small copy gives the value.
    let named = if device.is_cpu() {
        "targets[1, 1]"
    } else {
        "`targets` holds 5"
    };
    assert!(
        message.contains(named) && message.contains("V = 5"),
        "{message}"
    );
    // A pad id outside the vocabulary is fine, and so is a target equal to it.
    let padded = Tensor::new(&[[0u32, 7, 2], [3, 7, 4]], &device)?;
    let cfg = CrossEntropyConfig {
        pad_id: Some(7),
        label_smoothing: 0.0,
        ..Default::default()
    };
    let loss = cross_entropy_from_logits(&logits, &padded, &cfg)?
        .loss
        .to_scalar::<f32>()?;
    assert!((loss - 5f32.ln()).abs() < 1e-6);

    let all_pad = Tensor::full(7u32, (2, 3), &device)?;
    let message = error_of(cross_entropy_from_logits(&logits, &all_pad, &cfg));
    assert!(message.contains("pad_id"), "{message}");

    let message = error_of(cross_entropy_from_logits(
        &logits,
        &Tensor::zeros((2, 4), DType::U32, &device)?,
        &ok,
    ));
    assert!(
        message.contains("`targets` must be u32 [2, 3]") && message.contains("[2, 4]"),
        "{message}"
    );
    let message = error_of(cross_entropy_from_logits(
        &logits,
        &targets.to_dtype(DType::F32)?,
        &ok,
    ));
    assert!(
        message.contains("`targets` must be u32") && message.contains("F32"),
        "{message}"
    );
    let message = error_of(cross_entropy_from_logits(
        &logits.to_dtype(DType::U32)?,
        &targets,
        &ok,
    ));
    assert!(
        message.contains("`logits` must be a float tensor"),
        "{message}"
    );
    let message = error_of(cross_entropy_from_logits(
        &logits.reshape((6, 5))?,
        &targets,
        &ok,
    ));
    assert!(
        message.contains("`logits` must be [B, S, V]") && message.contains("[6, 5]"),
        "{message}"
    );
    let message = error_of(cross_entropy_from_logits(
        // From an empty vector: the way tests/loss_errors.rs builds empty tensors, which ran on
        // CUDA.
        &Tensor::from_vec(Vec::<f32>::new(), (2, 3, 0), &device)?,
        &targets,
        &ok,
    ));
    assert!(message.contains("empty dimension"), "{message}");

    for eps in [1.0, -0.1, f64::NAN, f64::INFINITY] {
        let cfg = CrossEntropyConfig {
            pad_id: None,
            label_smoothing: eps,
            ..Default::default()
        };
        let message = error_of(cross_entropy_from_logits(&logits, &targets, &cfg));
        assert!(
            message.contains("`label_smoothing` must be in [0, 1)"),
            "{eps}: {message}"
        );
    }

    // The CPU kernel finds a NaN logit in its pass; off the CPU the cross-entropy reads no
    // value back (a NaN logit gives a NaN loss there).
    if device.is_cpu() {
        let mut values = vec![0f32; 30];
        values[17] = f32::NAN;
        let nan_logits = Tensor::from_vec(values, (2, 3, 5), &device)?;
        let message = error_of(cross_entropy_from_logits(&nan_logits, &targets, &ok));
        assert!(message.contains("NaN or infinite"), "{message}");
    }
    Ok(())
}

#[test]
fn half_precision_is_computed_in_f32() -> Result<()> {
    let (logits, targets) = random_case(DType::F32, 2, 3, 40, 9)?;
    let cfg = CrossEntropyConfig {
        pad_id: None,
        label_smoothing: 0.1,
        ..Default::default()
    };
    for dtype in [DType::F16, DType::BF16] {
        let half = logits.to_dtype(dtype)?;
        let ours = cross_entropy_from_logits(&half, &targets, &cfg)?.loss;
        assert_eq!(ours.dtype(), DType::F32);
        let reference =
            cross_entropy_from_logits(&half.to_dtype(DType::F32)?, &targets, &cfg)?.loss;
        assert_eq!(ours.to_scalar::<f32>()?, reference.to_scalar::<f32>()?);
    }
    Ok(())
}
