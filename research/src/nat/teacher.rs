//! The autoregressive teacher of sequence-level distillation (Kim & Rush 2016): the translate
//! study's recipe, reused from a finished translate run when it was trained on the same corpus
//! and subwords, else trained here; and its beam-5 translations of the training sources,
//! cached with their SHA-256.

use anyhow::{Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::files::{file_sha256, join_lines, read_lines_gz, sha256_hex, write_lines_gz};
use crate::checkpoint::{load_json, save_json};
use crate::data::{BOS, EOS, PAD};
use crate::decode::{BeamConfig, Specials};
use crate::model::transformer::{Transformer, TransformerConfig};
use crate::translate::batches::IdPairs;
use crate::translate::data::StudyData;
use crate::translate::evaluate::{bleu, decode_ids, decode_texts, Search};
use crate::translate::run::{
    best_weights, load_model, run, Objective, RecipeConfig, RunSpec, RunState, Schedule, Setup,
};
use crate::translate::track::Tracker;

/// How the teacher is trained: the translate study's baseline recipe (its command line's
/// defaults), or the same with a higher cap and patience ([`Recipe::PLATEAU`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Recipe {
    /// Sentences per batch.
    pub batch_size: usize,
    /// Label smoothing.
    pub label_smoothing: f64,
    /// Peak learning rate of the inverse square root schedule.
    pub lr: f64,
    /// Warm-up steps.
    pub warmup: usize,
    /// Step cap.
    pub steps: usize,
    /// Dev evaluation every this many steps.
    pub eval_every: usize,
    /// Evaluations without a new best before stopping.
    pub patience: usize,
}

impl Recipe {
    /// `cargo run --example translate`'s defaults.
    pub const TRANSLATE: Recipe = Recipe {
        batch_size: 64,
        label_smoothing: 0.1,
        lr: 2e-3,
        warmup: 400,
        steps: 4000,
        eval_every: 500,
        patience: 2,
    };

    /// Translate's recipe trained to its dev plateau: the 4000-step teacher of the NAT study
    /// was still improving at its cap (docs/nat.md), so the cap is 12 000 steps and the run
    /// stops after 3 evaluations (1500 steps) without a new best dev BLEU. At translate's
    /// measured 141 ms a step on 2 cores, at most 28 min (plus greedy dev decodes).
    pub const PLATEAU: Recipe = Recipe {
        steps: 12_000,
        patience: 3,
        ..Recipe::TRANSLATE
    };

    /// `translate --quick`'s.
    pub const QUICK: Recipe = Recipe {
        batch_size: 32,
        label_smoothing: 0.1,
        lr: 3e-3,
        warmup: 10,
        steps: 40,
        eval_every: 40,
        patience: 2,
    };
}

/// The teacher's weights and where they came from.
#[derive(Debug, Clone, Serialize)]
pub struct Teacher {
    /// The safetensors file.
    pub weights: PathBuf,
    /// Its SHA-256.
    pub weights_sha256: String,
    /// `reused <dir>` or `trained (N steps, best dev BLEU at step M)`.
    pub origin: String,
    /// Best dev BLEU (greedy) of its run.
    pub dev_bleu: f64,
}

/// A finished translate run in `run_dir` whose corpus and tokenizer have the SHA-256 of this
/// study's (`out/corpus.json`'s corpus hash, `out/tokenizer.json`'s bytes): its seed-1 `ce`
/// state, if there is one.
fn reusable(run_dir: &Path, data: &StudyData, out: &Path) -> Result<Option<RunState>> {
    #[derive(Deserialize)]
    struct CorpusHash {
        sha256: String,
    }
    let Some(corpus) = load_json::<CorpusHash>(&run_dir.join("corpus.json"))? else {
        return Ok(None);
    };
    let tokenizer = run_dir.join("tokenizer.json");
    if corpus.sha256 != data.summary.sha256
        || !tokenizer.exists()
        || file_sha256(&tokenizer)? != file_sha256(&out.join("tokenizer.json"))?
    {
        return Ok(None);
    }
    let state: Option<RunState> = load_json(&run_dir.join("runs/seed1/ce/state.json"))?;
    Ok(state.filter(|s| s.done && best_weights(&s.spec.dir).exists()))
}

/// What a trained teacher's folder records (`work/teacher/teacher.json`): the corpus,
/// tokenizer and recipe it was trained with. A folder that records others is trained again,
/// so one teacher folder can be shared by studies and runs (`--teacher-dir` of the CTC NAT).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TeacherStamp {
    /// The corpus's SHA-256.
    pub corpus_sha256: String,
    /// SHA-256 of `tokenizer.json`.
    pub tokenizer_sha256: String,
    /// The recipe.
    pub recipe: Recipe,
}

/// Where and how a study gets its teacher and the teacher's distilled training targets:
/// [`teacher`], [`distill`], and both in turn ([`teacher_and_distilled`]).
pub struct TeacherSetup<'a> {
    /// The teacher's sizes.
    pub config: TransformerConfig,
    /// How the teacher is trained when no translate run is reused.
    pub recipe: Recipe,
    /// The study's corpus and subwords.
    pub data: &'a StudyData,
    /// A finished translate study whose seed-1 `ce` model is reused when it matches.
    pub translate_run: Option<&'a Path>,
    /// The study's output folder: `tokenizer.json`, and the distillation cache
    /// (`distilled.ids.gz`, `distilled.json`).
    pub out: &'a Path,
    /// Where the teacher trains (`work/teacher`).
    pub work: &'a Path,
    /// The distillation's beam search.
    pub beam: BeamConfig,
    /// The device.
    pub device: &'a Device,
}

/// The teacher ([`teacher`]) and its distilled training targets ([`distill`]), the teacher's
/// origin and dev BLEU printed.
pub fn teacher_and_distilled(
    setup: &TeacherSetup,
    tracker: &mut Tracker,
) -> Result<(Teacher, IdPairs)> {
    let teacher = teacher(setup, tracker)?;
    tracker.progress.println(&format!(
        "teacher: {} (dev BLEU {:.2})",
        teacher.origin, teacher.dev_bleu
    ));
    let distilled = distill(&teacher, setup, tracker)?;
    Ok((teacher, distilled))
}

/// The teacher: the seed-1 `ce` checkpoint of the translate run in `setup.translate_run` (if
/// given) when its corpus and tokenizer match and it loads into `setup.config`, else
/// translate's baseline trained in `setup.work/teacher` with `setup.recipe` (resumed when
/// interrupted, reused when finished with the same corpus, tokenizer and recipe:
/// [`TeacherStamp`]).
pub fn teacher(setup: &TeacherSetup, tracker: &mut Tracker) -> Result<Teacher> {
    let TeacherSetup {
        config,
        recipe,
        data,
        translate_run,
        out,
        work,
        device,
        ..
    } = *setup;
    if let Some((translate_run, state)) = match translate_run {
        Some(dir) => reusable(dir, data, out)?.map(|s| (dir, s)),
        None => None,
    } {
        let weights = best_weights(&state.spec.dir);
        match load_model(config, &weights, device) {
            Ok(_) => {
                return Ok(Teacher {
                    weights_sha256: file_sha256(&weights)?,
                    origin: format!("reused {} (seed 1, ce)", translate_run.display()),
                    weights,
                    dev_bleu: state.best_dev_bleu,
                })
            }
            Err(e) => tracker.progress.println(&format!(
                "the translate run in {} does not load into this model ({e:#}): training the teacher",
                translate_run.display()
            )),
        }
    }
    let dev_bleu = |model: &Transformer| -> Result<f64> {
        let hyps = decode_texts(model, &data.dev.ids.src, Search::Greedy, &data.bpe)?;
        bleu(&hyps, &data.dev.references)
    };
    let detok = |ids: &[u32]| data.bpe.decode(ids).unwrap_or_default();
    let chosen = RecipeConfig {
        model: config,
        batch_size: recipe.batch_size,
        label_smoothing: recipe.label_smoothing,
    };
    let setup = Setup::recipe(chosen, &data.train, &detok, &dev_bleu, device.clone());
    let dir = work.join("teacher");
    let stamp = TeacherStamp {
        corpus_sha256: data.summary.sha256.clone(),
        tokenizer_sha256: file_sha256(&out.join("tokenizer.json"))?,
        recipe,
    };
    let stamp_path = dir.join("teacher.json");
    match load_json::<TeacherStamp>(&stamp_path)? {
        Some(found) if found != stamp => {
            tracker.progress.println(&format!(
                "{} holds a teacher of another corpus, tokenizer or recipe: training again",
                dir.display()
            ));
            std::fs::remove_dir_all(&dir)?;
        }
        _ => {}
    }
    std::fs::create_dir_all(&dir)?;
    save_json(&stamp, &stamp_path)?;
    let spec = RunSpec {
        dir,
        seed: 1,
        batch_seed: 1,
        objective: Objective::Ce,
        init: None,
        max_steps: recipe.steps,
        eval_every: recipe.eval_every,
        patience: Some(recipe.patience),
        select_from: 0,
        keep_last: 0,
        schedule: Schedule::InverseSqrt {
            peak: recipe.lr,
            warmup: recipe.warmup,
        },
    };
    let state = tracker.train("teacher (translate baseline)", TEACHER, &spec, |on_step| {
        run(&spec, &setup, on_step)
    })?;
    let weights = best_weights(&spec.dir);
    Ok(Teacher {
        weights_sha256: file_sha256(&weights)?,
        origin: format!(
            "trained ({} steps, best dev BLEU at step {})",
            state.step, state.best_step
        ),
        weights,
        dev_bleu: state.best_dev_bleu,
    })
}

/// The progress plan's name for the teacher's training steps.
pub const TEACHER: &str = "teacher";
/// The progress plan's name for distillation (one step per chunk of [`DISTILL_CHUNK`] sources).
pub const DISTILL: &str = "distill";
/// Sources per distillation chunk.
pub const DISTILL_CHUNK: usize = 500;

/// What the distillation cache (`distilled.json`) records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DistillRecord {
    /// SHA-256 of the teacher's weights.
    pub teacher_sha256: String,
    /// The corpus's SHA-256.
    pub corpus_sha256: String,
    /// SHA-256 of `tokenizer.json`.
    pub tokenizer_sha256: String,
    /// Beam width.
    pub beam: usize,
    /// Length penalty.
    pub length_penalty: f64,
    /// Training sources translated.
    pub pairs: usize,
    /// SHA-256 of the uncompressed `distilled.ids.gz` (one line of space-separated ids per
    /// training source, in the training split's order).
    pub sha256: String,
}

/// The teacher's beam search translations of `setup.data.train`'s sources as id pairs (the
/// distilled training data), read from `setup.out/distilled.ids.gz` when `distilled.json`
/// names the same teacher, corpus, tokenizer, search and content hash, else decoded and
/// written there.
pub fn distill(teacher: &Teacher, setup: &TeacherSetup, tracker: &mut Tracker) -> Result<IdPairs> {
    let TeacherSetup {
        config,
        data,
        beam,
        out,
        device,
        ..
    } = *setup;
    let sources = &data.train.ids.src;
    let ids_path = out.join("distilled.ids.gz");
    let record_path = out.join("distilled.json");
    let mut expected = DistillRecord {
        teacher_sha256: teacher.weights_sha256.clone(),
        corpus_sha256: data.summary.sha256.clone(),
        tokenizer_sha256: file_sha256(&out.join("tokenizer.json"))?,
        beam: beam.beam,
        length_penalty: beam.length_penalty,
        pairs: sources.len(),
        sha256: String::new(),
    };
    if let (Some(cached), true) = (load_json::<DistillRecord>(&record_path)?, ids_path.exists()) {
        expected.sha256 = cached.sha256.clone();
        let lines = read_lines_gz(&ids_path)?;
        if cached == expected && sha256_hex(join_lines(&lines).as_bytes()) == cached.sha256 {
            tracker
                .progress
                .unplan(DISTILL, sources.len().div_ceil(DISTILL_CHUNK));
            return Ok(IdPairs {
                src: sources.clone(),
                tgt: lines.iter().map(|l| parse_ids(l)).collect::<Result<_>>()?,
            });
        }
        tracker
            .progress
            .println("the distillation cache belongs to another teacher or corpus: decoding again");
    }
    let model = load_model(config, &teacher.weights, device)?;
    let specials = Specials {
        bos: BOS,
        eos: EOS,
        pad: PAD,
    };
    // Sorted by length so that each chunk's beam batches hold similar lengths.
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| (sources[i].len(), i));
    let mut targets = vec![Vec::new(); sources.len()];
    let chunks = order.chunks(DISTILL_CHUNK).count();
    for (done, chunk) in order.chunks(DISTILL_CHUNK).enumerate() {
        let started = std::time::Instant::now();
        let chunk_sources: Vec<Vec<u32>> = chunk.iter().map(|&i| sources[i].clone()).collect();
        let decoded = decode_ids(&model, &chunk_sources, specials, Search::Beam(beam), 100)?;
        for (&i, ids) in chunk.iter().zip(decoded) {
            targets[i] = ids;
        }
        tracker
            .progress
            .record(DISTILL, 1, started.elapsed().as_secs_f64());
        tracker.progress.show(
            &format!(
                "distilling the training sources: {} of {chunks} chunks",
                done + 1
            ),
            false,
        );
    }
    let lines: Vec<String> = targets
        .iter()
        .map(|t| t.iter().map(u32::to_string).collect::<Vec<_>>().join(" "))
        .collect();
    expected.sha256 = sha256_hex(join_lines(&lines).as_bytes());
    write_lines_gz(&ids_path, &lines)?;
    save_json(&expected, &record_path)?;
    Ok(IdPairs {
        src: sources.clone(),
        tgt: targets,
    })
}

/// The ids of one line of `distilled.ids.gz`.
pub fn parse_ids(line: &str) -> Result<Vec<u32>> {
    line.split_whitespace()
        .map(|t| {
            t.parse::<u32>()
                .with_context(|| format!("distilled.ids.gz: `{t}` is not a token id"))
        })
        .collect()
}
