//! NAT decoding: the length predictor ranks target lengths; the decoder runs once at each of
//! the top-`k` lengths (and, for the analysis, at the reference length) with argmax at every
//! position; the candidate with the best mean log-probability among the first `l` of the
//! ranking is the output at length beam `l`.

use anyhow::{bail, Result};
use candle_core::{Device, Tensor};
use serde::Serialize;
use std::time::Instant;

use super::batches::pad_rows;
use crate::model::nat::{
    argmax_tokens, ranked_lengths, remove_consecutive_duplicates, select_memory, DecoderInputs, Nat,
};

/// One decoded candidate: its tokens and their mean log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Argmax tokens at every position.
    pub tokens: Vec<u32>,
    /// Mean log-probability of those tokens.
    pub score: f64,
}

/// Everything one source decodes to.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// The candidates at the predictor's `k` most likely lengths, most likely first.
    pub ranked: Vec<Candidate>,
    /// The candidate at the reference length, when one was given.
    pub oracle: Option<Candidate>,
    /// The predictor's most likely length.
    pub predicted_length: usize,
}

impl Decoded {
    /// The output at length beam `l`: the best-scoring of the first `l` candidates (the
    /// earlier on a tie).
    pub fn at_beam(&self, l: usize) -> &[u32] {
        let mut best: Option<&Candidate> = None;
        for c in self.ranked.iter().take(l.max(1)) {
            if best.is_none_or(|b| c.score > b.score) {
                best = Some(c);
            }
        }
        best.map_or(&[], |c| c.tokens.as_slice())
    }
}

/// How [`decode_nat`] searches and batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LengthBeam {
    /// The number of most likely lengths decoded (`>= 1`).
    pub k: usize,
    /// Sources per batch, of similar length (`>= 1`).
    pub batch: usize,
    /// The padding id.
    pub pad: u32,
}

/// Decodes `sources` (ids without padding, each non-empty) at the `search.k` most likely
/// lengths and, with `reference_lengths`, at those too; batches of `search.batch` sources of
/// similar length. Lengths are capped at the model's positions.
pub fn decode_nat(
    model: &Nat,
    sources: &[Vec<u32>],
    reference_lengths: Option<&[usize]>,
    search: LengthBeam,
    device: &Device,
) -> Result<Vec<Decoded>> {
    let LengthBeam { k, batch, pad } = search;
    if k == 0 || batch == 0 {
        bail!("decode_nat: k ({k}) and batch ({batch}) must be >= 1");
    }
    if let Some(refs) = reference_lengths {
        if refs.len() != sources.len() {
            bail!(
                "decode_nat: {} reference lengths for {} sources",
                refs.len(),
                sources.len()
            );
        }
    }
    let max_len = model.base().config().max_len;
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| (sources[i].len(), i));
    let mut out: Vec<Option<Decoded>> = vec![None; sources.len()];
    for chunk in order.chunks(batch) {
        let rows: Vec<&[u32]> = chunk.iter().map(|&i| sources[i].as_slice()).collect();
        let memory = model.encode(&pad_rows(&rows, pad, device)?, pad, None)?;
        let src_lens: Vec<usize> = rows.iter().map(|r| r.len()).collect();
        let ranked = ranked_lengths(&model.length_logits(&memory)?, &src_lens, k)?;
        // Rows of the decoder: each source's ranked lengths, then its reference length.
        let mut owners = Vec::new();
        let mut lengths = Vec::new();
        for (row, lens) in ranked.iter().enumerate() {
            for &len in lens {
                owners.push(row as u32);
                lengths.push(len.min(max_len));
            }
            if let Some(refs) = reference_lengths {
                owners.push(row as u32);
                lengths.push(refs[chunk[row]].clamp(1, max_len));
            }
        }
        let copies: Vec<&[u32]> = owners.iter().map(|&o| rows[o as usize]).collect();
        let inputs = DecoderInputs::new(&copies, &lengths, pad, device)?;
        let index = Tensor::from_vec(owners.clone(), owners.len(), device)?;
        let states = model.decode(&inputs, &select_memory(&memory, &index)?, None)?;
        let mut candidates = argmax_tokens(model, &states, &lengths)?.into_iter();
        for (row, lens) in ranked.iter().enumerate() {
            let ranked: Vec<Candidate> = candidates
                .by_ref()
                .take(lens.len())
                .map(|(tokens, score)| Candidate { tokens, score })
                .collect();
            let oracle = if reference_lengths.is_some() {
                candidates
                    .next()
                    .map(|(tokens, score)| Candidate { tokens, score })
            } else {
                None
            };
            out[chunk[row]] = Some(Decoded {
                ranked,
                oracle,
                predicted_length: lens[0],
            });
        }
    }
    Ok(out.into_iter().flatten().collect())
}

/// A reported output of a NAT: the length beam (`1`, `3`, `5`, or the reference length) and
/// whether consecutive duplicates were removed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Variant {
    /// Length beam `l`; `None`: the oracle (reference) length.
    pub length_beam: Option<usize>,
    /// Consecutive duplicate tokens removed.
    pub dedup: bool,
}

impl Variant {
    /// The variant every test and the dev selection use: `l = 5` (the largest beam), duplicates
    /// removed, as NAT papers report.
    pub const PRIMARY: Variant = Variant {
        length_beam: Some(5),
        dedup: true,
    };

    /// `l5+dedup`, `oracle`, ...
    pub fn name(&self) -> String {
        let beam = match self.length_beam {
            Some(l) => format!("l{l}"),
            None => "oracle".into(),
        };
        if self.dedup {
            format!("{beam}+dedup")
        } else {
            beam
        }
    }

    /// The variants reported for `beams`: each beam and the oracle, with and without
    /// duplicate removal.
    pub fn all(beams: &[usize]) -> Vec<Variant> {
        let lengths = beams.iter().map(|&l| Some(l)).chain(std::iter::once(None));
        lengths
            .flat_map(|length_beam| [true, false].map(|dedup| Variant { length_beam, dedup }))
            .collect()
    }

    /// This variant's tokens of `decoded` (empty for the oracle when none was decoded).
    pub fn tokens(&self, decoded: &Decoded) -> Vec<u32> {
        let tokens = match self.length_beam {
            Some(l) => decoded.at_beam(l),
            None => decoded.oracle.as_ref().map_or(&[][..], |c| &c.tokens),
        };
        if self.dedup {
            remove_consecutive_duplicates(tokens)
        } else {
            tokens.to_vec()
        }
    }
}

/// The share of output tokens that repeat the token before them.
pub fn repetition_share(outputs: &[Vec<u32>]) -> f64 {
    let tokens: usize = outputs.iter().map(Vec::len).sum();
    let repeats: usize = outputs
        .iter()
        .map(|o| o.windows(2).filter(|w| w[0] == w[1]).count())
        .sum();
    repeats as f64 / tokens.max(1) as f64
}

/// How well the predictor's most likely length matches the reference lengths.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LengthAccuracy {
    /// Share predicted exactly.
    pub exact: f64,
    /// Share within ±2 tokens.
    pub within_2: f64,
    /// Mean of predicted − reference length.
    pub mean_error: f64,
}

/// [`LengthAccuracy`] of `decoded` against `reference_lengths`.
pub fn length_accuracy(decoded: &[Decoded], reference_lengths: &[usize]) -> LengthAccuracy {
    let n = decoded.len().max(1) as f64;
    let errors: Vec<i64> = decoded
        .iter()
        .zip(reference_lengths)
        .map(|(d, &r)| d.predicted_length as i64 - r as i64)
        .collect();
    LengthAccuracy {
        exact: errors.iter().filter(|&&e| e == 0).count() as f64 / n,
        within_2: errors.iter().filter(|&&e| e.abs() <= 2).count() as f64 / n,
        mean_error: errors.iter().sum::<i64>() as f64 / n,
    }
}

/// Seconds `decode` takes, and sentences per second over `sentences`.
pub fn timed(sentences: usize, decode: impl FnOnce() -> Result<()>) -> Result<(f64, f64)> {
    let started = Instant::now();
    decode()?;
    let seconds = started.elapsed().as_secs_f64();
    Ok((seconds, sentences as f64 / seconds.max(1e-9)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(tokens: &[u32], score: f64) -> Candidate {
        Candidate {
            tokens: tokens.to_vec(),
            score,
        }
    }

    #[test]
    fn length_beams_pick_the_best_of_a_prefix() {
        let decoded = Decoded {
            ranked: vec![
                candidate(&[1, 1], -2.0),
                candidate(&[2], -3.0),
                candidate(&[3, 3, 4], -1.0),
            ],
            oracle: Some(candidate(&[5, 5], -4.0)),
            predicted_length: 2,
        };
        assert_eq!(decoded.at_beam(1), &[1, 1]);
        assert_eq!(decoded.at_beam(2), &[1, 1]);
        assert_eq!(decoded.at_beam(3), &[3, 3, 4]);
        assert_eq!(decoded.at_beam(5), &[3, 3, 4]);
        let dedup_oracle = Variant {
            length_beam: None,
            dedup: true,
        };
        assert_eq!(dedup_oracle.tokens(&decoded), vec![5]);
        assert_eq!(dedup_oracle.name(), "oracle+dedup");
        assert_eq!(Variant::all(&[1, 3, 5]).len(), 8);
        assert_eq!(Variant::PRIMARY.name(), "l5+dedup");
    }

    #[test]
    fn repetition_and_length_accuracy() {
        assert_eq!(repetition_share(&[vec![1, 1, 2], vec![3]]), 0.25);
        let decoded = |len| Decoded {
            ranked: vec![],
            oracle: None,
            predicted_length: len,
        };
        let acc = length_accuracy(&[decoded(3), decoded(7)], &[3, 4]);
        assert_eq!(acc.exact, 0.5);
        assert_eq!(acc.within_2, 0.5);
        assert_eq!(acc.mean_error, 1.5);
    }
}
