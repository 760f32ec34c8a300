//! chrF's F-score: sacrebleu's `_compute_f_score` on a corpus' summed statistics, and as its
//! bootstrap runs it on a NumPy `float32` vector.

use super::config::{ChrfConfig, ChrfCounts, ChrfScore};

/// sacrebleu's `_compute_f_score` on integer statistics (Python floats): `hyp`, `refs`,
/// `matches` per order, `β² = factor`.
pub(crate) fn f_score(
    hyp: &[u64],
    refs: &[u64],
    matches: &[u64],
    factor: f64,
    eps_smoothing: bool,
) -> f64 {
    const EPS: f64 = 1e-16;
    let mut score = 0.0f64;
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (0.0f64, 0.0f64);
    for ((&n_hyp, &n_ref), &n_match) in hyp.iter().zip(refs).zip(matches) {
        let prec = if n_hyp > 0 {
            n_match as f64 / n_hyp as f64
        } else {
            EPS
        };
        let rec = if n_ref > 0 {
            n_match as f64 / n_ref as f64
        } else {
            EPS
        };
        let denom = factor * prec + rec;
        score += if denom > 0.0 {
            (1.0 + factor) * prec * rec / denom
        } else {
            EPS
        };
        if n_hyp > 0 && n_ref > 0 {
            avg_prec += prec;
            avg_rec += rec;
            effective_order += 1;
        }
    }
    if eps_smoothing {
        return 100.0 * score / hyp.len() as f64;
    }
    if effective_order == 0 {
        return 0.0;
    }
    avg_prec /= effective_order as f64;
    avg_rec /= effective_order as f64;
    if avg_prec + avg_rec != 0.0 {
        let mut score = (1.0 + factor) * avg_prec * avg_rec;
        score /= (factor * avg_prec) + avg_rec;
        100.0 * score
    } else {
        0.0
    }
}

/// A number in sacrebleu's bootstrap arithmetic: a Python `float` (`f64`) or a NumPy
/// `float32`. Under NumPy 2's promotion rules a Python float meeting a `float32` is converted
/// to `float32` first, and the operation is done in `float32`.
#[derive(Debug, Clone, Copy)]
enum Num {
    Py(f64),
    F32(f32),
}

impl Num {
    fn op(self, other: Num, f: fn(f64, f64) -> f64, g: fn(f32, f32) -> f32) -> Num {
        match (self, other) {
            (Num::Py(a), Num::Py(b)) => Num::Py(f(a, b)),
            (Num::F32(a), Num::Py(b)) => Num::F32(g(a, b as f32)),
            (Num::Py(a), Num::F32(b)) => Num::F32(g(a as f32, b)),
            (Num::F32(a), Num::F32(b)) => Num::F32(g(a, b)),
        }
    }
    fn add(self, o: Num) -> Num {
        self.op(o, |a, b| a + b, |a, b| a + b)
    }
    fn mul(self, o: Num) -> Num {
        self.op(o, |a, b| a * b, |a, b| a * b)
    }
    fn div(self, o: Num) -> Num {
        self.op(o, |a, b| a / b, |a, b| a / b)
    }
    fn positive(self) -> bool {
        match self {
            Num::Py(a) => a > 0.0,
            Num::F32(a) => a > 0.0,
        }
    }
}

/// `_compute_f_score` as sacrebleu's bootstrap runs it: on a NumPy `float32` vector of summed
/// statistics (`flat`, `[hyp, ref, match]` per order, exact integers below 2^24), so that every
/// precision, recall and F-score is a `float32` under NumPy 2's promotion, except where only
/// Python floats meet (ε terms, and the `0.0` returned when nothing qualifies). Returns the
/// score and whether it is a `float32`.
pub(crate) fn f_score_f32(flat: &[u64], factor: f64, eps_smoothing: bool) -> (f64, bool) {
    const EPS: Num = Num::Py(1e-16);
    let factor_n = Num::Py(factor);
    let one_plus = Num::Py(1.0 + factor);
    let orders = flat.len() / 3;
    let mut score = Num::Py(0.0);
    let mut effective_order = 0usize;
    let (mut avg_prec, mut avg_rec) = (Num::Py(0.0), Num::Py(0.0));
    for stats in flat.chunks_exact(3) {
        let (n_hyp, n_ref, n_match) = (stats[0] as f32, stats[1] as f32, stats[2] as f32);
        let prec = if n_hyp > 0.0 {
            Num::F32(n_match / n_hyp)
        } else {
            EPS
        };
        let rec = if n_ref > 0.0 {
            Num::F32(n_match / n_ref)
        } else {
            EPS
        };
        let denom = factor_n.mul(prec).add(rec);
        score = score.add(if denom.positive() {
            one_plus.mul(prec).mul(rec).div(denom)
        } else {
            EPS
        });
        if n_hyp > 0.0 && n_ref > 0.0 {
            avg_prec = avg_prec.add(prec);
            avg_rec = avg_rec.add(rec);
            effective_order += 1;
        }
    }
    let done = |n: Num| match n {
        Num::Py(x) => (x, false),
        Num::F32(x) => (f64::from(x), true),
    };
    if eps_smoothing {
        return done(Num::Py(100.0).mul(score).div(Num::Py(orders as f64)));
    }
    if effective_order == 0 {
        return (0.0, false);
    }
    let eo = Num::Py(effective_order as f64);
    avg_prec = avg_prec.div(eo);
    avg_rec = avg_rec.div(eo);
    let nonzero = match avg_prec.add(avg_rec) {
        Num::Py(x) => x != 0.0,
        Num::F32(x) => x != 0.0,
    };
    if nonzero {
        let score = one_plus.mul(avg_prec).mul(avg_rec);
        let score = score.div(factor_n.mul(avg_prec).add(avg_rec));
        done(Num::Py(100.0).mul(score))
    } else {
        (0.0, false)
    }
}

/// Scores `counts` (validated) under `cfg` (validated).
pub(super) fn score_unchecked(counts: ChrfCounts, cfg: &ChrfConfig) -> ChrfScore {
    let score = f_score(
        &counts.hyp_ngrams,
        &counts.ref_ngrams,
        &counts.matches,
        cfg.beta * cfg.beta,
        cfg.eps_smoothing,
    );
    ChrfScore {
        score,
        counts,
        char_order: cfg.char_order,
        word_order: cfg.word_order,
        beta: cfg.beta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f_score_follows_sacrebleu_by_hand() {
        // One order, p = 3/4, r = 3/5, β = 2.
        let (p, r) = (0.75f64, 0.6f64);
        let want = 100.0 * ((5.0 * p * r) / (4.0 * p + r));
        assert_eq!(f_score(&[4], &[5], &[3], 4.0, false), want);
        // ε smoothing: the mean of per-order F-scores; an order with hyp = ref = 0 gives ε.
        let eps = f_score(&[4, 0], &[5, 0], &[3, 0], 4.0, true);
        assert_eq!(
            eps,
            100.0 * ((5.0 * p * r / (4.0 * p + r)) + 1e-16 * 5.0 * 1e-16 / 5e-16) / 2.0
        );
        // No qualifying order: 0.
        assert_eq!(f_score(&[0, 0], &[3, 2], &[0, 0], 4.0, false), 0.0);
    }
}
