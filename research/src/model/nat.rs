//! A vanilla non-autoregressive Transformer (Gu et al. 2018; the NAT of Shao et al. 2020):
//! [`Transformer`]'s encoder and decoder layers, with
//!
//! - **decoder inputs** that are the source embeddings copied uniformly to the target length:
//!   target position `j` of a sentence with `S` source and `T` target tokens takes source
//!   position `round(j·(S−1)/max(T−1, 1))` ([`copy_indices`]), plus the target positions;
//! - **no causal mask**: every target position attends to every other one of its sentence,
//!   and a key-padding mask hides the positions beyond each sentence's `T`
//!   ([`DecoderInputs`]);
//! - targets without BOS or EOS: the length is chosen before decoding, by
//! - a **length predictor**: a classifier over the offset `T − S ∈ [−20, 20]` ([`length_class`])
//!   from the mean of the encoder states over the source tokens.
//!
//! The weights keep [`Transformer`]'s names (`embedding`, `encoder.*`, `decoder.*`,
//! `positions`) and add `length.weight` / `length.bias`; with tied embeddings
//! [`Nat::output_projection`] and the decoder states are what `candle_bleu::loss`'s
//! hidden-state losses take.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::{Linear, VarBuilder, VarMap};

use super::transformer::{drop, Dense, Dropout, Memory, Transformer, TransformerConfig};

/// The largest offset `|T − S|` the length predictor has a class for.
pub const MAX_OFFSET: i64 = 20;
/// Classes of the length predictor: offsets `−MAX_OFFSET..=MAX_OFFSET`.
pub const LENGTH_CLASSES: usize = 2 * MAX_OFFSET as usize + 1;

/// The source positions target positions `0..tgt_len` copy from a source of `src_len` tokens:
/// `round(j·(S−1)/max(T−1, 1))` (halves round away from zero). Empty for `tgt_len == 0`; all
/// zeros for `src_len <= 1`.
pub fn copy_indices(src_len: usize, tgt_len: usize) -> Vec<usize> {
    let span = src_len.saturating_sub(1) as f64;
    let steps = tgt_len.saturating_sub(1).max(1) as f64;
    (0..tgt_len)
        .map(|j| (j as f64 * span / steps).round() as usize)
        .collect()
}

/// The length predictor's class of a pair with `src_len` source and `tgt_len` target tokens:
/// `clamp(T − S, −20, 20) + 20`, and whether the offset was clipped.
pub fn length_class(src_len: usize, tgt_len: usize) -> (u32, bool) {
    let offset = tgt_len as i64 - src_len as i64;
    let clipped = offset.clamp(-MAX_OFFSET, MAX_OFFSET);
    ((clipped + MAX_OFFSET) as u32, clipped != offset)
}

/// The target length class `class` predicts for a source of `src_len` tokens (at least 1).
pub fn length_of_class(src_len: usize, class: usize) -> usize {
    (src_len as i64 + class as i64 - MAX_OFFSET).max(1) as usize
}

/// The decoder's inputs for a batch of `B` sentences with target lengths `T_b`.
pub struct DecoderInputs {
    /// u32 `[B, T]`, `T = max_b T_b`: the source ids each target position copies, `pad`
    /// beyond `T_b`.
    pub ids: Tensor,
    /// f32 `[B, 1, 1, T]`: 0 at the first `T_b` positions, −1e9 beyond (the self-attention's
    /// key-padding mask).
    pub key_mask: Tensor,
    /// `T_b` of each sentence.
    pub lengths: Vec<usize>,
}

impl DecoderInputs {
    /// The inputs for `sources` (ids without padding) decoded at `lengths` (each `>= 1`).
    pub fn new(sources: &[&[u32]], lengths: &[usize], pad: u32, device: &Device) -> Result<Self> {
        if sources.len() != lengths.len() || sources.is_empty() {
            bail!(
                "DecoderInputs: needs one target length per source and at least one source, got {} sources and {} lengths",
                sources.len(),
                lengths.len()
            );
        }
        if let Some(b) = lengths.iter().position(|&t| t == 0) {
            bail!("DecoderInputs: target length of sentence {b} is 0 (must be >= 1)");
        }
        if let Some(b) = sources.iter().position(|s| s.is_empty()) {
            bail!("DecoderInputs: source {b} is empty");
        }
        let b = sources.len();
        let t = lengths.iter().copied().max().unwrap_or(1);
        let mut ids = vec![pad; b * t];
        let mut mask = vec![-1e9f32; b * t];
        for (row, (source, &len)) in sources.iter().zip(lengths).enumerate() {
            for (j, i) in copy_indices(source.len(), len).into_iter().enumerate() {
                ids[row * t + j] = source[i];
                mask[row * t + j] = 0.0;
            }
        }
        Ok(Self {
            ids: Tensor::from_vec(ids, (b, t), device)?,
            key_mask: Tensor::from_vec(mask, (b, 1, 1, t), device)?,
            lengths: lengths.to_vec(),
        })
    }
}

/// The non-autoregressive Transformer.
pub struct Nat {
    base: Transformer,
    length: Dense,
}

impl Nat {
    /// Builds the model in `varmap` and initialises every weight from `seed` (as
    /// [`Transformer::new`], the length predictor included).
    pub fn new(
        config: TransformerConfig,
        varmap: &VarMap,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        let vb = VarBuilder::from_varmap(varmap, DType::F32, device);
        // Made first: `Transformer::new` then draws every variable of the map from `seed`.
        let length = Dense::new(config.d_model, LENGTH_CLASSES, vb.pp("length"))?;
        let base = Transformer::new(config, varmap, seed, device)?;
        Ok(Self { base, length })
    }

    /// The encoder–decoder whose layers this model runs.
    pub fn base(&self) -> &Transformer {
        &self.base
    }

    /// The output layer (the tied embedding): the `proj` of the hidden-state losses.
    pub fn output_projection(&self) -> Result<Linear> {
        self.base.output_projection()
    }

    /// Encodes u32 `[B, Ts]` source ids (right-padded with `pad`); `dropout`: `None` to evaluate.
    pub fn encode(&self, src: &Tensor, pad: u32, dropout: Option<&mut Dropout>) -> Result<Memory> {
        self.base.encode(src, pad, dropout)
    }

    /// The length predictor's logits f32 `[B, LENGTH_CLASSES]`: a linear layer on the mean of
    /// the encoder states over each sentence's source tokens (padding excluded).
    pub fn length_logits(&self, memory: &Memory) -> Result<Tensor> {
        let (b, ts, _) = memory.states.dims3()?;
        // The mask is 0 at tokens and -1e9 at padding: 1 at tokens, 0 at padding.
        let weights = (memory.mask.reshape((b, ts, 1))?.ge(0f32)?).to_dtype(DType::F32)?;
        let summed = memory.states.broadcast_mul(&weights)?.sum(1)?;
        let counts = weights.sum(1)?.clamp(1f32, f32::MAX)?;
        self.length.forward(&summed.broadcast_div(&counts)?)
    }

    /// The length predictor's cross-entropy (mean over the batch) against u32 `[B]` classes.
    pub fn length_loss(&self, memory: &Memory, classes: &Tensor) -> Result<Tensor> {
        let logits = self.length_logits(memory)?;
        Ok(candle_nn::loss::cross_entropy(&logits, classes)?)
    }

    /// Decoder states f32 `[B, T, D]` (after the final layer norm) for `inputs`, attending to
    /// `memory` (one row per input row); positions beyond a row's length hold states that
    /// nothing should read. `dropout`: `None` to evaluate.
    pub fn decode(
        &self,
        inputs: &DecoderInputs,
        memory: &Memory,
        mut dropout: Option<&mut Dropout>,
    ) -> Result<Tensor> {
        let src_embedding = &self.base.src_embedding;
        let x = drop(
            self.base.embed(src_embedding, &inputs.ids, 0)?,
            &mut dropout,
        )?;
        self.base
            .decoder_states(x, memory, &inputs.key_mask, &mut dropout)
    }

    /// Logits `[.., V]` of decoder states `[.., D]`.
    pub fn logits(&self, states: &Tensor) -> Result<Tensor> {
        self.base.logits(states)
    }
}

/// `memory`'s rows `index` (u32 `[N]`), in that order: one source's memory for each of its
/// length candidates.
pub fn select_memory(memory: &Memory, index: &Tensor) -> Result<Memory> {
    Ok(Memory {
        states: memory.states.index_select(index, 0)?,
        mask: memory.mask.index_select(index, 0)?,
    })
}

/// The `k` most likely target lengths of each source under the length predictor's logits
/// f32 `[B, LENGTH_CLASSES]`, most likely first (distinct; ties to the smaller class).
pub fn ranked_lengths(logits: &Tensor, src_lens: &[usize], k: usize) -> Result<Vec<Vec<usize>>> {
    let rows = logits.to_dtype(DType::F32)?.to_vec2::<f32>()?;
    if rows.len() != src_lens.len() {
        bail!(
            "ranked_lengths: {} rows of logits for {} sources",
            rows.len(),
            src_lens.len()
        );
    }
    Ok(rows
        .iter()
        .zip(src_lens)
        .map(|(row, &s)| {
            let mut classes: Vec<usize> = (0..row.len()).collect();
            classes.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            let mut lengths = Vec::with_capacity(k);
            for class in classes {
                let len = length_of_class(s, class);
                if !lengths.contains(&len) {
                    lengths.push(len);
                }
                if lengths.len() == k {
                    break;
                }
            }
            lengths
        })
        .collect())
}

/// Argmax decoding of decoder states f32 `[N, T, D]` at `lengths[n]` positions each: the
/// tokens and their mean log-probability.
pub fn argmax_tokens(
    model: &Nat,
    states: &Tensor,
    lengths: &[usize],
) -> Result<Vec<(Vec<u32>, f64)>> {
    let log_probs = candle_nn::ops::log_softmax(&model.logits(states)?, D::Minus1)?;
    let best = log_probs.max(D::Minus1)?.to_vec2::<f32>()?;
    let tokens = log_probs.argmax(D::Minus1)?.to_vec2::<u32>()?;
    Ok(tokens
        .into_iter()
        .zip(best)
        .zip(lengths)
        .map(|((ids, lp), &len)| {
            let mean = lp[..len].iter().map(|&v| f64::from(v)).sum::<f64>() / len as f64;
            (ids[..len].to_vec(), mean)
        })
        .collect())
}

/// `ids` with every run of one repeated token collapsed to one (the usual NAT post-processing).
pub fn remove_consecutive_duplicates(ids: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(ids.len());
    for &id in ids {
        if out.last() != Some(&id) {
            out.push(id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::PositionAdd;

    fn config() -> TransformerConfig {
        TransformerConfig {
            src_vocab: 30,
            tgt_vocab: 30,
            d_model: 8,
            heads: 2,
            d_ff: 16,
            encoder_layers: 1,
            decoder_layers: 2,
            max_len: 16,
            dropout: 0.0,
            tie_all: true,
            positions: PositionAdd::Broadcast,
        }
    }

    #[test]
    fn copy_indices_spread_the_source_uniformly() {
        assert_eq!(copy_indices(5, 3), vec![0, 2, 4]);
        assert_eq!(copy_indices(3, 5), vec![0, 1, 1, 2, 2]);
        assert_eq!(copy_indices(4, 1), vec![0]);
        assert_eq!(copy_indices(1, 4), vec![0, 0, 0, 0]);
        assert_eq!(copy_indices(6, 6), vec![0, 1, 2, 3, 4, 5]);
        assert!(copy_indices(3, 0).is_empty());
    }

    #[test]
    fn length_classes_clip_at_twenty() {
        assert_eq!(length_class(10, 10), (20, false));
        assert_eq!(length_class(10, 7), (17, false));
        assert_eq!(length_class(3, 23), (40, false));
        assert_eq!(length_class(3, 24), (40, true));
        assert_eq!(length_class(30, 5), (0, true));
        assert_eq!(length_of_class(10, 17), 7);
        assert_eq!(length_of_class(2, 0), 1);
        assert_eq!(LENGTH_CLASSES, 41);
    }

    #[test]
    fn decoder_inputs_copy_and_mask() -> Result<()> {
        let device = Device::Cpu;
        let inputs = DecoderInputs::new(&[&[5, 6, 7], &[8]], &[2, 4], 0, &device)?;
        assert_eq!(
            inputs.ids.to_vec2::<u32>()?,
            vec![vec![5, 7, 0, 0], vec![8; 4]]
        );
        let mask = inputs.key_mask.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(&mask[..4], &[0.0, 0.0, -1e9, -1e9]);
        assert_eq!(&mask[4..], &[0.0; 4]);
        assert!(DecoderInputs::new(&[&[5]], &[0], 0, &device).is_err());
        Ok(())
    }

    #[test]
    fn shapes_and_padding_invariance() -> Result<()> {
        let device = Device::Cpu;
        let model = Nat::new(config(), &VarMap::new(), 7, &device)?;
        let short: &[u32] = &[4, 5, 6];
        let long: &[u32] = &[9, 10, 11, 12, 13, 14];
        // Alone: the short sentence unpadded, decoded at length 2.
        let src = Tensor::new(&[[4u32, 5, 6]], &device)?;
        let memory = model.encode(&src, 0, None)?;
        let alone = model.decode(
            &DecoderInputs::new(&[short], &[2], 0, &device)?,
            &memory,
            None,
        )?;
        assert_eq!(alone.dims(), &[1, 2, 8]);
        assert_eq!(model.length_logits(&memory)?.dims(), &[1, LENGTH_CLASSES]);
        // In a batch with a longer source and a longer target: padding on both sides.
        let src = Tensor::new(&[[4u32, 5, 6, 0, 0, 0], [9, 10, 11, 12, 13, 14]], &device)?;
        let memory_b = model.encode(&src, 0, None)?;
        let batch = model.decode(
            &DecoderInputs::new(&[short, long], &[2, 5], 0, &device)?,
            &memory_b,
            None,
        )?;
        assert_eq!(batch.dims(), &[2, 5, 8]);
        let difference = (batch.narrow(0, 0, 1)?.narrow(1, 0, 2)? - &alone)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(
            difference < 1e-5,
            "padding changed the outputs by {difference}"
        );
        let lengths_alone = model.length_logits(&memory)?;
        let lengths_batch = model.length_logits(&memory_b)?.narrow(0, 0, 1)?;
        let difference = (lengths_alone - lengths_batch)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(
            difference < 1e-5,
            "padding changed the length logits by {difference}"
        );
        // The length loss is a finite scalar with a gradient.
        let loss = model.length_loss(&memory_b, &Tensor::new(&[20u32, 21], &device)?)?;
        assert!(loss.to_scalar::<f32>()?.is_finite());
        Ok(())
    }

    #[test]
    fn ranked_lengths_are_distinct_and_ordered() -> Result<()> {
        let mut row = vec![0f32; LENGTH_CLASSES];
        row[22] = 3.0; // offset +2
        row[20] = 2.0; // offset 0
        row[0] = 1.0; // offset -20: clamps to length 1
        row[1] = 1.0; // offset -19: also length 1
        let logits = Tensor::from_vec(row, (1, LENGTH_CLASSES), &Device::Cpu)?;
        let ranked = ranked_lengths(&logits, &[4], 4)?;
        assert_eq!(ranked[0][..3], [6, 4, 1]);
        assert_eq!(ranked[0].len(), 4);
        assert!(!ranked[0][3..].contains(&1));
        Ok(())
    }

    #[test]
    fn duplicates_collapse() {
        assert_eq!(
            remove_consecutive_duplicates(&[1, 1, 2, 2, 2, 1, 3]),
            vec![1, 2, 1, 3]
        );
        assert!(remove_consecutive_duplicates(&[]).is_empty());
    }
}
