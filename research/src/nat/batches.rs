//! NAT training batches: sources, the uniform-copy decoder inputs at each target's length,
//! targets without BOS/EOS and the length predictor's classes.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

use crate::model::nat::{length_class, DecoderInputs};
use crate::translate::batches::IdPairs;

/// Right-pads `rows` with `pad` into u32 `[B, max len]` (at least one column).
pub fn pad_rows(rows: &[&[u32]], pad: u32, device: &Device) -> Result<Tensor> {
    let width = rows.iter().map(|r| r.len()).max().unwrap_or(0).max(1);
    let mut flat = vec![pad; rows.len() * width];
    for (i, row) in rows.iter().enumerate() {
        flat[i * width..][..row.len()].copy_from_slice(row);
    }
    Ok(Tensor::from_vec(flat, (rows.len(), width), device)?)
}

/// One NAT training batch of `B` pairs.
pub struct NatBatch {
    /// u32 `[B, Ts]`: sources, right-padded.
    pub src: Tensor,
    /// The decoder's inputs at the targets' lengths.
    pub inputs: DecoderInputs,
    /// u32 `[B, T]`: targets (no BOS/EOS), right-padded: the cross-entropy's targets and the
    /// BLEU loss's references.
    pub targets: Tensor,
    /// u32 `[B]`: the targets' lengths, the BLEU loss's hypothesis lengths.
    pub lengths: Tensor,
    /// u32 `[B]`: the length predictor's class of each pair.
    pub length_classes: Tensor,
}

/// The batch of `indices` of `pairs` (every source and target non-empty).
pub fn make_nat_batch(
    pairs: &IdPairs,
    indices: &[usize],
    pad: u32,
    device: &Device,
) -> Result<NatBatch> {
    if indices.is_empty() {
        bail!("a NAT batch needs at least one pair");
    }
    let sources: Vec<&[u32]> = indices.iter().map(|&i| pairs.src[i].as_slice()).collect();
    let targets: Vec<&[u32]> = indices.iter().map(|&i| pairs.tgt[i].as_slice()).collect();
    let lengths: Vec<usize> = targets.iter().map(|t| t.len()).collect();
    let classes: Vec<u32> = sources
        .iter()
        .zip(&lengths)
        .map(|(s, &t)| length_class(s.len(), t).0)
        .collect();
    let b = indices.len();
    Ok(NatBatch {
        src: pad_rows(&sources, pad, device)?,
        inputs: DecoderInputs::new(&sources, &lengths, pad, device)?,
        targets: pad_rows(&targets, pad, device)?,
        lengths: Tensor::from_vec(
            lengths.iter().map(|&l| l as u32).collect::<Vec<_>>(),
            b,
            device,
        )?,
        length_classes: Tensor::from_vec(classes, b, device)?,
    })
}

/// The share of `pairs` whose offset `T − S` lies outside the length predictor's classes.
pub fn clipped_share(pairs: &IdPairs) -> f64 {
    let clipped = pairs
        .src
        .iter()
        .zip(&pairs.tgt)
        .filter(|(s, t)| length_class(s.len(), t.len()).1)
        .count();
    clipped as f64 / pairs.len().max(1) as f64
}

/// `pairs` without those with an empty side (a NAT target needs a length >= 1), and how many
/// were left out.
pub fn non_empty(pairs: IdPairs) -> (IdPairs, usize) {
    let mut kept = IdPairs::default();
    let mut dropped = 0;
    for (s, t) in pairs.src.into_iter().zip(pairs.tgt) {
        if s.is_empty() || t.is_empty() {
            dropped += 1;
        } else {
            kept.src.push(s);
            kept.tgt.push(t);
        }
    }
    (kept, dropped)
}
