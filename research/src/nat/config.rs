//! The NAT study's command line and its `--quick` values and checks.

use anyhow::{bail, Result};
use std::path::PathBuf;

use super::objective::{Bon2Form, Mixing, NatObjective};
use super::teacher::Recipe;
use crate::cli::{output_dir, CatalogueStudyArgs};

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
    /// Output folder: results.json, table.md, log.csv, gzipped outputs, the distilled targets
    /// (default `docs/nat_run`, the committed study; with `--quick`, `runs/quick/nat/<lang>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Checkpoints (default `runs/nat/<lang>`; with `--quick`, `runs/quick/nat/<lang>/work`).
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// A finished translate study whose seed-1 `ce` model is the teacher when its corpus and
    /// tokenizer match (default `runs/translate/<lang>`; with `--quick`, translate `--quick`'s
    /// `runs/quick/translate/<lang>`).
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

/// The full study's output folder, whose files are committed.
pub const FULL_OUT: &str = "docs/nat_run";

impl Config {
    /// The output folder: `--out`, else [`FULL_OUT`] for the full study and
    /// `runs/quick/nat/<lang>` for `--quick` (never a tracked path).
    pub fn out_dir(&self) -> PathBuf {
        output_dir(
            self.out.clone(),
            self.common.quick,
            &format!("nat/{}", self.common.lang),
            PathBuf::from(FULL_OUT),
        )
    }

    /// The checkpoint folder: `--work`, else `runs/nat/<lang>`, or with `--quick` `work` in
    /// the quick output folder.
    pub fn work_dir(&self) -> PathBuf {
        match &self.work {
            Some(work) => work.clone(),
            None if self.common.quick => self.out_dir().join("work"),
            None => PathBuf::from("runs/nat").join(&self.common.lang),
        }
    }

    /// The translate run whose teacher may be reused: `--translate-run`, else where translate
    /// writes by default (its `--quick` folder for `--quick`).
    pub fn translate_run_dir(&self) -> PathBuf {
        self.translate_run.clone().unwrap_or_else(|| {
            output_dir(
                None,
                self.common.quick,
                &format!("translate/{}", self.common.lang),
                PathBuf::from("runs/translate").join(&self.common.lang),
            )
        })
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn quick_writes_under_runs_and_the_full_study_under_docs() {
        let full = Config::parse_from(["nat"]);
        assert_eq!(full.out_dir(), PathBuf::from("docs/nat_run"));
        assert_eq!(full.work_dir(), PathBuf::from("runs/nat/de"));
        assert_eq!(full.translate_run_dir(), PathBuf::from("runs/translate/de"));
        let quick = Config::parse_from(["nat", "--quick", "--lang", "fr"]);
        for dir in [quick.out_dir(), quick.work_dir(), quick.translate_run_dir()] {
            assert!(!dir.starts_with("docs"), "{}", dir.display());
            assert!(dir.starts_with("runs/quick"), "{}", dir.display());
        }
        assert_eq!(quick.out_dir(), PathBuf::from("runs/quick/nat/fr"));
        let given = Config::parse_from(["nat", "--quick", "--out", "/tmp/nat"]);
        assert_eq!(given.out_dir(), PathBuf::from("/tmp/nat"));
        assert_eq!(given.work_dir(), PathBuf::from("/tmp/nat/work"));
    }
}
