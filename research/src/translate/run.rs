//! One training run of a translation study: an objective, a seed, a step budget, dev-based
//! checkpoint selection and early stopping, checkpoints that let an interrupted run resume.
//!
//! Objectives ([`Objective`]):
//! - `ce`: label-smoothed token cross-entropy (from the decoder states and the tied output
//!   projection, `candle_bleu::loss::cross_entropy_from_hidden`);
//! - `ce+<form>`: `CE + λ · (−log BLEU)` with the BLEU loss on the teacher-forced distributions
//!   (`candle_bleu::loss::ce_bleu_from_hidden`);
//! - `mrt`: `CE + μ · risk`, minimum risk training over sampled candidates ([`crate::mrt`]).
//!
//! A run is a function of its spec: batches and dropout masks are drawn from `(seed, step)`,
//! so the objectives of one seed see the same batches and masks, and a run resumed from its
//! checkpoint continues as an uninterrupted one would (up to the thread-count dependence of
//! the floating-point sums).

use anyhow::{bail, Result};
use candle_bleu::loss::{
    ce_bleu_from_hidden, cross_entropy_from_hidden, BleuLossConfig, CrossEntropyConfig, Form,
    HiddenConfig, References, TrainingLossConfig, TrainingTargets,
};
use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

use super::batches::{make_batch, BatchIds, Batches, IdPairs};
use super::data::SplitData;
use super::evaluate::sentence_bleu_13a;
use crate::checkpoint::{
    keep_step_checkpoint, load_json, load_vars, save_json, save_optimizer, save_vars,
};
use crate::data::{BOS, EOS, PAD};
use crate::decode::{sample, SampleConfig, Specials};
use crate::model::transformer::{Dropout, Transformer, TransformerConfig};
use crate::mrt::{risk, sequence_log_probs};
use crate::optim::{AdamW, AdamWConfig};

/// What a run minimises.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Objective {
    /// Label-smoothed cross-entropy.
    Ce,
    /// `CE + λ · BLEU loss` in the given form.
    CeBleu {
        /// Expected, lower bound or paired.
        form: FormName,
        /// `λ`.
        lambda: f64,
    },
    /// `CE + μ · risk` (minimum risk training).
    Mrt {
        /// `μ`.
        mu: f64,
    },
}

/// The BLEU loss's forms, as names a results file can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FormName {
    /// `Form::Expected`.
    Expected,
    /// `Form::LowerBound`.
    LowerBound,
    /// `Form::Paired`.
    Paired,
}

impl FormName {
    /// The loss's form.
    pub fn form(self) -> Form {
        match self {
            FormName::Expected => Form::Expected,
            FormName::LowerBound => Form::LowerBound,
            FormName::Paired => Form::Paired,
        }
    }

    /// `expected`, `lower-bound`, `paired`.
    pub fn as_str(self) -> &'static str {
        match self {
            FormName::Expected => "expected",
            FormName::LowerBound => "lower-bound",
            FormName::Paired => "paired",
        }
    }
}

impl Objective {
    /// `ce`, `ce+expected`, `ce+lower-bound`, `ce+paired`, `mrt`.
    pub fn name(&self) -> String {
        match self {
            Objective::Ce => "ce".into(),
            Objective::CeBleu { form, .. } => format!("ce+{}", form.as_str()),
            Objective::Mrt { .. } => "mrt".into(),
        }
    }
}

/// The learning rate over steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Schedule {
    /// Linear warm-up to `peak` over `warmup` steps, then `peak · sqrt(warmup / step)`
    /// (Vaswani et al. 2017).
    InverseSqrt {
        /// Peak learning rate.
        peak: f64,
        /// Warm-up steps.
        warmup: usize,
    },
    /// A constant rate.
    Constant(f64),
}

impl Schedule {
    /// The rate at step `step` (1-based).
    pub fn at(&self, step: usize) -> f64 {
        match *self {
            Schedule::InverseSqrt { peak, warmup } => {
                let (s, w) = (step.max(1) as f64, warmup.max(1) as f64);
                peak * (s / w).min((w / s).sqrt())
            }
            Schedule::Constant(lr) => lr,
        }
    }
}

/// Settings shared by every run of a study.
pub struct Setup<'a> {
    /// The model's sizes (dropout included).
    pub model: TransformerConfig,
    /// Special ids.
    pub ids: BatchIds,
    /// Label smoothing and padding of the cross-entropy.
    pub cross_entropy: CrossEntropyConfig,
    /// The BLEU loss (its `form` is overridden per objective).
    pub bleu: BleuLossConfig,
    /// Blocks of the hidden-state losses.
    pub hidden: HiddenConfig,
    /// Training pairs.
    pub train: &'a IdPairs,
    /// Training references as text (MRT's costs).
    pub train_text: &'a [String],
    /// Sentences per batch.
    pub batch_size: usize,
    /// MRT: sources per step that get candidates (the first of the batch), candidates per
    /// source, and the sharpness `α`.
    pub mrt_sources: usize,
    /// MRT candidates per source.
    pub mrt_candidates: usize,
    /// MRT `α`.
    pub mrt_alpha: f64,
    /// Detokenises ids to text.
    pub detokenize: &'a (dyn Fn(&[u32]) -> String + Sync),
    /// Sentence BLEU (0–100) of a hypothesis text against a reference text: MRT's cost is
    /// `1 − bleu/100`.
    pub sentence_bleu: &'a (dyn Fn(&str, &str) -> f64 + Sync),
    /// Dev BLEU (0–100) of the model, greedy decoding: the selection criterion.
    pub dev_bleu: &'a (dyn Fn(&Transformer) -> Result<f64> + Sync),
    /// The device.
    pub device: Device,
}

/// What a study chooses of [`Setup::recipe`]: the model and the batches' two numbers.
#[derive(Debug, Clone, Copy)]
pub struct RecipeConfig {
    /// The model's sizes (dropout included).
    pub model: TransformerConfig,
    /// Sentences per batch.
    pub batch_size: usize,
    /// The cross-entropy's label smoothing.
    pub label_smoothing: f64,
}

impl<'a> Setup<'a> {
    /// The translate study's recipe on `train` with `cfg`'s model, batch size and label
    /// smoothing: padding `PAD`, BOS/EOS, the default BLEU loss, 4 Mi-logit blocks, MRT with 16
    /// sources × 4 candidates at `α = 1` and sacrebleu's sentence BLEU as its cost.
    pub fn recipe(
        cfg: RecipeConfig,
        train: &'a SplitData,
        detokenize: &'a (dyn Fn(&[u32]) -> String + Sync),
        dev_bleu: &'a (dyn Fn(&Transformer) -> Result<f64> + Sync),
        device: Device,
    ) -> Self {
        let RecipeConfig {
            model,
            batch_size,
            label_smoothing,
        } = cfg;
        Self {
            model,
            ids: BatchIds {
                pad: PAD,
                bos: BOS,
                eos: EOS,
            },
            cross_entropy: CrossEntropyConfig {
                pad_id: Some(PAD),
                label_smoothing,
                ..Default::default()
            },
            bleu: BleuLossConfig::default(),
            // The committed study's block size (the library's default then). The blocks set
            // the order in which the weight gradient is summed, so another size trains a model
            // that differs in rounding, and its scores by seed-level noise.
            hidden: HiddenConfig {
                block_elements: 4 << 20,
                ..HiddenConfig::default()
            },
            train: &train.ids,
            train_text: &train.references,
            batch_size,
            mrt_sources: 16,
            mrt_candidates: 4,
            mrt_alpha: 1.0,
            detokenize,
            sentence_bleu: &sentence_bleu_13a,
            dev_bleu,
            device,
        }
    }
}

/// A [`Transformer`] of `config` with the weights of `weights` (safetensors).
pub fn load_model(
    config: TransformerConfig,
    weights: &Path,
    device: &Device,
) -> Result<Transformer> {
    let mut varmap = VarMap::new();
    let model = Transformer::new(config, &varmap, 0, device)?;
    load_vars(&mut varmap, weights)?;
    Ok(model)
}

/// One run; `O` names what it minimises (translate's [`Objective`] by default, the NAT study's
/// own objectives in [`crate::nat`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSpec<O = Objective> {
    /// Directory of the run's checkpoints and state.
    pub dir: PathBuf,
    /// Model initialisation and dropout seed.
    pub seed: u64,
    /// Batch-order seed (the same for every objective of a seed: a paired design).
    pub batch_seed: u64,
    /// What to minimise.
    pub objective: O,
    /// Start from these weights instead of the seed's initialisation.
    pub init: Option<PathBuf>,
    /// Step budget.
    pub max_steps: usize,
    /// Dev evaluation (and checkpoint) every this many steps.
    pub eval_every: usize,
    /// Stop after this many evaluations without a new best (none: run the whole budget).
    pub patience: Option<usize>,
    /// Only evaluations at this step or later are selection candidates, and only they count
    /// towards `patience` (a warm-up window, as the seq2seq study scores its best dev
    /// evaluation after the warm-up). 0: every evaluation, the starting point of a fine-tune
    /// included.
    #[serde(default)]
    pub select_from: usize,
    /// Learning rate.
    pub schedule: Schedule,
    /// Keep the weights of the last this many dev evaluations as step checkpoints
    /// (`checkpoint::step_checkpoint`), for checkpoint averaging; 0 keeps none.
    #[serde(default)]
    pub keep_last: usize,
}

/// One dev evaluation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Eval {
    /// Steps trained.
    pub step: usize,
    /// Dev BLEU, greedy decoding.
    pub dev_bleu: f64,
    /// Mean training loss since the last evaluation (none for the starting point).
    pub train_loss: Option<f64>,
    /// Mean cross-entropy part since the last evaluation (none for the starting point).
    pub train_ce: Option<f64>,
}

/// A run's persisted state (`state.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunState<O = Objective> {
    /// The spec the state belongs to.
    pub spec: RunSpec<O>,
    /// Steps completed.
    pub step: usize,
    /// Evaluations so far (the first at step 0 when the run starts from `init`).
    pub evals: Vec<Eval>,
    /// Step of the best dev BLEU (its weights are `best.safetensors`).
    pub best_step: usize,
    /// The best dev BLEU.
    pub best_dev_bleu: f64,
    /// Seconds spent in training steps (evaluation excluded).
    pub train_seconds: f64,
    /// Seconds spent in dev evaluation.
    pub eval_seconds: f64,
    /// The run has finished (budget or early stop).
    pub done: bool,
}

impl<O> RunState<O> {
    /// Milliseconds per training step.
    pub fn ms_per_step(&self) -> f64 {
        1e3 * self.train_seconds / self.step.max(1) as f64
    }
}

/// A seed for `(seed, purpose, step)`: purpose 1 is a step's dropout masks.
pub fn mix(seed: u64, purpose: u64, step: usize) -> u64 {
    let mut x = seed
        ^ purpose.wrapping_mul(0xA24B_AED4_963E_E407)
        ^ (step as u64).wrapping_mul(0x9FB2_1C65_1E98_DF25);
    x ^= x >> 33;
    x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x ^ (x >> 33)
}

/// Paths in a run directory.
pub fn best_weights(dir: &std::path::Path) -> PathBuf {
    dir.join("best.safetensors")
}

/// What the objective of a run may be: anything a `state.json` can hold and compare.
pub trait RunObjective:
    Clone + PartialEq + std::fmt::Debug + Serialize + serde::de::DeserializeOwned
{
}

impl<O: Clone + PartialEq + std::fmt::Debug + Serialize + serde::de::DeserializeOwned> RunObjective
    for O
{
}

/// A training step of a run: `(pair indices of the batch, step)` → `(loss, its
/// cross-entropy part)`, both scalars. It draws its own dropout masks (from [`mix`]`(seed, 1,
/// step)`), so a step is a function of the spec and the step alone.
pub type StepLoss<'a> = dyn FnMut(&[usize], usize) -> Result<(Tensor, Tensor)> + 'a;

/// The two functions [`train_run`] calls on the model: each step's loss, and the dev BLEU
/// (0–100) that selects the checkpoints.
pub struct RunFunctions<'r, 's> {
    /// The step's `(loss, cross-entropy)` scalars from the batch's pair indices and the step.
    pub step_loss: &'r mut StepLoss<'s>,
    /// The model's dev BLEU, evaluated every `eval_every` steps.
    pub dev_bleu: &'r dyn Fn() -> Result<f64>,
}

/// Runs (or resumes, or just loads when done) `spec` over the model whose variables are
/// `varmap` (freshly initialised from `spec.seed`): AdamW on `functions.step_loss`'s loss over
/// the batches of `batches`, `functions.dev_bleu` every `spec.eval_every` steps, the best
/// weights kept, checkpoints that let an interrupted run resume. `on_step` reports progress.
pub fn train_run<O: RunObjective>(
    spec: &RunSpec<O>,
    varmap: &mut VarMap,
    batches: &Batches,
    functions: RunFunctions,
    on_step: &mut dyn FnMut(&RunState<O>),
) -> Result<RunState<O>> {
    let RunFunctions {
        step_loss,
        dev_bleu,
    } = functions;
    if spec.eval_every == 0 || spec.max_steps == 0 {
        bail!("eval_every and max_steps must be >= 1: {spec:?}");
    }
    std::fs::create_dir_all(&spec.dir)?;
    let state_path = spec.dir.join("state.json");
    let model_path = spec.dir.join("model.safetensors");
    let optim_path = spec.dir.join("optim.safetensors");
    let vars = varmap.data().lock().expect("VarMap lock").clone();
    let mut optimizer = AdamW::new(&vars, AdamWConfig::default())?;
    let previous: Option<RunState<O>> = load_json(&state_path)?;
    let mut state = match previous {
        Some(state) if state.spec.objective == spec.objective && state.spec.seed == spec.seed => {
            if state.done {
                return Ok(state);
            }
            load_vars(varmap, &model_path)?;
            optimizer.load(&optim_path)?;
            state
        }
        _ => {
            if let Some(init) = &spec.init {
                load_vars(varmap, init)?;
            }
            let mut state = RunState {
                spec: spec.clone(),
                step: 0,
                evals: Vec::new(),
                best_step: 0,
                best_dev_bleu: f64::NEG_INFINITY,
                train_seconds: 0.0,
                eval_seconds: 0.0,
                done: false,
            };
            if spec.init.is_some() {
                // The starting point is a candidate too: a fine-tune that never beats it
                // selects it.
                let started = Instant::now();
                let dev = dev_bleu()?;
                state.eval_seconds += started.elapsed().as_secs_f64();
                state.evals.push(Eval {
                    step: 0,
                    dev_bleu: dev,
                    train_loss: None,
                    train_ce: None,
                });
                state.best_dev_bleu = dev;
                save_vars(varmap, &best_weights(&spec.dir))?;
            }
            state
        }
    };
    // A window longer than the budget still selects the last evaluation.
    let select_from = spec.select_from.min(spec.max_steps);
    let (mut loss_sum, mut ce_sum, mut since) = (0.0, 0.0, 0usize);
    while state.step < spec.max_steps {
        let step = state.step;
        let started = Instant::now();
        optimizer.config.lr = spec.schedule.at(step + 1);
        let (loss, ce) = step_loss(batches.at(step), step)?;
        optimizer.backward_step(&loss)?;
        loss_sum += f64::from(loss.to_dtype(candle_core::DType::F32)?.to_scalar::<f32>()?);
        ce_sum += f64::from(ce.to_dtype(candle_core::DType::F32)?.to_scalar::<f32>()?);
        since += 1;
        state.train_seconds += started.elapsed().as_secs_f64();
        state.step += 1;
        if state.step % spec.eval_every == 0 || state.step == spec.max_steps {
            let started = Instant::now();
            let dev = dev_bleu()?;
            state.eval_seconds += started.elapsed().as_secs_f64();
            state.evals.push(Eval {
                step: state.step,
                dev_bleu: dev,
                train_loss: Some(loss_sum / since as f64),
                train_ce: Some(ce_sum / since as f64),
            });
            (loss_sum, ce_sum, since) = (0.0, 0.0, 0);
            if state.step >= select_from && dev > state.best_dev_bleu {
                state.best_dev_bleu = dev;
                state.best_step = state.step;
                save_vars(varmap, &best_weights(&spec.dir))?;
            }
            let since_best = state
                .evals
                .iter()
                .filter(|e| e.step > state.best_step && e.step >= select_from)
                .count();
            if spec.patience.is_some_and(|p| since_best >= p) || state.step == spec.max_steps {
                state.done = true;
            }
            keep_step_checkpoint(varmap, &spec.dir, state.step, spec.keep_last)?;
            save_vars(varmap, &model_path)?;
            save_optimizer(&optimizer, &optim_path)?;
            save_json(&state, &state_path)?;
            if state.done {
                on_step(&state);
                break;
            }
        }
        on_step(&state);
    }
    Ok(state)
}

/// Runs (or resumes, or just loads when done) `spec` with translate's model and objectives
/// ([`train_run`]). `on_step(state)` reports progress.
pub fn run(spec: &RunSpec, setup: &Setup, on_step: &mut dyn FnMut(&RunState)) -> Result<RunState> {
    let mut varmap = VarMap::new();
    let model = Transformer::new(setup.model, &varmap, spec.seed, &setup.device)?;
    let batches = Batches::new(setup.train, setup.batch_size, spec.batch_seed)?;
    let specials = Specials {
        bos: setup.ids.bos,
        eos: setup.ids.eos,
        pad: setup.ids.pad,
    };
    let dev_bleu = || (setup.dev_bleu)(&model);
    let mut step_loss = |indices: &[usize], step: usize| -> Result<(Tensor, Tensor)> {
        let batch = make_batch(setup.train, indices, setup.ids, &setup.device)?;
        let mut dropout = Dropout::new(setup.model.dropout, mix(spec.seed, 1, step));
        let memory = model.encode(&batch.src, setup.ids.pad, Some(&mut dropout))?;
        let states = model.decode(&batch.dec_in, &memory, Some(&mut dropout))?;
        let proj = &model.output_projection()?;
        Ok(match spec.objective {
            Objective::Ce => {
                let (cfg, blocks) = (&setup.cross_entropy, &setup.hidden);
                let ce =
                    cross_entropy_from_hidden(&states, proj, &batch.dec_out, cfg, blocks)?.loss;
                (ce.clone(), ce)
            }
            Objective::CeBleu { form, lambda } => {
                let cfg = TrainingLossConfig {
                    bleu_weight: lambda,
                    ce: setup.cross_entropy.clone(),
                    bleu: BleuLossConfig {
                        form: form.form(),
                        ..setup.bleu.clone()
                    },
                };
                let refs = References::from_ids(&batch.refs, setup.ids.pad)?;
                let targets =
                    TrainingTargets::new(&batch.dec_out, &refs).with_hyp_lengths(&batch.ref_len);
                let out = ce_bleu_from_hidden(&states, proj, &targets, &cfg, &setup.hidden)?;
                (out.loss, out.cross_entropy)
            }
            Objective::Mrt { mu } => {
                let (cfg, blocks) = (&setup.cross_entropy, &setup.hidden);
                let ce =
                    cross_entropy_from_hidden(&states, proj, &batch.dec_out, cfg, blocks)?.loss;
                let r = mrt_risk(
                    &model,
                    &batch.indices,
                    &batch.src,
                    setup,
                    specials,
                    mix(spec.seed, 2, step),
                    &mut dropout,
                )?;
                ((&ce + (r * mu)?)?, ce)
            }
        })
    };
    let functions = RunFunctions {
        step_loss: &mut step_loss,
        dev_bleu: &dev_bleu,
    };
    train_run(spec, &mut varmap, &batches, functions, on_step)
}

/// MRT's risk for the first `setup.mrt_sources` sources of the batch: candidates sampled from
/// the current model (no dropout), duplicates removed, costs `1 − sentence BLEU / 100`
/// against the reference text, then scored with dropout like the rest of the step.
fn mrt_risk(
    model: &Transformer,
    indices: &[usize],
    src: &Tensor,
    setup: &Setup,
    specials: Specials,
    seed: u64,
    dropout: &mut Dropout,
) -> Result<Tensor> {
    let sources = setup.mrt_sources.min(indices.len());
    let k = setup.mrt_candidates;
    let src = src.narrow(0, 0, sources)?;
    let sampling = SampleConfig {
        copies: k,
        seed,
        ..Default::default()
    };
    let candidates = sample(model, &src, specials, sampling)?;
    let mut costs = vec![0f32; sources * k];
    let mut valid = vec![0f32; sources * k];
    for s in 0..sources {
        let reference = &setup.train_text[indices[s]];
        for j in 0..k {
            let candidate = &candidates[s * k + j];
            if candidates[s * k..s * k + j].contains(candidate) {
                continue;
            }
            valid[s * k + j] = 1.0;
            let text = (setup.detokenize)(candidate);
            costs[s * k + j] = (1.0 - (setup.sentence_bleu)(&text, reference) / 100.0) as f32;
        }
    }
    // Teacher-forced log-probabilities of every candidate (duplicates too; they are masked).
    let longest = candidates.iter().map(Vec::len).max().unwrap_or(0) + 1;
    let n = sources * k;
    let mut dec_in = vec![specials.pad; n * longest];
    let mut dec_out = vec![specials.pad; n * longest];
    for (r, c) in candidates.iter().enumerate() {
        dec_in[r * longest] = specials.bos;
        dec_in[r * longest + 1..][..c.len()].copy_from_slice(c);
        dec_out[r * longest..][..c.len()].copy_from_slice(c);
        dec_out[r * longest + c.len()] = specials.eos;
    }
    let device = src.device();
    let dec_in = Tensor::from_vec(dec_in, (n, longest), device)?;
    let dec_out = Tensor::from_vec(dec_out, (n, longest), device)?;
    let repeat: Vec<u32> = (0..sources as u32)
        .flat_map(|s| std::iter::repeat_n(s, k))
        .collect();
    let src_rep = src.index_select(&Tensor::from_vec(repeat, n, device)?, 0)?;
    let memory = model.encode(&src_rep, specials.pad, Some(dropout))?;
    let states = model.decode(&dec_in, &memory, Some(dropout))?;
    let logits = model.logits(&states)?;
    let log_probs = sequence_log_probs(&logits, &dec_out, specials.pad)?.reshape((sources, k))?;
    let costs = Tensor::from_vec(costs, (sources, k), device)?;
    let valid = Tensor::from_vec(valid, (sources, k), device)?;
    risk(&log_probs, &costs, &valid, setup.mrt_alpha)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;
    use std::cell::Cell;

    /// Only evaluations from `select_from` on are selected and count towards the patience.
    #[test]
    fn selection_window() -> Result<()> {
        let device = Device::Cpu;
        let pairs = IdPairs {
            src: vec![vec![4]; 4],
            tgt: vec![vec![5]; 4],
        };
        let batches = Batches::new(&pairs, 2, 1)?;
        let dev_by_step = [50.0, 40.0, 10.0, 20.0, 15.0, 12.0, 11.0, 10.0];
        let run = |select_from: usize, name: &str| -> Result<RunState<()>> {
            let dir = std::env::temp_dir().join(format!(
                "candle-bleu-select-window-{}-{name}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            let mut varmap = VarMap::new();
            let w = varmap.get((1,), "w", candle_nn::Init::Const(1.0), DType::F32, &device)?;
            let spec = RunSpec {
                dir: dir.clone(),
                seed: 1,
                batch_seed: 1,
                objective: (),
                init: None,
                max_steps: 8,
                eval_every: 1,
                patience: Some(2),
                select_from,
                schedule: Schedule::Constant(1e-3),
                keep_last: 2,
            };
            let evals = Cell::new(0usize);
            let dev = || {
                evals.set(evals.get() + 1);
                Ok(dev_by_step[evals.get() - 1])
            };
            let mut step = |_: &[usize], _: usize| {
                let loss = w.sum_all()?;
                Ok((loss.clone(), loss))
            };
            let functions = RunFunctions {
                step_loss: &mut step,
                dev_bleu: &dev,
            };
            let state = train_run(&spec, &mut varmap, &batches, functions, &mut |_| {})?;
            // The weights of the last two evaluations are kept, for averaging.
            let kept: Vec<usize> = crate::checkpoint::step_checkpoints(&dir)?
                .into_iter()
                .map(|(step, _)| step)
                .collect();
            assert_eq!(kept, [state.step - 1, state.step]);
            std::fs::remove_dir_all(&dir)?;
            Ok(state)
        };
        // Without a window: best at step 1, stopped after 2 evaluations without a new best.
        let plain = run(0, "plain")?;
        assert_eq!((plain.best_step, plain.step), (1, 3));
        // From step 3: best at step 4 (20), stopped at step 6.
        let windowed = run(3, "window")?;
        assert_eq!((windowed.best_step, windowed.step), (4, 6));
        assert_eq!(windowed.best_dev_bleu, 20.0);
        Ok(())
    }
}
