//! The NAT study's plan: the steps of every kind of work to come, for the progress
//! projection, and the minutes each part is estimated to take.

use super::config::Config;
use super::teacher::{DISTILL, DISTILL_CHUNK, TEACHER};

/// Translate's measured cost on this machine's 2 cores (docs/translate.md): ms per training
/// step of the d = 128, 2 + 2 layer model at batch 64, and the beam-5 distillation of 27.7k
/// sources.
const AR_MS_PER_STEP: f64 = 185.0;
/// The planned NAT step relative to an AR step (no BOS/EOS; the length predictor is cheap) and
/// a BLEU-loss step relative to a CE step: estimates, replaced by measurements as the study runs.
const NAT_STEP_SHARE: f64 = 0.8;
const BLEU_STEP_SHARE: f64 = 1.3;
const DISTILL_SECONDS_PER_SOURCE: f64 = 8.0 * 60.0 / 27_700.0;

/// A part of the study and its estimated minutes.
pub(super) type PartMinutes = (String, f64);

/// The plan: `(kind, steps)` per run to come, and the estimated minutes of each part.
pub(super) fn plan(
    cfg: &Config,
    train_pairs: usize,
    teacher_reused: bool,
) -> (Vec<(String, usize)>, Vec<PartMinutes>) {
    let seeds = cfg.common.seeds as usize;
    let raw = cfg.raw_seeds as usize;
    let grid = cfg.grid().len();
    let finetunes_ce = seeds + raw;
    let finetunes_bleu = grid + (seeds - 1) + raw + if cfg.no_bleu4 { 0 } else { seeds };
    let mut kinds = vec![("nat baseline".to_string(), cfg.base_steps * (seeds + raw))];
    kinds.push(("nat ce".into(), cfg.common.finetune_steps * finetunes_ce));
    // Seed 1's final bon2 run is its grid run: planned again here, taken back when it loads.
    kinds.push((
        "nat bleu".into(),
        cfg.common.finetune_steps * (finetunes_bleu + 1),
    ));
    let recipe = cfg.recipe();
    if !teacher_reused {
        kinds.push((TEACHER.into(), recipe.steps));
    }
    kinds.push((DISTILL.into(), train_pairs.div_ceil(DISTILL_CHUNK)));
    let nat_s = AR_MS_PER_STEP * NAT_STEP_SHARE / 1e3;
    let minutes = vec![
        (
            "teacher (translate baseline)".to_string(),
            if teacher_reused {
                0.0
            } else {
                recipe.steps as f64 * AR_MS_PER_STEP / 6e4
            },
        ),
        (
            "distillation (beam 5)".into(),
            train_pairs as f64 * DISTILL_SECONDS_PER_SOURCE / 60.0,
        ),
        (
            "NAT baselines".into(),
            (cfg.base_steps * (seeds + raw)) as f64 * nat_s / 60.0,
        ),
        (
            "fine-tunes".into(),
            (cfg.common.finetune_steps as f64 * nat_s / 60.0)
                * (finetunes_ce as f64 + BLEU_STEP_SHARE * finetunes_bleu as f64),
        ),
        (
            "dev evaluations (~2 s each)".into(),
            ((cfg.base_steps / cfg.base_eval_every) * (seeds + raw)
                + (cfg.common.finetune_steps / cfg.common.finetune_eval_every + 1)
                    * (finetunes_ce + finetunes_bleu)) as f64
                * 2.0
                / 60.0,
        ),
        ("test decodes and speed".into(), 6.0),
    ];
    (kinds, minutes)
}

/// The plan's estimated seconds per step of each kind of work (a distillation step is a chunk
/// of sources), for the projection until each kind has measured steps.
pub(super) fn step_estimates() -> Vec<(String, f64)> {
    let nat_s = AR_MS_PER_STEP * NAT_STEP_SHARE / 1e3;
    vec![
        (TEACHER.to_string(), AR_MS_PER_STEP / 1e3),
        (
            DISTILL.to_string(),
            DISTILL_SECONDS_PER_SOURCE * DISTILL_CHUNK as f64,
        ),
        ("nat baseline".to_string(), nat_s),
        ("nat ce".to_string(), nat_s),
        ("nat bleu".to_string(), nat_s * BLEU_STEP_SHARE),
    ]
}
