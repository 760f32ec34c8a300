//! The study example: its incremental soft decoder computes what the seq2seq model computes,
//! its gradients through the unrolled soft decode match finite differences in f64, and
//! `--quick` runs end to end with results that the written files reproduce.

mod common;
use candle_bleu::exact::{corpus_bleu, BleuConfig};
use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, BleuLossConfig, Form, LengthModel, References,
};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarMap;
use common::{check_rescorable_results, example_command};
use std::path::{Path, PathBuf};

use candle_bleu_research::data::{BOS, EOS, PAD};
use candle_bleu_research::model::soft_decode::{weights_of, Feedback, SoftDecoder, Weights};
use candle_bleu_research::model::transformer::{PositionAdd, Transformer, TransformerConfig};

fn tiny_config() -> TransformerConfig {
    TransformerConfig {
        src_vocab: 9,
        tgt_vocab: 8,
        d_model: 8,
        heads: 2,
        d_ff: 12,
        encoder_layers: 1,
        decoder_layers: 2,
        max_len: 11,
        dropout: 0.0,
        tie_all: false,
        positions: PositionAdd::Lookup,
    }
}

/// A seeded tiny model, its f32 weights, and a source batch with padding.
fn tiny_model(seed: u64) -> (VarMap, Transformer, Tensor) {
    let varmap = VarMap::new();
    let model = Transformer::new(tiny_config(), &varmap, seed, &Device::Cpu).unwrap();
    let src = Tensor::new(
        &[[4u32, 5, 6, 7], [8, 4, PAD, PAD], [6, 6, 5, PAD]],
        &Device::Cpu,
    )
    .unwrap();
    (varmap, model, src)
}

fn to_f64(weights: &Weights) -> Weights {
    weights
        .iter()
        .map(|(name, t)| (name.clone(), t.to_dtype(DType::F64).unwrap()))
        .collect()
}

#[test]
fn cached_teacher_forced_decode_equals_the_models_parallel_decode() {
    let (varmap, model, src) = tiny_model(3);
    let dec_in = Tensor::new(
        &[[BOS, 4u32, 5, 6, 7], [BOS, 3, 3, 5, PAD], [BOS, 7, 6, 5, 4]],
        &Device::Cpu,
    )
    .unwrap();
    let memory = model.encode(&src, PAD, None).unwrap();
    let expected = model
        .logits(&model.decode(&dec_in, &memory, None).unwrap())
        .unwrap();
    let decoder = SoftDecoder::new(&weights_of(&varmap, true), tiny_config()).unwrap();
    let got = decoder
        .teacher_forced(&decoder.encode(&src).unwrap(), &dec_in)
        .unwrap();
    assert_eq!(got.dims(), expected.dims());
    let diff = (got - &expected)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let scale = expected
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        scale > 0.1,
        "logits of scale {scale}: the comparison would be vacuous"
    );
    assert!(
        diff < 1e-5 * scale.max(1.0),
        "max |cached - parallel| = {diff}"
    );
}

#[test]
fn cached_greedy_decode_equals_the_models_greedy_decode() {
    for seed in [1, 2, 5] {
        let (varmap, model, src) = tiny_model(seed);
        let expected = model.greedy(&src, 9).unwrap();
        let decoder = SoftDecoder::new(&weights_of(&varmap, true), tiny_config()).unwrap();
        assert_eq!(decoder.greedy(&src, 9).unwrap(), expected, "seed {seed}");
    }
}

/// The BLEU loss of a soft free-running decode of the tiny model (f64), as a function of one
/// weight tensor.
fn soft_decode_loss(
    weights: &Weights,
    name: &str,
    value: &Tensor,
    src: &Tensor,
    refs: &References,
    cfg: &BleuLossConfig,
    from_logits: bool,
) -> candle_core::Result<Tensor> {
    let mut weights = weights.clone();
    weights.insert(name.to_string(), value.clone());
    let err = |e: anyhow::Error| candle_core::Error::Msg(e.to_string());
    let decoder = SoftDecoder::new(&weights, tiny_config()).map_err(err)?;
    let memory = decoder.encode(src).map_err(err)?;
    let logits = decoder
        .unroll(&memory, 5, Feedback::Expected)
        .map_err(err)?;
    let out = if from_logits {
        bleu_loss_from_logits(&logits, None, refs, cfg)?
    } else {
        bleu_loss(
            &candle_nn::ops::softmax(&logits, D::Minus1)?,
            None,
            refs,
            cfg,
        )?
    };
    Ok(out.loss)
}

#[test]
fn soft_free_running_decode_gradients_match_finite_differences() {
    let (varmap, _, src) = tiny_model(7);
    let weights = to_f64(&weights_of(&varmap, true));
    // References of 2 tokens: the soft length (~ 5 * (1 - 1/8) on average) stays far from 2,
    // away from the brevity penalty's switch.
    let refs = References::from_ids(
        &Tensor::new(&[[4u32, 5], [6, 7], [5, 5]], &Device::Cpu).unwrap(),
        PAD,
    )
    .unwrap();
    let soft_eos = LengthModel::SoftEos { eos_id: EOS };
    let gradcheck = GradCheckConfig {
        eps: 1e-6,
        atol: 1e-8,
        rtol: 1e-5,
        ..GradCheckConfig::default()
    };
    // The target embedding enters every step through the fed-back expected embedding; the
    // decoder's self-attention queries see every earlier fed-back step.
    for (name, form, from_logits) in [
        ("tgt_embedding", Form::Expected, true),
        ("tgt_embedding", Form::Paired, false),
        ("decoder.1.self_attention.q.weight", Form::LowerBound, true),
        ("output.weight", Form::Expected, false),
    ] {
        let cfg = BleuLossConfig {
            form,
            length: soft_eos,
            ..BleuLossConfig::default()
        };
        let point = weights[name].clone();
        let f = |x: &Tensor| soft_decode_loss(&weights, name, x, &src, &refs, &cfg, from_logits);
        let report = check_gradients(f, &point, &gradcheck).unwrap();
        assert!(
            report.passed && !report.gradient_missing,
            "{name} {form:?}: {report}"
        );
        assert_eq!(report.checked, point.elem_count());
    }
}

#[test]
fn the_soft_decode_gradient_flows_through_the_fed_back_embeddings() {
    // Rows of the target embedding other than BOS enter the decode only through the feedback:
    // their gradient is nonzero with soft feedback, and zero when every step is fed BOS.
    let (varmap, _, src) = tiny_model(11);
    let weights = to_f64(&weights_of(&varmap, true));
    let embedding = candle_core::Var::from_tensor(&weights["tgt_embedding"]).unwrap();
    let mut with_var = weights.clone();
    with_var.insert("tgt_embedding".into(), embedding.as_tensor().clone());
    let decoder = SoftDecoder::new(&with_var, tiny_config()).unwrap();
    let refs = References::from_ids(
        &Tensor::new(&[[4u32, 5], [6, 7], [5, 5]], &Device::Cpu).unwrap(),
        PAD,
    )
    .unwrap();
    let cfg = BleuLossConfig {
        length: LengthModel::SoftEos { eos_id: EOS },
        ..BleuLossConfig::default()
    };
    let memory = decoder.encode(&src).unwrap();
    let logits = decoder.unroll(&memory, 5, Feedback::Expected).unwrap();
    let loss = bleu_loss_from_logits(&logits, None, &refs, &cfg)
        .unwrap()
        .loss;
    let grads = loss.backward().unwrap();
    let grad = grads
        .get(embedding.as_tensor())
        .expect("a gradient for the embedding");
    let row_norm = |row: u32| -> f64 {
        grad.get(row as usize)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            .sqrt()
    };
    for row in [3u32, 4, 7] {
        assert!(
            row_norm(row) > 1e-8,
            "row {row}: gradient norm {}",
            row_norm(row)
        );
    }
    // Sanity of the statement above: a decode that never feeds anything but BOS (one step)
    // leaves the other rows without gradient.
    let one_step = decoder.unroll(&memory, 1, Feedback::Expected).unwrap();
    let loss = bleu_loss_from_logits(
        &one_step,
        None,
        &refs,
        &BleuLossConfig {
            max_order: 1,
            ..cfg
        },
    )
    .unwrap()
    .loss;
    let grads = loss.backward().unwrap();
    let grad = grads
        .get(embedding.as_tensor())
        .expect("a gradient for the embedding");
    let other = grad
        .narrow(0, 3, 5)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert_eq!(other, 0.0);
}

#[test]
fn gumbel_feedback_is_seeded_hard_forward_and_differentiable() {
    let (varmap, _, src) = tiny_model(13);
    let weights = to_f64(&weights_of(&varmap, true));
    let embedding = candle_core::Var::from_tensor(&weights["tgt_embedding"]).unwrap();
    let mut with_var = weights.clone();
    with_var.insert("tgt_embedding".into(), embedding.as_tensor().clone());
    let decoder = SoftDecoder::new(&with_var, tiny_config()).unwrap();
    let memory = decoder.encode(&src).unwrap();
    let gumbel = |seed| {
        decoder
            .unroll(&memory, 6, Feedback::Gumbel { tau: 0.5, seed })
            .unwrap()
    };
    let (a, b, c) = (gumbel(1), gumbel(1), gumbel(2));
    let max_diff = |x: &Tensor, y: &Tensor| {
        (x - y)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    assert_eq!(max_diff(&a, &b), 0.0, "same seed, same decode");
    assert!(max_diff(&a, &c) > 0.0, "another seed samples other tokens");
    // The first step sees only BOS: identical in every mode.
    let expected = decoder.unroll(&memory, 6, Feedback::Expected).unwrap();
    assert_eq!(
        max_diff(
            &a.narrow(1, 0, 1).unwrap(),
            &expected.narrow(1, 0, 1).unwrap()
        ),
        0.0
    );
    // The straight-through path carries a finite, nonzero gradient to the embedding.
    let refs = References::from_ids(
        &Tensor::new(&[[4u32, 5], [6, 7], [5, 5]], &Device::Cpu).unwrap(),
        PAD,
    )
    .unwrap();
    let cfg = BleuLossConfig {
        length: LengthModel::SoftEos { eos_id: EOS },
        ..BleuLossConfig::default()
    };
    let loss = bleu_loss_from_logits(&a, None, &refs, &cfg).unwrap().loss;
    let grads = loss.backward().unwrap();
    let grad = grads
        .get(embedding.as_tensor())
        .expect("a gradient for the embedding");
    let norm = grad
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
        .sqrt();
    assert!(norm.is_finite() && norm > 1e-8, "gradient norm {norm}");
}

/// Runs the study; panics with its output unless it exits with status 0.
fn run_study(args: &[&str]) -> String {
    let output = example_command("study", args)
        .output()
        .expect("cannot start cargo run");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "study {args:?} exited with {}\n--- stdout\n{stdout}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn read_segments(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn quick_study_writes_results_that_its_files_reproduce() {
    let out: PathBuf =
        std::env::temp_dir().join(format!("candle-bleu-study-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let stdout = run_study(&["--quick", "--out", out.to_str().expect("a UTF-8 temp path")]);
    assert!(stdout.contains("| objective | test BLEU"), "{stdout}");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let runs = results["runs"].as_array().expect("runs");
    let objectives: Vec<&str> = runs
        .iter()
        .map(|r| r["objective"].as_str().unwrap())
        .collect();
    assert_eq!(
        objectives,
        [
            "ce",
            "ce+expected",
            "ce+paired",
            "ce+lower-bound",
            "ce+expected/not-eos",
            "ce+expected/soft-eos",
            "bleu-only/expected/scratch",
            "bleu-only/paired/scratch",
            "bleu-only/expected/warm",
            "bleu-only/paired/warm",
            "ce+expected/free-running",
        ]
    );
    let refs = read_segments(&out.join("test.ref"));
    let wrapped: Vec<Vec<Vec<String>>> = refs.iter().map(|r| vec![r.clone()]).collect();
    for run in runs {
        assert_eq!(run["test_ref"], "test.ref");
        let hyps = read_segments(&out.join(run["test_hyp"].as_str().unwrap()));
        assert_eq!(hyps.len(), refs.len(), "{run}");
        let rescored = corpus_bleu(&hyps, &wrapped, &BleuConfig::default())
            .unwrap()
            .score;
        let reported = run["test_bleu"].as_f64().unwrap();
        assert!(
            (rescored - reported).abs() <= 1e-9 * reported.max(1.0),
            "{run}: rescored {rescored}"
        );
        assert!(run["dev_bleu"].as_f64().unwrap().is_finite());
        let measures = run["measures"].as_object().unwrap();
        for key in [
            "entropy",
            "argmax_other_ref_rate",
            "argmax_top_token_share",
            "argmax_ref_bag_coverage",
            "teacher_forced_accuracy",
            "repeated_token_rate",
            "length_ratio",
        ] {
            let value = measures[key].as_f64().unwrap_or(f64::NAN);
            assert!(
                value.is_finite() && value >= 0.0,
                "{key} = {value} in {run}"
            );
        }
        // The length ratio is what the hypothesis file says.
        let ratio = hyps.iter().map(Vec::len).sum::<usize>() as f64
            / refs.iter().map(Vec::len).sum::<usize>() as f64;
        assert!((measures["length_ratio"].as_f64().unwrap() - ratio).abs() < 1e-12);
    }
    // Every run re-scorable from the files it names (relative paths, tok:none signature).
    check_rescorable_results(&out);
    assert!(results.get("partial").is_none(), "the final results.json");
    for run in runs {
        let step = run["selected_step"].as_u64().unwrap();
        assert!((1..=80).contains(&step), "{run}");
        assert!(run["dev_bleu"].as_f64().unwrap() >= run["last_dev_bleu"].as_f64().unwrap());
    }
    // The averaging measure's no-model controls: always one token covers at most one
    // reference type per sentence and is its own top token.
    let controls = &results["measure_controls"];
    assert_eq!(controls["constant"]["argmax_top_token_share"], 1.0);
    assert_eq!(controls["references"]["argmax_other_ref_rate"], 0.0);
    for predictor in ["constant", "unigram", "references"] {
        for key in [
            "argmax_other_ref_rate",
            "argmax_top_token_share",
            "argmax_ref_bag_coverage",
        ] {
            let v = controls[predictor][key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{predictor}.{key} = {v}");
        }
    }
    let pooled = results["bootstrap"]["pooled"].as_object().unwrap();
    assert_eq!(pooled.len(), 10);
    for (name, test) in pooled {
        let p = test["p_value"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 1.0, "{name}: p = {p}");
        // Δ is the difference of the rescored BLEU of the two runs (one seed).
        let bleu_of = |objective: &str| {
            runs.iter().find(|r| r["objective"] == objective).unwrap()["test_bleu"]
                .as_f64()
                .unwrap()
        };
        let delta = test["delta"].as_f64().unwrap();
        assert!(
            (delta - (bleu_of(name) - bleu_of("ce"))).abs() < 1e-9,
            "{name}: {delta}"
        );
    }
    for png in ["curves.png", "averaging.png"] {
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert!(bytes.len() > 1000 && bytes.starts_with(b"\x89PNG"), "{png}");
    }
    let table = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert_eq!(
        table.lines().filter(|l| l.starts_with("| ce")).count(),
        14, // the summary and the per-seed table
        "{table}"
    );
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn study_rejects_an_unknown_objective() {
    let output = example_command("study", &["--arms", "ce,nonsense", "--project"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown objective `nonsense`"), "{stderr}");
}
