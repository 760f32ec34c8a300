//! Shared helpers of the loss tests: random batches and the discrete statistics they must match.
#![allow(dead_code)]

use candle_bleu::loss::{BleuLossConfig, BleuStats, Form, LengthModel, LossSmoothing, Reduction};
use candle_core::{DType, Device, Result, Tensor};
use std::sync::OnceLock;

pub const PAD: u32 = 0;

/// The device the loss tests run on, from `CANDLE_BLEU_TEST_DEVICE`: `cpu` (default), `cuda`
/// or `metal`. The GPU ones need the crate built with the matching feature (`--features cuda`
/// / `metal`); without it the first test fails with candle's "not compiled with ... support".
/// One device for the whole test binary: two `Device::new_cuda(0)` are two devices to candle.
/// On CUDA the crate's CUDA kernels run (the `cuda` feature), the `_composed` functions
/// composed candle ops. Every tensor a test hands the loss must be on this device: the loss
/// refuses arguments on two devices.
pub fn test_device() -> Device {
    static DEVICE: OnceLock<Device> = OnceLock::new();
    DEVICE
        .get_or_init(|| {
            let wanted = std::env::var("CANDLE_BLEU_TEST_DEVICE").unwrap_or_default();
            let device = match wanted.as_str() {
                "" | "cpu" => Ok(Device::Cpu),
                "cuda" => Device::new_cuda(0),
                "metal" => Device::new_metal(0),
                other => {
                    panic!("CANDLE_BLEU_TEST_DEVICE must be cpu, cuda or metal, got {other:?}")
                }
            };
            device.unwrap_or_else(|e| panic!("CANDLE_BLEU_TEST_DEVICE={wanted}: {e}"))
        })
        .clone()
}

/// Whether the test device computes in f64. Metal has no f64: f64 checks are skipped there,
/// with a note, and stay f64 everywhere else.
pub fn f64_supported(test: &str) -> bool {
    let supported = !test_device().is_metal();
    if !supported {
        eprintln!("{test}: skipped on Metal, which has no f64");
    }
    supported
}

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
                        ..Default::default()
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
    Tensor::from_vec(data, (ids.len(), seq, vocab), &test_device())
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
    Tensor::from_vec(data, (refs.len(), max_refs, max_len), &test_device())
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

/// Collapses a CTC alignment: repeats merged, then blanks removed.
pub fn ctc_collapse(alignment: &[u32], blank: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut previous = None;
    for &symbol in alignment {
        if Some(symbol) != previous && symbol != blank {
            out.push(symbol);
        }
        previous = Some(symbol);
    }
    out
}

/// Softmax of one row of logits, in f64.
pub fn softmax_row(row: &[f64]) -> Vec<f64> {
    let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = row.iter().map(|z| (z - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}
