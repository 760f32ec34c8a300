//! Differentiable BLEU loss (SPEC §2). SKELETON: types and signatures fixed (issue 3); bodies being written.

use candle_core::{Result, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    #[default]
    Expected,
    Paired,
    LowerBound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LengthModel {
    #[default]
    Given,
    NotEos {
        eos_id: u32,
    },
    SoftEos {
        eos_id: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    #[default]
    Corpus,
    SentenceMean,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LossSmoothing {
    None,
    AddK(f64),
}

impl Default for LossSmoothing {
    fn default() -> Self {
        LossSmoothing::AddK(1.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BleuLossConfig {
    pub max_order: usize,
    pub weights: Option<Vec<f64>>,
    pub form: Form,
    pub length: LengthModel,
    pub reduction: Reduction,
    pub smoothing: LossSmoothing,
}

impl Default for BleuLossConfig {
    fn default() -> Self {
        Self {
            max_order: 4,
            weights: None,
            form: Form::Expected,
            length: LengthModel::Given,
            reduction: Reduction::Corpus,
            smoothing: LossSmoothing::AddK(1.0),
        }
    }
}

pub struct References {
    _private: (),
}

impl References {
    pub fn from_ids(ids: &Tensor, pad_id: u32) -> Result<Self> {
        let _ = (ids, pad_id);
        todo!()
    }
    pub fn from_matrices(refs: &Tensor, lengths: &Tensor) -> Result<Self> {
        let _ = (refs, lengths);
        todo!()
    }
}

pub struct BleuLossOutput {
    pub loss: Tensor,
    pub matches: Tensor,
    pub totals: Tensor,
    pub hyp_len: Tensor,
    pub ref_len: Tensor,
}

pub fn bleu_loss(
    hyp_probs: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let _ = (hyp_probs, hyp_lengths, refs, cfg);
    todo!()
}

pub fn bleu_loss_from_logits(
    logits: &Tensor,
    hyp_lengths: Option<&Tensor>,
    refs: &References,
    cfg: &BleuLossConfig,
) -> Result<BleuLossOutput> {
    let _ = (logits, hyp_lengths, refs, cfg);
    todo!()
}

pub fn loss_from_stats(
    matches: &Tensor,
    totals: &Tensor,
    hyp_len: &Tensor,
    ref_len: &Tensor,
    cfg: &BleuLossConfig,
) -> Result<Tensor> {
    let _ = (matches, totals, hyp_len, ref_len, cfg);
    todo!()
}
