//! The NAT study's command line and its `--quick` values and checks.

use anyhow::{bail, Result};
use std::path::PathBuf;

use super::objective::{Bon2Form, Mixing, NatObjective};
use super::teacher::Recipe;
use crate::cli::CatalogueStudyArgs;

/// The NAT study's command line.
#[derive(clap::Parser, Debug, Clone)]
#[command(
    about = "Does the BLEU loss help a non-autoregressive translator? (English→LANG gettext catalogues)"
)]
pub struct Config {
    /// The flags NAT shares with the translate study (corpus, model, schedules, seeds).
    #[command(flatten)]
    pub common: CatalogueStudyArgs,
    /// Seeds on the raw (human) references: a NAT baseline and `ce`/`bon2` each.
    #[arg(long, default_value_t = 1)]
    pub raw_seeds: u64,
    /// Output folder: results.json, table.md, log.csv, gzipped outputs, the distilled targets.
    #[arg(long, default_value = "docs/nat_run")]
    pub out: PathBuf,
    /// Checkpoints (default `runs/nat/<lang>`).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// A finished translate study whose seed-1 `ce` model is the teacher when its corpus and
    /// tokenizer match (default `runs/translate/<lang>`).
    #[arg(long)]
    pub translate_run: Option<PathBuf>,
    /// Leave out `bleu4` (the first objective the budget cuts).
    #[arg(long)]
    pub no_bleu4: bool,
    /// NAT baseline: step cap.
    #[arg(long, default_value_t = 5000)]
    pub base_steps: usize,
    /// NAT baseline: dev evaluation every this many steps.
    #[arg(long, default_value_t = 500)]
    pub base_eval_every: usize,
    /// NAT baseline: evaluations without a new best dev BLEU before stopping. The default (10
    /// evaluations of 500 steps) trains to the cap: with 3, seed 1 stopped at step 2000 with its
    /// best dev BLEU at step 500, where the barely trained model copies its source — which
    /// scores well on these messages — before cross-entropy training dips and then climbs.
    #[arg(long, default_value_t = 10)]
    pub patience: usize,
    /// λ of the mixed objectives `CE + λ·L` (Shao et al.'s 0.3/0.7 and 0.1/0.9).
    #[arg(long, value_delimiter = ',', default_value = "2.3,9")]
    pub lambdas: Vec<f64>,
    /// Length candidates decoded (the length beams reported are 1, 3 and this).
    #[arg(long, default_value_t = 5)]
    pub length_beam: usize,
    /// Sentences of the batch-1 speed measurement.
    #[arg(long, default_value_t = 200)]
    pub speed_sentences: usize,
}

impl Config {
    pub(super) fn apply_quick(&mut self) {
        self.common.apply_quick();
        self.base_steps = 40;
        self.base_eval_every = 20;
        self.common.finetune_eval_every = 5;
        self.speed_sentences = self.speed_sentences.min(20);
    }

    pub(super) fn check(&self) -> Result<()> {
        self.common.check()?;
        if self.length_beam < 3 {
            bail!(
                "--length-beam must be >= 3 (l = 1, 3 and it are reported), got {}",
                self.length_beam
            );
        }
        if let Some(l) = self.lambdas.iter().find(|l| !(l.is_finite() && **l > 0.0)) {
            bail!("--lambdas must be finite and > 0, got {l}");
        }
        Ok(())
    }

    pub(super) fn recipe(&self) -> Recipe {
        if self.common.quick {
            Recipe::QUICK
        } else {
            Recipe::TRANSLATE
        }
    }

    pub(super) fn beams(&self) -> Vec<usize> {
        vec![1, 3, self.length_beam]
    }

    pub(super) fn grid(&self) -> Vec<NatObjective> {
        let mixings: Vec<Mixing> = std::iter::once(Mixing::Pure)
            .chain(self.lambdas.iter().map(|&l| Mixing::WithCe(l)))
            .collect();
        [Bon2Form::NegLog, Bon2Form::Shao]
            .into_iter()
            .flat_map(|form| {
                mixings
                    .iter()
                    .map(move |&mixing| NatObjective::Bon2 { form, mixing })
            })
            .collect()
    }
}
