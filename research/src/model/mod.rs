//! The models of the research examples: the [`transformer`] encoder–decoder every study trains
//! (with its greedy decoding; beam search and sampling are in [`crate::decode`]), the
//! non-autoregressive [`nat`] on its layers, and in [`soft_decode`] an incremental view of it
//! that decodes softly and differentiably.

use anyhow::Result;
use candle_core::Device;

use crate::data::tokens::Vocab;
use crate::data::{source_tensor, Encoded};
use transformer::Transformer;

pub mod ctc_nat;
pub mod nat;
pub mod soft_decode;
pub mod transformer;

/// Greedy decodes of `examples` (sources only) as target tokens, in batches of 250: the
/// model's [`Transformer::greedy`] up to `max_len` tokens, each cut at its first EOS by
/// [`Vocab::decode`].
pub fn translate(
    model: &Transformer,
    examples: &[Encoded],
    vocab: &Vocab,
    max_len: usize,
    device: &Device,
) -> Result<Vec<Vec<String>>> {
    let mut out = Vec::with_capacity(examples.len());
    for chunk in examples.chunks(250) {
        let refs: Vec<&Encoded> = chunk.iter().collect();
        let src = source_tensor(&refs, device)?;
        for ids in model.greedy(&src, max_len)? {
            out.push(vocab.decode(&ids)?);
        }
    }
    Ok(out)
}
