//! sacrebleu 2.6.0 semantics: `BLEU.compute_bleu` on summed statistics, operation for operation
//! (same float operations in the same order, so uniform weights give sacrebleu's bits).

use super::config::{BleuCounts, BleuScore, SmoothMethod};

/// sacrebleu's `my_log`: `ln(x)`, and `-9999999999` for `x == 0` (which makes the score 0).
/// Shared with the bootstrap's `float32` scoring (`bootstrap::score_f32`).
pub(crate) fn my_log(x: f64) -> f64 {
    if x == 0.0 {
        -9_999_999_999.0
    } else {
        x.ln()
    }
}

/// sacrebleu's brevity penalty: `1` if `c >= r`, `0` if `c == 0 < r`, else `exp(1 - r/c)`.
pub(crate) fn brevity_penalty(hyp_len: u64, ref_len: u64) -> f64 {
    if hyp_len < ref_len {
        if hyp_len > 0 {
            (1.0 - ref_len as f64 / hyp_len as f64).exp()
        } else {
            0.0
        }
    } else {
        1.0
    }
}

/// `sys_len / ref_len`, 0 when `ref_len == 0` (sacrebleu `BLEUScore.ratio`).
pub(crate) fn length_ratio(hyp_len: u64, ref_len: u64) -> f64 {
    if ref_len == 0 {
        0.0
    } else {
        hyp_len as f64 / ref_len as f64
    }
}

/// Scores summed statistics as sacrebleu's `compute_bleu`. `stats` has `max_order` orders,
/// `smoothing` is not `Nltk`, arguments are validated by the caller.
pub(crate) fn score(
    stats: &BleuCounts,
    weights: Option<&[f64]>,
    smoothing: SmoothMethod,
    effective_order: bool,
) -> BleuScore {
    let max_order = stats.matches.len();
    let (sys_len, ref_len) = (stats.hyp_len, stats.ref_len);
    let bp = brevity_penalty(sys_len, ref_len);
    // `counts`/`totals` as sacrebleu reports them: add-k mutates its lists in place.
    let mut counts: Vec<f64> = stats.matches.iter().map(|&m| m as f64).collect();
    let mut totals: Vec<f64> = stats.totals.iter().map(|&t| t as f64).collect();
    let mut precisions_pct = vec![0.0; max_order];
    let mut precisions = vec![0.0; max_order];
    let mut result = BleuScore {
        bleu: 0.0,
        score: 0.0,
        precisions: Vec::new(),
        precisions_pct: Vec::new(),
        bp,
        ratio: length_ratio(sys_len, ref_len),
        hyp_len: sys_len,
        ref_len,
        counts: Vec::new(),
        totals: Vec::new(),
        effective_order: max_order,
    };

    // Early stop if there are no matches at all (sacrebleu #141): 0 whatever the smoothing.
    if stats.matches.iter().all(|&m| m == 0) {
        result.precisions = precisions;
        result.precisions_pct = precisions_pct;
        result.counts = counts;
        result.totals = totals;
        return result;
    }

    let mut smooth_mteval = 1.0f64;
    let mut eff_order = max_order;
    for n in 1..=max_order {
        let i = n - 1;
        if let SmoothMethod::AddK(k) = smoothing {
            if n > 1 {
                counts[i] += k;
                totals[i] += k;
            }
        }
        // Orders with no n-gram end the loop: later precisions stay 0.
        if totals[i] == 0.0 {
            break;
        }
        if effective_order {
            eff_order = n;
        }
        if counts[i] == 0.0 {
            match smoothing {
                SmoothMethod::Exp => {
                    smooth_mteval *= 2.0;
                    precisions_pct[i] = 100.0 / (smooth_mteval * totals[i]);
                    precisions[i] = 1.0 / (smooth_mteval * totals[i]);
                }
                SmoothMethod::Floor(v) => {
                    precisions_pct[i] = 100.0 * v / totals[i];
                    precisions[i] = v / totals[i];
                }
                _ => {}
            }
        } else {
            precisions_pct[i] = 100.0 * counts[i] / totals[i];
            precisions[i] = counts[i] / totals[i];
        }
    }

    let log_mean = match weights {
        // sacrebleu: the plain mean of the logs over the first `eff_order` orders.
        None => {
            precisions_pct[..eff_order]
                .iter()
                .fold(0.0, |acc, &p| acc + my_log(p))
                / eff_order as f64
        }
        // Extension: the weighted mean, renormalised over the orders that enter.
        Some(w) => {
            let weight_sum: f64 = w[..eff_order].iter().sum();
            if weight_sum == 0.0 {
                0.0
            } else {
                w[..eff_order]
                    .iter()
                    .zip(&precisions_pct[..eff_order])
                    .fold(0.0, |acc, (&w, &p)| acc + w * my_log(p))
                    / weight_sum
            }
        }
    };
    let score = bp * log_mean.exp();
    result.score = score;
    result.bleu = score / 100.0;
    result.precisions = precisions;
    result.precisions_pct = precisions_pct;
    result.counts = counts;
    result.totals = totals;
    result.effective_order = eff_order;
    result
}
