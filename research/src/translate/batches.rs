//! Length-bucketed training batches whose order is a function of `(seed, step)` alone, so a
//! run resumed at step `s` sees exactly the batches an uninterrupted run would.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Token-id pairs of one split: `src[i]` translates to `tgt[i]` (no BOS/EOS).
#[derive(Debug, Clone, Default)]
pub struct IdPairs {
    /// Source ids.
    pub src: Vec<Vec<u32>>,
    /// Target ids.
    pub tgt: Vec<Vec<u32>>,
}

impl IdPairs {
    /// Pairs.
    pub fn len(&self) -> usize {
        self.src.len()
    }

    /// No pairs.
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }
}

/// The special ids a batch needs.
#[derive(Debug, Clone, Copy)]
pub struct BatchIds {
    /// Padding.
    pub pad: u32,
    /// Decoder start.
    pub bos: u32,
    /// End of sequence.
    pub eos: u32,
}

/// One training batch of `B` pairs.
pub struct Batch {
    /// u32 `[B, Ts]`: sources, right-padded.
    pub src: Tensor,
    /// u32 `[B, T]`: `BOS y`, padded (`T = max |y| + 1`).
    pub dec_in: Tensor,
    /// u32 `[B, T]`: `y EOS`, padded: the cross-entropy's targets.
    pub dec_out: Tensor,
    /// u32 `[B, T - 1]`: `y`, padded: the BLEU loss's references.
    pub refs: Tensor,
    /// u32 `[B]`: `|y|`, the hypothesis lengths of the teacher-forced BLEU loss.
    pub ref_len: Tensor,
    /// The pairs' indices in the split.
    pub indices: Vec<usize>,
}

/// Builds the batch of `indices` of `pairs`.
pub fn make_batch(
    pairs: &IdPairs,
    indices: &[usize],
    ids: BatchIds,
    device: &Device,
) -> Result<Batch> {
    if indices.is_empty() {
        bail!("a batch needs at least one pair");
    }
    let b = indices.len();
    let ts = indices
        .iter()
        .map(|&i| pairs.src[i].len())
        .max()
        .unwrap_or(0)
        .max(1);
    let ty = indices
        .iter()
        .map(|&i| pairs.tgt[i].len())
        .max()
        .unwrap_or(0);
    let t = ty + 1;
    let mut src = vec![ids.pad; b * ts];
    let mut dec_in = vec![ids.pad; b * t];
    let mut dec_out = vec![ids.pad; b * t];
    let mut refs = vec![ids.pad; b * ty.max(1)];
    let mut lens = Vec::with_capacity(b);
    for (row, &i) in indices.iter().enumerate() {
        let (s, y) = (&pairs.src[i], &pairs.tgt[i]);
        src[row * ts..][..s.len()].copy_from_slice(s);
        dec_in[row * t] = ids.bos;
        dec_in[row * t + 1..][..y.len()].copy_from_slice(y);
        dec_out[row * t..][..y.len()].copy_from_slice(y);
        dec_out[row * t + y.len()] = ids.eos;
        refs[row * ty.max(1)..][..y.len()].copy_from_slice(y);
        lens.push(y.len() as u32);
    }
    Ok(Batch {
        src: Tensor::from_vec(src, (b, ts), device)?,
        dec_in: Tensor::from_vec(dec_in, (b, t), device)?,
        dec_out: Tensor::from_vec(dec_out, (b, t), device)?,
        refs: Tensor::from_vec(refs, (b, ty.max(1)), device)?,
        ref_len: Tensor::from_vec(lens, b, device)?,
        indices: indices.to_vec(),
    })
}

/// Batches of about `batch_size` pairs of similar lengths; epoch `e` visits them in an order
/// drawn from `(seed, e)`.
pub struct Batches {
    buckets: Vec<Vec<usize>>,
    seed: u64,
}

impl Batches {
    /// Sorts `pairs` by (source, target) length and cuts them into batches of `batch_size`.
    pub fn new(pairs: &IdPairs, batch_size: usize, seed: u64) -> Result<Self> {
        if batch_size == 0 || pairs.is_empty() {
            bail!(
                "batches need batch_size >= 1 and pairs (got {batch_size}, {} pairs)",
                pairs.len()
            );
        }
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        // Ties broken by index, so the batches do not depend on the sort's stability.
        order.sort_by_key(|&i| (pairs.src[i].len(), pairs.tgt[i].len(), i));
        let buckets = order.chunks(batch_size).map(<[usize]>::to_vec).collect();
        Ok(Self { buckets, seed })
    }

    /// Batches per epoch.
    pub fn per_epoch(&self) -> usize {
        self.buckets.len()
    }

    /// The pair indices of global step `step` (0-based).
    pub fn at(&self, step: usize) -> &[usize] {
        let epoch = step / self.buckets.len();
        let mut order: Vec<usize> = (0..self.buckets.len()).collect();
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        order.shuffle(&mut rng);
        &self.buckets[order[step % self.buckets.len()]]
    }
}
