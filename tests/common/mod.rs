//! Shared helpers of the loss tests: random batches and the discrete statistics they must match.
#![allow(dead_code)]

use candle_bleu::loss::{BleuLossConfig, BleuStats, Form, LengthModel, LossSmoothing, Reduction};
use candle_core::{DType, Device, Result, Tensor};

pub const PAD: u32 = 0;

/// Every configuration the properties range over.
pub fn all_configs(max_order: usize, eos_id: u32) -> Vec<BleuLossConfig> {
    let mut configs = Vec::new();
    for form in [Form::Expected, Form::Paired, Form::LowerBound] {
        for length in [
            LengthModel::Given,
            LengthModel::NotEos { eos_id },
            LengthModel::SoftEos { eos_id },
        ] {
            for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                for smoothing in [LossSmoothing::None, LossSmoothing::AddK(1.0)] {
                    configs.push(BleuLossConfig {
                        max_order,
                        weights: None,
                        form,
                        length,
                        reduction,
                        smoothing,
                    });
                }
            }
        }
    }
    configs
}

/// One-hot rows `[B, S, V]` (f64) for hypothesis ids `[b][i]`.
pub fn one_hot(ids: &[Vec<u32>], vocab: usize) -> Result<Tensor> {
    let seq = ids[0].len();
    let mut data = vec![0f64; ids.len() * seq * vocab];
    for (b, row) in ids.iter().enumerate() {
        for (i, &id) in row.iter().enumerate() {
            data[(b * seq + i) * vocab + id as usize] = 1.0;
        }
    }
    Tensor::from_vec(data, (ids.len(), seq, vocab), &Device::Cpu)
}

/// References `[b][r]` as a padded u32 `[B, R, T]` tensor.
pub fn reference_ids(refs: &[Vec<Vec<u32>>], pad: u32) -> Result<Tensor> {
    let max_refs = refs.iter().map(|r| r.len()).max().unwrap();
    let max_len = refs.iter().flatten().map(|r| r.len()).max().unwrap();
    let mut data = vec![pad; refs.len() * max_refs * max_len];
    for (b, element) in refs.iter().enumerate() {
        for (r, reference) in element.iter().enumerate() {
            let offset = (b * max_refs + r) * max_len;
            data[offset..offset + reference.len()].copy_from_slice(reference);
        }
    }
    Tensor::from_vec(data, (refs.len(), max_refs, max_len), &Device::Cpu)
}

pub fn to_vec2(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap()
}

pub fn to_vec1(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap()
}

pub fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

/// The four statistics as one [`BleuStats`] (cloned handles: same storage, same graph).
pub fn stats_of(
    matches: &Tensor,
    totals: &Tensor,
    hyp_len: &Tensor,
    ref_len: &Tensor,
) -> BleuStats {
    BleuStats {
        matches: matches.clone(),
        totals: totals.clone(),
        hyp_len: hyp_len.clone(),
        ref_len: ref_len.clone(),
    }
}
