//! The cross-entropy's options against PyTorch (tests/golden/ce_options_torch.py, committed with
//! its output): `reduction` (mean, sum, none) with padding (`ignore_index`) and label smoothing,
//! and the z-loss (`λ·lse²` per non-pad position, Liger's `lse_square_scale`),
//! from logits and from hidden states, on the kernels and on the composed references — values
//! and gradients to 1e-10 in f64 and 1e-5 relative in f32.
//!
//! The golden file also holds the other options of Liger-Kernel's fused cross-entropy (class
//! weights, z-loss, soft-capping, token accuracy); [`supported`] says which option sets the crate
//! implements, and the test counts them, so that a set cannot silently drop out.

mod common;

use candle_bleu::loss::{
    cross_entropy_from_hidden, cross_entropy_from_hidden_composed, cross_entropy_from_logits,
    cross_entropy_from_logits_composed, CrossEntropyConfig, CrossEntropyReduction, HiddenConfig,
};
use candle_core::{DType, Result, Tensor, Var};
use candle_nn::Linear;
use common::test_device;
use serde_json::Value;

const GOLDEN: &str = include_str!("golden/ce_options_torch.json");

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("an array")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

fn golden_cases() -> Vec<Value> {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    assert_eq!(golden["torch"], "2.15.0");
    assert_eq!(golden["pad"], 0);
    golden["cases"].as_array().unwrap().clone()
}

/// Whether the crate implements the option set `r` (the others are in the golden file for the
/// options still to come).
fn supported(r: &Value) -> bool {
    !r["weighted"].as_bool().unwrap() && r["softcap"].is_null()
}

fn reduction(r: &Value) -> CrossEntropyReduction {
    match r["reduction"].as_str().unwrap() {
        "mean" => CrossEntropyReduction::Mean,
        "sum" => CrossEntropyReduction::Sum,
        "none" => CrossEntropyReduction::None,
        other => panic!("reduction {other}"),
    }
}

fn config(r: &Value) -> CrossEntropyConfig {
    CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: r["label_smoothing"].as_f64().unwrap(),
        reduction: reduction(r),
        z_loss: r["z_loss"].as_f64().unwrap(),
    }
}

/// `max |ours − theirs| <= tol · max(1, max |theirs|)`.
fn compare(what: &str, ours: &[f64], theirs: &[f64], tol: f64) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let scale = theirs.iter().fold(1f64, |m, x| m.max(x.abs()));
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        assert!(
            (a - b).abs() <= tol * scale,
            "{what}[{i}]: {a} vs {b} (tolerance {tol} × {scale})"
        );
    }
}

fn flat(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// The loss to differentiate: the loss itself, or `Σ r_i loss_i` for per-token losses.
fn total(loss: &Tensor, row_weights: &Tensor) -> Result<Tensor> {
    if loss.rank() == 0 {
        Ok(loss.clone())
    } else {
        (loss * row_weights.to_dtype(loss.dtype())?)?.sum_all()
    }
}

fn check(dtype: DType, tol: f64) -> Result<usize> {
    let dev = test_device();
    let mut checked = 0;
    for case in golden_cases() {
        let shape: Vec<usize> = case["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        let (batch, seq) = (shape[0], shape[1]);
        let targets: Vec<u32> = numbers(&case["targets"])
            .iter()
            .map(|&x| x as u32)
            .collect();
        let targets = Tensor::from_vec(targets, (batch, seq), &dev)?;
        let row_weights = Tensor::from_vec(numbers(&case["row_weights"]), (batch, seq), &dev)?;
        let name = case["name"].as_str().unwrap();
        for r in case["results"].as_array().unwrap() {
            if !supported(r) {
                continue;
            }
            let cfg = config(r);
            let per_token = cfg.reduction == CrossEntropyReduction::None;
            let expected_dims: Vec<usize> = if per_token { vec![batch, seq] } else { vec![] };
            let expected_loss = if per_token {
                numbers(&r["loss"])
            } else {
                vec![r["loss"].as_f64().unwrap()]
            };
            for composed in [false, true] {
                let what =
                    format!("{name}, {r:?} (composed {composed}, {dtype:?})").replace('\n', " ");
                match case["kind"].as_str().unwrap() {
                    "logits" => {
                        let vocab = shape[2];
                        let logits =
                            Tensor::from_vec(numbers(&case["logits"]), (batch, seq, vocab), &dev)?
                                .to_dtype(dtype)?;
                        let x = Var::from_tensor(&logits)?;
                        let loss = if composed {
                            cross_entropy_from_logits_composed(x.as_tensor(), &targets, &cfg)?
                        } else {
                            cross_entropy_from_logits(x.as_tensor(), &targets, &cfg)?
                        };
                        assert_eq!(loss.dims(), expected_dims.as_slice());
                        compare(&format!("{what} loss"), &flat(&loss)?, &expected_loss, tol);
                        let grads = total(&loss, &row_weights)?.backward()?;
                        let grad = grads.get(x.as_tensor()).expect("a gradient");
                        compare(
                            &format!("{what} grad"),
                            &flat(grad)?,
                            &numbers(&r["grad_logits"]),
                            tol,
                        );
                    }
                    "hidden" => {
                        let (dim, vocab) = (shape[2], shape[3]);
                        let to = |key: &str, dims: &[usize]| -> Result<Var> {
                            Var::from_tensor(
                                &Tensor::from_vec(numbers(&case[key]), dims, &dev)?
                                    .to_dtype(dtype)?,
                            )
                        };
                        let h = to("hidden", &[batch, seq, dim])?;
                        let w = to("weight", &[vocab, dim])?;
                        let b = to("bias", &[vocab])?;
                        let proj = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
                        // Blocks of two rows: a block boundary inside a sequence of three.
                        let blocks = HiddenConfig {
                            block_elements: 2 * vocab,
                            ..Default::default()
                        };
                        let loss = if composed {
                            cross_entropy_from_hidden_composed(
                                h.as_tensor(),
                                &proj,
                                &targets,
                                &cfg,
                                &blocks,
                            )?
                        } else {
                            cross_entropy_from_hidden(
                                h.as_tensor(),
                                &proj,
                                &targets,
                                &cfg,
                                &blocks,
                            )?
                        };
                        assert_eq!(loss.dims(), expected_dims.as_slice());
                        compare(&format!("{what} loss"), &flat(&loss)?, &expected_loss, tol);
                        let grads = total(&loss, &row_weights)?.backward()?;
                        for (var, key) in
                            [(&h, "grad_hidden"), (&w, "grad_weight"), (&b, "grad_bias")]
                        {
                            let grad = grads.get(var.as_tensor()).expect("a gradient");
                            compare(
                                &format!("{what} {key}"),
                                &flat(grad)?,
                                &numbers(&r[key]),
                                tol,
                            );
                        }
                    }
                    kind => panic!("kind {kind}"),
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}

/// 3 cases × 12 supported option sets (3 reductions × 2 label smoothings × z-loss off and on)
/// × 2 paths.
const SUPPORTED_CHECKS: usize = 3 * 12 * 2;

#[test]
fn golden_pytorch_f64() -> Result<()> {
    assert_eq!(check(DType::F64, 1e-10)?, SUPPORTED_CHECKS);
    Ok(())
}

#[test]
fn golden_pytorch_f32() -> Result<()> {
    assert_eq!(check(DType::F32, 1e-5)?, SUPPORTED_CHECKS);
    Ok(())
}

/// `reduction = Sum` over padding only is 0 (PyTorch's), `Mean` is the named error; a training
/// step's loss refuses `None`, and so do the data-parallel functions.
#[test]
fn reductions_at_their_edges() -> Result<()> {
    use candle_bleu::loss::distributed::{self, ThreadAllReduce};
    use candle_bleu::loss::{ce_bleu_from_logits, References, TrainingLossConfig, TrainingTargets};
    let dev = test_device();
    let logits = Tensor::new(&[[[1f64, 2.0, 0.5], [0.0, -1.0, 3.0]]], &dev)?;
    let padding = Tensor::new(&[[0u32, 0]], &dev)?;
    let with = |reduction| CrossEntropyConfig {
        pad_id: Some(0),
        reduction,
        ..Default::default()
    };
    let sum = cross_entropy_from_logits(&logits, &padding, &with(CrossEntropyReduction::Sum))?;
    assert_eq!(sum.to_scalar::<f64>()?, 0.0);
    let none = cross_entropy_from_logits(&logits, &padding, &with(CrossEntropyReduction::None))?;
    assert_eq!(none.to_vec2::<f64>()?, [[0.0, 0.0]]);
    let err = cross_entropy_from_logits(&logits, &padding, &with(CrossEntropyReduction::Mean))
        .unwrap_err()
        .to_string();
    assert!(err.contains("is `pad_id`"), "{err}");

    let targets = Tensor::new(&[[2u32, 1]], &dev)?;
    let refs = References::from_ids(&targets, 0)?;
    let step = TrainingLossConfig {
        ce: with(CrossEntropyReduction::None),
        ..Default::default()
    };
    let err = ce_bleu_from_logits(&logits, &TrainingTargets::new(&targets, &refs), &step)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`ce.reduction` None"), "{err}");

    // Two workers, one element each: `Sum` is the global sum, `None` the named error.
    let logits2 = Tensor::new(
        &[
            [[1f64, 2.0, 0.5], [0.0, -1.0, 3.0]],
            [[0.2f64, 0.1, -0.4], [2.0, 1.0, 0.0]],
        ],
        &dev,
    )?;
    let targets2 = Tensor::new(&[[2u32, 1], [1, 0]], &dev)?;
    let single = cross_entropy_from_logits(&logits2, &targets2, &with(CrossEntropyReduction::Sum))?
        .to_scalar::<f64>()?;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadAllReduce::group(2)
            .into_iter()
            .enumerate()
            .map(|(w, reduce)| {
                let (logits, targets) = (&logits2, &targets2);
                s.spawn(move || -> Result<(f64, String)> {
                    let (l, t) = (logits.narrow(0, w, 1)?, targets.narrow(0, w, 1)?);
                    let sum = distributed::cross_entropy_from_logits(
                        &l,
                        &t,
                        &with(CrossEntropyReduction::Sum),
                        &reduce,
                    )?
                    .to_scalar::<f64>()?;
                    let none = distributed::cross_entropy_from_logits(
                        &l,
                        &t,
                        &with(CrossEntropyReduction::None),
                        &reduce,
                    )
                    .unwrap_err()
                    .to_string();
                    Ok((sum, none))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker"))
            .collect::<Result<Vec<_>>>()
    })?;
    for (sum, none) in results {
        assert!((sum - single).abs() < 1e-12, "{sum} vs {single}");
        assert!(
            none.contains("`reduction` None with data-parallel"),
            "{none}"
        );
    }
    Ok(())
}

/// The z-loss scale must be finite and `>= 0`: a named error on both paths.
#[test]
fn a_bad_z_loss_scale_is_a_named_error() -> Result<()> {
    let dev = test_device();
    let logits = Tensor::new(&[[[1f64, 2.0, 0.5], [0.0, -1.0, 3.0]]], &dev)?;
    let targets = Tensor::new(&[[2u32, 1]], &dev)?;
    let proj = Linear::new(Tensor::new(&[[1f64], [0.5], [-1.0]], &dev)?, None);
    let hidden = Tensor::new(&[[[0.3f64], [-0.2]]], &dev)?;
    for z_loss in [-0.1, f64::NAN, f64::INFINITY] {
        let cfg = CrossEntropyConfig {
            z_loss,
            ..Default::default()
        };
        for err in [
            cross_entropy_from_logits(&logits, &targets, &cfg).unwrap_err(),
            cross_entropy_from_hidden(&hidden, &proj, &targets, &cfg, &HiddenConfig::default())
                .unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(err.contains("`z_loss` must be finite and >= 0"), "{err}");
        }
    }
    Ok(())
}

/// The z-loss in a training step: every form of the BLEU loss (the paired form runs the
/// self-match pass, whose backward applies the softmax Jacobian), from logits and from hidden
/// states, the kernels against the composed references in f64 — values and gradients.
#[test]
fn z_loss_in_a_training_step_kernels_equal_composed() -> Result<()> {
    use candle_bleu::loss::{
        ce_bleu_from_hidden, ce_bleu_from_hidden_composed, ce_bleu_from_logits,
        ce_bleu_from_logits_composed, BleuLossConfig, Form, References, TrainingLossConfig,
        TrainingTargets,
    };
    let dev = test_device();
    let (batch, seq, dim, vocab) = (2, 4, 3, 6);
    let values = |n: usize, scale: f64, phase: f64| -> Vec<f64> {
        (0..n)
            .map(|i| scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0))
            .collect()
    };
    let hidden = Tensor::from_vec(values(batch * seq * dim, 1.5, 0.1), (batch, seq, dim), &dev)?;
    let weight = Tensor::from_vec(values(vocab * dim, 1.0, 0.4), (vocab, dim), &dev)?;
    let bias = Tensor::from_vec(values(vocab, 0.5, 0.7), vocab, &dev)?;
    let tokens = Tensor::new(&[[1u32, 2, 3, 4], [5, 1, 0, 0]], &dev)?;
    let refs = References::from_ids(&tokens, 0)?;
    let targets = TrainingTargets::new(&tokens, &refs);
    let blocks = HiddenConfig {
        block_elements: 2 * vocab,
        ..Default::default()
    };
    let mut checked = 0;
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        let cfg = TrainingLossConfig {
            bleu_weight: 0.7,
            ce: CrossEntropyConfig {
                pad_id: Some(0),
                label_smoothing: 0.1,
                z_loss: 0.05,
                ..Default::default()
            },
            bleu: BleuLossConfig {
                form,
                ..Default::default()
            },
        };
        let run = |from_hidden: bool, composed: bool| -> Result<Vec<Vec<f64>>> {
            let (h, w, b) = (
                Var::from_tensor(&hidden)?,
                Var::from_tensor(&weight)?,
                Var::from_tensor(&bias)?,
            );
            let proj = Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
            let out = match (from_hidden, composed) {
                (true, false) => {
                    ce_bleu_from_hidden(h.as_tensor(), &proj, &targets, &cfg, &blocks)?
                }
                (true, true) => {
                    ce_bleu_from_hidden_composed(h.as_tensor(), &proj, &targets, &cfg, &blocks)?
                }
                (false, c) => {
                    let logits = candle_core::Module::forward(&proj, h.as_tensor())?;
                    if c {
                        ce_bleu_from_logits_composed(&logits, &targets, &cfg)?
                    } else {
                        ce_bleu_from_logits(&logits, &targets, &cfg)?
                    }
                }
            };
            let grads = out.loss.backward()?;
            let mut all = vec![flat(&out.loss)?, flat(&out.cross_entropy)?];
            for v in [&h, &w, &b] {
                all.push(flat(grads.get(v.as_tensor()).expect("a gradient"))?);
            }
            Ok(all)
        };
        for from_hidden in [false, true] {
            let (kernels, composed) = (run(from_hidden, false)?, run(from_hidden, true)?);
            for (k, c) in kernels.iter().zip(&composed) {
                compare(&format!("{form:?}, hidden {from_hidden}"), k, c, 1e-10);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 6);
    Ok(())
}
