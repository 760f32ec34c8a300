//! What a NAT run minimises, and one training step.
//!
//! - `ce`: label-smoothed cross-entropy at the training target's length (the control, and the
//!   baseline's objective);
//! - `bon2`: the bag-of-2-grams objective of Shao et al. (2020) through the crate's loss from
//!   the decoder's hidden states, expected form, `LengthModel::Given` at the targets' lengths,
//!   2-grams only and no smoothing ([`bon2_config`]), either as the corpus `−log(ΣM₂/ΣT₂)`
//!   ([`Bon2Form::NegLog`]) or as Shao's per-sentence `1 − mean_b(m_b/t_b)` over the
//!   sentences with `T_b >= 2` ([`Bon2Form::Shao`]);
//! - `bleu4`: the crate's default `−log BLEU` (expected form, 4-grams, add-1 smoothing).
//!
//! Each is pure or mixed with the cross-entropy as `CE + λ·L` ([`Mixing`]), and every
//! objective adds the length predictor's loss with weight [`LENGTH_LOSS_WEIGHT`].

use anyhow::Result;
use candle_bleu::loss::{
    bleu_loss_from_hidden, ce_bleu_from_hidden, cross_entropy_from_hidden, BleuLossConfig,
    BleuLossOutput, CrossEntropyConfig, HiddenConfig, LossSmoothing, Reduction, References,
    TrainingLossConfig, TrainingTargets,
};
use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::batches::NatBatch;
use crate::model::nat::Nat;
use crate::model::transformer::Dropout;

/// The weight of the length predictor's cross-entropy in every objective.
pub const LENGTH_LOSS_WEIGHT: f64 = 0.1;

/// How the bag-of-2-grams statistics become a loss.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Bon2Form {
    /// The crate's corpus `−log(ΣM₂ / ΣT₂)` (sentences weighted by length).
    NegLog,
    /// Shao et al.'s `1 − mean_b(m_b / t_b)` (each sentence weighted equally).
    Shao,
}

/// Whether a BLEU-type loss is used alone or added to the cross-entropy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Mixing {
    /// The loss alone (plus the length loss).
    Pure,
    /// `CE + λ · loss`.
    WithCe(f64),
}

impl Mixing {
    /// `pure` or `ce+λ2.3`.
    pub fn label(self) -> String {
        match self {
            Mixing::Pure => "pure".into(),
            Mixing::WithCe(lambda) => format!("ce+λ{lambda}"),
        }
    }
}

/// What a NAT run minimises.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum NatObjective {
    /// Label-smoothed cross-entropy.
    Ce,
    /// The bag-of-2-grams objective.
    Bon2 {
        /// `−log` corpus form or Shao's.
        form: Bon2Form,
        /// Alone or with CE.
        mixing: Mixing,
    },
    /// The crate's default `−log BLEU`.
    Bleu4 {
        /// Alone or with CE.
        mixing: Mixing,
    },
}

impl NatObjective {
    /// `ce`, `bon2`, `bleu4`.
    pub fn name(&self) -> &'static str {
        match self {
            NatObjective::Ce => "ce",
            NatObjective::Bon2 { .. } => "bon2",
            NatObjective::Bleu4 { .. } => "bleu4",
        }
    }

    /// The name with its configuration, as a directory name: `bon2-shao-pure`,
    /// `bleu4-ce+λ9`.
    pub fn label(&self) -> String {
        match self {
            NatObjective::Ce => "ce".into(),
            NatObjective::Bon2 { form, mixing } => {
                let form = match form {
                    Bon2Form::NegLog => "log",
                    Bon2Form::Shao => "shao",
                };
                format!("bon2-{form}-{}", mixing.label())
            }
            NatObjective::Bleu4 { mixing } => format!("bleu4-{}", mixing.label()),
        }
    }
}

/// The bag-of-2-grams configuration: 2-grams only (weights `[0, 1]`), no smoothing (add-k
/// would smooth the only weighted order), corpus reduction (a sentence mean gives gradients
/// `∝ 1/m` and none to sentences without a match), the expected form and given lengths (at
/// the reference length the brevity penalty is 0 and carries no gradient).
pub fn bon2_config() -> BleuLossConfig {
    BleuLossConfig {
        max_order: 2,
        weights: Some(vec![0.0, 1.0]),
        smoothing: LossSmoothing::None,
        reduction: Reduction::Corpus,
        ..Default::default()
    }
}

/// Shao et al.'s objective from the loss's differentiable statistics:
/// `1 − mean_b(matches[b, 1] / totals[b, 1])` over the sentences with a 2-gram (`T_b >= 2`);
/// a scalar in the statistics' dtype.
pub fn shao_loss(out: &BleuLossOutput) -> Result<Tensor> {
    let matches = out.stats.matches.narrow(1, 1, 1)?.squeeze(1)?;
    let totals = out.stats.totals.narrow(1, 1, 1)?.squeeze(1)?;
    let counted = totals.gt(0.0)?.to_dtype(matches.dtype())?;
    let precision = (matches / totals.clamp(1.0, f64::MAX)?)?;
    let sentences = counted.sum_all()?.clamp(1.0, f64::MAX)?;
    let mean = ((precision * &counted)?.sum_all()? / sentences)?;
    Ok(mean.neg()?.affine(1.0, 1.0)?)
}

/// Settings every NAT step shares.
#[derive(Debug, Clone)]
pub struct StepSettings {
    /// Padding and label smoothing of the cross-entropy.
    pub cross_entropy: CrossEntropyConfig,
    /// Blocks of the hidden-state losses.
    pub hidden: HiddenConfig,
    /// The padding id.
    pub pad: u32,
}

/// One training step's `(loss, its cross-entropy part)` (scalars) of `objective` on `batch`,
/// with `dropout`'s masks. A pure objective has no cross-entropy: its second value is the
/// objective's own term, detached.
pub fn step_loss(
    model: &Nat,
    batch: &NatBatch,
    objective: NatObjective,
    settings: &StepSettings,
    dropout: &mut Dropout,
) -> Result<(Tensor, Tensor)> {
    let memory = model.encode(&batch.src, settings.pad, Some(dropout))?;
    let states = model.decode(&batch.inputs, &memory, Some(dropout))?;
    let length = (model.length_loss(&memory, &batch.length_classes)? * LENGTH_LOSS_WEIGHT)?;
    let proj = &model.output_projection()?;
    let ce_only = || -> Result<Tensor> {
        Ok(cross_entropy_from_hidden(
            &states,
            proj,
            &batch.targets,
            &settings.cross_entropy,
            &settings.hidden,
        )?
        .loss)
    };
    let (bleu, form, mixing) = match objective {
        NatObjective::Ce => {
            let ce = ce_only()?;
            return Ok(((&ce + length)?, ce));
        }
        NatObjective::Bon2 { form, mixing } => (bon2_config(), form, mixing),
        NatObjective::Bleu4 { mixing } => (BleuLossConfig::default(), Bon2Form::NegLog, mixing),
    };
    let refs = References::from_ids(&batch.targets, settings.pad)?;
    let term = |out: &BleuLossOutput| -> Result<Tensor> {
        match form {
            Bon2Form::NegLog => Ok(out.loss.clone()),
            Bon2Form::Shao => shao_loss(out),
        }
    };
    let (main, ce) = match mixing {
        Mixing::Pure => {
            let lengths = Some(&batch.lengths);
            let out =
                bleu_loss_from_hidden(&states, proj, lengths, &refs, &bleu, &settings.hidden)?;
            let main = term(&out)?.to_dtype(DType::F32)?;
            let logged = main.detach();
            (main, logged)
        }
        Mixing::WithCe(lambda) => {
            let cfg = TrainingLossConfig {
                bleu_weight: lambda,
                ce: settings.cross_entropy.clone(),
                bleu,
            };
            let targets =
                TrainingTargets::new(&batch.targets, &refs).with_hyp_lengths(&batch.lengths);
            let out = ce_bleu_from_hidden(&states, proj, &targets, &cfg, &settings.hidden)?;
            let main = match form {
                // `CE + λ·(−log …)`, as the crate computes it.
                Bon2Form::NegLog => out.loss,
                Bon2Form::Shao => {
                    let shao = shao_loss(&out.bleu)?.to_dtype(DType::F32)?;
                    (&out.cross_entropy + (shao * lambda)?)?
                }
            };
            (main, out.cross_entropy)
        }
    };
    Ok(((main + length)?, ce))
}
