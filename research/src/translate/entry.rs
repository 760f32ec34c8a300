//! The translate study end to end (`cargo run --release --example translate`): the phases of
//! [`super::study`] in order, then [`super::report`]'s results into `results.json` and
//! `table.md`.

use anyhow::Result;
use std::time::Instant;

use super::config::Config;
use super::report;
use super::study::Study;
use super::track::Tracker;
use crate::checkpoint::{load_json, save_json};
use crate::progress::format_duration;

/// The whole study, as `cargo run --release --example translate` runs it: the baselines, the λ
/// and μ grids, every objective on every seed, the test decodes, `results.json` and `table.md`
/// (or, with `--output-distribution`, the measurements of a finished study's models).
pub fn run_study(mut args: Config) -> Result<()> {
    if args.common.quick {
        args.apply_quick();
    }
    args.check()?;
    let started = Instant::now();
    let study = Study::prepare(args)?;
    let mut tracker = Tracker::open(&study.out, &study.plan())?;
    let (model, common) = (&study.model, &study.args.common);
    println!(
        "model: d={} layers={}+{} heads 4 ff {} dropout {} tied embeddings, V={}; batch {}; label smoothing {}",
        model.d_model,
        model.encoder_layers,
        model.decoder_layers,
        model.d_ff,
        model.dropout,
        model.tgt_vocab,
        common.batch_size,
        common.label_smoothing
    );
    if study.args.output_distribution {
        return report::output_distributions(&study);
    }

    let baselines = study.train_baselines(&mut tracker)?;
    let tuning = study.tune(&mut tracker)?;
    let fine_tunings = study.fine_tunings(&tuning);
    let states = study.train_fine_tunings(&mut tracker, &fine_tunings)?;
    let tested = study.test_all(&mut tracker, &baselines, &fine_tunings, &states)?;
    let results = report::results(&study, &tuning, &fine_tunings, &tested, started)?;

    let out = &study.out;
    save_json(&results.json, &out.join("results.json"))?;
    std::fs::write(out.join("table.md"), &results.table)?;
    tracker.progress.finish();
    println!("\n{}", results.table);
    println!(
        "λ = {} and μ = {} from seed 1's dev set; BLEU loss share of a ce+expected step: {:.0} %; total {}",
        tuning.lambda,
        tuning.mu,
        100.0 * results.bleu_loss_share,
        format_duration(started.elapsed().as_secs_f64())
    );
    println!("outputs in {}", out.display());
    // Reading results.json back checks that it parses.
    let _: Option<serde_json::Value> = load_json(&out.join("results.json"))?;
    Ok(())
}
