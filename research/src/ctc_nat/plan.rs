//! The CTC NAT study's plan: the steps of every kind of work to come, for the progress
//! projection, and the minutes each part is estimated to take on this machine's 2 cores.

use super::config::Config;
use crate::nat::teacher::{DISTILL, DISTILL_CHUNK, TEACHER};

/// An AR (teacher) training step at batch 64 on 2 cores, ms, its greedy dev evaluations
/// included (docs/nat.md: the 4000-step teacher took 9 min 56 s).
const AR_MS_PER_STEP: f64 = 150.0;
/// A CTC NAT training step at batch 64 on 2 cores, ms per unit of the upsampling ratio (the
/// decoder and the tied output layer run on `r·S` frames; the CTC and BLEU kernels are a small
/// part). Measured on the study's real batches (distilled targets, forward and backward, 3 × 12
/// steps with the machine otherwise quiet, docs/ctc_nat.md): the vanilla NAT's CE step 140 ms
/// (its study measured 126–134 ms with the optimiser), CTC at r = 2 250 ms, at r = 3 370 ms.
const CTC_MS_PER_STEP_PER_RATIO: f64 = 130.0;
/// A BLEU-on-CTC step (`ctc+bon2`, mixed) relative to a CTC step: 305 against 250 ms.
const BLEU_STEP_SHARE: f64 = 1.25;
/// The beam-5 distillation of the training sources (docs/nat.md: 8 min for 27.7k).
const DISTILL_SECONDS_PER_SOURCE: f64 = 8.0 * 60.0 / 27_700.0;
/// A dev evaluation of a CTC NAT (one greedy pass over the dev set), seconds.
const DEV_EVAL_SECONDS: f64 = 3.0;

/// A part of the study and its estimated minutes.
pub(super) type PartMinutes = (String, f64);

/// The plan's kinds of work.
pub(super) const BASELINE: &str = "ctc baseline";
pub(super) const FINETUNE_CTC: &str = "ctc";
pub(super) const FINETUNE_BLEU: &str = "ctc bleu";

fn ctc_s(cfg: &Config) -> f64 {
    CTC_MS_PER_STEP_PER_RATIO * cfg.ratio as f64 / 1e3
}

/// The plan: `(kind, steps)` per run to come, and the estimated minutes of each part
/// (`distill_sources`: the training sources to distil, 0 when the cache holds them;
/// `teacher_steps`: the teacher's steps still to train, 0 when it is reused).
pub(super) fn plan(
    cfg: &Config,
    distill_sources: usize,
    teacher_steps: usize,
) -> (Vec<(String, usize)>, Vec<PartMinutes>) {
    let seeds = cfg.common.seeds as usize;
    let grid = cfg.grid().len();
    let finetune = cfg.common.finetune_steps;
    let bleu_runs = grid
        + (seeds - 1)
        + if cfg.no_bleu4 { 0 } else { seeds }
        + if cfg.nmla { seeds } else { 0 };
    // The runs decoded on the test set: the baselines, `ctc`, and every arm for every seed.
    let runs = 2 * seeds + bleu_runs - grid + 1;
    let mut kinds = vec![(BASELINE.to_string(), cfg.base_steps * seeds)];
    kinds.push((FINETUNE_CTC.into(), finetune * seeds));
    kinds.push((FINETUNE_BLEU.into(), finetune * bleu_runs));
    if teacher_steps > 0 {
        kinds.push((TEACHER.into(), teacher_steps));
    }
    if distill_sources > 0 {
        kinds.push((DISTILL.into(), distill_sources.div_ceil(DISTILL_CHUNK)));
    }
    let teacher_minutes = teacher_steps as f64 * AR_MS_PER_STEP / 6e4;
    let minutes = vec![
        (
            format!("teacher ({} steps at most)", teacher_steps),
            teacher_minutes,
        ),
        (
            "distillation (beam 5)".into(),
            distill_sources as f64 * DISTILL_SECONDS_PER_SOURCE / 60.0,
        ),
        (
            format!("CTC baselines (r = {})", cfg.ratio),
            (cfg.base_steps * seeds) as f64 * ctc_s(cfg) / 60.0,
        ),
        (
            "fine-tunes".into(),
            finetune as f64 * ctc_s(cfg) / 60.0
                * (seeds as f64 + BLEU_STEP_SHARE * bleu_runs as f64),
        ),
        (
            "dev evaluations".into(),
            ((cfg.base_steps / cfg.base_eval_every) * seeds
                + (finetune / cfg.common.finetune_eval_every + 1) * (seeds + bleu_runs))
                as f64
                * DEV_EVAL_SECONDS
                / 60.0,
        ),
        (
            "test decodes and speed".into(),
            if cfg.common.quick { 0.3 } else { 5.0 },
        ),
        (
            format!(
                "blank penalty on dev ({} values)",
                cfg.blank_penalties.len()
            ),
            (runs * cfg.blank_penalties.len()) as f64 * DEV_EVAL_SECONDS / 60.0,
        ),
        (
            format!("checkpoint averaging (last {})", cfg.average_last),
            // One dev evaluation of each trained run's average (baselines and fine-tunes).
            if cfg.average_last > 0 {
                (2 * seeds + bleu_runs) as f64 * DEV_EVAL_SECONDS / 60.0
            } else {
                0.0
            },
        ),
    ];
    (kinds, minutes)
}

/// The plan's estimated seconds per step of each kind of work, for the projection until each
/// kind has measured steps.
pub(super) fn step_estimates(cfg: &Config) -> Vec<(String, f64)> {
    vec![
        (TEACHER.to_string(), AR_MS_PER_STEP / 1e3),
        (
            DISTILL.to_string(),
            DISTILL_SECONDS_PER_SOURCE * DISTILL_CHUNK as f64,
        ),
        (BASELINE.to_string(), ctc_s(cfg)),
        (FINETUNE_CTC.to_string(), ctc_s(cfg)),
        (FINETUNE_BLEU.to_string(), ctc_s(cfg) * BLEU_STEP_SHARE),
    ]
}
