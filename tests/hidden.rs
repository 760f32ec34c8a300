//! The loss from hidden states (`cross_entropy_from_hidden`, `bleu_loss_from_hidden`,
//! `ce_bleu_from_hidden`) against the logits path on `proj.forward(hidden)`: values, BLEU
//! statistics and the gradients of `hidden`, the weight and the bias to 1e-10 in f64, for
//! every form × length model × reduction × smoothing, id references (one and several per
//! element), padding, label smoothing, hard lengths, with and without a bias, in one block and
//! in many, through the CPU kernels (the composed candle-op blocks: the unit tests of
//! `src/loss/hidden.rs`); finite
//! differences; gradient filtering within its stated bound; dtypes; errors.
//!
//! Every tensor is on `test_device()` (`CANDLE_BLEU_TEST_DEVICE`). Off the CPU the hidden-state
//! path runs the composed candle-op blocks (it has CPU kernels only) against the logits path's
//! kernels there; gradient filtering is a CPU-kernel feature, so elsewhere the test checks it
//! changes nothing; the value checks that read data on the host need `check_values` there.

mod common;

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    bleu_loss_from_hidden, bleu_loss_from_hidden_composed, bleu_loss_from_logits,
    ce_bleu_from_hidden, ce_bleu_from_hidden_composed, ce_bleu_from_logits,
    cross_entropy_from_hidden, cross_entropy_from_hidden_composed, cross_entropy_from_logits,
    BleuLossConfig, CrossEntropyConfig, Form, HiddenConfig, LengthModel, References,
    TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Module, Result, Tensor, Var};
use candle_nn::Linear;
use common::*;

const EOS: u32 = 5;
const VOCAB: usize = 7;
const DIM: usize = 4;

fn random(shape: &[usize], scale: f64, seed: u64) -> Result<Tensor> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let count = shape.iter().product();
    let values: Vec<f64> = (0..count).map(|_| rng.gen_range(-scale..scale)).collect();
    Tensor::from_vec(values, shape, &test_device())
}

/// Two elements of 5 positions, `D = 4`, over 7 tokens; id references with repeats (two
/// references for the second element, as `[B, R, T]`), targets with one padding position.
struct Fixture {
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor,
    refs: References,
    targets: Tensor,
    lengths: Tensor,
}

fn fixture() -> Result<Fixture> {
    let refs = vec![
        vec![vec![1u32, 2, 1, 2, 3]],
        vec![vec![2u32, 4, 4, 1], vec![4u32, 1, 2, 2, 6]],
    ];
    Ok(Fixture {
        hidden: random(&[2, 5, DIM], 1.2, 1)?,
        weight: random(&[VOCAB, DIM], 1.0, 2)?,
        bias: random(&[VOCAB], 0.5, 3)?,
        refs: References::from_ids(&reference_ids(&refs, PAD)?, PAD)?,
        targets: Tensor::new(&[[1u32, 2, 1, 2, 3], [2, 4, 4, 1, 0]], &test_device())?,
        lengths: Tensor::new(&[5u32, 4], &test_device())?,
    })
}

fn lengths_for<'a>(cfg: &BleuLossConfig, lengths: &'a Tensor) -> Option<&'a Tensor> {
    match cfg.length {
        LengthModel::SoftEos { .. } => None,
        _ => Some(lengths),
    }
}

fn ce_configs() -> [CrossEntropyConfig; 2] {
    [
        CrossEntropyConfig::default(),
        CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        },
    ]
}

/// A value and the gradients of `hidden`, the weight and (if any) the bias.
struct Evaluated {
    value: f64,
    extra: Vec<f64>,
    grads: Vec<Vec<f64>>,
}

fn flat(t: &Tensor) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// Evaluates `f(hidden, proj)` (a scalar and extra values to compare) on fresh variables and
/// back-propagates the scalar.
fn evaluate(
    f: impl Fn(&Tensor, &Linear) -> Result<(Tensor, Vec<Tensor>)>,
    hidden: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Evaluated> {
    let h = Var::from_tensor(hidden)?;
    let w = Var::from_tensor(weight)?;
    let b = bias.map(Var::from_tensor).transpose()?;
    let proj = Linear::new(
        w.as_tensor().clone(),
        b.as_ref().map(|b| b.as_tensor().clone()),
    );
    let (loss, extra) = f(h.as_tensor(), &proj)?;
    let grads = loss.backward()?;
    let mut all = vec![h.as_tensor(), w.as_tensor()];
    all.extend(b.as_ref().map(Var::as_tensor));
    let grads = all
        .into_iter()
        .map(|v| flat(grads.get(v).expect("a gradient for every input")))
        .collect::<Result<_>>()?;
    let extra = extra.iter().map(flat).collect::<Result<Vec<_>>>()?.concat();
    Ok(Evaluated {
        value: flat(&loss)?[0],
        extra,
        grads,
    })
}

fn assert_close(a: &Evaluated, b: &Evaluated, tol: f64, what: &str) {
    assert!(
        (a.value - b.value).abs() <= tol * b.value.abs().max(1.0),
        "{what}: value {} vs {}",
        a.value,
        b.value
    );
    assert_eq!(a.extra.len(), b.extra.len(), "{what}");
    for (x, y) in a.extra.iter().zip(&b.extra) {
        assert!(
            (x - y).abs() <= tol * y.abs().max(1.0),
            "{what}: {x} vs {y}"
        );
    }
    for (name, (ga, gb)) in ["hidden", "weight", "bias"]
        .iter()
        .zip(a.grads.iter().zip(&b.grads))
    {
        let scale = gb.iter().fold(1f64, |m, g| m.max(g.abs()));
        let diff = ga
            .iter()
            .zip(gb)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(diff <= tol * scale, "{what}: d{name} differs by {diff}");
    }
}

/// The ways the hidden-state path runs: its kernels in one block, in blocks of two rows (whole
/// sequences for the paired form), and with the exact backward in vocabulary tiles of 3
/// columns (not dividing `VOCAB`) and 4 rows; and its composed references (`…_composed`, what
/// devices without the kernels run) in one block and in blocks (tiles do not apply to them).
/// Each flag says whether the composed reference runs. Off the CPU both run composed ops.
fn paths() -> Vec<(&'static str, HiddenConfig, bool)> {
    let small = HiddenConfig {
        block_elements: 2 * VOCAB,
        ..Default::default()
    };
    let tiles = HiddenConfig {
        block_elements: 2 * VOCAB,
        vocab_tile: 3,
        ..Default::default()
    };
    vec![
        ("kernel, one block", HiddenConfig::default(), false),
        ("kernel, blocks", small, false),
        ("kernel, vocabulary tiles", tiles, false),
        ("composed, one block", HiddenConfig::default(), true),
        ("composed, blocks", small, true),
    ]
}

#[test]
fn ce_bleu_from_hidden_equals_the_logits_path() -> Result<()> {
    let fx = fixture()?;
    let mut checked = 0;
    for bleu in all_configs(4, EOS) {
        for ce in ce_configs() {
            for bias in [None, Some(&fx.bias)] {
                let hyp_lengths = lengths_for(&bleu, &fx.lengths);
                let logits_path = evaluate(
                    |h, proj| {
                        let cfg = TrainingLossConfig {
                            bleu_weight: 0.7,
                            ce: ce.clone(),
                            bleu: bleu.clone(),
                        };
                        let logits = proj.forward(h)?;
                        let out = ce_bleu_from_logits(
                            &logits,
                            &TrainingTargets {
                                tokens: &fx.targets,
                                refs: &fx.refs,
                                hyp_lengths,
                            },
                            &cfg,
                        )?;
                        Ok((
                            out.loss,
                            vec![
                                out.cross_entropy,
                                out.bleu.loss,
                                out.bleu.stats.matches,
                                out.bleu.stats.totals,
                                out.bleu.stats.hyp_len,
                            ],
                        ))
                    },
                    &fx.hidden,
                    &fx.weight,
                    bias,
                )?;
                for (path, hidden_cfg, composed) in paths() {
                    let cfg = TrainingLossConfig {
                        bleu_weight: 0.7,
                        ce: ce.clone(),
                        bleu: bleu.clone(),
                    };
                    let entry = if composed {
                        ce_bleu_from_hidden_composed
                    } else {
                        ce_bleu_from_hidden
                    };
                    let hidden_path = {
                        evaluate(
                            |h, proj| {
                                let out = entry(
                                    h,
                                    proj,
                                    &TrainingTargets {
                                        tokens: &fx.targets,
                                        refs: &fx.refs,
                                        hyp_lengths,
                                    },
                                    &cfg,
                                    &hidden_cfg,
                                )?;
                                Ok((
                                    out.loss,
                                    vec![
                                        out.cross_entropy,
                                        out.bleu.loss,
                                        out.bleu.stats.matches,
                                        out.bleu.stats.totals,
                                        out.bleu.stats.hyp_len,
                                    ],
                                ))
                            },
                            &fx.hidden,
                            &fx.weight,
                            bias,
                        )
                    }?;
                    let what = format!("{path}, bias {}, {bleu:?}, {ce:?}", bias.is_some());
                    assert_close(&hidden_path, &logits_path, 1e-10, &what);
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 36 * 2 * 2 * 5);
    Ok(())
}

#[test]
fn bleu_loss_from_hidden_equals_the_logits_path() -> Result<()> {
    let fx = fixture()?;
    for bleu in all_configs(3, EOS) {
        for bias in [None, Some(&fx.bias)] {
            let hyp_lengths = lengths_for(&bleu, &fx.lengths);
            let stats = |out: candle_bleu::loss::BleuLossOutput| {
                let s = out.stats;
                (out.loss, vec![s.matches, s.totals, s.hyp_len, s.ref_len])
            };
            let logits_path = evaluate(
                |h, proj| {
                    Ok(stats(bleu_loss_from_logits(
                        &proj.forward(h)?,
                        hyp_lengths,
                        &fx.refs,
                        &bleu,
                    )?))
                },
                &fx.hidden,
                &fx.weight,
                bias,
            )?;
            for (path, hidden_cfg, composed) in paths() {
                let entry = if composed {
                    bleu_loss_from_hidden_composed
                } else {
                    bleu_loss_from_hidden
                };
                let hidden_path = {
                    evaluate(
                        |h, proj| {
                            Ok(stats(entry(
                                h,
                                proj,
                                hyp_lengths,
                                &fx.refs,
                                &bleu,
                                &hidden_cfg,
                            )?))
                        },
                        &fx.hidden,
                        &fx.weight,
                        bias,
                    )
                }?;
                let what = format!("{path}, bias {}, {bleu:?}", bias.is_some());
                assert_close(&hidden_path, &logits_path, 1e-10, &what);
            }
        }
    }
    Ok(())
}

#[test]
fn cross_entropy_from_hidden_equals_the_logits_path() -> Result<()> {
    let fx = fixture()?;
    // Blocks of 3 rows: a block boundary inside a sequence of 5.
    let odd = HiddenConfig {
        block_elements: 3 * VOCAB + 2,
        ..Default::default()
    };
    for ce in ce_configs() {
        for bias in [None, Some(&fx.bias)] {
            let logits_path = evaluate(
                |h, proj| {
                    Ok((
                        cross_entropy_from_logits(&proj.forward(h)?, &fx.targets, &ce)?.loss,
                        vec![],
                    ))
                },
                &fx.hidden,
                &fx.weight,
                bias,
            )?;
            let mut paths = paths();
            paths.push(("kernel, blocks of 3", odd, false));
            paths.push(("composed, blocks of 3", odd, true));
            for (path, hidden_cfg, composed) in paths {
                let entry = if composed {
                    cross_entropy_from_hidden_composed
                } else {
                    cross_entropy_from_hidden
                };
                let hidden_path = {
                    evaluate(
                        |h, proj| Ok((entry(h, proj, &fx.targets, &ce, &hidden_cfg)?.loss, vec![])),
                        &fx.hidden,
                        &fx.weight,
                        bias,
                    )
                }?;
                let what = format!("{path}, bias {}, {ce:?}", bias.is_some());
                assert_close(&hidden_path, &logits_path, 1e-10, &what);
            }
        }
    }
    Ok(())
}

/// Matrix references are `[B, T, V]` themselves: the hidden-state entry points materialise the
/// logits and take the logits path, with the same numbers.
#[test]
fn matrix_references_take_the_logits_path() -> Result<()> {
    let fx = fixture()?;
    let matrix_refs = References::from_matrices(
        &one_hot(&[vec![1u32, 2, 1, 2, 3], vec![2u32, 4, 4, 1, 0]], VOCAB)?,
        &Tensor::new(&[5u32, 4], &test_device())?,
    )?;
    for bleu in all_configs(2, EOS) {
        let hyp_lengths = lengths_for(&bleu, &fx.lengths);
        let cfg = TrainingLossConfig {
            bleu: bleu.clone(),
            ..Default::default()
        };
        let logits_path = evaluate(
            |h, proj| {
                Ok((
                    ce_bleu_from_logits(
                        &proj.forward(h)?,
                        &TrainingTargets {
                            tokens: &fx.targets,
                            refs: &matrix_refs,
                            hyp_lengths,
                        },
                        &cfg,
                    )?
                    .loss,
                    vec![],
                ))
            },
            &fx.hidden,
            &fx.weight,
            Some(&fx.bias),
        )?;
        let hidden_path = evaluate(
            |h, proj| {
                Ok((
                    ce_bleu_from_hidden(
                        h,
                        proj,
                        &TrainingTargets {
                            tokens: &fx.targets,
                            refs: &matrix_refs,
                            hyp_lengths,
                        },
                        &cfg,
                        &HiddenConfig::default(),
                    )?
                    .loss,
                    vec![],
                ))
            },
            &fx.hidden,
            &fx.weight,
            Some(&fx.bias),
        )?;
        assert_close(&hidden_path, &logits_path, 1e-12, &format!("{bleu:?}"));
        let bleu_only = evaluate(
            |h, proj| {
                Ok((
                    bleu_loss_from_hidden(
                        h,
                        proj,
                        hyp_lengths,
                        &matrix_refs,
                        &bleu,
                        &HiddenConfig::default(),
                    )?
                    .loss,
                    vec![],
                ))
            },
            &fx.hidden,
            &fx.weight,
            None,
        )?;
        let bleu_logits = evaluate(
            |h, proj| {
                Ok((
                    bleu_loss_from_logits(&proj.forward(h)?, hyp_lengths, &matrix_refs, &bleu)?
                        .loss,
                    vec![],
                ))
            },
            &fx.hidden,
            &fx.weight,
            None,
        )?;
        assert_close(
            &bleu_only,
            &bleu_logits,
            1e-12,
            &format!("BLEU alone, {bleu:?}"),
        );
    }
    Ok(())
}

/// Tied embeddings: the output layer's weight is also the embedding table, so its gradient is
/// the sum of both uses — as on the logits path.
#[test]
fn tied_embeddings_accumulate_both_gradients() -> Result<()> {
    let fx = fixture()?;
    let tokens = Tensor::new(&[3u32, 1, 4, 1, 5, 2, 6, 2, 0, 3], &test_device())?;
    let cfg = TrainingLossConfig::default();
    let blocks = HiddenConfig {
        block_elements: VOCAB,
        ..Default::default()
    };
    let step = |from_hidden: bool| -> Result<Vec<f64>> {
        let table = Var::from_tensor(&fx.weight)?;
        let proj = Linear::new(table.as_tensor().clone(), None);
        let hidden = table
            .as_tensor()
            .index_select(&tokens, 0)?
            .reshape((2, 5, DIM))?
            .tanh()?;
        let loss = if from_hidden {
            ce_bleu_from_hidden(
                &hidden,
                &proj,
                &TrainingTargets::new(&fx.targets, &fx.refs),
                &cfg,
                &blocks,
            )?
            .loss
        } else {
            ce_bleu_from_logits(
                &proj.forward(&hidden)?,
                &TrainingTargets::new(&fx.targets, &fx.refs),
                &cfg,
            )?
            .loss
        };
        flat(loss.backward()?.get(table.as_tensor()).unwrap())
    };
    let (hidden_grad, logits_grad) = (step(true)?, step(false)?);
    // Off the CPU the composed blocks against the CUDA kernels: other summation orders.
    let tol = if test_device().is_cpu() { 1e-12 } else { 1e-10 };
    for (a, b) in hidden_grad.iter().zip(&logits_grad) {
        assert!((a - b).abs() < tol, "{a} vs {b}");
    }
    Ok(())
}

#[test]
fn gradients_pass_finite_differences() -> Result<()> {
    let fx = fixture()?;
    let grad_cfg = GradCheckConfig {
        eps: 1e-6,
        atol: 1e-8,
        rtol: 1e-5,
        ..Default::default()
    };
    let ce = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        ..Default::default()
    };
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [LengthModel::Given, LengthModel::SoftEos { eos_id: EOS }] {
            let cfg = TrainingLossConfig {
                bleu_weight: 0.5,
                ce: ce.clone(),
                bleu: BleuLossConfig {
                    form,
                    length,
                    ..Default::default()
                },
            };
            let blocks = HiddenConfig {
                block_elements: 2 * VOCAB,
                ..Default::default()
            };
            let hyp_lengths = lengths_for(&cfg.bleu, &fx.lengths);
            let proj = Linear::new(fx.weight.clone(), Some(fx.bias.clone()));
            let report = check_gradients(
                |h| {
                    Ok(ce_bleu_from_hidden(
                        h,
                        &proj,
                        &TrainingTargets {
                            tokens: &fx.targets,
                            refs: &fx.refs,
                            hyp_lengths,
                        },
                        &cfg,
                        &blocks,
                    )?
                    .loss)
                },
                &fx.hidden,
                &grad_cfg,
            )?;
            assert!(
                report.passed && !report.gradient_missing,
                "hidden, {form:?} {length:?}: {report}"
            );
            for (name, index) in [("weight", 0), ("bias", 1)] {
                let at = if index == 0 { &fx.weight } else { &fx.bias };
                let report = check_gradients(
                    |x| {
                        let proj = if index == 0 {
                            Linear::new(x.clone(), Some(fx.bias.clone()))
                        } else {
                            Linear::new(fx.weight.clone(), Some(x.clone()))
                        };
                        Ok(ce_bleu_from_hidden(
                            &fx.hidden,
                            &proj,
                            &TrainingTargets {
                                tokens: &fx.targets,
                                refs: &fx.refs,
                                hyp_lengths,
                            },
                            &cfg,
                            &blocks,
                        )?
                        .loss)
                    },
                    at,
                    &grad_cfg,
                )?;
                assert!(
                    report.passed && !report.gradient_missing,
                    "{name}, {form:?} {length:?}: {report}"
                );
            }
        }
    }
    Ok(())
}

/// A peaked output distribution over `V = 300`: 16 frequent tokens with large weights and a
/// bias of 20, the rest with small ones, so that every tile of 16 rare columns holds
/// probabilities near `e^-20` in every row (the filter skips them).
/// Targets and reference ids are spread over the whole vocabulary, so that the sparse terms of
/// skipped tiles matter.
struct Peaked {
    hidden: Tensor,
    weight: Tensor,
    bias: Tensor,
    refs: References,
    targets: Tensor,
}

fn peaked() -> Result<Peaked> {
    use rand::{Rng, SeedableRng};
    let (batch, seq, dim, vocab) = (2, 6, 8, 300);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let weight: Vec<f64> = (0..vocab * dim)
        .map(|i| {
            let scale = if i / dim < 16 { 4.0 } else { 0.05 };
            rng.gen_range(-scale..scale)
        })
        .collect();
    let ids: Vec<u32> = (0..batch * seq)
        .map(|_| rng.gen_range(1..vocab as u32))
        .collect();
    let mut targets = ids.clone();
    targets[seq - 1] = 0; // one padding position
    Ok(Peaked {
        hidden: random(&[batch, seq, dim], 2.0, 12)?,
        weight: Tensor::from_vec(weight, (vocab, dim), &test_device())?,
        // The frequent tokens' bias of 20 puts every row's maximum far above the rare tokens'
        // logits, so every tile of rare columns lies below τ in all rows of a block.
        bias: (random(&[vocab], 0.1, 13)?
            + Tensor::from_vec(
                (0..vocab)
                    .map(|v| if v < 16 { 20.0 } else { 0.0 })
                    .collect::<Vec<f64>>(),
                vocab,
                &test_device(),
            )?)?,
        refs: References::from_ids(&Tensor::from_vec(ids, (batch, seq), &test_device())?, 0)?,
        targets: Tensor::from_vec(targets, (batch, seq), &test_device())?,
    })
}

/// Gradient filtering: the skipped tiles' error stays within the bound `HiddenConfig` states,
/// computed here from the exact logits path, row by row for `dH` and column by column for
/// `dW` and `db`; the value is exact.
#[test]
fn filtered_gradients_stay_within_the_stated_bound() -> Result<()> {
    let fx = peaked()?;
    let (vocab, dim) = fx.weight.dims2()?;
    let tau = 1e-6;
    let ce = CrossEntropyConfig {
        pad_id: Some(0),
        label_smoothing: 0.1,
        ..Default::default()
    };
    for form in [Form::Expected, Form::LowerBound] {
        let train_cfg = TrainingLossConfig {
            bleu_weight: 0.5,
            ce: ce.clone(),
            bleu: BleuLossConfig {
                form,
                max_order: 2,
                ..Default::default()
            },
        };
        let blocks = |filter_below| HiddenConfig {
            block_elements: 3 * vocab,
            vocab_tile: 16,
            filter_below,
        };
        let (refs, targets) = (&fx.refs, &fx.targets);
        let loss_of = |filter_below: Option<f64>| {
            let (cfg, blocks) = (train_cfg.clone(), blocks(filter_below));
            move |h: &Tensor, proj: &Linear| {
                let targets = TrainingTargets::new(targets, refs);
                let out = ce_bleu_from_hidden(h, proj, &targets, &cfg, &blocks)?;
                Ok((out.loss, vec![]))
            }
        };
        let exact = evaluate(loss_of(None), &fx.hidden, &fx.weight, Some(&fx.bias))?;
        let filtered = evaluate(loss_of(Some(tau)), &fx.hidden, &fx.weight, Some(&fx.bias))?;
        assert_eq!(exact.value, filtered.value, "the forward is not filtered");
        if !test_device().is_cpu() {
            // Off the CPU the composed blocks run; their gradients are exact, unfiltered.
            assert_close(&filtered, &exact, 1e-12, "filtering off the CPU");
            continue;
        }
        // With a threshold below every probability nothing is skipped: the exact gradients.
        let nothing_skipped = evaluate(
            loss_of(Some(1e-300)),
            &fx.hidden,
            &fx.weight,
            Some(&fx.bias),
        )?;
        assert_close(&nothing_skipped, &exact, 1e-12, "threshold 1e-300");

        // The exact logits gradient gives p and c_r = (G[r,v] - o_r) / p[r,v] at a column that
        // is neither the row's target nor a reference id.
        let proj = Linear::new(fx.weight.clone(), Some(fx.bias.clone()));
        let logits = Var::from_tensor(&proj.forward(&fx.hidden)?.reshape((12, vocab))?)?;
        let loss = ce_bleu_from_logits(
            &logits.as_tensor().reshape((2, 6, vocab))?,
            &TrainingTargets::new(&fx.targets, &fx.refs),
            &train_cfg,
        )?
        .loss;
        let grad_logits = loss
            .backward()?
            .get(logits.as_tensor())
            .unwrap()
            .to_vec2::<f64>()?;
        let probs = candle_nn::ops::softmax(logits.as_tensor(), 1)?.to_vec2::<f64>()?;
        let targets = fx.targets.flatten_all()?.to_vec1::<u32>()?;
        let ref_ids = fx.refs.ids().unwrap();
        let non_pad = targets.iter().filter(|&&t| t != 0).count() as f64;
        let hidden = fx.hidden.reshape((12, dim))?.to_vec2::<f64>()?;
        let weight = fx.weight.to_vec2::<f64>()?;
        let norm = |x: &[f64]| x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let max_weight_norm = weight.iter().map(|w| norm(w)).fold(0f64, f64::max);
        let mut c = [0f64; 12];
        for r in 0..12 {
            let special: Vec<u32> = std::iter::once(targets[r])
                .chain(ref_ids[r / 6].concat())
                .collect();
            let offset = if targets[r] == 0 {
                0.0
            } else {
                -0.1 / vocab as f64 / non_pad
            };
            let v = (0..vocab)
                .filter(|&v| !special.contains(&(v as u32)))
                .max_by(|&a, &b| probs[r][a].total_cmp(&probs[r][b]))
                .unwrap();
            c[r] = (grad_logits[r][v] - offset) / probs[r][v];
        }
        let small = |r: usize, v: usize| if probs[r][v] < tau { probs[r][v] } else { 0.0 };
        let (dh_exact, dh_filtered) = (&exact.grads[0], &filtered.grads[0]);
        let mut largest_error = 0f64;
        for r in 0..12 {
            let error: Vec<f64> = (0..dim)
                .map(|d| dh_filtered[r * dim + d] - dh_exact[r * dim + d])
                .collect();
            let skipped_mass: f64 = (0..vocab).map(|v| small(r, v)).sum();
            let bound = c[r].abs() * skipped_mass * max_weight_norm;
            assert!(
                norm(&error) <= bound * (1.0 + 1e-6) + 1e-14,
                "{form:?} dH row {r}: error {} > bound {bound}",
                norm(&error)
            );
            largest_error = largest_error.max(norm(&error));
        }
        assert!(
            largest_error > 0.0,
            "{form:?}: no tile was skipped; the test needs a peaked distribution"
        );
        for v in 0..vocab {
            let error: Vec<f64> = (0..dim)
                .map(|d| filtered.grads[1][v * dim + d] - exact.grads[1][v * dim + d])
                .collect();
            let bound: f64 = (0..12)
                .map(|r| c[r].abs() * small(r, v) * norm(&hidden[r]))
                .sum();
            assert!(
                norm(&error) <= bound * (1.0 + 1e-6) + 1e-14,
                "{form:?} dW row {v}: {} > {bound}",
                norm(&error)
            );
            let bias_error = (filtered.grads[2][v] - exact.grads[2][v]).abs();
            let bias_bound: f64 = (0..12).map(|r| c[r].abs() * small(r, v)).sum();
            assert!(
                bias_error <= bias_bound * (1.0 + 1e-6) + 1e-14,
                "{form:?} db[{v}]: {bias_error} > {bias_bound}"
            );
        }
    }
    Ok(())
}

/// The paired form is not filtered (its dense gradient has a term the bound does not cover):
/// with a threshold it gives the exact gradients.
#[test]
fn the_paired_form_ignores_filtering() -> Result<()> {
    let fx = peaked()?;
    let vocab = fx.weight.dim(0)?;
    let cfg = TrainingLossConfig {
        bleu: BleuLossConfig {
            form: Form::Paired,
            max_order: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    let blocks = |filter_below| HiddenConfig {
        block_elements: 6 * vocab,
        vocab_tile: 16,
        filter_below,
    };
    let run = |filter_below| {
        evaluate(
            |h, proj| {
                Ok((
                    ce_bleu_from_hidden(
                        h,
                        proj,
                        &TrainingTargets::new(&fx.targets, &fx.refs),
                        &cfg,
                        &blocks(filter_below),
                    )?
                    .loss,
                    vec![],
                ))
            },
            &fx.hidden,
            &fx.weight,
            Some(&fx.bias),
        )
    };
    let (exact, filtered) = (run(None)?, run(Some(1e-3))?);
    assert_eq!(exact.grads, filtered.grads);
    Ok(())
}

/// f32 runs in f32 (close to f64); f16 and bf16 hidden states and weights are computed in f32:
/// exactly the f32 numbers of the upcast inputs, with gradients in the inputs' dtype.
#[test]
fn dtypes() -> Result<()> {
    let fx = fixture()?;
    let cfg = TrainingLossConfig {
        ce: CrossEntropyConfig {
            pad_id: Some(0),
            label_smoothing: 0.1,
            ..Default::default()
        },
        ..Default::default()
    };
    let loss_with = |dtype: DType| -> Result<(f64, Tensor)> {
        let h = Var::from_tensor(&fx.hidden.to_dtype(dtype)?)?;
        let proj = Linear::new(fx.weight.to_dtype(dtype)?, Some(fx.bias.to_dtype(dtype)?));
        let out = ce_bleu_from_hidden(
            h.as_tensor(),
            &proj,
            &TrainingTargets::new(&fx.targets, &fx.refs),
            &cfg,
            &HiddenConfig::default(),
        )?;
        assert_eq!(
            out.loss.dtype(),
            if dtype == DType::F64 {
                DType::F64
            } else {
                DType::F32
            }
        );
        let grad = out.loss.backward()?.get(h.as_tensor()).unwrap().clone();
        assert_eq!(grad.dtype(), dtype);
        Ok((flat(&out.loss)?[0], grad))
    };
    let (f64_loss, _) = loss_with(DType::F64)?;
    let (f32_loss, _) = loss_with(DType::F32)?;
    assert!(
        (f64_loss - f32_loss).abs() < 1e-5,
        "{f64_loss} vs {f32_loss}"
    );
    for half in [DType::BF16, DType::F16] {
        let (half_loss, half_grad) = loss_with(half)?;
        // The same computation on the inputs rounded to `half` and upcast to f32.
        let h = Var::from_tensor(&fx.hidden.to_dtype(half)?.to_dtype(DType::F32)?)?;
        let proj = Linear::new(
            fx.weight.to_dtype(half)?.to_dtype(DType::F32)?,
            Some(fx.bias.to_dtype(half)?.to_dtype(DType::F32)?),
        );
        let out = ce_bleu_from_hidden(
            h.as_tensor(),
            &proj,
            &TrainingTargets::new(&fx.targets, &fx.refs),
            &cfg,
            &HiddenConfig::default(),
        )?;
        assert_eq!(half_loss, flat(&out.loss)?[0], "{half:?}");
        let upcast_grad = out
            .loss
            .backward()?
            .get(h.as_tensor())
            .unwrap()
            .to_dtype(half)?;
        assert_eq!(flat(&half_grad)?, flat(&upcast_grad)?, "{half:?}");
    }
    Ok(())
}

#[test]
fn errors_name_the_argument() -> Result<()> {
    let fx = fixture()?;
    let proj = Linear::new(fx.weight.clone(), Some(fx.bias.clone()));
    let cfg = TrainingLossConfig::default();
    let ce = CrossEntropyConfig::default();
    let hidden_cfg = HiddenConfig::default();
    let expect = |result: Result<()>, needle: &str| {
        let message = result.expect_err(needle).to_string();
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    };
    let ce_bleu_with =
        |h: &Tensor, proj: &Linear, cfg: &TrainingLossConfig, blocks: &HiddenConfig| {
            let targets = TrainingTargets::new(&fx.targets, &fx.refs);
            ce_bleu_from_hidden(h, proj, &targets, cfg, blocks).map(|_| ())
        };
    let ce_bleu = |h: &Tensor, proj: &Linear, cfg: &TrainingLossConfig| {
        ce_bleu_with(h, proj, cfg, &hidden_cfg)
    };
    expect(
        ce_bleu(&fx.hidden.flatten_to(1)?, &proj, &cfg),
        "`hidden` must be [B, S, D]",
    );
    expect(
        ce_bleu(&fx.targets.unsqueeze(2)?, &proj, &cfg),
        "`hidden` must be a float tensor",
    );
    expect(
        ce_bleu(&fx.hidden.narrow(2, 0, 3)?, &proj, &cfg),
        "`proj.weight` must be [V, D]",
    );
    let f32_proj = Linear::new(fx.weight.to_dtype(DType::F32)?, None);
    expect(
        ce_bleu(&fx.hidden, &f32_proj, &cfg),
        "`proj.weight` is F32 but `hidden` is F64",
    );
    let bad_bias = Linear::new(fx.weight.clone(), Some(fx.bias.narrow(0, 0, 5)?));
    expect(
        ce_bleu(&fx.hidden, &bad_bias, &cfg),
        "`proj.bias` must be [V] = [7]",
    );
    for (hidden_cfg, needle) in [
        (
            HiddenConfig {
                block_elements: 0,
                ..Default::default()
            },
            "`block_elements`",
        ),
        (
            HiddenConfig {
                vocab_tile: 0,
                ..Default::default()
            },
            "`vocab_tile`",
        ),
        (
            HiddenConfig {
                filter_below: Some(1.5),
                ..Default::default()
            },
            "`filter_below`",
        ),
        (
            HiddenConfig {
                filter_below: Some(f64::NAN),
                ..Default::default()
            },
            "`filter_below`",
        ),
    ] {
        expect(ce_bleu_with(&fx.hidden, &proj, &cfg, &hidden_cfg), needle);
        expect(
            cross_entropy_from_hidden(&fx.hidden, &proj, &fx.targets, &ce, &hidden_cfg).map(|_| ()),
            needle,
        );
    }
    let short_targets = fx.targets.narrow(1, 0, 4)?;
    expect(
        cross_entropy_from_hidden(&fx.hidden, &proj, &short_targets, &ce, &hidden_cfg).map(|_| ()),
        "`targets` must be u32 [2, 5]",
    );
    let bad_target = Tensor::new(&[[1u32, 2, 9, 2, 3], [2, 4, 4, 1, 0]], &test_device())?;
    expect(
        cross_entropy_from_hidden(&fx.hidden, &proj, &bad_target, &ce, &hidden_cfg).map(|_| ()),
        // In place on the CPU (the first bad value named); elsewhere one small copy.
        if test_device().is_cpu() {
            "`targets[0, 2]` = 9"
        } else {
            "`targets` holds 9"
        },
    );
    let one_ref = References::from_ids(&Tensor::new(&[[1u32, 2]], &test_device())?, 0)?;
    expect(
        bleu_loss_from_hidden(
            &fx.hidden,
            &proj,
            None,
            &one_ref,
            &BleuLossConfig::default(),
            &hidden_cfg,
        )
        .map(|_| ()),
        "`refs` has 1 batch elements but `hidden` has 2",
    );
    let far_eos = TrainingLossConfig {
        bleu: BleuLossConfig {
            length: LengthModel::NotEos { eos_id: 7 },
            ..Default::default()
        },
        ..Default::default()
    };
    expect(
        ce_bleu(&fx.hidden, &proj, &far_eos),
        "`eos_id` 7 is out of the vocabulary",
    );
    let negative = TrainingLossConfig {
        bleu_weight: -1.0,
        ..Default::default()
    };
    expect(ce_bleu(&fx.hidden, &proj, &negative), "`bleu_weight`");
    // The checks that read values on the host: in place on the CPU, always; elsewhere only with
    // `check_values`.
    let checked = TrainingLossConfig {
        bleu: BleuLossConfig {
            check_values: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let long = Tensor::new(&[6u32, 2], &test_device())?;
    expect(
        ce_bleu_from_hidden(
            &fx.hidden,
            &proj,
            &TrainingTargets::new(&fx.targets, &fx.refs).with_hyp_lengths(&long),
            &checked,
            &hidden_cfg,
        )
        .map(|_| ()),
        "`hyp_lengths[0]` = 6 exceeds S = 5",
    );
    // Non-finite logits (an infinite weight): found by the CPU kernel, named; elsewhere by the
    // check of `proj.weight`.
    let inf_weight = fx
        .weight
        .broadcast_add(&Tensor::new(&[f64::INFINITY], &test_device())?)?;
    let inf_proj = Linear::new(inf_weight, None);
    expect(
        ce_bleu(&fx.hidden, &inf_proj, &checked),
        "contain NaN or infinite values",
    );
    Ok(())
}

/// Device-to-host copies: none for the BLEU loss from id references; the cross-entropy's
/// composed path reads one summary of the targets, as from logits.
#[test]
fn host_copies() -> Result<()> {
    use candle_bleu::loss::host_copies;
    let fx = fixture()?;
    let proj = Linear::new(fx.weight.clone(), None);
    let cfg = TrainingLossConfig::default();
    let copies = |f: &dyn Fn() -> Result<()>| -> Result<u64> {
        let before = host_copies();
        f()?;
        Ok(host_copies() - before)
    };
    let bleu = || {
        bleu_loss_from_hidden(
            &fx.hidden,
            &proj,
            Some(&fx.lengths),
            &fx.refs,
            &cfg.bleu,
            &HiddenConfig::default(),
        )
        .map(|_| ())
    };
    let ce_bleu = || {
        ce_bleu_from_hidden(
            &fx.hidden,
            &proj,
            &TrainingTargets::new(&fx.targets, &fx.refs),
            &cfg,
            &HiddenConfig::default(),
        )
        .map(|_| ())
    };
    assert_eq!(copies(&bleu)?, 0);
    // The targets: read in place on the CPU, one counted summary (largest id, count) elsewhere.
    assert_eq!(copies(&ce_bleu)?, u64::from(!test_device().is_cpu()));
    Ok(())
}
