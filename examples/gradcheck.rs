//! Finite-difference gradient checks of the BLEU loss, and of any function of a tensor.
//!
//! candle has no gradient checker; `candle_bleu::gradcheck::check_gradients` compares
//! candle's autograd with central differences in f64. This example runs it
//!
//! 1. on every loss configuration: form {Expected, Paired, LowerBound} × length model
//!    {Given, NotEos, SoftEos} × reduction {Corpus, SentenceMean} × smoothing {None, AddK(1)},
//!    each through the softmax of f64 logits both ways: `bleu_loss` on
//!    `candle_nn::ops::softmax(logits)` ("composed") and `bleu_loss_from_logits` ("fused",
//!    the hand-written kernels), and prints a table; the process exits non-zero if any fails;
//! 2. on softmaxes: `candle_nn::ops::softmax_last_dim` has no backward, and the check reports
//!    the missing gradient, where `candle_nn::ops::softmax(x, D::Minus1)` passes (the crate's
//!    own softmax kernel is checked through `bleu_loss_from_logits` in 1.);
//! 3. on a function of your own (a log-sum-exp), to show the harness is general.
//!
//! ```text
//! cargo run --release --example gradcheck
//! cargo run --release --example gradcheck -- --seed 3 --max-coordinates 20
//! ```
//!
//! Device: CUDA device 0 in a `--features cuda` build when there is one, else the CPU; `--cpu`
//! forces the CPU. `check_gradients` perturbs an f64 copy on the host and the functions move it to the
//! device, so the loss runs there in f64 (CUDA has f64; Metal has not: use `--cpu` on a Mac).
//!
//! The point is random soft logits (N(0, 1)), away from the loss's kinks: a `min` tie has
//! probability zero there, and the seed is advanced until every soft hypothesis length is
//! more than `KINK_MARGIN` from the brevity penalty's switches (`C = L`, `C = 1`) and from the
//! midpoints where the effective reference length jumps (see the `gradcheck` module docs).

use anyhow::{bail, Result};
use candle_bleu::gradcheck::{check_gradients, GradCheckConfig, GradCheckReport};
use candle_bleu::loss::{
    bleu_loss, bleu_loss_from_logits, BleuLossConfig, Form, LengthModel, LossSmoothing, Reduction,
    References,
};
use candle_core::{Device, Tensor, D};
use clap::Parser;
use rand::{rngs::StdRng, Rng, SeedableRng};

#[derive(Parser, Debug)]
#[command(about = "Finite-difference gradient checks of every BLEU loss configuration")]
struct Args {
    /// Seed of the random logits (advanced until the point is away from the kinks) and of the
    /// coordinate subset.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Check this many random coordinates per function instead of all `B·S·V`.
    #[arg(long)]
    max_coordinates: Option<usize>,
    /// Run on the CPU even when built with `cuda` and a GPU is available.
    #[arg(long)]
    cpu: bool,
}

const PAD: u32 = 0;
const EOS: u32 = 6;
const VOCAB: usize = 7;
const SEQ: usize = 5;
/// Hard hypothesis lengths of the `Given` and `NotEos` models.
const HYP_LENGTHS: [u32; 2] = [5, 4];
/// How far (in tokens) every soft length must stay from a kink of the loss.
const KINK_MARGIN: f64 = 0.01;

/// Element 0 has one reference; element 1 two of different lengths (4 and 3, padded to
/// T = 5), so the effective reference length has a switch at C = 3.5.
fn references(device: &Device) -> Result<(References, Vec<Vec<usize>>)> {
    let ids = Tensor::new(
        &[
            [[1u32, 2, 1, 2, 3], [0, 0, 0, 0, 0]],
            [[2, 4, 4, 1, 0], [4, 1, 2, 0, 0]],
        ],
        device,
    )?;
    Ok((References::from_ids(&ids, PAD)?, vec![vec![5], vec![4, 3]]))
}

/// `[2, SEQ, VOCAB]` f64 logits, N(0, 1) by Box–Muller.
fn normal_logits(seed: u64) -> Result<Tensor> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data: Vec<f64> = (0..2 * SEQ * VOCAB)
        .map(|_| {
            let (u, v): (f64, f64) = (1.0 - rng.gen::<f64>(), rng.gen());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        })
        .collect();
    Ok(Tensor::from_vec(data, (2, SEQ, VOCAB), &Device::Cpu)?)
}

/// Every configuration: 3 forms × 3 length models × 2 reductions × 2 smoothings.
fn all_configs() -> Vec<BleuLossConfig> {
    let mut configs = Vec::new();
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [
            LengthModel::Given,
            LengthModel::NotEos { eos_id: EOS },
            LengthModel::SoftEos { eos_id: EOS },
        ] {
            for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                for smoothing in [LossSmoothing::None, LossSmoothing::AddK(1.0)] {
                    configs.push(BleuLossConfig {
                        form,
                        length,
                        reduction,
                        smoothing,
                        ..Default::default()
                    });
                }
            }
        }
    }
    configs
}

fn config_name(cfg: &BleuLossConfig) -> String {
    let length = match cfg.length {
        LengthModel::Given => "Given",
        LengthModel::NotEos { .. } => "NotEos",
        LengthModel::SoftEos { .. } => "SoftEos",
    };
    let smoothing = match cfg.smoothing {
        LossSmoothing::None => "None".to_string(),
        LossSmoothing::AddK(k) => format!("AddK({k})"),
    };
    format!("{:?}/{length}/{:?}/{smoothing}", cfg.form, cfg.reduction)
}

/// `Some(lengths)` for the hard-length models, `None` for `SoftEos`.
fn hyp_lengths(cfg: &BleuLossConfig, lengths: &Tensor) -> Option<Tensor> {
    match cfg.length {
        LengthModel::SoftEos { .. } => None,
        _ => Some(lengths.clone()),
    }
}

/// The smallest distance from the soft hypothesis lengths to a kink of the loss, over the
/// EOS length models (under `Given` the lengths are constants) and both reductions.
fn kink_distance(logits: &Tensor, refs: &References, ref_lengths: &[Vec<usize>]) -> Result<f64> {
    let lengths = Tensor::new(&HYP_LENGTHS, logits.device())?;
    let mut distance = f64::INFINITY;
    for length in [
        LengthModel::NotEos { eos_id: EOS },
        LengthModel::SoftEos { eos_id: EOS },
    ] {
        let cfg = BleuLossConfig {
            length,
            ..Default::default()
        };
        let out = bleu_loss_from_logits(logits, hyp_lengths(&cfg, &lengths).as_ref(), refs, &cfg)?;
        let hyp_len = out.stats.hyp_len.to_vec1::<f64>()?;
        let ref_len = out.stats.ref_len.to_vec1::<f64>()?;
        let mut kinks = Vec::new();
        for (b, candidates) in ref_lengths.iter().enumerate() {
            let c = hyp_len[b];
            // SentenceMean: per element, the brevity penalty's switches and the midpoints
            // where the closest reference changes.
            kinks.push((c - ref_len[b]).abs());
            kinks.push((c - 1.0).abs());
            for (i, &r) in candidates.iter().enumerate() {
                for &s in &candidates[i + 1..] {
                    kinks.push((c - (r + s) as f64 / 2.0).abs());
                }
            }
        }
        // Corpus: the switches of the summed lengths.
        let (c, l) = (hyp_len.iter().sum::<f64>(), ref_len.iter().sum::<f64>());
        kinks.extend([(c - l).abs(), (c - 1.0).abs()]);
        distance = kinks.into_iter().fold(distance, f64::min);
    }
    Ok(distance)
}

fn print_row(name: &str, path: &str, report: &GradCheckReport) {
    println!(
        "{name:<38} {path:<9} {:>7} {:>12.3e} {:>12.3e}  {}",
        report.checked,
        report.max_abs_error,
        report.max_rel_error,
        if report.passed { "pass" } else { "FAIL" }
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = if args.cpu {
        Device::Cpu
    } else {
        Device::cuda_if_available(0)?
    };
    println!("device: {:?}", device.location());
    // `check_gradients` evaluates the functions on host tensors: each moves its input here.
    let on_device = |x: &Tensor| x.to_device(&device);
    let grad_cfg = GradCheckConfig {
        eps: 1e-6,
        atol: 1e-8,
        rtol: 1e-6,
        max_coordinates: args.max_coordinates,
        seed: args.seed,
    };
    let (refs, ref_lengths) = references(&device)?;
    let lengths = Tensor::new(&HYP_LENGTHS, &device)?;

    // A point away from the kinks.
    let mut seed = args.seed;
    let logits = loop {
        let logits = normal_logits(seed)?.to_device(&device)?;
        let distance = kink_distance(&logits, &refs, &ref_lengths)?;
        if distance > KINK_MARGIN {
            println!(
                "logits: [2, {SEQ}, {VOCAB}] f64, N(0, 1), seed {seed}; soft lengths are {distance:.3} tokens from the nearest kink"
            );
            break logits;
        }
        if seed > args.seed + 1000 {
            bail!(
                "no point away from the kinks in 1000 seeds from {}",
                args.seed
            );
        }
        seed += 1;
    };

    // 1. Every configuration, both paths.
    println!(
        "\n{:<38} {:<9} {:>7} {:>12} {:>12}  pass",
        "config (form/length/reduction/smoothing)", "path", "checked", "max abs err", "max rel err"
    );
    let (mut total, mut failed) = (0, Vec::new());
    let (mut worst_abs, mut worst_rel) = ((0.0, String::new()), (0.0, String::new()));
    for cfg in all_configs() {
        let name = config_name(&cfg);
        let hyp_lengths = hyp_lengths(&cfg, &lengths);
        let composed = |x: &Tensor| {
            let probs = candle_nn::ops::softmax(&on_device(x)?, D::Minus1)?;
            Ok(bleu_loss(&probs, hyp_lengths.as_ref(), &refs, &cfg)?.loss)
        };
        let fused = |x: &Tensor| {
            let x = on_device(x)?;
            Ok(bleu_loss_from_logits(&x, hyp_lengths.as_ref(), &refs, &cfg)?.loss)
        };
        for (path, report) in [
            ("composed", check_gradients(composed, &logits, &grad_cfg)?),
            ("fused", check_gradients(fused, &logits, &grad_cfg)?),
        ] {
            print_row(&name, path, &report);
            total += 1;
            if report.max_abs_error > worst_abs.0 {
                worst_abs = (report.max_abs_error, format!("{name} {path}"));
            }
            if report.max_rel_error > worst_rel.0 {
                worst_rel = (report.max_rel_error, format!("{name} {path}"));
            }
            if !report.passed {
                failed.push(format!("{name} {path}: {report}"));
            }
        }
    }
    println!(
        "worst max abs err {:.3e} ({}); worst max rel err {:.3e} ({})",
        worst_abs.0, worst_abs.1, worst_rel.0, worst_rel.1
    );
    if failed.is_empty() {
        println!("all {total} loss gradient checks passed");
    } else {
        println!("{} of {total} loss gradient checks FAILED:", failed.len());
        for line in &failed {
            println!("  {line}");
        }
    }

    // 2. Softmaxes in front of the default loss.
    println!("\nsoftmax in front of the default loss (Expected/Given/Corpus/AddK(1)):");
    let cfg = BleuLossConfig::default();
    let loss_of = |probs: Tensor| Ok(bleu_loss(&probs, Some(&lengths), &refs, &cfg)?.loss);
    let last_dim = check_gradients(
        |x| loss_of(candle_nn::ops::softmax_last_dim(&on_device(x)?)?),
        &logits,
        &grad_cfg,
    )?;
    println!("  candle_nn::ops::softmax_last_dim:    {last_dim}");
    if last_dim.gradient_missing {
        println!("  -> softmax_last_dim has no backward: the model would get no BLEU gradient");
    } else {
        println!(
            "  -> softmax_last_dim now has a backward (candle changed): update the README's warning about ops without a backward"
        );
    }
    let composed = check_gradients(
        |x| loss_of(candle_nn::ops::softmax(&on_device(x)?, D::Minus1)?),
        &logits,
        &grad_cfg,
    )?;
    println!("  candle_nn::ops::softmax(x, D::Minus1): {composed}");
    let mut demo_failures = usize::from(!composed.passed);

    // 3. Any scalar function of a tensor: a log-sum-exp over the vocabulary, written by hand
    //    (max-shifted, the max detached: its gradient cancels) and candle's own.
    println!("\nyour own function:");
    let by_hand = |x: &Tensor| {
        let x = &on_device(x)?;
        let max = x.max_keepdim(D::Minus1)?.detach();
        let sum = x.broadcast_sub(&max)?.exp()?.sum_keepdim(D::Minus1)?;
        (sum.log()? + max)?.sum_all()
    };
    for (name, report) in [
        (
            "log-sum-exp by hand",
            check_gradients(by_hand, &logits, &grad_cfg)?,
        ),
        (
            "Tensor::log_sum_exp",
            check_gradients(
                |x| on_device(x)?.log_sum_exp(D::Minus1)?.sum_all(),
                &logits,
                &grad_cfg,
            )?,
        ),
    ] {
        println!("  {name}: {report}");
        demo_failures += usize::from(!report.passed);
    }

    if !failed.is_empty() || demo_failures > 0 {
        std::process::exit(1);
    }
    Ok(())
}
