//! The study's setting (data, model, plan) and its training and decoding phases: the baselines,
//! the λ and μ grids on seed 1, every objective on every seed, and the beam-search test decodes
//! with the control's length-penalty sweep.

use crate::cli::output_dir;
use crate::data::Bpe;
use crate::decode::{BeamConfig, MaxLength};
use crate::model::transformer::{PositionAdd, Transformer, TransformerConfig};
use crate::stats::best_on_dev;
use crate::translate::data::{prepare, DataConfig, SplitData, StudyData};
use crate::translate::evaluate::{
    decode_texts, score, segment_stats, Search, SegmentStats, TextScores, BLEU_SIGNATURE,
    CHRF_PP_SIGNATURE, CHRF_SIGNATURE,
};
use crate::translate::run::{
    best_weights, load_model, run, FormName, Objective, RecipeConfig, RunSpec, RunState, Schedule,
    Setup,
};
use crate::translate::track::Tracker;
use anyhow::Result;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::config::Config;

/// One row of results.json's `runs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    /// The objective's name (`baseline`, `ce`, `ce+expected`, `mrt`, …).
    pub objective: String,
    /// The seed.
    pub seed: u64,
    /// λ or μ (none for `ce` and the baseline).
    pub weight: Option<f64>,
    /// The selected checkpoint's dev BLEU (greedy).
    pub dev_bleu: f64,
    /// The selected checkpoint's step.
    pub best_step: usize,
    /// The steps the run trained.
    pub steps: usize,
    /// Test BLEU (sacrebleu 13a), beam search.
    pub test_bleu: f64,
    /// Test chrF.
    pub test_chrf: f64,
    /// Test chrF++.
    pub test_chrf_pp: f64,
    /// Test BLEU without the brevity penalty.
    pub test_bleu_without_bp: f64,
    /// Hypothesis length over reference length, on test.
    pub test_length_ratio: f64,
    /// The test output file.
    pub test_hyp: String,
    /// The test reference file.
    pub test_ref: String,
    /// sacrebleu's BLEU signature.
    pub bleu_signature: String,
    /// sacrebleu's chrF signature.
    pub chrf_signature: String,
    /// sacrebleu's chrF++ signature.
    pub chrf_pp_signature: String,
    /// Milliseconds per training step.
    pub ms_per_step: f64,
    /// Training time, seconds.
    pub train_seconds: f64,
    /// Dev evaluation time, seconds.
    pub eval_seconds: f64,
}

/// The progress plan's name for one beam-search decode of the test set.
const TEST_DECODE: &str = "test decode";

/// The whole study's setting: its flags, folders, data and model.
pub struct Study {
    /// The command line.
    pub args: Config,
    /// The output folder.
    pub out: PathBuf,
    /// The runs' checkpoints: `runs/seed<k>/<objective>`.
    pub runs_dir: PathBuf,
    /// The device the study runs on.
    pub device: candle_core::Device,
    /// The Transformer's sizes.
    pub model: TransformerConfig,
    /// The corpus's summary (counts, splits, SHA-256), as `corpus.json` holds it.
    pub corpus_summary: serde_json::Value,
    /// The BPE model.
    pub bpe: Bpe,
    /// The training split.
    pub train: SplitData,
    /// The dev split.
    pub dev: SplitData,
    /// The test split.
    pub test: SplitData,
    /// The seeds, `1..=--seeds`.
    pub seeds: Vec<u64>,
}

/// λ and μ as tuned on seed 1's dev set, with their grids (value, dev BLEU).
pub struct Tuning {
    /// λ and its dev BLEU, per grid point.
    pub lambda_grid: Vec<(f64, f64)>,
    /// The λ chosen.
    pub lambda: f64,
    /// μ and its dev BLEU, per grid point.
    pub mu_grid: Vec<(f64, f64)>,
    /// NaN without MRT.
    pub mu: f64,
}

/// One fine-tuning objective as every seed runs it.
pub struct FineTuning {
    /// Its name in tables and `results.json` (`ce`, `ce+expected`, `mrt`, ...).
    pub name: String,
    /// What it trains.
    pub objective: Objective,
    /// λ or μ (none for `ce`).
    pub weight: Option<f64>,
    /// Its checkpoints' folder name under each seed's.
    pub dir: String,
}

/// The test decodes: a record per run, the segment statistics of every fine-tuned run, and
/// the control's length-penalty sweep.
pub struct Tested {
    /// A record per test decode.
    pub records: Vec<RunRecord>,
    /// The segment statistics of every fine-tuned run, by objective and seed.
    pub segments: BTreeMap<(String, u64), SegmentStats>,
    /// The control's length-penalty sweep.
    pub sweep: Vec<serde_json::Value>,
}

impl Study {
    /// The setting of `args`: the output folder (an earlier study's runs are removed unless
    /// resuming), the corpus and its BPE model, the model's sizes and `test.ref`.
    pub fn prepare(args: Config) -> Result<Self> {
        let common = &args.common;
        let device = crate::device::device(common.cpu);
        let out = output_dir(
            args.out.clone(),
            common.quick,
            &format!("translate/{}", common.lang),
            PathBuf::from("runs/translate").join(&common.lang),
        );
        if out.join("runs").exists() && !common.resume && !args.output_distribution {
            println!(
                "{} holds an earlier study: starting over (use --resume to continue it)",
                out.display()
            );
            std::fs::remove_dir_all(out.join("runs"))?;
        }
        std::fs::create_dir_all(&out)?;
        let max_len = 128;
        let StudyData {
            summary,
            bpe,
            train,
            dev,
            test,
        } = prepare(
            &DataConfig {
                catalogs: &common.catalogs,
                lang: &common.lang,
                bpe_vocab: common.bpe_vocab,
                quick: common.quick,
                max_len,
            },
            &out,
        )?;
        let model = TransformerConfig {
            src_vocab: bpe.vocab_size(),
            tgt_vocab: bpe.vocab_size(),
            d_model: common.d_model,
            heads: 4,
            d_ff: 4 * common.d_model,
            encoder_layers: common.layers,
            decoder_layers: common.layers,
            max_len,
            dropout: common.dropout,
            tie_all: true,
            positions: PositionAdd::Broadcast,
        };
        let mut test_ref = test.references.join("\n");
        test_ref.push('\n');
        std::fs::write(out.join("test.ref"), test_ref)?;
        Ok(Self {
            seeds: (1..=common.seeds).collect(),
            runs_dir: out.join("runs"),
            out,
            device,
            model,
            corpus_summary: serde_json::to_value(&summary)?,
            bpe,
            train,
            dev,
            test,
            args,
        })
    }

    fn with_mrt(&self) -> bool {
        self.args.objectives.iter().any(|o| o == "mrt")
    }

    /// Beam-search decodes of the test set: per seed the baseline, every objective and the
    /// control's extra length penalties.
    fn test_decodes(&self) -> usize {
        let sweep_extra = self
            .args
            .lp_sweep
            .iter()
            .filter(|&&lp| lp != self.args.length_penalty)
            .count();
        self.seeds.len() * (2 + self.args.objectives.len() + sweep_extra)
    }

    /// The plan, for the progress projection: one entry per `Self::train` call of the phases
    /// below (each call takes back what it does not run: an early stop, a resumed run, or seed
    /// 1's final expected and MRT runs, which are the chosen grid runs), then the test decodes.
    pub fn plan(&self) -> Vec<(String, usize)> {
        let args = &self.args;
        let finetune_steps = args.common.finetune_steps;
        let mut plan: Vec<(String, usize)> = self
            .seeds
            .iter()
            .map(|_| ("baseline".to_string(), args.base_steps))
            .collect();
        plan.push(("ce+expected".into(), finetune_steps * args.lambdas.len()));
        if self.with_mrt() {
            plan.push(("mrt".into(), finetune_steps * args.mus.len()));
        }
        for _ in &self.seeds {
            for o in std::iter::once("ce").chain(args.objectives.iter().map(String::as_str)) {
                plan.push((kind_of(o), finetune_steps));
            }
        }
        plan.push((TEST_DECODE.into(), self.test_decodes()));
        plan
    }

    /// The study's model with the weights in `weights`.
    pub fn load_model(&self, weights: &Path) -> Result<Transformer> {
        load_model(self.model, weights, &self.device)
    }

    fn decode_texts(
        &self,
        model: &Transformer,
        split: &SplitData,
        search: Search,
    ) -> Result<Vec<String>> {
        decode_texts(model, &split.ids.src, search, &self.bpe)
    }

    /// Trains (or resumes, or loads) one run.
    fn train(
        &self,
        tracker: &mut Tracker,
        label: &str,
        kind: &str,
        spec: &RunSpec,
    ) -> Result<RunState> {
        let dev_bleu = |model: &Transformer| -> Result<f64> {
            let hyps = self.decode_texts(model, &self.dev, Search::Greedy)?;
            super::evaluate::bleu(&hyps, &self.dev.references)
        };
        let detok = |ids: &[u32]| self.bpe.decode(ids).unwrap_or_default();
        let setup = Setup {
            mrt_sources: self.args.mrt_sources,
            mrt_candidates: self.args.mrt_candidates,
            mrt_alpha: self.args.mrt_alpha,
            ..Setup::recipe(
                RecipeConfig {
                    model: self.model,
                    batch_size: self.args.common.batch_size,
                    label_smoothing: self.args.common.label_smoothing,
                },
                &self.train,
                &detok,
                &dev_bleu,
                self.device.clone(),
            )
        };
        tracker.train(label, kind, spec, |on_step| run(spec, &setup, on_step))
    }

    /// Beam-decodes the test set with a run's best weights, writes the hypotheses, scores them.
    fn test(
        &self,
        state: &RunState,
        file: &str,
        length_penalty: f64,
    ) -> Result<(TextScores, Vec<String>)> {
        let path = self.out.join(file);
        let hyps = match std::fs::read_to_string(&path) {
            Ok(text) if text.lines().count() == self.test.references.len() => {
                text.lines().map(str::to_string).collect()
            }
            _ => {
                let model = self.load_model(&best_weights(&state.spec.dir))?;
                let beam = BeamConfig {
                    beam: self.args.common.beam,
                    length_penalty,
                    max_length: MaxLength::default(),
                };
                let hyps = self.decode_texts(&model, &self.test, Search::Beam(beam))?;
                let mut text = hyps.join("\n");
                text.push('\n');
                std::fs::write(&path, text)?;
                hyps
            }
        };
        Ok((score(&hyps, &self.test.references)?, hyps))
    }

    /// 1. The cross-entropy baseline of every seed, until dev BLEU stops improving.
    pub fn train_baselines(&self, tracker: &mut Tracker) -> Result<BTreeMap<u64, RunState>> {
        let args = &self.args;
        let mut baselines = BTreeMap::new();
        for &seed in &self.seeds {
            let spec = RunSpec {
                dir: self.runs_dir.join(format!("seed{seed}")).join("baseline"),
                seed,
                batch_seed: seed,
                objective: Objective::Ce,
                init: None,
                max_steps: args.base_steps,
                eval_every: args.base_eval_every,
                patience: Some(args.patience),
                select_from: 0,
                keep_last: 0,
                schedule: Schedule::InverseSqrt {
                    peak: args.common.lr,
                    warmup: args.common.warmup,
                },
            };
            let state = self.train(tracker, &format!("seed {seed} baseline"), "baseline", &spec)?;
            baselines.insert(seed, state);
        }
        Ok(baselines)
    }

    /// A fine-tuning run of `seed` from its baseline's best weights, checkpoints in `name`.
    fn finetune(&self, seed: u64, objective: Objective, name: &str) -> RunSpec {
        let seed_dir = self.runs_dir.join(format!("seed{seed}"));
        RunSpec {
            dir: seed_dir.join(name),
            seed,
            // Every objective of a seed sees the same batches and dropout masks (a paired design).
            batch_seed: seed.wrapping_mul(1000) + 7,
            objective,
            init: Some(best_weights(&seed_dir.join("baseline"))),
            max_steps: self.args.common.finetune_steps,
            eval_every: self.args.common.finetune_eval_every,
            patience: None,
            select_from: 0,
            keep_last: 0,
            schedule: Schedule::Constant(self.args.common.finetune_lr),
        }
    }

    /// 2. λ and μ on seed 1's dev set.
    pub fn tune(&self, tracker: &mut Tracker) -> Result<Tuning> {
        let mut lambda_grid = Vec::new();
        for &lambda in &self.args.lambdas {
            let spec = self.finetune(
                1,
                Objective::CeBleu {
                    form: FormName::Expected,
                    lambda,
                },
                &format!("ce+expected-l{lambda}"),
            );
            let label = format!("seed 1 ce+expected λ={lambda}");
            let state = self.train(tracker, &label, "ce+expected", &spec)?;
            lambda_grid.push((lambda, state.best_dev_bleu));
        }
        let mut mu_grid = Vec::new();
        if self.with_mrt() {
            for &mu in &self.args.mus {
                let spec = self.finetune(1, Objective::Mrt { mu }, &format!("mrt-m{mu}"));
                let state = self.train(tracker, &format!("seed 1 mrt μ={mu}"), "mrt", &spec)?;
                mu_grid.push((mu, state.best_dev_bleu));
            }
        }
        let tuning = Tuning {
            lambda: best_on_dev(&lambda_grid).unwrap_or(f64::NAN),
            mu: if self.with_mrt() {
                best_on_dev(&mu_grid).unwrap_or(f64::NAN)
            } else {
                f64::NAN
            },
            lambda_grid,
            mu_grid,
        };
        tracker.progress.println(&format!(
            "tuned on seed 1's dev set: λ = {} ({}), μ = {} ({})",
            tuning.lambda,
            grid_text(&tuning.lambda_grid),
            tuning.mu,
            grid_text(&tuning.mu_grid)
        ));
        Ok(tuning)
    }

    /// The control `ce` and every objective of `--objectives`, with the tuned weights.
    pub fn fine_tunings(&self, tuning: &Tuning) -> Vec<FineTuning> {
        let (lambda, mu) = (tuning.lambda, tuning.mu);
        let with_bleu = |form: FormName, name: &str| FineTuning {
            name: format!("ce+{name}"),
            objective: Objective::CeBleu { form, lambda },
            weight: Some(lambda),
            dir: format!("ce+{name}-l{lambda}"),
        };
        std::iter::once("ce")
            .chain(self.args.objectives.iter().map(String::as_str))
            .map(|o| match o {
                "ce" => FineTuning {
                    name: "ce".into(),
                    objective: Objective::Ce,
                    weight: None,
                    dir: "ce".into(),
                },
                "expected" => with_bleu(FormName::Expected, o),
                "lower-bound" => with_bleu(FormName::LowerBound, o),
                "paired" => with_bleu(FormName::Paired, o),
                _ => FineTuning {
                    name: "mrt".into(),
                    objective: Objective::Mrt { mu },
                    weight: Some(mu),
                    dir: format!("mrt-m{mu}"),
                },
            })
            .collect()
    }

    /// 3. Every objective on every seed.
    pub fn train_fine_tunings(
        &self,
        tracker: &mut Tracker,
        fine_tunings: &[FineTuning],
    ) -> Result<BTreeMap<(String, u64), RunState>> {
        let mut states = BTreeMap::new();
        for &seed in &self.seeds {
            for f in fine_tunings {
                let spec = self.finetune(seed, f.objective, &f.dir);
                let label = format!("seed {seed} {}", f.name);
                let state = self.train(tracker, &label, &f.name, &spec)?;
                states.insert((f.name.clone(), seed), state);
            }
        }
        Ok(states)
    }

    /// 4. Test decodes (beam search), scores and the control's length-penalty sweep.
    pub fn test_all(
        &self,
        tracker: &mut Tracker,
        baselines: &BTreeMap<u64, RunState>,
        fine_tunings: &[FineTuning],
        states: &BTreeMap<(String, u64), RunState>,
    ) -> Result<Tested> {
        let args = &self.args;
        tracker
            .progress
            .show("decoding the test set (beam search)", true);
        let decodes = self.test_decodes();
        let mut records = Vec::new();
        let mut segments = BTreeMap::new();
        let mut decoded = 0;
        let mut tick = Instant::now();
        let mut count_decode = |tracker: &mut Tracker| {
            decoded += 1;
            tracker
                .progress
                .record(TEST_DECODE, 1, tick.elapsed().as_secs_f64());
            tick = Instant::now();
            tracker.progress.show(
                &format!("decoding the test set (beam search): {decoded} of {decodes}"),
                true,
            );
        };
        // The control's scores at the reported length penalty, for the sweep.
        let mut control_scores = BTreeMap::new();
        for &seed in &self.seeds {
            let file = format!("test.baseline.seed{seed}.hyp");
            let (scores, _) = self.test(&baselines[&seed], &file, args.length_penalty)?;
            count_decode(tracker);
            records.push(record(
                "baseline",
                seed,
                None,
                &baselines[&seed],
                &file,
                &scores,
            ));
            for f in fine_tunings {
                let state = &states[&(f.name.clone(), seed)];
                let file = format!("test.{}.seed{seed}.hyp", f.name);
                let (scores, hyps) = self.test(state, &file, args.length_penalty)?;
                count_decode(tracker);
                if f.name == "ce" {
                    control_scores.insert(seed, scores);
                }
                segments.insert(
                    (f.name.clone(), seed),
                    segment_stats(&hyps, &self.test.references)?,
                );
                records.push(record(&f.name, seed, f.weight, state, &file, &scores));
            }
        }
        let mut sweep = Vec::new();
        for &seed in &self.seeds {
            for &lp in &args.lp_sweep {
                // The reported length penalty is the control's own decode, already scored.
                let (scores, file) = if lp == args.length_penalty {
                    (control_scores[&seed], format!("test.ce.seed{seed}.hyp"))
                } else {
                    let file = format!("test.ce.seed{seed}.lp{lp}.hyp");
                    let (scores, _) = self.test(&states[&("ce".to_string(), seed)], &file, lp)?;
                    count_decode(tracker);
                    (scores, file)
                };
                sweep.push(json!({"seed": seed, "length_penalty": lp, "test_bleu": scores.bleu, "test_chrf": scores.chrf,
                    "test_length_ratio": scores.length_ratio, "test_bleu_without_bp": scores.bleu_without_bp, "test_hyp": file}));
            }
        }
        Ok(Tested {
            records,
            segments,
            sweep,
        })
    }
}

/// The record of one run's test decode `file`, scored `scores`.
fn record(
    objective: &str,
    seed: u64,
    weight: Option<f64>,
    state: &RunState,
    file: &str,
    scores: &TextScores,
) -> RunRecord {
    RunRecord {
        objective: objective.to_string(),
        seed,
        weight,
        dev_bleu: state.best_dev_bleu,
        best_step: state.best_step,
        steps: state.step,
        test_bleu: scores.bleu,
        test_chrf: scores.chrf,
        test_chrf_pp: scores.chrf_pp,
        test_bleu_without_bp: scores.bleu_without_bp,
        test_length_ratio: scores.length_ratio,
        test_hyp: file.to_string(),
        test_ref: "test.ref".to_string(),
        bleu_signature: BLEU_SIGNATURE.to_string(),
        chrf_signature: CHRF_SIGNATURE.to_string(),
        chrf_pp_signature: CHRF_PP_SIGNATURE.to_string(),
        ms_per_step: state.ms_per_step(),
        train_seconds: state.train_seconds,
        eval_seconds: state.eval_seconds,
    }
}

/// The progress plan's kind of a fine-tuning objective.
fn kind_of(objective: &str) -> String {
    match objective {
        "ce" => "ce".into(),
        "mrt" => "mrt".into(),
        form => format!("ce+{form}"),
    }
}

fn grid_text(grid: &[(f64, f64)]) -> String {
    grid.iter()
        .map(|(v, d)| format!("{v}: {d:.2}"))
        .collect::<Vec<_>>()
        .join(", ")
}
