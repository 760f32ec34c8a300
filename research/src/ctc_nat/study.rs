//! The CTC NAT study's driver ([`run_study`]) and its phases; `docs/ctc_nat.md` describes the
//! design. The corpus, teacher, distillation, batches order, training loop, statistics and
//! files are the NAT study's and the translate study's ([`crate::nat`], [`crate::translate`]).

use anyhow::{bail, Result};
use candle_core::Device;
use candle_nn::VarMap;
use serde_json::json;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::batches::{feasible_pairs, infeasible_count, make_ctc_batch};
use super::config::{Config, TeacherChoice};
use super::decode::{decode_ctc, decode_ctc_penalised};
use super::objective::{step_loss, CtcObjective};
use super::plan::{plan, step_estimates, BASELINE, FINETUNE_BLEU, FINETUNE_CTC};
use crate::checkpoint::{average_checkpoints, load_json, save_json, step_checkpoints};
use crate::data::{BOS, EOS, PAD};
use crate::decode::{BeamConfig, Specials};
use crate::model::ctc_nat::{CtcNat, BLANK};
use crate::model::transformer::{Dropout, TransformerConfig};
use crate::nat::decode::{repetition_share, timed};
use crate::nat::files::{file_sha256, read_lines_gz, write_lines_gz};
use crate::nat::objective::Mixing;
use crate::nat::report::{
    bootstraps_vs, delta_text, find, mean_sd_text, seed_level_tests_vs, summary, Comparison,
    NatRecord,
};
use crate::nat::teacher::{
    parse_ids, teacher, teacher_and_distilled, DistillRecord, Teacher, TeacherSetup, TeacherStamp,
    TEACHER,
};
use crate::progress::format_duration;
use crate::stats::best_on_dev;
use crate::translate::batches::{Batches, IdPairs};
use crate::translate::data::StudyData;
use crate::translate::evaluate::{
    bleu, decode_ids, score, segment_stats, Search, SegmentStats, TextScores,
};
use crate::translate::run::{
    best_weights, load_model, mix, train_run, RunFunctions, RunSpec, RunState, Schedule,
};
use crate::translate::track::Tracker;

/// The longest source or target, in subwords with BOS and EOS (the teacher's positions; the
/// CTC NAT has `r` times as many).
use crate::nat::study::{record_scores, study_setting, StudySetting, MAX_LEN};
/// The control every objective is compared with.
const CONTROL: &str = "ctc";
/// The CTC NAT's decoding: greedy, `δ = 0`.
const VARIANT: &str = "greedy";
/// Greedy with the blank penalty `δ` chosen on dev for each run (`--blank-penalties`).
const TUNED: &str = "blank-tuned";

/// The setting the whole study shares.
struct Study {
    cfg: Config,
    data: StudyData,
    /// The teacher's sizes.
    teacher: TransformerConfig,
    /// The CTC NAT's sizes (the teacher's, with `r·MAX_LEN` positions).
    ctc: TransformerConfig,
    device: Device,
    out: PathBuf,
    work: PathBuf,
    seeds: Vec<u64>,
    /// The teacher's beam search on the test set (its reference point).
    beam: BeamConfig,
    /// The distillation's: the same width, `--distill-length-penalty`.
    distill_beam: BeamConfig,
}

/// A run's test output in one decoding variant: its record, its segment statistics and, for the
/// blank-tuned variant, every `(δ, dev BLEU)` tried.
type TestOutput = (NatRecord, SegmentStats, Option<Vec<(f64, f64)>>);

/// Every run's state by (name, seed); seed 1's grid runs are named `grid:<label>`.
type States = BTreeMap<(String, u64), RunState<CtcObjective>>;

/// The training pairs and what was left out.
struct TrainingPairs {
    teacher: Teacher,
    distilled: IdPairs,
    /// Distilled pairs left out: no CTC alignment in `r·S` frames, or an empty side.
    dropped_distilled: usize,
    /// The raw training references `r·S` frames cannot align (for comparison; not trained on).
    infeasible_raw: usize,
    /// Σ |distilled target| / Σ |reference| over the training pairs, in subwords (before the
    /// infeasible pairs are dropped): how short the teacher's targets are.
    target_length_ratio: f64,
    /// Dev and test references longer (with repeats) than their source's frames.
    infeasible_dev: usize,
    infeasible_test: usize,
}

fn specials() -> Specials {
    Specials {
        bos: BOS,
        eos: EOS,
        pad: PAD,
    }
}

/// A run's `averaging.json`: what checkpoint averaging (`--average-last`) found on dev.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Averaging {
    /// The steps whose weights were averaged.
    steps: Vec<usize>,
    /// The average's dev BLEU.
    dev_bleu: f64,
    single_best_step: usize,
    single_best_dev_bleu: f64,
    /// Whether the average replaced the single best checkpoint.
    selected: bool,
}

/// The name of a run's averaging record.
const AVERAGING: &str = "averaging.json";

/// A record with `scores`, the files and its objective, condition and variant (nat's
/// [`record_scores`], no training time).
fn record(
    scores: &TextScores,
    objective: &str,
    condition: &str,
    variant: &str,
    file: String,
) -> NatRecord {
    NatRecord {
        objective: objective.into(),
        condition: condition.into(),
        variant: variant.into(),
        ..record_scores(scores, file, f64::NAN, 0.0, 0.0)
    }
}

impl Study {
    fn prepare(cfg: Config) -> Result<Self> {
        let common = &cfg.common;
        let StudySetting {
            device,
            out,
            work,
            data,
            model: teacher,
        } = study_setting(
            common,
            cfg.out(),
            cfg.work(),
            // The plan and the distillation pilot remove nothing (a fresh start would).
            common.resume || cfg.plan_only || !cfg.distill_pilot.is_empty(),
        )?;
        Ok(Self {
            ctc: TransformerConfig {
                max_len: cfg.ratio * MAX_LEN,
                ..teacher
            },
            seeds: (1..=common.seeds).collect(),
            beam: BeamConfig {
                beam: common.beam,
                ..BeamConfig::default()
            },
            distill_beam: BeamConfig {
                beam: common.beam,
                length_penalty: cfg.distill_length_penalty,
                ..BeamConfig::default()
            },
            cfg,
            data,
            teacher,
            device,
            out,
            work,
        })
    }

    fn load(&self, weights: &Path) -> Result<CtcNat> {
        let mut varmap = VarMap::new();
        let model = CtcNat::new(self.ctc, self.cfg.ratio, &varmap, 0, &self.device)?;
        crate::checkpoint::load_vars(&mut varmap, weights)?;
        Ok(model)
    }

    fn detok(&self, ids: &[u32]) -> String {
        self.data.bpe.decode(ids).unwrap_or_default()
    }

    /// Frames of a source of `s` tokens.
    fn frames(&self, s: usize) -> usize {
        crate::model::ctc_nat::frames(s, self.cfg.ratio, self.ctc.max_len)
    }

    /// Dev BLEU of `model`, greedy CTC decoding (the selection criterion).
    fn dev_bleu(&self, model: &CtcNat) -> Result<f64> {
        let ids = decode_ctc(model, &self.data.dev.ids.src, 64, PAD)?;
        let hyps: Vec<String> = ids.iter().map(|i| self.detok(i)).collect();
        bleu(&hyps, &self.data.dev.references)
    }

    fn run_dir(&self, seed: u64, name: &str) -> PathBuf {
        self.work.join(format!("seed{seed}")).join(name)
    }

    /// Trains (or resumes, or loads) one run on `pairs`.
    fn train(
        &self,
        tracker: &mut Tracker,
        label: &str,
        kind: &str,
        spec: &RunSpec<CtcObjective>,
        pairs: &IdPairs,
    ) -> Result<RunState<CtcObjective>> {
        let mut varmap = VarMap::new();
        let model = CtcNat::new(self.ctc, self.cfg.ratio, &varmap, spec.seed, &self.device)?;
        let batches = Batches::new(pairs, self.cfg.common.batch_size, spec.batch_seed)?;
        let dev = || self.dev_bleu(&model);
        let mut step = |indices: &[usize], step: usize| {
            let batch = make_ctc_batch(&model, pairs, indices, PAD, &self.device)?;
            let mut dropout = Dropout::new(self.ctc.dropout, mix(spec.seed, 1, step));
            step_loss(&model, &batch, spec.objective, PAD, &mut dropout)
        };
        let state = tracker.train(label, kind, spec, |on_step| {
            let functions = RunFunctions {
                step_loss: &mut step,
                dev_bleu: &dev,
            };
            train_run(spec, &mut varmap, &batches, functions, on_step)
        })?;
        self.select_averaged(tracker, label, state)
    }

    /// Checkpoint averaging (`--average-last K`): the average of the run's last `K` kept
    /// checkpoints replaces its best checkpoint (`best.safetensors`, the single best kept as
    /// `best_single.safetensors`) when its dev BLEU is higher — chosen on dev, as every
    /// checkpoint is. Recorded in the run's `averaging.json` (read back on a resume) and
    /// reflected in the returned state's `best_dev_bleu`.
    fn select_averaged(
        &self,
        tracker: &mut Tracker,
        label: &str,
        mut state: RunState<CtcObjective>,
    ) -> Result<RunState<CtcObjective>> {
        let keep = self.cfg.average_last;
        let dir = state.spec.dir.clone();
        if keep == 0 || !state.done {
            return Ok(state);
        }
        let record_path = dir.join(AVERAGING);
        let record = match load_json::<Averaging>(&record_path)? {
            Some(record) => record,
            None => {
                let kept = step_checkpoints(&dir)?;
                let last: Vec<(usize, PathBuf)> = kept[kept.len().saturating_sub(keep)..].to_vec();
                if last.len() < 2 {
                    return Ok(state);
                }
                let averaged = dir.join("averaged.safetensors");
                let paths: Vec<PathBuf> = last.iter().map(|(_, p)| p.clone()).collect();
                average_checkpoints(&paths, &averaged)?;
                let dev_bleu = self.dev_bleu(&self.load(&averaged)?)?;
                let selected = dev_bleu > state.best_dev_bleu;
                if selected {
                    std::fs::copy(best_weights(&dir), dir.join("best_single.safetensors"))?;
                    std::fs::copy(&averaged, best_weights(&dir))?;
                }
                let record = Averaging {
                    steps: last.iter().map(|(s, _)| *s).collect(),
                    dev_bleu,
                    single_best_step: state.best_step,
                    single_best_dev_bleu: state.best_dev_bleu,
                    selected,
                };
                save_json(&record, &record_path)?;
                tracker.progress.println(&format!(
                    "{label}: the average of steps {:?} has dev BLEU {dev_bleu:.2} against the best single checkpoint's {:.2} (step {}): {}",
                    record.steps,
                    state.best_dev_bleu,
                    state.best_step,
                    if selected { "the average is selected" } else { "the single checkpoint stays" }
                ));
                record
            }
        };
        if record.selected {
            state.best_dev_bleu = record.dev_bleu;
        }
        Ok(state)
    }

    /// The teacher's steps still to train (0 when a finished one matches).
    fn teacher_steps_left(&self) -> Result<usize> {
        let dir = self.cfg.teacher_dir().join("teacher");
        let stamp: Option<TeacherStamp> = load_json(&dir.join("teacher.json"))?;
        let state: Option<RunState> = load_json(&dir.join("state.json"))?;
        let matches = stamp.is_some_and(|s| {
            s.recipe == self.cfg.recipe() && s.corpus_sha256 == self.data.summary.sha256
        });
        let translate_reused = self.cfg.teacher == TeacherChoice::Translate
            && self
                .translate_run()
                .join("runs/seed1/ce/state.json")
                .exists();
        Ok(match state {
            _ if translate_reused => 0,
            Some(s) if matches && s.done => 0,
            Some(s) if matches => self.cfg.recipe().steps.saturating_sub(s.step),
            _ => self.cfg.recipe().steps,
        })
    }

    /// Whether the distilled targets in the output folder are the plateau teacher's (its best
    /// weights' SHA-256, the corpus'), so that the run will read them instead of decoding: the
    /// plan then leaves the distillation out. A teacher still to train, or the translate
    /// study's, counts as not cached.
    fn distillation_cached(&self, teacher_steps: usize) -> Result<bool> {
        if teacher_steps > 0 || self.cfg.teacher == TeacherChoice::Translate {
            return Ok(false);
        }
        let record: Option<DistillRecord> = load_json(&self.out.join("distilled.json"))?;
        let weights = best_weights(&self.cfg.teacher_dir().join("teacher"));
        Ok(match record {
            Some(r) if weights.exists() && self.out.join("distilled.ids.gz").exists() => {
                r.teacher_sha256 == file_sha256(&weights)?
                    && r.corpus_sha256 == self.data.summary.sha256
                    && r.beam == self.distill_beam.beam
                    && r.length_penalty == self.distill_beam.length_penalty
            }
            _ => false,
        })
    }

    fn translate_run(&self) -> PathBuf {
        self.cfg
            .translate_run
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs/translate").join(&self.cfg.common.lang))
    }

    /// What [`teacher_and_distilled`] needs, from the study's settings.
    fn teacher_setup<'a>(
        &'a self,
        translate_run: &'a Path,
        teacher_dir: &'a Path,
    ) -> TeacherSetup<'a> {
        TeacherSetup {
            config: self.teacher,
            recipe: self.cfg.recipe(),
            data: &self.data,
            translate_run: (self.cfg.teacher == TeacherChoice::Translate).then_some(translate_run),
            out: &self.out,
            work: teacher_dir,
            beam: self.distill_beam,
            device: &self.device,
        }
    }

    /// Part 1: the teacher and the distilled targets, the infeasible pairs dropped.
    fn teacher_and_distillation(&self, tracker: &mut Tracker) -> Result<TrainingPairs> {
        let translate_run = self.translate_run();
        let teacher_dir = self.cfg.teacher_dir();
        let setup = self.teacher_setup(&translate_run, &teacher_dir);
        let (teacher, distilled) = teacher_and_distilled(&setup, tracker)?;
        let total = |rows: &[Vec<u32>]| rows.iter().map(Vec::len).sum::<usize>() as f64;
        let target_length_ratio = total(&distilled.tgt) / total(&self.data.train.ids.tgt).max(1.0);
        let frames = |s: usize| self.frames(s);
        let (distilled, dropped_distilled) = feasible_pairs(&distilled, frames);
        let pairs = TrainingPairs {
            teacher,
            distilled,
            dropped_distilled,
            target_length_ratio,
            infeasible_raw: infeasible_count(&self.data.train.ids, frames),
            infeasible_dev: infeasible_count(&self.data.dev.ids, frames),
            infeasible_test: infeasible_count(&self.data.test.ids, frames),
        };
        tracker.progress.println(&format!(
            "distilled targets: {} pairs kept, {} left out (no alignment in {}·S frames, or empty); references beyond their frames: raw train {}, dev {}, test {}; targets / references length {:.3} (subwords, length penalty {})",
            pairs.distilled.len(), pairs.dropped_distilled, self.cfg.ratio, pairs.infeasible_raw, pairs.infeasible_dev, pairs.infeasible_test,
            pairs.target_length_ratio, self.distill_beam.length_penalty
        ));
        Ok(pairs)
    }

    /// Part 2: the CTC baselines, to their dev plateau after the selection window.
    fn train_baselines(&self, tracker: &mut Tracker, pairs: &IdPairs) -> Result<States> {
        let cfg = &self.cfg;
        let mut states = States::new();
        for &seed in &self.seeds {
            let spec = RunSpec {
                dir: self.run_dir(seed, "baseline"),
                seed,
                batch_seed: seed,
                objective: CtcObjective::Ctc,
                init: None,
                max_steps: cfg.base_steps,
                eval_every: cfg.base_eval_every,
                patience: Some(cfg.patience),
                select_from: cfg.select_from,
                keep_last: cfg.average_last,
                schedule: Schedule::InverseSqrt {
                    peak: cfg.common.lr,
                    warmup: cfg.common.warmup,
                },
            };
            let label = format!("seed {seed} CTC baseline");
            let state = self.train(tracker, &label, BASELINE, &spec, pairs)?;
            states.insert(("baseline".into(), seed), state);
        }
        Ok(states)
    }

    /// A fine-tuning run of `objective` from `seed`'s baseline: the same batches and dropout
    /// masks for every objective of a seed (paired), the starting point a candidate.
    fn finetune(&self, seed: u64, objective: CtcObjective) -> RunSpec<CtcObjective> {
        let common = &self.cfg.common;
        RunSpec {
            dir: self.run_dir(seed, &objective.label()),
            seed,
            batch_seed: seed.wrapping_mul(1000) + 7,
            objective,
            init: Some(best_weights(&self.run_dir(seed, "baseline"))),
            max_steps: common.finetune_steps,
            eval_every: common.finetune_eval_every,
            patience: None,
            select_from: 0,
            keep_last: self.cfg.average_last,
            schedule: Schedule::Constant(common.finetune_lr),
        }
    }

    fn finetune_run(
        &self,
        tracker: &mut Tracker,
        seed: u64,
        objective: CtcObjective,
        pairs: &IdPairs,
    ) -> Result<RunState<CtcObjective>> {
        let spec = self.finetune(seed, objective);
        let kind = if objective == CtcObjective::Ctc {
            FINETUNE_CTC
        } else {
            FINETUNE_BLEU
        };
        let label = format!("seed {seed} {}", objective.label());
        self.train(tracker, &label, kind, &spec, pairs)
    }

    /// The dev-best blank penalty of `model` over `--blank-penalties` (the first among equals)
    /// and every `(δ, dev BLEU)` tried.
    fn tune_blank_penalty(&self, model: &CtcNat) -> Result<(f64, Vec<(f64, f64)>)> {
        let dev = &self.data.dev;
        let mut tried = Vec::new();
        for &delta in &self.cfg.blank_penalties {
            let ids = decode_ctc_penalised(model, &dev.ids.src, 64, PAD, delta)?;
            let hyps: Vec<String> = ids.iter().map(|i| self.detok(i)).collect();
            tried.push((delta, bleu(&hyps, &dev.references)?));
        }
        let Some(best) = best_on_dev(&tried) else {
            bail!("internal: no blank penalty to tune")
        };
        Ok((best, tried))
    }

    /// Test outputs of a CTC NAT: its record and segment statistics at `δ = 0` (`greedy`), and
    /// with `--blank-penalties` at its dev-best `δ` too (`blank-tuned`, its `δ` in `config`).
    fn test(&self, name: &str, state: &RunState<CtcObjective>) -> Result<Vec<TestOutput>> {
        let model = self.load(&best_weights(&state.spec.dir))?;
        let mut variants = vec![(VARIANT, 0.0, None)];
        if !self.cfg.blank_penalties.is_empty() {
            let (delta, tried) = self.tune_blank_penalty(&model)?;
            variants.push((TUNED, delta, Some(tried)));
        }
        let test = &self.data.test;
        let mut out = Vec::new();
        for (variant, delta, tried) in variants {
            let ids = decode_ctc_penalised(&model, &test.ids.src, 64, PAD, delta)?;
            let hyps: Vec<String> = ids.iter().map(|i| self.detok(i)).collect();
            let file = format!(
                "test.distilled.{name}.seed{}.{variant}.hyp.gz",
                state.spec.seed
            );
            write_lines_gz(&self.out.join(&file), &hyps)?;
            let scores = score(&hyps, &test.references)?;
            let config = match variant {
                TUNED => format!("{} δ={delta}", state.spec.objective.label()),
                _ => state.spec.objective.label(),
            };
            out.push((
                NatRecord {
                    seed: state.spec.seed,
                    config,
                    dev_bleu: state.best_dev_bleu,
                    best_step: state.best_step,
                    steps: state.step,
                    repetition_share: repetition_share(&ids),
                    ms_per_step: state.ms_per_step(),
                    train_seconds: state.train_seconds,
                    eval_seconds: state.eval_seconds,
                    ..record(&scores, name, "distilled", variant, file)
                },
                segment_stats(&hyps, &test.references)?,
                tried,
            ));
        }
        Ok(out)
    }

    /// The reference points: the source copied as the hypothesis, the teacher greedy and beam.
    fn reference_points(&self, teacher: &Teacher) -> Result<Vec<NatRecord>> {
        let test = &self.data.test;
        write_lines_gz(&self.out.join("test.copy.hyp.gz"), &test.sources)?;
        let mut records = vec![NatRecord {
            config: "the source sentence".into(),
            ..record(
                &score(&test.sources, &test.references)?,
                "copy",
                "copy",
                "source",
                "test.copy.hyp.gz".into(),
            )
        }];
        let model = load_model(self.teacher, &teacher.weights, &self.device)?;
        for (search, variant) in [
            (Search::Greedy, "greedy".to_string()),
            (Search::Beam(self.beam), format!("beam{}", self.beam.beam)),
        ] {
            let ids = decode_ids(&model, &test.ids.src, specials(), search, 100)?;
            let hyps: Vec<String> = ids.iter().map(|i| self.detok(i)).collect();
            let file = format!("test.teacher.{variant}.hyp.gz");
            write_lines_gz(&self.out.join(&file), &hyps)?;
            records.push(NatRecord {
                config: teacher.origin.clone(),
                dev_bleu: teacher.dev_bleu,
                repetition_share: repetition_share(&ids),
                ..record(
                    &score(&hyps, &test.references)?,
                    "teacher",
                    "ar",
                    &variant,
                    file,
                )
            });
        }
        Ok(records)
    }

    /// Speed: seed 1's CTC baseline and the teacher, the same threads, in this process, on the
    /// test set at batch 64 and on `--speed-sentences` at batch 1.
    fn speed(&self, teacher: &Teacher) -> Result<Vec<serde_json::Value>> {
        let sources = &self.data.test.ids.src;
        let ctc = self.load(&best_weights(&self.run_dir(1, "baseline")))?;
        let ar = load_model(self.teacher, &teacher.weights, &self.device)?;
        let few = self.cfg.speed_sentences.min(sources.len());
        // One untimed batch of each first (allocations, caches).
        let warm = &sources[..sources.len().min(8)];
        decode_ctc(&ctc, warm, 8, PAD)?;
        decode_ids(&ar, warm, specials(), Search::Greedy, 8)?;
        let mut speed = Vec::new();
        for (batch, sources) in [(64usize, &sources[..]), (1, &sources[..few])] {
            let (seconds, per_second) = timed(sources.len(), || {
                decode_ctc(&ctc, sources, batch, PAD).map(|_| ())
            })?;
            speed.push(json!({"model": "ctc nat", "search": "greedy", "batch": batch, "sentences": sources.len(), "seconds": seconds, "sentences_per_second": per_second}));
            for (search, label) in [
                (Search::Greedy, "greedy".to_string()),
                (Search::Beam(self.beam), format!("beam {}", self.beam.beam)),
            ] {
                let (seconds, per_second) = timed(sources.len(), || {
                    decode_ids(&ar, sources, specials(), search, batch).map(|_| ())
                })?;
                speed.push(json!({"model": "ar", "search": label, "batch": batch, "sentences": sources.len(), "seconds": seconds, "sentences_per_second": per_second}));
            }
        }
        Ok(speed)
    }
}

fn grid_text(grid: &[(CtcObjective, f64)]) -> String {
    grid.iter()
        .map(|(o, d)| format!("{} {d:.2}", o.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The pilot of `--pilot-distilled`: seed 1's baseline and two short fine-tunes on the given
/// distilled targets; dev BLEU and costs to `pilot.json`.
fn run_pilot(study: &Study, distilled: &Path) -> Result<()> {
    let cfg = &study.cfg;
    let lines = read_lines_gz(distilled)?;
    let sources = &study.data.train.ids.src;
    if lines.len() != sources.len() {
        bail!(
            "{}: {} lines for {} training sources (another corpus or tokenizer?)",
            distilled.display(),
            lines.len(),
            sources.len()
        );
    }
    let targets = lines
        .iter()
        .map(|l| parse_ids(l))
        .collect::<Result<Vec<_>>>()?;
    let pairs = IdPairs {
        src: sources.clone(),
        tgt: targets,
    };
    let (pairs, dropped) = feasible_pairs(&pairs, |s| study.frames(s));
    println!(
        "pilot r = {}: {} distilled pairs kept, {dropped} left out",
        cfg.ratio,
        pairs.len()
    );
    let finetune = cfg.common.finetune_steps;
    let mixing = Mixing::WithCe(cfg.lambdas[0]);
    let mut tracker = Tracker::open(
        &study.out,
        &[
            (BASELINE.to_string(), cfg.base_steps),
            (FINETUNE_CTC.to_string(), finetune),
            (FINETUNE_BLEU.to_string(), finetune),
        ],
    )?;
    for (kind, seconds) in step_estimates(cfg) {
        tracker.progress.estimate(&kind, seconds);
    }
    let spec = RunSpec {
        dir: study.run_dir(1, "baseline"),
        seed: 1,
        batch_seed: 1,
        objective: CtcObjective::Ctc,
        init: None,
        max_steps: cfg.base_steps,
        eval_every: cfg.base_eval_every,
        patience: None,
        select_from: 0,
        keep_last: 0,
        schedule: Schedule::InverseSqrt {
            peak: cfg.common.lr,
            warmup: cfg.common.warmup,
        },
    };
    let base = study.train(&mut tracker, "pilot CTC baseline", BASELINE, &spec, &pairs)?;
    let control = study.finetune_run(&mut tracker, 1, CtcObjective::Ctc, &pairs)?;
    let bon2 = study.finetune_run(&mut tracker, 1, CtcObjective::Bon2 { mixing }, &pairs)?;
    let run = |s: &RunState<CtcObjective>| {
        json!({"objective": s.spec.objective.label(), "steps": s.step, "ms_per_step": s.ms_per_step(),
               "best_step": s.best_step, "best_dev_bleu": s.best_dev_bleu, "eval_seconds": s.eval_seconds,
               "dev_by_step": s.evals.iter().map(|e| json!([e.step, e.dev_bleu, e.train_loss])).collect::<Vec<_>>()})
    };
    let pilot = json!({"ratio": cfg.ratio, "distilled": distilled, "pairs_kept": pairs.len(), "dropped": dropped,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "runs": [run(&base), run(&control), run(&bon2)]});
    save_json(&pilot, &study.out.join("pilot.json"))?;
    tracker.progress.finish();
    println!("{}", serde_json::to_string_pretty(&pilot)?);
    Ok(())
}

/// Training sources the distillation pilot decodes at each `α` (`--distill-pilot`).
pub const DISTILL_PILOT_SOURCES: usize = 1500;
/// The distilled targets' length against the references that the pilot's choice must reach.
pub const DISTILL_TARGET_RATIO: f64 = 0.97;

/// The pilot of `--distill-pilot`: the teacher, then its beam search at each length penalty
/// `α` over a fixed sample of training sources (every k-th, so that the sample spans the
/// split) and over the dev set. Writes `distill_pilot.json` in the output folder: per `α`, the
/// sample's Σ|target| / Σ|reference| in subwords (the quantity the study reports for the full
/// distillation), the dev set's, the dev BLEU and the seconds; and the chosen `α`, the smallest
/// whose sample ratio reaches [`DISTILL_TARGET_RATIO`] (none when no `α` does). An earlier
/// pilot's rows for the same teacher and sample are kept, so that the grid can be extended.
fn run_distill_pilot(study: &Study, alphas: &[f64]) -> Result<()> {
    let teacher_steps = study.teacher_steps_left()?;
    let mut tracker = Tracker::open(&study.out, &[(TEACHER.to_string(), teacher_steps)])?;
    let translate_run = study.translate_run();
    let teacher_dir = study.cfg.teacher_dir();
    let setup = study.teacher_setup(&translate_run, &teacher_dir);
    let teacher = teacher(&setup, &mut tracker)?;
    let model = load_model(study.teacher, &teacher.weights, &study.device)?;
    let train = &study.data.train.ids;
    let every = train.len().div_ceil(DISTILL_PILOT_SOURCES).max(1);
    let sample: Vec<usize> = (0..train.len()).step_by(every).collect();
    let sample_sources: Vec<Vec<u32>> = sample.iter().map(|&i| train.src[i].clone()).collect();
    let total =
        |rows: &mut dyn Iterator<Item = &Vec<u32>>| rows.map(Vec::len).sum::<usize>() as f64;
    let sample_reference = total(&mut sample.iter().map(|&i| &train.tgt[i])).max(1.0);
    let dev = &study.data.dev;
    let dev_reference = total(&mut dev.ids.tgt.iter()).max(1.0);
    let specials = Specials {
        bos: BOS,
        eos: EOS,
        pad: PAD,
    };
    let mut rows = Vec::new();
    for &length_penalty in alphas {
        let started = Instant::now();
        let search = Search::Beam(BeamConfig {
            length_penalty,
            ..study.distill_beam
        });
        let sample_targets = decode_ids(&model, &sample_sources, specials, search, 100)?;
        let dev_targets = decode_ids(&model, &dev.ids.src, specials, search, 100)?;
        let dev_texts: Vec<String> = dev_targets
            .iter()
            .map(|t| study.data.bpe.decode(t))
            .collect::<Result<_>>()?;
        let dev_bleu = bleu(&dev_texts, &dev.references)?;
        let sample_ratio = total(&mut sample_targets.iter()) / sample_reference;
        let dev_ratio = total(&mut dev_targets.iter()) / dev_reference;
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "α = {length_penalty}: training sample {sample_ratio:.3}, dev {dev_ratio:.3} of the references' length; dev BLEU {dev_bleu:.2} ({seconds:.0} s)"
        );
        rows.push(
            json!({"length_penalty": length_penalty, "train_sample_ratio": sample_ratio,
            "dev_ratio": dev_ratio, "dev_bleu": dev_bleu, "seconds": seconds}),
        );
    }
    // Rows of an earlier pilot of the same teacher, beam and sample are kept (those of an α
    // measured again are replaced), so that a grid can be extended run by run.
    let path = study.out.join("distill_pilot.json");
    let mut commands = vec![std::env::args().collect::<Vec<_>>().join(" ")];
    if let Some(earlier) = load_json::<serde_json::Value>(&path)? {
        let same = earlier["teacher_sha256"] == json!(teacher.weights_sha256)
            && earlier["beam"] == json!(study.distill_beam.beam)
            && earlier["every"] == json!(every);
        if same {
            let measured: Vec<f64> = alphas.to_vec();
            for row in earlier["alphas"].as_array().into_iter().flatten() {
                let alpha = row["length_penalty"].as_f64().unwrap_or(f64::NAN);
                if !measured.contains(&alpha) {
                    rows.push(row.clone());
                }
            }
            let earlier_commands = earlier["commands"]
                .as_array()
                .cloned()
                .unwrap_or_else(|| vec![earlier["command"].clone()]);
            for command in earlier_commands {
                if let Some(command) = command.as_str() {
                    commands.insert(commands.len() - 1, command.to_string());
                }
            }
        }
    }
    rows.sort_by(|a, b| {
        let key = |r: &serde_json::Value| r["length_penalty"].as_f64().unwrap_or(f64::NAN);
        key(a).total_cmp(&key(b))
    });
    let chosen = rows
        .iter()
        .find(|r| r["train_sample_ratio"].as_f64().unwrap_or(0.0) >= DISTILL_TARGET_RATIO)
        .and_then(|r| r["length_penalty"].as_f64());
    let pilot = json!({"teacher": teacher.origin, "teacher_sha256": teacher.weights_sha256,
        "beam": study.distill_beam.beam, "train_sample": sample.len(), "every": every,
        "target_ratio": DISTILL_TARGET_RATIO, "chosen": chosen,
        "commands": commands, "alphas": rows});
    save_json(&pilot, &path)?;
    match chosen {
        Some(a) => println!("chosen: --distill-length-penalty {a}"),
        None => println!("no α of the list reaches a ratio of {DISTILL_TARGET_RATIO}"),
    }
    Ok(())
}

/// Runs the study `cfg` describes (see `docs/ctc_nat.md`).
pub fn run_study(mut cfg: Config) -> Result<()> {
    if cfg.common.quick {
        cfg.apply_quick();
    }
    cfg.check()?;
    let started = Instant::now();
    let study = Study::prepare(cfg)?;
    let cfg = &study.cfg;
    if let Some(distilled) = &cfg.pilot_distilled {
        return run_pilot(&study, distilled);
    }
    if !cfg.distill_pilot.is_empty() {
        return run_distill_pilot(&study, &cfg.distill_pilot);
    }

    let teacher_steps = study.teacher_steps_left()?;
    let distill_sources = if study.distillation_cached(teacher_steps)? {
        0
    } else {
        study.data.train.ids.len()
    };
    let (kinds, planned_minutes) = plan(cfg, distill_sources, teacher_steps);
    let total: f64 = planned_minutes.iter().map(|m| m.1).sum();
    println!(
        "plan: {} seeds, r = {}, baseline cap {} steps (selection from step {}), grid {}, fine-tunes {} steps; estimated from measured costs on 2 cores:",
        cfg.common.seeds,
        cfg.ratio,
        cfg.base_steps,
        cfg.select_from,
        cfg.grid().iter().map(CtcObjective::label).collect::<Vec<_>>().join(" "),
        cfg.common.finetune_steps
    );
    for (part, m) in &planned_minutes {
        println!("  {part:<36} {m:6.1} min");
    }
    println!("  {:<36} {total:6.1} min", "total");
    if cfg.plan_only {
        return Ok(());
    }
    let mut tracker = Tracker::open(&study.out, &kinds)?;
    for (kind, seconds) in step_estimates(cfg) {
        tracker.progress.estimate(&kind, seconds);
    }

    let mut costs: Vec<(String, f64)> = Vec::new();
    let part = Instant::now();
    let pairs = study.teacher_and_distillation(&mut tracker)?;
    costs.push((
        "teacher and distillation".into(),
        part.elapsed().as_secs_f64(),
    ));
    let part = Instant::now();
    let mut states = study.train_baselines(&mut tracker, &pairs.distilled)?;
    costs.push(("CTC baselines".into(), part.elapsed().as_secs_f64()));

    let part = Instant::now();
    let mut grid = Vec::new();
    for objective in cfg.grid() {
        let state = study.finetune_run(&mut tracker, 1, objective, &pairs.distilled)?;
        grid.push((objective, state.best_dev_bleu));
        states.insert((format!("grid:{}", objective.label()), 1), state);
    }
    let Some(bon2) = best_on_dev(&grid) else {
        bail!("internal: an empty λ grid")
    };
    let CtcObjective::Bon2 { mixing } = bon2 else {
        bail!("internal: the grid holds ctc+bon2 objectives only")
    };
    tracker.progress.println(&format!(
        "ctc+bon2 on seed 1's dev set: {} → {}",
        grid_text(&grid),
        bon2.label()
    ));
    costs.push(("λ grid (seed 1)".into(), part.elapsed().as_secs_f64()));
    let part = Instant::now();
    let mut objectives = vec![CtcObjective::Ctc, bon2];
    if !cfg.no_bleu4 {
        objectives.push(CtcObjective::Bleu4 { mixing });
    }
    if cfg.nmla {
        objectives.push(CtcObjective::Nmla2 { mixing });
    }
    for &seed in &study.seeds {
        for &objective in &objectives {
            let state = study.finetune_run(&mut tracker, seed, objective, &pairs.distilled)?;
            states.insert((objective.name().into(), seed), state);
        }
    }
    costs.push(("fine-tunes".into(), part.elapsed().as_secs_f64()));

    let part = Instant::now();
    tracker.progress.show("decoding the test set", true);
    let mut records = study.reference_points(&pairs.teacher)?;
    // Segment statistics by variant, then by (objective, seed); each run's blank-penalty grid.
    let mut segments: BTreeMap<String, BTreeMap<(String, u64), SegmentStats>> = BTreeMap::new();
    let mut blank_grids = Vec::new();
    for ((name, seed), state) in &states {
        if name.starts_with("grid:") {
            continue;
        }
        for (record, segs, tried) in study.test(name, state)? {
            if let Some(tried) = tried {
                blank_grids.push(json!({"objective": name, "seed": seed, "chosen": record.config,
                    "dev_bleu_by_delta": tried.iter().map(|(d, b)| json!([d, b])).collect::<Vec<_>>()}));
            }
            segments
                .entry(record.variant.clone())
                .or_default()
                .insert((name.clone(), *seed), segs);
            records.push(record);
        }
    }
    let speed = study.speed(&pairs.teacher)?;
    costs.push((
        "test decodes and speed".into(),
        part.elapsed().as_secs_f64(),
    ));

    let compared: Vec<&str> = objectives
        .iter()
        .map(CtcObjective::name)
        .filter(|o| *o != CONTROL)
        .collect();
    // The seed-level tests and the bootstraps, for each decoding variant.
    let mut tests = BTreeMap::new();
    let mut boot = BTreeMap::new();
    let comparison = Comparison {
        control: CONTROL,
        objectives: &compared,
        seeds: &study.seeds,
    };
    for (variant, segments) in &segments {
        tests.insert(
            variant.clone(),
            seed_level_tests_vs(&records, "distilled", variant, &comparison)?,
        );
        boot.insert(
            variant.clone(),
            bootstraps_vs(segments, &comparison, cfg.common.bootstrap)?,
        );
    }
    let summary = summary(&records);
    let names: Vec<&str> = std::iter::once("baseline")
        .chain(objectives.iter().map(CtcObjective::name))
        .collect();
    let mut table = String::new();
    for variant in [VARIANT, TUNED]
        .into_iter()
        .filter(|v| segments.contains_key(*v))
    {
        table.push_str(&render(
            &study,
            &pairs,
            &records,
            &summary,
            (variant, &tests[variant]),
            &names,
            &grid,
            &speed,
        ));
        table.push('\n');
    }
    let baselines: Vec<serde_json::Value> = states
        .iter()
        .filter(|((name, _), _)| name == "baseline")
        .map(|((_, seed), s)| {
            json!({"seed": seed, "steps": s.step, "best_step": s.best_step, "dev_bleu": s.best_dev_bleu,
                   "stopped_early": s.step < cfg.base_steps,
                   "dev_by_step": s.evals.iter().map(|e| json!([e.step, e.dev_bleu])).collect::<Vec<_>>()})
        })
        .collect();
    let mut averaging = Vec::new();
    for ((name, seed), state) in &states {
        if let Some(record) = load_json::<Averaging>(&state.spec.dir.join(AVERAGING))? {
            averaging.push(
                json!({"run": name, "seed": seed, "averaged_steps": record.steps,
                "dev_bleu": record.dev_bleu, "single_best_step": record.single_best_step,
                "single_best_dev_bleu": record.single_best_dev_bleu, "selected": record.selected}),
            );
        }
    }
    let results = json!({
        "study": "ctc_nat",
        "language": cfg.common.lang,
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "commit": option_env!("GIT_COMMIT"),
        "corpus": study.data.summary,
        "bpe_vocab": study.data.bpe.vocab_size(),
        "model": {"d_model": study.ctc.d_model, "layers": study.ctc.encoder_layers, "heads": study.ctc.heads, "d_ff": study.ctc.d_ff,
                  "dropout": study.ctc.dropout, "tied_embeddings": true, "ratio": cfg.ratio, "max_frames": study.ctc.max_len,
                  "blank": BLANK, "blank_token": "<s> (BOS; never an input or target of the NAT)"},
        "teacher": pairs.teacher,
        "teacher_recipe": format!("{:?}", cfg.recipe()),
        "distillation": {"pairs_kept": pairs.distilled.len(), "dropped_no_alignment_or_empty": pairs.dropped_distilled,
                         "target_length_ratio_subwords": pairs.target_length_ratio, "length_penalty": cfg.distill_length_penalty,
                         "raw_train_references_without_alignment": pairs.infeasible_raw,
                         "dev_references_beyond_frames": pairs.infeasible_dev, "test_references_beyond_frames": pairs.infeasible_test,
                         "beam": cfg.common.beam},
        "protocol": {"seeds": cfg.common.seeds, "batch_size": cfg.common.batch_size,
                     "baseline": {"objective": "ctc (mean)", "peak_lr": cfg.common.lr, "warmup": cfg.common.warmup, "step_cap": cfg.base_steps,
                                  "eval_every": cfg.base_eval_every, "patience": cfg.patience, "select_from": cfg.select_from},
                     "finetune": {"steps": cfg.common.finetune_steps, "eval_every": cfg.common.finetune_eval_every, "lr": cfg.common.finetune_lr},
                     "selection": "best dev BLEU, greedy CTC decoding; fine-tunes: the starting checkpoint included; with checkpoint averaging, the average of the last evaluations' weights when its dev BLEU is higher",
                     "variant": VARIANT},
        "baselines": baselines,
        "bon2_grid": grid.iter().map(|(o, d)| json!({"objective": o, "label": o.label(), "dev_bleu": d})).collect::<Vec<_>>(),
        "bon2": bon2,
        "runs": records,
        "summary": summary,
        "paired_t_vs_ctc": tests[VARIANT],
        "paired_bootstrap_vs_ctc": boot[VARIANT],
        "paired_t_vs_ctc_blank_tuned": tests.get(TUNED),
        "paired_bootstrap_vs_ctc_blank_tuned": boot.get(TUNED),
        "blank_penalties": {"grid": cfg.blank_penalties, "runs": blank_grids},
        "checkpoint_averaging": {"last": cfg.average_last, "runs": averaging},
        "speed": speed,
        "costs_seconds": costs.iter().map(|(p, s)| json!({"part": p, "seconds": s})).collect::<Vec<_>>(),
        "planned_minutes": planned_minutes.iter().map(|(p, m)| json!({"part": p, "minutes": m})).collect::<Vec<_>>(),
        "seconds": started.elapsed().as_secs_f64(),
        "threads": std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| format!("default ({})", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))),
    });
    save_json(&results, &study.out.join("results.json"))?;
    std::fs::write(study.out.join("table.md"), &table)?;
    tracker.progress.finish();
    println!("\n{table}");
    println!(
        "total {}; outputs in {}",
        format_duration(started.elapsed().as_secs_f64()),
        study.out.display()
    );
    Ok(())
}

/// table.md: the CTC NAT's objectives (mean ± sd over seeds, Δ vs `ctc` with the seed-level
/// test), the reference points, the grid, the speed and the dropped pairs.
#[allow(clippy::too_many_arguments)]
fn render(
    study: &Study,
    pairs: &TrainingPairs,
    records: &[NatRecord],
    summary: &serde_json::Value,
    (variant, tests): (&str, &serde_json::Value),
    names: &[&str],
    grid: &[(CtcObjective, f64)],
    speed: &[serde_json::Value],
) -> String {
    let decoding = match variant {
        TUNED => "greedy CTC decoding with each run's dev-best blank penalty",
        _ => "greedy CTC decoding",
    };
    let mut t = format!(
        "Test set; CTC NAT (r = {}) outputs by {decoding} (`{variant}`); mean ± sd over seeds; Δ vs `ctc` with the seed-level paired t-test, Holm's correction and the difference detectable at 80 % power.\n\n",
        study.cfg.ratio
    );
    t.push_str("| distilled | BLEU | Δ BLEU vs ctc | chrF | Δ chrF vs ctc | length ratio | BLEU / BP | repeated tokens |\n|---|---|---|---|---|---|---|---|\n");
    for o in names {
        let row = find(summary, "distilled", o, variant);
        let _ = writeln!(
            t,
            "| {o} | {} | {} | {} | {} | {} | {} | {} |",
            mean_sd_text(row, "test_bleu", 2),
            delta_text(tests, "test_bleu", o),
            mean_sd_text(row, "test_chrf", 2),
            delta_text(tests, "test_chrf", o),
            mean_sd_text(row, "test_length_ratio", 3),
            mean_sd_text(row, "test_bleu_without_bp", 2),
            mean_sd_text(row, "repetition_share", 3),
        );
    }
    if variant == TUNED {
        let deltas: Vec<String> = records
            .iter()
            .filter(|r| r.variant == TUNED)
            .map(|r| format!("{} seed {}: {}", r.objective, r.seed, r.config))
            .collect();
        let _ = writeln!(t, "\nchosen on dev: {}", deltas.join("; "));
        return t; // the reference points, the grid and the speed are in the `greedy` table
    }
    t.push('\n');
    for r in records.iter().filter(|r| r.condition != "distilled") {
        let _ = writeln!(
            t,
            "{} {} ({}): BLEU {:.2}, chrF {:.2}, length ratio {:.3}  ",
            r.objective, r.variant, r.config, r.test_bleu, r.test_chrf, r.test_length_ratio
        );
    }
    let _ = write!(
        t,
        "\nctc+bon2 on seed 1's dev set (BLEU, greedy): {}\n\nspeed (sentences/s):",
        grid_text(grid)
    );
    for s in speed {
        let _ = write!(
            t,
            " {} {} batch {}: {:.1};",
            s["model"].as_str().unwrap_or(""),
            s["search"].as_str().unwrap_or(""),
            s["batch"],
            s["sentences_per_second"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let _ = writeln!(
        t,
        "\n\ndistilled training pairs: {} kept, {} left out (no CTC alignment in {}·S frames, or empty); references beyond their frames: raw train {}, dev {}, test {}",
        pairs.distilled.len(),
        pairs.dropped_distilled,
        study.cfg.ratio,
        pairs.infeasible_raw,
        pairs.infeasible_dev,
        pairs.infeasible_test
    );
    t
}
