//! Train a small candle Transformer translation model with cross-entropy alone and with a
//! cross-entropy warm-up followed by `CE + λ · BLEU loss`, at an equal number of steps, and
//! compare their test BLEU over several seeds with a paired bootstrap test.
//!
//! ```text
//! cargo run --release --example seq2seq                  # synthetic task, 2 objectives, 1 seed
//! cargo run --release --example seq2seq -- --seeds 3     # the full comparison (docs/seq2seq.md)
//! cargo run --release --example seq2seq -- --quick       # smoke test, under a minute
//! cargo run --release --example seq2seq -- --train train.tsv --dev dev.tsv --test test.tsv
//! cargo run --release --features cuda --example seq2seq  # on CUDA device 0 (`-- --cpu`: CPU)
//! ```
//!
//! **Data.** By default a synthetic English-like → invented-SOV translation task generated
//! from a fixed seed (reordering, one-to-many mappings, synonyms; see `task.rs`); the
//! generated sets are written to `runs/seq2seq/data/*.tsv`. `--train/--dev/--test` read your
//! own tab-separated files (`source<TAB>target`, one pair a line), tokenized on whitespace,
//! or into characters with `--char` (a space becomes the token `▁`).
//!
//! **Why teacher-forced.** The BLEU loss needs a distribution over tokens at every output
//! position. Greedy or sampled decodes are discrete (no gradient); the teacher-forced
//! decoder gives one `softmax(logits)` row per reference position in one parallel pass, the
//! same pass cross-entropy uses, so the BLEU term costs one extra `bleu_loss_from_logits`
//! call per step. Its n-gram statistics reward probability mass on reference n-grams at any
//! position (not only the aligned one), and with `--length soft-eos` or `not-eos` the loss
//! also sees the EOS probabilities, i.e. the hypothesis length. The limitation: each
//! position is conditioned on the gold prefix, so the loss does not see the model's own
//! errors compound (exposure bias), which a soft or Gumbel free-running decode would.
//!
//! **Protocol.** Both objectives train with label-smoothed (0.1) cross-entropy and seeded
//! dropout (0.1); dev BLEU (greedy) is measured every `--eval-every` steps and the best
//! checkpoint after the warm-up (`--warmup` share of the steps, the same window for both) is
//! the one scored on test. Seed-level paired t-test of `ce+bleu` against `ce` (Holm-adjusted
//! over the comparisons; one here) with its detectable difference, and sacrebleu's paired
//! bootstrap per seed and pooled. Scores depend on the thread count (candle's CPU
//! reductions); `results.json` records it. See `docs/seq2seq.md`.
//!
//! **Outputs** (under `--out`, default `runs/seq2seq/`): `results.json`
//! (`{"runs": [{"objective", "seed", "dev_bleu", "selected_step", "test_bleu", "test_hyp",
//! "test_ref", "signature"}, ...], "seed_tests": ..., "bootstrap": ...}`), `test.ref` and
//! `test.<objective>.seed<k>.hyp` (whitespace-tokenized, one segment a line, paths relative to
//! `results.json`: `sacrebleu test.ref -i <hyp> -tok none -b` gives `test_bleu`), `log.csv`,
//! `curves.png`.

mod plot;
mod task;
mod train;

use anyhow::{bail, Context, Result};
use candle_bleu::loss::{BleuLossConfig, Form, LengthModel};
use candle_bleu_research::data::tokens::{
    read_tsv, write_lines, write_tsv, TokenCorpus, Tokens, Vocab,
};
use candle_bleu_research::data::{encode_pairs, EOS};
use candle_bleu_research::device::device;
use candle_bleu_research::eval::{self, mean_sd};
use candle_bleu_research::model::ModelConfig;
use candle_bleu_research::progress;
use candle_bleu_research::stats::seed_tests;
use candle_bleu_research::train::{log_csv, write_partial_results};
use clap::{Parser, ValueEnum};
use indicatif::MultiProgress;
use std::path::PathBuf;
use std::time::Instant;

use train::{Objective, RunData, RunOutput, TrainConfig};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormArg {
    Expected,
    Paired,
    LowerBound,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LengthArg {
    Given,
    NotEos,
    SoftEos,
}

/// Cross-entropy vs cross-entropy + BLEU loss on a small candle seq2seq model.
#[derive(Parser, Debug)]
struct Args {
    /// Training steps of every run (both objectives).
    #[arg(long, default_value_t = 1200)]
    steps: usize,
    /// Number of seeds (1, 2, ...); every seed trains both objectives. One by default (the
    /// README's first command, about 5 minutes on 2 cores); `--seeds 3` is the committed
    /// comparison with seed-level statistics (docs/seq2seq.md).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    /// Weight λ of the BLEU loss in `CE + λ · BLEU loss`.
    #[arg(long, default_value_t = 1.0)]
    lambda: f64,
    /// Share of the steps trained with cross-entropy alone before the BLEU term starts; the
    /// dev-selected checkpoint of every objective is chosen after it.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Label smoothing of the cross-entropy term (both objectives).
    #[arg(long, default_value_t = 0.1)]
    label_smoothing: f64,
    /// Dropout on the embeddings and residual branches while training (seeded per seed).
    #[arg(long, default_value_t = 0.1)]
    dropout: f32,
    /// Form of the differentiable clipped matches.
    #[arg(long, value_enum, default_value_t = FormArg::Expected)]
    form: FormArg,
    /// Length model of the BLEU loss.
    #[arg(long, value_enum, default_value_t = LengthArg::Given)]
    length: LengthArg,
    /// Dev BLEU and a log row every this many steps.
    #[arg(long, default_value_t = 100)]
    eval_every: usize,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    d_model: usize,
    /// Encoder and decoder layers (each).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Training file: `source<TAB>target` per line (requires --dev and --test).
    #[arg(long)]
    train: Option<PathBuf>,
    #[arg(long)]
    dev: Option<PathBuf>,
    #[arg(long)]
    test: Option<PathBuf>,
    /// Character tokens for --train/--dev/--test (whitespace tokens otherwise).
    #[arg(long)]
    char: bool,
    /// A tiny run (1 seed, 150 steps, small synthetic sets) for smoke tests.
    #[arg(long)]
    quick: bool,
    /// Resamples of the paired bootstrap test.
    #[arg(long, default_value_t = 1000)]
    bootstrap: usize,
    /// Output folder.
    #[arg(long, default_value = "runs/seq2seq")]
    out: PathBuf,
    /// Train on the CPU even when built with `cuda` or `metal` and a GPU is available.
    #[arg(long)]
    cpu: bool,
}

fn load_corpus(args: &Args) -> Result<TokenCorpus> {
    match (&args.train, &args.dev, &args.test) {
        (None, None, None) => {
            let (train, dev, test) = if args.quick {
                (2000, 100, 200)
            } else {
                (20000, 500, 1000)
            };
            Ok(task::synthetic_corpus(train, dev, test, 2024))
        }
        (Some(train), Some(dev), Some(test)) => {
            let mode = if args.char {
                Tokens::Char
            } else {
                Tokens::Whitespace
            };
            Ok(TokenCorpus {
                train: read_tsv(train, mode)?,
                dev: read_tsv(dev, mode)?,
                test: read_tsv(test, mode)?,
                test_oracle: None,
            })
        }
        _ => bail!("--train, --dev and --test must be given together"),
    }
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.quick {
        args.steps = 150;
        args.seeds = 1;
        args.eval_every = 50;
        args.bootstrap = args.bootstrap.min(200);
    }
    if args.steps == 0
        || args.seeds == 0
        || args.batch_size == 0
        || args.eval_every == 0
        || args.bootstrap == 0
    {
        bail!("--steps, --seeds, --batch-size, --eval-every and --bootstrap must be at least 1");
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
    if !(0.0..=1.0).contains(&args.warmup) {
        bail!(
            "--warmup must be a share of the steps in [0, 1], got {}",
            args.warmup
        );
    }
    let started = Instant::now();
    let device = device(args.cpu);
    let corpus = load_corpus(&args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    if args.train.is_none() {
        let dir = args.out.join("data");
        std::fs::create_dir_all(&dir)?;
        write_tsv(&dir.join("train.tsv"), &corpus.train)?;
        write_tsv(&dir.join("dev.tsv"), &corpus.dev)?;
        write_tsv(&dir.join("test.tsv"), &corpus.test)?;
    }

    let src_vocab = Vocab::build(corpus.train.iter().map(|p| &p.src));
    let tgt_vocab = Vocab::build(corpus.train.iter().map(|p| &p.tgt));
    let train = encode_pairs(&corpus.train, &src_vocab, &tgt_vocab);
    let dev = encode_pairs(&corpus.dev, &src_vocab, &tgt_vocab);
    let test = encode_pairs(&corpus.test, &src_vocab, &tgt_vocab);
    let dev_refs: Vec<Vec<String>> = corpus.dev.iter().map(|p| p.tgt.clone()).collect();
    let test_refs: Vec<Vec<String>> = corpus.test.iter().map(|p| p.tgt.clone()).collect();
    let longest = [&corpus.train, &corpus.dev, &corpus.test]
        .iter()
        .flat_map(|set| set.iter().map(|p| p.src.len().max(p.tgt.len() + 1)))
        .max()
        .unwrap_or(1);
    let max_target = corpus.train.iter().map(|p| p.tgt.len()).max().unwrap_or(1);

    let eos_id = EOS;
    let loss = BleuLossConfig {
        form: match args.form {
            FormArg::Expected => Form::Expected,
            FormArg::Paired => Form::Paired,
            FormArg::LowerBound => Form::LowerBound,
        },
        length: match args.length {
            LengthArg::Given => LengthModel::Given,
            LengthArg::NotEos => LengthModel::NotEos { eos_id },
            LengthArg::SoftEos => LengthModel::SoftEos { eos_id },
        },
        ..BleuLossConfig::default()
    };
    let cfg = TrainConfig {
        model: ModelConfig {
            src_vocab: src_vocab.len(),
            tgt_vocab: tgt_vocab.len(),
            d_model: args.d_model,
            heads: 4,
            d_ff: 2 * args.d_model,
            encoder_layers: args.layers,
            decoder_layers: args.layers,
            max_len: longest.max(2 * max_target + 2),
        },
        steps: args.steps,
        batch_size: args.batch_size,
        lr: args.lr,
        lr_warmup: (args.steps / 10).clamp(1, 200),
        bleu_start: (args.warmup * args.steps as f64).round() as usize,
        lambda: args.lambda,
        loss,
        label_smoothing: args.label_smoothing,
        dropout: args.dropout,
        eval_every: args.eval_every,
        max_decode_len: 2 * max_target + 2,
    };
    if args.d_model % 4 != 0 {
        bail!(
            "--d-model must be a multiple of the 4 attention heads, got {}",
            args.d_model
        );
    }
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target; \
         model d={} layers={}+{} dropout {}; {} steps x batch {}; CE label smoothing {}; BLEU term \
         from step {} with λ={} ({:?}, {:?}); dev-selected checkpoints after step {}; {} threads",
        train.len(),
        dev.len(),
        test.len(),
        src_vocab.len(),
        tgt_vocab.len(),
        cfg.model.d_model,
        cfg.model.encoder_layers,
        cfg.model.decoder_layers,
        cfg.dropout,
        cfg.steps,
        cfg.batch_size,
        cfg.label_smoothing,
        cfg.bleu_start,
        cfg.lambda,
        cfg.loss.form,
        cfg.loss.length,
        cfg.bleu_start,
        candle_core::utils::get_num_threads(),
    );

    let run_data = RunData {
        train: &train,
        dev: &dev,
        dev_refs: &dev_refs,
        test: &test,
        test_refs: &test_refs,
        tgt_vocab: &tgt_vocab,
    };
    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &test_refs)?;
    let run_json = |run: &RunOutput| -> Result<serde_json::Value> {
        let hyp_name = format!("test.{}.seed{}.hyp", run.objective.slug(), run.seed);
        write_lines(&args.out.join(&hyp_name), &run.test_hyps)?;
        Ok(serde_json::json!({
            "objective": run.objective.name(),
            "seed": run.seed,
            "dev_bleu": run.dev_bleu,
            "selected_step": run.selected_step,
            "last_dev_bleu": run.last_dev_bleu,
            "test_bleu": run.test_bleu,
            "test_hyp": hyp_name,
            "test_ref": "test.ref",
            "signature": eval::BLEU_SIGNATURE_TOK_NONE,
            "wall_s": run.wall_s,
        }))
    };
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let objectives = [Objective::CrossEntropy, Objective::CeThenBleu];
    let mut runs: Vec<RunOutput> = Vec::new();
    for seed in 1..=args.seeds {
        for objective in objectives {
            let prefix = format!("{} seed {seed}", objective.name());
            let bar = progress::bar(&bars, prefix, 16, cfg.steps)?;
            let output = train::run(objective, seed, &cfg, &run_data, &bar, &device)?;
            bar.finish();
            let step_ms =
                |ms: Option<f64>| ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1}"));
            let line = format!(
                "{:>8} seed {seed}: dev BLEU {:6.2} (step {}; last {:.2})  test BLEU {:6.2}  ({:.0} s; ms/step CE-only {}, with BLEU {})",
                objective.name(),
                output.dev_bleu,
                output.selected_step,
                output.last_dev_bleu,
                output.test_bleu,
                output.wall_s,
                step_ms(output.step_ms[0]),
                step_ms(output.step_ms[1])
            );
            progress::say(&bars, line)?;
            json_runs.push(run_json(&output)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }

    // Files: results, log, curves.
    let csv = log_csv(
        runs.iter()
            .map(|r| (r.objective.name(), r.seed, r.log.as_slice())),
    );
    std::fs::write(args.out.join("log.csv"), csv)?;

    // Paired bootstrap (sacrebleu's, from `exact::bootstrap`): per seed, and pooled over seeds,
    // where the test outputs of all seeds form one corpus whose segment (seed k, sentence i)
    // is paired with the same (k, i) of the other objective.
    let stats_of = |objective: Objective| -> Result<Vec<Vec<candle_bleu::exact::BleuCounts>>> {
        runs.iter()
            .filter(|r| r.objective == objective)
            .map(|r| eval::segment_stats(&r.test_hyps, &test_refs))
            .collect()
    };
    let baseline = stats_of(Objective::CrossEntropy)?;
    let system = stats_of(Objective::CeThenBleu)?;
    let pooled =
        eval::paired_bootstrap(&baseline.concat(), &system.concat(), args.bootstrap, 12345)?;
    let per_seed: Vec<eval::PairedBootstrap> = baseline
        .iter()
        .zip(&system)
        .map(|(b, s)| eval::paired_bootstrap(b, s, args.bootstrap, 12345))
        .collect::<Result<_>>()?;

    // A yardstick for the synthetic task: the rule-based translation of every test source
    // with each word's most probable choice. Not an upper bound: BLEU's brevity penalty and
    // n-gram clipping can reward other choices.
    // Seed-level paired t-test of ce+bleu against ce (Holm over the comparisons: one here).
    let test_of = |objective: Objective| -> Vec<f64> {
        runs.iter()
            .filter(|r| r.objective == objective)
            .map(|r| r.test_bleu)
            .collect()
    };
    let seed_level = if args.seeds >= 2 {
        seed_tests(
            &test_of(Objective::CrossEntropy),
            &[("ce+bleu".to_string(), test_of(Objective::CeThenBleu))],
        )?
    } else {
        Vec::new()
    };

    let oracle_bleu = corpus
        .test_oracle
        .as_ref()
        .map(|oracle| eval::bleu_100(oracle, &test_refs))
        .transpose()?;
    let results = serde_json::json!({
        "rule_based_test_bleu": oracle_bleu,
        "runs": json_runs,
        "seed_tests": {
            "baseline": "ce",
            "method": "paired t-test over seeds of test BLEU (system - ce), two-sided; p_holm: Holm's adjustment over the comparisons; detectable_difference: the true mean difference detected with 80% power at alpha 0.05 given the observed sd of the differences",
            "tests": seed_level,
        },
        "bootstrap": {
            "baseline": "ce",
            "system": "ce+bleu",
            "method": "sacrebleu's paired bootstrap (candle_bleu::exact::bootstrap::paired_bootstrap, NumPy PCG64 resamples, seed 12345); pooled: the test outputs of all seeds as one corpus, segment (seed, sentence) paired across objectives; delta = BLEU(ce+bleu) - BLEU(ce); p = (1 + #{b: d_b - mean(d) > |delta|}) / (1 + B), d_b = |BLEU(ce+bleu)_b - BLEU(ce)_b|; CI: the floor(B/40)-th smallest and largest resampled difference",
            "pooled": pooled,
            "per_seed": per_seed,
        },
        "config": {
            "steps": cfg.steps, "batch_size": cfg.batch_size, "lr": cfg.lr,
            "lambda": cfg.lambda, "bleu_start": cfg.bleu_start,
            "label_smoothing": cfg.label_smoothing, "dropout": cfg.dropout,
            "selection": "best dev BLEU (greedy) among the evaluations after bleu_start",
            "threads": candle_core::utils::get_num_threads(),
            "form": format!("{:?}", cfg.loss.form), "length": format!("{:?}", cfg.loss.length),
            "d_model": cfg.model.d_model, "layers": cfg.model.encoder_layers,
            "train_pairs": train.len(), "dev_pairs": dev.len(), "test_pairs": test.len(),
        },
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    plot::curves(&args.out.join("curves.png"), &runs, cfg.bleu_start)?;

    // The table.
    println!();
    println!(
        "| objective | test BLEU (mean ± sd, {} seeds) | dev BLEU (selected, mean) | vs ce: seed-level paired t (Holm) | detectable Δ (80% power) | pooled paired bootstrap | wall time / run |",
        args.seeds
    );
    println!("|---|---|---|---|---|---|---|");
    for objective in objectives {
        let of: Vec<&RunOutput> = runs.iter().filter(|r| r.objective == objective).collect();
        let test: Vec<f64> = of.iter().map(|r| r.test_bleu).collect();
        let dev: Vec<f64> = of.iter().map(|r| r.dev_bleu).collect();
        let wall: Vec<f64> = of.iter().map(|r| r.wall_s).collect();
        let (test_mean, test_sd) = mean_sd(&test);
        let (seed_level_cell, detectable, significance) = match objective {
            Objective::CrossEntropy => (
                "baseline".to_string(),
                "—".to_string(),
                "baseline".to_string(),
            ),
            Objective::CeThenBleu => (
                seed_level.first().map_or("— (1 seed)".to_string(), |t| {
                    format!(
                        "Δ {:+.2}, p = {:.3} (Holm {:.3})",
                        t.test.mean_difference, t.test.p_value, t.p_holm
                    )
                }),
                seed_level.first().map_or("—".to_string(), |t| {
                    format!("{:.2}", t.test.detectable_difference)
                }),
                format!(
                    "Δ {:+.2} BLEU, 95% CI [{:+.2}, {:+.2}], p = {:.3}",
                    pooled.delta, pooled.ci_low, pooled.ci_high, pooled.p_value
                ),
            ),
        };
        println!(
            "| {} | {:.2} ± {:.2} | {:.2} | {} | {} | {} | {:.0} s |",
            objective.name(),
            test_mean,
            test_sd,
            mean_sd(&dev).0,
            seed_level_cell,
            detectable,
            significance,
            mean_sd(&wall).0,
        );
    }
    println!();
    let ce_runs: Vec<&RunOutput> = runs
        .iter()
        .filter(|r| r.objective == Objective::CrossEntropy)
        .collect();
    let bleu_runs: Vec<&RunOutput> = runs
        .iter()
        .filter(|r| r.objective == Objective::CeThenBleu)
        .collect();
    for ((p, ce), bleu) in per_seed.iter().zip(&ce_runs).zip(&bleu_runs) {
        println!(
            "seed {}: test BLEU ce {:.2} (step {}) -> ce+bleu {:.2} (step {}): Δ {:+.2} (paired bootstrap p = {:.3})",
            ce.seed, ce.test_bleu, ce.selected_step, bleu.test_bleu, bleu.selected_step, p.delta, p.p_value
        );
    }
    if let Some(oracle) = oracle_bleu {
        println!(
            "yardstick (no model: each test source translated by the task's rules with every \
             word's most probable choice): test BLEU {oracle:.2}"
        );
    }
    println!(
        "\nwrote {} (results.json, log.csv, curves.png, test.*); total {:.0} s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
