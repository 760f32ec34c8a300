//! What a CTC NAT run minimises, and one training step.
//!
//! - `ctc`: the CTC loss (`candle_bleu::loss::ctc_loss_from_logits`, blank [`BLANK`], mean
//!   reduction: each sentence's loss over its target length, then the batch mean) — the
//!   baseline's objective and the fine-tuning control;
//! - `ctc+bon2`: the bag-of-2-grams objective on the CTC outputs
//!   (`candle_bleu::loss::ctc_bleu_loss_from_logits` with the NAT study's
//!   [`bon2_config`]: the exact expected 2-gram counts of the collapsed sequence, corpus
//!   `−log(ΣM₂/ΣT₂)`), added to the CTC loss as `CTC + λ·L` or alone ([`Mixing`]; `WithCe(λ)`
//!   here mixes with the CTC loss);
//! - `ctc+bleu4`: the crate's default `−log BLEU` (4-grams, add-1 smoothing, brevity penalty on
//!   the expected length) on the CTC outputs, mixed as `ctc+bon2`.

use anyhow::Result;
use candle_bleu::loss::{
    ctc_bleu_loss_from_logits, ctc_loss_from_logits, ctc_ngram_f_loss, BleuLossConfig, CtcConfig,
    CtcNgramFConfig, CtcReduction, References,
};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::batches::CtcBatch;
use crate::model::ctc_nat::{CtcNat, BLANK};
use crate::model::transformer::Dropout;
use crate::nat::objective::{bon2_config, Mixing};

/// What a CTC NAT run minimises.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum CtcObjective {
    /// The CTC loss.
    Ctc,
    /// `−log p₂ − log BP` on the CTC outputs (weights `[0, 1]`: the bigram precision with the
    /// brevity penalty, named bag-of-2-grams here), alone or with the CTC loss.
    Bon2 {
        /// Alone or `CTC + λ·L`.
        mixing: Mixing,
    },
    /// The crate's default `−log BLEU` on the CTC outputs, alone or with the CTC loss.
    Bleu4 {
        /// Alone or `CTC + λ·L`.
        mixing: Mixing,
    },
    /// NMLA's bigram F-measure on the CTC outputs (`ctc_ngram_f_loss`, order 2, the sentence
    /// mean), alone or with the CTC loss.
    Nmla2 {
        /// Alone or `CTC + λ·L`.
        mixing: Mixing,
    },
}

impl CtcObjective {
    /// `ctc`, `ctc+bon2`, `ctc+bleu4`, `ctc+nmla2`.
    pub fn name(&self) -> &'static str {
        match self {
            CtcObjective::Ctc => "ctc",
            CtcObjective::Bon2 { .. } => "ctc+bon2",
            CtcObjective::Bleu4 { .. } => "ctc+bleu4",
            CtcObjective::Nmla2 { .. } => "ctc+nmla2",
        }
    }

    /// The name with its mixing, as a directory name: `ctc`, `bon2-pure`, `bon2-ce+λ1`
    /// (`ce+λ` is [`Mixing`]'s label: here the base loss is the CTC loss).
    pub fn label(&self) -> String {
        match self {
            CtcObjective::Ctc => "ctc".into(),
            CtcObjective::Bon2 { mixing } => format!("bon2-{}", mixing.label()),
            CtcObjective::Bleu4 { mixing } => format!("bleu4-{}", mixing.label()),
            CtcObjective::Nmla2 { mixing } => format!("nmla2-{}", mixing.label()),
        }
    }

    /// The BLEU loss's configuration and mixing (`None` for `ctc`).
    pub fn bleu(&self) -> Option<(BleuLossConfig, Mixing)> {
        match *self {
            CtcObjective::Ctc => None,
            CtcObjective::Bon2 { mixing } => Some((bon2_config(), mixing)),
            CtcObjective::Bleu4 { mixing } => Some((BleuLossConfig::default(), mixing)),
            CtcObjective::Nmla2 { .. } => None,
        }
    }

    /// The mixing of the n-gram term with CTC (`None` for the control).
    pub fn mixing(&self) -> Option<Mixing> {
        match *self {
            CtcObjective::Ctc => None,
            CtcObjective::Bon2 { mixing }
            | CtcObjective::Bleu4 { mixing }
            | CtcObjective::Nmla2 { mixing } => Some(mixing),
        }
    }
}

/// The CTC loss's configuration: blank [`BLANK`], mean reduction, no `zero_infinity` (the
/// training pairs are feasible: [`super::batches::feasible_pairs`]).
pub fn ctc_config() -> CtcConfig {
    CtcConfig {
        blank: BLANK,
        reduction: CtcReduction::Mean,
        zero_infinity: false,
        check_values: false,
    }
}

/// One training step's `(loss, its CTC part)` (f32 scalars) of `objective` on `batch`, with
/// `dropout`'s masks; `pad` pads the targets. A pure BLEU objective's CTC part is computed for
/// the log only (detached).
pub fn step_loss(
    model: &CtcNat,
    batch: &CtcBatch,
    objective: CtcObjective,
    pad: u32,
    dropout: &mut Dropout,
) -> Result<(Tensor, Tensor)> {
    let (logits, frames) = model.forward(&batch.src, &batch.inputs, pad, Some(dropout))?;
    let ctc = ctc_loss_from_logits(
        &logits,
        &batch.targets,
        &frames,
        &batch.target_lengths,
        &ctc_config(),
    )?
    .to_dtype(DType::F32)?;
    let Some(mixing) = objective.mixing() else {
        return Ok((ctc.clone(), ctc));
    };
    let refs = References::from_ids(&batch.targets, pad)?;
    let term = match objective.bleu() {
        Some((bleu, _)) => {
            ctc_bleu_loss_from_logits(&logits, Some(&frames), &refs, BLANK, &bleu)?.loss
        }
        None => {
            let cfg = CtcNgramFConfig::default(); // bigrams, the sentence mean: NMLA's
            ctc_ngram_f_loss(&logits, Some(&frames), &refs, BLANK, &cfg)?.loss
        }
    };
    let term = term.to_dtype(DType::F32)?;
    Ok(match mixing {
        Mixing::Pure => (term, ctc.detach()),
        Mixing::WithCe(lambda) => ((&ctc + (term * lambda)?)?, ctc),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctc_nat::batches::make_ctc_batch;
    use crate::model::transformer::{PositionAdd, TransformerConfig};
    use crate::optim::{AdamW, AdamWConfig};
    use crate::translate::batches::IdPairs;
    use candle_core::Device;
    use candle_nn::VarMap;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    fn config() -> TransformerConfig {
        TransformerConfig {
            src_vocab: 12,
            tgt_vocab: 12,
            d_model: 16,
            heads: 2,
            d_ff: 32,
            encoder_layers: 1,
            decoder_layers: 1,
            max_len: 24,
            dropout: 0.0,
            tie_all: true,
            positions: PositionAdd::Broadcast,
        }
    }

    /// Random pairs over ids 4..12 (no PAD, BOS, EOS), each feasible at ratio 2.
    fn pairs() -> IdPairs {
        let mut rng = StdRng::seed_from_u64(5);
        let mut pairs = IdPairs::default();
        for _ in 0..6 {
            let s = rng.gen_range(2..6);
            let src: Vec<u32> = (0..s).map(|_| rng.gen_range(4..12)).collect();
            let tgt: Vec<u32> = (0..s).map(|_| rng.gen_range(4..12)).collect();
            pairs.src.push(src);
            pairs.tgt.push(tgt);
        }
        pairs
    }

    /// A few AdamW steps on one batch: every objective's loss falls, and is finite.
    #[test]
    fn training_steps_lower_every_objective() -> Result<()> {
        let device = Device::Cpu;
        let pairs = pairs();
        let indices: Vec<usize> = (0..pairs.len()).collect();
        for objective in [
            CtcObjective::Ctc,
            CtcObjective::Bon2 {
                mixing: Mixing::WithCe(1.0),
            },
            CtcObjective::Bon2 {
                mixing: Mixing::Pure,
            },
            CtcObjective::Bleu4 {
                mixing: Mixing::WithCe(1.0),
            },
            CtcObjective::Nmla2 {
                mixing: Mixing::WithCe(1.0),
            },
        ] {
            let varmap = VarMap::new();
            let model = CtcNat::new(config(), 2, &varmap, 1, &device)?;
            let vars = varmap.data().lock().expect("VarMap lock").clone();
            let mut optimizer = AdamW::new(
                &vars,
                AdamWConfig {
                    lr: 1e-2,
                    ..AdamWConfig::default()
                },
            )?;
            let batch = make_ctc_batch(&model, &pairs, &indices, 0, &device)?;
            let mut losses = Vec::new();
            for step in 0..4 {
                let mut dropout = Dropout::new(0.0, step);
                let (loss, ctc) = step_loss(&model, &batch, objective, 0, &mut dropout)?;
                let value = loss.to_scalar::<f32>()?;
                assert!(value.is_finite() && ctc.to_scalar::<f32>()?.is_finite());
                losses.push(value);
                optimizer.backward_step(&loss)?;
            }
            assert!(
                losses[3] < losses[0],
                "{}: the loss did not fall: {losses:?}",
                objective.label()
            );
        }
        Ok(())
    }
}
