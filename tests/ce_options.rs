//! The cross-entropy's options against PyTorch (tests/golden/ce_options_torch.py, committed with
//! its output): `reduction` (mean, sum, none) with padding (`ignore_index`) and label smoothing,
//! the z-loss (`λ·lse²` per non-pad position, Liger's `lse_square_scale`) and the value of its
//! part, logit soft-capping (`c·tanh(z/c)`, Liger's `softcap`), and the token accuracy (Liger's `return_token_accuracy`), from logits and from hidden
//! states, on the kernels and on the composed references, with the metrics asked for and not —
//! values and gradients to 1e-10 in f64 and 1e-5 relative in f32.
//!
//! The golden file holds every option set of Liger-Kernel's fused cross-entropy and PyTorch's
//! `F.cross_entropy` (class weights with smoothing and `ignore_index`, the reductions, the z-loss,
//! soft-capping, the token accuracy); the test checks and counts them all, so that a set cannot
//! silently drop out.

mod common;

use candle_bleu::loss::{
    cross_entropy_from_hidden, cross_entropy_from_hidden_composed, cross_entropy_from_logits,
    cross_entropy_from_logits_composed, CrossEntropyConfig, CrossEntropyOutput,
    CrossEntropyReduction, HiddenConfig,
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

fn reduction(r: &Value) -> CrossEntropyReduction {
    match r["reduction"].as_str().unwrap() {
        "mean" => CrossEntropyReduction::Mean,
        "sum" => CrossEntropyReduction::Sum,
        "none" => CrossEntropyReduction::None,
        other => panic!("reduction {other}"),
    }
}

fn config(r: &Value, class_weights: &[f64], token_accuracy: bool) -> CrossEntropyConfig {
    CrossEntropyConfig {
        pad_id: Some(0),
        class_weights: r["weighted"]
            .as_bool()
            .unwrap()
            .then(|| class_weights.to_vec().into()),
        label_smoothing: r["label_smoothing"].as_f64().unwrap(),
        reduction: reduction(r),
        z_loss: r["z_loss"].as_f64().unwrap(),
        softcap: r["softcap"].as_f64(),
        token_accuracy,
        check_values: false,
    }
}

/// The reported metrics against PyTorch's: the z-loss's part (`None` at `λ = 0`; for `None`,
/// per position, whose sum over the `n` non-pad positions PyTorch's file records as a mean) and
/// the token accuracy (`None` unless asked for).
fn check_metrics(
    what: &str,
    out: &CrossEntropyOutput,
    r: &Value,
    cfg: &CrossEntropyConfig,
    count: usize,
    tol: f64,
) -> Result<()> {
    match &out.z_loss {
        None => assert_eq!(cfg.z_loss, 0.0, "{what}: no z-loss value"),
        Some(z) => {
            assert!(cfg.z_loss != 0.0, "{what}: a z-loss value at λ = 0");
            let value = if cfg.reduction == CrossEntropyReduction::None {
                assert_eq!(z.dims(), out.loss.dims(), "{what}: per-position z-loss");
                flat(z)?.iter().sum::<f64>() / count as f64
            } else {
                assert_eq!(z.rank(), 0, "{what}: a scalar z-loss");
                flat(z)?[0]
            };
            compare(
                &format!("{what} z_loss"),
                &[value],
                &[r["z_loss_value"].as_f64().unwrap()],
                tol,
            );
        }
    }
    match &out.token_accuracy {
        None => assert!(!cfg.token_accuracy, "{what}: no token accuracy"),
        Some(accuracy) => {
            assert!(cfg.token_accuracy, "{what}: an accuracy not asked for");
            assert_eq!(accuracy.rank(), 0, "{what}: a scalar accuracy");
            compare(
                &format!("{what} token_accuracy"),
                &flat(accuracy)?,
                &[r["token_accuracy"].as_f64().unwrap()],
                tol,
            );
        }
    }
    Ok(())
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

/// The bad-input tests' inputs: logits `[1, 2, 3]` with their targets, and hidden states
/// `[1, 2, 1]` with an output layer giving 3 classes.
struct Tiny {
    dev: candle_core::Device,
    logits: Tensor,
    targets: Tensor,
    proj: Linear,
    hidden: Tensor,
}

fn tiny() -> Result<Tiny> {
    let dev = test_device();
    Ok(Tiny {
        logits: Tensor::new(&[[[1f64, 2.0, 0.5], [0.0, -1.0, 3.0]]], &dev)?,
        targets: Tensor::new(&[[2u32, 1]], &dev)?,
        proj: Linear::new(Tensor::new(&[[1f64], [0.5], [-1.0]], &dev)?, None),
        hidden: Tensor::new(&[[[0.3f64], [-0.2]]], &dev)?,
        dev,
    })
}

/// Deterministic values in `[-scale, scale)`, for the fixtures.
fn values(n: usize, scale: f64, phase: f64) -> Vec<f64> {
    (0..n)
        .map(|i| scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0))
        .collect()
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
        let count = targets.iter().filter(|&&t| t != 0).count();
        let targets = Tensor::from_vec(targets, (batch, seq), &dev)?;
        let row_weights = Tensor::from_vec(numbers(&case["row_weights"]), (batch, seq), &dev)?;
        let name = case["name"].as_str().unwrap();
        for r in case["results"].as_array().unwrap() {
            for token_accuracy in [false, true] {
                let cfg = config(r, &numbers(&case["class_weights"]), token_accuracy);
                let per_token = cfg.reduction == CrossEntropyReduction::None;
                let expected_dims: Vec<usize> = if per_token { vec![batch, seq] } else { vec![] };
                let expected_loss = if per_token {
                    numbers(&r["loss"])
                } else {
                    vec![r["loss"].as_f64().unwrap()]
                };
                for composed in [false, true] {
                    let what = format!(
                        "{name}, {r:?} (composed {composed}, accuracy {token_accuracy}, {dtype:?})"
                    )
                    .replace('\n', " ");
                    match case["kind"].as_str().unwrap() {
                        "logits" => {
                            let vocab = shape[2];
                            let logits = Tensor::from_vec(
                                numbers(&case["logits"]),
                                (batch, seq, vocab),
                                &dev,
                            )?
                            .to_dtype(dtype)?;
                            let x = Var::from_tensor(&logits)?;
                            let out = if composed {
                                cross_entropy_from_logits_composed(x.as_tensor(), &targets, &cfg)?
                            } else {
                                cross_entropy_from_logits(x.as_tensor(), &targets, &cfg)?
                            };
                            check_metrics(&what, &out, r, &cfg, count, tol)?;
                            let loss = out.loss;
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
                            let proj =
                                Linear::new(w.as_tensor().clone(), Some(b.as_tensor().clone()));
                            // Blocks of two rows: a block boundary inside a sequence of three.
                            let blocks = HiddenConfig {
                                block_elements: 2 * vocab,
                                ..Default::default()
                            };
                            let out = if composed {
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
                            check_metrics(&what, &out, r, &cfg, count, tol)?;
                            let loss = out.loss;
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
    }
    Ok(checked)
}

/// 4 cases (the last: two targets whose class weights sum to exactly 1, so the weighted mean's
/// divisor is 1 while the z-loss stays a mean over the tokens) × 48 option sets (class weights
/// off and on × 2 label smoothings × 3 reductions × z-loss off and on × soft-capping off and on)
/// × the token accuracy asked for or not × 2 paths.
const SUPPORTED_CHECKS: usize = 4 * 48 * 2 * 2;

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
    use candle_bleu::loss::distributed::{DataParallel, ThreadAllReduce};
    use candle_bleu::loss::{ce_bleu_from_logits, References, TrainingLossConfig, TrainingTargets};
    let dev = test_device();
    let logits = Tensor::new(&[[[1f64, 2.0, 0.5], [0.0, -1.0, 3.0]]], &dev)?;
    let padding = Tensor::new(&[[0u32, 0]], &dev)?;
    // The value checks on: off the CPU, errors over only padding need the count on the host
    // (without them a GPU gives NaN; `src/loss/run.rs`'s unit tests cover that path).
    let with = |reduction| CrossEntropyConfig {
        pad_id: Some(0),
        reduction,
        check_values: true,
        ..Default::default()
    };
    let sum = cross_entropy_from_logits(&logits, &padding, &with(CrossEntropyReduction::Sum))?;
    assert_eq!(sum.loss.to_scalar::<f64>()?, 0.0);
    let none = cross_entropy_from_logits(&logits, &padding, &with(CrossEntropyReduction::None))?;
    assert_eq!(none.loss.to_vec2::<f64>()?, [[0.0, 0.0]]);
    // The token accuracy over no positions is undefined: a named error, on both paths.
    for reduction in [CrossEntropyReduction::Sum, CrossEntropyReduction::None] {
        let cfg = CrossEntropyConfig {
            token_accuracy: true,
            ..with(reduction)
        };
        for err in [
            cross_entropy_from_logits(&logits, &padding, &cfg).unwrap_err(),
            cross_entropy_from_logits_composed(&logits, &padding, &cfg).unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(err.contains("`token_accuracy` over no positions"), "{err}");
        }
    }
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
        .loss
        .to_scalar::<f64>()?;
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = ThreadAllReduce::group(2)
            .into_iter()
            .enumerate()
            .map(|(w, reduce)| {
                let (logits, targets) = (&logits2, &targets2);
                s.spawn(move || -> Result<(f64, String)> {
                    let (l, t) = (logits.narrow(0, w, 1)?, targets.narrow(0, w, 1)?);
                    let dp = DataParallel::new(&reduce);
                    let sum = dp
                        .cross_entropy_from_logits(&l, &t, &with(CrossEntropyReduction::Sum))?
                        .loss
                        .to_scalar::<f64>()?;
                    let none = dp
                        .cross_entropy_from_logits(&l, &t, &with(CrossEntropyReduction::None))
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
    let Tiny {
        dev: _,
        logits,
        targets,
        proj,
        hidden,
    } = tiny()?;
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

/// The z-loss, class weights and the metrics in a training step: every form of the BLEU loss
/// (the paired form runs the self-match pass, whose backward applies the softmax Jacobian),
/// from logits and from hidden states, the kernels against the composed references in f64 —
/// values and gradients.
#[test]
fn z_loss_in_a_training_step_kernels_equal_composed() -> Result<()> {
    use candle_bleu::loss::{
        ce_bleu_from_hidden, ce_bleu_from_hidden_composed, ce_bleu_from_logits,
        ce_bleu_from_logits_composed, BleuLossConfig, Form, References, TrainingLossConfig,
        TrainingTargets,
    };
    let dev = test_device();
    let (batch, seq, dim, vocab) = (2, 4, 3, 6);
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
                token_accuracy: true,
                // Every class weighted (one at 0): the kernels' weighted offsets, in the row
                // pass and in the self-match pass's Jacobian, against the composed ops.
                class_weights: Some(vec![0.5, 1.5, 0.0, 1.25, 0.75, 2.0].into()),
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
            let (Some(z), Some(accuracy)) = (&out.z_loss, &out.token_accuracy) else {
                panic!(
                    "a training step's metrics: {:?} {:?}",
                    out.z_loss, out.token_accuracy
                );
            };
            let mut all = vec![
                flat(&out.loss)?,
                flat(&out.cross_entropy)?,
                flat(z)?,
                flat(accuracy)?,
            ];
            for v in [&h, &w, &b] {
                all.push(flat(grads.get(v.as_tensor()).expect("a gradient"))?);
            }
            Ok(all)
        };
        // The cross-entropy alone reports the same metrics.
        let logits = candle_core::Module::forward(
            &Linear::new(weight.clone(), Some(bias.clone())),
            &hidden,
        )?;
        let alone = cross_entropy_from_logits(&logits, &tokens, &cfg.ce)?;
        let alone = [
            flat(&alone.loss)?,
            flat(&alone.z_loss.expect("z"))?,
            flat(&alone.token_accuracy.expect("accuracy"))?,
        ];
        for from_hidden in [false, true] {
            let (kernels, composed) = (run(from_hidden, false)?, run(from_hidden, true)?);
            for (k, c) in kernels.iter().zip(&composed) {
                compare(&format!("{form:?}, hidden {from_hidden}"), k, c, 1e-10);
            }
            for (k, a) in kernels[1..4].iter().zip(&alone) {
                compare(
                    &format!("{form:?}, hidden {from_hidden}, alone"),
                    k,
                    a,
                    1e-10,
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 6);
    Ok(())
}

/// The loss and metrics of a data-parallel group equal the single process's, from logits and
/// from hidden states, under `Mean` and `Sum`, with and without class weights (the weighted
/// mean over the global `Σ w_t`): worker 1's shard holds only padding. Class weights with the
/// z-loss under `Mean` are refused in a group, by name.
#[test]
fn metrics_of_a_group_equal_the_single_process() -> Result<()> {
    use candle_bleu::loss::distributed::{DataParallel, ThreadAllReduce};
    let dev = test_device();
    let (batch, seq, dim, vocab) = (3, 3, 4, 7);
    let hidden = Tensor::from_vec(values(batch * seq * dim, 2.0, 0.2), (batch, seq, dim), &dev)?;
    let proj = Linear::new(
        Tensor::from_vec(values(vocab * dim, 1.5, 0.6), (vocab, dim), &dev)?,
        Some(Tensor::from_vec(values(vocab, 0.5, 0.3), vocab, &dev)?),
    );
    let logits = candle_core::Module::forward(&proj, &hidden)?;
    let tokens = Tensor::new(&[[1u32, 2, 3], [4, 5, 0], [0, 0, 0]], &dev)?;
    let blocks = HiddenConfig::default();
    let scalars = |out: CrossEntropyOutput| -> Result<Vec<f64>> {
        let mut values = flat(&out.loss)?;
        for metric in out.z_loss.iter().chain(&out.token_accuracy) {
            values.extend(flat(metric)?);
        }
        Ok(values)
    };
    let class_weights: std::sync::Arc<[f64]> = values(vocab, 0.5, 0.9)
        .iter()
        .map(|w| w + 0.75)
        .collect::<Vec<_>>()
        .into();
    let mut checked = 0;
    for (reduction, weighted, z_loss) in [
        (CrossEntropyReduction::Mean, false, 0.02),
        (CrossEntropyReduction::Sum, false, 0.02),
        (CrossEntropyReduction::Mean, true, 0.0),
        (CrossEntropyReduction::Sum, true, 0.02),
    ] {
        let cfg = CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            class_weights: weighted.then(|| class_weights.clone()),
            reduction,
            z_loss,
            softcap: Some(2.0),
            token_accuracy: true,
            check_values: false,
        };
        let single = scalars(cross_entropy_from_logits(&logits, &tokens, &cfg)?)?;
        let cfg = &cfg;
        for from_hidden in [false, true] {
            let ranges = [(0, 2), (2, 1)];
            let workers = std::thread::scope(|s| {
                let handles: Vec<_> = ThreadAllReduce::group(2)
                    .into_iter()
                    .zip(ranges)
                    .map(|(reduce, (start, len))| {
                        let (hidden, logits, tokens, proj, blocks) =
                            (&hidden, &logits, &tokens, &proj, &blocks);
                        s.spawn(move || -> Result<Vec<f64>> {
                            let dp = DataParallel::new(&reduce);
                            let t = tokens.narrow(0, start, len)?;
                            let out = if from_hidden {
                                let h = hidden.narrow(0, start, len)?;
                                dp.cross_entropy_from_hidden(&h, proj, &t, cfg, blocks)?
                            } else {
                                let l = logits.narrow(0, start, len)?;
                                dp.cross_entropy_from_logits(&l, &t, cfg)?
                            };
                            scalars(out)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a worker"))
                    .collect::<Result<Vec<_>>>()
            })?;
            for worker in workers {
                compare(
                    &format!("{reduction:?}, weighted {weighted}, hidden {from_hidden}"),
                    &worker,
                    &single,
                    1e-12,
                );
            }
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
    let cfg = CrossEntropyConfig {
        pad_id: Some(0),
        class_weights: Some(class_weights),
        z_loss: 0.02,
        ..Default::default()
    };
    let err = std::thread::scope(|s| {
        s.spawn(|| {
            let group = ThreadAllReduce::group(1);
            DataParallel::new(&group[0])
                .cross_entropy_from_logits(&logits, &tokens, &cfg)
                .unwrap_err()
                .to_string()
        })
        .join()
        .expect("a worker")
    });
    assert!(
        err.contains("`class_weights` with `z_loss` in data-parallel"),
        "{err}"
    );
    Ok(())
}

/// Ties: the accuracy counts a target as correct only where it is the first of equal maxima,
/// as `argmax` picks it — on the kernels and the composed references alike.
#[test]
fn token_accuracy_breaks_ties_as_argmax_does() -> Result<()> {
    let dev = test_device();
    // Row 0: maxima at 0 and 2, target 2 (not the argmax); row 1: maxima at 1 and 3, target 1.
    let logits = Tensor::new(&[[[3f64, 1.0, 3.0, 0.0], [0.0, 2.0, 1.0, 2.0]]], &dev)?;
    let targets = Tensor::new(&[[2u32, 1]], &dev)?;
    let cfg = CrossEntropyConfig {
        token_accuracy: true,
        ..Default::default()
    };
    for out in [
        cross_entropy_from_logits(&logits, &targets, &cfg)?,
        cross_entropy_from_logits_composed(&logits, &targets, &cfg)?,
    ] {
        assert_eq!(
            out.token_accuracy.expect("accuracy").to_scalar::<f64>()?,
            0.5
        );
        assert!(out.z_loss.is_none());
    }
    Ok(())
}

/// Soft-capping in a training step: the BLEU term sees the capped logits too — the loss and
/// gradients equal those of the same step without the option on logits capped by hand — and the
/// hidden-state path's kernels equal its composed blocks.
#[test]
fn softcap_reaches_the_bleu_term() -> Result<()> {
    use candle_bleu::loss::{
        ce_bleu_from_hidden, ce_bleu_from_hidden_composed, ce_bleu_from_logits, BleuLossConfig,
        Form, References, TrainingLossConfig, TrainingTargets,
    };
    let dev = test_device();
    let (batch, seq, dim, vocab) = (2, 4, 3, 6);
    let hidden = Tensor::from_vec(values(batch * seq * dim, 3.0, 0.1), (batch, seq, dim), &dev)?;
    let weight = Tensor::from_vec(values(vocab * dim, 2.0, 0.4), (vocab, dim), &dev)?;
    let proj = Linear::new(weight, None);
    let tokens = Tensor::new(&[[1u32, 2, 3, 4], [5, 1, 0, 0]], &dev)?;
    let refs = References::from_ids(&tokens, 0)?;
    let targets = TrainingTargets::new(&tokens, &refs);
    let cap = 1.5;
    for form in [Form::Expected, Form::Paired] {
        let cfg = |softcap| TrainingLossConfig {
            bleu_weight: 0.7,
            ce: CrossEntropyConfig {
                pad_id: Some(0),
                softcap,
                ..Default::default()
            },
            bleu: BleuLossConfig {
                form,
                ..Default::default()
            },
        };
        let h = Var::from_tensor(&hidden)?;
        let step = |capped_by_hand: bool| -> Result<Vec<Vec<f64>>> {
            let logits = candle_core::Module::forward(&proj, h.as_tensor())?;
            let out = if capped_by_hand {
                let capped = ((logits / cap)?.tanh()? * cap)?;
                ce_bleu_from_logits(&capped, &targets, &cfg(None))?
            } else {
                ce_bleu_from_logits(&logits, &targets, &cfg(Some(cap)))?
            };
            let grads = out.loss.backward()?;
            Ok(vec![
                flat(&out.loss)?,
                flat(&out.bleu.loss)?,
                flat(grads.get(h.as_tensor()).expect("a gradient"))?,
            ])
        };
        let (option, by_hand) = (step(false)?, step(true)?);
        for (a, b) in option.iter().zip(&by_hand) {
            compare(&format!("{form:?}, option vs by hand"), a, b, 1e-12);
        }
        let blocks = HiddenConfig {
            block_elements: 2 * vocab,
            ..Default::default()
        };
        for composed in [false, true] {
            let h = Var::from_tensor(&hidden)?;
            let out = if composed {
                ce_bleu_from_hidden_composed(
                    h.as_tensor(),
                    &proj,
                    &targets,
                    &cfg(Some(cap)),
                    &blocks,
                )?
            } else {
                ce_bleu_from_hidden(h.as_tensor(), &proj, &targets, &cfg(Some(cap)), &blocks)?
            };
            let grads = out.loss.backward()?;
            let got = [
                flat(&out.loss)?,
                flat(&out.bleu.loss)?,
                flat(grads.get(h.as_tensor()).expect("a gradient"))?,
            ];
            for (a, b) in got.iter().zip(&option) {
                compare(
                    &format!("{form:?}, hidden, composed {composed}"),
                    a,
                    b,
                    1e-10,
                );
            }
        }
    }
    Ok(())
}

/// A cap that is not finite and positive, and a cap with gradient filtering, are named errors;
/// with a cap, infinite logits are still refused (`tanh` would hide them).
#[test]
fn bad_softcaps_are_named_errors() -> Result<()> {
    let Tiny {
        dev,
        logits,
        targets,
        proj,
        hidden,
    } = tiny()?;
    for cap in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let cfg = CrossEntropyConfig {
            softcap: Some(cap),
            ..Default::default()
        };
        for err in [
            cross_entropy_from_logits(&logits, &targets, &cfg).unwrap_err(),
            cross_entropy_from_hidden(&hidden, &proj, &targets, &cfg, &HiddenConfig::default())
                .unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(err.contains("`softcap` must be finite and > 0"), "{err}");
        }
    }
    let cfg = CrossEntropyConfig {
        softcap: Some(5.0),
        ..Default::default()
    };
    let filtered = HiddenConfig {
        filter_below: Some(1e-6),
        ..Default::default()
    };
    let err = cross_entropy_from_hidden(&hidden, &proj, &targets, &cfg, &filtered)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`softcap` (5) with gradient filtering"),
        "{err}"
    );
    let infinite = Tensor::new(&[[[1f64, f64::INFINITY, 0.5], [0.0, -1.0, 3.0]]], &dev)?;
    for err in [
        cross_entropy_from_logits(&infinite, &targets, &cfg).unwrap_err(),
        cross_entropy_from_logits_composed(&infinite, &targets, &cfg).unwrap_err(),
    ] {
        let err = err.to_string();
        assert!(err.contains("NaN or infinite"), "{err}");
    }
    if dev.is_cpu() {
        // Finite inputs whose product overflows: the CPU blocks check the logits before capping.
        let huge = Linear::new(Tensor::new(&[[1f64], [f64::MAX], [-1.0]], &dev)?, None);
        let hidden = Tensor::new(&[[[3.0f64], [-2.0]]], &dev)?;
        let err =
            cross_entropy_from_hidden(&hidden, &huge, &targets, &cfg, &HiddenConfig::default())
                .unwrap_err()
                .to_string();
        assert!(err.contains("NaN or infinite"), "{err}");
    }
    Ok(())
}

/// Class weights of the wrong length, negative or not finite, whose non-pad targets sum to 0
/// under `Mean`, or combined with gradient filtering, are named errors.
#[test]
fn bad_class_weights_are_named_errors() -> Result<()> {
    let Tiny {
        dev: _,
        logits,
        targets,
        proj,
        hidden,
    } = tiny()?;
    let with = |weights: Vec<f64>| CrossEntropyConfig {
        class_weights: Some(weights.into()),
        ..Default::default()
    };
    for (weights, needle) in [
        (vec![1.0, 1.0], "`class_weights` must hold V = 3 values"),
        (vec![1.0, -0.5, 1.0], "`class_weights[1]` = -0.5"),
        (vec![1.0, 1.0, f64::NAN], "`class_weights[2]` = NaN"),
        (vec![1.0, 0.0, 0.0], "sum to 0: the weighted mean"),
    ] {
        let cfg = with(weights);
        for err in [
            cross_entropy_from_logits(&logits, &targets, &cfg).unwrap_err(),
            cross_entropy_from_logits_composed(&logits, &targets, &cfg).unwrap_err(),
            cross_entropy_from_hidden(&hidden, &proj, &targets, &cfg, &HiddenConfig::default())
                .unwrap_err(),
        ] {
            let err = err.to_string();
            assert!(err.contains(needle), "{needle}: {err}");
        }
    }
    // A weight sum of 0 is a sum, not an error, under `Sum`.
    let cfg = CrossEntropyConfig {
        reduction: CrossEntropyReduction::Sum,
        ..with(vec![1.0, 0.0, 0.0])
    };
    let sum = cross_entropy_from_logits(&logits, &targets, &cfg)?.loss;
    assert_eq!(sum.to_scalar::<f64>()?, 0.0);
    let filtered = HiddenConfig {
        filter_below: Some(1e-6),
        ..Default::default()
    };
    let err = cross_entropy_from_hidden(&hidden, &proj, &targets, &with(vec![1.0; 3]), &filtered)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`class_weights` with gradient filtering"),
        "{err}"
    );
    Ok(())
}

/// Every option on at once — class weights, label smoothing, the z-loss, soft-capping, padding —
/// through `gradcheck` (central differences in f64): from logits, and from hidden states with
/// respect to the hidden states (the weight and bias through the golden checks above), on the
/// kernels and the composed references, under each reduction (`None` summed with weights).
#[test]
fn every_option_at_once_passes_gradcheck() -> Result<()> {
    use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
    let dev = test_device();
    let (batch, seq, dim, vocab) = (2, 3, 4, 6);
    let hidden = Tensor::from_vec(values(batch * seq * dim, 1.5, 0.3), (batch, seq, dim), &dev)?;
    let proj = Linear::new(
        Tensor::from_vec(values(vocab * dim, 1.0, 0.7), (vocab, dim), &dev)?,
        Some(Tensor::from_vec(values(vocab, 0.5, 0.2), vocab, &dev)?),
    );
    let logits = candle_core::Module::forward(&proj, &hidden)?;
    let targets = Tensor::new(&[[1u32, 4, 0], [5, 2, 3]], &dev)?;
    let row_weights = Tensor::from_vec(values(batch * seq, 1.0, 0.5), (batch, seq), &dev)?;
    let mut checked = 0;
    for reduction in [
        CrossEntropyReduction::Mean,
        CrossEntropyReduction::Sum,
        CrossEntropyReduction::None,
    ] {
        let cfg = CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.2,
            reduction,
            z_loss: 0.03,
            softcap: Some(2.5),
            token_accuracy: true,
            class_weights: Some(vec![1.0, 0.5, 2.0, 0.0, 1.5, 0.75].into()),
            check_values: false,
        };
        for composed in [false, true] {
            let from_logits = |x: &Tensor| -> Result<Tensor> {
                let out = if composed {
                    cross_entropy_from_logits_composed(x, &targets, &cfg)?
                } else {
                    cross_entropy_from_logits(x, &targets, &cfg)?
                };
                total(&out.loss, &row_weights)
            };
            let from_hidden = |h: &Tensor| -> Result<Tensor> {
                let blocks = HiddenConfig {
                    block_elements: 2 * vocab,
                    ..Default::default()
                };
                let out = if composed {
                    cross_entropy_from_hidden_composed(h, &proj, &targets, &cfg, &blocks)?
                } else {
                    cross_entropy_from_hidden(h, &proj, &targets, &cfg, &blocks)?
                };
                total(&out.loss, &row_weights)
            };
            for (what, report) in [
                (
                    "logits",
                    check_gradients(from_logits, &logits, &GradCheckConfig::default())?,
                ),
                (
                    "hidden",
                    check_gradients(from_hidden, &hidden, &GradCheckConfig::default())?,
                ),
            ] {
                assert!(
                    report.passed && !report.gradient_missing,
                    "{reduction:?}, composed {composed}, {what}: {report}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 12);
    Ok(())
}

/// Class weights with a z-loss whose non-pad targets' weights sum to exactly 1 (two targets of
/// weight 0.5): the loss is still the weighted mean `Σ w_t·ce_t / Σ w_t` plus the z-term's
/// mean `λ·Σ lse² / n` (a reduction that guessed the mean from a divisor `!= 1` summed the
/// z-term here: 1.762 instead of 1.134). Value and gradient against an independent f64
/// computation, from logits and hidden states (an identity output layer), on the kernels and
/// the composed references, alone and in a training step. A data-parallel group refuses class
/// weights with a z-loss under `Mean` (named error).
#[test]
fn class_weights_summing_to_one_with_z_loss_are_a_weighted_mean() -> Result<()> {
    if !common::f64_supported("class_weights_summing_to_one_with_z_loss_are_a_weighted_mean") {
        return Ok(());
    }
    let dev = test_device();
    let rows = [[1.0f64, 2.0, 0.5, 0.0, -1.0], [0.3, -1.0, 2.0, 0.1, 0.2]];
    let target = [1usize, 2];
    let weights = [1.0f64, 0.5, 0.5, 1.0, 1.0];
    let lambda = 0.1;
    // The expected loss and gradient, in f64 by hand: lse_r, p_r = softmax(z_r).
    let n = rows.len() as f64;
    let weight_sum: f64 = target.iter().map(|&t| weights[t]).sum();
    assert_eq!(weight_sum, 1.0);
    let mut expected = 0.0;
    let mut expected_grad = Vec::new();
    for (z, &t) in rows.iter().zip(&target) {
        let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + z.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        expected += weights[t] * (lse - z[t]) / weight_sum + lambda * lse * lse / n;
        for (v, x) in z.iter().enumerate() {
            let p = (x - lse).exp();
            let one_hot = if v == t { 1.0 } else { 0.0 };
            expected_grad
                .push(weights[t] / weight_sum * (p - one_hot) + lambda / n * 2.0 * lse * p);
        }
    }
    assert!((expected - 1.134).abs() < 1e-3, "{expected}");
    let cfg = CrossEntropyConfig {
        pad_id: None,
        class_weights: Some(weights.to_vec().into()),
        z_loss: lambda,
        ..Default::default()
    };
    let targets = Tensor::new(&[[1u32, 2]], &dev)?;
    let logits = Var::from_tensor(&Tensor::new(&[rows], &dev)?)?;
    let hidden = Var::from_tensor(&Tensor::new(&[rows], &dev)?)?;
    let identity = Linear::new(Tensor::eye(5, DType::F64, &dev)?, None);
    let blocks = HiddenConfig {
        block_elements: 5,
        ..Default::default()
    };
    let refs = candle_bleu::loss::References::from_ids(&targets, 0)?;
    let training_targets = candle_bleu::loss::TrainingTargets::new(&targets, &refs);
    let training = candle_bleu::loss::TrainingLossConfig {
        bleu_weight: 0.0,
        ce: cfg.clone(),
        ..Default::default()
    };
    let mut checked = 0;
    for composed in [false, true] {
        let (x, h) = (logits.as_tensor(), hidden.as_tensor());
        let outs = [
            ("logits", x, {
                if composed {
                    cross_entropy_from_logits_composed(x, &targets, &cfg)?.loss
                } else {
                    cross_entropy_from_logits(x, &targets, &cfg)?.loss
                }
            }),
            ("hidden", h, {
                if composed {
                    cross_entropy_from_hidden_composed(h, &identity, &targets, &cfg, &blocks)?.loss
                } else {
                    cross_entropy_from_hidden(h, &identity, &targets, &cfg, &blocks)?.loss
                }
            }),
            ("training step, logits", x, {
                if composed {
                    candle_bleu::loss::ce_bleu_from_logits_composed(
                        x,
                        &training_targets,
                        &training,
                    )?
                    .cross_entropy
                } else {
                    candle_bleu::loss::ce_bleu_from_logits(x, &training_targets, &training)?
                        .cross_entropy
                }
            }),
            ("training step, hidden", h, {
                if composed {
                    candle_bleu::loss::ce_bleu_from_hidden_composed(
                        h,
                        &identity,
                        &training_targets,
                        &training,
                        &blocks,
                    )?
                    .cross_entropy
                } else {
                    candle_bleu::loss::ce_bleu_from_hidden(
                        h,
                        &identity,
                        &training_targets,
                        &training,
                        &blocks,
                    )?
                    .cross_entropy
                }
            }),
        ];
        for (what, input, loss) in outs {
            let what = format!("{what}, composed {composed}");
            compare(&format!("{what} loss"), &flat(&loss)?, &[expected], 1e-12);
            let grads = loss.backward()?;
            let grad = grads.get(input).expect("a gradient");
            compare(&format!("{what} grad"), &flat(grad)?, &expected_grad, 1e-12);
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
    use candle_bleu::loss::distributed::{DataParallel, SingleWorker};
    let err = DataParallel::new(&SingleWorker)
        .cross_entropy_from_logits(logits.as_tensor(), &targets, &cfg)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`class_weights` with `z_loss`"), "{err}");
    Ok(())
}
