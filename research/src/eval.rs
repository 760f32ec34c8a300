//! Evaluation: exact BLEU of decoded outputs, sacrebleu's paired bootstrap between systems,
//! the averaging-effect measures of a model, and mean ± sd over seeds — all BLEU from the
//! crate's `exact` module (nothing re-implemented here).
//!
//! Every score is `candle_bleu::exact::corpus_bleu` with its default configuration, which is
//! sacrebleu's corpus default (4-grams, `exp` smoothing); on the whitespace-tokenized files
//! the examples write it equals `sacrebleu.corpus_bleu(hyps, [refs], tokenize='none')`. The
//! tests are `exact::bootstrap::paired_bootstrap` and `paired_bootstrap_many`, sacrebleu's
//! `--paired-bs` with its own resamples.

use anyhow::{anyhow, Result};
use candle_bleu::exact::bootstrap::{
    paired_bootstrap as sacrebleu_paired_bootstrap, paired_bootstrap_many, resample_scores,
    BootstrapConfig,
};
use candle_bleu::exact::{corpus_bleu, corpus_stats, BleuConfig, BleuCounts};
use candle_core::{Device, D};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::data::{make_batch, Encoded, EOS, PAD};
use crate::model::transformer::Transformer;

/// sacrebleu's signature of every BLEU the synthetic examples report: one reference,
/// sacrebleu's defaults, whitespace tokens as written (`tokenize='none'`), so
/// `sacrebleu REF -i HYP -tok none -b` reproduces the score from the written files.
pub const BLEU_SIGNATURE_TOK_NONE: &str =
    "nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:2.6.0";

/// The references as `exact` takes them: one reference per segment.
fn one_reference_each(refs: &[Vec<String>]) -> Vec<Vec<Vec<String>>> {
    refs.iter().map(|r| vec![r.clone()]).collect()
}

/// Corpus BLEU on 0–100 of `hyps` against one reference per segment.
pub fn bleu_100(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Result<f64> {
    let refs = one_reference_each(refs);
    let score = corpus_bleu(hyps, &refs, &BleuConfig::default()).map_err(|e| anyhow!("{e}"))?;
    Ok(score.score)
}

/// Per-segment statistics (`exact::corpus_stats`, 4-grams) of `hyps` against one reference per
/// segment: what the bootstrap resamples.
pub fn segment_stats(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Result<Vec<BleuCounts>> {
    corpus_stats(hyps, &one_reference_each(refs), 4).map_err(|e| anyhow!("{e}"))
}

/// The outcome of a paired bootstrap test of `system` against `baseline`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairedBootstrap {
    /// BLEU(system) − BLEU(baseline) on the full test set, 0–100.
    pub delta: f64,
    /// sacrebleu's p-value: `(1 + #{b : d_b − mean(d) > |delta|}) / (1 + B)` with
    /// `d_b = |BLEU_system,b − BLEU_baseline,b|` on resample `b`.
    pub p_value: f64,
    /// 95% bootstrap interval of the difference `BLEU_system,b − BLEU_baseline,b` (the
    /// `⌊B/40⌋`-th smallest and largest, as sacrebleu's intervals).
    pub ci_low: f64,
    /// Upper end of that interval.
    pub ci_high: f64,
    /// Bootstrap mean of the baseline, as `sacrebleu -pbs` prints it.
    pub baseline_mean: f64,
    /// 95% half-width of the baseline's bootstrap scores.
    pub baseline_ci: f64,
    /// Bootstrap mean of the system.
    pub system_mean: f64,
    /// 95% half-width of the system's bootstrap scores.
    pub system_ci: f64,
    /// Number of resamples `B`.
    pub resamples: usize,
}

/// sacrebleu's paired bootstrap resampling (`exact::bootstrap::paired_bootstrap`, seed `seed`)
/// of `system` against `baseline`, given as per-segment statistics of the same test segments.
/// The interval of the difference comes from the same resamples (`resample_scores` with the
/// same seed draws the same segment indices).
pub fn paired_bootstrap(
    baseline: &[BleuCounts],
    system: &[BleuCounts],
    resamples: usize,
    seed: u64,
) -> Result<PairedBootstrap> {
    if resamples == 0 {
        anyhow::bail!("paired bootstrap: resamples must be at least 1");
    }
    let cfg = BleuConfig::default();
    let bootstrap = BootstrapConfig {
        n_samples: resamples,
        seed,
    };
    let err = |e: candle_bleu::exact::MetricError| anyhow!("paired bootstrap: {e}");
    let (base, sys) =
        sacrebleu_paired_bootstrap(baseline, system, &cfg, &bootstrap).map_err(err)?;
    let sys_confidence = sys
        .confidence
        .ok_or_else(|| anyhow!("paired bootstrap: no system estimate"))?;
    let base_scores = resample_scores(baseline, &cfg, &bootstrap).map_err(err)?;
    let sys_scores = resample_scores(system, &cfg, &bootstrap).map_err(err)?;
    let mut deltas: Vec<f64> = sys_scores
        .iter()
        .zip(&base_scores)
        .map(|(s, b)| s - b)
        .collect();
    deltas.sort_by(f64::total_cmp);
    let k = resamples / 40;
    Ok(PairedBootstrap {
        delta: sys.score - base.score,
        p_value: sys.p_value,
        ci_low: deltas[k],
        ci_high: deltas[resamples - 1 - k],
        baseline_mean: base.mean,
        baseline_ci: base.ci,
        system_mean: sys_confidence.mean,
        system_ci: sys_confidence.ci,
        resamples,
    })
}

/// One system against a baseline by paired bootstrap (the study: each objective against `ce`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    /// BLEU(system) − BLEU(baseline) on the compared corpus, 0–100.
    pub delta: f64,
    /// sacrebleu's paired-bootstrap p-value.
    pub p_value: f64,
    /// The system's bootstrap mean (sacrebleu's `μ`).
    pub mean: f64,
    /// The system's 95% half-width (sacrebleu's `± ci`).
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
        &BootstrapConfig {
            n_samples: resamples,
            ..BootstrapConfig::default()
        },
    )
    .map_err(|e| anyhow!("{e}"))?;
    results
        .into_iter()
        .map(|r| {
            let confidence = r
                .confidence
                .ok_or_else(|| anyhow!("paired bootstrap: no system estimate"))?;
            Ok(Comparison {
                delta: r.score - base.score,
                p_value: r.p_value,
                mean: confidence.mean,
                ci: confidence.ci,
            })
        })
        .collect()
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
    /// Share of the reference word positions whose teacher-forced argmax is the run's most
    /// frequent argmax token: 1 for a model collapsed onto one token, the references' own top
    /// token share for a perfect model ([`MeasureControls`]).
    pub argmax_top_token_share: f64,
    /// Mean over test sentences of the share of the sentence's distinct reference tokens that
    /// are the teacher-forced argmax at some word position of the sentence: 1 when every
    /// reference token is predicted somewhere (correctly or displaced, as averaging would),
    /// `1 / types` for a collapse onto one reference token.
    pub argmax_ref_bag_coverage: f64,
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
    model: &Transformer,
    test: &[Encoded],
    hyps: &[Vec<String>],
    refs: &[Vec<String>],
    device: &Device,
) -> Result<Measures> {
    let (mut entropy_sum, mut positions) = (0.0, 0usize);
    let (mut other_ref, mut words, mut correct) = (0usize, 0usize, 0usize);
    let mut argmax_counts: HashMap<u32, usize> = HashMap::new();
    let (mut coverage_sum, mut sentences) = (0.0, 0usize);
    for chunk in test.chunks(250) {
        let examples: Vec<&Encoded> = chunk.iter().collect();
        let batch = make_batch(&examples, device)?;
        let memory = model.encode(&batch.src, PAD, None)?;
        let logits = model.logits(&model.decode(&batch.dec_in, &memory, None)?)?;
        let log_probs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let entropy = (log_probs.exp()? * &log_probs)?.sum(D::Minus1)?.neg()?;
        let entropy: Vec<Vec<f32>> = entropy.to_vec2()?;
        let argmax: Vec<Vec<u32>> = logits.argmax(D::Minus1)?.to_vec2()?;
        for (i, example) in examples.iter().enumerate() {
            let target = &example.tgt;
            let predicted_words = &argmax[i][..target.len()];
            for &token in predicted_words {
                *argmax_counts.entry(token).or_default() += 1;
            }
            if let Some(coverage) = bag_coverage(target, |t| predicted_words.contains(t)) {
                coverage_sum += coverage;
                sentences += 1;
            }
            // Positions 0..T predict the words, position T predicts EOS.
            for position in 0..=target.len() {
                entropy_sum += f64::from(entropy[i][position]);
                positions += 1;
                let predicted = argmax[i][position];
                let gold = target.get(position).copied().unwrap_or(EOS);
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
        argmax_top_token_share: argmax_counts.values().max().copied().unwrap_or(0) as f64
            / words.max(1) as f64,
        argmax_ref_bag_coverage: coverage_sum / sentences.max(1) as f64,
        teacher_forced_accuracy: correct as f64 / positions.max(1) as f64,
        repeated_token_rate: repeated_token_rate(hyps),
        length_ratio: hyp_len as f64 / ref_len.max(1) as f64,
    })
}

/// The share of `reference`'s distinct tokens for which `hit` holds; `None` for an empty
/// reference.
fn bag_coverage<T: Eq + std::hash::Hash>(
    reference: &[T],
    mut hit: impl FnMut(&T) -> bool,
) -> Option<f64> {
    let types: HashSet<&T> = reference.iter().collect();
    if types.is_empty() {
        return None;
    }
    let hits = types.iter().filter(|t| hit(t)).count();
    Some(hits as f64 / types.len() as f64)
}

/// The averaging measures of a predictor that needs no model, on the test references.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ControlMeasures {
    /// [`Measures::argmax_other_ref_rate`] of the predictor.
    pub argmax_other_ref_rate: f64,
    /// [`Measures::argmax_top_token_share`] of the predictor.
    pub argmax_top_token_share: f64,
    /// [`Measures::argmax_ref_bag_coverage`] of the predictor.
    pub argmax_ref_bag_coverage: f64,
}

/// What the averaging measures give without a model, on the same test references: the
/// yardsticks that separate averaging (reference tokens spread over the wrong positions) from
/// a collapse onto one frequent token.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MeasureControls {
    /// The most frequent token of the training targets (ties: the first in byte order).
    pub most_frequent_token: String,
    /// "Always the most frequent training-target token" at every position.
    pub constant: ControlMeasures,
    /// Each position drawn independently from the training targets' unigram frequencies:
    /// expected values (the top-token share is the largest unigram probability, the share's
    /// limit on a large test set).
    pub unigram: ControlMeasures,
    /// The references themselves (a model whose argmax is the reference everywhere).
    pub references: ControlMeasures,
}

/// The [`MeasureControls`] of `test_refs` (word tokens, no EOS), with the unigram frequencies
/// of `train_targets`. Errors: no training-target tokens.
pub fn measure_controls(
    train_targets: &[Vec<String>],
    test_refs: &[Vec<String>],
) -> Result<MeasureControls> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for token in train_targets.iter().flatten() {
        *counts.entry(token).or_default() += 1;
    }
    let total: usize = counts.values().sum();
    if total == 0 {
        anyhow::bail!("measure_controls: train_targets has no tokens");
    }
    let p = |t: &str| counts.get(t).map_or(0.0, |&c| c as f64 / total as f64);
    // BTreeMap order: the first maximum in byte order.
    let (top, top_count) = counts.iter().fold(
        ("", 0usize),
        |best, (&t, &c)| if c > best.1 { (t, c) } else { best },
    );
    let (mut constant_other, mut unigram_other, mut words) = (0.0, 0.0, 0usize);
    let (mut constant_cover, mut unigram_cover, mut sentences) = (0.0, 0.0, 0usize);
    let mut ref_counts: HashMap<&str, usize> = HashMap::new();
    for reference in test_refs {
        for (i, gold) in reference.iter().enumerate() {
            words += 1;
            *ref_counts.entry(gold).or_default() += 1;
            // Ordered sets: the sums below run in one order in every process (a HashSet's
            // order is random per process and moved the last bit of the sums between runs).
            let elsewhere: BTreeSet<&str> = reference
                .iter()
                .enumerate()
                .filter(|&(j, t)| j != i && t != gold)
                .map(|(_, t)| t.as_str())
                .collect();
            if elsewhere.contains(top) {
                constant_other += 1.0;
            }
            unigram_other += elsewhere.iter().map(|t| p(t)).sum::<f64>();
        }
        let len = reference.len() as i32;
        if let Some(c) = bag_coverage(reference, |t| t == top) {
            constant_cover += c;
            // P(type t drawn at least once in `len` independent positions), averaged over types.
            let types: BTreeSet<&String> = reference.iter().collect();
            unigram_cover += types
                .iter()
                .map(|t| 1.0 - (1.0 - p(t)).powi(len))
                .sum::<f64>()
                / types.len() as f64;
            sentences += 1;
        }
    }
    let words_f = words.max(1) as f64;
    let sentences_f = sentences.max(1) as f64;
    Ok(MeasureControls {
        most_frequent_token: top.to_string(),
        constant: ControlMeasures {
            argmax_other_ref_rate: constant_other / words_f,
            argmax_top_token_share: 1.0,
            argmax_ref_bag_coverage: constant_cover / sentences_f,
        },
        unigram: ControlMeasures {
            argmax_other_ref_rate: unigram_other / words_f,
            argmax_top_token_share: top_count as f64 / total as f64,
            argmax_ref_bag_coverage: unigram_cover / sentences_f,
        },
        references: ControlMeasures {
            argmax_other_ref_rate: 0.0,
            argmax_top_token_share: ref_counts.values().max().copied().unwrap_or(0) as f64
                / words_f,
            argmax_ref_bag_coverage: 1.0,
        },
    })
}

pub use crate::stats::mean_sd;
