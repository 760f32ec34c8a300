//! What a finished seq2seq comparison reports: each run's line and `results.json` entry, and
//! at the end the paired bootstrap and seed-level tests of `ce+bleu` against `ce`, `log.csv`,
//! `results.json`, `curves.png` and the table.

use crate::data::EncodedCorpus;
use crate::eval::{self, mean_sd};
use crate::stats::seed_tests;
use crate::train::{log_csv, selected_run_json, SelectedRun};
use anyhow::Result;
use std::path::Path;

use super::plot;
use super::train::{Objective, RunOutput, TrainConfig};

/// A finished run's progress line.
pub fn run_line(run: &RunOutput) -> String {
    let step_ms = |ms: Option<f64>| ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1}"));
    format!(
        "{:>8} seed {}: dev BLEU {:6.2} (step {}; last {:.2})  test BLEU {:6.2}  ({:.0} s; ms/step CE-only {}, with BLEU {})",
        run.objective.name(),
        run.seed,
        run.dev_bleu,
        run.selected_step,
        run.last_dev_bleu,
        run.test_bleu,
        run.wall_s,
        step_ms(run.step_ms[0]),
        step_ms(run.step_ms[1])
    )
}

/// Writes `run`'s test hypotheses under `out` and returns its `results.json` entry.
pub fn run_json(run: &RunOutput, out: &Path) -> Result<serde_json::Value> {
    let record = selected_run_json(
        &SelectedRun {
            objective: run.objective.name(),
            slug: run.objective.slug(),
            seed: run.seed,
            dev_bleu: run.dev_bleu,
            selected_step: run.selected_step,
            last_dev_bleu: run.last_dev_bleu,
            test_bleu: run.test_bleu,
            test_hyps: &run.test_hyps,
            wall_s: run.wall_s,
        },
        out,
    )?;
    Ok(serde_json::Value::Object(record))
}

/// What the final report reads besides the runs.
pub struct Report<'a> {
    /// The output folder.
    pub out: &'a Path,
    /// The number of seeds.
    pub seeds: u64,
    /// Resamples of the paired bootstrap.
    pub bootstrap: usize,
    /// The runs' settings.
    pub cfg: &'a TrainConfig,
    /// The encoded corpus.
    pub data: &'a EncodedCorpus,
    /// The synthetic task's rule-based test translations (none for files given by the user).
    pub test_oracle: Option<&'a [Vec<String>]>,
}

impl Report<'_> {
    /// Compares the objectives over `runs` (every seed's `ce` and `ce+bleu`, whose
    /// `results.json` entries are `json_runs`), writes the files and prints the table.
    pub fn write(&self, runs: &[RunOutput], json_runs: Vec<serde_json::Value>) -> Result<()> {
        let cfg = self.cfg;
        // Files: results, log, curves.
        let csv = log_csv(
            runs.iter()
                .map(|r| (r.objective.name(), r.seed, r.log.as_slice())),
        );
        std::fs::write(self.out.join("log.csv"), csv)?;

        // Paired bootstrap (sacrebleu's, from `exact::bootstrap`): per seed, and pooled over seeds,
        // where the test outputs of all seeds form one corpus whose segment (seed k, sentence i)
        // is paired with the same (k, i) of the other objective.
        let stats_of = |objective: Objective| -> Result<Vec<Vec<candle_bleu::exact::BleuCounts>>> {
            runs.iter()
                .filter(|r| r.objective == objective)
                .map(|r| eval::segment_stats(&r.test_hyps, &self.data.test_refs))
                .collect()
        };
        let baseline = stats_of(Objective::CrossEntropy)?;
        let system = stats_of(Objective::CeThenBleu)?;
        let pooled =
            eval::paired_bootstrap(&baseline.concat(), &system.concat(), self.bootstrap, 12345)?;
        let per_seed: Vec<eval::PairedBootstrap> = baseline
            .iter()
            .zip(&system)
            .map(|(b, s)| eval::paired_bootstrap(b, s, self.bootstrap, 12345))
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
        let seed_level = if self.seeds >= 2 {
            seed_tests(
                &test_of(Objective::CrossEntropy),
                &[("ce+bleu".to_string(), test_of(Objective::CeThenBleu))],
            )?
        } else {
            Vec::new()
        };

        let oracle_bleu = self
            .test_oracle
            .map(|oracle| eval::bleu_100(oracle, &self.data.test_refs))
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
                "train_pairs": self.data.train.len(), "dev_pairs": self.data.dev.len(), "test_pairs": self.data.test.len(),
            },
        });
        std::fs::write(
            self.out.join("results.json"),
            serde_json::to_string_pretty(&results)?,
        )?;
        plot::curves(&self.out.join("curves.png"), runs, cfg.bleu_start)?;

        // The table.
        println!();
        println!(
            "| objective | test BLEU (mean ± sd, {} seeds) | dev BLEU (selected, mean) | vs ce: seed-level paired t (Holm) | detectable Δ (80% power) | pooled paired bootstrap | wall time / run |",
            self.seeds
        );
        println!("|---|---|---|---|---|---|---|");
        for objective in Objective::ALL {
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
        Ok(())
    }
}
