//! The data-parallel fixture shared by `tests/distributed.rs` (threads) and `tests/mpi.rs`
//! (MPI ranks): a tiny linear model over a batch of 5 sequences, its single-process loss and
//! parameter gradients, and the same computed by one worker of a data-parallel group on its
//! shard — in f64, so that the two agree to round-off.
#![allow(dead_code)]

use candle_bleu::loss::distributed::{shard_range, AllReduce, DataParallel};
use candle_bleu::loss::{
    ce_bleu_from_hidden, ce_bleu_from_logits, BleuLossConfig, CrossEntropyConfig, Form,
    HiddenConfig, LengthModel, LossSmoothing, Reduction, References, TrainingLossConfig,
    TrainingTargets,
};
use candle_core::{Device, Result, Tensor, Var};
use candle_nn::Linear;

/// What a worker passes the loss: the logits `x W + b`, or the hidden states `x` and the output
/// layer `(Wᵀ, b)` with blocks of two rows (the hidden-state path, never storing the logits).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Input {
    Logits,
    Hidden,
}

impl Input {
    /// Blocks of two rows: several blocks per shard.
    pub fn blocks() -> HiddenConfig {
        HiddenConfig {
            block_elements: 2 * VOCAB,
            ..Default::default()
        }
    }
}

pub const PAD: u32 = 0;
pub const EOS: u32 = 5;
pub const BATCH: usize = 5;
pub const SEQ: usize = 6;
pub const VOCAB: usize = 9;
pub const FEATURES: usize = 4;

/// Reference ids `[B, R = 2, T = 6]` (PAD-padded; the second reference of some elements is
/// empty), with repeated n-grams and EOS inside some references.
const REFS: [[[u32; 6]; 2]; BATCH] = [
    [[1, 2, 1, 2, 3, 0], [2, 1, 2, 3, 0, 0]],
    [[4, 4, 6, 7, 0, 0], [0, 0, 0, 0, 0, 0]],
    [[3, 8, 3, 8, 3, 5], [8, 3, 8, 1, 2, 0]],
    [[6, 7, 1, 0, 0, 0], [6, 6, 7, 1, 5, 2]],
    [[2, 2, 2, 8, 1, 4], [0, 0, 0, 0, 0, 0]],
];

/// Hypothesis lengths (for the `Given` and `NotEos` length models).
const LENGTHS: [u32; BATCH] = [6, 4, 5, 3, 6];

/// The model, inputs and targets; `pad_shard` makes every target of elements 3 and 4 padding,
/// so that the last worker of a group of 2, 3 or 5 holds only padding (the shards of 5 are
/// 3 + 2, 2 + 2 + 1, 1 each).
pub struct Fixture {
    /// `[B, S, D]` input features.
    pub x: Tensor,
    /// `[D, V]` and `[V]`: the parameters' initial values.
    pub weight: Tensor,
    pub bias: Tensor,
    pub ref_ids: Tensor,
    pub targets: Tensor,
    pub lengths: Tensor,
}

fn seeded(n: usize, seed: u64, scale: f64) -> Vec<f64> {
    // A small LCG: the fixture must be identical in every process.
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect()
}

impl Fixture {
    pub fn new(pad_shard: bool) -> Result<Self> {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(
            seeded(BATCH * SEQ * FEATURES, 1, 1.0),
            (BATCH, SEQ, FEATURES),
            &dev,
        )?;
        let weight = Tensor::from_vec(seeded(FEATURES * VOCAB, 2, 1.5), (FEATURES, VOCAB), &dev)?;
        let bias = Tensor::from_vec(seeded(VOCAB, 3, 0.5), VOCAB, &dev)?;
        let ref_ids = Tensor::new(&REFS, &dev)?;
        let mut targets: Vec<[u32; SEQ]> = REFS.iter().map(|r| r[0]).collect();
        // Some padding inside the batch.
        targets[2][5] = PAD;
        if pad_shard {
            targets[3] = [PAD; SEQ];
            targets[4] = [PAD; SEQ];
        }
        let targets = Tensor::from_vec(targets.concat(), (BATCH, SEQ), &dev)?;
        let lengths = Tensor::new(&LENGTHS, &dev)?;
        Ok(Self {
            x,
            weight,
            bias,
            ref_ids,
            targets,
            lengths,
        })
    }

    /// The same fixture on `device`.
    pub fn on(&self, device: &Device) -> Result<Self> {
        Ok(Self {
            x: self.x.to_device(device)?,
            weight: self.weight.to_device(device)?,
            bias: self.bias.to_device(device)?,
            ref_ids: self.ref_ids.to_device(device)?,
            targets: self.targets.to_device(device)?,
            lengths: self.lengths.to_device(device)?,
        })
    }

    /// The parameters as fresh variables (each worker has its own copy).
    pub fn vars(&self) -> Result<[Var; 2]> {
        Ok([
            Var::from_tensor(&self.weight)?,
            Var::from_tensor(&self.bias)?,
        ])
    }

    /// `logits = x W + b` of elements `start..start + len`: `[len, S, V]`.
    pub fn logits(&self, vars: &[Var; 2], start: usize, len: usize) -> Result<Tensor> {
        self.x
            .narrow(0, start, len)?
            .broadcast_matmul(vars[0].as_tensor())?
            .broadcast_add(vars[1].as_tensor())
    }

    /// Loss, cross-entropy and BLEU loss of elements `start..start + len`, single-process or
    /// through `reduce`, and the gradients of the two parameters (summed over the group).
    pub fn run(
        &self,
        cfg: &TrainingLossConfig,
        range: (usize, usize),
        reduce: Option<&dyn AllReduce>,
        input: Input,
    ) -> Result<Outcome> {
        let (start, len) = range;
        let vars = self.vars()?;
        let logits = self.logits(&vars, start, len)?;
        let hidden = self.x.narrow(0, start, len)?;
        let proj = Linear::new(vars[0].as_tensor().t()?, Some(vars[1].as_tensor().clone()));
        let blocks = Input::blocks();
        let refs = References::from_ids(&self.ref_ids.narrow(0, start, len)?, PAD)?;
        let targets = self.targets.narrow(0, start, len)?;
        let lengths = self.lengths.narrow(0, start, len)?;
        let lengths = match cfg.bleu.length {
            LengthModel::SoftEos { .. } => None,
            _ => Some(&lengths),
        };
        let step_targets = TrainingTargets {
            tokens: &targets,
            refs: &refs,
            hyp_lengths: lengths,
        };
        let group = reduce.map(DataParallel::new);
        let step = match (group, input) {
            (None, Input::Logits) => ce_bleu_from_logits(&logits, &step_targets, cfg)?,
            (None, Input::Hidden) => {
                ce_bleu_from_hidden(&hidden, &proj, &step_targets, cfg, &blocks)?
            }
            (Some(dp), Input::Logits) => dp.ce_bleu_from_logits(&logits, &step_targets, cfg)?,
            (Some(dp), Input::Hidden) => {
                dp.ce_bleu_from_hidden(&hidden, &proj, &step_targets, cfg, &blocks)?
            }
        };
        let mut grads = step.loss.backward()?;
        if let Some(dp) = group {
            dp.sum_gradients(&mut grads, &vars)?;
        }
        let grad = |v: &Var| -> Result<Vec<f64>> {
            grads
                .get(v.as_tensor())
                .expect("a parameter gradient")
                .flatten_all()?
                .to_vec1::<f64>()
        };
        Ok(Outcome {
            loss: step.loss.to_scalar()?,
            cross_entropy: step.cross_entropy.to_scalar()?,
            bleu: step.bleu.loss.to_scalar()?,
            grad_weight: grad(&vars[0])?,
            grad_bias: grad(&vars[1])?,
        })
    }

    /// The whole batch in one process, from the logits: the reference every worker is held to.
    pub fn single(&self, cfg: &TrainingLossConfig) -> Result<Outcome> {
        self.run(cfg, (0, BATCH), None, Input::Logits)
    }

    /// Worker `reduce.rank()`'s view of the batch, split over `reduce.world_size()` workers,
    /// from the logits.
    pub fn worker(&self, cfg: &TrainingLossConfig, reduce: &dyn AllReduce) -> Result<Outcome> {
        self.worker_from(cfg, reduce, Input::Logits)
    }

    /// Worker `reduce.rank()`'s view of the batch from `input`.
    pub fn worker_from(
        &self,
        cfg: &TrainingLossConfig,
        reduce: &dyn AllReduce,
        input: Input,
    ) -> Result<Outcome> {
        let range = shard_range(BATCH, reduce.rank(), reduce.world_size())?;
        self.run(cfg, range, Some(reduce), input)
    }
}

/// The values a run produces.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub loss: f64,
    pub cross_entropy: f64,
    pub bleu: f64,
    pub grad_weight: Vec<f64>,
    pub grad_bias: Vec<f64>,
}

impl Outcome {
    /// The largest difference to `other`, relative to `max(1, |value|)`, over every number.
    pub fn max_difference(&self, other: &Outcome) -> f64 {
        let scalars = [
            (self.loss, other.loss),
            (self.cross_entropy, other.cross_entropy),
            (self.bleu, other.bleu),
        ];
        let grads = self
            .grad_weight
            .iter()
            .zip(&other.grad_weight)
            .chain(self.grad_bias.iter().zip(&other.grad_bias))
            .map(|(&a, &b)| (a, b));
        scalars
            .into_iter()
            .chain(grads)
            .map(|(a, b): (f64, f64)| (a - b).abs() / a.abs().max(1.0))
            .fold(0.0, f64::max)
    }
}

/// The configurations the split is checked on: every form × length model × reduction, with
/// and without padding and label smoothing in the cross-entropy.
pub fn configs() -> Vec<TrainingLossConfig> {
    let mut configs = Vec::new();
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [
            LengthModel::Given,
            LengthModel::NotEos { eos_id: EOS },
            LengthModel::SoftEos { eos_id: EOS },
        ] {
            for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                for (ce, smoothing) in [
                    (
                        CrossEntropyConfig {
                            pad_id: Some(PAD),
                            label_smoothing: 0.1,
                            ..Default::default()
                        },
                        LossSmoothing::AddK(1.0),
                    ),
                    (
                        CrossEntropyConfig {
                            pad_id: None,
                            label_smoothing: 0.0,
                            ..Default::default()
                        },
                        LossSmoothing::None,
                    ),
                ] {
                    configs.push(TrainingLossConfig {
                        bleu_weight: 0.7,
                        ce,
                        bleu: BleuLossConfig {
                            max_order: 3,
                            form,
                            length,
                            reduction,
                            smoothing,
                            ..Default::default()
                        },
                    });
                }
            }
        }
    }
    configs
}

/// A short name of a configuration, for failure messages.
pub fn describe(cfg: &TrainingLossConfig) -> String {
    format!(
        "{:?}/{:?}/{:?}/pad {:?}/ε {}",
        cfg.bleu.form, cfg.bleu.length, cfg.bleu.reduction, cfg.ce.pad_id, cfg.ce.label_smoothing
    )
}
