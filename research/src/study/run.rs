//! One run of the study (an objective and a seed, from the seed's shared warm-up to its test
//! measures), its `results.json` entry, and `--project`'s timing of every objective.

use crate::data::EncodedCorpus;
use crate::eval;
use crate::progress;
use crate::train::{
    process_cpu_s, restore, selected_run_json, snapshot, LogRow, SelectedRun, StepTime,
    TrainingContext,
};
use anyhow::{bail, Result};
use candle_core::Device;
use indicatif::MultiProgress;
use std::path::Path;
use std::time::Instant;

use super::arms::{self, Arm, Init, Stretch, TrainConfig, WarmStart};

/// Everything a finished run produced.
pub struct RunOutput {
    /// The objective.
    pub arm: Arm,
    /// The seed.
    pub seed: u64,
    /// Dev BLEU of the selected checkpoint (the best of this objective's own evaluations).
    pub dev_bleu: f64,
    /// Its global step.
    pub selected_step: usize,
    /// Dev BLEU at the last step.
    pub last_dev_bleu: f64,
    /// Test BLEU of the selected checkpoint (greedy).
    pub test_bleu: f64,
    /// The selected checkpoint's test outputs, tokens per segment.
    pub test_hyps: Vec<Vec<String>>,
    /// The averaging measures of its test outputs.
    pub measures: eval::Measures,
    /// Including the shared warm-up's rows for warm-started objectives.
    pub log: Vec<LogRow>,
    /// Mean training step (this objective's steps only).
    pub step: StepTime,
    /// This objective's own training and evaluation, seconds (the shared warm-up excluded).
    pub wall_s: f64,
}

/// The shared cross-entropy warm-up of `seed` when any of `arms` starts from it (the
/// initialisation itself when there are no warm-up steps).
pub fn warm_up(
    arms: &[Arm],
    seed: u64,
    context: &TrainingContext<TrainConfig>,
    bars: &MultiProgress,
) -> Result<Option<WarmStart>> {
    let TrainingContext { cfg, device, .. } = *context;
    if !arms.iter().any(|a| a.init == Init::Warm) {
        return Ok(None);
    }
    let (varmap, model) = arms::init_model(cfg, seed, device)?;
    let log = if cfg.warmup_steps > 0 {
        let stretch = Stretch {
            arm: None,
            first: 0,
            last: cfg.warmup_steps,
            seed,
        };
        let bar = progress::bar(
            bars,
            format!("ce warm-up seed {seed}"),
            36,
            cfg.warmup_steps,
        )?;
        let (log, _, _) = arms::train(&varmap, &model, &stretch, context, &bar)?;
        bar.finish();
        log
    } else {
        Vec::new()
    };
    Ok(Some(WarmStart {
        snapshot: snapshot(&varmap)?,
        log,
    }))
}

/// One objective of one seed, from its start to its test measures.
pub fn run_arm(
    arm: &Arm,
    seed: u64,
    warm: Option<&WarmStart>,
    context: &TrainingContext<TrainConfig>,
    bars: &MultiProgress,
) -> Result<RunOutput> {
    let TrainingContext { cfg, data, device } = *context;
    let started = Instant::now();
    let (varmap, model) = arms::init_model(cfg, seed, device)?;
    let (first, mut log) = match (arm.init, warm) {
        (Init::Warm, Some(warm)) => {
            restore(&varmap, &warm.snapshot)?;
            (cfg.warmup_steps, warm.log.clone())
        }
        (Init::Warm, None) => bail!("{}: no warm-up checkpoint", arm.name),
        (Init::Scratch, _) => (0, Vec::new()),
    };
    let stretch = Stretch {
        arm: Some(arm),
        first,
        last: cfg.total_steps(),
        seed,
    };
    let bar = progress::bar(
        bars,
        format!("{} seed {seed}", arm.name),
        36,
        stretch.last - stretch.first,
    )?;
    let (arm_log, step, best) = arms::train(&varmap, &model, &stretch, context, &bar)?;
    bar.finish();
    log.extend(arm_log);
    let last_dev_bleu = log.last().map_or(0.0, |r| r.dev_bleu);
    restore(&varmap, &best.snapshot)?;
    let test_hyps = arms::translate(&varmap, cfg, &data.test, &data.tgt_vocab, device)?;
    let test_bleu = eval::bleu_100(&test_hyps, &data.test_refs)?;
    let measures = eval::measures(&model, &data.test, &test_hyps, &data.test_refs, device)?;
    Ok(RunOutput {
        arm: arm.clone(),
        seed,
        dev_bleu: best.dev_bleu,
        selected_step: best.step,
        last_dev_bleu,
        test_bleu,
        test_hyps,
        measures,
        log,
        step,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

/// Writes `run`'s test hypotheses to `out` and returns its `results.json` entry.
pub fn run_json(run: &RunOutput, out: &Path) -> Result<serde_json::Value> {
    let slug = run.arm.slug();
    let mut record = selected_run_json(
        &SelectedRun {
            objective: run.arm.name,
            slug: &slug,
            seed: run.seed,
            dev_bleu: run.dev_bleu,
            selected_step: run.selected_step,
            last_dev_bleu: run.last_dev_bleu,
            test_bleu: run.test_bleu,
            test_hyps: &run.test_hyps,
            wall_s: run.wall_s,
        },
        out,
    )?;
    let own = serde_json::json!({
        "measures": run.measures,
        "init": run.arm.init,
        "cross_entropy": run.arm.ce,
        "bleu_term": run.arm.bleu.map(|(form, length)| serde_json::json!({
            "form": format!("{form:?}"), "length": format!("{length:?}"),
        })),
        "decode": run.arm.decode,
        "train_s_per_step": run.step.wall_s,
        "train_cpu_s_per_step": run.step.cpu_s,
    });
    if let serde_json::Value::Object(own) = own {
        record.extend(own);
    }
    Ok(serde_json::Value::Object(record))
}

/// `--project`: times steps of every objective and one dev evaluation, and extrapolates.
pub fn project(
    arms: &[Arm],
    cfg: &TrainConfig,
    data: &EncodedCorpus,
    seeds: u64,
    device: &Device,
) -> Result<()> {
    const TIMED: usize = 12;
    let bars = MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden());
    let timing_cfg = TrainConfig {
        eval_every: usize::MAX,
        ..cfg.clone()
    };
    let timing = TrainingContext {
        cfg: &timing_cfg,
        data,
        device,
    };
    let mut ce_step = None;
    let (mut total, mut total_cpu) = (0.0, 0.0);
    println!(
        "| objective | wall s / step (mean of {TIMED}) | CPU s / step | steps / seed | projected wall s / seed | projected CPU s / seed |"
    );
    println!("|---|---|---|---|---|---|");
    for arm in arms {
        let (varmap, model) = arms::init_model(cfg, 1, device)?;
        let stretch = Stretch {
            arm: Some(arm),
            first: cfg.warmup_steps,
            last: cfg.warmup_steps + TIMED,
            seed: 1,
        };
        let bar = progress::bar(&bars, format!("{} seed 1", arm.name), 36, TIMED)?;
        let (_, step, _) = arms::train(&varmap, &model, &stretch, &timing, &bar)?;
        let steps = match arm.init {
            Init::Warm => cfg.arm_steps,
            Init::Scratch => cfg.total_steps(),
        };
        if arm.name == "ce" {
            ce_step = Some(step);
        }
        total += step.wall_s * steps as f64;
        total_cpu += step.cpu_s * steps as f64;
        println!(
            "| {} | {:.3} | {:.3} | {steps} | {:.0} | {:.0} |",
            arm.name,
            step.wall_s,
            step.cpu_s,
            step.wall_s * steps as f64,
            step.cpu_s * steps as f64
        );
    }
    let ce_step = ce_step.unwrap_or_default();
    let (warmup, warmup_cpu) = (
        ce_step.wall_s * cfg.warmup_steps as f64,
        ce_step.cpu_s * cfg.warmup_steps as f64,
    );
    let (varmap, _) = arms::init_model(cfg, 1, device)?;
    let (started, cpu_started) = (Instant::now(), process_cpu_s());
    arms::translate(&varmap, cfg, &data.dev, &data.tgt_vocab, device)?;
    let dev_eval = started.elapsed().as_secs_f64();
    let dev_eval_cpu = process_cpu_s() - cpu_started;
    let evals: usize = cfg.warmup_steps / cfg.eval_every
        + arms
            .iter()
            .map(|a| match a.init {
                Init::Warm => cfg.arm_steps / cfg.eval_every + 1,
                Init::Scratch => cfg.total_steps() / cfg.eval_every + 1,
            })
            .sum::<usize>();
    // Test decode and measures per run: the test set's size in dev evaluations, plus 20% for
    // the teacher-forced measures pass (cheap next to greedy decoding).
    let test_ratio = 1.2 * data.test.len() as f64 / data.dev.len().max(1) as f64;
    let eval_units = evals as f64 + arms.len() as f64 * test_ratio;
    let per_seed = total + warmup + eval_units * dev_eval;
    let per_seed_cpu = total_cpu + warmup_cpu + eval_units * dev_eval_cpu;
    println!(
        "\nCE warm-up {warmup:.0} s wall / {warmup_cpu:.0} s CPU per seed; one dev evaluation \
         (greedy, {} sentences, untrained model: decodes run to the length limit, an upper bound) \
         {dev_eval:.2} s wall / {dev_eval_cpu:.2} s CPU, {evals} per seed.\n\
         projected total for {seeds} seed(s): {:.0} s wall ({:.1} min); {:.0} s CPU ({:.1} min)",
        data.dev.len(),
        per_seed * seeds as f64,
        per_seed * seeds as f64 / 60.0,
        per_seed_cpu * seeds as f64,
        per_seed_cpu * seeds as f64 / 60.0,
    );
    Ok(())
}
