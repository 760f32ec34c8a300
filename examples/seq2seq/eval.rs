//! Exact BLEU of decoded outputs, and the paired bootstrap test between two objectives, both
//! from the crate's `exact` module (nothing re-implemented here).
//!
//! Every score is `candle_bleu::exact::corpus_bleu` with its default configuration, which is
//! sacrebleu's corpus default (4-grams, `exp` smoothing); on the whitespace-tokenized files
//! the example writes it equals `sacrebleu.corpus_bleu(hyps, [refs], tokenize='none')`. The
//! test is `exact::bootstrap::paired_bootstrap`, sacrebleu's `--paired-bs` with its resamples.

use anyhow::{anyhow, Result};
use candle_bleu::exact::bootstrap::{
    paired_bootstrap as sacrebleu_paired_bootstrap, resample_scores,
};
use candle_bleu::exact::{corpus_bleu, corpus_stats, BleuConfig, BleuCounts};

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
    pub ci_high: f64,
    /// Bootstrap mean and 95% half-width of each system, as `sacrebleu -pbs` prints them.
    pub baseline_mean: f64,
    pub baseline_ci: f64,
    pub system_mean: f64,
    pub system_ci: f64,
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
    let cfg = BleuConfig::default();
    let err = |e: candle_bleu::exact::MetricError| anyhow!("paired bootstrap: {e}");
    let (base, sys) =
        sacrebleu_paired_bootstrap(baseline, system, &cfg, resamples, seed).map_err(err)?;
    let sys_confidence = sys
        .confidence
        .ok_or_else(|| anyhow!("paired bootstrap: no system estimate"))?;
    let base_scores = resample_scores(baseline, &cfg, resamples, seed).map_err(err)?;
    let sys_scores = resample_scores(system, &cfg, resamples, seed).map_err(err)?;
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
