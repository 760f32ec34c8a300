//! A CTC non-autoregressive Transformer (Libovický & Helcl 2018; Gu & Kong 2021; Shao & Feng
//! 2022): [`Nat`](super::nat::Nat)'s encoder and decoder layers ([`Transformer`]'s, weight
//! names kept), with
//!
//! - **upsampled decoder inputs**: a source of `S` tokens gives `T' = r·S` decoder frames
//!   (capped at the model's positions), frame `j` taking the source embedding at
//!   [`copy_indices`]`(S, r·S)[j]` plus the frame's position — each source token copied about
//!   `r` times; no causal mask, a key-padding mask beyond each sentence's `T'`
//!   ([`DecoderInputs`]);
//! - **no length predictor**: the output length is the length of the frames' collapse (repeats
//!   merged, blanks dropped), so it is decided by the model frame by frame;
//! - a **blank** token, [`BLANK`] = the BOS id (1): the NAT never reads BOS (its sources and
//!   targets have neither BOS nor EOS, its decoder inputs are copies of source tokens), so with
//!   tied embeddings the BOS row of the shared table is used by nothing but the blank's output
//!   logit — a dedicated id, and `Bpe::decode` drops it like every special id;
//! - logits f32 `[B, T', V]` from the tied output projection ([`CtcNat::logits`]), the input
//!   of `candle_bleu::loss::ctc_loss_from_logits` and `ctc_bleu_loss_from_logits`.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use candle_nn::VarMap;

use super::nat::{copy_indices, DecoderInputs};
use super::transformer::{drop, Dropout, Memory, Transformer, TransformerConfig};

/// The blank of the CTC NAT: the BOS id, which no input or target of the NAT holds.
pub const BLANK: u32 = crate::data::BOS;

/// Frames of a source of `src_len` tokens at upsampling ratio `ratio`: `ratio · src_len`,
/// at least 1 and at most `max_frames` (the model's positions).
pub fn frames(src_len: usize, ratio: usize, max_frames: usize) -> usize {
    (ratio * src_len).clamp(1, max_frames.max(1))
}

/// The CTC NAT.
pub struct CtcNat {
    base: Transformer,
    ratio: usize,
}

impl CtcNat {
    /// Builds the model in `varmap`, every weight drawn from `seed` ([`Transformer::new`]);
    /// `ratio` is the upsampling ratio `r` (>= 1). `config.max_len` bounds the frames (set it to
    /// `r` times the longest source).
    pub fn new(
        config: TransformerConfig,
        ratio: usize,
        varmap: &VarMap,
        seed: u64,
        device: &Device,
    ) -> Result<Self> {
        if ratio == 0 {
            bail!("CtcNat: the upsampling ratio must be >= 1");
        }
        if !config.tie_all {
            bail!("CtcNat: the blank's row needs one shared embedding table (tie_all)");
        }
        let base = Transformer::new(config, varmap, seed, device)?;
        Ok(Self { base, ratio })
    }

    /// The encoder–decoder whose layers this model runs.
    pub fn base(&self) -> &Transformer {
        &self.base
    }

    /// The upsampling ratio `r`.
    pub fn ratio(&self) -> usize {
        self.ratio
    }

    /// Frames of a source of `src_len` tokens ([`frames`] at this model's ratio and positions).
    pub fn frames(&self, src_len: usize) -> usize {
        frames(src_len, self.ratio, self.base.config().max_len)
    }

    /// The decoder inputs of `sources` (ids without padding, each non-empty): each at
    /// [`CtcNat::frames`] frames, copying [`copy_indices`]`(S, T')`.
    pub fn upsampled_inputs(
        &self,
        sources: &[&[u32]],
        pad: u32,
        device: &Device,
    ) -> Result<DecoderInputs> {
        let lengths: Vec<usize> = sources.iter().map(|s| self.frames(s.len())).collect();
        DecoderInputs::new(sources, &lengths, pad, device)
    }

    /// Encodes u32 `[B, Ts]` source ids (right-padded with `pad`); `dropout`: `None` to evaluate.
    pub fn encode(&self, src: &Tensor, pad: u32, dropout: Option<&mut Dropout>) -> Result<Memory> {
        self.base.encode(src, pad, dropout)
    }

    /// Decoder states f32 `[B, T', D]` of `inputs` attending to `memory`.
    pub fn decode(
        &self,
        inputs: &DecoderInputs,
        memory: &Memory,
        mut dropout: Option<&mut Dropout>,
    ) -> Result<Tensor> {
        let x = drop(
            self.base.embed(&self.base.src_embedding, &inputs.ids, 0)?,
            &mut dropout,
        )?;
        self.base
            .decoder_states(x, memory, &inputs.key_mask, &mut dropout)
    }

    /// Logits `[.., V]` of decoder states `[.., D]` (the tied output projection).
    pub fn logits(&self, states: &Tensor) -> Result<Tensor> {
        self.base.logits(states)
    }

    /// Logits f32 `[B, T', V]` of u32 `[B, Ts]` sources `src` (padded with `pad`) and their
    /// upsampled `inputs`, and the frames `T'_b` as u32 `[B]`.
    pub fn forward(
        &self,
        src: &Tensor,
        inputs: &DecoderInputs,
        pad: u32,
        mut dropout: Option<&mut Dropout>,
    ) -> Result<(Tensor, Tensor)> {
        let memory = self.encode(src, pad, dropout.as_deref_mut())?;
        let states = self.decode(inputs, &memory, dropout)?;
        let frames: Vec<u32> = inputs.lengths.iter().map(|&t| t as u32).collect();
        let n = frames.len();
        Ok((
            self.logits(&states)?,
            Tensor::from_vec(frames, n, src.device())?,
        ))
    }
}

/// The source positions the frames of a source of `src_len` tokens copy at ratio `ratio`
/// (uncapped): [`copy_indices`]`(S, r·S)`.
pub fn upsampled_indices(src_len: usize, ratio: usize) -> Vec<usize> {
    copy_indices(src_len, ratio * src_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::PositionAdd;

    fn config() -> TransformerConfig {
        TransformerConfig {
            src_vocab: 20,
            tgt_vocab: 20,
            d_model: 8,
            heads: 2,
            d_ff: 16,
            encoder_layers: 1,
            decoder_layers: 1,
            max_len: 16,
            dropout: 0.0,
            tie_all: true,
            positions: PositionAdd::Broadcast,
        }
    }

    #[test]
    fn upsampling_copies_each_source_token_about_r_times() {
        assert_eq!(upsampled_indices(3, 2), vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(upsampled_indices(2, 3), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(upsampled_indices(1, 3), vec![0, 0, 0]);
        assert_eq!(frames(5, 3, 16), 15);
        assert_eq!(frames(7, 3, 16), 16);
        assert_eq!(frames(0, 3, 16), 1);
    }

    #[test]
    fn inputs_shape_mask_and_logits() -> Result<()> {
        let device = Device::Cpu;
        let model = CtcNat::new(config(), 2, &VarMap::new(), 3, &device)?;
        let sources: [&[u32]; 2] = [&[5, 6, 7], &[8]];
        let inputs = model.upsampled_inputs(&sources, 0, &device)?;
        assert_eq!(inputs.lengths, vec![6, 2]);
        assert_eq!(
            inputs.ids.to_vec2::<u32>()?,
            vec![vec![5, 5, 6, 6, 7, 7], vec![8, 8, 0, 0, 0, 0]]
        );
        let mask = inputs.key_mask.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(&mask[..6], &[0.0; 6]);
        assert_eq!(&mask[6..], &[0.0, 0.0, -1e9, -1e9, -1e9, -1e9]);
        let src = Tensor::new(&[[5u32, 6, 7], [8, 0, 0]], &device)?;
        let (logits, frames) = model.forward(&src, &inputs, 0, None)?;
        assert_eq!(logits.dims(), &[2, 6, 20]);
        assert_eq!(frames.to_vec1::<u32>()?, vec![6, 2]);
        // The second sentence alone gives the same logits at its frames.
        let alone = model.upsampled_inputs(&sources[1..], 0, &device)?;
        let (single, _) = model.forward(&Tensor::new(&[[8u32]], &device)?, &alone, 0, None)?;
        let difference = (logits.narrow(0, 1, 1)?.narrow(1, 0, 2)? - single)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(
            difference < 1e-5,
            "padding changed the logits by {difference}"
        );
        assert!(CtcNat::new(config(), 0, &VarMap::new(), 3, &device).is_err());
        Ok(())
    }
}
