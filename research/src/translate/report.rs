//! What a finished study reports: a record per test decode, the seed-level paired t-tests
//! against `ce` (Holm over the objectives), the per-seed paired bootstrap, the gain at the
//! control's matched length, the summaries, `table.md` and `results.json`; and
//! `--output-distribution`'s measurements of a finished study's models.

use crate::data::{BOS, EOS, PAD};
use crate::stats::{holm, mean_sd, paired_t_test, PairedT};
use crate::translate::batches::BatchIds;
use crate::translate::evaluate::{bootstrap, output_distribution, Bootstrap, TileFilter};
use crate::translate::run::best_weights;
use anyhow::{bail, Result};
use candle_bleu::loss::HiddenConfig;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use super::study::{FineTuning, RunRecord, Study, Tested, Tuning};

/// Reads one reported number off a run.
type Metric = fn(&RunRecord) -> f64;

/// The study's results: `results.json`'s value, the table (`table.md`) and the BLEU loss's
/// share of a `ce+expected` step.
pub struct Results {
    /// `results.json`'s value.
    pub json: serde_json::Value,
    /// `table.md`.
    pub table: String,
    /// The BLEU loss's share of a `ce+expected` step's time.
    pub bleu_loss_share: f64,
}

/// The statistics, summaries and table of `tested`, the runs of `fine_tunings` tuned as
/// `tuning`; `started`: when the study started.
pub fn results(
    study: &Study,
    tuning: &Tuning,
    fine_tunings: &[FineTuning],
    tested: &Tested,
    started: Instant,
) -> Result<Results> {
    let (args, model, seeds) = (&study.args, &study.model, study.seeds.as_slice());
    let Tested {
        records,
        segments,
        sweep,
    } = tested;
    // Statistics: seed-level paired t-tests against `ce` (Holm over the objectives), the
    // per-seed paired bootstrap, and the gain at the control's matched length.
    let value = |objective: &str, seed: u64, f: fn(&RunRecord) -> f64| -> f64 {
        records
            .iter()
            .find(|r| r.objective == objective && r.seed == seed)
            .map(f)
            .unwrap_or(f64::NAN)
    };
    let metrics: [(&str, Metric); 5] = [
        ("test_bleu", |r| r.test_bleu),
        ("test_chrf", |r| r.test_chrf),
        ("test_chrf_pp", |r| r.test_chrf_pp),
        ("test_bleu_without_bp", |r| r.test_bleu_without_bp),
        ("test_length_ratio", |r| r.test_length_ratio),
    ];
    let compared: Vec<&str> = fine_tunings
        .iter()
        .map(|f| f.name.as_str())
        .filter(|o| *o != "ce")
        .collect();
    let mut tests: BTreeMap<String, BTreeMap<String, PairedT>> = BTreeMap::new();
    let mut holm_adjusted: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for (metric, f) in metrics.iter().take(4) {
        let base: Vec<f64> = seeds.iter().map(|&s| value("ce", s, *f)).collect();
        let mut ps = Vec::new();
        for o in &compared {
            let sys: Vec<f64> = seeds.iter().map(|&s| value(o, s, *f)).collect();
            let t = paired_t_test(&base, &sys)?;
            ps.push(t.p_value);
            tests
                .entry(metric.to_string())
                .or_default()
                .insert(o.to_string(), t);
        }
        let adjusted = holm(&ps);
        for (o, p) in compared.iter().zip(adjusted) {
            holm_adjusted
                .entry(metric.to_string())
                .or_default()
                .insert(o.to_string(), p);
        }
    }
    let mut boot: Vec<serde_json::Value> = Vec::new();
    for &seed in seeds {
        for o in &compared {
            let b: Bootstrap = bootstrap(
                &segments[&("ce".to_string(), seed)],
                &segments[&(o.to_string(), seed)],
                args.common.bootstrap,
            )?;
            boot.push(json!({"objective": o, "seed": seed, "bleu_delta": b.bleu_delta, "bleu_p": b.bleu_p, "chrf_delta": b.chrf_delta, "chrf_p": b.chrf_p}));
        }
    }
    // The control's BLEU at each objective's length ratio, interpolated along its sweep.
    let mut matched = Vec::new();
    for &seed in seeds {
        let mut points: Vec<(f64, f64)> = sweep
            .iter()
            .filter(|s| s["seed"] == seed)
            .map(|s| {
                (
                    s["test_length_ratio"].as_f64().unwrap_or(f64::NAN),
                    s["test_bleu"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        for o in &compared {
            let ratio = value(o, seed, |r| r.test_length_ratio);
            let bleu = value(o, seed, |r| r.test_bleu);
            let control = interpolate(&points, ratio);
            matched.push(json!({"objective": o, "seed": seed, "length_ratio": ratio, "test_bleu": bleu,
                "control_bleu_at_ratio": control, "gain_at_matched_length": control.map(|c| bleu - c)}));
        }
    }

    // Summaries, the table and results.json.
    let summary = |objective: &str| -> serde_json::Value {
        let mut m = serde_json::Map::new();
        for (metric, f) in &metrics {
            let values: Vec<f64> = seeds.iter().map(|&s| value(objective, s, *f)).collect();
            let (mean, sd) = mean_sd(&values);
            m.insert(
                metric.to_string(),
                json!({"mean": mean, "sd": sd, "per_seed": values}),
            );
        }
        let ms: Vec<f64> = records
            .iter()
            .filter(|r| r.objective == objective)
            .map(|r| r.ms_per_step)
            .collect();
        let total: f64 = records
            .iter()
            .filter(|r| r.objective == objective)
            .map(|r| r.train_seconds + r.eval_seconds)
            .sum();
        m.insert("ms_per_step".into(), json!(mean_sd(&ms).0));
        m.insert("total_seconds".into(), json!(total));
        serde_json::Value::Object(m)
    };
    let names: Vec<String> = std::iter::once("baseline".to_string())
        .chain(fine_tunings.iter().map(|f| f.name.clone()))
        .collect();
    let summaries: BTreeMap<String, serde_json::Value> =
        names.iter().map(|n| (n.clone(), summary(n))).collect();
    let ce_ms = summaries["ce"]["ms_per_step"].as_f64().unwrap_or(f64::NAN);
    let expected_ms = summaries
        .get("ce+expected")
        .and_then(|s| s["ms_per_step"].as_f64())
        .unwrap_or(f64::NAN);
    let loss_share = (expected_ms - ce_ms) / expected_ms;
    let table = render_table(&names, &summaries, &tests, &holm_adjusted, seeds.len());
    let results = json!({
        "study": "translate",
        "language": args.common.lang,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "corpus": study.corpus_summary,
        "bpe_vocab": study.bpe.vocab_size(),
        "model": {"d_model": model.d_model, "layers": model.encoder_layers, "heads": model.heads, "d_ff": model.d_ff,
                  "dropout": model.dropout, "tied_embeddings": true, "max_len": model.max_len},
        "protocol": {"seeds": args.common.seeds, "batch_size": args.common.batch_size, "label_smoothing": args.common.label_smoothing,
                     "baseline": {"peak_lr": args.common.lr, "warmup": args.common.warmup, "step_cap": args.base_steps,
                                  "eval_every": args.base_eval_every, "patience": args.patience},
                     "finetune": {"steps": args.common.finetune_steps, "eval_every": args.common.finetune_eval_every, "lr": args.common.finetune_lr},
                     "selection": "best dev BLEU, greedy decoding, the starting checkpoint included",
                     "test_decoding": {"beam": args.common.beam, "length_penalty": args.length_penalty},
                     "mrt": {"sources_per_step": args.mrt_sources, "candidates": args.mrt_candidates, "alpha": args.mrt_alpha,
                             "sampling": "ancestral, temperature 1, duplicates removed", "cost": "1 - sentence BLEU (sacrebleu sentence_bleu, 13a)"}},
        "lambda_grid": tuning.lambda_grid.iter().map(|(l, d)| json!({"lambda": l, "dev_bleu": d})).collect::<Vec<_>>(),
        "mu_grid": tuning.mu_grid.iter().map(|(m, d)| json!({"mu": m, "dev_bleu": d})).collect::<Vec<_>>(),
        "lambda": tuning.lambda,
        "mu": if tuning.mu_grid.is_empty() { json!(null) } else { json!(tuning.mu) },
        "runs": records,
        "summary": summaries,
        "paired_t_vs_ce": tests,
        "holm_adjusted_p_vs_ce": holm_adjusted,
        "comparisons_per_metric": compared.len(),
        "paired_bootstrap_vs_ce": boot,
        "length_penalty_sweep_of_ce": sweep,
        "gain_at_matched_length": matched,
        "bleu_loss_share_of_a_step": loss_share,
        "seconds": started.elapsed().as_secs_f64(),
        "threads": std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| format!("default ({})", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))),
    });
    Ok(Results {
        json: results,
        table,
        bleu_loss_share: loss_share,
    })
}

/// `--output-distribution`: the teacher-forced output distributions of every seed's selected
/// baseline and `ce` checkpoints on dev, with the hidden-state loss's default blocks and tiles.
pub fn output_distributions(study: &Study) -> Result<()> {
    let (runs_dir, seeds, out) = (&study.runs_dir, &study.seeds, &study.out);
    let hidden = HiddenConfig::default();
    let vocab = study.model.tgt_vocab;
    let block_rows = (hidden.block_elements / vocab).max(1);
    let ids = BatchIds {
        pad: PAD,
        bos: BOS,
        eos: EOS,
    };
    let mut report = Vec::new();
    for &seed in seeds {
        for kind in ["baseline", "ce"] {
            let weights = best_weights(&runs_dir.join(format!("seed{seed}")).join(kind));
            if !weights.exists() {
                bail!(
                    "--output-distribution: {} is missing (run the study first)",
                    weights.display()
                );
            }
            let model = study.load_model(&weights)?;
            let measured = output_distribution(
                &model,
                &study.dev.ids,
                ids,
                study.args.common.batch_size,
                TileFilter {
                    tau: study.args.filter_tau,
                    block_rows,
                    vocab_tile: hidden.vocab_tile,
                },
            )?;
            println!(
                "seed {seed} {kind:>8}: {} dev positions, mean entropy {:.3} nats (ln V = {:.3}), \
                 reference token p {:.3}, {:.2} % of probabilities < {:e}, {:.1} % of the \
                 {block_rows} × {} tiles skippable",
                measured.positions,
                measured.mean_entropy_nats,
                (vocab as f64).ln(),
                measured.mean_target_prob,
                100.0 * measured.share_below_tau,
                measured.tau,
                100.0 * measured.skipped_tile_share,
                measured.vocab_tile,
            );
            report.push(json!({"seed": seed, "model": kind, "weights": weights, "dev": measured}));
        }
    }
    let path = out.join("output_distribution.json");
    std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    println!("{}", path.display());
    Ok(())
}

/// Linear interpolation of `y` at `x` along `points` sorted by `x`; `None` outside their range.
fn interpolate(points: &[(f64, f64)], x: f64) -> Option<f64> {
    points.windows(2).find_map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        (x0 <= x && x <= x1).then(|| {
            if x1 > x0 {
                y0 + (y1 - y0) * (x - x0) / (x1 - x0)
            } else {
                y0
            }
        })
    })
}

fn render_table(
    names: &[String],
    summaries: &BTreeMap<String, serde_json::Value>,
    tests: &BTreeMap<String, BTreeMap<String, PairedT>>,
    holm_adjusted: &BTreeMap<String, BTreeMap<String, f64>>,
    seeds: usize,
) -> String {
    let ms = |n: &str, m: &str| -> String {
        let s = &summaries[n][m];
        format!(
            "{:.2} ± {:.2}",
            s["mean"].as_f64().unwrap_or(f64::NAN),
            s["sd"].as_f64().unwrap_or(f64::NAN)
        )
    };
    let test = |n: &str, m: &str| -> String {
        match (
            tests.get(m).and_then(|t| t.get(n)),
            holm_adjusted.get(m).and_then(|t| t.get(n)),
        ) {
            (Some(t), Some(p)) => format!(
                "{:+.2} (p {:.3}, Holm {:.3})",
                t.mean_difference, t.p_value, p
            ),
            _ => "—".into(),
        }
    };
    let mut out = String::new();
    let _ = writeln!(out, "Test set, beam 5; mean ± sd over {seeds} seeds; Δ vs `ce` with the seed-level paired t-test (df = {}) and Holm's correction.\n", seeds - 1);
    let _ = writeln!(out, "| objective | BLEU | Δ BLEU | chrF | Δ chrF | chrF++ | BLEU w/o BP | length ratio | ms/step |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for n in names {
        let _ = writeln!(
            out,
            "| {n} | {} | {} | {} | {} | {} | {} | {:.3} | {:.0} |",
            ms(n, "test_bleu"),
            test(n, "test_bleu"),
            ms(n, "test_chrf"),
            test(n, "test_chrf"),
            ms(n, "test_chrf_pp"),
            ms(n, "test_bleu_without_bp"),
            summaries[n]["test_length_ratio"]["mean"]
                .as_f64()
                .unwrap_or(f64::NAN),
            summaries[n]["ms_per_step"].as_f64().unwrap_or(f64::NAN),
        );
    }
    // The detectable difference differs per objective (it scales with the sd of that
    // objective's per-seed differences from `ce`), so each is named.
    let detectable: Vec<String> = tests
        .get("test_bleu")
        .map(|t| {
            t.iter()
                .filter(|(_, t)| t.detectable_difference > 0.0)
                .map(|(name, t)| format!("{name} {:.2}", t.detectable_difference))
                .collect()
        })
        .unwrap_or_default();
    if !detectable.is_empty() {
        let _ = writeln!(
            out,
            "\nWith {seeds} seeds the t-test detects (80 % power, α = 0.05) only BLEU differences from `ce` at least this large, at each objective's observed seed-to-seed spread: {}.",
            detectable.join(", ")
        );
    }
    out
}
