//! The NAT study's driver ([`run_study`]) and its phases; `docs/nat.md` describes the design.

use anyhow::{bail, Result};
use candle_bleu::loss::{CrossEntropyConfig, HiddenConfig};
use candle_core::Device;
use candle_nn::VarMap;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::batches::{clipped_share, make_nat_batch, non_empty};
use super::config::Config;
use super::decode::{
    decode_nat, length_accuracy, repetition_share, timed, Decoded, LengthBeam, Variant,
};
use super::files::write_lines_gz;
use super::objective::{step_loss, NatObjective, StepSettings};
use super::plan::{plan, step_estimates, PartMinutes};
use super::report::{bootstraps, render_condition, seed_level_tests, summary, NatRecord};
use super::teacher::{teacher_and_distilled, Teacher, TeacherSetup};
use crate::checkpoint::save_json;
use crate::cli::CatalogueStudyArgs;
use crate::data::PAD;
use crate::decode::BeamConfig;
use crate::model::nat::Nat;
use crate::model::transformer::{Dropout, PositionAdd, TransformerConfig};
use crate::progress::format_duration;
use crate::stats::best_on_dev;
use crate::translate::batches::{Batches, IdPairs};
use crate::translate::data::{prepare, DataConfig, StudyData};
use crate::translate::evaluate::{
    bleu, decode_ids, score, segment_stats, Search, SegmentStats, TextScores, BLEU_SIGNATURE,
    CHRF_SIGNATURE,
};
use crate::translate::run::{
    best_weights, load_model, mix, train_run, RunFunctions, RunSpec, RunState, Schedule,
};
use crate::translate::track::Tracker;

/// The longest source or target, in subwords with BOS and EOS (the models' positions).
pub const MAX_LEN: usize = 128;

/// The NAT setting the whole study shares.
struct Study {
    cfg: Config,
    data: StudyData,
    /// The NAT's sizes, and the teacher's.
    nat: TransformerConfig,
    device: Device,
    /// results.json, table.md, log.csv, the outputs and the distilled targets.
    out: PathBuf,
    /// The checkpoints.
    work: PathBuf,
    settings: StepSettings,
    /// Seeds on the distilled data.
    seeds: Vec<u64>,
    /// Seeds on the raw references.
    raw_seeds: Vec<u64>,
    /// The teacher's beam (distillation and test decode).
    beam: BeamConfig,
}

/// A test decode of one NAT: the records of its variants and the segments of its primary one.
struct Tested {
    records: Vec<NatRecord>,
    primary_segments: SegmentStats,
}

impl Study {
    fn load(&self, weights: &Path) -> Result<Nat> {
        let mut varmap = VarMap::new();
        let model = Nat::new(self.nat, &varmap, 0, &self.device)?;
        crate::checkpoint::load_vars(&mut varmap, weights)?;
        Ok(model)
    }

    fn detok(&self, ids: &[u32]) -> String {
        self.data.bpe.decode(ids).unwrap_or_default()
    }

    /// Dev BLEU of `model`: length beam 1, duplicates removed (cheap; the selection criterion).
    fn dev_bleu(&self, model: &Nat) -> Result<f64> {
        let decoded = decode_nat(
            model,
            &self.data.dev.ids.src,
            None,
            LengthBeam {
                k: 1,
                batch: 128,
                pad: PAD,
            },
            &self.device,
        )?;
        let dedup = Variant {
            length_beam: Some(1),
            dedup: true,
        };
        let hyps: Vec<String> = decoded
            .iter()
            .map(|d| self.detok(&dedup.tokens(d)))
            .collect();
        bleu(&hyps, &self.data.dev.references)
    }

    /// Trains (or resumes, or loads) one NAT run on `pairs`.
    fn train(
        &self,
        tracker: &mut Tracker,
        label: &str,
        kind: &str,
        spec: &RunSpec<NatObjective>,
        pairs: &IdPairs,
    ) -> Result<RunState<NatObjective>> {
        let mut varmap = VarMap::new();
        let model = Nat::new(self.nat, &varmap, spec.seed, &self.device)?;
        let batches = Batches::new(pairs, self.cfg.common.batch_size, spec.batch_seed)?;
        let dev = || self.dev_bleu(&model);
        let mut step = |indices: &[usize], step: usize| {
            let batch = make_nat_batch(pairs, indices, PAD, &self.device)?;
            let mut dropout = Dropout::new(self.nat.dropout, mix(spec.seed, 1, step));
            step_loss(&model, &batch, spec.objective, &self.settings, &mut dropout)
        };
        tracker.train(label, kind, spec, |on_step| {
            let functions = RunFunctions {
                step_loss: &mut step,
                dev_bleu: &dev,
            };
            train_run(spec, &mut varmap, &batches, functions, on_step)
        })
    }

    /// Decodes the test set with `weights`, writes every variant's hypotheses and scores them.
    fn test(
        &self,
        weights: &Path,
        name: &str,
        state: &RunState<NatObjective>,
        condition: &str,
    ) -> Result<Tested> {
        let model = self.load(weights)?;
        let test = &self.data.test;
        let ref_lengths: Vec<usize> = test.ids.tgt.iter().map(Vec::len).collect();
        let decoded: Vec<Decoded> = decode_nat(
            &model,
            &test.ids.src,
            Some(&ref_lengths),
            LengthBeam {
                k: self.cfg.length_beam,
                batch: 64,
                pad: PAD,
            },
            &self.device,
        )?;
        let accuracy = length_accuracy(&decoded, &ref_lengths);
        let mut records = Vec::new();
        let mut primary_segments = None;
        for variant in Variant::all(&self.cfg.beams()) {
            let tokens: Vec<Vec<u32>> = decoded.iter().map(|d| variant.tokens(d)).collect();
            let hyps: Vec<String> = tokens.iter().map(|t| self.detok(t)).collect();
            let file = format!(
                "test.{condition}.{name}.seed{}.{}.hyp.gz",
                state.spec.seed,
                variant.name()
            );
            write_lines_gz(&self.out.join(&file), &hyps)?;
            let scores = score(&hyps, &test.references)?;
            if variant == Variant::PRIMARY {
                primary_segments = Some(segment_stats(&hyps, &test.references)?);
            }
            records.push(NatRecord {
                objective: name.to_string(),
                condition: condition.to_string(),
                variant: variant.name(),
                length_beam: Some(
                    variant
                        .length_beam
                        .map_or("oracle".into(), |l| l.to_string()),
                ),
                dedup: variant.dedup,
                seed: state.spec.seed,
                config: state.spec.objective.label(),
                dev_bleu: state.best_dev_bleu,
                best_step: state.best_step,
                steps: state.step,
                repetition_share: repetition_share(&tokens),
                length_accuracy: Some(accuracy.exact),
                ..record_scores(
                    &scores,
                    file,
                    state.ms_per_step(),
                    state.train_seconds,
                    state.eval_seconds,
                )
            });
        }
        Ok(Tested {
            records,
            primary_segments: primary_segments.expect("the primary variant is among all variants"),
        })
    }
}

/// A record with `scores` and the files, the rest to be filled (shared with the CTC NAT study).
pub fn record_scores(
    scores: &TextScores,
    file: String,
    ms_per_step: f64,
    train_seconds: f64,
    eval_seconds: f64,
) -> NatRecord {
    NatRecord {
        objective: String::new(),
        condition: String::new(),
        variant: String::new(),
        length_beam: None,
        dedup: false,
        seed: 1,
        config: String::new(),
        dev_bleu: f64::NAN,
        best_step: 0,
        steps: 0,
        test_bleu: scores.bleu,
        test_chrf: scores.chrf,
        test_chrf_pp: scores.chrf_pp,
        test_bleu_without_bp: scores.bleu_without_bp,
        test_length_ratio: scores.length_ratio,
        repetition_share: 0.0,
        length_accuracy: None,
        test_hyp: file,
        test_ref: "test.ref.gz".into(),
        bleu_signature: BLEU_SIGNATURE.into(),
        chrf_signature: CHRF_SIGNATURE.into(),
        ms_per_step,
        train_seconds,
        eval_seconds,
    }
}

/// The teacher and the training pairs it gives: the distilled targets and the raw (human)
/// references, each without the pairs whose target is empty.
struct TrainingPairs {
    teacher: Teacher,
    distilled: IdPairs,
    /// Distilled outputs left out for being empty.
    empty_distilled: usize,
    raw: IdPairs,
    /// Raw references left out for being empty.
    empty_raw: usize,
}

/// Every run's state by (condition, name, seed); seed 1's bon2 grid runs are named
/// `grid:<label>`.
type States = BTreeMap<(String, String, u64), RunState<NatObjective>>;

/// The test decodes: a record per model and variant, the primary variant's segment
/// statistics by condition and (objective, seed), and the teacher's scores.
struct TestResults {
    records: Vec<NatRecord>,
    segments: BTreeMap<String, BTreeMap<(String, u64), SegmentStats>>,
    teacher_scores: TextScores,
}

/// What the study measured, for the report.
struct Finished {
    pairs: TrainingPairs,
    states: States,
    /// bon2's form and mixing on seed 1's dev set: (objective, dev BLEU).
    grid: Vec<(NatObjective, f64)>,
    bon2: NatObjective,
    /// The fine-tuning objectives: `ce`, the chosen bon2, and bleu4 unless left out.
    objectives: Vec<NatObjective>,
    tested: TestResults,
    speed: Vec<serde_json::Value>,
    /// Seconds per part of the study.
    costs: Vec<(String, f64)>,
    /// The plan's estimated minutes per part.
    planned_minutes: Vec<PartMinutes>,
}

/// What a study on the catalogue corpus starts from (the NAT study and the CTC NAT study):
/// its device, output and checkpoint folders, the corpus with its BPE model (and
/// `test.ref.gz` written), and the NAT's sizes, which are the teacher's.
pub struct StudySetting {
    /// The device the study trains on (`--cpu` forces the CPU).
    pub device: Device,
    /// The results folder.
    pub out: PathBuf,
    /// The checkpoints' folder.
    pub work: PathBuf,
    /// The corpus, its splits and BPE model.
    pub data: StudyData,
    /// The NAT's sizes (the teacher's).
    pub model: TransformerConfig,
}

/// The setting of a study with `common`'s arguments in `out` and `work`: unless `keep`, an
/// earlier study's checkpoints (`work`) and log are removed.
pub fn study_setting(
    common: &CatalogueStudyArgs,
    out: PathBuf,
    work: PathBuf,
    keep: bool,
) -> Result<StudySetting> {
    let device = crate::device::device(common.cpu);
    if work.exists() && !keep {
        println!(
            "{} holds an earlier study: starting over (use --resume to continue it)",
            work.display()
        );
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&work)?;
    if !keep {
        // The log of an earlier study would mix with this one's.
        let _ = std::fs::remove_file(out.join("log.csv"));
    }
    let data = prepare(
        &DataConfig {
            catalogs: &common.catalogs,
            lang: &common.lang,
            bpe_vocab: common.bpe_vocab,
            quick: common.quick,
            max_len: MAX_LEN,
        },
        &out,
    )?;
    write_lines_gz(&out.join("test.ref.gz"), &data.test.references)?;
    let vocab = data.bpe.vocab_size();
    let model = TransformerConfig {
        src_vocab: vocab,
        tgt_vocab: vocab,
        d_model: common.d_model,
        heads: 4,
        d_ff: 4 * common.d_model,
        encoder_layers: common.layers,
        decoder_layers: common.layers,
        max_len: MAX_LEN,
        dropout: common.dropout,
        tie_all: true,
        positions: PositionAdd::Broadcast,
    };
    Ok(StudySetting {
        device,
        out,
        work,
        data,
        model,
    })
}

impl Study {
    /// The setting of `cfg`: the output and checkpoint folders (an earlier study's checkpoints
    /// and log are removed unless resuming), the corpus and its BPE model, `test.ref.gz`, the
    /// model's sizes.
    fn prepare(cfg: Config) -> Result<Self> {
        let common = &cfg.common;
        let StudySetting {
            device,
            out,
            work,
            data,
            model: nat,
        } = study_setting(common, cfg.out_dir(), cfg.work_dir(), common.resume)?;
        Ok(Self {
            settings: StepSettings {
                cross_entropy: CrossEntropyConfig {
                    pad_id: Some(PAD),
                    label_smoothing: common.label_smoothing,
                    ..Default::default()
                },
                hidden: HiddenConfig::default(),
                pad: PAD,
            },
            seeds: (1..=common.seeds).collect(),
            raw_seeds: (1..=cfg.raw_seeds).collect(),
            beam: BeamConfig {
                beam: common.beam,
                ..BeamConfig::default()
            },
            cfg,
            data,
            nat,
            device,
            out,
            work,
        })
    }

    /// The checkpoints of run `name` of `seed` in `condition`.
    fn run_dir(&self, condition: &str, seed: u64, name: &str) -> PathBuf {
        self.work
            .join(condition)
            .join(format!("seed{seed}"))
            .join(name)
    }

    /// Both conditions: their name, training pairs and seeds.
    fn conditions<'a>(
        &'a self,
        pairs: &'a TrainingPairs,
    ) -> [(&'static str, &'a IdPairs, &'a [u64]); 2] {
        [
            ("distilled", &pairs.distilled, &self.seeds),
            ("raw", &pairs.raw, &self.raw_seeds),
        ]
    }

    /// Part 1: The teacher (reused from `translate_run` when it matches, else trained) and the
    /// distilled targets.
    fn teacher_and_distillation(
        &self,
        tracker: &mut Tracker,
        translate_run: &Path,
    ) -> Result<TrainingPairs> {
        let setup = TeacherSetup {
            config: self.nat,
            recipe: self.cfg.recipe(),
            data: &self.data,
            translate_run: Some(translate_run),
            out: &self.out,
            work: &self.work,
            beam: self.beam,
            device: &self.device,
        };
        let (teacher, distilled) = teacher_and_distilled(&setup, tracker)?;
        let (distilled, empty_distilled) = non_empty(distilled);
        let (raw, empty_raw) = non_empty(self.data.train.ids.clone());
        tracker.progress.println(&format!(
            "distilled targets: {} pairs ({empty_distilled} empty outputs left out); length offsets clipped: distilled {:.2} %, raw {:.2} %",
            distilled.len(), 100.0 * clipped_share(&distilled), 100.0 * clipped_share(&raw)
        ));
        Ok(TrainingPairs {
            teacher,
            distilled,
            empty_distilled,
            raw,
            empty_raw,
        })
    }

    /// Part 2: NAT baselines: label-smoothed CE until dev BLEU stops improving.
    fn train_baselines(&self, tracker: &mut Tracker, pairs: &TrainingPairs) -> Result<States> {
        let cfg = &self.cfg;
        let mut states = States::new();
        for (condition, pairs, condition_seeds) in self.conditions(pairs) {
            for &seed in condition_seeds {
                let spec = RunSpec {
                    dir: self.run_dir(condition, seed, "baseline"),
                    seed,
                    batch_seed: seed,
                    objective: NatObjective::Ce,
                    init: None,
                    max_steps: cfg.base_steps,
                    eval_every: cfg.base_eval_every,
                    patience: Some(cfg.patience),
                    select_from: 0,
                    keep_last: 0,
                    schedule: Schedule::InverseSqrt {
                        peak: cfg.common.lr,
                        warmup: cfg.common.warmup,
                    },
                };
                let label = format!("{condition} seed {seed} NAT baseline");
                let state = self.train(tracker, &label, "nat baseline", &spec, pairs)?;
                states.insert((condition.to_string(), "baseline".into(), seed), state);
            }
        }
        Ok(states)
    }

    /// A fine-tuning run of `objective` from the best weights of `seed`'s baseline.
    fn finetune(
        &self,
        condition: &str,
        seed: u64,
        objective: NatObjective,
    ) -> RunSpec<NatObjective> {
        let common = &self.cfg.common;
        RunSpec {
            dir: self.run_dir(condition, seed, &objective.label()),
            seed,
            // Every objective of a seed sees the same batches and dropout masks (a paired design).
            batch_seed: seed.wrapping_mul(1000) + 7,
            objective,
            init: Some(best_weights(&self.run_dir(condition, seed, "baseline"))),
            max_steps: common.finetune_steps,
            eval_every: common.finetune_eval_every,
            patience: None,
            select_from: 0,
            keep_last: 0,
            schedule: Schedule::Constant(common.finetune_lr),
        }
    }

    /// Part 3: bon2's form and mixing on seed 1's dev set (distilled): each grid run's dev BLEU;
    /// the runs join `states`.
    fn tune_bon2(
        &self,
        tracker: &mut Tracker,
        distilled: &IdPairs,
        states: &mut States,
    ) -> Result<Vec<(NatObjective, f64)>> {
        let mut grid = Vec::new();
        for objective in self.cfg.grid() {
            let spec = self.finetune("distilled", 1, objective);
            let label = format!("distilled seed 1 {}", objective.label());
            let state = self.train(tracker, &label, kind(&objective), &spec, distilled)?;
            grid.push((objective, state.best_dev_bleu));
            states.insert(
                ("distilled".into(), format!("grid:{}", objective.label()), 1),
                state,
            );
        }
        Ok(grid)
    }

    /// Part 4: Every objective from each seed's baseline (bleu4 on the distilled data only).
    fn train_fine_tunes(
        &self,
        tracker: &mut Tracker,
        pairs: &TrainingPairs,
        objectives: &[NatObjective],
        states: &mut States,
    ) -> Result<()> {
        for (condition, pairs, condition_seeds) in self.conditions(pairs) {
            for &seed in condition_seeds {
                for objective in objectives {
                    if condition == "raw" && matches!(objective, NatObjective::Bleu4 { .. }) {
                        continue;
                    }
                    let spec = self.finetune(condition, seed, *objective);
                    let label = format!("{condition} seed {seed} {}", objective.label());
                    let state = self.train(tracker, &label, kind(objective), &spec, pairs)?;
                    states.insert(
                        (condition.to_string(), objective.name().into(), seed),
                        state,
                    );
                }
            }
        }
        Ok(())
    }

    /// Part 5: Test decodes: the teacher (beam), every NAT in every variant.
    fn test_all(
        &self,
        tracker: &mut Tracker,
        teacher: &Teacher,
        states: &States,
    ) -> Result<TestResults> {
        tracker.progress.show("decoding the test set", true);
        let test = &self.data.test;
        let teacher_model = load_model(self.nat, &teacher.weights, &self.device)?;
        let ids = decode_ids(
            &teacher_model,
            &test.ids.src,
            specials(),
            Search::Beam(self.beam),
            100,
        )?;
        let teacher_hyps: Vec<String> = ids.iter().map(|i| self.detok(i)).collect();
        write_lines_gz(&self.out.join("test.teacher.hyp.gz"), &teacher_hyps)?;
        let teacher_scores = score(&teacher_hyps, &test.references)?;
        let mut records = vec![NatRecord {
            objective: "teacher".into(),
            condition: "ar".into(),
            variant: format!("beam{}", self.cfg.common.beam),
            config: teacher.origin.clone(),
            dev_bleu: teacher.dev_bleu,
            ..record_scores(
                &teacher_scores,
                "test.teacher.hyp.gz".into(),
                f64::NAN,
                0.0,
                0.0,
            )
        }];
        let mut segments: BTreeMap<String, BTreeMap<(String, u64), _>> = BTreeMap::new();
        for ((condition, name, seed), state) in states {
            if name.starts_with("grid:") {
                continue;
            }
            let tested = self.test(&best_weights(&state.spec.dir), name, state, condition)?;
            records.extend(tested.records);
            segments
                .entry(condition.clone())
                .or_default()
                .insert((name.clone(), *seed), tested.primary_segments);
        }
        Ok(TestResults {
            records,
            segments,
            teacher_scores,
        })
    }

    /// Part 6: Speed: seed 1's distilled NAT baseline and the teacher, the same threads, in this
    /// process, on the test set at batch 64 and on `--speed-sentences` at batch 1.
    fn speed(&self, teacher: &Teacher) -> Result<Vec<serde_json::Value>> {
        let cfg = &self.cfg;
        let sources = &self.data.test.ids.src;
        let nat_model = self.load(&best_weights(&self.run_dir("distilled", 1, "baseline")))?;
        let teacher_model = load_model(self.nat, &teacher.weights, &self.device)?;
        let few = cfg.speed_sentences.min(sources.len());
        let mut speed = Vec::new();
        for (batch, sources) in [(64usize, &sources[..]), (1, &sources[..few])] {
            for l in [1, cfg.length_beam] {
                let (seconds, per_second) = timed(sources.len(), || {
                    let search = LengthBeam {
                        k: l,
                        batch,
                        pad: PAD,
                    };
                    decode_nat(&nat_model, sources, None, search, &self.device).map(|_| ())
                })?;
                speed.push(json!({"model": "nat", "search": format!("length beam {l}"), "batch": batch, "sentences": sources.len(), "seconds": seconds, "sentences_per_second": per_second}));
            }
            for (search, label) in [
                (Search::Greedy, "greedy".to_string()),
                (Search::Beam(self.beam), format!("beam {}", cfg.common.beam)),
            ] {
                let (seconds, per_second) = timed(sources.len(), || {
                    decode_ids(&teacher_model, sources, specials(), search, batch).map(|_| ())
                })?;
                speed.push(json!({"model": "ar", "search": label, "batch": batch, "sentences": sources.len(), "seconds": seconds, "sentences_per_second": per_second}));
            }
        }
        Ok(speed)
    }
}

/// The progress plan's kind of a fine-tuning run of `objective`.
fn kind(objective: &NatObjective) -> &'static str {
    if *objective == NatObjective::Ce {
        "nat ce"
    } else {
        "nat bleu"
    }
}

/// Runs the study `cfg` describes (see `docs/nat.md`).
pub fn run_study(mut cfg: Config) -> Result<()> {
    if cfg.common.quick {
        cfg.apply_quick();
    }
    cfg.check()?;
    let started = Instant::now();
    let study = Study::prepare(cfg)?;
    let translate_run = study.cfg.translate_run_dir();

    // The plan and its estimate.
    let teacher_reused = translate_run.join("runs/seed1/ce/state.json").exists();
    let (kinds, planned_minutes) = plan(&study.cfg, study.data.train.ids.len(), teacher_reused);
    let total: f64 = planned_minutes.iter().map(|m| m.1).sum();
    println!("plan (estimated from translate's measured costs on 2 cores):");
    for (part, m) in &planned_minutes {
        println!("  {part:<32} {m:6.1} min");
    }
    println!("  {:<32} {total:6.1} min", "total");
    let mut tracker = Tracker::open(&study.out, &kinds)?;
    for (kind, seconds) in step_estimates() {
        tracker.progress.estimate(&kind, seconds);
    }

    let mut costs = Vec::new();
    let part = Instant::now();
    let pairs = study.teacher_and_distillation(&mut tracker, &translate_run)?;
    costs.push((
        "teacher and distillation".to_string(),
        part.elapsed().as_secs_f64(),
    ));
    let part = Instant::now();
    let mut states = study.train_baselines(&mut tracker, &pairs)?;
    costs.push(("NAT baselines".into(), part.elapsed().as_secs_f64()));
    let part = Instant::now();
    let grid = study.tune_bon2(&mut tracker, &pairs.distilled, &mut states)?;
    let Some(bon2) = best_on_dev(&grid) else {
        bail!("internal: an empty λ grid")
    };
    let NatObjective::Bon2 { mixing, .. } = bon2 else {
        bail!("internal: the grid holds bon2 objectives only")
    };
    tracker.progress.println(&format!(
        "bon2 on seed 1's dev set: {} → {}",
        grid_text(&grid),
        bon2.label()
    ));
    costs.push(("bon2 grid (seed 1)".into(), part.elapsed().as_secs_f64()));
    let part = Instant::now();
    let mut objectives = vec![NatObjective::Ce, bon2];
    if !study.cfg.no_bleu4 {
        objectives.push(NatObjective::Bleu4 { mixing });
    }
    study.train_fine_tunes(&mut tracker, &pairs, &objectives, &mut states)?;
    costs.push(("fine-tunes".into(), part.elapsed().as_secs_f64()));
    let part = Instant::now();
    let tested = study.test_all(&mut tracker, &pairs.teacher, &states)?;
    let speed = study.speed(&pairs.teacher)?;
    costs.push((
        "test decodes and speed".into(),
        part.elapsed().as_secs_f64(),
    ));

    let finished = Finished {
        pairs,
        states,
        grid,
        bon2,
        objectives,
        tested,
        speed,
        costs,
        planned_minutes,
    };
    let (results, table) = study.results(&finished, started)?;
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

/// `label dev-BLEU` of every grid run.
fn grid_text(grid: &[(NatObjective, f64)]) -> String {
    grid.iter()
        .map(|(o, d)| format!("{} {d:.2}", o.label()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Study {
    /// Part 7: statistics, table and results.json of `finished`; `started`: when the study
    /// started.
    fn results(
        &self,
        finished: &Finished,
        started: Instant,
    ) -> Result<(serde_json::Value, String)> {
        let (cfg, data, nat) = (&self.cfg, &self.data, &self.nat);
        let (seeds, raw_seeds) = (&self.seeds, &self.raw_seeds);
        let Finished {
            pairs,
            states,
            grid,
            bon2,
            objectives,
            tested,
            speed,
            costs,
            planned_minutes,
        } = finished;
        let TestResults {
            records,
            segments,
            teacher_scores,
        } = tested;
        let teacher = &pairs.teacher;
        let primary = Variant::PRIMARY.name();
        let compared: Vec<&str> = objectives
            .iter()
            .map(NatObjective::name)
            .filter(|o| *o != "ce")
            .collect();
        let mut tests = serde_json::Map::new();
        for variant in Variant::all(&cfg.beams()) {
            tests.insert(
                variant.name(),
                seed_level_tests(records, "distilled", &variant.name(), &compared, seeds)?,
            );
        }
        let raw_tests = if raw_seeds.len() >= 2 {
            seed_level_tests(records, "raw", &primary, &["bon2"], raw_seeds)?
        } else {
            json!(null)
        };
        let boot = json!({
            "distilled": bootstraps(&segments["distilled"], &compared, seeds, cfg.common.bootstrap)?,
            "raw": segments.get("raw").map(|s| bootstraps(s, &["bon2"], raw_seeds, cfg.common.bootstrap)).transpose()?,
        });
        let summary = summary(records);
        let mut table = format!(
            "Test set; NAT outputs at length beam {} with consecutive duplicates removed unless stated; mean ± sd over seeds; Δ vs `ce` with the seed-level paired t-test, Holm's correction and the difference detectable at 80 % power.\n\nteacher ({}): BLEU {:.2}, chrF {:.2}, length ratio {:.3}\n\n",
            cfg.length_beam, teacher.origin, teacher_scores.bleu, teacher_scores.chrf, teacher_scores.length_ratio
        );
        let names: Vec<&str> = std::iter::once("baseline")
            .chain(objectives.iter().map(NatObjective::name))
            .collect();
        table.push_str(&render_condition(
            &summary,
            &tests[&primary],
            "distilled",
            &names,
            &primary,
        ));
        table.push('\n');
        table.push_str(&render_condition(
            &summary,
            &raw_tests,
            "raw",
            &["baseline", "ce", "bon2"],
            &primary,
        ));
        table.push_str("\nbon2 on seed 1's dev set (BLEU, length beam 1, dedup): ");
        table.push_str(&grid_text(grid));
        table.push_str("\n\nspeed (sentences/s):");
        for s in speed.iter() {
            table.push_str(&format!(
                " {} {} batch {}: {:.1};",
                s["model"].as_str().unwrap_or(""),
                s["search"].as_str().unwrap_or(""),
                s["batch"],
                s["sentences_per_second"].as_f64().unwrap_or(f64::NAN)
            ));
        }
        table.push('\n');
        let baselines: Vec<serde_json::Value> = states
            .iter()
            .filter(|((_, name, _), _)| name == "baseline")
            .map(|((condition, _, seed), s)| {
                let last_two: Vec<f64> = s.evals.iter().rev().take(2).map(|e| e.dev_bleu).collect();
                let rising = s.step >= cfg.base_steps && last_two.len() == 2 && last_two[0] > last_two[1];
                json!({"condition": condition, "seed": seed, "steps": s.step, "best_step": s.best_step, "dev_bleu": s.best_dev_bleu,
                       "stopped_early": s.step < cfg.base_steps, "dev_still_rising_at_cap": rising})
            })
            .collect();
        let results = json!({
            "study": "nat",
            "language": cfg.common.lang,
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "commit": option_env!("GIT_COMMIT"),
            "corpus": data.summary,
            "bpe_vocab": data.bpe.vocab_size(),
            "model": {"d_model": nat.d_model, "layers": nat.encoder_layers, "heads": nat.heads, "d_ff": nat.d_ff, "dropout": nat.dropout,
                      "tied_embeddings": true, "max_len": MAX_LEN, "length_classes": "T - S in [-20, 20]", "length_loss_weight": super::objective::LENGTH_LOSS_WEIGHT},
            "teacher": teacher,
            "distillation": {"pairs": pairs.distilled.len(), "empty_outputs_left_out": pairs.empty_distilled, "raw_empty_left_out": pairs.empty_raw,
                             "clipped_offsets_distilled": clipped_share(&pairs.distilled), "clipped_offsets_raw": clipped_share(&pairs.raw), "beam": cfg.common.beam},
            "protocol": {"seeds": cfg.common.seeds, "raw_seeds": cfg.raw_seeds, "batch_size": cfg.common.batch_size, "label_smoothing": cfg.common.label_smoothing,
                         "baseline": {"peak_lr": cfg.common.lr, "warmup": cfg.common.warmup, "step_cap": cfg.base_steps, "eval_every": cfg.base_eval_every, "patience": cfg.patience},
                         "finetune": {"steps": cfg.common.finetune_steps, "eval_every": cfg.common.finetune_eval_every, "lr": cfg.common.finetune_lr},
                         "selection": "best dev BLEU at length beam 1, duplicates removed; the starting checkpoint included",
                         "primary_variant": primary, "length_beams": cfg.beams()},
            "baselines": baselines,
            "bon2_grid": grid.iter().map(|(o, d)| json!({"objective": o, "label": o.label(), "dev_bleu": d})).collect::<Vec<_>>(),
            "bon2": bon2,
            "runs": records,
            "summary": summary,
            "paired_t_vs_ce": tests,
            "paired_t_vs_ce_raw": raw_tests,
            "paired_bootstrap_vs_ce": boot,
            "speed": speed,
            "costs_seconds": costs.iter().map(|(p, s)| json!({"part": p, "seconds": s})).collect::<Vec<_>>(),
            "planned_minutes": planned_minutes.iter().map(|(p, m)| json!({"part": p, "minutes": m})).collect::<Vec<_>>(),
            "seconds": started.elapsed().as_secs_f64(),
            "threads": std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| format!("default ({})", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))),
        });
        Ok((results, table))
    }
}

fn specials() -> crate::decode::Specials {
    crate::decode::Specials {
        bos: crate::data::BOS,
        eos: crate::data::EOS,
        pad: PAD,
    }
}
