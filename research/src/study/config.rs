//! The study's command line, its `--quick` values and its checks.

use anyhow::Result;
use std::path::PathBuf;

use crate::cli::{check_at_least_one, LengthArg, SyntheticTrainingArgs};

/// The BLEU loss's forms, length models and decodes against cross-entropy, on a task where
/// cross-entropy is not at the ceiling.
#[derive(clap::Parser, Debug)]
pub struct Config {
    /// Seeds (1, 2, ...); every seed trains every objective.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Cross-entropy warm-up steps shared by the warm-started objectives of a seed.
    #[arg(long, default_value_t = 400)]
    pub warmup_steps: usize,
    /// Steps of each objective after the warm-up (from-scratch objectives train
    /// warm-up + these steps).
    #[arg(long, default_value_t = 400)]
    pub arm_steps: usize,
    /// The training flags the study shares with the seq2seq example.
    #[command(flatten)]
    pub training: SyntheticTrainingArgs,
    /// Objectives to train, comma-separated (default: every objective but the Gumbel one);
    /// `ce` is the bootstrap baseline.
    #[arg(long, value_delimiter = ',')]
    pub arms: Option<Vec<String>>,
    /// Length model of the BLEU-only objectives.
    #[arg(long, value_enum, default_value_t = LengthArg::SoftEos)]
    pub bleu_only_length: LengthArg,
    /// Free-running steps beyond the batch's longest reference and its EOS.
    #[arg(long, default_value_t = 2)]
    pub free_running_margin: usize,
    #[arg(long, default_value_t = 2000)]
    /// Training pairs of the synthetic task.
    pub train_pairs: usize,
    #[arg(long, default_value_t = 400)]
    /// Dev pairs.
    pub dev_pairs: usize,
    #[arg(long, default_value_t = 1000)]
    /// Test pairs.
    pub test_pairs: usize,
    /// Seed of the synthetic data (independent of the model seeds).
    #[arg(long, default_value_t = 2025)]
    pub data_seed: u64,
    /// A tiny study (1 seed, 40 + 40 steps, width 32, small sets) for smoke tests.
    #[arg(long)]
    pub quick: bool,
    /// Time a few training steps of every objective and one dev evaluation, print the
    /// projected time of the whole study with these settings, and exit.
    #[arg(long)]
    pub project: bool,
    /// Output folder (default runs/study; with --quick, runs/quick/study).
    #[arg(long = "out", value_name = "OUT")]
    pub out_flag: Option<PathBuf>,
    /// The output folder in use: `--out`, else the default for a full or `--quick` run.
    #[arg(skip)]
    pub out: PathBuf,
}

impl Config {
    /// The `--quick` values: one seed, a small model, short runs, small sets.
    pub fn apply_quick(&mut self) {
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

    /// Errors on flags out of range.
    pub fn check(&self) -> Result<()> {
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
