//! Greedy CTC decoding of a CTC NAT: one decoder pass at `r·S` frames, each frame's argmax,
//! repeats merged, blanks dropped (`candle_bleu::loss::ctc_greedy_decode`). No length beam:
//! the length is the collapse's.

use anyhow::{bail, Result};
use candle_bleu::loss::ctc_greedy_decode;
use candle_core::Device;

use crate::model::ctc_nat::{CtcNat, BLANK};
use crate::nat::batches::pad_rows;

/// The greedy CTC outputs of `sources` (ids without padding, each non-empty), in batches of
/// `batch` sources of similar length; sources longer than the model's positions are cut to
/// them.
pub fn decode_ctc(
    model: &CtcNat,
    sources: &[Vec<u32>],
    batch: usize,
    pad: u32,
    device: &Device,
) -> Result<Vec<Vec<u32>>> {
    if batch == 0 {
        bail!("decode_ctc: batch must be >= 1");
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
    use candle_nn::VarMap;

    /// Batching and the length sort do not change the outputs, which never hold the blank.
    #[test]
    fn outputs_are_in_source_order_and_blank_free() -> Result<()> {
        let device = Device::Cpu;
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
        let model = CtcNat::new(config, 3, &VarMap::new(), 2, &device)?;
        let sources = vec![vec![4, 5, 6, 7], vec![8], vec![9, 4], vec![5, 5, 6, 6, 7]];
        let one = decode_ctc(&model, &sources, 1, 0, &device)?;
        let all = decode_ctc(&model, &sources, 4, 0, &device)?;
        assert_eq!(one, all);
        for (out, source) in all.iter().zip(&sources) {
            assert!(!out.contains(&BLANK));
            // At most one token per frame; the 5-token source is cut to 12 frames.
            assert!(out.len() <= (3 * source.len()).min(12));
        }
        assert!(decode_ctc(&model, &sources, 0, 0, &device).is_err());
        Ok(())
    }
}
