//! Batches of token ids for the encoder–decoder: padding, the decoder's shifted input and
//! output, the BLEU loss's references, and a reproducible stream of shuffled batches.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use super::special::{BOS, EOS, PAD};
use super::tokens::{TokenCorpus, TokenPair, Vocab};

/// A pair as ids.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// Source ids (no BOS/EOS).
    pub src: Vec<u32>,
    /// Target ids (no BOS/EOS).
    pub tgt: Vec<u32>,
}

/// The ids of `pairs` in the two vocabularies.
pub fn encode_pairs(pairs: &[TokenPair], src_vocab: &Vocab, tgt_vocab: &Vocab) -> Vec<Encoded> {
    pairs
        .iter()
        .map(|p| Encoded {
            src: src_vocab.encode(&p.src),
            tgt: tgt_vocab.encode(&p.tgt),
        })
        .collect()
}

/// A token corpus as the synthetic studies train on it: vocabularies of the training pairs,
/// every split as ids, and the dev and test targets as references.
pub struct EncodedCorpus {
    /// The source vocabulary, built on the training sources.
    pub src_vocab: Vocab,
    /// The target vocabulary, built on the training targets.
    pub tgt_vocab: Vocab,
    /// Training pairs as ids.
    pub train: Vec<Encoded>,
    /// Development pairs as ids.
    pub dev: Vec<Encoded>,
    /// Test pairs as ids.
    pub test: Vec<Encoded>,
    /// The dev targets as tokens (one reference each).
    pub dev_refs: Vec<Vec<String>>,
    /// The test targets as tokens (one reference each).
    pub test_refs: Vec<Vec<String>>,
}

impl EncodedCorpus {
    /// Builds the vocabularies on `corpus`'s training pairs and encodes every split.
    pub fn new(corpus: &TokenCorpus) -> Self {
        let src_vocab = Vocab::build(corpus.train.iter().map(|p| &p.src));
        let tgt_vocab = Vocab::build(corpus.train.iter().map(|p| &p.tgt));
        let encode = |pairs: &[TokenPair]| encode_pairs(pairs, &src_vocab, &tgt_vocab);
        let targets = |pairs: &[TokenPair]| pairs.iter().map(|p| p.tgt.clone()).collect();
        Self {
            train: encode(&corpus.train),
            dev: encode(&corpus.dev),
            test: encode(&corpus.test),
            dev_refs: targets(&corpus.dev),
            test_refs: targets(&corpus.test),
            src_vocab,
            tgt_vocab,
        }
    }
}

/// A training batch as tensors.
pub struct Batch {
    /// u32 `[B, Ts]`: source ids, right-padded with [`PAD`].
    pub src: Tensor,
    /// u32 `[B, Tt + 1]`: `BOS y_1 .. y_T`, right-padded with [`PAD`].
    pub dec_in: Tensor,
    /// u32 `[B, Tt + 1]`: `y_1 .. y_T EOS`, right-padded with [`PAD`] (the cross-entropy's
    /// `pad_id`: padding positions are not targets).
    pub dec_out: Tensor,
    /// u32 `[B, Tt]`: the reference words `y_1 .. y_T` (no EOS), right-padded with [`PAD`].
    pub refs: Tensor,
    /// u32 `[B]`: reference lengths `T` (words, no EOS).
    pub ref_len: Tensor,
}

fn pad_rows(rows: &[Vec<u32>], width: usize) -> Vec<u32> {
    let mut flat = Vec::with_capacity(rows.len() * width);
    for row in rows {
        flat.extend_from_slice(row);
        flat.extend(std::iter::repeat_n(PAD, width - row.len()));
    }
    flat
}

/// Source ids as a padded u32 `[B, Ts]` tensor.
pub fn source_tensor(examples: &[&Encoded], device: &Device) -> Result<Tensor> {
    let rows: Vec<Vec<u32>> = examples.iter().map(|e| e.src.clone()).collect();
    let width = rows.iter().map(Vec::len).max().unwrap_or(1).max(1);
    Ok(Tensor::from_vec(
        pad_rows(&rows, width),
        (rows.len(), width),
        device,
    )?)
}

/// Several references per element, `refs[b][r]` (ids, unpadded, any number per element), as
/// a u32 `[B, R, T]` tensor padded with `pad` for `candle_bleu::loss::References::from_ids`:
/// `R` the most references of an element, `T` the longest reference; an element with fewer
/// references gets rows of padding.
pub fn reference_tensor(refs: &[Vec<Vec<u32>>], pad: u32, device: &Device) -> Result<Tensor> {
    let max_refs = refs.iter().map(Vec::len).max().unwrap_or(1);
    let max_len = refs.iter().flatten().map(Vec::len).max().unwrap_or(1);
    let mut ids = vec![pad; refs.len() * max_refs * max_len];
    for (b, element) in refs.iter().enumerate() {
        for (r, reference) in element.iter().enumerate() {
            let offset = (b * max_refs + r) * max_len;
            ids[offset..offset + reference.len()].copy_from_slice(reference);
        }
    }
    Ok(Tensor::from_vec(
        ids,
        (refs.len(), max_refs, max_len),
        device,
    )?)
}

/// The tensors of one batch.
pub fn make_batch(examples: &[&Encoded], device: &Device) -> Result<Batch> {
    let b = examples.len();
    let t = examples.iter().map(|e| e.tgt.len()).max().unwrap_or(1);
    let dec_in: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| std::iter::once(BOS).chain(e.tgt.iter().copied()).collect())
        .collect();
    let dec_out: Vec<Vec<u32>> = examples
        .iter()
        .map(|e| e.tgt.iter().copied().chain(std::iter::once(EOS)).collect())
        .collect();
    let refs: Vec<Vec<u32>> = examples.iter().map(|e| e.tgt.clone()).collect();
    let ref_len: Vec<u32> = examples.iter().map(|e| e.tgt.len() as u32).collect();
    Ok(Batch {
        src: source_tensor(examples, device)?,
        dec_in: Tensor::from_vec(pad_rows(&dec_in, t + 1), (b, t + 1), device)?,
        dec_out: Tensor::from_vec(pad_rows(&dec_out, t + 1), (b, t + 1), device)?,
        refs: Tensor::from_vec(pad_rows(&refs, t), (b, t), device)?,
        ref_len: Tensor::from_vec(ref_len, b, device)?,
    })
}

/// An endless stream of shuffled training batches, reproducible from a seed.
pub struct Batches {
    order: Vec<usize>,
    position: usize,
    batch_size: usize,
    rng: StdRng,
}

impl Batches {
    /// Batches of `batch_size` (at most `len`) indices into a set of `len` examples, shuffled
    /// from `seed`. Errors: `len` or `batch_size` 0.
    pub fn new(len: usize, batch_size: usize, seed: u64) -> Result<Self> {
        if len == 0 || batch_size == 0 {
            bail!("Batches: len ({len}) and batch_size ({batch_size}) must be at least 1");
        }
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_ba7c);
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut rng);
        Ok(Batches {
            order,
            position: 0,
            batch_size: batch_size.min(len),
            rng,
        })
    }

    /// Indices of the next batch; reshuffles at the end of each epoch.
    pub fn next_indices(&mut self) -> Vec<usize> {
        if self.position + self.batch_size > self.order.len() {
            self.order.shuffle(&mut self.rng);
            self.position = 0;
        }
        let batch = self.order[self.position..self.position + self.batch_size].to_vec();
        self.position += self.batch_size;
        batch
    }
}
