//! The study's objectives ("arms") and the training of one run: a shared cross-entropy
//! warm-up, then an equal number of steps of each arm's objective, all with seeded dropout and
//! label-smoothed cross-entropy; each arm keeps the weights of its best dev evaluation.

use crate::data::tokens::Vocab;
use crate::data::{source_tensor, Batch, Batches, Encoded, EOS, PAD};
use crate::eval;
use crate::model::soft_decode::{weights_of, Feedback, SoftDecoder};
use crate::model::transformer::{Dropout, Transformer, TransformerConfig};
use crate::train::{
    adamw, learning_rate, process_cpu_s, snapshot, teacher_forced_logits, LogRow, Snapshot,
    StepTime, TrainingContext,
};
use anyhow::{bail, Result};
use candle_bleu::loss::{
    bleu_loss_from_logits, cross_entropy_from_logits, BleuLossConfig, CrossEntropyConfig, Form,
    LengthModel, References,
};
use candle_core::{Device, Tensor};
use candle_nn::{Optimizer, VarMap};
use indicatif::ProgressBar;
use std::time::Instant;

/// Where a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Init {
    /// The seed's cross-entropy warm-up checkpoint (shared by every warm arm of the seed).
    Warm,
    /// The seed's random initialisation, trained for warm-up + arm steps.
    Scratch,
}

/// Which distributions the BLEU term scores.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decode {
    /// The teacher-forced decoder's `softmax(logits)` at the reference positions.
    TeacherForced,
    /// The model's own soft free-running decode ([`Feedback::Expected`] or `Gumbel`).
    FreeRunning(#[serde(skip)] Feedback),
}

/// One objective of the study.
#[derive(Debug, Clone, PartialEq)]
pub struct Arm {
    /// Its name in tables and `results.json`.
    pub name: &'static str,
    /// Where it starts.
    pub init: Init,
    /// Cross-entropy in the objective.
    pub ce: bool,
    /// The BLEU term's form and length model, if any.
    pub bleu: Option<(Form, LengthModel)>,
    /// What the loss reads: teacher-forced rows or a soft free-running decode.
    pub decode: Decode,
}

impl Arm {
    /// A file-name-safe form of the name.
    pub fn slug(&self) -> String {
        self.name.replace(['+', '/'], "_")
    }
}

/// Every arm the study knows, the default ones first; `bleu_only_length` is the length model
/// of the BLEU-only arms (without cross-entropy nothing else teaches the model to stop).
pub fn all_arms(bleu_only_length: LengthModel) -> Vec<Arm> {
    let eos_id = EOS;
    let tf = Decode::TeacherForced;
    let arm = |name, init, ce, bleu, decode| Arm {
        name,
        init,
        ce,
        bleu,
        decode,
    };
    vec![
        arm("ce", Init::Warm, true, None, tf),
        arm(
            "ce+expected",
            Init::Warm,
            true,
            Some((Form::Expected, LengthModel::Given)),
            tf,
        ),
        arm(
            "ce+paired",
            Init::Warm,
            true,
            Some((Form::Paired, LengthModel::Given)),
            tf,
        ),
        arm(
            "ce+lower-bound",
            Init::Warm,
            true,
            Some((Form::LowerBound, LengthModel::Given)),
            tf,
        ),
        arm(
            "ce+expected/not-eos",
            Init::Warm,
            true,
            Some((Form::Expected, LengthModel::NotEos { eos_id })),
            tf,
        ),
        arm(
            "ce+expected/soft-eos",
            Init::Warm,
            true,
            Some((Form::Expected, LengthModel::SoftEos { eos_id })),
            tf,
        ),
        arm(
            "bleu-only/expected/scratch",
            Init::Scratch,
            false,
            Some((Form::Expected, bleu_only_length)),
            tf,
        ),
        arm(
            "bleu-only/paired/scratch",
            Init::Scratch,
            false,
            Some((Form::Paired, bleu_only_length)),
            tf,
        ),
        arm(
            "bleu-only/expected/warm",
            Init::Warm,
            false,
            Some((Form::Expected, bleu_only_length)),
            tf,
        ),
        arm(
            "bleu-only/paired/warm",
            Init::Warm,
            false,
            Some((Form::Paired, bleu_only_length)),
            tf,
        ),
        arm(
            "ce+expected/free-running",
            Init::Warm,
            true,
            Some((Form::Expected, LengthModel::SoftEos { eos_id })),
            Decode::FreeRunning(Feedback::Expected),
        ),
        // Not in the default list: a straight-through Gumbel-softmax feedback.
        arm(
            "ce+expected/free-running-gumbel",
            Init::Warm,
            true,
            Some((Form::Expected, LengthModel::SoftEos { eos_id })),
            Decode::FreeRunning(Feedback::Gumbel { tau: 1.0, seed: 0 }),
        ),
    ]
}

/// How many of [`all_arms`] run by default.
pub const DEFAULT_ARMS: usize = 11;

/// Settings shared by every run.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// The Transformer's sizes.
    pub model: TransformerConfig,
    /// Cross-entropy warm-up steps, shared by the warm arms of a seed.
    pub warmup_steps: usize,
    /// Steps of each arm after the warm-up (scratch arms: warm-up + these).
    pub arm_steps: usize,
    /// Sentences per batch.
    pub batch_size: usize,
    /// Peak learning rate (linear warm-up, cosine decay to 10% over all steps).
    pub lr: f64,
    /// Learning-rate warm-up steps.
    pub lr_warmup: usize,
    /// Weight `λ` of the BLEU term next to cross-entropy.
    pub lambda: f64,
    /// Label smoothing of every cross-entropy term (warm-up and arms).
    pub label_smoothing: f64,
    /// Dropout on the embeddings and residual branches of the teacher-forced training pass
    /// (the soft free-running decode has none).
    pub dropout: f32,
    /// Extra free-running steps beyond the batch's longest reference + EOS.
    pub free_running_margin: usize,
    /// Dev evaluation every this many steps.
    pub eval_every: usize,
    /// The longest greedy decode.
    pub max_decode_len: usize,
}

impl TrainConfig {
    /// The warm-up's and an objective's steps together.
    pub fn total_steps(&self) -> usize {
        self.warmup_steps + self.arm_steps
    }
}

/// Token-level cross-entropy over the real target positions (words and EOS; [`PAD`] is
/// ignored) with label smoothing `label_smoothing`: the crate's fused
/// `cross_entropy_from_logits`.
fn masked_cross_entropy(logits: &Tensor, batch: &Batch, label_smoothing: f64) -> Result<Tensor> {
    let cfg = CrossEntropyConfig {
        pad_id: Some(PAD),
        label_smoothing,
        ..Default::default()
    };
    Ok(cross_entropy_from_logits(logits, &batch.dec_out, &cfg)?.loss)
}

/// The teacher-forced BLEU loss of logits `[B, T+1, V]`: `Given` scores the `T` reference
/// positions, `NotEos` also the position that should predict EOS, `SoftEos` every position.
fn teacher_forced_bleu(
    logits: &Tensor,
    batch: &Batch,
    examples: &[&Encoded],
    cfg: &BleuLossConfig,
) -> Result<Tensor> {
    let refs = References::from_ids(&batch.refs, PAD)?;
    let extra = match cfg.length {
        LengthModel::Given => Some(0),
        LengthModel::NotEos { .. } => Some(1),
        LengthModel::SoftEos { .. } => None,
    };
    let lengths = extra
        .map(|extra| {
            let lengths: Vec<u32> = examples
                .iter()
                .map(|e| (e.tgt.len() + extra) as u32)
                .collect();
            Tensor::from_vec(lengths, examples.len(), logits.device())
        })
        .transpose()?;
    Ok(bleu_loss_from_logits(logits, lengths.as_ref(), &refs, cfg)?.loss)
}

/// The seed's model at its random initialisation.
pub fn init_model(cfg: &TrainConfig, seed: u64, device: &Device) -> Result<(VarMap, Transformer)> {
    let varmap = VarMap::new();
    let model = Transformer::new(cfg.model, &varmap, seed, device)?;
    Ok((varmap, model))
}

/// A seed's cross-entropy warm-up: the weights it ended with and its log.
pub struct WarmStart {
    /// The weights.
    pub snapshot: Snapshot,
    /// Every logged step.
    pub log: Vec<LogRow>,
}

/// Greedy decodes of `examples` (key/value-cached decoder on detached weights), as tokens.
pub fn translate(
    varmap: &VarMap,
    cfg: &TrainConfig,
    examples: &[Encoded],
    vocab: &Vocab,
    device: &Device,
) -> Result<Vec<Vec<String>>> {
    let decoder = SoftDecoder::new(&weights_of(varmap, true), cfg.model)?;
    let mut out = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(250) {
        let refs: Vec<&Encoded> = chunk.iter().collect();
        let src = source_tensor(&refs, device)?;
        for ids in decoder.greedy(&src, cfg.max_decode_len)? {
            out.push(vocab.decode(&ids)?);
        }
    }
    Ok(out)
}

/// What a stretch of training optimises.
pub struct Stretch<'a> {
    /// `None`: cross-entropy alone (the warm-up).
    pub arm: Option<&'a Arm>,
    /// Global step numbers `first..last` (for the learning rate and the log).
    pub first: usize,
    /// See `first`.
    pub last: usize,
    /// Batch-order seed.
    pub seed: u64,
}

/// The weights of a stretch's best dev evaluation.
pub struct Best {
    /// Its dev BLEU (greedy).
    pub dev_bleu: f64,
    /// Global step.
    pub step: usize,
    /// The weights.
    pub snapshot: Snapshot,
}

/// Trains `model` for the stretch's steps with a fresh AdamW; logs every `eval_every` global
/// steps and at the stretch's end, and returns the weights of the stretch's best dev
/// evaluation (the first among equals; the stretch's end is always evaluated).
pub fn train(
    varmap: &VarMap,
    model: &Transformer,
    stretch: &Stretch,
    context: &TrainingContext<TrainConfig>,
    progress: &ProgressBar,
) -> Result<(Vec<LogRow>, StepTime, Best)> {
    let TrainingContext { cfg, data, device } = *context;
    let mut optimizer = adamw(varmap, cfg.lr)?;
    let mut best: Option<Best> = None;
    let name = stretch.arm.map_or("ce warm-up", |a| a.name);
    let soft = match stretch.arm.map(|a| a.decode) {
        Some(Decode::FreeRunning(_)) => {
            Some(SoftDecoder::new(&weights_of(varmap, false), cfg.model)?)
        }
        _ => None,
    };
    let yardstick = BleuLossConfig::default();
    let mut batches = Batches::new(
        data.train.len(),
        cfg.batch_size,
        stretch.seed.wrapping_mul(1_000_003) ^ stretch.first as u64,
    )?;
    // Seeded like the batches: every arm of a seed sees the same masks on the same batches.
    let mut dropout = Dropout::new(
        cfg.dropout,
        stretch.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ stretch.first as u64,
    );
    let mut log = Vec::new();
    let zero = Tensor::zeros((), candle_core::DType::F32, device)?;
    let (mut ce_sum, mut bleu_sum, mut window) = (zero.clone(), zero.clone(), 0usize);
    let (mut step_wall, mut step_cpu) = (0.0, 0.0);
    for step in stretch.first..stretch.last {
        let started = Instant::now();
        let cpu_started = process_cpu_s();
        optimizer.set_learning_rate(learning_rate(
            cfg.lr,
            cfg.lr_warmup,
            cfg.total_steps(),
            step,
        ));
        let (examples, batch, logits) =
            teacher_forced_logits(model, data, &mut batches, &mut dropout, device)?;
        let ce = masked_cross_entropy(&logits, &batch, cfg.label_smoothing)?;
        let monitored = teacher_forced_bleu(&logits.detach(), &batch, &examples, &yardstick)?;
        let mut loss = match stretch.arm {
            Some(arm) if !arm.ce => None,
            _ => Some(ce.clone()),
        };
        if let Some(arm) = stretch.arm {
            if let Some((form, length)) = arm.bleu {
                let bleu_cfg = BleuLossConfig {
                    form,
                    length,
                    ..BleuLossConfig::default()
                };
                let bleu = match arm.decode {
                    Decode::TeacherForced => {
                        teacher_forced_bleu(&logits, &batch, &examples, &bleu_cfg)?
                    }
                    Decode::FreeRunning(feedback) => {
                        let decoder = soft.as_ref().expect("built for free-running arms");
                        let longest = examples.iter().map(|e| e.tgt.len()).max().unwrap_or(1);
                        // BOS takes the first position.
                        let steps =
                            (longest + 1 + cfg.free_running_margin).min(cfg.model.max_len - 1);
                        let feedback = match feedback {
                            Feedback::Gumbel { tau, .. } => Feedback::Gumbel {
                                tau,
                                seed: stretch.seed.wrapping_mul(7919) + step as u64,
                            },
                            other => other,
                        };
                        let soft_memory = decoder.encode(&batch.src)?;
                        let free_logits = decoder.unroll(&soft_memory, steps, feedback)?;
                        let refs = References::from_ids(&batch.refs, PAD)?;
                        bleu_loss_from_logits(&free_logits, None, &refs, &bleu_cfg)?.loss
                    }
                };
                loss = Some(match loss {
                    Some(ce) => (ce + (bleu * cfg.lambda)?)?,
                    None => bleu,
                });
            }
        }
        let loss = loss.expect("every arm has cross-entropy or a BLEU term");
        optimizer.backward_step(&loss)?;
        ce_sum = (ce_sum + ce.detach())?;
        bleu_sum = (bleu_sum + monitored)?;
        window += 1;
        step_wall += started.elapsed().as_secs_f64();
        step_cpu += process_cpu_s() - cpu_started;
        progress.inc(1);
        if (step + 1) % cfg.eval_every == 0 || step + 1 == stretch.last {
            let ce_mean = f64::from(ce_sum.to_scalar::<f32>()?) / window as f64;
            let bleu_mean = f64::from(bleu_sum.to_scalar::<f32>()?) / window as f64;
            if !ce_mean.is_finite() || !bleu_mean.is_finite() {
                bail!(
                    "{name} seed {}: non-finite loss before step {}",
                    stretch.seed,
                    step + 1
                );
            }
            let dev_hyps = translate(varmap, cfg, &data.dev, &data.tgt_vocab, device)?;
            let dev_bleu = eval::bleu_100(&dev_hyps, &data.dev_refs)?;
            let message = format!("ce {ce_mean:.3} -logBLEU {bleu_mean:.3} dev {dev_bleu:.2}");
            if progress.is_hidden() {
                // No terminal (output redirected): one line per evaluation instead of a bar.
                eprintln!("{name} seed {} step {}: {message}", stretch.seed, step + 1);
            }
            progress.set_message(message);
            log.push(LogRow {
                step: step + 1,
                ce_loss: ce_mean,
                bleu_loss: bleu_mean,
                dev_bleu,
            });
            if best.as_ref().is_none_or(|b| dev_bleu > b.dev_bleu) {
                best = Some(Best {
                    dev_bleu,
                    step: step + 1,
                    snapshot: snapshot(varmap)?,
                });
            }
            (ce_sum, bleu_sum, window) = (zero.clone(), zero.clone(), 0);
        }
    }
    let steps = (stretch.last - stretch.first).max(1) as f64;
    let Some(best) = best else {
        bail!(
            "{name} seed {}: an empty stretch has no checkpoint",
            stretch.seed
        );
    };
    Ok((
        log,
        StepTime {
            wall_s: step_wall / steps,
            cpu_s: step_cpu / steps,
        },
        best,
    ))
}
