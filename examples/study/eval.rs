//! Exact BLEU of the decodes, the paired bootstrap against `ce`, and the averaging-effect
//! measures.
//!
//! Every score is `candle_bleu::exact::corpus_bleu` with sacrebleu's corpus defaults
//! (4-grams, `exp` smoothing), which on the whitespace-tokenized files the study writes equals
//! `sacrebleu REF -i HYP --tokenize none`. The bootstrap is `candle_bleu::exact::bootstrap`,
//! sacrebleu's `--paired-bs` with its own random numbers.

use anyhow::{anyhow, Result};
use candle_bleu::exact::bootstrap::paired_bootstrap_many;
use candle_bleu::exact::{corpus_bleu, corpus_stats, BleuConfig, BleuCounts};
use candle_core::{Device, D};
use std::collections::HashSet;

use crate::data::{make_batch, Encoded};
use crate::model::Seq2Seq;

fn wrap(refs: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    refs.iter().map(|r| vec![r.clone()]).collect()
}

/// Corpus BLEU on 0–100 of `hyps` against one reference per segment.
pub fn bleu_100(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Result<f64> {
    let score =
        corpus_bleu(hyps, &wrap(refs), &BleuConfig::default()).map_err(|e| anyhow!("{e}"))?;
    Ok(score.score)
}

/// Per-segment statistics, for the bootstrap.
pub fn segment_stats(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Result<Vec<BleuCounts>> {
    corpus_stats(hyps, &wrap(refs), 4).map_err(|e| anyhow!("{e}"))
}

/// One arm against `ce` by paired bootstrap.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    /// BLEU(arm) − BLEU(ce) on the compared corpus, 0–100.
    pub delta: f64,
    /// sacrebleu's paired-bootstrap p-value.
    pub p_value: f64,
    /// The arm's bootstrap mean and 95% half-width (sacrebleu's `μ ± ci`).
    pub mean: f64,
    pub ci: f64,
}

/// Paired bootstrap of every system against the baseline on the same segments
/// (`exact::bootstrap::paired_bootstrap_many`, sacrebleu's seed 12345).
pub fn compare(
    baseline: &[BleuCounts],
    systems: &[Vec<BleuCounts>],
    resamples: usize,
) -> Result<Vec<Comparison>> {
    let cfg = BleuConfig::default();
    let refs: Vec<&[BleuCounts]> = systems.iter().map(Vec::as_slice).collect();
    let (base, results) = paired_bootstrap_many(
        baseline,
        &refs,
        &cfg,
        resamples,
        candle_bleu::exact::bootstrap::SACREBLEU_SEED,
    )
    .map_err(|e| anyhow!("{e}"))?;
    Ok(results
        .into_iter()
        .map(|r| {
            let confidence = r
                .confidence
                .expect("the paired bootstrap estimates the interval");
            Comparison {
                delta: r.score - base.score,
                p_value: r.p_value,
                mean: confidence.mean,
                ci: confidence.ci,
            }
        })
        .collect())
}

/// The averaging-effect measures of one model on the test set.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Measures {
    /// Mean entropy (nats) of the teacher-forced output distribution over the real target
    /// positions (words and EOS).
    pub entropy: f64,
    /// Share of the reference word positions whose teacher-forced argmax is not the
    /// position's reference token but a reference token of another position of the sentence
    /// (Casas et al.'s "average of the tokens in the reference").
    pub argmax_other_ref_rate: f64,
    /// Share of the real target positions (words and EOS) whose teacher-forced argmax is the
    /// reference token.
    pub teacher_forced_accuracy: f64,
    /// Share of greedy hypothesis tokens that repeat an earlier token of the same hypothesis.
    pub repeated_token_rate: f64,
    /// Total greedy hypothesis length / total reference length.
    pub length_ratio: f64,
}

/// Share of tokens that repeat an earlier token of their own segment.
pub fn repeated_token_rate(segments: &[Vec<String>]) -> f64 {
    let (mut repeats, mut total) = (0usize, 0usize);
    for segment in segments {
        let mut seen = HashSet::new();
        for token in segment {
            if !seen.insert(token) {
                repeats += 1;
            }
        }
        total += segment.len();
    }
    repeats as f64 / total.max(1) as f64
}

/// The measures of `model` on `test` (teacher-forced part) and of its greedy decodes `hyps`.
/// Evaluation only: copies the teacher-forced argmax and entropies to the host.
pub fn measures(
    model: &Seq2Seq,
    test: &[Encoded],
    hyps: &[Vec<String>],
    refs: &[Vec<String>],
    device: &Device,
) -> Result<Measures> {
    let (mut entropy_sum, mut positions) = (0.0, 0usize);
    let (mut other_ref, mut words, mut correct) = (0usize, 0usize, 0usize);
    for chunk in test.chunks(250) {
        let examples: Vec<&Encoded> = chunk.iter().collect();
        let batch = make_batch(&examples, device)?;
        let logits = model.decode(&batch.dec_in, &model.encode(&batch.src)?)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let entropy = (log_probs.exp()? * &log_probs)?.sum(D::Minus1)?.neg()?;
        let entropy: Vec<Vec<f32>> = entropy.to_vec2()?;
        let argmax: Vec<Vec<u32>> = logits.argmax(D::Minus1)?.to_vec2()?;
        for (i, example) in examples.iter().enumerate() {
            let target = &example.tgt;
            // Positions 0..T predict the words, position T predicts EOS.
            for position in 0..=target.len() {
                entropy_sum += f64::from(entropy[i][position]);
                positions += 1;
                let predicted = argmax[i][position];
                let gold = target.get(position).copied().unwrap_or(crate::data::EOS);
                if predicted == gold {
                    correct += 1;
                }
                if position < target.len() {
                    words += 1;
                    let elsewhere = target
                        .iter()
                        .enumerate()
                        .any(|(j, &t)| j != position && t == predicted);
                    if predicted != gold && elsewhere {
                        other_ref += 1;
                    }
                }
            }
        }
    }
    let hyp_len: usize = hyps.iter().map(Vec::len).sum();
    let ref_len: usize = refs.iter().map(Vec::len).sum();
    Ok(Measures {
        entropy: entropy_sum / positions.max(1) as f64,
        argmax_other_ref_rate: other_ref as f64 / words.max(1) as f64,
        teacher_forced_accuracy: correct as f64 / positions.max(1) as f64,
        repeated_token_rate: repeated_token_rate(hyps),
        length_ratio: hyp_len as f64 / ref_len.max(1) as f64,
    })
}
