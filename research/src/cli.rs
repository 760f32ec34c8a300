//! Command-line pieces the examples share: the flags of the two studies on gettext catalogues
//! (`translate`, `nat`) with their `--quick` values, the training flags of the two synthetic
//! studies (`seq2seq`, `study`), the loss's form and length model as flags, and the checks
//! every example makes of its flags. Each example flattens these into its own `clap` parser
//! (`#[command(flatten)]`).

use anyhow::{bail, Result};
use candle_bleu::loss::{Form, LengthModel};
use clap::ValueEnum;
use std::path::PathBuf;

/// The attention heads of every study's Transformer: `--d-model` must be a multiple.
pub const HEADS: usize = 4;

/// Fails unless `d_model` is a positive multiple of the [`HEADS`] attention heads.
pub fn check_d_model(d_model: usize) -> Result<()> {
    if d_model == 0 || !d_model.is_multiple_of(HEADS) {
        bail!(
            "--d-model must be a positive multiple of the {HEADS} attention heads, got {d_model}"
        );
    }
    Ok(())
}

/// Fails unless every `(flag, value)` is at least 1, naming the flags.
pub fn check_at_least_one(flags: &[(&str, usize)]) -> Result<()> {
    let zero: Vec<&str> = flags
        .iter()
        .filter(|(_, value)| *value == 0)
        .map(|(flag, _)| *flag)
        .collect();
    if !zero.is_empty() {
        bail!("{} must be at least 1", zero.join(", "));
    }
    Ok(())
}

/// Fails unless `value` (the value of `flag`) is a probability in `[0, 1)`.
pub fn check_probability<T: Into<f64> + Copy + std::fmt::Display>(
    flag: &str,
    value: T,
) -> Result<()> {
    if !(0.0..1.0).contains(&value.into()) {
        bail!("{flag} must be in [0, 1), got {value}");
    }
    Ok(())
}

/// Where `--quick` smoke runs write when no `--out` is given: `runs/quick/<example>`, under the
/// git-ignored `runs/`, apart from the full runs' folders (whose results some studies commit
/// under `docs/`, and whose checkpoints other studies reuse).
pub const QUICK_ROOT: &str = "runs/quick";

/// The folder an example writes to: `out` when the user gave `--out`; otherwise, for a
/// `--quick` run, `QUICK_ROOT/<example>` (`example` may be a relative path such as
/// `translate/de`; never a tracked path); otherwise the full run's default `full`.
pub fn output_dir(out: Option<PathBuf>, quick: bool, example: &str, full: PathBuf) -> PathBuf {
    match out {
        Some(out) => out,
        None if quick => PathBuf::from(QUICK_ROOT).join(example),
        None => full,
    }
}

/// The flags shared by the studies on gettext catalogues (`translate`, `nat`): the corpus, the
/// model, the baseline's schedule, the fine-tuning budget, the seeds and the statistics.
#[derive(clap::Args, Debug, Clone)]
pub struct CatalogueStudyArgs {
    /// Target language: the directory name under --catalogs.
    #[arg(long, default_value = "de")]
    pub lang: String,
    /// Directory holding `<lang>/LC_MESSAGES/*.mo` (scripts/fetch-catalogs.sh fetches them).
    #[arg(long, default_value = "/usr/share/locale")]
    pub catalogs: PathBuf,
    /// Seeds (each trains its own baseline and every objective from it).
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Continue an interrupted study from its checkpoints.
    #[arg(long)]
    pub resume: bool,
    /// A tiny smoke run: a few hundred pairs, a tiny model, a few steps (under a minute).
    #[arg(long)]
    pub quick: bool,
    /// Train on the CPU even when built with `cuda` or `metal` and a GPU is available.
    #[arg(long)]
    pub cpu: bool,
    /// BPE vocabulary size (joint source/target; the same for both studies, so that NAT can
    /// reuse translate's model as its teacher).
    #[arg(long, default_value_t = 8000)]
    pub bpe_vocab: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    pub d_model: usize,
    /// Encoder and decoder layers (each).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Dropout on embeddings and residual branches.
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f32,
    /// Label smoothing of every cross-entropy.
    #[arg(long, default_value_t = 0.1)]
    pub label_smoothing: f64,
    /// Sentences per training batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Baseline: peak learning rate (inverse square root schedule).
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// Baseline: warm-up steps.
    #[arg(long, default_value_t = 400)]
    pub warmup: usize,
    /// Fine-tuning: steps of every objective.
    #[arg(long, default_value_t = 400)]
    pub finetune_steps: usize,
    /// Fine-tuning: dev evaluation every this many steps.
    #[arg(long, default_value_t = 100)]
    pub finetune_eval_every: usize,
    /// Fine-tuning: constant learning rate of every objective.
    #[arg(long, default_value_t = 2e-4)]
    pub finetune_lr: f64,
    /// Beam width of the autoregressive decodes (translate: the reported test decodes; NAT:
    /// its teacher's distillation and test decode).
    #[arg(long, default_value_t = 5)]
    pub beam: usize,
    /// Resamples of sacrebleu's paired bootstrap.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
}

impl CatalogueStudyArgs {
    /// The `--quick` values both studies share (each sets its own baseline and evaluation
    /// steps after this).
    pub fn apply_quick(&mut self) {
        self.seeds = self.seeds.min(2);
        self.bpe_vocab = 400;
        self.d_model = 32;
        self.layers = 1;
        self.batch_size = 32;
        self.lr = 3e-3;
        self.warmup = 10;
        self.finetune_steps = 10;
        self.beam = 2;
        self.bootstrap = 50;
    }

    /// The checks both studies make.
    pub fn check(&self) -> Result<()> {
        if self.seeds < 2 {
            bail!(
                "--seeds must be >= 2 (the seed-level test needs two), got {}",
                self.seeds
            );
        }
        check_d_model(self.d_model)
    }
}

/// The training flags of the synthetic studies (`seq2seq`, `study`).
#[derive(clap::Args, Debug, Clone)]
pub struct SyntheticTrainingArgs {
    /// Sentences per training batch.
    #[arg(long, default_value_t = 64)]
    pub batch_size: usize,
    /// Peak learning rate of AdamW.
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f64,
    /// Weight λ of the BLEU term in `CE + λ · BLEU loss`.
    #[arg(long, default_value_t = 1.0)]
    pub lambda: f64,
    /// Label smoothing of every cross-entropy term.
    #[arg(long, default_value_t = 0.1)]
    pub label_smoothing: f64,
    /// Dropout on the embeddings and residual branches while training (seeded per seed).
    #[arg(long, default_value_t = 0.1)]
    pub dropout: f32,
    /// Model width.
    #[arg(long, default_value_t = 64)]
    pub d_model: usize,
    /// Encoder and decoder layers (each).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Dev BLEU and a log row every this many steps.
    #[arg(long, default_value_t = 100)]
    pub eval_every: usize,
    /// Resamples of the paired bootstrap test.
    #[arg(long, default_value_t = 1000)]
    pub bootstrap: usize,
    /// Train on the CPU even when built with `cuda` or `metal` and a GPU is available.
    #[arg(long)]
    pub cpu: bool,
}

impl SyntheticTrainingArgs {
    /// The checks both synthetic studies make.
    pub fn check(&self) -> Result<()> {
        check_at_least_one(&[
            ("--batch-size", self.batch_size),
            ("--eval-every", self.eval_every),
            ("--bootstrap", self.bootstrap),
        ])?;
        if !(self.lambda.is_finite() && self.lambda >= 0.0) {
            bail!("--lambda must be finite and >= 0, got {}", self.lambda);
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            bail!("--lr must be finite and > 0, got {}", self.lr);
        }
        check_probability("--label-smoothing", self.label_smoothing)?;
        check_probability("--dropout", self.dropout)?;
        check_d_model(self.d_model)
    }
}

/// The loss's form of the differentiable clipped matches, as a flag.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FormArg {
    /// [`Form::Expected`].
    Expected,
    /// [`Form::Paired`].
    Paired,
    /// [`Form::LowerBound`].
    LowerBound,
}

impl FormArg {
    /// The loss's form.
    pub fn form(self) -> Form {
        match self {
            FormArg::Expected => Form::Expected,
            FormArg::Paired => Form::Paired,
            FormArg::LowerBound => Form::LowerBound,
        }
    }
}

/// The loss's length model, as a flag.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LengthArg {
    /// [`LengthModel::Given`].
    Given,
    /// [`LengthModel::NotEos`].
    NotEos,
    /// [`LengthModel::SoftEos`].
    SoftEos,
}

impl LengthArg {
    /// The loss's length model, reading EOS as `eos_id`.
    pub fn model(self, eos_id: u32) -> LengthModel {
        match self {
            LengthArg::Given => LengthModel::Given,
            LengthArg::NotEos => LengthModel::NotEos { eos_id },
            LengthArg::SoftEos => LengthModel::SoftEos { eos_id },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The full runs' default folders of the examples with `--quick` (the NAT study's commits
    /// its results).
    const FULL_DEFAULTS: [(&str, &str); 4] = [
        ("nat/de", "docs/nat_run"),
        ("translate/de", "runs/translate/de"),
        ("seq2seq", "runs/seq2seq"),
        ("study", "runs/study"),
    ];

    #[test]
    fn quick_runs_never_write_under_docs() {
        for (example, full) in FULL_DEFAULTS {
            let quick = output_dir(None, true, example, PathBuf::from(full));
            assert!(
                !quick.starts_with("docs"),
                "{example} --quick writes to {}",
                quick.display()
            );
            assert!(quick.starts_with("runs/quick"), "{}", quick.display());
            assert_ne!(quick, PathBuf::from(full), "{example}");
            assert_eq!(
                output_dir(None, false, example, PathBuf::from(full)),
                PathBuf::from(full)
            );
            let given = PathBuf::from("/tmp/somewhere");
            assert_eq!(
                output_dir(Some(given.clone()), true, example, PathBuf::from(full)),
                given
            );
        }
    }
}
