//! The CTC loss: PyTorch's `F.ctc_loss` golden vectors (tests/golden/ctc_torch.py; values and
//! logits gradients through `log_softmax`) for the fused kernel, the kernel on candle's
//! `log_softmax` and both composed references, in f64 and f32; finite differences on a leaf
//! `log_probs` (the true gradient, not PyTorch's, pytorch/pytorch#52241) and on logits; the
//! kernel against the composed ops; frames beyond the input lengths; f16/bf16 and f32 against
//! f64 (at `[2, 256, 1000]` too, with the BLEU loss on CTC outputs), to tolerances derived from
//! each dtype's precision; greedy decoding; and each input error. The tests that compute in f64
//! are skipped on Metal, which has none (`common::f64_supported`).

use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
use candle_bleu::loss::{
    ctc_greedy_decode, ctc_loss, ctc_loss_composed, ctc_loss_from_logits,
    ctc_loss_from_logits_composed, host_copies, CtcConfig, CtcReduction,
};
use candle_core::{DType, Result, Tensor, Var, D};
use common::test_device;
use serde_json::Value;

mod common;

const GOLDEN: &str = include_str!("golden/ctc_torch.json");

type Loss = fn(&Tensor, &Tensor, &Tensor, &Tensor, &CtcConfig) -> Result<Tensor>;

/// `ctc_loss` of candle's `log_softmax` of the logits.
fn kernel_on_log_softmax(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    ctc_loss(&log_probs, targets, input_lengths, target_lengths, cfg)
}

/// `ctc_loss_composed` of candle's `log_softmax` of the logits.
fn composed_on_log_softmax(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    let log_probs = candle_nn::ops::log_softmax(logits, D::Minus1)?;
    ctc_loss_composed(&log_probs, targets, input_lengths, target_lengths, cfg)
}

/// `ctc_loss` of the crate's `log_softmax` op of the logits: PyTorch's idiom.
fn kernel_on_crate_log_softmax(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    let log_probs = candle_bleu::loss::log_softmax(logits)?;
    ctc_loss(&log_probs, targets, input_lengths, target_lengths, cfg)
}

/// Every way to get the loss from logits.
const FROM_LOGITS: [(&str, Loss); 5] = [
    ("ctc_loss_from_logits", ctc_loss_from_logits),
    ("ctc_loss(log_softmax)", kernel_on_log_softmax),
    ("ctc_loss(crate log_softmax)", kernel_on_crate_log_softmax),
    (
        "ctc_loss_from_logits_composed",
        ctc_loss_from_logits_composed,
    ),
    ("ctc_loss_composed(log_softmax)", composed_on_log_softmax),
];

/// A golden number: a float, or `"inf"`/`"nan"`.
fn number(v: &Value) -> f64 {
    match v {
        Value::String(s) if s == "inf" => f64::INFINITY,
        Value::String(s) if s == "-inf" => f64::NEG_INFINITY,
        Value::String(s) if s == "nan" => f64::NAN,
        v => v.as_f64().unwrap(),
    }
}

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(number).collect()
}

/// A golden case's tensors: logits `[B, T, V]` in `dtype`, i64 targets, u32 lengths.
struct Case {
    name: String,
    logits: Tensor,
    targets: Tensor,
    input_lengths: Tensor,
    target_lengths: Tensor,
    blank: u32,
    weights: Vec<f64>,
}

fn case(c: &Value, dtype: DType) -> Result<Case> {
    let shape: Vec<usize> = c["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let (b, t, v, l) = (shape[0], shape[1], shape[2], shape[3]);
    let dev = test_device();
    let ints = |key: &str| -> Vec<i64> {
        let value = &c[key];
        let flat: Vec<&Value> = match value.as_array().unwrap().first() {
            Some(Value::Array(_)) => value
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r.as_array().unwrap())
                .collect(),
            _ => value.as_array().unwrap().iter().collect(),
        };
        flat.iter().map(|v| v.as_i64().unwrap()).collect()
    };
    let lengths = |key: &str| -> Result<Tensor> {
        let values: Vec<u32> = ints(key).iter().map(|&x| x as u32).collect();
        Tensor::from_vec(values, b, &dev)
    };
    Ok(Case {
        name: c["name"].as_str().unwrap().to_string(),
        logits: Tensor::from_vec(numbers(&c["logits"]), (b, t, v), &dev)?.to_dtype(dtype)?,
        targets: Tensor::from_vec(ints("targets"), (b, l), &dev)?,
        input_lengths: lengths("input_lengths")?,
        target_lengths: lengths("target_lengths")?,
        blank: c["blank"].as_u64().unwrap() as u32,
        weights: numbers(&c["weights"]),
    })
}

fn reduction(name: &str) -> CtcReduction {
    match name {
        "mean" => CtcReduction::Mean,
        "sum" => CtcReduction::Sum,
        "none" => CtcReduction::None,
        other => panic!("reduction {other}"),
    }
}

/// The loss (as a vector: one value, or `[B]`) and the gradient of the loss (or for `None` of
/// `Σ_b w_b loss_b`) with respect to `x`.
fn loss_and_grad(
    f: impl Fn(&Tensor) -> Result<Tensor>,
    x: &Tensor,
    weights: &[f64],
) -> Result<(Vec<f64>, Vec<f64>)> {
    let var = Var::from_tensor(x)?;
    let loss = f(var.as_tensor())?;
    let total = if loss.rank() == 1 {
        let w = Tensor::new(weights, &test_device())?.to_dtype(loss.dtype())?;
        (&loss * w)?.sum_all()?
    } else {
        loss.clone()
    };
    let grads = total.backward()?;
    let grad = grads.get(var.as_tensor()).expect("a gradient");
    let values = loss.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let grad = grad.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    Ok((values, grad))
}

/// Checks ours against PyTorch's: equal infinities, else `|a − b| <= tol · scale` (scale: the
/// larger magnitude, at least 1, or the gradient's largest entry). PyTorch's NaN gradient of an
/// infinite loss must be 0 here.
fn compare(what: &str, ours: &[f64], theirs: &[f64], tol: f64, relative_to_max: bool) {
    assert_eq!(ours.len(), theirs.len(), "{what}: lengths");
    let max = theirs
        .iter()
        .filter(|x| x.is_finite())
        .fold(0f64, |m, x| m.max(x.abs()))
        .max(1e-300);
    for (i, (&a, &b)) in ours.iter().zip(theirs).enumerate() {
        if b.is_nan() {
            assert_eq!(
                a, 0.0,
                "{what}[{i}]: PyTorch's NaN (infinite loss) should be 0 here"
            );
        } else if b.is_infinite() {
            assert_eq!(a, b, "{what}[{i}]");
        } else {
            let scale = if relative_to_max {
                max
            } else {
                b.abs().max(1.0)
            };
            assert!(
                (a - b).abs() <= tol * scale,
                "{what}[{i}]: {a} vs PyTorch {b} (diff {:e}, tol {:e})",
                (a - b).abs(),
                tol * scale
            );
        }
    }
}

fn golden_cases() -> Vec<Value> {
    let golden: Value = serde_json::from_str(GOLDEN).unwrap();
    assert_eq!(golden["torch"], "2.15.0");
    let cases = golden["cases"].as_array().unwrap().clone();
    assert!(cases.len() >= 7);
    cases
}

fn check_golden(dtype: DType, value_tol: f64, grad_tol: f64) -> Result<()> {
    let mut checked = 0;
    for c in golden_cases() {
        let case = case(&c, dtype)?;
        for r in c["results"].as_array().unwrap() {
            let cfg = CtcConfig {
                blank: case.blank,
                reduction: reduction(r["reduction"].as_str().unwrap()),
                zero_infinity: r["zero_infinity"].as_bool().unwrap(),
                ..Default::default()
            };
            let (loss, grad) = (numbers(&r["loss"]), numbers(&r["grad"]));
            for (name, f) in FROM_LOGITS {
                let what = format!("{} {dtype:?} {name} {cfg:?}", case.name);
                let (ours, our_grad) = loss_and_grad(
                    |x| {
                        f(
                            x,
                            &case.targets,
                            &case.input_lengths,
                            &case.target_lengths,
                            &cfg,
                        )
                    },
                    &case.logits,
                    &case.weights,
                )?;
                compare(&format!("{what} loss"), &ours, &loss, value_tol, false);
                compare(&format!("{what} grad"), &our_grad, &grad, grad_tol, true);
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 7 * 6 * FROM_LOGITS.len());
    Ok(())
}

#[test]
fn golden_pytorch_f64() -> Result<()> {
    if !common::f64_supported("golden_pytorch_f64") {
        return Ok(());
    }
    check_golden(DType::F64, 1e-10, 1e-10)
}

#[test]
fn golden_pytorch_f32() -> Result<()> {
    check_golden(DType::F32, 1e-5, 1e-5)
}

/// A random batch: unnormalised log-probabilities or logits `[B, T, V]` (f64), targets with
/// repeats, lengths below the maxima.
fn random_batch(seed: u64, blank: u32) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (b, t, v, l) = (4, 9, 6, 3);
    let x: Vec<f64> = (0..b * t * v).map(|_| rng.gen_range(-3.0..1.0)).collect();
    let mut targets = vec![0i64; b * l];
    let mut target_lengths = vec![0u32; b];
    let mut input_lengths = vec![0u32; b];
    for e in 0..b {
        let length = rng.gen_range(0..=l);
        for j in 0..length {
            let mut id = rng.gen_range(0..v as u32 - 1);
            if id >= blank {
                id += 1;
            }
            if j > 0 && rng.gen_bool(0.4) {
                id = targets[e * l + j - 1] as u32;
            }
            targets[e * l + j] = i64::from(id);
        }
        target_lengths[e] = length as u32;
        input_lengths[e] = rng.gen_range(2 * l as u32..t as u32); // T_b < T: padding frames
    }
    let dev = test_device();
    Ok((
        Tensor::from_vec(x, (b, t, v), &dev)?,
        Tensor::from_vec(targets, (b, l), &dev)?,
        Tensor::from_vec(input_lengths, b, &dev)?,
        Tensor::from_vec(target_lengths, b, &dev)?,
    ))
}

/// The true gradient with respect to a leaf `log_probs` (unnormalised): finite differences
/// agree with the kernel and the composed ops, for each reduction.
#[test]
fn gradcheck_on_a_leaf_log_probs() -> Result<()> {
    if !common::f64_supported("gradcheck_on_a_leaf_log_probs") {
        return Ok(());
    }
    for (seed, blank) in [(1, 0), (2, 3), (3, 5)] {
        let (x, targets, il, tl) = random_batch(seed, blank)?;
        for reduction in [CtcReduction::Mean, CtcReduction::Sum, CtcReduction::None] {
            let cfg = CtcConfig {
                blank,
                reduction,
                zero_infinity: false,
                ..Default::default()
            };
            for (name, f) in [
                ("ctc_loss", ctc_loss as Loss),
                ("ctc_loss_composed", ctc_loss_composed),
            ] {
                let report = check_gradients(
                    |x| f(x, &targets, &il, &tl, &cfg)?.sum_all(),
                    &x,
                    &GradCheckConfig::default(),
                )?;
                assert!(report.passed, "{name} seed {seed} {cfg:?}: {report}");
            }
        }
    }
    Ok(())
}

#[test]
fn gradcheck_on_logits() -> Result<()> {
    if !common::f64_supported("gradcheck_on_logits") {
        return Ok(());
    }
    for (seed, blank) in [(4, 0), (5, 2)] {
        let (x, targets, il, tl) = random_batch(seed, blank)?;
        let cfg = CtcConfig {
            blank,
            ..Default::default()
        };
        for (name, f) in FROM_LOGITS {
            let report = check_gradients(
                |x| f(x, &targets, &il, &tl, &cfg),
                &x,
                &GradCheckConfig::default(),
            )?;
            assert!(report.passed, "{name} seed {seed}: {report}");
        }
    }
    Ok(())
}

/// The kernel and the composed ops agree on values and gradients, from log-probabilities (with
/// `-inf` entries: probability 0) and from logits.
#[test]
fn kernel_matches_composed() -> Result<()> {
    if !common::f64_supported("kernel_matches_composed") {
        return Ok(());
    }
    for (seed, blank) in [(6, 0), (7, 4), (8, 5)] {
        let (x, targets, il, tl) = random_batch(seed, blank)?;
        // A few zero probabilities: every label 1 at frame 1 of element 0, say.
        let mask: Vec<f64> = (0..x.elem_count())
            .map(|i| if i % 17 == 3 { f64::NEG_INFINITY } else { 0.0 })
            .collect();
        let with_zeros = (&x + Tensor::from_vec(mask, x.shape(), &test_device())?)?;
        let cfg = CtcConfig {
            blank,
            reduction: CtcReduction::None,
            zero_infinity: true,
            ..Default::default()
        };
        let weights = [0.5, 1.5, 1.0, 2.0];
        for (input, pair) in [
            (&with_zeros, [ctc_loss as Loss, ctc_loss_composed]),
            (&x, [ctc_loss_from_logits, ctc_loss_from_logits_composed]),
        ] {
            let (a, ga) = loss_and_grad(|x| pair[0](x, &targets, &il, &tl, &cfg), input, &weights)?;
            let (b, gb) = loss_and_grad(|x| pair[1](x, &targets, &il, &tl, &cfg), input, &weights)?;
            compare(&format!("seed {seed} loss"), &a, &b, 1e-12, false);
            compare(&format!("seed {seed} grad"), &ga, &gb, 1e-12, true);
        }
    }
    Ok(())
}

/// Frames at and beyond an element's input length get no gradient, whatever they hold.
#[test]
fn frames_beyond_input_lengths_have_zero_gradient() -> Result<()> {
    if !common::f64_supported("frames_beyond_input_lengths_have_zero_gradient") {
        return Ok(());
    }
    let (x, targets, il, tl) = random_batch(9, 0)?;
    let lengths = il.to_vec1::<u32>()?;
    let (_, t, v) = x.dims3()?;
    let cfg = CtcConfig::default();
    let all: [(&str, Loss); 4] = [
        ("ctc_loss", ctc_loss),
        ("ctc_loss_composed", ctc_loss_composed),
        ("ctc_loss_from_logits", ctc_loss_from_logits),
        (
            "ctc_loss_from_logits_composed",
            ctc_loss_from_logits_composed,
        ),
    ];
    for (name, f) in all {
        let (_, grad) = loss_and_grad(|x| f(x, &targets, &il, &tl, &cfg), &x, &[])?;
        for (b, &length) in lengths.iter().enumerate() {
            assert!(length < t as u32, "the case needs padding frames");
            let inside = &grad[b * t * v..(b * t + length as usize) * v];
            assert!(
                inside.iter().any(|&g| g != 0.0),
                "{name}: element {b} has no gradient"
            );
            let beyond = &grad[(b * t + length as usize) * v..(b + 1) * t * v];
            assert!(
                beyond.iter().all(|&g| g == 0.0),
                "{name}: element {b} has a gradient beyond its {length} frames"
            );
        }
    }
    Ok(())
}

/// Padding frames may hold anything, NaN included: they are not read, and their gradient is 0
/// (the composed path masks them before its `log_softmax`, whose backward would spread NaN).
#[test]
fn frames_beyond_input_lengths_are_not_read() -> Result<()> {
    if !common::f64_supported("frames_beyond_input_lengths_are_not_read") {
        return Ok(());
    }
    let dev = test_device();
    let x = Tensor::new(
        &[[[0.1f64, 0.2, 0.3], [0.3, 0.2, 0.1], [f64::NAN, 0.0, 0.0]]],
        &dev,
    )?;
    let targets = Tensor::new(&[[1u32]], &dev)?;
    let (il, tl) = (Tensor::new(&[2u32], &dev)?, Tensor::new(&[1u32], &dev)?);
    let cfg = CtcConfig::default();
    let reference = ctc_loss_from_logits(&x.narrow(1, 0, 2)?, &targets, &il, &tl, &cfg)?;
    let all: [(&str, Loss); 4] = [
        ("ctc_loss", ctc_loss),
        ("ctc_loss_composed", ctc_loss_composed),
        ("ctc_loss_from_logits", ctc_loss_from_logits),
        (
            "ctc_loss_from_logits_composed",
            ctc_loss_from_logits_composed,
        ),
    ];
    for (name, f) in all {
        let (loss, grad) = loss_and_grad(|x| f(x, &targets, &il, &tl, &cfg), &x, &[])?;
        if name.contains("logits") {
            let expected = reference.to_scalar::<f64>()?;
            assert!((loss[0] - expected).abs() < 1e-14, "{name}: {loss:?}");
        }
        assert!(loss[0].is_finite(), "{name}: {loss:?}");
        assert!(grad[..6].iter().all(|g| g.is_finite()), "{name}: {grad:?}");
        assert!(grad[6..].iter().all(|&g| g == 0.0), "{name}: {grad:?}");
    }
    Ok(())
}

/// Worked by hand: one element, V = 3 (blank 0), 3 frames of uniform probabilities, target
/// "1 1": only (1, blank, 1) aligns, so the loss is 3 log 3; target "1 2" has 5 alignments.
#[test]
fn hand_values() -> Result<()> {
    if !common::f64_supported("hand_values") {
        return Ok(());
    }
    let dev = test_device();
    let log_probs = Tensor::full((1f64 / 3.0).ln(), (1, 3, 3), &dev)?;
    let il = Tensor::new(&[3u32], &dev)?;
    let tl = Tensor::new(&[2u32], &dev)?;
    for (target, paths) in [([1u32, 1], 1.0), ([1, 2], 5.0)] {
        let targets = Tensor::new(&[target], &dev)?;
        let cfg = CtcConfig {
            reduction: CtcReduction::Sum,
            ..Default::default()
        };
        let expected = -(paths / 27f64).ln();
        for f in [ctc_loss as Loss, ctc_loss_composed] {
            let loss = f(&log_probs, &targets, &il, &tl, &cfg)?.to_scalar::<f64>()?;
            assert!(
                (loss - expected).abs() < 1e-12,
                "{target:?}: {loss} vs {expected}"
            );
        }
        // The mean divides by the target length, 2.
        let mean = ctc_loss(&log_probs, &targets, &il, &tl, &CtcConfig::default())?;
        assert!((mean.to_scalar::<f64>()? - expected / 2.0).abs() < 1e-12);
    }
    Ok(())
}

#[test]
fn impossible_alignment_is_infinite_or_zero() -> Result<()> {
    let dev = test_device();
    let logits = Tensor::zeros((2, 2, 3), DType::F32, &dev)?;
    // "1 1" needs 3 frames; element 1 ("2") aligns.
    let targets = Tensor::new(&[[1u32, 1], [2, 0]], &dev)?;
    let il = Tensor::new(&[2u32, 2], &dev)?;
    let tl = Tensor::new(&[2u32, 1], &dev)?;
    for f in [ctc_loss_from_logits as Loss, ctc_loss_from_logits_composed] {
        for zero_infinity in [false, true] {
            let cfg = CtcConfig {
                reduction: CtcReduction::None,
                zero_infinity,
                ..Default::default()
            };
            let (loss, grad) =
                loss_and_grad(|x| f(x, &targets, &il, &tl, &cfg), &logits, &[1.0, 1.0])?;
            let expected = if zero_infinity { 0.0 } else { f64::INFINITY };
            assert_eq!(loss[0], expected);
            assert!((loss[1] - (9f64 / 3.0).ln()).abs() < 1e-6, "{loss:?}");
            assert!(grad[..6].iter().all(|&g| g == 0.0), "{grad:?}");
            assert!(grad[6..].iter().any(|&g| g != 0.0), "{grad:?}");
        }
    }
    Ok(())
}

/// f16 and bf16 are computed in f32: against the f64 loss of the same rounded inputs, the loss
/// differs by f32 round-off alone, and the gradient (returned in the input's dtype) by one
/// rounding to that dtype. Derivation of the tolerances: the forward recursion makes `O(S)`
/// f32 operations per frame on log-space values of magnitude `≤ |loss|`, each off by at most
/// `ε₃₂ = 2⁻²⁴` relative; over `T' = 9` frames that is well under `1e-5 · max(|loss|, 1)`
/// (observed ≈ 1e-7). The gradient's f32 value is as close; rounding it to f16 (11 significant
/// bits) moves each entry by at most `2⁻¹¹·|g|` (bf16: 8 bits, `2⁻⁸·|g|`), below f16's
/// normal range by at most half its smallest subnormal step `2⁻²⁵`; so each entry is within
/// `2⁻¹¹·|g| + 1e-5·max|g|` (bf16 `2⁻⁸·|g| + 1e-5·max|g|`) of the f64 gradient.
#[test]
fn half_precision_is_computed_in_f32() -> Result<()> {
    if !common::f64_supported("half_precision_is_computed_in_f32") {
        return Ok(());
    }
    let (x, targets, il, tl) = random_batch(10, 0)?;
    let cfg = CtcConfig::default();
    for (dtype, unit) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
        let x = x.to_dtype(dtype)?;
        let exact = x.to_dtype(DType::F64)?;
        for (name, f) in [
            ("ctc_loss_from_logits", ctc_loss_from_logits as Loss),
            (
                "ctc_loss_from_logits_composed",
                ctc_loss_from_logits_composed,
            ),
        ] {
            let (reference, reference_grad) =
                loss_and_grad(|x| f(x, &targets, &il, &tl, &cfg), &exact, &[])?;
            let var = Var::from_tensor(&x)?;
            let loss = f(var.as_tensor(), &targets, &il, &tl, &cfg)?;
            assert_eq!(loss.dtype(), DType::F32, "{name} {dtype:?}");
            let grads = loss.backward()?;
            let grad = grads.get(var.as_tensor()).unwrap();
            assert_eq!(grad.dtype(), dtype, "{name} {dtype:?}");
            let (a, b) = (f64::from(loss.to_scalar::<f32>()?), reference[0]);
            assert!(
                (a - b).abs() <= 1e-5 * b.abs().max(1.0),
                "{name} {dtype:?}: {a} vs f64 {b}"
            );
            let grad = grad.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
            let max = reference_grad.iter().fold(0f64, |m, g| m.max(g.abs()));
            for (i, (g, r)) in grad.iter().zip(&reference_grad).enumerate() {
                assert!(
                    (g - r).abs() <= unit * r.abs() + 1e-5 * max,
                    "{name} {dtype:?} grad[{i}]: {g} vs f64 {r}"
                );
            }
        }
    }
    Ok(())
}

/// f32 against f64 at the size of a real batch, `[B, T', V] = [2, 256, 1000]` with targets of
/// 40 labels, for `ctc_loss` (of an f64 `log_softmax`, rounded), `ctc_loss_from_logits` and
/// the BLEU loss on CTC outputs, each on the CPU kernel and the composed ops. Tolerances: the
/// loss to `1e-6` relative (observed ≤ 7e-8); each gradient entry to `1e-5 · max|g|` on the
/// kernels (observed ≤ 5e-7). The composed CTC ops hold `log α` unscaled, of magnitude up to
/// `T'·ln V ≈ 1800`, so each is off by `≈ 1800·ε₃₂ ≈ 1e-4` absolute, and the occupancies
/// `exp(log α + log β − log p)` by as much relative: `2e-4 · max|g|` there (observed 7.6e-5).
#[test]
fn f32_agrees_with_f64_at_many_frames_and_a_large_vocabulary() -> Result<()> {
    use candle_bleu::loss::{
        ctc_bleu_loss_from_logits, ctc_bleu_loss_from_logits_composed, BleuLossConfig, References,
    };
    use rand::{Rng, SeedableRng};
    if !common::f64_supported("f32_agrees_with_f64_at_many_frames_and_a_large_vocabulary") {
        return Ok(());
    }
    let dev = test_device();
    let mut rng = rand::rngs::StdRng::seed_from_u64(256);
    let (b, t, v, l) = (2, 256, 1000, 40);
    let logits: Vec<f64> = (0..b * t * v).map(|_| rng.gen_range(-4.0..4.0)).collect();
    let logits = Tensor::from_vec(logits, (b, t, v), &dev)?;
    let ids: Vec<u32> = (0..b * l).map(|_| rng.gen_range(1..v as u32)).collect();
    let targets = Tensor::from_vec(ids, (b, l), &dev)?;
    let il = Tensor::new(&[256u32, 200], &dev)?;
    let tl = Tensor::new(&[40u32, 31], &dev)?;
    let cfg = CtcConfig::default();
    let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
    let refs = References::from_ids(&targets, 0)?;
    let (targets, il, tl, cfg, refs) = (&targets, &il, &tl, &cfg, &refs);
    let bleu = |composed: bool| {
        move |x: &Tensor| -> Result<Tensor> {
            let f = if composed {
                ctc_bleu_loss_from_logits_composed
            } else {
                ctc_bleu_loss_from_logits
            };
            Ok(f(x, Some(il), refs, 0, &BleuLossConfig::default())?.loss)
        }
    };
    let ctc = |f: Loss| move |x: &Tensor| f(x, targets, il, tl, cfg);
    type Of<'a> = Box<dyn Fn(&Tensor) -> Result<Tensor> + 'a>;
    let cases: [(&str, &Tensor, Of); 6] = [
        ("ctc_loss", &log_probs, Box::new(ctc(ctc_loss))),
        (
            "ctc_loss_composed",
            &log_probs,
            Box::new(ctc(ctc_loss_composed)),
        ),
        (
            "ctc_loss_from_logits",
            &logits,
            Box::new(ctc(ctc_loss_from_logits)),
        ),
        (
            "ctc_loss_from_logits_composed",
            &logits,
            Box::new(ctc(ctc_loss_from_logits_composed)),
        ),
        ("ctc_bleu_loss_from_logits", &logits, Box::new(bleu(false))),
        (
            "ctc_bleu_loss_from_logits_composed",
            &logits,
            Box::new(bleu(true)),
        ),
    ];
    let mut worst = Vec::new();
    for (name, input, f) in cases {
        let (exact, exact_grad) = loss_and_grad(&f, input, &[])?;
        let (single, single_grad) = loss_and_grad(&f, &input.to_dtype(DType::F32)?, &[])?;
        let (a, e) = (single[0], exact[0]);
        assert!(e.is_finite() && e.abs() > 1e-3, "{name}: {e}");
        let loss_error = (a - e).abs() / e.abs().max(1.0);
        let max = exact_grad.iter().fold(0f64, |m, g| m.max(g.abs()));
        let grad_error = single_grad
            .iter()
            .zip(&exact_grad)
            .fold(0f64, |m, (g, r)| m.max((g - r).abs()))
            / max;
        eprintln!("{name}: loss {e}, relative error {loss_error:e}; gradient error {grad_error:e} of max |g| {max:e}");
        worst.push((name, a, e, loss_error, grad_error));
    }
    for (name, a, e, loss_error, grad_error) in worst {
        let grad_tol = if name.ends_with("_composed") {
            2e-4
        } else {
            1e-5
        };
        let loss_tol = 1e-6;
        assert!(loss_error <= loss_tol, "{name}: f32 {a} vs f64 {e}");
        assert!(
            grad_error <= grad_tol,
            "{name}: gradient off by {grad_error:e} of max |g|"
        );
    }
    Ok(())
}

/// Targets and lengths as u32, i32 or i64 give the same loss.
#[test]
fn integer_dtypes_of_targets_and_lengths() -> Result<()> {
    if !common::f64_supported("integer_dtypes_of_targets_and_lengths") {
        return Ok(());
    }
    let (x, targets, il, tl) = random_batch(11, 0)?;
    let cfg = CtcConfig::default();
    let reference = ctc_loss_from_logits(&x, &targets, &il, &tl, &cfg)?.to_scalar::<f64>()?;
    for dtype in [DType::U32, DType::I32, DType::I64] {
        let loss = ctc_loss_from_logits(
            &x,
            &targets.to_dtype(dtype)?,
            &il.to_dtype(dtype)?,
            &tl.to_dtype(dtype)?,
            &cfg,
        )?;
        assert_eq!(loss.to_scalar::<f64>()?, reference, "{dtype:?}");
    }
    Ok(())
}

#[test]
fn three_host_copies_per_call() -> Result<()> {
    if !common::f64_supported("three_host_copies_per_call") {
        return Ok(());
    }
    let (x, targets, il, tl) = random_batch(12, 0)?;
    let before = host_copies();
    ctc_loss_from_logits(&x, &targets, &il, &tl, &CtcConfig::default())?;
    assert_eq!(host_copies() - before, 3);
    Ok(())
}

#[test]
fn greedy_decode_by_hand() -> Result<()> {
    let dev = test_device();
    // Argmax per frame, element 0: 2 2 0 2 1 1 3; element 1: 0 3 3 0 0 1 1 (length 6).
    let ids = [[2u32, 2, 0, 2, 1, 1, 3], [0, 3, 3, 0, 0, 1, 1]];
    let mut values = Vec::new();
    for row in ids {
        for id in row {
            for v in 0..4u32 {
                values.push(if v == id {
                    2.0f32
                } else {
                    -1.0 - v as f32 * 0.1
                });
            }
        }
    }
    let logits = Tensor::from_vec(values, (2, 7, 4), &dev)?;
    let lengths = Tensor::new(&[7i64, 6], &dev)?;
    assert_eq!(
        ctc_greedy_decode(&logits, Some(&lengths), 0)?,
        vec![vec![2, 2, 1, 3], vec![3, 1]]
    );
    // Probabilities decode alike; with blank 2 the 2s vanish and 0 is a label.
    let probs = candle_nn::ops::softmax(&logits, D::Minus1)?;
    assert_eq!(
        ctc_greedy_decode(&probs, None, 2)?,
        vec![vec![0, 1, 3], vec![0, 3, 0, 1]]
    );
    // Half precision decodes alike (the argmax runs in the input's dtype).
    for dtype in [DType::F16, DType::BF16] {
        assert_eq!(
            ctc_greedy_decode(&logits.to_dtype(dtype)?, Some(&lengths), 0)?,
            vec![vec![2, 2, 1, 3], vec![3, 1]]
        );
    }
    // A zero length decodes to nothing.
    let lengths = Tensor::new(&[0u32, 1], &dev)?;
    assert_eq!(
        ctc_greedy_decode(&logits, Some(&lengths), 0)?,
        vec![Vec::<u32>::new(), vec![]]
    );
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Errors: each names its argument.
// ------------------------------------------------------------------------------------------

/// A valid call's arguments: logits `[2, 4, 5]`, targets `[2, 2]`, lengths.
fn valid() -> (Tensor, Tensor, Tensor, Tensor) {
    let dev = test_device();
    (
        Tensor::zeros((2, 4, 5), DType::F32, &dev).unwrap(),
        Tensor::new(&[[1u32, 2], [3, 3]], &dev).unwrap(),
        Tensor::new(&[4u32, 3], &dev).unwrap(),
        Tensor::new(&[2u32, 2], &dev).unwrap(),
    )
}

/// Every entry point (all four losses) fails with a message containing each of `needles`.
fn fails_with(args: (&Tensor, &Tensor, &Tensor, &Tensor), cfg: &CtcConfig, needles: &[&str]) {
    let all: [(&str, Loss); 4] = [
        ("ctc_loss", ctc_loss),
        ("ctc_loss_composed", ctc_loss_composed),
        ("ctc_loss_from_logits", ctc_loss_from_logits),
        (
            "ctc_loss_from_logits_composed",
            ctc_loss_from_logits_composed,
        ),
    ];
    for (name, f) in all {
        let err = match f(args.0, args.1, args.2, args.3, cfg) {
            Ok(loss) => panic!("{name}: expected an error, got {loss}"),
            Err(e) => e.to_string(),
        };
        for needle in needles {
            assert!(err.contains(needle), "{name}: {err:?} lacks {needle:?}");
        }
    }
}

/// The valid arguments the error tests perturb give the loss worked out by hand: uniform
/// logits over `V = 5`; "1 2" in 4 frames has 15 alignments of probability `5⁻⁴`, "3 3" in 3
/// frames only (3, blank, 3), `5⁻³`; the mean divides each by its target length 2. As
/// log-probabilities the zeros are unnormalised (each frame's probabilities sum to 5): every
/// alignment has probability 1.
#[test]
fn the_loss_is_fine_on_the_valid_arguments() -> Result<()> {
    let (x, t, il, tl) = valid();
    let from_logits = ((625f64 / 15.0).ln() / 2.0 + 125f64.ln() / 2.0) / 2.0;
    let from_log_probs = (-(15f64.ln()) / 2.0 + -(1f64.ln()) / 2.0) / 2.0;
    for (name, f, expected) in [
        (
            "ctc_loss_from_logits",
            ctc_loss_from_logits as Loss,
            from_logits,
        ),
        (
            "ctc_loss_from_logits_composed",
            ctc_loss_from_logits_composed,
            from_logits,
        ),
        ("ctc_loss", ctc_loss, from_log_probs),
        ("ctc_loss_composed", ctc_loss_composed, from_log_probs),
    ] {
        let loss = f(&x, &t, &il, &tl, &CtcConfig::default())?;
        assert_eq!(loss.dims(), [0usize; 0], "{name}: a scalar");
        let loss = f64::from(loss.to_scalar::<f32>()?);
        assert!(
            (loss - expected).abs() < 1e-5,
            "{name}: {loss} vs {expected}"
        );
    }
    Ok(())
}

#[test]
fn error_blank_out_of_vocabulary() {
    let (x, t, il, tl) = valid();
    let cfg = CtcConfig {
        blank: 5,
        ..Default::default()
    };
    fails_with((&x, &t, &il, &tl), &cfg, &["`blank` 5", "V = 5"]);
}

#[test]
fn error_target_is_the_blank() {
    let (x, _, il, tl) = valid();
    let t = Tensor::new(&[[1u32, 2], [0, 3]], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets[1, 0]` = 0", "blank"],
    );
}

#[test]
fn error_target_out_of_vocabulary() {
    let (x, _, il, tl) = valid();
    let t = Tensor::new(&[[1u32, 5], [3, 3]], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets[0, 1]` = 5", "V = 5"],
    );
}

#[test]
fn error_negative_target() {
    let (x, _, il, tl) = valid();
    let t = Tensor::new(&[[1i64, 2], [-1, 3]], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets[1, 0]` = -1"],
    );
}

#[test]
fn padding_beyond_target_lengths_is_not_read() -> Result<()> {
    let (x, _, il, _) = valid();
    let t = Tensor::new(&[[1i64, -1], [3, 99]], &test_device())?;
    let tl = Tensor::new(&[1u32, 1], &test_device())?;
    ctc_loss_from_logits(&x, &t, &il, &tl, &CtcConfig::default())?;
    Ok(())
}

#[test]
fn error_input_length_beyond_frames() {
    let (x, t, _, tl) = valid();
    let il = Tensor::new(&[5u32, 3], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`input_lengths[0]` = 5", "T' = 4"],
    );
}

#[test]
fn error_input_length_zero() {
    let (x, t, _, tl) = valid();
    let il = Tensor::new(&[4u32, 0], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`input_lengths[1]` = 0"],
    );
}

#[test]
fn error_negative_input_length() {
    let (x, t, _, tl) = valid();
    let il = Tensor::new(&[4i64, -2], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`input_lengths[1]` = -2", "negative"],
    );
}

#[test]
fn error_target_length_beyond_targets() {
    let (x, t, il, _) = valid();
    let tl = Tensor::new(&[2u32, 3], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`target_lengths[1]` = 3", "L"],
    );
}

#[test]
fn error_negative_target_length() {
    let (x, t, il, _) = valid();
    let tl = Tensor::new(&[-1i64, 2], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`target_lengths[0]` = -1", "negative"],
    );
}

#[test]
fn error_lengths_dtype() {
    let (x, t, il, tl) = valid();
    let float_lengths = il.to_dtype(DType::F32).unwrap();
    fails_with(
        (&x, &t, &float_lengths, &tl),
        &CtcConfig::default(),
        &["`input_lengths`", "F32"],
    );
    let float_lengths = tl.to_dtype(DType::F64).unwrap();
    fails_with(
        (&x, &t, &il, &float_lengths),
        &CtcConfig::default(),
        &["`target_lengths`", "F64"],
    );
}

#[test]
fn error_targets_dtype() {
    let (x, t, il, tl) = valid();
    let t = t.to_dtype(DType::F32).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets`", "F32"],
    );
}

#[test]
fn error_input_dtype() {
    let (_, t, il, tl) = valid();
    let x = Tensor::zeros((2, 4, 5), DType::U32, &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["must be a float tensor", "U32"],
    );
}

#[test]
fn error_input_rank() {
    let (_, t, il, tl) = valid();
    let x = Tensor::zeros((4, 5), DType::F32, &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["batch-first [B, T', V]", "[4, 5]"],
    );
}

#[test]
fn error_input_empty_dimension() {
    let (_, t, il, tl) = valid();
    let x = Tensor::zeros((2, 4, 0), DType::F32, &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["empty dimension", "[2, 4, 0]"],
    );
}

#[test]
fn error_batch_size_of_targets() {
    let (x, _, il, tl) = valid();
    let t = Tensor::new(&[[1u32, 2]], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets`", "B = 2", "[1, 2]"],
    );
}

#[test]
fn error_batch_size_of_lengths() {
    let (x, t, _, tl) = valid();
    let il = Tensor::new(&[4u32, 3, 2], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`input_lengths`", "[2]", "[3]"],
    );
    let (x, t, il, _) = valid();
    let tl = Tensor::new(&[[2u32, 2]], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`target_lengths`", "[1, 2]"],
    );
}

#[test]
fn error_targets_rank() {
    let (x, _, il, tl) = valid();
    let t = Tensor::new(&[1u32, 2, 3, 3], &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &CtcConfig::default(),
        &["`targets` must be padded [B, L]", "[4]"],
    );
}

/// The defaults, with the value checks on off the CPU too (the CPU always checks).
fn checking_values() -> CtcConfig {
    CtcConfig {
        check_values: true,
        ..Default::default()
    }
}

#[test]
fn error_nan_in_logits() {
    let (_, t, il, tl) = valid();
    let mut values = vec![0f32; 40];
    values[20 + 2 * 5 + 1] = f32::NAN; // element 1, frame 2 (within its 3 frames)
    let x = Tensor::from_vec(values, (2, 4, 5), &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &checking_values(),
        &["contains NaN", "batch element 1, frame 2"],
    );
}

#[test]
fn error_infinity_in_logits_and_positive_infinity_in_log_probs() {
    if !common::f64_supported("error_infinity_in_logits_and_positive_infinity_in_log_probs") {
        return;
    }
    let (_, t, il, tl) = valid();
    let mut values = vec![0f64; 40];
    values[3] = f64::INFINITY;
    let x = Tensor::from_vec(values, (2, 4, 5), &test_device()).unwrap();
    fails_with(
        (&x, &t, &il, &tl),
        &checking_values(),
        &["contains NaN or", "inf", "batch element 0, frame 0"],
    );
}

#[test]
fn negative_infinity_is_a_log_probability_but_not_a_logit() -> Result<()> {
    if !common::f64_supported("negative_infinity_is_a_log_probability_but_not_a_logit") {
        return Ok(());
    }
    let (_, t, il, tl) = valid();
    let mut values = vec![0f64; 40];
    values[3] = f64::NEG_INFINITY;
    let x = Tensor::from_vec(values, (2, 4, 5), &test_device()).unwrap();
    let cfg = checking_values();
    // Element 0's frame 0 gives label 3 probability 0; its target "1 2" never uses it, so
    // the loss is that of all zeros: 15 alignments of probability 1 over target length 2 for
    // element 0, one over 2 for element 1, averaged.
    let expected = (-(15f64.ln()) / 2.0 + 0.0) / 2.0;
    for f in [ctc_loss as Loss, ctc_loss_composed] {
        let (loss, grad) = loss_and_grad(|x| f(x, &t, &il, &tl, &cfg), &x, &[])?;
        assert!((loss[0] - expected).abs() < 1e-12, "{loss:?} vs {expected}");
        assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");
        assert_eq!(grad[3], 0.0, "no gradient at a zero probability");
    }
    for f in [ctc_loss_from_logits as Loss, ctc_loss_from_logits_composed] {
        let err = f(&x, &t, &il, &tl, &cfg).unwrap_err().to_string();
        assert!(
            err.contains("`logits` contains NaN or infinite values"),
            "{err}"
        );
    }
    Ok(())
}

#[test]
fn error_decode_blank_and_lengths() {
    let (x, _, _, _) = valid();
    let err = ctc_greedy_decode(&x, None, 5).unwrap_err().to_string();
    assert!(err.contains("`blank` 5") && err.contains("V = 5"), "{err}");
    let il = Tensor::new(&[5u32, 1], &test_device()).unwrap();
    let err = ctc_greedy_decode(&x, Some(&il), 0).unwrap_err().to_string();
    assert!(err.contains("`input_lengths[0]` = 5"), "{err}");
    let il = Tensor::new(&[1u32], &test_device()).unwrap();
    let err = ctc_greedy_decode(&x, Some(&il), 0).unwrap_err().to_string();
    assert!(
        err.contains("`input_lengths`") && err.contains("[2]"),
        "{err}"
    );
}
