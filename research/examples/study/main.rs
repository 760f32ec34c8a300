//! What the BLEU loss does to a model: every form and length model of the loss next to
//! cross-entropy, BLEU alone, and the loss on the model's own soft free-running decode, trained
//! from the same cross-entropy warm-up for an equal number of steps, over several seeds, on a
//! synthetic task where cross-entropy is not at the ceiling (see `task.rs`, `docs/study.md`).
//!
//! ```text
//! cargo run --release --example study                 # the full study (11 objectives x 3 seeds)
//! cargo run --release --example study -- --quick      # a smoke test, well under a minute
//! cargo run --release --example study -- --project    # time steps, project the full run's time
//! ```
//!
//! Protocol: label-smoothed (0.1) cross-entropy and seeded dropout (0.1) everywhere; every
//! objective is scored on test at its best dev evaluation (greedy BLEU every `--eval-every`
//! steps, among its own evaluations); seed-level paired t-tests against `ce` with Holm's
//! correction over the comparisons and the detectable difference; the averaging measures next
//! to what they give without a model (always the most frequent token, unigram draws, the
//! references). Scores depend on the thread count (candle's CPU reductions): `results.json`
//! records it. See `docs/study.md`.
//!
//! Outputs (under `--out`, default `runs/study/`): `results.json` (`runs: [{objective, seed,
//! dev_bleu, selected_step, test_bleu, test_hyp, test_ref, signature, measures: {...}}]`, the
//! seed-level tests and paired bootstrap of every objective against `ce`, the measures'
//! controls, the yardstick, the configuration), `test.ref` and `test.<objective>.seed<k>.hyp`
//! (whitespace-tokenized, paths relative to `results.json`: `sacrebleu test.ref -i <hyp> -tok
//! none -b` gives `test_bleu`), `table.md`, `log.csv`, `curves.png`, `averaging.png`, and the
//! generated data in `data/*.tsv`.

mod arms;
mod plots;
mod task;

use anyhow::{bail, Context, Result};
use candle_bleu::loss::LengthModel;
use candle_bleu_research::data::tokens::{write_lines, write_tsv, Vocab};
use candle_bleu_research::data::{encode_pairs, EOS};
use candle_bleu_research::device::device;
use candle_bleu_research::eval::{self, mean_sd};
use candle_bleu_research::model::ModelConfig;
use candle_bleu_research::progress::{self, say};
use candle_bleu_research::stats::seed_tests;
use candle_bleu_research::train::{
    log_csv, process_cpu_s, restore, snapshot, write_partial_results, LogRow, StepTime,
};
use candle_core::Device;
use clap::{Parser, ValueEnum};
use indicatif::MultiProgress;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use arms::{Arm, Init, RunData, Stretch, TrainConfig, WarmStart};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LengthArg {
    Given,
    NotEos,
    SoftEos,
}

/// The BLEU loss's forms, length models and decodes against cross-entropy, on a task where
/// cross-entropy is not at the ceiling.
#[derive(Parser, Debug)]
struct Args {
    /// Seeds (1, 2, ...); every seed trains every objective.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Cross-entropy warm-up steps shared by the warm-started objectives of a seed.
    #[arg(long, default_value_t = 400)]
    warmup_steps: usize,
    /// Steps of each objective after the warm-up (from-scratch objectives train
    /// warm-up + these steps).
    #[arg(long, default_value_t = 400)]
    arm_steps: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Weight λ of the BLEU term in `CE + λ · BLEU loss`.
    #[arg(long, default_value_t = 1.0)]
    lambda: f64,
    /// Label smoothing of every cross-entropy term.
    #[arg(long, default_value_t = 0.1)]
    label_smoothing: f64,
    /// Dropout on the embeddings and residual branches while training (seeded per seed).
    #[arg(long, default_value_t = 0.1)]
    dropout: f32,
    /// Objectives to train, comma-separated (default: every objective but the Gumbel one);
    /// `ce` is the bootstrap baseline.
    #[arg(long, value_delimiter = ',')]
    arms: Option<Vec<String>>,
    /// Length model of the BLEU-only objectives.
    #[arg(long, value_enum, default_value_t = LengthArg::SoftEos)]
    bleu_only_length: LengthArg,
    /// Free-running steps beyond the batch's longest reference and its EOS.
    #[arg(long, default_value_t = 2)]
    free_running_margin: usize,
    #[arg(long, default_value_t = 2000)]
    train_pairs: usize,
    #[arg(long, default_value_t = 400)]
    dev_pairs: usize,
    #[arg(long, default_value_t = 1000)]
    test_pairs: usize,
    /// Seed of the synthetic data (independent of the model seeds).
    #[arg(long, default_value_t = 2025)]
    data_seed: u64,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Encoder and decoder layers (each).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Dev BLEU and a log row every this many steps.
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Resamples of the paired bootstrap test.
    #[arg(long, default_value_t = 1000)]
    bootstrap: usize,
    /// A tiny study (1 seed, 40 + 40 steps, width 32, small sets) for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Time a few training steps of every objective and one dev evaluation, print the
    /// projected time of the whole study with these settings, and exit.
    #[arg(long)]
    project: bool,
    /// Output folder.
    #[arg(long, default_value = "runs/study")]
    out: PathBuf,
    /// Train on the CPU even when built with `cuda` or `metal` and a GPU is available.
    #[arg(long)]
    cpu: bool,
}

/// Everything a finished run produced.
pub struct RunOutput {
    pub arm: Arm,
    pub seed: u64,
    /// Dev BLEU of the selected checkpoint (the best of this objective's own evaluations).
    pub dev_bleu: f64,
    /// Its global step.
    pub selected_step: usize,
    /// Dev BLEU at the last step.
    pub last_dev_bleu: f64,
    pub test_bleu: f64,
    pub test_hyps: Vec<Vec<String>>,
    pub measures: eval::Measures,
    /// Including the shared warm-up's rows for warm-started objectives.
    pub log: Vec<LogRow>,
    /// Mean training step (this objective's steps only).
    pub step: StepTime,
    /// This objective's own training and evaluation, seconds (the shared warm-up excluded).
    pub wall_s: f64,
}

fn selected_arms(args: &Args) -> Result<Vec<Arm>> {
    let length = match args.bleu_only_length {
        LengthArg::Given => LengthModel::Given,
        LengthArg::NotEos => LengthModel::NotEos { eos_id: EOS },
        LengthArg::SoftEos => LengthModel::SoftEos { eos_id: EOS },
    };
    let all = arms::all_arms(length);
    match &args.arms {
        None => Ok(all[..arms::DEFAULT_ARMS].to_vec()),
        Some(names) => names
            .iter()
            .map(|name| {
                all.iter()
                    .find(|a| a.name == name)
                    .cloned()
                    .with_context(|| {
                        let known: Vec<&str> = all.iter().map(|a| a.name).collect();
                        format!(
                            "--arms: unknown objective `{name}`; known: {}",
                            known.join(", ")
                        )
                    })
            })
            .collect(),
    }
}

fn check_args(args: &Args) -> Result<()> {
    if args.seeds == 0
        || args.batch_size == 0
        || args.eval_every == 0
        || args.bootstrap == 0
        || args.arm_steps == 0
        || args.train_pairs == 0
        || args.dev_pairs == 0
        || args.test_pairs == 0
    {
        bail!(
            "--seeds, --batch-size, --eval-every, --bootstrap, --arm-steps and --train/dev/test-pairs \
             must be at least 1"
        );
    }
    if !(args.lambda.is_finite() && args.lambda >= 0.0) {
        bail!("--lambda must be finite and >= 0, got {}", args.lambda);
    }
    if !(args.lr.is_finite() && args.lr > 0.0) {
        bail!("--lr must be finite and > 0, got {}", args.lr);
    }
    if !(0.0..1.0).contains(&args.label_smoothing) {
        bail!(
            "--label-smoothing must be in [0, 1), got {}",
            args.label_smoothing
        );
    }
    if !(0.0..1.0).contains(&args.dropout) {
        bail!("--dropout must be in [0, 1), got {}", args.dropout);
    }
    if args.d_model == 0 || !args.d_model.is_multiple_of(4) {
        bail!(
            "--d-model must be a positive multiple of the 4 attention heads, got {}",
            args.d_model
        );
    }
    Ok(())
}

/// One objective of one seed, from its start to its test measures.
fn run_arm(
    arm: &Arm,
    seed: u64,
    warm: Option<&WarmStart>,
    cfg: &TrainConfig,
    data: &RunData,
    bars: &MultiProgress,
    device: &Device,
) -> Result<RunOutput> {
    let started = Instant::now();
    let (varmap, model) = arms::init_model(cfg, seed, device)?;
    let (first, mut log) = match (arm.init, warm) {
        (Init::Warm, Some(warm)) => {
            restore(&varmap, &warm.snapshot)?;
            (cfg.warmup_steps, warm.log.clone())
        }
        (Init::Warm, None) => bail!("{}: no warm-up checkpoint", arm.name),
        (Init::Scratch, _) => (0, Vec::new()),
    };
    let stretch = Stretch {
        arm: Some(arm),
        first,
        last: cfg.total_steps(),
        seed,
    };
    let bar = progress::bar(
        bars,
        format!("{} seed {seed}", arm.name),
        36,
        stretch.last - stretch.first,
    )?;
    let (arm_log, step, best) = arms::train(&varmap, &model, &stretch, cfg, data, &bar, device)?;
    bar.finish();
    log.extend(arm_log);
    let last_dev_bleu = log.last().map_or(0.0, |r| r.dev_bleu);
    restore(&varmap, &best.snapshot)?;
    let test_hyps = arms::translate(&varmap, cfg, data.test, data.tgt_vocab, device)?;
    let test_bleu = eval::bleu_100(&test_hyps, data.test_refs)?;
    let measures = eval::measures(&model, data.test, &test_hyps, data.test_refs, device)?;
    Ok(RunOutput {
        arm: arm.clone(),
        seed,
        dev_bleu: best.dev_bleu,
        selected_step: best.step,
        last_dev_bleu,
        test_bleu,
        test_hyps,
        measures,
        log,
        step,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Writes `run`'s test hypotheses to `out` and returns its `results.json` entry.
fn run_json(run: &RunOutput, out: &std::path::Path) -> Result<serde_json::Value> {
    let hyp_name = format!("test.{}.seed{}.hyp", run.arm.slug(), run.seed);
    write_lines(&out.join(&hyp_name), &run.test_hyps)?;
    Ok(serde_json::json!({
        "objective": run.arm.name,
        "seed": run.seed,
        "dev_bleu": run.dev_bleu,
        "selected_step": run.selected_step,
        "last_dev_bleu": run.last_dev_bleu,
        "test_bleu": run.test_bleu,
        "test_hyp": hyp_name,
        "test_ref": "test.ref",
        "signature": eval::BLEU_SIGNATURE_TOK_NONE,
        "measures": run.measures,
        "init": run.arm.init,
        "cross_entropy": run.arm.ce,
        "bleu_term": run.arm.bleu.map(|(form, length)| serde_json::json!({
            "form": format!("{form:?}"), "length": format!("{length:?}"),
        })),
        "decode": run.arm.decode,
        "train_s_per_step": run.step.wall_s,
        "train_cpu_s_per_step": run.step.cpu_s,
        "wall_s": run.wall_s,
    }))
}

/// `--project`: times steps of every objective and one dev evaluation, and extrapolates.
fn project(
    arms: &[Arm],
    cfg: &TrainConfig,
    data: &RunData,
    seeds: u64,
    device: &Device,
) -> Result<()> {
    const TIMED: usize = 12;
    let bars = MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden());
    let timing_cfg = TrainConfig {
        eval_every: usize::MAX,
        ..cfg.clone()
    };
    let mut ce_step = None;
    let (mut total, mut total_cpu) = (0.0, 0.0);
    println!(
        "| objective | wall s / step (mean of {TIMED}) | CPU s / step | steps / seed | projected wall s / seed | projected CPU s / seed |"
    );
    println!("|---|---|---|---|---|---|");
    for arm in arms {
        let (varmap, model) = arms::init_model(cfg, 1, device)?;
        let stretch = Stretch {
            arm: Some(arm),
            first: cfg.warmup_steps,
            last: cfg.warmup_steps + TIMED,
            seed: 1,
        };
        let bar = progress::bar(&bars, format!("{} seed 1", arm.name), 36, TIMED)?;
        let (_, step, _) = arms::train(&varmap, &model, &stretch, &timing_cfg, data, &bar, device)?;
        let steps = match arm.init {
            Init::Warm => cfg.arm_steps,
            Init::Scratch => cfg.total_steps(),
        };
        if arm.name == "ce" {
            ce_step = Some(step);
        }
        total += step.wall_s * steps as f64;
        total_cpu += step.cpu_s * steps as f64;
        println!(
            "| {} | {:.3} | {:.3} | {steps} | {:.0} | {:.0} |",
            arm.name,
            step.wall_s,
            step.cpu_s,
            step.wall_s * steps as f64,
            step.cpu_s * steps as f64
        );
    }
    let ce_step = ce_step.unwrap_or_default();
    let (warmup, warmup_cpu) = (
        ce_step.wall_s * cfg.warmup_steps as f64,
        ce_step.cpu_s * cfg.warmup_steps as f64,
    );
    let (varmap, _) = arms::init_model(cfg, 1, device)?;
    let (started, cpu_started) = (Instant::now(), process_cpu_s());
    arms::translate(&varmap, cfg, data.dev, data.tgt_vocab, device)?;
    let dev_eval = started.elapsed().as_secs_f64();
    let dev_eval_cpu = process_cpu_s() - cpu_started;
    let evals: usize = cfg.warmup_steps / cfg.eval_every
        + arms
            .iter()
            .map(|a| match a.init {
                Init::Warm => cfg.arm_steps / cfg.eval_every + 1,
                Init::Scratch => cfg.total_steps() / cfg.eval_every + 1,
            })
            .sum::<usize>();
    // Test decode and measures per run: the test set's size in dev evaluations, plus 20% for
    // the teacher-forced measures pass (cheap next to greedy decoding).
    let test_ratio = 1.2 * data.test.len() as f64 / data.dev.len().max(1) as f64;
    let eval_units = evals as f64 + arms.len() as f64 * test_ratio;
    let per_seed = total + warmup + eval_units * dev_eval;
    let per_seed_cpu = total_cpu + warmup_cpu + eval_units * dev_eval_cpu;
    println!(
        "\nCE warm-up {warmup:.0} s wall / {warmup_cpu:.0} s CPU per seed; one dev evaluation \
         (greedy, {} sentences, untrained model: decodes run to the length limit, an upper bound) \
         {dev_eval:.2} s wall / {dev_eval_cpu:.2} s CPU, {evals} per seed.\n\
         projected total for {seeds} seed(s): {:.0} s wall ({:.1} min); {:.0} s CPU ({:.1} min)",
        data.dev.len(),
        per_seed * seeds as f64,
        per_seed * seeds as f64 / 60.0,
        per_seed_cpu * seeds as f64,
        per_seed_cpu * seeds as f64 / 60.0,
    );
    Ok(())
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.seeds = 1;
        args.warmup_steps = 40;
        args.arm_steps = 40;
        args.batch_size = 32;
        args.d_model = 32;
        args.layers = 1;
        args.train_pairs = 1000;
        args.dev_pairs = 60;
        args.test_pairs = 150;
        args.eval_every = 40;
        args.bootstrap = args.bootstrap.min(200);
    }
    check_args(&args)?;
    let started = Instant::now();
    let device = device(args.cpu);
    let arms = selected_arms(&args)?;
    let corpus = task::corpus(
        args.train_pairs,
        args.dev_pairs,
        args.test_pairs,
        args.data_seed,
    );
    let src_vocab = Vocab::build(corpus.train.iter().map(|p| &p.src));
    let tgt_vocab = Vocab::build(corpus.train.iter().map(|p| &p.tgt));
    let train = encode_pairs(&corpus.train, &src_vocab, &tgt_vocab);
    let dev = encode_pairs(&corpus.dev, &src_vocab, &tgt_vocab);
    let test = encode_pairs(&corpus.test, &src_vocab, &tgt_vocab);
    let dev_refs: Vec<Vec<String>> = corpus.dev.iter().map(|p| p.tgt.clone()).collect();
    let test_refs: Vec<Vec<String>> = corpus.test.iter().map(|p| p.tgt.clone()).collect();
    let all_pairs = || corpus.train.iter().chain(&corpus.dev).chain(&corpus.test);
    let longest_src = all_pairs().map(|p| p.src.len()).max().unwrap_or(1);
    let max_target = all_pairs().map(|p| p.tgt.len()).max().unwrap_or(1);
    let max_decode_len = 2 * max_target + 2;
    let cfg = TrainConfig {
        model: ModelConfig {
            src_vocab: src_vocab.len(),
            tgt_vocab: tgt_vocab.len(),
            d_model: args.d_model,
            heads: 4,
            d_ff: 2 * args.d_model,
            encoder_layers: args.layers,
            decoder_layers: args.layers,
            max_len: longest_src.max(max_decode_len + args.free_running_margin + 2),
        },
        warmup_steps: args.warmup_steps,
        arm_steps: args.arm_steps,
        batch_size: args.batch_size,
        lr: args.lr,
        lr_warmup: (args.warmup_steps + args.arm_steps)
            .div_ceil(10)
            .clamp(1, 200),
        lambda: args.lambda,
        label_smoothing: args.label_smoothing,
        dropout: args.dropout,
        free_running_margin: args.free_running_margin,
        eval_every: args.eval_every,
        max_decode_len,
    };
    let run_data = RunData {
        train: &train,
        dev: &dev,
        dev_refs: &dev_refs,
        test: &test,
        test_refs: &test_refs,
        tgt_vocab: &tgt_vocab,
    };
    let oracle_bleu = corpus
        .test_oracle
        .as_ref()
        .map(|oracle| eval::bleu_100(oracle, &test_refs))
        .transpose()?;
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target, targets up to \
         {max_target} tokens; model d={} layers={}+{}; CE warm-up {} steps, then {} steps per \
         objective, batch {}, λ={}, CE label smoothing {}, dropout {}; {} objectives x {} seeds; \
         {} threads; rule-based yardstick test BLEU {:.2}",
        train.len(),
        dev.len(),
        test.len(),
        src_vocab.len(),
        tgt_vocab.len(),
        cfg.model.d_model,
        cfg.model.encoder_layers,
        cfg.model.decoder_layers,
        cfg.warmup_steps,
        cfg.arm_steps,
        cfg.batch_size,
        cfg.lambda,
        cfg.label_smoothing,
        cfg.dropout,
        arms.len(),
        args.seeds,
        candle_core::utils::get_num_threads(),
        oracle_bleu.unwrap_or(f64::NAN),
    );
    if args.project {
        return project(&arms, &cfg, &run_data, args.seeds, &device);
    }

    std::fs::create_dir_all(args.out.join("data"))
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    write_tsv(&args.out.join("data/train.tsv"), &corpus.train)?;
    write_tsv(&args.out.join("data/dev.tsv"), &corpus.dev)?;
    write_tsv(&args.out.join("data/test.tsv"), &corpus.test)?;

    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &test_refs)?;
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let mut runs: Vec<RunOutput> = Vec::new();
    let mut warmup_s = Vec::new();
    for seed in 1..=args.seeds {
        // The shared cross-entropy warm-up of this seed.
        let warm = if arms.iter().any(|a| a.init == Init::Warm) && cfg.warmup_steps > 0 {
            let warm_started = Instant::now();
            let (varmap, model) = arms::init_model(&cfg, seed, &device)?;
            let stretch = Stretch {
                arm: None,
                first: 0,
                last: cfg.warmup_steps,
                seed,
            };
            let prefix = format!("ce warm-up seed {seed}");
            let bar = progress::bar(&bars, prefix, 36, cfg.warmup_steps)?;
            let (log, _, _) =
                arms::train(&varmap, &model, &stretch, &cfg, &run_data, &bar, &device)?;
            bar.finish();
            warmup_s.push(warm_started.elapsed().as_secs_f64());
            Some(WarmStart {
                snapshot: snapshot(&varmap)?,
                log,
            })
        } else if arms.iter().any(|a| a.init == Init::Warm) {
            let (varmap, _) = arms::init_model(&cfg, seed, &device)?;
            Some(WarmStart {
                snapshot: snapshot(&varmap)?,
                log: Vec::new(),
            })
        } else {
            None
        };
        for arm in &arms {
            let output = run_arm(arm, seed, warm.as_ref(), &cfg, &run_data, &bars, &device)?;
            say(
                &bars,
                format!(
                    "{:>32} seed {seed}: dev BLEU {:6.2} (step {}; last {:.2})  test BLEU {:6.2}  ({:.0} s, {:.0} ms/step)",
                    arm.name,
                    output.dev_bleu,
                    output.selected_step,
                    output.last_dev_bleu,
                    output.test_bleu,
                    output.wall_s,
                    1e3 * output.step.wall_s
                ),
            )?;
            json_runs.push(run_json(&output, &args.out)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }

    // Files: log, results.
    let csv = log_csv(runs.iter().map(|r| (r.arm.name, r.seed, r.log.as_slice())));
    std::fs::write(args.out.join("log.csv"), csv)?;

    // Paired bootstrap against `ce`: pooled (the seeds' test sets concatenated, segment i of
    // seed k paired with segment i of seed k) and per seed.
    let names: Vec<&str> = arms.iter().map(|a| a.name).collect();
    let seeds: Vec<u64> = (1..=args.seeds).collect();
    let stats_of = |name: &str, seed: u64| -> Result<Option<Vec<candle_bleu::exact::BleuCounts>>> {
        runs.iter()
            .find(|r| r.arm.name == name && r.seed == seed)
            .map(|r| eval::segment_stats(&r.test_hyps, &test_refs))
            .transpose()
    };
    let others: Vec<&str> = names.iter().copied().filter(|n| *n != "ce").collect();
    let mut pooled = serde_json::Map::new();
    let mut per_seed = serde_json::Map::new();
    let mut pooled_by_name = std::collections::HashMap::new();
    if names.contains(&"ce") && !others.is_empty() {
        let mut base_all = Vec::new();
        let mut systems_all: Vec<Vec<_>> = vec![Vec::new(); others.len()];
        for &seed in &seeds {
            let base = stats_of("ce", seed)?.expect("ce ran for every seed");
            let systems: Vec<Vec<_>> = others
                .iter()
                .map(|n| Ok(stats_of(n, seed)?.expect("every objective ran for every seed")))
                .collect::<Result<_>>()?;
            let results = eval::compare(&base, &systems, args.bootstrap)?;
            for (name, result) in others.iter().zip(&results) {
                per_seed
                    .entry(name.to_string())
                    .or_insert_with(|| serde_json::json!([]))
                    .as_array_mut()
                    .expect("an array")
                    .push(serde_json::json!({"seed": seed, "test": result}));
            }
            base_all.extend(base);
            for (all, system) in systems_all.iter_mut().zip(systems) {
                all.extend(system);
            }
        }
        let results = eval::compare(&base_all, &systems_all, args.bootstrap)?;
        for (name, result) in others.iter().zip(results) {
            pooled.insert(name.to_string(), serde_json::to_value(&result)?);
            pooled_by_name.insert(name.to_string(), result);
        }
    }

    // Seed-level paired t-tests against `ce`, Holm-adjusted over the objectives compared.
    let test_bleu_of = |name: &str| -> Vec<f64> {
        seeds
            .iter()
            .filter_map(|&seed| {
                runs.iter()
                    .find(|r| r.arm.name == name && r.seed == seed)
                    .map(|r| r.test_bleu)
            })
            .collect()
    };
    let seed_level = if names.contains(&"ce") && !others.is_empty() && seeds.len() >= 2 {
        let systems: Vec<(String, Vec<f64>)> = others
            .iter()
            .map(|n| (n.to_string(), test_bleu_of(n)))
            .collect();
        seed_tests(&test_bleu_of("ce"), &systems)?
    } else {
        Vec::new()
    };
    let train_targets: Vec<Vec<String>> = corpus.train.iter().map(|p| p.tgt.clone()).collect();
    let controls = eval::measure_controls(&train_targets, &test_refs)?;

    let reference_repeats = eval::repeated_token_rate(&test_refs);
    let results = serde_json::json!({
        "task": "study synthetic task (research/examples/study/task.rs, docs/study.md)",
        "rule_based_test_bleu": oracle_bleu,
        "reference_measures": {
            "repeated_token_rate": reference_repeats,
            "length_ratio": 1.0,
        },
        "measure_controls": controls,
        "runs": json_runs,
        "seed_tests": {
            "baseline": "ce",
            "method": "paired t-test over seeds of test BLEU (objective - ce), two-sided; p_holm: Holm's adjustment over all objectives compared with ce; detectable_difference: the true mean difference detected with 80% power at alpha 0.05 given the observed sd of the differences",
            "tests": seed_level,
        },
        "bootstrap": {
            "baseline": "ce",
            "method": "sacrebleu --paired-bs (candle_bleu::exact::bootstrap::paired_bootstrap_many, seed 12345); delta = BLEU(objective) - BLEU(ce); pooled: the seeds' test sets concatenated, segments paired within each seed",
            "resamples": args.bootstrap,
            "pooled": pooled,
            "per_seed": per_seed,
        },
        "config": {
            "seeds": args.seeds, "warmup_steps": cfg.warmup_steps, "arm_steps": cfg.arm_steps,
            "batch_size": cfg.batch_size, "lr": cfg.lr, "lambda": cfg.lambda,
            "label_smoothing": cfg.label_smoothing, "dropout": cfg.dropout,
            "selection": "best dev BLEU (greedy) among each objective's own evaluations",
            "threads": candle_core::utils::get_num_threads(),
            "free_running_margin": cfg.free_running_margin,
            "bleu_only_length": format!("{:?}", args.bleu_only_length),
            "d_model": cfg.model.d_model, "layers": cfg.model.encoder_layers,
            "train_pairs": train.len(), "dev_pairs": dev.len(), "test_pairs": test.len(),
            "data_seed": args.data_seed, "eval_every": cfg.eval_every,
        },
        "warmup_wall_s": warmup_s,
        "total_wall_s": started.elapsed().as_secs_f64(),
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    plots::curves(
        &args.out.join("curves.png"),
        &runs,
        &names,
        cfg.warmup_steps,
    )?;
    plots::averaging(
        &args.out.join("averaging.png"),
        &runs,
        &names,
        reference_repeats,
    )?;

    // The table.
    let mut table = String::new();
    writeln!(
        table,
        "| objective | test BLEU (mean ± sd, {} seeds) | dev BLEU (selected) | vs ce: seed-level paired t (Holm) | detectable Δ | vs ce: pooled paired bootstrap | entropy | argmax = other ref token | argmax top-token share | ref bag coverage | repeated tokens | length ratio | ms / step |",
        args.seeds
    )?;
    writeln!(
        table,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )?;
    for name in &names {
        let of: Vec<&RunOutput> = runs.iter().filter(|r| r.arm.name == *name).collect();
        let stat =
            |f: &dyn Fn(&RunOutput) -> f64| mean_sd(&of.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (test_mean, test_sd) = stat(&|r| r.test_bleu);
        let versus = match pooled_by_name.get(*name) {
            Some(c) => format!("Δ {:+.2}, p = {:.3}", c.delta, c.p_value),
            None if *name == "ce" => "baseline".to_string(),
            None => "—".to_string(),
        };
        let seed_test = seed_level.iter().find(|t| t.objective == *name);
        let (t_cell, detectable) = match seed_test {
            Some(t) => (
                format!(
                    "Δ {:+.2}, p = {:.3} (Holm {:.3})",
                    t.test.mean_difference, t.test.p_value, t.p_holm
                ),
                format!("{:.2}", t.test.detectable_difference),
            ),
            None if *name == "ce" => ("baseline".to_string(), "—".to_string()),
            None => ("—".to_string(), "—".to_string()),
        };
        writeln!(
            table,
            "| {name} | {test_mean:.2} ± {test_sd:.2} | {:.2} | {t_cell} | {detectable} | {versus} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |",
            stat(&|r| r.dev_bleu).0,
            stat(&|r| r.measures.entropy).0,
            stat(&|r| r.measures.argmax_other_ref_rate).0,
            stat(&|r| r.measures.argmax_top_token_share).0,
            stat(&|r| r.measures.argmax_ref_bag_coverage).0,
            stat(&|r| r.measures.repeated_token_rate).0,
            stat(&|r| r.measures.length_ratio).0,
            1e3 * stat(&|r| r.step.wall_s).0,
        )?;
    }
    for (label, control) in [
        (
            format!("no model: always `{}`", controls.most_frequent_token),
            &controls.constant,
        ),
        (
            "no model: unigram draws (expected)".to_string(),
            &controls.unigram,
        ),
        ("no model: the references".to_string(), &controls.references),
    ] {
        writeln!(
            table,
            "| {label} | | | | | | | {:.3} | {:.3} | {:.3} | | | |",
            control.argmax_other_ref_rate,
            control.argmax_top_token_share,
            control.argmax_ref_bag_coverage,
        )?;
    }
    writeln!(
        table,
        "\nReferences: repeated-token rate {reference_repeats:.3}. Rule-based yardstick (each test \
         source translated by the task's rules with every word's most probable choice): test BLEU {:.2}.",
        oracle_bleu.unwrap_or(f64::NAN)
    )?;
    writeln!(
        table,
        "\nPer seed: test BLEU (selected step).\n\n| objective | {} |\n|---|{}",
        seeds
            .iter()
            .map(|s| format!("seed {s}"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(seeds.len())
    )?;
    for name in &names {
        let cells: Vec<String> = seeds
            .iter()
            .map(|&seed| {
                runs.iter()
                    .find(|r| r.arm.name == *name && r.seed == seed)
                    .map_or("—".to_string(), |r| {
                        format!("{:.2} ({})", r.test_bleu, r.selected_step)
                    })
            })
            .collect();
        writeln!(table, "| {name} | {} |", cells.join(" | "))?;
    }
    std::fs::write(args.out.join("table.md"), &table)?;
    println!("\n{table}");
    println!(
        "wrote {} (results.json, table.md, log.csv, curves.png, averaging.png, test.*); total {:.0} s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
