//! Greedy CTC decoding of a CTC NAT: one decoder pass at `r·S` frames, each frame's argmax,
//! repeats merged, blanks dropped (`candle_bleu::loss::ctc_greedy_decode`). No length beam:
//! the length is the collapse's, which a blank penalty moves: the blank's logit lowered by `δ`
//! before the argmax (still one pass), `δ` tuned on dev.

use anyhow::{bail, Result};
use candle_bleu::loss::ctc_greedy_decode;
use candle_core::Tensor;

use crate::model::ctc_nat::{CtcNat, BLANK};
use crate::nat::batches::pad_rows;

/// The greedy CTC outputs of `sources` (ids without padding, each non-empty), on the model's
/// device in batches of `batch` sources of similar length; sources longer than the model's
/// positions are cut to them.
pub fn decode_ctc(
    model: &CtcNat,
    sources: &[Vec<u32>],
    batch: usize,
    pad: u32,
) -> Result<Vec<Vec<u32>>> {
    decode_ctc_penalised(model, sources, batch, pad, 0.0)
}

/// [`decode_ctc`] with the blank's logit lowered by `blank_penalty` (`δ`, finite) at every
/// frame before the argmax: `δ > 0` emits fewer blanks, so longer outputs; `δ < 0` shorter.
pub fn decode_ctc_penalised(
    model: &CtcNat,
    sources: &[Vec<u32>],
    batch: usize,
    pad: u32,
    blank_penalty: f64,
) -> Result<Vec<Vec<u32>>> {
    let device = model.base().device();
    if batch == 0 {
        bail!("decode_ctc: batch must be >= 1");
    }
    if !blank_penalty.is_finite() {
        bail!("decode_ctc: the blank penalty must be finite, got {blank_penalty}");
    }
    let max_len = model.base().config().max_len;
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| (sources[i].len(), i));
    let mut out = vec![Vec::new(); sources.len()];
    for chunk in order.chunks(batch) {
        let rows: Vec<&[u32]> = chunk
            .iter()
            .map(|&i| &sources[i][..sources[i].len().min(max_len)])
            .collect();
        let inputs = model.upsampled_inputs(&rows, pad, device)?;
        let (logits, frames) = model.forward(&pad_rows(&rows, pad, device)?, &inputs, pad, None)?;
        let logits = if blank_penalty == 0.0 {
            logits
        } else {
            let vocab = logits.dim(2)?;
            let mut shift = vec![0f32; vocab];
            shift[BLANK as usize] = blank_penalty as f32;
            let shift = Tensor::from_vec(shift, vocab, device)?.to_dtype(logits.dtype())?;
            logits.broadcast_sub(&shift)?
        };
        for (&i, ids) in chunk
            .iter()
            .zip(ctc_greedy_decode(&logits, Some(&frames), BLANK)?)
        {
            out[i] = ids;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::transformer::{PositionAdd, TransformerConfig};
    use candle_core::Device;
    use candle_nn::VarMap;

    /// An untrained CTC NAT of 12 frames at r = 3 over 10 ids.
    fn tiny_model(device: &Device) -> Result<CtcNat> {
        let config = TransformerConfig {
            src_vocab: 10,
            tgt_vocab: 10,
            d_model: 8,
            heads: 2,
            d_ff: 16,
            encoder_layers: 1,
            decoder_layers: 1,
            max_len: 12,
            dropout: 0.0,
            tie_all: true,
            positions: PositionAdd::Broadcast,
        };
        CtcNat::new(config, 3, &VarMap::new(), 2, device)
    }

    /// Batching and the length sort do not change the outputs, which never hold the blank.
    #[test]
    fn outputs_are_in_source_order_and_blank_free() -> Result<()> {
        let device = Device::Cpu;
        let model = tiny_model(&device)?;
        let sources = vec![vec![4, 5, 6, 7], vec![8], vec![9, 4], vec![5, 5, 6, 6, 7]];
        let one = decode_ctc(&model, &sources, 1, 0)?;
        let all = decode_ctc(&model, &sources, 4, 0)?;
        assert_eq!(one, all);
        for (out, source) in all.iter().zip(&sources) {
            assert!(!out.contains(&BLANK));
            // At most one token per frame; the 5-token source is cut to 12 frames.
            assert!(out.len() <= (3 * source.len()).min(12));
        }
        assert!(decode_ctc(&model, &sources, 0, 0).is_err());
        Ok(())
    }

    /// δ = 0 is plain greedy decoding; a δ larger than any logit gap never picks the blank, so
    /// the output is the collapse of each frame's best non-blank id: one per frame, repeats
    /// merged.
    #[test]
    fn the_blank_penalty_lowers_the_blank_before_the_argmax() -> Result<()> {
        let device = Device::Cpu;
        let model = tiny_model(&device)?;
        let sources = vec![vec![4, 5, 6, 7], vec![8], vec![9, 4]];
        assert_eq!(
            decode_ctc_penalised(&model, &sources, 2, 0, 0.0)?,
            decode_ctc(&model, &sources, 2, 0)?
        );
        let never_blank = decode_ctc_penalised(&model, &sources, 2, 0, 1e6)?;
        for (out, source) in never_blank.iter().zip(&sources) {
            let rows: Vec<&[u32]> = vec![&source[..]];
            let inputs = model.upsampled_inputs(&rows, 0, &device)?;
            let (logits, _) = model.forward(&pad_rows(&rows, 0, &device)?, &inputs, 0, None)?;
            let frames: Vec<Vec<f32>> = logits
                .squeeze(0)?
                .to_dtype(candle_core::DType::F32)?
                .to_vec2()?;
            let mut want: Vec<u32> = Vec::new();
            for row in &frames {
                let best = (0..row.len() as u32)
                    .filter(|&v| v != BLANK)
                    .max_by(|&a, &b| row[a as usize].total_cmp(&row[b as usize]).then(b.cmp(&a)))
                    .expect("a non-blank id");
                if want.last() != Some(&best) {
                    want.push(best);
                }
            }
            assert_eq!(out, &want, "source {source:?}");
        }
        assert!(decode_ctc_penalised(&model, &sources, 2, 0, f64::NAN).is_err());
        Ok(())
    }
}
