//! The study end to end (`cargo run --release --example study`): the corpus, the runs of
//! [`super::run`] for the objectives of [`super::arms`], then [`super::report`]'s results.

use crate::cli::output_dir;
use crate::data::tokens::{write_lines, write_tsv};
use crate::data::{EncodedCorpus, EOS};
use crate::device::device;
use crate::eval;
use crate::model::transformer::{PositionAdd, TransformerConfig};
use crate::progress::say;
use crate::task::agreement;
use crate::train::{write_partial_results, TrainingContext};
use anyhow::{Context, Result};
use indicatif::MultiProgress;
use std::path::PathBuf;
use std::time::Instant;

use super::arms::{self, Arm, TrainConfig};
use super::config::Config;
use super::report;
use super::run::{self, RunOutput};

/// The objectives `--arms` names (by default the first [`arms::DEFAULT_ARMS`]).
fn selected_arms(args: &Config) -> Result<Vec<Arm>> {
    let all = arms::all_arms(args.bleu_only_length.model(EOS));
    match &args.arms {
        None => Ok(all[..arms::DEFAULT_ARMS].to_vec()),
        Some(names) => names
            .iter()
            .map(|name| {
                all.iter()
                    .find(|a| a.name == name)
                    .cloned()
                    .with_context(|| {
                        let known: Vec<&str> = all.iter().map(|a| a.name).collect();
                        format!(
                            "--arms: unknown objective `{name}`; known: {}",
                            known.join(", ")
                        )
                    })
            })
            .collect(),
    }
}

/// The whole study, as `cargo run --release --example study` runs it: the warm-ups, every
/// objective on every seed, the measures and their controls, the report, `results.json`,
/// `table.md` and the figures (or, with `--project`, the projected time).
pub fn run_study(mut args: Config) -> Result<()> {
    if args.quick {
        args.apply_quick();
    }
    args.out = output_dir(
        args.out_flag.take(),
        args.quick,
        "study",
        PathBuf::from("runs/study"),
    );
    args.check()?;
    let training = &args.training;
    let started = Instant::now();
    let device = device(training.cpu);
    let arms = selected_arms(&args)?;
    let corpus = agreement::corpus(
        args.train_pairs,
        args.dev_pairs,
        args.test_pairs,
        args.data_seed,
    );
    let data = EncodedCorpus::new(&corpus);
    let all_pairs = || corpus.train.iter().chain(&corpus.dev).chain(&corpus.test);
    let longest_src = all_pairs().map(|p| p.src.len()).max().unwrap_or(1);
    let max_target = all_pairs().map(|p| p.tgt.len()).max().unwrap_or(1);
    let max_decode_len = 2 * max_target + 2;
    let cfg = TrainConfig {
        model: TransformerConfig {
            src_vocab: data.src_vocab.len(),
            tgt_vocab: data.tgt_vocab.len(),
            d_model: training.d_model,
            heads: 4,
            d_ff: 2 * training.d_model,
            encoder_layers: training.layers,
            decoder_layers: training.layers,
            // The longest sequence and BOS.
            max_len: longest_src.max(max_decode_len + args.free_running_margin + 2) + 1,
            dropout: training.dropout,
            tie_all: false,
            positions: PositionAdd::Lookup,
        },
        warmup_steps: args.warmup_steps,
        arm_steps: args.arm_steps,
        batch_size: training.batch_size,
        lr: training.lr,
        lr_warmup: (args.warmup_steps + args.arm_steps)
            .div_ceil(10)
            .clamp(1, 200),
        lambda: training.lambda,
        label_smoothing: training.label_smoothing,
        dropout: training.dropout,
        free_running_margin: args.free_running_margin,
        eval_every: training.eval_every,
        max_decode_len,
    };
    let oracle_bleu = corpus
        .test_oracle
        .as_ref()
        .map(|oracle| eval::bleu_100(oracle, &data.test_refs))
        .transpose()?;
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target, targets up to \
         {max_target} tokens; model d={} layers={}+{}; CE warm-up {} steps, then {} steps per \
         objective, batch {}, λ={}, CE label smoothing {}, dropout {}; {} objectives x {} seeds; \
         {} threads; rule-based yardstick test BLEU {:.2}",
        data.train.len(),
        data.dev.len(),
        data.test.len(),
        data.src_vocab.len(),
        data.tgt_vocab.len(),
        cfg.model.d_model,
        cfg.model.encoder_layers,
        cfg.model.decoder_layers,
        cfg.warmup_steps,
        cfg.arm_steps,
        cfg.batch_size,
        cfg.lambda,
        cfg.label_smoothing,
        cfg.dropout,
        arms.len(),
        args.seeds,
        candle_core::utils::get_num_threads(),
        oracle_bleu.unwrap_or(f64::NAN),
    );
    if args.project {
        return run::project(&arms, &cfg, &data, args.seeds, &device);
    }

    std::fs::create_dir_all(args.out.join("data"))
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    write_tsv(&args.out.join("data/train.tsv"), &corpus.train)?;
    write_tsv(&args.out.join("data/dev.tsv"), &corpus.dev)?;
    write_tsv(&args.out.join("data/test.tsv"), &corpus.test)?;

    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &data.test_refs)?;
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let mut runs: Vec<RunOutput> = Vec::new();
    let mut warmup_s = Vec::new();
    let context = TrainingContext {
        cfg: &cfg,
        data: &data,
        device: &device,
    };
    for seed in 1..=args.seeds {
        let warm_started = Instant::now();
        let warm = run::warm_up(&arms, seed, &context, &bars)?;
        if warm.is_some() && cfg.warmup_steps > 0 {
            warmup_s.push(warm_started.elapsed().as_secs_f64());
        }
        for arm in &arms {
            let output = run::run_arm(arm, seed, warm.as_ref(), &context, &bars)?;
            say(
                &bars,
                format!(
                    "{:>32} seed {seed}: dev BLEU {:6.2} (step {}; last {:.2})  test BLEU {:6.2}  ({:.0} s, {:.0} ms/step)",
                    arm.name,
                    output.dev_bleu,
                    output.selected_step,
                    output.last_dev_bleu,
                    output.test_bleu,
                    output.wall_s,
                    1e3 * output.step.wall_s
                ),
            )?;
            json_runs.push(run::run_json(&output, &args.out)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }
    let report = report::Report {
        args: &args,
        cfg: &cfg,
        corpus: &corpus,
        data: &data,
        arms: &arms,
        oracle_bleu,
        warmup_s: &warmup_s,
        started,
    };
    report.write(&runs, json_runs)
}
