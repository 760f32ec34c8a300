//! Decoding a split and scoring the detokenised output as a paper reports it: sacrebleu's
//! default BLEU (13a tokenizer, `exp` smoothing) and chrF / chrF++, all through
//! `candle_bleu::exact`, plus the length ratio and BLEU without its brevity penalty.

use anyhow::{anyhow, Result};
use candle_bleu::exact::bootstrap::{paired_bootstrap, BootstrapConfig};
use candle_bleu::exact::chrf::{corpus_chrf, corpus_chrf_stats, ChrfConfig, ChrfCounts};
use candle_bleu::exact::tokenize::{tokenize, Tokenizer};
use candle_bleu::exact::{corpus_bleu, corpus_stats, sentence_bleu, BleuConfig, BleuCounts};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::batches::{make_batch, BatchIds, IdPairs};
use crate::data::{Bpe, BOS, EOS, PAD};
use crate::decode::{beam_search, greedy, BeamConfig, MaxLength, Specials};
use crate::model::transformer::Transformer;

/// sacrebleu's signature of the BLEU every score here is: `sacrebleu REF -i HYP` (defaults).
pub const BLEU_SIGNATURE: &str = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0";
/// sacrebleu's signature of chrF (`-m chrf`).
pub const CHRF_SIGNATURE: &str = "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0";
/// sacrebleu's signature of chrF++ (`-m chrf --chrf-word-order 2`).
pub const CHRF_PP_SIGNATURE: &str = "nrefs:1|case:mixed|eff:yes|nc:6|nw:2|space:no|version:2.6.0";

/// How to decode.
#[derive(Debug, Clone, Copy)]
pub enum Search {
    /// Greedy (checkpoint selection).
    Greedy,
    /// Beam search (reported test scores).
    Beam(BeamConfig),
}

/// Decodes `sources` (ids without BOS/EOS) on the model's device in batches of about `batch`
/// sentences of similar length, and returns the outputs' ids in the sources' order.
pub fn decode_ids(
    model: &Transformer,
    sources: &[Vec<u32>],
    specials: Specials,
    search: Search,
    batch: usize,
) -> Result<Vec<Vec<u32>>> {
    let device = model.device();
    let mut order: Vec<usize> = (0..sources.len()).collect();
    order.sort_by_key(|&i| (sources[i].len(), i));
    let mut out = vec![Vec::new(); sources.len()];
    for chunk in order.chunks(batch.max(1)) {
        let width = chunk
            .iter()
            .map(|&i| sources[i].len())
            .max()
            .unwrap_or(1)
            .max(1);
        let mut flat = vec![specials.pad; chunk.len() * width];
        for (row, &i) in chunk.iter().enumerate() {
            flat[row * width..][..sources[i].len()].copy_from_slice(&sources[i]);
        }
        let src = Tensor::from_vec(flat, (chunk.len(), width), device)?;
        let decoded = match search {
            Search::Greedy => greedy(model, &src, specials, MaxLength::default())?,
            Search::Beam(cfg) => beam_search(model, &src, specials, cfg)?,
        };
        for (&i, ids) in chunk.iter().zip(decoded) {
            out[i] = ids;
        }
    }
    Ok(out)
}

/// [`decode_ids`] of `sources` in batches of 250 (greedy) or 100 (beam search), detokenised
/// by `bpe`.
pub fn decode_texts(
    model: &Transformer,
    sources: &[Vec<u32>],
    search: Search,
    bpe: &Bpe,
) -> Result<Vec<String>> {
    let batch = match search {
        Search::Greedy => 250,
        Search::Beam(_) => 100,
    };
    let specials = Specials {
        bos: BOS,
        eos: EOS,
        pad: PAD,
    };
    let ids = decode_ids(model, sources, specials, search, batch)?;
    Ok(ids
        .iter()
        .map(|i| bpe.decode(i).unwrap_or_default())
        .collect())
}

/// The scores of one system output against one reference per segment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TextScores {
    /// sacrebleu's BLEU (13a), 0–100.
    pub bleu: f64,
    /// BLEU without the brevity penalty: the geometric mean of the precisions, 0–100.
    pub bleu_without_bp: f64,
    /// The brevity penalty.
    pub brevity_penalty: f64,
    /// Hypothesis length / reference length, in 13a tokens.
    pub length_ratio: f64,
    /// chrF (sacrebleu's `CHRF()`), 0–100.
    pub chrf: f64,
    /// chrF++ (`CHRF(word_order=2)`), 0–100.
    pub chrf_pp: f64,
}

fn tokens(lines: &[String]) -> Vec<Vec<String>> {
    lines
        .iter()
        .map(|l| tokenize(l, Tokenizer::V13a, false))
        .collect()
}

fn one_each<T: Clone>(refs: &[T]) -> Vec<Vec<T>> {
    refs.iter().map(|r| vec![r.clone()]).collect()
}

/// Corpus BLEU (13a) of detokenised `hyps` against `refs`, 0–100.
pub fn bleu(hyps: &[String], refs: &[String]) -> Result<f64> {
    let score = corpus_bleu(
        &tokens(hyps),
        &one_each(&tokens(refs)),
        &BleuConfig::default(),
    )
    .map_err(|e| anyhow!("BLEU: {e}"))?;
    Ok(score.score)
}

/// sacrebleu's `sentence_bleu` (13a, `exp` smoothing, effective order), 0–100: MRT's cost.
pub fn sentence_bleu_13a(hyp: &str, reference: &str) -> f64 {
    let hyp = tokenize(hyp, Tokenizer::V13a, false);
    let reference = vec![tokenize(reference, Tokenizer::V13a, false)];
    sentence_bleu(&hyp, &reference, &BleuConfig::sacrebleu_sentence())
        .map(|s| s.score)
        .unwrap_or(0.0)
}

/// Every score of [`TextScores`].
pub fn score(hyps: &[String], refs: &[String]) -> Result<TextScores> {
    let b = corpus_bleu(
        &tokens(hyps),
        &one_each(&tokens(refs)),
        &BleuConfig::default(),
    )
    .map_err(|e| anyhow!("BLEU: {e}"))?;
    let refs_each = one_each(refs);
    let chrf =
        corpus_chrf(hyps, &refs_each, ChrfConfig::default()).map_err(|e| anyhow!("chrF: {e}"))?;
    let chrf_pp = corpus_chrf(hyps, &refs_each, ChrfConfig::chrf_plus_plus())
        .map_err(|e| anyhow!("chrF++: {e}"))?;
    Ok(TextScores {
        bleu: b.score,
        bleu_without_bp: if b.bp > 0.0 { b.score / b.bp } else { 0.0 },
        brevity_penalty: b.bp,
        length_ratio: b.ratio,
        chrf: chrf.score,
        chrf_pp: chrf_pp.score,
    })
}

/// Per-segment statistics of a system, for the paired bootstrap.
pub struct SegmentStats {
    /// BLEU (13a) counts per segment.
    pub bleu: Vec<BleuCounts>,
    /// chrF counts per segment.
    pub chrf: Vec<ChrfCounts>,
}

/// The per-segment statistics of `hyps` against `refs`.
pub fn segment_stats(hyps: &[String], refs: &[String]) -> Result<SegmentStats> {
    Ok(SegmentStats {
        bleu: corpus_stats(&tokens(hyps), &one_each(&tokens(refs)), 4)
            .map_err(|e| anyhow!("BLEU statistics: {e}"))?,
        chrf: corpus_chrf_stats(hyps, &one_each(refs), ChrfConfig::default())
            .map_err(|e| anyhow!("chrF statistics: {e}"))?,
    })
}

/// sacrebleu's paired bootstrap (`--paired-bs`, its seed and resamples) of a system against
/// the baseline, for BLEU and chrF.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Bootstrap {
    /// System BLEU − baseline BLEU.
    pub bleu_delta: f64,
    /// sacrebleu's p-value for BLEU.
    pub bleu_p: f64,
    /// System chrF − baseline chrF.
    pub chrf_delta: f64,
    /// sacrebleu's p-value for chrF.
    pub chrf_p: f64,
}

/// The paired bootstrap of `system` against `baseline` with `resamples` resamples and
/// sacrebleu's seed 12345.
pub fn bootstrap(
    baseline: &SegmentStats,
    system: &SegmentStats,
    resamples: usize,
) -> Result<Bootstrap> {
    let (bleu_base, bleu_sys) = paired_bootstrap(
        &baseline.bleu,
        &system.bleu,
        &BleuConfig::default(),
        &BootstrapConfig {
            n_samples: resamples,
            seed: 12345,
        },
    )
    .map_err(|e| anyhow!("paired bootstrap (BLEU): {e}"))?;
    let (chrf_base, chrf_sys) = paired_bootstrap(
        &baseline.chrf,
        &system.chrf,
        &ChrfConfig::default(),
        &BootstrapConfig {
            n_samples: resamples,
            seed: 12345,
        },
    )
    .map_err(|e| anyhow!("paired bootstrap (chrF): {e}"))?;
    Ok(Bootstrap {
        bleu_delta: bleu_sys.score - bleu_base.score,
        bleu_p: bleu_sys.p_value,
        chrf_delta: chrf_sys.score - chrf_base.score,
        chrf_p: chrf_sys.p_value,
    })
}

/// What a trained model's teacher-forced output distributions look like on a split: the
/// numbers that decide what gradient filtering (`candle_bleu::loss::HiddenConfig::filter_below`)
/// can skip in the backward of the loss from hidden states.
#[derive(Debug, Clone, Serialize)]
pub struct OutputDistribution {
    /// Target positions measured (each reference token and the EOS; padding excluded).
    pub positions: usize,
    /// Mean entropy of their softmax rows, nats.
    pub mean_entropy_nats: f64,
    /// Mean probability of the reference token.
    pub mean_target_prob: f64,
    /// Share of their probabilities that lie below `tau`.
    pub share_below_tau: f64,
    /// Share of the `block_rows × vocab_tile` tiles whose probabilities all lie below `tau`:
    /// blocks of consecutive rows of each batch's `[B·T, V]` logits, padding rows included,
    /// as the hidden-state loss cuts them in training.
    pub skipped_tile_share: f64,
    /// The threshold.
    pub tau: f64,
    /// Rows per block.
    pub block_rows: usize,
    /// Vocabulary columns per tile.
    pub vocab_tile: usize,
}

/// The gradient filter [`output_distribution`] measures against: probabilities below `tau`,
/// and the `block_rows × vocab_tile` tiles the hidden-state loss cuts the logits into.
#[derive(Debug, Clone, Copy)]
pub struct TileFilter {
    /// The threshold, in `(0, 1)`.
    pub tau: f64,
    /// Rows per block (>= 1).
    pub block_rows: usize,
    /// Vocabulary columns per tile (>= 1).
    pub vocab_tile: usize,
}

/// Measures [`OutputDistribution`] of `model` on `pairs`, teacher-forced without dropout, in
/// batches of `batch_size` consecutive pairs, against `filter`.
pub fn output_distribution(
    model: &Transformer,
    pairs: &IdPairs,
    ids: BatchIds,
    batch_size: usize,
    filter: TileFilter,
) -> Result<OutputDistribution> {
    let TileFilter {
        tau,
        block_rows,
        vocab_tile,
    } = filter;
    if pairs.is_empty() || batch_size == 0 || block_rows == 0 || vocab_tile == 0 {
        return Err(anyhow!(
            "output_distribution: needs pairs ({}), batch_size ({batch_size}), block_rows \
             ({block_rows}) and vocab_tile ({vocab_tile}) >= 1",
            pairs.len()
        ));
    }
    if !(tau > 0.0 && tau < 1.0) {
        return Err(anyhow!(
            "output_distribution: tau must be in (0, 1), got {tau}"
        ));
    }
    let indices: Vec<usize> = (0..pairs.len()).collect();
    let (mut positions, mut entropy, mut target_prob, mut below) = (0.0, 0.0, 0.0, 0.0);
    let (mut skipped, mut tiles) = (0usize, 0usize);
    for chunk in indices.chunks(batch_size) {
        let batch = make_batch(pairs, chunk, ids, model.device())?;
        let memory = model.encode(&batch.src, ids.pad, None)?;
        let states = model.decode(&batch.dec_in, &memory, None)?;
        let logits = model.logits(&states)?.flatten_to(1)?;
        let (rows, vocab) = logits.dims2()?;
        let log_probs = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1)?;
        let probs = log_probs.exp()?;
        let targets = batch.dec_out.flatten_all()?;
        let kept = targets.ne(ids.pad)?.to_dtype(candle_core::DType::F32)?;
        let row_entropy = (&probs * &log_probs)?.sum(1)?.neg()?;
        let row_target = probs.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?;
        let row_below = probs.lt(tau)?.to_dtype(candle_core::DType::F32)?.sum(1)?;
        let masked_sum = |t: &Tensor| -> Result<f64> {
            Ok(f64::from((t * &kept)?.sum_all()?.to_scalar::<f32>()?))
        };
        positions += f64::from(kept.sum_all()?.to_scalar::<f32>()?);
        entropy += masked_sum(&row_entropy)?;
        target_prob += masked_sum(&row_target)?;
        below += masked_sum(&row_below)? / vocab as f64;
        for start in (0..rows).step_by(block_rows) {
            let n = block_rows.min(rows - start);
            let column_max = probs.narrow(0, start, n)?.max(0)?.to_vec1::<f32>()?;
            for tile in column_max.chunks(vocab_tile) {
                skipped += usize::from(tile.iter().all(|&p| f64::from(p) < tau));
                tiles += 1;
            }
        }
    }
    Ok(OutputDistribution {
        positions: positions as usize,
        mean_entropy_nats: entropy / positions,
        mean_target_prob: target_prob / positions,
        share_below_tau: below / positions,
        skipped_tile_share: skipped as f64 / tiles as f64,
        tau,
        block_rows,
        vocab_tile,
    })
}
