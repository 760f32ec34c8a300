//! docs/loss.md, §14 (gradients): candle's autograd agrees with central finite differences (f64) for every form ×
//! length model × reduction × smoothing, with respect to logits through softmax; and the fused
//! path gives the composed path's numbers and gradients.

mod common;

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, BleuLossConfig, LengthModel, References,
};
use candle_core::{Tensor, Var, D};
use common::*;

const EOS: u32 = 5;

/// Two elements, references with repeats, one with two references of equal length (so the
/// effective reference length never switches within `eps`).
fn fixture() -> candle_core::Result<(Tensor, References, Tensor)> {
    let refs = vec![
        vec![vec![1u32, 2, 1, 2, 3]],
        vec![vec![2u32, 4, 4, 1], vec![4u32, 1, 2, 2]],
    ];
    let references = References::from_ids(&reference_ids(&refs, PAD)?, PAD)?;
    // Logits of moderate scale: soft probabilities keep every min() away from a tie.
    let logits = Tensor::new(
        &[
            [
                [0.3f64, 1.1, -0.4, 0.8, -1.2, -0.9],
                [-0.5, 0.2, 1.3, -0.1, 0.4, -1.4],
                [0.9, -0.3, 0.1, 0.6, -0.8, -1.1],
                [0.0, 0.7, -0.6, 1.2, 0.3, -0.7],
                [-0.2, 0.5, 0.4, -1.0, 0.9, 0.2],
            ],
            [
                [0.6, -0.7, 1.0, 0.2, 0.5, -1.3],
                [-1.1, 0.4, 0.3, -0.2, 1.4, -0.6],
                [0.2, 1.2, -0.5, 0.7, -0.3, -1.0],
                [0.8, -0.1, 0.6, -0.9, 0.1, 0.3],
                [-0.4, 0.3, -1.2, 0.5, 0.6, -0.2],
            ],
        ],
        &test_device(),
    )?;
    let lengths = Tensor::new(&[5u32, 4], &test_device())?;
    Ok((logits, references, lengths))
}

fn lengths_for<'a>(cfg: &BleuLossConfig, lengths: &'a Tensor) -> Option<&'a Tensor> {
    match cfg.length {
        LengthModel::SoftEos { .. } => None,
        _ => Some(lengths),
    }
}

#[test]
fn autograd_matches_finite_differences_for_every_configuration() -> candle_core::Result<()> {
    if !f64_supported("autograd_matches_finite_differences_for_every_configuration") {
        return Ok(());
    }
    let (logits, refs, lengths) = fixture()?;
    let grad_cfg = GradCheckConfig {
        eps: 1e-6,
        atol: 1e-8,
        rtol: 1e-6,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for cfg in all_configs(4, EOS) {
        let hyp_lengths = lengths_for(&cfg, &lengths);
        let through_softmax = |x: &Tensor| {
            let probs = candle_nn::ops::softmax(x, D::Minus1)?;
            Ok(bleu_loss(&probs, hyp_lengths, &refs, &cfg)?.loss)
        };
        let fused = |x: &Tensor| Ok(bleu_loss_from_logits(x, hyp_lengths, &refs, &cfg)?.loss);
        for (path, report) in [
            (
                "softmax + bleu_loss",
                check_gradients(through_softmax, &logits, &grad_cfg)?,
            ),
            (
                "bleu_loss_from_logits",
                check_gradients(fused, &logits, &grad_cfg)?,
            ),
        ] {
            assert_eq!(report.checked, logits.elem_count());
            assert!(!report.gradient_missing, "{cfg:?}");
            if !report.passed {
                failures.push(format!("{path} {cfg:?}: {report}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn fused_path_equals_composed_path_in_values_and_gradients() -> candle_core::Result<()> {
    if !f64_supported("fused_path_equals_composed_path_in_values_and_gradients") {
        return Ok(());
    }
    let (logits, refs, lengths) = fixture()?;
    for cfg in all_configs(4, EOS) {
        let hyp_lengths = lengths_for(&cfg, &lengths);
        let var = Var::from_tensor(&logits)?;
        let composed = bleu_loss(
            &candle_nn::ops::softmax(var.as_tensor(), D::Minus1)?,
            hyp_lengths,
            &refs,
            &cfg,
        )?;
        let composed_grad = composed.loss.backward()?.get(&var).unwrap().clone();
        let var = Var::from_tensor(&logits)?;
        let fused = bleu_loss_from_logits(var.as_tensor(), hyp_lengths, &refs, &cfg)?;
        let fused_grad = fused.loss.backward()?.get(&var).unwrap().clone();
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + a.abs());
        assert!(
            close(scalar(&composed.loss), scalar(&fused.loss)),
            "{cfg:?}"
        );
        for (a, b) in to_vec2(&composed.stats.matches)
            .iter()
            .flatten()
            .zip(to_vec2(&fused.stats.matches).iter().flatten())
        {
            assert!(close(*a, *b), "{cfg:?} matches {a} vs {b}");
        }
        let diff = composed_grad
            .sub(&fused_grad)?
            .abs()?
            .max_all()?
            .to_scalar::<f64>()?;
        assert!(diff < 1e-12, "{cfg:?}: gradient difference {diff}");
    }
    Ok(())
}

#[test]
fn fused_f32_is_close_to_f64() -> candle_core::Result<()> {
    if !f64_supported("fused_f32_is_close_to_f64") {
        return Ok(());
    }
    let (logits, refs, lengths) = fixture()?;
    for cfg in all_configs(4, EOS) {
        let hyp_lengths = lengths_for(&cfg, &lengths);
        let in_f64 = scalar(&bleu_loss_from_logits(&logits, hyp_lengths, &refs, &cfg)?.loss);
        let in_f32 = bleu_loss_from_logits(
            &logits.to_dtype(candle_core::DType::F32)?,
            hyp_lengths,
            &refs,
            &cfg,
        )?;
        assert_eq!(in_f32.loss.dtype(), candle_core::DType::F32);
        let in_f32 = scalar(&in_f32.loss);
        assert!(
            (in_f64 - in_f32).abs() < 1e-5 * (1.0 + in_f64.abs()),
            "{cfg:?}: f64 {in_f64} vs f32 {in_f32}"
        );
    }
    Ok(())
}
