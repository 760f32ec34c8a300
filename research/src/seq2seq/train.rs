//! One training run: an objective, a seed, a fixed number of AdamW steps with seeded dropout
//! and label-smoothed cross-entropy; the checkpoint with the best dev BLEU (greedy) among the
//! evaluations after the warm-up is the one scored on test.

use crate::data::{Batch, Batches, PAD};
use crate::eval::bleu_100;
use crate::model::transformer::{Dropout, Transformer, TransformerConfig};
use crate::model::translate;
use crate::train::{
    adamw, learning_rate, restore, snapshot, teacher_forced_logits, LogRow, TrainingContext,
};
use anyhow::Result;
use candle_bleu::loss::{
    bleu_loss_from_logits, ce_bleu_from_logits, cross_entropy_from_logits, BleuLossConfig,
    CrossEntropyConfig, LengthModel, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::Tensor;
use candle_nn::{Optimizer, VarMap};
use indicatif::ProgressBar;
use std::time::Instant;

/// What the optimizer minimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objective {
    /// Token-level cross-entropy for every step.
    CrossEntropy,
    /// Cross-entropy for the warm-up steps, then `CE + λ · (-log BLEU)`.
    CeThenBleu,
}

impl Objective {
    /// Both objectives, in the order every seed trains them.
    pub const ALL: [Objective; 2] = [Objective::CrossEntropy, Objective::CeThenBleu];

    /// The objective's name in tables, logs and `results.json`.
    pub fn name(self) -> &'static str {
        match self {
            Objective::CrossEntropy => "ce",
            Objective::CeThenBleu => "ce+bleu",
        }
    }

    /// A file-name-safe form of [`Self::name`].
    pub fn slug(self) -> &'static str {
        match self {
            Objective::CrossEntropy => "ce",
            Objective::CeThenBleu => "ce_bleu",
        }
    }
}

/// Settings shared by every run.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// The Transformer's sizes.
    pub model: TransformerConfig,
    /// Training steps of every run.
    pub steps: usize,
    /// Sentences per batch.
    pub batch_size: usize,
    /// Peak learning rate (linear warm-up, then cosine decay to 10%).
    pub lr: f64,
    /// Steps of the learning-rate warm-up.
    pub lr_warmup: usize,
    /// Steps of cross-entropy alone before the BLEU term is added (`CeThenBleu`).
    pub bleu_start: usize,
    /// Weight `λ` of the BLEU loss.
    pub lambda: f64,
    /// The BLEU loss of `CeThenBleu`'s second phase.
    pub loss: BleuLossConfig,
    /// Label smoothing of the cross-entropy (every objective).
    pub label_smoothing: f64,
    /// Dropout probability on the embeddings and every residual branch (training only).
    pub dropout: f32,
    /// Dev BLEU and a log row every this many steps (and at the last step); the checkpoint
    /// is chosen among the evaluations after step `bleu_start` (the same window for every
    /// objective).
    pub eval_every: usize,
    /// Longest greedy decode.
    pub max_decode_len: usize,
}

/// Everything a finished run produced.
pub struct RunOutput {
    /// The objective it trained.
    pub objective: Objective,
    /// The seed.
    pub seed: u64,
    /// Dev BLEU of the selected checkpoint (the best in the selection window).
    pub dev_bleu: f64,
    /// The step of the selected checkpoint.
    pub selected_step: usize,
    /// Dev BLEU at the last step.
    pub last_dev_bleu: f64,
    /// Test BLEU of the selected checkpoint (greedy).
    pub test_bleu: f64,
    /// The selected checkpoint's test outputs, tokens per segment.
    pub test_hyps: Vec<Vec<String>>,
    /// Every logged step.
    pub log: Vec<LogRow>,
    /// Training and evaluation, seconds.
    pub wall_s: f64,
    /// Mean time of one training step (batch, forward, losses, backward, optimizer), ms, over
    /// the steps without and with the BLEU term.
    pub step_ms: [Option<f64>; 2],
}

/// Token-level cross-entropy over real target positions (words and EOS) with label smoothing
/// `label_smoothing`: `dec_out` is padded with [`PAD`], which the loss ignores.
fn cross_entropy_config(label_smoothing: f64) -> CrossEntropyConfig {
    CrossEntropyConfig {
        pad_id: Some(PAD),
        label_smoothing,
        ..Default::default()
    }
}

/// The references of a batch and the hypothesis lengths of teacher-forced logits `[B, T+1, V]`.
///
/// The hypothesis lengths follow the length model: `Given` scores the first `T` positions
/// (the reference's length, so the brevity penalty is 1); `NotEos` scores `T + 1` positions
/// including the one that should predict EOS, each weighted by `1 - P(EOS)`; `SoftEos`
/// scores every position weighted by the probability that no EOS came before it.
fn bleu_inputs(batch: &Batch, cfg: &BleuLossConfig) -> Result<(References, Option<Tensor>)> {
    let refs = References::from_ids(&batch.refs, PAD)?;
    let lengths = match cfg.length {
        LengthModel::Given => Some(batch.ref_len.clone()),
        LengthModel::NotEos { .. } => Some(batch.ref_len.affine(1.0, 1.0)?),
        LengthModel::SoftEos { .. } => None,
    };
    Ok((refs, lengths))
}

/// Trains one model of `objective` from `seed` and decodes dev and test with it; `progress`
/// (from `crate::progress::bar`) counts the steps.
pub fn run(
    objective: Objective,
    seed: u64,
    context: &TrainingContext<TrainConfig>,
    progress: &ProgressBar,
) -> Result<RunOutput> {
    let TrainingContext { cfg, data, device } = *context;
    let started = Instant::now();
    let varmap = VarMap::new();
    let model = Transformer::new(cfg.model, &varmap, seed, device)?;
    let mut optimizer = adamw(&varmap, cfg.lr)?;
    let mut batches = Batches::new(data.train.len(), cfg.batch_size, seed)?;
    // The same masks for both objectives of a seed (same shapes, same batches).
    let mut dropout = Dropout::new(cfg.dropout, seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let cross_entropy = cross_entropy_config(cfg.label_smoothing);
    let mut best: Option<(f64, usize, crate::train::Snapshot)> = None;
    let mut log = Vec::new();
    let (mut ce_sum, mut bleu_sum, mut window) = (0.0, 0.0, 0usize);
    // [without BLEU, with BLEU]: (total seconds, steps).
    let mut step_time = [(0.0f64, 0usize); 2];
    for step in 0..cfg.steps {
        let step_started = Instant::now();
        optimizer.set_learning_rate(learning_rate(cfg.lr, cfg.lr_warmup, cfg.steps, step));
        let (_, batch, logits) =
            teacher_forced_logits(&model, data, &mut batches, &mut dropout, device)?;
        let use_bleu = objective == Objective::CeThenBleu && step >= cfg.bleu_start;
        let (refs, lengths) = bleu_inputs(&batch, &cfg.loss)?;
        // With BLEU: one fused op reads the logits once for both losses and writes one logits
        // gradient. CE only: the fused cross-entropy, and the BLEU loss of the outputs for the
        // log, on detached logits.
        let (loss, ce, bleu) = if use_bleu {
            let step_cfg = TrainingLossConfig {
                bleu_weight: cfg.lambda,
                ce: cross_entropy.clone(),
                bleu: cfg.loss.clone(),
            };
            let out = ce_bleu_from_logits(
                &logits,
                &TrainingTargets {
                    tokens: &batch.dec_out,
                    refs: &refs,
                    hyp_lengths: lengths.as_ref(),
                },
                &step_cfg,
            )?;
            (out.loss, out.cross_entropy, out.bleu.loss)
        } else {
            let ce = cross_entropy_from_logits(&logits, &batch.dec_out, &cross_entropy)?.loss;
            let bleu =
                bleu_loss_from_logits(&logits.detach(), lengths.as_ref(), &refs, &cfg.loss)?.loss;
            (ce.clone(), ce, bleu)
        };
        let ce_value = f64::from(ce.to_scalar::<f32>()?);
        let bleu_value = f64::from(bleu.to_scalar::<f32>()?);
        if !ce_value.is_finite() || !bleu_value.is_finite() {
            anyhow::bail!(
                "{} seed {seed}: non-finite loss at step {step} (ce {ce_value}, bleu {bleu_value})",
                objective.name()
            );
        }
        optimizer.backward_step(&loss)?;
        let slot = &mut step_time[usize::from(use_bleu)];
        slot.0 += step_started.elapsed().as_secs_f64();
        slot.1 += 1;
        ce_sum += ce_value;
        bleu_sum += bleu_value;
        window += 1;
        progress.inc(1);
        if (step + 1) % cfg.eval_every == 0 || step + 1 == cfg.steps {
            let dev_hyps = translate(
                &model,
                &data.dev,
                &data.tgt_vocab,
                cfg.max_decode_len,
                device,
            )?;
            let dev_bleu = bleu_100(&dev_hyps, &data.dev_refs)?;
            let row = LogRow {
                step: step + 1,
                ce_loss: ce_sum / window as f64,
                bleu_loss: bleu_sum / window as f64,
                dev_bleu,
            };
            progress.set_message(format!(
                "ce {:.3} -logBLEU {:.3} dev {:.2}",
                row.ce_loss, row.bleu_loss, row.dev_bleu
            ));
            let in_window = step + 1 > cfg.bleu_start || step + 1 == cfg.steps;
            if in_window && best.as_ref().is_none_or(|b| dev_bleu > b.0) {
                best = Some((dev_bleu, step + 1, snapshot(&varmap)?));
            }
            log.push(row);
            (ce_sum, bleu_sum, window) = (0.0, 0.0, 0);
        }
    }
    let last_dev_bleu = log.last().map_or(0.0, |r| r.dev_bleu);
    let (dev_bleu, selected_step, weights) =
        best.expect("the last step is always evaluated and in the window");
    restore(&varmap, &weights)?;
    let test_hyps = translate(
        &model,
        &data.test,
        &data.tgt_vocab,
        cfg.max_decode_len,
        device,
    )?;
    let test_bleu = bleu_100(&test_hyps, &data.test_refs)?;
    Ok(RunOutput {
        objective,
        seed,
        dev_bleu,
        selected_step,
        last_dev_bleu,
        test_bleu,
        test_hyps,
        log,
        wall_s: started.elapsed().as_secs_f64(),
        step_ms: step_time.map(|(total, steps)| (steps > 0).then(|| total * 1e3 / steps as f64)),
    })
}
