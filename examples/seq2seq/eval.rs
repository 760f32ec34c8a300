//! Exact BLEU of decoded outputs, and the paired bootstrap test between two objectives.
//!
//! Every score is `candle_bleu::exact::corpus_bleu` with its default configuration, which is
//! sacrebleu's corpus default (4-grams, `exp` smoothing); on the whitespace-tokenized files
//! the example writes it equals `sacrebleu.corpus_bleu(hyps, [refs], tokenize='none')`.

use anyhow::{anyhow, Result};
use candle_bleu::exact::{corpus_bleu, BleuConfig};
use candle_bleu::ngram::{add_clipped_matches, count_ngrams, merge_max_counts, NgramCounts};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Corpus BLEU on 0–100 of `hyps` against one reference per segment.
pub fn bleu_100(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Result<f64> {
    let refs: Vec<Vec<Vec<String>>> = refs.iter().map(|r| vec![r.clone()]).collect();
    let score = corpus_bleu(hyps, &refs, &BleuConfig::default()).map_err(|e| anyhow!("{e}"))?;
    Ok(100.0 * score.bleu)
}

/// Sufficient statistics of one segment: `[m_1..m_4, t_1..t_4, hyp_len, ref_len]`.
pub type SegmentStats = [u64; 10];

const ORDER: usize = 4;

/// Per-segment statistics from the crate's shared n-gram counter.
pub fn segment_stats(hyps: &[Vec<String>], refs: &[Vec<String>]) -> Vec<SegmentStats> {
    hyps.iter()
        .zip(refs)
        .map(|(hyp, reference)| {
            let mut stats = [0u64; 10];
            let mut max_counts = NgramCounts::default();
            let mut scratch = NgramCounts::default();
            merge_max_counts(reference, ORDER, &mut scratch, &mut max_counts);
            add_clipped_matches(&count_ngrams(hyp, ORDER), &max_counts, &mut stats[..ORDER]);
            for n in 1..=ORDER {
                stats[ORDER + n - 1] = (hyp.len() + 1).saturating_sub(n) as u64;
            }
            stats[8] = hyp.len() as u64;
            stats[9] = reference.len() as u64;
            stats
        })
        .collect()
}

/// sacrebleu's corpus BLEU (0–100, `exp` smoothing, no effective order) from summed
/// statistics: the score `bleu_100` gives, computed from sums so that a bootstrap
/// resample costs no re-counting.
pub fn bleu_from_stats(stats: &SegmentStats) -> f64 {
    let (hyp_len, ref_len) = (stats[8] as f64, stats[9] as f64);
    if hyp_len == 0.0 {
        return 0.0;
    }
    let mut log_sum = 0.0;
    let mut smooth = 1.0;
    for n in 0..ORDER {
        let (matches, totals) = (stats[n] as f64, stats[ORDER + n] as f64);
        let precision = if totals == 0.0 {
            0.0
        } else if matches == 0.0 {
            smooth *= 2.0;
            1.0 / (smooth * totals)
        } else {
            matches / totals
        };
        if precision == 0.0 {
            return 0.0;
        }
        log_sum += precision.ln();
    }
    let log_bp = if hyp_len < ref_len {
        1.0 - ref_len / hyp_len
    } else {
        0.0
    };
    100.0 * (log_bp + log_sum / ORDER as f64).exp()
}

/// Corpus BLEU (0–100) of the segments' summed statistics.
pub fn bleu_of_segments(stats: &[SegmentStats]) -> f64 {
    let all: Vec<usize> = (0..stats.len()).collect();
    bleu_from_stats(&sum_at(stats, &all))
}

fn sum_at(stats: &[SegmentStats], indices: &[usize]) -> SegmentStats {
    let mut total = [0u64; 10];
    for &i in indices {
        for (t, s) in total.iter_mut().zip(&stats[i]) {
            *t += s;
        }
    }
    total
}

/// The outcome of a paired bootstrap test of `system` against `baseline`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PairedBootstrap {
    /// Observed difference of the (seed-averaged) BLEU, system − baseline, on 0–100.
    pub delta: f64,
    /// Two-sided p-value of "no difference".
    pub p_value: f64,
    /// 95% bootstrap interval of the difference.
    pub ci_low: f64,
    pub ci_high: f64,
    pub resamples: usize,
}

/// Paired bootstrap resampling (Koehn 2004) over test segments, pooled over seeds.
///
/// `baseline[s]` and `system[s]` are the per-segment statistics of seed `s`'s two runs on
/// the same test set. Each resample draws the segment indices once (with replacement) and
/// uses them for every seed and both systems, so the pairing of segments and of seeds is
/// kept. The statistic is the difference of seed-averaged corpus BLEU. As in sacrebleu's
/// `--paired-bs`, the p-value is the share of resampled differences, centred on their mean
/// (the null hypothesis), at least as far from zero as the observed difference:
/// `p = (1 + #{|d_k - mean(d)| >= |d_obs|}) / (1 + K)`.
pub fn paired_bootstrap(
    baseline: &[Vec<SegmentStats>],
    system: &[Vec<SegmentStats>],
    resamples: usize,
    seed: u64,
) -> PairedBootstrap {
    let segments = baseline[0].len();
    let all: Vec<usize> = (0..segments).collect();
    let seed_mean_delta = |indices: &[usize]| {
        let deltas: f64 = baseline
            .iter()
            .zip(system)
            .map(|(b, s)| {
                bleu_from_stats(&sum_at(s, indices)) - bleu_from_stats(&sum_at(b, indices))
            })
            .sum();
        deltas / baseline.len() as f64
    };
    let observed = seed_mean_delta(&all);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut deltas: Vec<f64> = (0..resamples)
        .map(|_| {
            let indices: Vec<usize> = (0..segments).map(|_| rng.gen_range(0..segments)).collect();
            seed_mean_delta(&indices)
        })
        .collect();
    let mean = deltas.iter().sum::<f64>() / resamples as f64;
    let extreme = deltas
        .iter()
        .filter(|d| (*d - mean).abs() >= observed.abs())
        .count();
    deltas.sort_by(|a, b| a.total_cmp(b));
    let quantile =
        |q: f64| deltas[((q * (resamples - 1) as f64).round() as usize).min(resamples - 1)];
    PairedBootstrap {
        delta: observed,
        p_value: (1 + extreme) as f64 / (1 + resamples) as f64,
        ci_low: quantile(0.025),
        ci_high: quantile(0.975),
        resamples,
    }
}
