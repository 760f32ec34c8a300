//! Soft BLEU against temperature: as `τ → 0`, `softmax(logits / τ)` tends to the one-hot
//! argmax decode, and every form of the loss tends to the exact BLEU of that decode.
//!
//! Fixed random logits `[B, S, V] = [8, 12, 20]` whose argmax decode shares n-grams of every
//! order with the references (1–2 per sentence, made by editing the decode, padded). For 15
//! temperatures from 10 down to 0.01 (log-spaced) the example computes the soft corpus BLEU
//! `exp(-loss)` of `bleu_loss_from_logits(logits / τ)` for the expected, paired and
//! lower-bound forms, next to the exact corpus BLEU of the argmax decode
//! (`candle_bleu::exact`, sacrebleu's add-k smoothing, the loss's default `AddK(1)`).
//! It prints a table, writes `temperature.csv` and `temperature.png` (log τ axis, one line per
//! form, the exact BLEU dashed) under `--out`, and exits non-zero unless every form is within
//! `1e-6` of the exact BLEU at the smallest temperature.
//!
//! ```text
//! cargo run --release --example temperature                       # writes runs/temperature/
//! cargo run --release --example temperature -- --out /tmp/temperature
//! ```
//!
//! Device: the GPU of a `--features cuda` (or `metal`) build, else the CPU; `--cpu` forces the
//! CPU. The data is drawn on the host and the loss runs on the device, in f64 (Metal has no
//! f64: use `--cpu` on a Mac).

use anyhow::{anyhow, bail, Context, Result};
use candle_bleu::exact::{self, BleuConfig, BleuCounts, SmoothMethod};
use candle_bleu::loss::{bleu_loss_from_logits, BleuLossConfig, Form, LossSmoothing, References};
use candle_core::{DType, Device, Tensor, D};
use clap::Parser;
use plotters::prelude::*;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use candle_bleu_research::data::reference_tensor;
use candle_bleu_research::device;

#[derive(Parser, Debug)]
#[command(about = "Soft BLEU of softmax(logits / τ) against τ, and the exact BLEU of the argmax")]
struct Args {
    /// Output directory for temperature.csv and temperature.png.
    #[arg(long, default_value = "runs/temperature")]
    out: PathBuf,
    /// Run on the CPU even when built with `cuda` or `metal` and a GPU is available.
    #[arg(long)]
    cpu: bool,
}

const PAD: u32 = 0;
const BATCH: usize = 8;
const SEQ: usize = 12;
const VOCAB: usize = 20;
const TEMPERATURES: usize = 15;
const FORMS: [(Form, &str); 3] = [
    (Form::Expected, "expected"),
    (Form::Paired, "paired"),
    (Form::LowerBound, "lower_bound"),
];

/// The argmax decode `[b][i]` (ids 1..V, 0 is padding), references `[b][r]` that edit it
/// (substitutions, a dropped or an added token), and logits whose argmax is the decode by a
/// margin of at least 1: uniform noise in `[-1, 1)` plus 3 on the decoded token.
struct Data {
    decode: Vec<Vec<u32>>,
    refs: Vec<Vec<Vec<u32>>>,
    logits: Tensor,
}

fn data(seed: u64) -> Result<Data> {
    let mut rng = StdRng::seed_from_u64(seed);
    let token = |rng: &mut StdRng| rng.gen_range(1..VOCAB as u32);
    let decode: Vec<Vec<u32>> = (0..BATCH)
        .map(|_| (0..SEQ).map(|_| token(&mut rng)).collect())
        .collect();
    let mut refs = Vec::with_capacity(BATCH);
    for hyp in &decode {
        let count = rng.gen_range(1..=2);
        let element: Vec<Vec<u32>> = (0..count)
            .map(|_| {
                let mut reference = hyp.clone();
                for _ in 0..2 {
                    let at = rng.gen_range(0..reference.len());
                    reference[at] = token(&mut rng);
                }
                match rng.gen_range(0..3) {
                    0 => {
                        reference.remove(rng.gen_range(0..reference.len()));
                    }
                    1 => reference.insert(rng.gen_range(0..=reference.len()), token(&mut rng)),
                    _ => {}
                }
                reference
            })
            .collect();
        refs.push(element);
    }
    let mut logits = vec![0f64; BATCH * SEQ * VOCAB];
    for (k, logit) in logits.iter_mut().enumerate() {
        let (b, i, v) = (k / (SEQ * VOCAB), k / VOCAB % SEQ, k % VOCAB);
        *logit = rng.gen_range(-1.0..1.0) + if decode[b][i] == v as u32 { 3.0 } else { 0.0 };
    }
    let logits = Tensor::from_vec(logits, (BATCH, SEQ, VOCAB), &Device::Cpu)?;
    Ok(Data {
        decode,
        refs,
        logits,
    })
}

/// `temperature.png`: soft BLEU (0–100) of each form against τ on a log axis, and the exact
/// BLEU as a dashed horizontal line.
fn plot(path: &Path, taus: &[f64], soft: &[Vec<f64>], exact_bleu: f64) -> Result<()> {
    candle_bleu_research::plot::register_font()?;
    let plot_err = |e: DrawingAreaErrorKind<<BitMapBackend as DrawingBackend>::ErrorType>| {
        anyhow!("plot: {e}")
    };
    let root = BitMapBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    // A little room beyond the data, so that 0.01 and 10 get their labels.
    let (tau_min, tau_max) = (0.8 * taus[taus.len() - 1], 1.25 * taus[0]);
    let top = soft.iter().flatten().fold(exact_bleu, |a, &b| a.max(b)) * 100.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "soft BLEU of softmax(logits / τ) vs exact BLEU of the argmax",
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((tau_min..tau_max).log_scale(), 0f64..(top * 1.08).max(1.0))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc("temperature τ (log scale)")
        .y_desc("corpus BLEU")
        .x_label_formatter(&|x| format!("{x}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(plot_err)?;
    let colours = [
        RGBColor(31, 119, 180),
        RGBColor(214, 39, 40),
        RGBColor(44, 160, 44),
    ];
    for (f, ((_, name), colour)) in FORMS.iter().zip(colours).enumerate() {
        let points: Vec<(f64, f64)> = taus
            .iter()
            .zip(&soft[f])
            .map(|(&t, &s)| (t, 100.0 * s))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(plot_err)?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, colour.filled())),
            )
            .map_err(plot_err)?;
    }
    let exact_line = [(tau_min, 100.0 * exact_bleu), (tau_max, 100.0 * exact_bleu)];
    chart
        .draw_series(DashedLineSeries::new(
            exact_line,
            8,
            6,
            BLACK.stroke_width(2),
        ))
        .map_err(plot_err)?
        .label("exact (argmax decode)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::MiddleRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 16))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}

fn main() -> Result<()> {
    let args = Args::parse();
    let device = device::device(args.cpu);
    let Data {
        decode,
        refs,
        logits,
    } = data(0)?;
    let logits = logits.to_device(&device)?;
    let references = References::from_ids(&reference_tensor(&refs, PAD, &device)?, PAD)?;

    // Exact corpus BLEU of the argmax decode, with the loss's smoothing: BLEU+1 (add-k, k = 1,
    // for orders >= 2) is sacrebleu's add-k; corpus statistics are summed segment statistics.
    let stats: BleuCounts = decode
        .iter()
        .zip(&refs)
        .map(|(hyp, element)| exact::segment_stats(hyp, element, 4))
        .sum::<Result<BleuCounts, _>>()?;
    if stats.matches.contains(&0) {
        bail!("the data has an order without matches: {:?}", stats.matches);
    }
    let exact_cfg = BleuConfig {
        max_order: 4,
        weights: None,
        smoothing: SmoothMethod::AddK(1.0),
        effective_order: false,
    };
    let exact_bleu = exact::score_from_stats(&stats, &exact_cfg)
        .map_err(|e| anyhow!("{e}"))?
        .bleu;
    // The argmax of logits / τ is the same decode at every τ > 0: check it once.
    let argmax = logits.argmax(D::Minus1)?.to_vec2::<u32>()?;
    assert_eq!(argmax, decode, "the logits' argmax is the decode");

    // τ from 10 down to 0.01, log-spaced.
    let taus: Vec<f64> = (0..TEMPERATURES)
        .map(|k| 10f64.powf(1.0 - 3.0 * k as f64 / (TEMPERATURES - 1) as f64))
        .collect();
    let mut soft = vec![Vec::with_capacity(TEMPERATURES); FORMS.len()];
    for &tau in &taus {
        let scaled = (&logits / tau)?;
        for (f, &(form, _)) in FORMS.iter().enumerate() {
            let cfg = BleuLossConfig {
                form,
                smoothing: LossSmoothing::AddK(1.0),
                ..Default::default()
            };
            let loss = bleu_loss_from_logits(&scaled, None, &references, &cfg)?.loss;
            soft[f].push((-loss.to_dtype(DType::F64)?.to_scalar::<f64>()?).exp());
        }
    }

    println!(
        "matches {:?} totals {:?} hyp_len {} ref_len {}",
        stats.matches, stats.totals, stats.hyp_len, stats.ref_len
    );
    println!(
        "corpus BLEU (0-100): soft = exp(-loss) of softmax(logits / tau); exact = argmax decode"
    );
    let mut csv = String::from("tau,expected,paired,lower_bound,exact\n");
    println!(
        "{:>9} {:>10} {:>10} {:>12} {:>10}",
        "tau", "expected", "paired", "lower_bound", "exact"
    );
    for (k, &tau) in taus.iter().enumerate() {
        let row = [soft[0][k], soft[1][k], soft[2][k], exact_bleu];
        println!(
            "{tau:>9.4} {:>10.4} {:>10.4} {:>12.4} {:>10.4}",
            100.0 * row[0],
            100.0 * row[1],
            100.0 * row[2],
            100.0 * row[3]
        );
        writeln!(csv, "{tau},{},{},{},{}", row[0], row[1], row[2], row[3])?;
    }

    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let csv_path = args.out.join("temperature.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let png_path = args.out.join("temperature.png");
    plot(&png_path, &taus, &soft, exact_bleu)?;
    println!("wrote {} and {}", csv_path.display(), png_path.display());

    // At the smallest τ the distributions are one-hot to within exp(-100): every form must be
    // the exact BLEU.
    let last = TEMPERATURES - 1;
    let mut ok = true;
    for (f, (_, name)) in FORMS.iter().enumerate() {
        let error = (soft[f][last] - exact_bleu).abs();
        let verdict = if error <= 1e-6 { "ok" } else { "MISMATCH" };
        println!(
            "tau = {}: {name} differs from exact by {error:.3e} (BLEU in [0, 1]): {verdict}",
            taus[last]
        );
        ok &= error <= 1e-6;
    }
    if !ok {
        eprintln!("a form is not within 1e-6 of the exact BLEU at the smallest temperature");
        std::process::exit(1);
    }
    Ok(())
}
