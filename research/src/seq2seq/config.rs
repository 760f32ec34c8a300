//! The seq2seq comparison's command line, its `--quick` values and its checks.

use anyhow::{bail, Result};
use std::path::PathBuf;

use crate::cli::{check_at_least_one, FormArg, LengthArg, SyntheticTrainingArgs};

/// Cross-entropy vs cross-entropy + BLEU loss on a small candle seq2seq model.
#[derive(clap::Parser, Debug)]
pub struct Config {
    /// Training steps of every run (both objectives).
    #[arg(long, default_value_t = 1200)]
    pub steps: usize,
    /// Number of seeds (1, 2, ...); every seed trains both objectives. One by default (the
    /// README's first command, about 5 minutes on 2 cores); `--seeds 3` is the committed
    /// comparison with seed-level statistics (docs/seq2seq.md).
    #[arg(long, default_value_t = 1)]
    pub seeds: u64,
    /// The training flags seq2seq shares with the study example.
    #[command(flatten)]
    pub training: SyntheticTrainingArgs,
    /// Share of the steps trained with cross-entropy alone before the BLEU term starts; the
    /// dev-selected checkpoint of every objective is chosen after it.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Form of the differentiable clipped matches.
    #[arg(long, value_enum, default_value_t = FormArg::Expected)]
    pub form: FormArg,
    /// Length model of the BLEU loss.
    #[arg(long, value_enum, default_value_t = LengthArg::Given)]
    pub length: LengthArg,
    /// Training file: `source<TAB>target` per line (requires --dev and --test).
    #[arg(long)]
    pub train: Option<PathBuf>,
    /// Dev file, as --train.
    #[arg(long)]
    pub dev: Option<PathBuf>,
    /// Test file, as --train.
    #[arg(long)]
    pub test: Option<PathBuf>,
    /// Character tokens for --train/--dev/--test (whitespace tokens otherwise).
    #[arg(long)]
    pub char: bool,
    /// A tiny run (1 seed, 150 steps, small synthetic sets) for smoke tests.
    #[arg(long)]
    pub quick: bool,
    /// Output folder (default runs/seq2seq; with --quick, runs/quick/seq2seq).
    #[arg(long = "out", value_name = "OUT")]
    pub out_flag: Option<PathBuf>,
    /// The output folder in use: `--out`, else the default for a full or `--quick` run.
    #[arg(skip)]
    pub out: PathBuf,
}

impl Config {
    /// The `--quick` values: one seed, 150 steps.
    pub fn apply_quick(&mut self) {
        self.steps = 150;
        self.seeds = 1;
        self.training.eval_every = 50;
        self.training.bootstrap = self.training.bootstrap.min(200);
    }

    /// Errors on flags out of range.
    pub fn check(&self) -> Result<()> {
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
