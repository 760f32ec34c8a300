//! The NAT study's records, statistics (seed-level paired t-tests against `ce` with Holm's
//! correction and the detectable difference, sacrebleu's paired bootstrap per seed), its
//! table and results.json.

use anyhow::Result;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::stats::{mean_sd, seed_tests};
use crate::translate::evaluate::{bootstrap, SegmentStats};

/// One row of results.json's `runs`: one model's test output in one variant.
#[derive(Debug, Clone, Serialize)]
pub struct NatRecord {
    /// `teacher` (the autoregressive model), `baseline`, `ce`, `bon2`, `bleu4`.
    pub objective: String,
    /// `distilled`, `raw` (trained on the human references) or `ar` (the teacher).
    pub condition: String,
    /// `l5+dedup`, `l1`, `oracle+dedup`, ... (`beam5` for the teacher).
    pub variant: String,
    /// Length beam `1`, `3`, `5`, or `oracle` (`null` for the teacher).
    pub length_beam: Option<String>,
    /// Consecutive duplicate tokens removed.
    pub dedup: bool,
    /// The seed.
    pub seed: u64,
    /// The objective's configuration (`bon2-shao-pure`, ...).
    pub config: String,
    /// Best dev BLEU of the run (the selection criterion).
    pub dev_bleu: f64,
    /// Step of the selected checkpoint.
    pub best_step: usize,
    /// Steps trained.
    pub steps: usize,
    /// Test BLEU (13a), chrF, chrF++, BLEU without the brevity penalty, length ratio.
    pub test_bleu: f64,
    /// chrF.
    pub test_chrf: f64,
    /// chrF++.
    pub test_chrf_pp: f64,
    /// BLEU without its brevity penalty.
    pub test_bleu_without_bp: f64,
    /// Hypothesis / reference length (13a tokens).
    pub test_length_ratio: f64,
    /// Share of output subword tokens equal to the one before (0 after duplicate removal).
    pub repetition_share: f64,
    /// Share of test sentences whose length the predictor's top length hits exactly.
    pub length_accuracy: Option<f64>,
    /// The hypotheses (gzipped, relative to results.json).
    pub test_hyp: String,
    /// The references.
    pub test_ref: String,
    /// sacrebleu's BLEU signature.
    pub bleu_signature: String,
    /// sacrebleu's chrF signature.
    pub chrf_signature: String,
    /// Milliseconds per training step.
    pub ms_per_step: f64,
    /// Seconds of training and of dev evaluation.
    pub train_seconds: f64,
    /// Seconds of dev evaluation.
    pub eval_seconds: f64,
}

/// What a study's tests compare: each of `objectives` against `control`, seed by seed over
/// `seeds` (a system's run of seed `s` against the control's run of the same seed).
#[derive(Debug, Clone, Copy)]
pub struct Comparison<'a> {
    /// The objective every other is compared with (`ce`, the CTC NAT's `ctc`).
    pub control: &'a str,
    /// The objectives compared with it.
    pub objectives: &'a [&'a str],
    /// The seeds whose runs are paired.
    pub seeds: &'a [u64],
}

/// The seed-level tests of every objective against `ce` in one condition and variant, for
/// `test_bleu` and `test_chrf`: `{metric: [{objective, test, p_holm}]}`.
pub fn seed_level_tests(
    records: &[NatRecord],
    condition: &str,
    variant: &str,
    objectives: &[&str],
    seeds: &[u64],
) -> Result<Value> {
    let comparison = Comparison {
        control: "ce",
        objectives,
        seeds,
    };
    seed_level_tests_vs(records, condition, variant, &comparison)
}

/// [`seed_level_tests`] against the objective `comparison.control` (the CTC NAT's `ctc`).
pub fn seed_level_tests_vs(
    records: &[NatRecord],
    condition: &str,
    variant: &str,
    comparison: &Comparison,
) -> Result<Value> {
    let Comparison {
        control,
        objectives,
        seeds,
    } = *comparison;
    let value = |objective: &str, seed: u64, metric: &str| -> f64 {
        records
            .iter()
            .find(|r| {
                r.objective == objective
                    && r.seed == seed
                    && r.condition == condition
                    && r.variant == variant
            })
            .map_or(f64::NAN, |r| match metric {
                "test_bleu" => r.test_bleu,
                _ => r.test_chrf,
            })
    };
    let mut out = serde_json::Map::new();
    for metric in ["test_bleu", "test_chrf"] {
        let baseline: Vec<f64> = seeds.iter().map(|&s| value(control, s, metric)).collect();
        let systems: Vec<(String, Vec<f64>)> = objectives
            .iter()
            .map(|o| {
                (
                    o.to_string(),
                    seeds.iter().map(|&s| value(o, s, metric)).collect(),
                )
            })
            .collect();
        out.insert(
            metric.into(),
            serde_json::to_value(seed_tests(&baseline, &systems)?)?,
        );
    }
    Ok(Value::Object(out))
}

/// sacrebleu's paired bootstrap of each `(objective, seed)`'s segments against `ce`'s of the
/// same seed.
pub fn bootstraps(
    segments: &BTreeMap<(String, u64), SegmentStats>,
    objectives: &[&str],
    seeds: &[u64],
    resamples: usize,
) -> Result<Vec<Value>> {
    let comparison = Comparison {
        control: "ce",
        objectives,
        seeds,
    };
    bootstraps_vs(segments, &comparison, resamples)
}

/// [`bootstraps`] against the objective `comparison.control` (the CTC NAT's `ctc`).
pub fn bootstraps_vs(
    segments: &BTreeMap<(String, u64), SegmentStats>,
    comparison: &Comparison,
    resamples: usize,
) -> Result<Vec<Value>> {
    let Comparison {
        control,
        objectives,
        seeds,
    } = *comparison;
    let mut out = Vec::new();
    for &seed in seeds {
        let Some(control) = segments.get(&(control.to_string(), seed)) else {
            continue;
        };
        for o in objectives {
            if let Some(system) = segments.get(&(o.to_string(), seed)) {
                let b = bootstrap(control, system, resamples)?;
                out.push(json!({"objective": o, "seed": seed, "bleu_delta": b.bleu_delta, "bleu_p": b.bleu_p,
                    "chrf_delta": b.chrf_delta, "chrf_p": b.chrf_p}));
            }
        }
    }
    Ok(out)
}

/// Mean ± sd over seeds of the records of `(objective, condition, variant)`.
pub fn summary(records: &[NatRecord]) -> Value {
    let mut groups: BTreeMap<(String, String, String), Vec<&NatRecord>> = BTreeMap::new();
    for r in records {
        groups
            .entry((r.condition.clone(), r.objective.clone(), r.variant.clone()))
            .or_default()
            .push(r);
    }
    let rows: Vec<Value> = groups
        .into_iter()
        .map(|((condition, objective, variant), rs)| {
            let stat = |f: fn(&NatRecord) -> f64| {
                let (mean, sd) = mean_sd(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
                json!({"mean": mean, "sd": sd})
            };
            json!({"condition": condition, "objective": objective, "variant": variant, "seeds": rs.len(),
                "test_bleu": stat(|r| r.test_bleu), "test_chrf": stat(|r| r.test_chrf),
                "test_length_ratio": stat(|r| r.test_length_ratio),
                "test_bleu_without_bp": stat(|r| r.test_bleu_without_bp),
                "repetition_share": stat(|r| r.repetition_share),
                "length_accuracy": stat(|r| r.length_accuracy.unwrap_or(f64::NAN)),
                "ms_per_step": stat(|r| r.ms_per_step)})
        })
        .collect();
    Value::Array(rows)
}

/// The summary row of `(condition, objective, variant)`.
pub fn find<'a>(
    summary: &'a Value,
    condition: &str,
    objective: &str,
    variant: &str,
) -> Option<&'a Value> {
    summary.as_array()?.iter().find(|s| {
        s["condition"] == condition && s["objective"] == objective && s["variant"] == variant
    })
}

/// `mean ± sd` of `metric` in a summary row (the mean alone for one seed, `—` for none).
pub fn mean_sd_text(row: Option<&Value>, metric: &str, digits: usize) -> String {
    // A metric the row lacks (or a NaN, which JSON stores as null) reads "—", never "NaN".
    let mean = row.and_then(|r| r[metric]["mean"].as_f64());
    match (row, mean) {
        (Some(r), Some(mean)) if r["seeds"].as_u64().unwrap_or(0) > 1 => {
            match r[metric]["sd"].as_f64() {
                Some(sd) => format!("{mean:.digits$} ± {sd:.digits$}"),
                None => format!("{mean:.digits$}"),
            }
        }
        (Some(_), Some(mean)) => format!("{mean:.digits$}"),
        _ => "—".into(),
    }
}

/// `objective`'s difference from `ce` in `metric` with its test, or `—`.
pub fn delta_text(tests: &Value, metric: &str, objective: &str) -> String {
    tests[metric]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["objective"] == objective))
        .map_or("—".into(), |t| {
            format!(
                "{:+.2} (p {:.3}, Holm {:.3}; detectable {:.2})",
                t["test"]["mean_difference"].as_f64().unwrap_or(f64::NAN),
                t["test"]["p_value"].as_f64().unwrap_or(f64::NAN),
                t["p_holm"].as_f64().unwrap_or(f64::NAN),
                t["test"]["detectable_difference"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            )
        })
}

/// The markdown table of one condition: per objective, the primary variant's BLEU (with its
/// test against `ce`), chrF, BLEU without duplicate removal, length ratio, repetitions, BLEU
/// at the oracle length and the length predictor's accuracy.
pub fn render_condition(
    summary: &Value,
    tests: &Value,
    condition: &str,
    objectives: &[&str],
    primary: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "| {condition} | BLEU ({primary}) | Δ BLEU vs ce | chrF | Δ chrF vs ce | BLEU (l5, no dedup) | length ratio | repeated tokens (no dedup) | BLEU at oracle length (+dedup) | length accuracy |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|");
    for o in objectives {
        let row = find(summary, condition, o, primary);
        let raw = find(summary, condition, o, "l5");
        let _ = writeln!(
            out,
            "| {o} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            mean_sd_text(row, "test_bleu", 2),
            delta_text(tests, "test_bleu", o),
            mean_sd_text(row, "test_chrf", 2),
            delta_text(tests, "test_chrf", o),
            mean_sd_text(raw, "test_bleu", 2),
            mean_sd_text(row, "test_length_ratio", 3),
            mean_sd_text(raw, "repetition_share", 3),
            mean_sd_text(find(summary, condition, o, "oracle+dedup"), "test_bleu", 2),
            mean_sd_text(row, "length_accuracy", 3),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every column a table prints has its mean in the summary (the BLEU / BP column once read
    /// `NaN ± NaN` because the summary left it out), and a metric missing reads `—`.
    #[test]
    fn the_summary_holds_every_tables_metric_and_a_missing_one_reads_a_dash() {
        let record = |seed, test_bleu, test_bleu_without_bp| NatRecord {
            objective: "ctc".into(),
            condition: "distilled".into(),
            variant: "greedy".into(),
            length_beam: None,
            dedup: false,
            seed,
            config: "ctc".into(),
            dev_bleu: 30.0,
            best_step: 100,
            steps: 1000,
            test_bleu,
            test_chrf: 50.0,
            test_chrf_pp: 48.0,
            test_bleu_without_bp,
            test_length_ratio: 0.9,
            repetition_share: 0.01,
            length_accuracy: None,
            test_hyp: "h".into(),
            test_ref: "r".into(),
            bleu_signature: "b".into(),
            chrf_signature: "c".into(),
            ms_per_step: 500.0,
            train_seconds: 1.0,
            eval_seconds: 1.0,
        };
        let summary = summary(&[record(1, 30.0, 40.0), record(2, 32.0, 42.0)]);
        let row = find(&summary, "distilled", "ctc", "greedy");
        assert_eq!(mean_sd_text(row, "test_bleu_without_bp", 2), "41.00 ± 1.41");
        assert_eq!(mean_sd_text(row, "length_accuracy", 2), "—");
        assert_eq!(mean_sd_text(row, "no_such_metric", 2), "—");
        assert_eq!(mean_sd_text(None, "test_bleu", 2), "—");
    }
}
