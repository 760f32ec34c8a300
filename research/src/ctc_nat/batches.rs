//! CTC NAT training batches, and which pairs a CTC NAT can learn at all.
//!
//! CTC needs an alignment: a target of `L` tokens with `k` adjacent repeats (a blank must
//! separate two equal tokens) needs at least `L + k` frames, and a source of `S` tokens gives
//! `r·S` ([`crate::model::ctc_nat::frames`]). Training pairs with fewer frames than that have
//! no alignment (their CTC loss is `+inf`); the study leaves them out and counts them
//! ([`feasible_pairs`]) rather than zeroing them with `zero_infinity`, which would keep them in
//! the batch mean's denominator and still give them the BLEU term's gradient.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};

use crate::model::ctc_nat::{CtcNat, BLANK};
use crate::model::nat::DecoderInputs;
use crate::nat::batches::pad_rows;
use crate::translate::batches::IdPairs;

/// The frames CTC needs for `target`: its length plus its adjacent repeats.
pub fn frames_needed(target: &[u32]) -> usize {
    target.len() + target.windows(2).filter(|w| w[0] == w[1]).count()
}

/// Whether a pair has an alignment in `frames` frames.
pub fn feasible(target: &[u32], frames: usize) -> bool {
    frames_needed(target) <= frames
}

/// `pairs` without those a CTC NAT at `frames(S)` frames cannot align (and without an empty
/// side, or a target holding the blank — never the case: the teacher's search excludes BOS and
/// BPE never emits a special id), and how many were left out.
pub fn feasible_pairs(pairs: &IdPairs, frames: impl Fn(usize) -> usize) -> (IdPairs, usize) {
    let mut kept = IdPairs::default();
    let mut dropped = 0;
    for (s, t) in pairs.src.iter().zip(&pairs.tgt) {
        if s.is_empty() || t.is_empty() || t.contains(&BLANK) || !feasible(t, frames(s.len())) {
            dropped += 1;
        } else {
            kept.src.push(s.clone());
            kept.tgt.push(t.clone());
        }
    }
    (kept, dropped)
}

/// How many of `pairs` have more target tokens (with repeats) than their source's frames:
/// references the model cannot produce whole (dev and test are never filtered).
pub fn infeasible_count(pairs: &IdPairs, frames: impl Fn(usize) -> usize) -> usize {
    pairs
        .src
        .iter()
        .zip(&pairs.tgt)
        .filter(|(s, t)| !feasible(t, frames(s.len())))
        .count()
}

/// One CTC NAT training batch of `B` pairs.
pub struct CtcBatch {
    /// u32 `[B, Ts]`: sources, right-padded.
    pub src: Tensor,
    /// The decoder's upsampled inputs (`T'_b = r·S_b` frames).
    pub inputs: DecoderInputs,
    /// u32 `[B, L]`: targets (no BOS/EOS), right-padded with `pad`: the CTC targets and the
    /// BLEU loss's references.
    pub targets: Tensor,
    /// u32 `[B]`: the targets' lengths.
    pub target_lengths: Tensor,
}

/// The batch of `indices` of `pairs` (each feasible: [`feasible_pairs`]).
pub fn make_ctc_batch(
    model: &CtcNat,
    pairs: &IdPairs,
    indices: &[usize],
    pad: u32,
    device: &Device,
) -> Result<CtcBatch> {
    if indices.is_empty() {
        bail!("a CTC batch needs at least one pair");
    }
    let sources: Vec<&[u32]> = indices.iter().map(|&i| pairs.src[i].as_slice()).collect();
    let targets: Vec<&[u32]> = indices.iter().map(|&i| pairs.tgt[i].as_slice()).collect();
    let lengths: Vec<u32> = targets.iter().map(|t| t.len() as u32).collect();
    Ok(CtcBatch {
        src: pad_rows(&sources, pad, device)?,
        inputs: model.upsampled_inputs(&sources, pad, device)?,
        targets: pad_rows(&targets, pad, device)?,
        target_lengths: Tensor::from_vec(lengths, indices.len(), device)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_need_a_blank_between() {
        assert_eq!(frames_needed(&[4, 5, 6]), 3);
        assert_eq!(frames_needed(&[4, 4, 5, 5, 5]), 8);
        assert!(feasible(&[4, 4], 3));
        assert!(!feasible(&[4, 4], 2));
        assert!(feasible(&[], 1));
    }

    #[test]
    fn infeasible_pairs_are_dropped_and_counted() {
        let pairs = IdPairs {
            src: vec![vec![4, 5], vec![6], vec![7], vec![8, 9], vec![]],
            tgt: vec![
                vec![10, 11, 12, 13], // 4 <= 2·2: kept
                vec![10, 11, 12],     // 3 > 2·1: dropped
                vec![10, 10],         // 2 + 1 repeat = 3 > 2: dropped
                vec![10, 10, 11],     // 3 + 1 = 4 <= 4: kept
                vec![10],             // empty source: dropped
            ],
        };
        let (kept, dropped) = feasible_pairs(&pairs, |s| 2 * s);
        assert_eq!(dropped, 3);
        assert_eq!(kept.src, vec![vec![4, 5], vec![8, 9]]);
        assert_eq!(kept.tgt[1], vec![10, 10, 11]);
        // The empty source gets one frame, enough for its one token.
        assert_eq!(infeasible_count(&pairs, |s| (2 * s).max(1)), 2);
    }
}
