//! What the BLEU loss does to a model: every form and length model of the loss next to
//! cross-entropy, BLEU alone, and the loss on the model's own soft free-running decode, trained
//! from the same cross-entropy warm-up for an equal number of steps, over several seeds, on a
//! synthetic task where cross-entropy is not at the ceiling (the research library's
//! `task::agreement`, `docs/study.md`).
//!
//! ```text
//! cargo run --release --example study                 # the full study (11 objectives x 3 seeds)
//! cargo run --release --example study -- --quick      # a smoke test, well under a minute (runs/quick/study)
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
//! Outputs (under `--out`, default `runs/study/`, `runs/quick/study/` with `--quick`):
//! `results.json` (`runs: [{objective, seed, dev_bleu, selected_step, test_bleu, test_hyp,
//! test_ref, signature, measures: {...}}]`, the seed-level tests and paired bootstrap of every
//! objective against `ce`, the measures' controls, the yardstick, the configuration), `test.ref`
//! and `test.<objective>.seed<k>.hyp`
//! (whitespace-tokenized, paths relative to `results.json`: `sacrebleu test.ref -i <hyp> -tok
//! none -b` gives `test_bleu`), `table.md`, `log.csv`, `curves.png`, `averaging.png`, and the
//! generated data in `data/*.tsv`.

mod arms;
mod plots;
mod report;
mod run;

use anyhow::{Context, Result};
use candle_bleu_research::cli::{check_at_least_one, output_dir, LengthArg, SyntheticTrainingArgs};
use candle_bleu_research::data::tokens::{write_lines, write_tsv};
use candle_bleu_research::data::{EncodedCorpus, EOS};
use candle_bleu_research::device::device;
use candle_bleu_research::eval;
use candle_bleu_research::model::transformer::{PositionAdd, TransformerConfig};
use candle_bleu_research::progress::say;
use candle_bleu_research::task::agreement;
use candle_bleu_research::train::write_partial_results;
use clap::Parser;
use indicatif::MultiProgress;
use std::path::PathBuf;
use std::time::Instant;

use arms::{Arm, TrainConfig};
use run::RunOutput;

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
    /// The training flags the study shares with the seq2seq example.
    #[command(flatten)]
    training: SyntheticTrainingArgs,
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
    /// A tiny study (1 seed, 40 + 40 steps, width 32, small sets) for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Time a few training steps of every objective and one dev evaluation, print the
    /// projected time of the whole study with these settings, and exit.
    #[arg(long)]
    project: bool,
    /// Output folder (default runs/study; with --quick, runs/quick/study).
    #[arg(long = "out", value_name = "OUT")]
    out_flag: Option<PathBuf>,
    /// The output folder in use: `--out`, else the default for a full or `--quick` run.
    #[arg(skip)]
    out: PathBuf,
}

impl Args {
    fn apply_quick(&mut self) {
        self.seeds = 1;
        self.warmup_steps = 40;
        self.arm_steps = 40;
        self.training.batch_size = 32;
        self.training.d_model = 32;
        self.training.layers = 1;
        self.train_pairs = 1000;
        self.dev_pairs = 60;
        self.test_pairs = 150;
        self.training.eval_every = 40;
        self.training.bootstrap = self.training.bootstrap.min(200);
    }

    fn check(&self) -> Result<()> {
        check_at_least_one(&[
            ("--seeds", self.seeds as usize),
            ("--arm-steps", self.arm_steps),
            ("--train-pairs", self.train_pairs),
            ("--dev-pairs", self.dev_pairs),
            ("--test-pairs", self.test_pairs),
        ])?;
        self.training.check()
    }
}

/// The objectives `--arms` names (by default the first [`arms::DEFAULT_ARMS`]).
fn selected_arms(args: &Args) -> Result<Vec<Arm>> {
    let all = arms::all_arms(args.bleu_only_length.model(EOS));
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

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.apply_quick();
    }
    args.out = output_dir(
        args.out_flag.take(),
        args.quick,
        "study",
        PathBuf::from("runs/study"),
    );
    args.check()?;
    let training = &args.training;
    let started = Instant::now();
    let device = device(training.cpu);
    let arms = selected_arms(&args)?;
    let corpus = agreement::corpus(
        args.train_pairs,
        args.dev_pairs,
        args.test_pairs,
        args.data_seed,
    );
    let data = EncodedCorpus::new(&corpus);
    let all_pairs = || corpus.train.iter().chain(&corpus.dev).chain(&corpus.test);
    let longest_src = all_pairs().map(|p| p.src.len()).max().unwrap_or(1);
    let max_target = all_pairs().map(|p| p.tgt.len()).max().unwrap_or(1);
    let max_decode_len = 2 * max_target + 2;
    let cfg = TrainConfig {
        model: TransformerConfig {
            src_vocab: data.src_vocab.len(),
            tgt_vocab: data.tgt_vocab.len(),
            d_model: training.d_model,
            heads: 4,
            d_ff: 2 * training.d_model,
            encoder_layers: training.layers,
            decoder_layers: training.layers,
            // The longest sequence and BOS.
            max_len: longest_src.max(max_decode_len + args.free_running_margin + 2) + 1,
            dropout: training.dropout,
            tie_all: false,
            positions: PositionAdd::Lookup,
        },
        warmup_steps: args.warmup_steps,
        arm_steps: args.arm_steps,
        batch_size: training.batch_size,
        lr: training.lr,
        lr_warmup: (args.warmup_steps + args.arm_steps)
            .div_ceil(10)
            .clamp(1, 200),
        lambda: training.lambda,
        label_smoothing: training.label_smoothing,
        dropout: training.dropout,
        free_running_margin: args.free_running_margin,
        eval_every: training.eval_every,
        max_decode_len,
    };
    let oracle_bleu = corpus
        .test_oracle
        .as_ref()
        .map(|oracle| eval::bleu_100(oracle, &data.test_refs))
        .transpose()?;
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target, targets up to \
         {max_target} tokens; model d={} layers={}+{}; CE warm-up {} steps, then {} steps per \
         objective, batch {}, λ={}, CE label smoothing {}, dropout {}; {} objectives x {} seeds; \
         {} threads; rule-based yardstick test BLEU {:.2}",
        data.train.len(),
        data.dev.len(),
        data.test.len(),
        data.src_vocab.len(),
        data.tgt_vocab.len(),
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
        return run::project(&arms, &cfg, &data, args.seeds, &device);
    }

    std::fs::create_dir_all(args.out.join("data"))
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    write_tsv(&args.out.join("data/train.tsv"), &corpus.train)?;
    write_tsv(&args.out.join("data/dev.tsv"), &corpus.dev)?;
    write_tsv(&args.out.join("data/test.tsv"), &corpus.test)?;

    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &data.test_refs)?;
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let mut runs: Vec<RunOutput> = Vec::new();
    let mut warmup_s = Vec::new();
    for seed in 1..=args.seeds {
        let warm_started = Instant::now();
        let warm = run::warm_up(&arms, seed, &cfg, &data, &bars, &device)?;
        if warm.is_some() && cfg.warmup_steps > 0 {
            warmup_s.push(warm_started.elapsed().as_secs_f64());
        }
        for arm in &arms {
            let output = run::run_arm(arm, seed, warm.as_ref(), &cfg, &data, &bars, &device)?;
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
            json_runs.push(run::run_json(&output, &args.out)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }
    let report = report::Report {
        args: &args,
        cfg: &cfg,
        corpus: &corpus,
        data: &data,
        arms: &arms,
        oracle_bleu,
        warmup_s: &warmup_s,
        started,
    };
    report.write(&runs, json_runs)
}
