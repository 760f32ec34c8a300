//! `ce_bleu_from_logits`: its values and logits gradients equal `cross_entropy_from_logits` +
//! `bleu_weight · bleu_loss_from_logits` computed apart (every form × length model ×
//! reduction × smoothing, id and matrix references, f64), finite differences, and validation.
//! Every tensor is on `test_device()` (`CANDLE_BLEU_TEST_DEVICE`).

mod common;

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    bleu_loss_from_logits, ce_bleu_from_logits, cross_entropy_from_logits, BleuLossConfig,
    CrossEntropyConfig, Form, LengthModel, References, TrainingLoss, TrainingLossConfig,
    TrainingTargets,
};
use candle_core::{DType, Result, Tensor, Var};
use common::*;

const EOS: u32 = 5;
const VOCAB: usize = 7;

/// Two elements of 5 positions over 7 tokens, id references with repeats (two references for
/// the second element), targets with one padding position (id 0).
fn fixture() -> Result<(Tensor, References, Tensor, Tensor)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let values: Vec<f64> = (0..2 * 5 * VOCAB)
        .map(|_| rng.gen_range(-1.5..1.5))
        .collect();
    let logits = Tensor::from_vec(values, (2, 5, VOCAB), &test_device())?;
    let refs = vec![
        vec![vec![1u32, 2, 1, 2, 3]],
        vec![vec![2u32, 4, 4, 1], vec![4u32, 1, 2, 2, 6]],
    ];
    let references = References::from_ids(&reference_ids(&refs, PAD)?, PAD)?;
    let targets = Tensor::new(&[[1u32, 2, 1, 2, 3], [2, 4, 4, 1, 0]], &test_device())?;
    let lengths = Tensor::new(&[5u32, 4], &test_device())?;
    Ok((logits, references, targets, lengths))
}

/// The first reference of each element as one-hot matrices `[B, T, V]` with their lengths.
fn matrix_references() -> Result<References> {
    let matrix_ids = vec![vec![1u32, 2, 1, 2, 3], vec![2u32, 4, 4, 1, 0]];
    References::from_matrices(
        &one_hot(&matrix_ids, VOCAB)?,
        &Tensor::new(&[5u32, 4], &test_device())?,
    )
}

fn lengths_for<'a>(cfg: &BleuLossConfig, lengths: &'a Tensor) -> Option<&'a Tensor> {
    match cfg.length {
        LengthModel::SoftEos { .. } => None,
        _ => Some(lengths),
    }
}

fn value_and_grad(
    f: impl Fn(&Tensor) -> Result<Tensor>,
    logits: &Tensor,
) -> Result<(f64, Vec<f64>)> {
    let var = Var::from_tensor(logits)?;
    let loss = f(var.as_tensor())?;
    let grads = loss.backward()?;
    let grad = grads
        .get(var.as_tensor())
        .expect("a logits gradient")
        .flatten_all()?
        .to_vec1::<f64>()?;
    Ok((loss.to_scalar::<f64>()?, grad))
}

/// `ce_bleu_from_logits` with the configuration built from its parts.
fn ce_bleu(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    targets: &Tensor,
    bleu_weight: f64,
    ce: &CrossEntropyConfig,
    bleu: &BleuLossConfig,
) -> Result<TrainingLoss> {
    let cfg = TrainingLossConfig {
        bleu_weight,
        ce: ce.clone(),
        bleu: bleu.clone(),
    };
    ce_bleu_from_logits(
        logits,
        &TrainingTargets {
            tokens: targets,
            refs,
            hyp_lengths,
        },
        &cfg,
    )
}

#[test]
fn equals_the_two_losses_computed_apart() -> Result<()> {
    let (logits, id_refs, targets, lengths) = fixture()?;
    let matrix_refs = matrix_references()?;
    let ce_configs = [
        CrossEntropyConfig::default(),
        CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        },
    ];
    let mut checked = 0;
    for (refs_name, refs) in [("ids", &id_refs), ("matrices", &matrix_refs)] {
        for bleu in all_configs(4, EOS) {
            for ce in &ce_configs {
                let weight = 0.7;
                let hyp_lengths = lengths_for(&bleu, &lengths);
                let (together, grad_together) = value_and_grad(
                    |x| Ok(ce_bleu(x, hyp_lengths, refs, &targets, weight, ce, &bleu)?.loss),
                    &logits,
                )?;
                let (apart, grad_apart) = value_and_grad(
                    |x| {
                        let ce_loss = cross_entropy_from_logits(x, &targets, ce)?.loss;
                        let bleu_loss = bleu_loss_from_logits(x, hyp_lengths, refs, &bleu)?.loss;
                        ce_loss + bleu_loss.affine(weight, 0.0)?
                    },
                    &logits,
                )?;
                let what = format!("{refs_name} {bleu:?} {ce:?}");
                assert!(
                    (together - apart).abs() <= 1e-10 * apart.abs().max(1.0),
                    "{what}: {together} vs {apart}"
                );
                let worst = grad_together
                    .iter()
                    .zip(&grad_apart)
                    .fold(0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(worst <= 1e-10, "{what}: gradients differ by {worst}");
                // The parts are the two losses.
                let out = ce_bleu(&logits, hyp_lengths, refs, &targets, weight, ce, &bleu)?;
                let ce_alone = scalar(&cross_entropy_from_logits(&logits, &targets, ce)?.loss);
                let bleu_alone =
                    scalar(&bleu_loss_from_logits(&logits, hyp_lengths, refs, &bleu)?.loss);
                assert!(
                    (scalar(&out.cross_entropy) - ce_alone).abs() <= 1e-12 * ce_alone.abs(),
                    "{what}"
                );
                assert!(
                    (scalar(&out.bleu.loss) - bleu_alone).abs()
                        <= 1e-12 * bleu_alone.abs().max(1.0),
                    "{what}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 2 * 36 * 2);
    Ok(())
}

#[test]
fn gradients_match_finite_differences() -> Result<()> {
    let (logits, refs, targets, lengths) = fixture()?;
    let grad_cfg = GradCheckConfig {
        eps: 1e-6,
        atol: 1e-8,
        rtol: 1e-6,
        ..Default::default()
    };
    let ce = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.2,
        ..Default::default()
    };
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [LengthModel::Given, LengthModel::SoftEos { eos_id: EOS }] {
            let bleu = BleuLossConfig {
                form,
                length,
                ..Default::default()
            };
            let hyp_lengths = lengths_for(&bleu, &lengths);
            let report = check_gradients(
                |x| Ok(ce_bleu(x, hyp_lengths, &refs, &targets, 0.5, &ce, &bleu)?.loss),
                &logits,
                &grad_cfg,
            )?;
            assert!(
                report.passed && !report.gradient_missing,
                "{form:?} {length:?}: {report}"
            );
        }
    }
    Ok(())
}

#[test]
fn f32_agrees_with_f64() -> Result<()> {
    let (logits, refs, targets, lengths) = fixture()?;
    let ce = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        ..Default::default()
    };
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        let bleu = BleuLossConfig {
            form,
            ..Default::default()
        };
        let wide = ce_bleu(&logits, Some(&lengths), &refs, &targets, 1.0, &ce, &bleu)?;
        let narrow = ce_bleu(
            &logits.to_dtype(DType::F32)?,
            Some(&lengths),
            &refs,
            &targets,
            1.0,
            &ce,
            &bleu,
        )?;
        let (a, b) = (scalar(&wide.loss), scalar(&narrow.loss));
        assert!((a - b).abs() <= 1e-5 * a.abs(), "{form:?}: {a} vs {b}");
    }
    Ok(())
}

#[test]
fn bad_inputs_are_clear_errors() -> Result<()> {
    let (logits, refs, targets, _) = fixture()?;
    let (ce, bleu) = (CrossEntropyConfig::default(), BleuLossConfig::default());
    let message = |r: Result<TrainingLoss>| match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    };
    for weight in [-1.0, f64::NAN, f64::INFINITY] {
        let m = message(ce_bleu(&logits, None, &refs, &targets, weight, &ce, &bleu));
        assert!(m.contains("`bleu_weight` must be finite and >= 0"), "{m}");
    }
    let m = message(ce_bleu(
        &logits,
        None,
        &refs,
        &targets.narrow(1, 0, 4)?,
        1.0,
        &ce,
        &bleu,
    ));
    assert!(m.contains("`targets` must be u32 [2, 5]"), "{m}");
    let out_of_vocab = Tensor::new(&[[1u32, 2, 1, 2, 3], [2, 4, 9, 1, 0]], &test_device())?;
    let m = message(ce_bleu(
        &logits,
        None,
        &refs,
        &out_of_vocab,
        1.0,
        &ce,
        &bleu,
    ));
    // On the CPU the values are read in place and the first bad one is named; elsewhere one
    // small copy of the largest id and the count names the value only.
    let named = if test_device().is_cpu() {
        "targets[1, 2]"
    } else {
        "`targets` holds 9"
    };
    assert!(m.contains(named) && m.contains("V = 7"), "{m}");
    let all_pad = Tensor::zeros((2, 5), DType::U32, &test_device())?;
    let pad = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.0,
        ..Default::default()
    };
    for form in [Form::Expected, Form::Paired] {
        let bleu = BleuLossConfig {
            form,
            ..Default::default()
        };
        let m = message(ce_bleu(&logits, None, &refs, &all_pad, 1.0, &pad, &bleu));
        assert!(m.contains("pad_id"), "{form:?}: {m}");
    }
    let one_element = References::from_ids(&Tensor::new(&[[1u32, 2]], &test_device())?, PAD)?;
    let m = message(ce_bleu(
        &logits,
        None,
        &one_element,
        &targets,
        1.0,
        &ce,
        &bleu,
    ));
    assert!(m.contains("`refs` has 1 batch elements"), "{m}");
    Ok(())
}
