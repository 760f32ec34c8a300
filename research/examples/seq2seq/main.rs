//! Train a small candle Transformer translation model with cross-entropy alone and with a
//! cross-entropy warm-up followed by `CE + λ · BLEU loss`, at an equal number of steps, and
//! compare their test BLEU over several seeds with a paired bootstrap test.
//!
//! ```text
//! cargo run --release --example seq2seq                  # synthetic task, 2 objectives, 1 seed
//! cargo run --release --example seq2seq -- --seeds 3     # the full comparison (docs/seq2seq.md)
//! cargo run --release --example seq2seq -- --quick       # smoke test, under a minute (runs/quick/seq2seq)
//! cargo run --release --example seq2seq -- --train train.tsv --dev dev.tsv --test test.tsv
//! cargo run --release --features cuda --example seq2seq  # on CUDA device 0 (`-- --cpu`: CPU)
//! ```
//!
//! **Data.** By default a synthetic English-like → invented-SOV translation task generated
//! from a fixed seed (reordering, one-to-many mappings, synonyms; the research library's
//! `task::reordering`); the generated sets are written to `data/*.tsv` in the output folder.
//! `--train/--dev/--test` read your own tab-separated files (`source<TAB>target`, one pair a
//! line), tokenized on whitespace, or into characters with `--char` (a space becomes the token
//! `▁`).
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
//! **Outputs** (under `--out`, default `runs/seq2seq/`, `runs/quick/seq2seq/` with `--quick`):
//! `results.json` (`{"runs": [{"objective", "seed", "dev_bleu", "selected_step", "test_bleu",
//! "test_hyp", "test_ref", "signature"}, ...], "seed_tests": ..., "bootstrap": ...}`), `test.ref` and
//! `test.<objective>.seed<k>.hyp` (whitespace-tokenized, one segment a line, paths relative to
//! `results.json`: `sacrebleu test.ref -i <hyp> -tok none -b` gives `test_bleu`), `log.csv`,
//! `curves.png`.

mod plot;
mod report;
mod train;

use anyhow::{bail, Context, Result};
use candle_bleu::loss::BleuLossConfig;
use candle_bleu_research::cli::{
    check_at_least_one, output_dir, FormArg, LengthArg, SyntheticTrainingArgs,
};
use candle_bleu_research::data::tokens::{read_tsv, write_lines, write_tsv, TokenCorpus, Tokens};
use candle_bleu_research::data::{EncodedCorpus, EOS};
use candle_bleu_research::device::device;
use candle_bleu_research::model::transformer::{PositionAdd, TransformerConfig};
use candle_bleu_research::progress;
use candle_bleu_research::task::reordering;
use candle_bleu_research::train::write_partial_results;
use clap::Parser;
use indicatif::MultiProgress;
use std::path::PathBuf;
use std::time::Instant;

use train::{Objective, RunOutput, TrainConfig};

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
    /// The training flags seq2seq shares with the study example.
    #[command(flatten)]
    training: SyntheticTrainingArgs,
    /// Share of the steps trained with cross-entropy alone before the BLEU term starts; the
    /// dev-selected checkpoint of every objective is chosen after it.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Form of the differentiable clipped matches.
    #[arg(long, value_enum, default_value_t = FormArg::Expected)]
    form: FormArg,
    /// Length model of the BLEU loss.
    #[arg(long, value_enum, default_value_t = LengthArg::Given)]
    length: LengthArg,
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
    /// Output folder (default runs/seq2seq; with --quick, runs/quick/seq2seq).
    #[arg(long = "out", value_name = "OUT")]
    out_flag: Option<PathBuf>,
    /// The output folder in use: `--out`, else the default for a full or `--quick` run.
    #[arg(skip)]
    out: PathBuf,
}

impl Args {
    fn apply_quick(&mut self) {
        self.steps = 150;
        self.seeds = 1;
        self.training.eval_every = 50;
        self.training.bootstrap = self.training.bootstrap.min(200);
    }

    fn check(&self) -> Result<()> {
        check_at_least_one(&[("--steps", self.steps), ("--seeds", self.seeds as usize)])?;
        self.training.check()?;
        if !(0.0..=1.0).contains(&self.warmup) {
            bail!(
                "--warmup must be a share of the steps in [0, 1], got {}",
                self.warmup
            );
        }
        Ok(())
    }
}

fn load_corpus(args: &Args) -> Result<TokenCorpus> {
    match (&args.train, &args.dev, &args.test) {
        (None, None, None) => {
            let (train, dev, test) = if args.quick {
                (2000, 100, 200)
            } else {
                (20000, 500, 1000)
            };
            Ok(reordering::corpus(train, dev, test, 2024))
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
        args.apply_quick();
    }
    args.out = output_dir(
        args.out_flag.take(),
        args.quick,
        "seq2seq",
        PathBuf::from("runs/seq2seq"),
    );
    args.check()?;
    let training = &args.training;
    let started = Instant::now();
    let device = device(training.cpu);
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
    let data = EncodedCorpus::new(&corpus);
    let longest = [&corpus.train, &corpus.dev, &corpus.test]
        .iter()
        .flat_map(|set| set.iter().map(|p| p.src.len().max(p.tgt.len() + 1)))
        .max()
        .unwrap_or(1);
    let max_target = corpus.train.iter().map(|p| p.tgt.len()).max().unwrap_or(1);

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
            max_len: longest.max(2 * max_target + 2) + 1,
            dropout: training.dropout,
            tie_all: false,
            positions: PositionAdd::Lookup,
        },
        steps: args.steps,
        batch_size: training.batch_size,
        lr: training.lr,
        lr_warmup: (args.steps / 10).clamp(1, 200),
        bleu_start: (args.warmup * args.steps as f64).round() as usize,
        lambda: training.lambda,
        loss: BleuLossConfig {
            form: args.form.form(),
            length: args.length.model(EOS),
            ..BleuLossConfig::default()
        },
        label_smoothing: training.label_smoothing,
        dropout: training.dropout,
        eval_every: training.eval_every,
        max_decode_len: 2 * max_target + 2,
    };
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target; \
         model d={} layers={}+{} dropout {}; {} steps x batch {}; CE label smoothing {}; BLEU term \
         from step {} with λ={} ({:?}, {:?}); dev-selected checkpoints after step {}; {} threads",
        data.train.len(),
        data.dev.len(),
        data.test.len(),
        data.src_vocab.len(),
        data.tgt_vocab.len(),
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

    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &data.test_refs)?;
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let mut runs: Vec<RunOutput> = Vec::new();
    for seed in 1..=args.seeds {
        for objective in Objective::ALL {
            let prefix = format!("{} seed {seed}", objective.name());
            let bar = progress::bar(&bars, prefix, 16, cfg.steps)?;
            let output = train::run(objective, seed, &cfg, &data, &bar, &device)?;
            bar.finish();
            progress::say(&bars, report::run_line(&output))?;
            json_runs.push(report::run_json(&output, &args.out)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }
    let report = report::Report {
        out: &args.out,
        seeds: args.seeds,
        bootstrap: training.bootstrap,
        cfg: &cfg,
        data: &data,
        test_oracle: corpus.test_oracle.as_deref(),
    };
    report.write(&runs, json_runs)?;
    println!(
        "\nwrote {} (results.json, log.csv, curves.png, test.*); total {:.0} s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
