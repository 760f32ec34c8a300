//! The seq2seq comparison end to end (`cargo run --release --example seq2seq`): the corpus, the
//! runs of [`super::train`], then [`super::report`]'s results.

use crate::cli::output_dir;
use crate::data::tokens::{read_tsv, write_lines, write_tsv, TokenCorpus, Tokens};
use crate::data::{EncodedCorpus, EOS};
use crate::device::device;
use crate::model::transformer::{PositionAdd, TransformerConfig};
use crate::progress;
use crate::task::reordering;
use crate::train::{write_partial_results, TrainingContext};
use anyhow::{bail, Context, Result};
use candle_bleu::loss::BleuLossConfig;
use indicatif::MultiProgress;
use std::path::PathBuf;
use std::time::Instant;

use super::config::Config;
use super::train::{Objective, RunOutput, TrainConfig};
use super::{report, train};

fn load_corpus(args: &Config) -> Result<TokenCorpus> {
    match (&args.train, &args.dev, &args.test) {
        (None, None, None) => {
            let (train, dev, test) = if args.quick {
                (2000, 100, 200)
            } else {
                (20000, 500, 1000)
            };
            Ok(reordering::corpus(train, dev, test, 2024))
        }
        (Some(train), Some(dev), Some(test)) => {
            let mode = if args.char {
                Tokens::Char
            } else {
                Tokens::Whitespace
            };
            Ok(TokenCorpus {
                train: read_tsv(train, mode)?,
                dev: read_tsv(dev, mode)?,
                test: read_tsv(test, mode)?,
                test_oracle: None,
            })
        }
        _ => bail!("--train, --dev and --test must be given together"),
    }
}

/// The whole comparison, as `cargo run --release --example seq2seq` runs it: every seed trains
/// both objectives; then the report, `results.json`, the outputs and `curves.png`.
pub fn run_study(mut args: Config) -> Result<()> {
    if args.quick {
        args.apply_quick();
    }
    args.out = output_dir(
        args.out_flag.take(),
        args.quick,
        "seq2seq",
        PathBuf::from("runs/seq2seq"),
    );
    args.check()?;
    let training = &args.training;
    let started = Instant::now();
    let device = device(training.cpu);
    let corpus = load_corpus(&args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    if args.train.is_none() {
        let dir = args.out.join("data");
        std::fs::create_dir_all(&dir)?;
        write_tsv(&dir.join("train.tsv"), &corpus.train)?;
        write_tsv(&dir.join("dev.tsv"), &corpus.dev)?;
        write_tsv(&dir.join("test.tsv"), &corpus.test)?;
    }
    let data = EncodedCorpus::new(&corpus);
    let longest = [&corpus.train, &corpus.dev, &corpus.test]
        .iter()
        .flat_map(|set| set.iter().map(|p| p.src.len().max(p.tgt.len() + 1)))
        .max()
        .unwrap_or(1);
    let max_target = corpus.train.iter().map(|p| p.tgt.len()).max().unwrap_or(1);

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
            max_len: longest.max(2 * max_target + 2) + 1,
            dropout: training.dropout,
            tie_all: false,
            positions: PositionAdd::Lookup,
        },
        steps: args.steps,
        batch_size: training.batch_size,
        lr: training.lr,
        lr_warmup: (args.steps / 10).clamp(1, 200),
        bleu_start: (args.warmup * args.steps as f64).round() as usize,
        lambda: training.lambda,
        loss: BleuLossConfig {
            form: args.form.form(),
            length: args.length.model(EOS),
            ..BleuLossConfig::default()
        },
        label_smoothing: training.label_smoothing,
        dropout: training.dropout,
        eval_every: training.eval_every,
        max_decode_len: 2 * max_target + 2,
    };
    println!(
        "data: {} train / {} dev / {} test pairs, vocabularies {} source / {} target; \
         model d={} layers={}+{} dropout {}; {} steps x batch {}; CE label smoothing {}; BLEU term \
         from step {} with λ={} ({:?}, {:?}); dev-selected checkpoints after step {}; {} threads",
        data.train.len(),
        data.dev.len(),
        data.test.len(),
        data.src_vocab.len(),
        data.tgt_vocab.len(),
        cfg.model.d_model,
        cfg.model.encoder_layers,
        cfg.model.decoder_layers,
        cfg.dropout,
        cfg.steps,
        cfg.batch_size,
        cfg.label_smoothing,
        cfg.bleu_start,
        cfg.lambda,
        cfg.loss.form,
        cfg.loss.length,
        cfg.bleu_start,
        candle_core::utils::get_num_threads(),
    );

    // Every finished run's hypotheses at once, and a partial results.json after each run, so
    // an interrupted study leaves what finished re-scorable.
    write_lines(&args.out.join("test.ref"), &data.test_refs)?;
    let mut json_runs = Vec::new();
    let bars = MultiProgress::new();
    let mut runs: Vec<RunOutput> = Vec::new();
    let context = TrainingContext {
        cfg: &cfg,
        data: &data,
        device: &device,
    };
    for seed in 1..=args.seeds {
        for objective in Objective::ALL {
            let prefix = format!("{} seed {seed}", objective.name());
            let bar = progress::bar(&bars, prefix, 16, cfg.steps)?;
            let output = train::run(objective, seed, &context, &bar)?;
            bar.finish();
            progress::say(&bars, report::run_line(&output))?;
            json_runs.push(report::run_json(&output, &args.out)?);
            write_partial_results(&args.out, &json_runs)?;
            runs.push(output);
        }
    }
    let report = report::Report {
        out: &args.out,
        seeds: args.seeds,
        bootstrap: training.bootstrap,
        cfg: &cfg,
        data: &data,
        test_oracle: corpus.test_oracle.as_deref(),
    };
    report.write(&runs, json_runs)?;
    println!(
        "\nwrote {} (results.json, log.csv, curves.png, test.*); total {:.0} s",
        args.out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
