//! What a finished study reports: the paired bootstrap and seed-level tests of every objective
//! against `ce`, the averaging measures next to their no-model controls, `log.csv`,
//! `results.json`, the figures and `table.md`.

use crate::data::tokens::TokenCorpus;
use crate::data::EncodedCorpus;
use crate::eval::{self, mean_sd};
use crate::stats::seed_tests;
use crate::train::log_csv;
use anyhow::Result;
use std::fmt::Write as _;
use std::time::Instant;

use super::arms::{Arm, TrainConfig};
use super::config::Config;
use super::plots;
use super::run::RunOutput;

/// What the final report reads besides the runs.
pub struct Report<'a> {
    /// The command line.
    pub args: &'a Config,
    /// The runs' settings.
    pub cfg: &'a TrainConfig,
    /// The synthetic corpus, as tokens.
    pub corpus: &'a TokenCorpus,
    /// The corpus, encoded.
    pub data: &'a EncodedCorpus,
    /// The objectives of the study.
    pub arms: &'a [Arm],
    /// The rule-based yardstick's test BLEU.
    pub oracle_bleu: Option<f64>,
    /// Each seed's shared warm-up, seconds.
    pub warmup_s: &'a [f64],
    /// When the study started.
    pub started: Instant,
}

impl Report<'_> {
    /// Compares the objectives over `runs` (whose `results.json` entries are `json_runs`),
    /// writes the files and prints the table.
    pub fn write(&self, runs: &[RunOutput], json_runs: Vec<serde_json::Value>) -> Result<()> {
        let Report {
            args,
            cfg,
            corpus,
            data,
            arms,
            oracle_bleu,
            warmup_s,
            started,
        } = self;
        // Files: log, results.
        let csv = log_csv(runs.iter().map(|r| (r.arm.name, r.seed, r.log.as_slice())));
        std::fs::write(args.out.join("log.csv"), csv)?;

        // Paired bootstrap against `ce`: pooled (the seeds' test sets concatenated, segment i of
        // seed k paired with segment i of seed k) and per seed.
        let names: Vec<&str> = arms.iter().map(|a| a.name).collect();
        let seeds: Vec<u64> = (1..=args.seeds).collect();
        let stats_of =
            |name: &str, seed: u64| -> Result<Option<Vec<candle_bleu::exact::BleuCounts>>> {
                runs.iter()
                    .find(|r| r.arm.name == name && r.seed == seed)
                    .map(|r| eval::segment_stats(&r.test_hyps, &data.test_refs))
                    .transpose()
            };
        let others: Vec<&str> = names.iter().copied().filter(|n| *n != "ce").collect();
        let mut pooled = serde_json::Map::new();
        let mut per_seed = serde_json::Map::new();
        let mut pooled_by_name = std::collections::HashMap::new();
        if names.contains(&"ce") && !others.is_empty() {
            let mut base_all = Vec::new();
            let mut systems_all: Vec<Vec<_>> = vec![Vec::new(); others.len()];
            for &seed in &seeds {
                let base = stats_of("ce", seed)?.expect("ce ran for every seed");
                let systems: Vec<Vec<_>> = others
                    .iter()
                    .map(|n| Ok(stats_of(n, seed)?.expect("every objective ran for every seed")))
                    .collect::<Result<_>>()?;
                let results = eval::compare(&base, &systems, args.training.bootstrap)?;
                for (name, result) in others.iter().zip(&results) {
                    per_seed
                        .entry(name.to_string())
                        .or_insert_with(|| serde_json::json!([]))
                        .as_array_mut()
                        .expect("an array")
                        .push(serde_json::json!({"seed": seed, "test": result}));
                }
                base_all.extend(base);
                for (all, system) in systems_all.iter_mut().zip(systems) {
                    all.extend(system);
                }
            }
            let results = eval::compare(&base_all, &systems_all, args.training.bootstrap)?;
            for (name, result) in others.iter().zip(results) {
                pooled.insert(name.to_string(), serde_json::to_value(&result)?);
                pooled_by_name.insert(name.to_string(), result);
            }
        }

        // Seed-level paired t-tests against `ce`, Holm-adjusted over the objectives compared.
        let test_bleu_of = |name: &str| -> Vec<f64> {
            seeds
                .iter()
                .filter_map(|&seed| {
                    runs.iter()
                        .find(|r| r.arm.name == name && r.seed == seed)
                        .map(|r| r.test_bleu)
                })
                .collect()
        };
        let seed_level = if names.contains(&"ce") && !others.is_empty() && seeds.len() >= 2 {
            let systems: Vec<(String, Vec<f64>)> = others
                .iter()
                .map(|n| (n.to_string(), test_bleu_of(n)))
                .collect();
            seed_tests(&test_bleu_of("ce"), &systems)?
        } else {
            Vec::new()
        };
        let train_targets: Vec<Vec<String>> = corpus.train.iter().map(|p| p.tgt.clone()).collect();
        let controls = eval::measure_controls(&train_targets, &data.test_refs)?;

        let reference_repeats = eval::repeated_token_rate(&data.test_refs);
        let results = serde_json::json!({
            "task": "study synthetic task (research/src/task/agreement.rs, docs/study.md)",
            "rule_based_test_bleu": oracle_bleu,
            "reference_measures": {
                "repeated_token_rate": reference_repeats,
                "length_ratio": 1.0,
            },
            "measure_controls": controls,
            "runs": json_runs,
            "seed_tests": {
                "baseline": "ce",
                "method": "paired t-test over seeds of test BLEU (objective - ce), two-sided; p_holm: Holm's adjustment over all objectives compared with ce; detectable_difference: the true mean difference detected with 80% power at alpha 0.05 given the observed sd of the differences",
                "tests": seed_level,
            },
            "bootstrap": {
                "baseline": "ce",
                "method": "sacrebleu --paired-bs (candle_bleu::exact::bootstrap::paired_bootstrap_many, seed 12345); delta = BLEU(objective) - BLEU(ce); pooled: the seeds' test sets concatenated, segments paired within each seed",
                "resamples": args.training.bootstrap,
                "pooled": pooled,
                "per_seed": per_seed,
            },
            "config": {
                "seeds": args.seeds, "warmup_steps": cfg.warmup_steps, "arm_steps": cfg.arm_steps,
                "batch_size": cfg.batch_size, "lr": cfg.lr, "lambda": cfg.lambda,
                "label_smoothing": cfg.label_smoothing, "dropout": cfg.dropout,
                "selection": "best dev BLEU (greedy) among each objective's own evaluations",
                "threads": candle_core::utils::get_num_threads(),
                "free_running_margin": cfg.free_running_margin,
                "bleu_only_length": format!("{:?}", args.bleu_only_length),
                "d_model": cfg.model.d_model, "layers": cfg.model.encoder_layers,
                "train_pairs": data.train.len(), "dev_pairs": data.dev.len(), "test_pairs": data.test.len(),
                "data_seed": args.data_seed, "eval_every": cfg.eval_every,
            },
            "warmup_wall_s": warmup_s,
            "total_wall_s": started.elapsed().as_secs_f64(),
        });
        std::fs::write(
            args.out.join("results.json"),
            serde_json::to_string_pretty(&results)?,
        )?;
        plots::curves(&args.out.join("curves.png"), runs, &names, cfg.warmup_steps)?;
        plots::averaging(
            &args.out.join("averaging.png"),
            runs,
            &names,
            reference_repeats,
        )?;

        // The table.
        let mut table = String::new();
        writeln!(
            table,
            "| objective | test BLEU (mean ± sd, {} seeds) | dev BLEU (selected) | vs ce: seed-level paired t (Holm) | detectable Δ | vs ce: pooled paired bootstrap | entropy | argmax = other ref token | argmax top-token share | ref bag coverage | repeated tokens | length ratio | ms / step |",
            args.seeds
        )?;
        writeln!(
            table,
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
        )?;
        for name in &names {
            let of: Vec<&RunOutput> = runs.iter().filter(|r| r.arm.name == *name).collect();
            let stat = |f: &dyn Fn(&RunOutput) -> f64| {
                mean_sd(&of.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            let (test_mean, test_sd) = stat(&|r| r.test_bleu);
            let versus = match pooled_by_name.get(*name) {
                Some(c) => format!("Δ {:+.2}, p = {:.3}", c.delta, c.p_value),
                None if *name == "ce" => "baseline".to_string(),
                None => "—".to_string(),
            };
            let seed_test = seed_level.iter().find(|t| t.objective == *name);
            let (t_cell, detectable) = match seed_test {
                Some(t) => (
                    format!(
                        "Δ {:+.2}, p = {:.3} (Holm {:.3})",
                        t.test.mean_difference, t.test.p_value, t.p_holm
                    ),
                    format!("{:.2}", t.test.detectable_difference),
                ),
                None if *name == "ce" => ("baseline".to_string(), "—".to_string()),
                None => ("—".to_string(), "—".to_string()),
            };
            writeln!(
                table,
                "| {name} | {test_mean:.2} ± {test_sd:.2} | {:.2} | {t_cell} | {detectable} | {versus} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} |",
                stat(&|r| r.dev_bleu).0,
                stat(&|r| r.measures.entropy).0,
                stat(&|r| r.measures.argmax_other_ref_rate).0,
                stat(&|r| r.measures.argmax_top_token_share).0,
                stat(&|r| r.measures.argmax_ref_bag_coverage).0,
                stat(&|r| r.measures.repeated_token_rate).0,
                stat(&|r| r.measures.length_ratio).0,
                1e3 * stat(&|r| r.step.wall_s).0,
            )?;
        }
        for (label, control) in [
            (
                format!("no model: always `{}`", controls.most_frequent_token),
                &controls.constant,
            ),
            (
                "no model: unigram draws (expected)".to_string(),
                &controls.unigram,
            ),
            ("no model: the references".to_string(), &controls.references),
        ] {
            writeln!(
                table,
                "| {label} | | | | | | | {:.3} | {:.3} | {:.3} | | | |",
                control.argmax_other_ref_rate,
                control.argmax_top_token_share,
                control.argmax_ref_bag_coverage,
            )?;
        }
        writeln!(
            table,
            "\nReferences: repeated-token rate {reference_repeats:.3}. Rule-based yardstick (each test \
             source translated by the task's rules with every word's most probable choice): test BLEU {:.2}.",
            oracle_bleu.unwrap_or(f64::NAN)
        )?;
        writeln!(
            table,
            "\nPer seed: test BLEU (selected step).\n\n| objective | {} |\n|---|{}",
            seeds
                .iter()
                .map(|s| format!("seed {s}"))
                .collect::<Vec<_>>()
                .join(" | "),
            "---|".repeat(seeds.len())
        )?;
        for name in &names {
            let cells: Vec<String> = seeds
                .iter()
                .map(|&seed| {
                    runs.iter()
                        .find(|r| r.arm.name == *name && r.seed == seed)
                        .map_or("—".to_string(), |r| {
                            format!("{:.2} ({})", r.test_bleu, r.selected_step)
                        })
                })
                .collect();
            writeln!(table, "| {name} | {} |", cells.join(" | "))?;
        }
        std::fs::write(args.out.join("table.md"), &table)?;
        println!("\n{table}");
        println!(
            "wrote {} (results.json, table.md, log.csv, curves.png, averaging.png, test.*); total {:.0} s",
            args.out.display(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
