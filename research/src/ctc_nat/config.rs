//! The CTC NAT study's command line and its `--quick` values and checks.

use anyhow::{bail, Result};
use std::path::PathBuf;

use super::objective::CtcObjective;
use crate::cli::CatalogueStudyArgs;
use crate::nat::objective::Mixing;
use crate::nat::teacher::Recipe;

/// Which teacher distils the training targets.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TeacherChoice {
    /// Translate's recipe trained to its dev plateau (`Recipe::PLATEAU`), in `--teacher-dir`
    /// (reused there by every run with the same corpus and tokenizer).
    Plateau,
    /// The NAT study's teacher: a finished translate run's seed-1 `ce` model when it matches
    /// (`--translate-run`), else translate's 4000-step recipe in `--teacher-dir`.
    Translate,
}

/// The CTC NAT study's command line.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    about = "Does the BLEU loss on CTC outputs help a CTC non-autoregressive translator? (English→LANG gettext catalogues)"
)]
pub struct Config {
    /// The flags the CTC NAT shares with the translate and NAT studies (corpus, model sizes,
    /// schedules, seeds; `--label-smoothing` is unused).
    #[command(flatten)]
    pub common: CatalogueStudyArgs,
    /// The upsampling ratio `r`: a source of `S` subwords gives `r·S` decoder frames. 2 from
    /// the ratio pilot (docs/ctc_nat.md): better dev BLEU than 3 at equal steps and about 1.5×
    /// cheaper a step, for 1.2 % of the distilled pairs left out (0.13 % at 3).
    #[arg(long, default_value_t = 2)]
    pub ratio: usize,
    /// Output folder: results.json, table.md, log.csv, gzipped outputs, the distilled targets
    /// (default `docs/ctc_nat_run`; with `--quick`, `runs/ctc_nat_quick`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Checkpoints (default `runs/ctc_nat/<lang>`; with `--quick`, `runs/ctc_nat_quick/work`).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// The teacher.
    #[arg(long, value_enum, default_value_t = TeacherChoice::Plateau)]
    pub teacher: TeacherChoice,
    /// Where a trained teacher is kept across runs (default `runs/teacher/<lang>/plateau` or
    /// `.../translate`; with `--quick`, under the work folder).
    #[arg(long)]
    pub teacher_dir: Option<PathBuf>,
    /// With `--teacher translate`: a finished translate study whose seed-1 `ce` model is the
    /// teacher when its corpus and tokenizer match (default `runs/translate/<lang>`).
    #[arg(long)]
    pub translate_run: Option<PathBuf>,
    /// Leave out `ctc+bleu4` (the first objective the budget cuts).
    #[arg(long)]
    pub no_bleu4: bool,
    /// The distillation's beam-search length penalty `α` (a finished hypothesis scores
    /// `log p / |y|^α`): above 1 favours longer targets. The committed run's targets, at 1, are
    /// 0.91 of the references' length (docs/ctc_nat.md); the run reports the ratio it gets.
    #[arg(long, default_value_t = 1.0)]
    pub distill_length_penalty: f64,
    /// Add the `ctc+nmla2` arm: NMLA's bigram F-measure on the CTC outputs
    /// (`candle_bleu::loss::ctc_ngram_f_loss`), with `ctc+bon2`'s mixing.
    #[arg(long)]
    pub nmla: bool,
    /// The blank penalties `δ` (the blank's logit lowered by `δ` before the argmax) tried on dev
    /// for every run, the same grid for all: each run's test output is then reported at its
    /// dev-best `δ` (variant `blank-tuned`) beside `δ = 0` (`greedy`). Empty (the default): no
    /// length control, only `greedy`.
    #[arg(long, value_delimiter = ',')]
    pub blank_penalties: Vec<f64>,
    /// Checkpoint averaging: every CTC run (baselines and fine-tunes alike) keeps the weights of
    /// its last K dev evaluations; their average replaces the run's best checkpoint when its dev
    /// BLEU is higher (chosen on dev, recorded in the run's `averaging.json` and in
    /// `results.json`). 0 (the default, as committed): no averaging.
    #[arg(long, default_value_t = 0)]
    pub average_last: usize,
    /// CTC baseline: step cap (4000 to fit the 150-minute budget, docs/ctc_nat.md).
    #[arg(long, default_value_t = 4000)]
    pub base_steps: usize,
    /// CTC baseline: dev evaluation every this many steps.
    #[arg(long, default_value_t = 500)]
    pub base_eval_every: usize,
    /// CTC baseline: evaluations (from `--select-from` on) without a new best dev BLEU before
    /// stopping.
    #[arg(long, default_value_t = 3)]
    pub patience: usize,
    /// CTC baseline: only checkpoints from this step on are selected (a warm-up window, as in
    /// the seq2seq study): the NAT study selected a step-500 baseline that mostly copied its
    /// source (docs/nat.md).
    #[arg(long, default_value_t = 1500)]
    pub select_from: usize,
    /// λ of the mixed objectives `CTC + λ·L` in seed 1's grid (with `L` alone).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub lambdas: Vec<f64>,
    /// Sentences of the batch-1 speed measurement.
    #[arg(long, default_value_t = 200)]
    pub speed_sentences: usize,
    /// A pilot instead of the study: seed 1's CTC baseline for `--base-steps` (no early stop,
    /// no selection window) on these distilled targets (a `distilled.ids.gz` of the same corpus
    /// and tokenizer, e.g. the NAT study's `docs/nat_run/distilled.ids.gz`), then
    /// `--finetune-steps` of `ctc` and of `ctc+bon2` at the first `--lambdas`; dev BLEU and ms per
    /// step to `pilot.json` in `--out`. No teacher, no test set.
    #[arg(long)]
    pub pilot_distilled: Option<PathBuf>,
    /// A pilot instead of the study: the teacher (trained or reused as the study would), then,
    /// for each length penalty `α` of this list, its beam search over a fixed sample of
    /// [`DISTILL_PILOT_SOURCES`](super::study::DISTILL_PILOT_SOURCES) training sources (every
    /// k-th) and over the dev set: Σ|target| / Σ|reference| in subwords and the dev BLEU, to
    /// `distill_pilot.json` in `--out`. The study's `--distill-length-penalty` is then the
    /// smallest `α` whose training-sample ratio reaches 0.97. Like `--plan-only`, it removes
    /// nothing (no `--resume` needed).
    #[arg(long, value_delimiter = ',')]
    pub distill_pilot: Vec<f64>,
    /// Print the plan and its time estimate, then stop (the corpus, tokenizer and test
    /// references are still written to `--out`; nothing is removed or trained).
    #[arg(long)]
    pub plan_only: bool,
}

impl Config {
    pub(super) fn apply_quick(&mut self) {
        self.common.apply_quick();
        self.base_steps = 40;
        self.base_eval_every = 20;
        self.select_from = 20;
        self.common.finetune_eval_every = 5;
        self.speed_sentences = self.speed_sentences.min(20);
    }

    pub(super) fn check(&self) -> Result<()> {
        self.common.check()?;
        if self.ratio == 0 || self.ratio > 8 {
            bail!("--ratio must be in 1..=8, got {}", self.ratio);
        }
        if let Some(l) = self.lambdas.iter().find(|l| !(l.is_finite() && **l > 0.0)) {
            bail!("--lambdas must be finite and > 0, got {l}");
        }
        if !self.distill_length_penalty.is_finite() || self.distill_length_penalty < 0.0 {
            bail!(
                "--distill-length-penalty must be finite and >= 0, got {}",
                self.distill_length_penalty
            );
        }
        if let Some(a) = self
            .distill_pilot
            .iter()
            .find(|a| !(a.is_finite() && **a >= 0.0))
        {
            bail!("--distill-pilot must hold finite values >= 0, got {a}");
        }
        if let Some(d) = self.blank_penalties.iter().find(|d| !d.is_finite()) {
            bail!("--blank-penalties must be finite, got {d}");
        }
        if self.base_eval_every == 0 || self.base_steps == 0 {
            bail!("--base-steps and --base-eval-every must be >= 1");
        }
        Ok(())
    }

    /// The output folder.
    pub fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            PathBuf::from(if self.common.quick {
                "runs/ctc_nat_quick"
            } else {
                "docs/ctc_nat_run"
            })
        })
    }

    /// The checkpoint folder.
    pub fn work(&self) -> PathBuf {
        self.work.clone().unwrap_or_else(|| {
            if self.common.quick {
                self.out().join("work")
            } else {
                PathBuf::from("runs/ctc_nat").join(&self.common.lang)
            }
        })
    }

    /// The folder whose `teacher/` holds the trained teacher.
    pub fn teacher_dir(&self) -> PathBuf {
        self.teacher_dir.clone().unwrap_or_else(|| {
            let name = match self.teacher {
                TeacherChoice::Plateau => "plateau",
                TeacherChoice::Translate => "translate",
            };
            if self.common.quick {
                self.out().join("teacher").join(name)
            } else {
                PathBuf::from("runs/teacher")
                    .join(&self.common.lang)
                    .join(name)
            }
        })
    }

    /// The teacher's recipe.
    pub fn recipe(&self) -> Recipe {
        match (self.common.quick, self.teacher) {
            (true, _) => Recipe::QUICK,
            (false, TeacherChoice::Plateau) => Recipe::PLATEAU,
            (false, TeacherChoice::Translate) => Recipe::TRANSLATE,
        }
    }

    /// Seed 1's grid: `ctc+bon2` alone and at every λ.
    pub fn grid(&self) -> Vec<CtcObjective> {
        std::iter::once(Mixing::Pure)
            .chain(self.lambdas.iter().map(|&l| Mixing::WithCe(l)))
            .map(|mixing| CtcObjective::Bon2 { mixing })
            .collect()
    }
}
