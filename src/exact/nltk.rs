//! NLTK 3.10.4 semantics: `nltk.translate.bleu_score.corpus_bleu` with
//! `SmoothingFunction().method0..method7` (default `epsilon = 0.1`, `alpha = 5`, `k = 5`).
//!
//! NLTK keeps precisions as `Fraction`s and mixes them with floats as each smoothing method
//! does; [`PyNum`] reproduces Python's arithmetic on that mix (exact rationals while both sides
//! are fractions, `float(a) op float(b)` as soon as one side is a float), so methods 5–7 give
//! NLTK's bits rather than an approximation of them.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};

use super::config::{invalid, BleuCounts, BleuScore, MetricError};
use super::sacre::length_ratio;

/// NLTK's corpus statistics. More than [`BleuCounts`], because NLTK:
/// - floors each segment's denominator at 1 before summing (`max(1, t_n)` per segment), so
///   empty or short hypotheses change the corpus precision;
/// - hands the LAST segment's hypothesis to the smoothing function: methods 4 and 7 fall back
///   to its length when the corpus hypothesis length is 0, method 6 uses
///   `max(0, len(last hyp) - i)` as its `l`, and methods 5 and 7 append the last segment's
///   5-gram modified precision as `p_{N+1}`, whatever `N` is.
///
/// Build it with [`super::nltk_corpus_stats`], or segment by segment with
/// [`NltkStats::push_segment`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NltkStats {
    /// `Σ_seg m_n` (clipped matches), orders `1..=N`.
    pub numerators: Vec<u64>,
    /// `Σ_seg max(1, t_n)`, orders `1..=N`.
    pub denominators: Vec<u64>,
    /// `Σ_seg c`.
    pub hyp_len: u64,
    /// `Σ_seg` closest reference length (tie: shorter).
    pub ref_len: u64,
    /// Length of the last segment's hypothesis.
    pub last_hyp_len: u64,
    /// The last segment's 5-gram modified precision as NLTK's unreduced fraction
    /// `(m_5, max(1, t_5))`; needed by methods 5 and 7 only. `None` if unknown.
    pub last_fivegram: Option<(u64, u64)>,
}

impl NltkStats {
    /// Empty statistics for orders `1..=max_order`.
    pub fn new(max_order: usize) -> Self {
        Self {
            numerators: vec![0; max_order],
            denominators: vec![0; max_order],
            ..Self::default()
        }
    }

    /// Adds one segment's statistics (as counted by [`super::segment_stats`]) and records it as
    /// the last segment. `seg` may hold more orders than `self` (the extra ones are not
    /// summed); when it holds order 5, `last_fivegram` is set from it, otherwise to `None`
    /// (set it yourself if you score with method 5 or 7).
    pub fn push_segment(&mut self, seg: &BleuCounts) {
        for (n, (num, den)) in self
            .numerators
            .iter_mut()
            .zip(self.denominators.iter_mut())
            .enumerate()
        {
            *num += seg.matches.get(n).copied().unwrap_or(0);
            *den += seg.totals.get(n).copied().unwrap_or(0).max(1);
        }
        self.hyp_len += seg.hyp_len;
        self.ref_len += seg.ref_len;
        self.last_hyp_len = seg.hyp_len;
        self.last_fivegram = match (seg.matches.get(4), seg.totals.get(4)) {
            (Some(&m), Some(&t)) => Some((m, t.max(1))),
            _ => None,
        };
    }
}

/// A Python number as NLTK's smoothing produces it: an exact `Fraction` or a `float`.
#[derive(Debug, Clone)]
enum PyNum {
    Frac(BigRational),
    Float(f64),
}

impl PyNum {
    fn frac(numerator: u64, denominator: u64) -> Self {
        PyNum::Frac(BigRational::new(
            BigInt::from(numerator),
            BigInt::from(denominator),
        ))
    }

    /// `float(x)`: Python's int true division, correctly rounded.
    fn to_f64(&self) -> f64 {
        match self {
            PyNum::Frac(r) => r.to_f64().unwrap_or(f64::NAN),
            PyNum::Float(x) => *x,
        }
    }

    fn is_zero(&self) -> bool {
        match self {
            PyNum::Frac(r) => r.is_zero(),
            PyNum::Float(x) => *x == 0.0,
        }
    }

    fn is_positive(&self) -> bool {
        match self {
            PyNum::Frac(r) => r.is_positive(),
            PyNum::Float(x) => *x > 0.0,
        }
    }

    fn add(&self, other: &PyNum) -> PyNum {
        match (self, other) {
            (PyNum::Frac(a), PyNum::Frac(b)) => PyNum::Frac(a + b),
            _ => PyNum::Float(self.to_f64() + other.to_f64()),
        }
    }

    fn add_int(&self, k: i128) -> PyNum {
        match self {
            PyNum::Frac(a) => PyNum::Frac(a + BigInt::from(k)),
            PyNum::Float(x) => PyNum::Float(x + k as f64),
        }
    }

    fn mul_int(&self, k: i128) -> PyNum {
        match self {
            PyNum::Frac(a) => PyNum::Frac(a * BigInt::from(k)),
            PyNum::Float(x) => PyNum::Float(x * k as f64),
        }
    }

    /// `x / k` for `k != 0` (every caller divides by a positive constant or `l + α`).
    fn div_int(&self, k: i128) -> PyNum {
        match self {
            PyNum::Frac(a) => PyNum::Frac(a / BigInt::from(k)),
            PyNum::Float(x) => PyNum::Float(x / k as f64),
        }
    }

    fn div(&self, other: &PyNum) -> PyNum {
        match (self, other) {
            (PyNum::Frac(a), PyNum::Frac(b)) => PyNum::Frac(a / b),
            _ => PyNum::Float(self.to_f64() / other.to_f64()),
        }
    }

    /// `x ** 2`.
    fn square(&self) -> PyNum {
        match self {
            PyNum::Frac(a) => PyNum::Frac(a * a),
            PyNum::Float(x) => PyNum::Float(x.powi(2)),
        }
    }

    /// `int + x` for an int `k` on the left.
    fn int_plus(k: u64, x: &PyNum) -> PyNum {
        match x {
            PyNum::Frac(a) => PyNum::Frac(BigRational::from_integer(BigInt::from(k)) + a),
            PyNum::Float(v) => PyNum::Float(k as f64 + v),
        }
    }
}

/// NLTK's brevity penalty: `1` if `c > r`, `0` if `c == 0`, else `exp(1 - r/c)`.
fn brevity_penalty(hyp_len: u64, ref_len: u64) -> f64 {
    if hyp_len > ref_len {
        1.0
    } else if hyp_len == 0 {
        0.0
    } else {
        (1.0 - ref_len as f64 / hyp_len as f64).exp()
    }
}

/// Python's `math.fsum`: the correctly rounded sum of finite floats (Shewchuk's algorithm
/// with CPython's half-even correction across partials).
pub(crate) fn fsum(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut partials: Vec<f64> = Vec::new();
    for mut x in values {
        let mut i = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        partials.truncate(i);
        partials.push(x);
    }
    let mut n = partials.len();
    if n == 0 {
        return 0.0;
    }
    n -= 1;
    let mut hi = partials[n];
    let mut lo = 0.0;
    while n > 0 {
        let x = hi;
        n -= 1;
        let y = partials[n];
        hi = x + y;
        let yr = hi - x;
        lo = y - yr;
        if lo != 0.0 {
            break;
        }
    }
    if n > 0 && ((lo < 0.0 && partials[n - 1] < 0.0) || (lo > 0.0 && partials[n - 1] > 0.0)) {
        let y = lo * 2.0;
        let x = hi + y;
        let yr = x - hi;
        if y == yr {
            hi = x;
        }
    }
    hi
}

const EPSILON: f64 = 0.1;
const ALPHA: i128 = 5;
const K: f64 = 5.0;

/// Method 4 (Chen & Cherry): the k-th zero-numerator order gets `ln(L)/(2^k·5)/d`, where `L`
/// is the corpus hypothesis length (the last hypothesis' if that is 0); nothing when `L <= 1`.
///
/// NLTK computes `1 / (2**k * 5 / math.log(L))`: the Python int `2**k * 5` is exact, and is
/// converted to a float for the division, which raises `OverflowError` once it exceeds
/// `f64::MAX` (from the 1022nd zero-numerator order on). `5 · 2^k` is exact in `f64` up to
/// there, so this is NLTK's arithmetic, and the overflow is an error naming `cfg.max_order`.
fn method4(p: &mut [PyNum], raw: &[(u64, u64)], stats: &NltkStats) -> Result<(), MetricError> {
    let hyp_len = if stats.hyp_len != 0 {
        stats.hyp_len
    } else {
        stats.last_hyp_len
    };
    let mut incvnt: i32 = 1;
    for (p_i, &(m, d)) in p.iter_mut().zip(raw) {
        if m == 0 && hyp_len > 1 {
            let scaled = 2f64.powi(incvnt) * K;
            if !scaled.is_finite() {
                return Err(invalid(
                    "cfg.max_order",
                    format!(
                        "NLTK smoothing method4 overflows at the {incvnt}th order without a \
                         match (2**{incvnt} * 5 is too large for a float; NLTK raises \
                         OverflowError): use fewer than {} orders",
                        raw.len()
                    ),
                ));
            }
            let numerator = 1.0 / (scaled / (hyp_len as f64).ln());
            *p_i = PyNum::Float(numerator / d as f64);
            incvnt += 1;
        }
    }
    Ok(())
}

/// Method 5: `p'_i = (p'_{i-1} + p_i + p_{i+1}) / 3` with `p'_{-1} = p_0 + 1` and `p_{N}` the
/// last segment's 5-gram precision.
fn method5(p: &mut [PyNum], stats: &NltkStats) -> Result<(), MetricError> {
    let (m5, d5) = stats.last_fivegram.ok_or_else(|| {
        invalid(
            "stats.last_fivegram",
            "NLTK methods 5 and 7 need the last segment's 5-gram precision; it is None",
        )
    })?;
    if d5 == 0 {
        return Err(invalid(
            "stats.last_fivegram",
            format!("the denominator max(1, t_5) must be >= 1, got ({m5}, 0)"),
        ));
    }
    let mut plus1: Vec<PyNum> = p.to_vec();
    plus1.push(PyNum::frac(m5, d5));
    let mut prev = p[0].add_int(1);
    for i in 0..p.len() {
        let smoothed = prev.add(&p[i]).add(&plus1[i + 1]).div_int(3);
        p[i] = smoothed.clone();
        prev = smoothed;
    }
    Ok(())
}

/// Method 6: for orders `i >= 2` (0-based), `p'_i = (m_i + α·π0) / (l + α)` with
/// `π0 = p'_{i-1}² / p'_{i-2}` (0 if `p'_{i-2} == 0`), `m_i` the corpus numerator and
/// `l = max(0, len(last hyp) - i)`.
fn method6(p: &mut [PyNum], raw: &[(u64, u64)], stats: &NltkStats) -> Result<(), MetricError> {
    if p.len() < 3 {
        return Err(invalid(
            "cfg.max_order",
            format!(
                "NLTK smoothing method6 needs max_order >= 3 (it reads the trigram precision; \
                 NLTK raises IndexError), got {}",
                p.len()
            ),
        ));
    }
    if p[2].is_zero() {
        return Err(invalid(
            "cfg.smoothing",
            "NLTK smoothing method6 needs a non-zero trigram precision (NLTK raises \
             AssertionError); this corpus has no trigram match",
        ));
    }
    for i in 2..p.len() {
        let pi0 = if p[i - 2].is_zero() {
            None
        } else {
            Some(p[i - 1].square().div(&p[i - 2]))
        };
        let m = raw[i].0;
        let l = i128::from(stats.last_hyp_len.saturating_sub(i as u64));
        p[i] = match pi0 {
            Some(pi0) => PyNum::int_plus(m, &pi0.mul_int(ALPHA)).div_int(l + ALPHA),
            // `(m + 0) / (l + α)`: int / int in Python, a float.
            None => PyNum::Float(m as f64 / (l + ALPHA) as f64),
        };
    }
    Ok(())
}

/// Scores NLTK statistics with `SmoothingFunction().method{method}` and `weights`
/// (`weights.len() == stats.numerators.len()`, validated by the caller).
pub(crate) fn score(
    stats: &NltkStats,
    weights: &[f64],
    method: u8,
) -> Result<BleuScore, MetricError> {
    if let Some(n) = stats.denominators.iter().position(|&d| d == 0) {
        return Err(invalid(
            "stats.denominators",
            format!(
                "must be >= 1 (each segment adds max(1, t_n)), got 0 at order {}: statistics \
                 of no segment (NLTK raises ZeroDivisionError on an empty corpus)",
                n + 1
            ),
        ));
    }
    let raw: Vec<(u64, u64)> = stats
        .numerators
        .iter()
        .zip(&stats.denominators)
        .map(|(&m, &d)| (m, d))
        .collect();
    let mut p: Vec<PyNum> = raw.iter().map(|&(m, d)| PyNum::frac(m, d.max(1))).collect();
    let bp = brevity_penalty(stats.hyp_len, stats.ref_len);
    let mut result = BleuScore {
        bleu: 0.0,
        score: 0.0,
        precisions: p.iter().map(PyNum::to_f64).collect(),
        precisions_pct: Vec::new(),
        bp,
        ratio: length_ratio(stats.hyp_len, stats.ref_len),
        hyp_len: stats.hyp_len,
        ref_len: stats.ref_len,
        counts: stats.numerators.iter().map(|&m| m as f64).collect(),
        totals: stats.denominators.iter().map(|&d| d as f64).collect(),
        effective_order: raw.len(),
    };
    // NLTK returns the int 0 when there is no unigram match, before any smoothing (so before
    // method6 can raise).
    if raw.first().is_none_or(|&(m, _)| m == 0) {
        result.precisions_pct = result.precisions.iter().map(|p| 100.0 * p).collect();
        return Ok(result);
    }
    match method {
        0 => {
            for (p_i, &(m, _)) in p.iter_mut().zip(&raw) {
                if m == 0 {
                    *p_i = PyNum::Float(f64::MIN_POSITIVE);
                }
            }
        }
        1 => {
            for (p_i, &(m, d)) in p.iter_mut().zip(&raw) {
                if m == 0 {
                    *p_i = PyNum::Float((m as f64 + EPSILON) / d as f64);
                }
            }
        }
        2 => {
            for (p_i, &(m, d)) in p.iter_mut().zip(&raw).skip(1) {
                // `(m + 1) / (d + 1)` as Python ints: no overflow at u64::MAX.
                *p_i = PyNum::Frac(BigRational::new(BigInt::from(m) + 1, BigInt::from(d) + 1));
            }
        }
        3 => {
            let mut incvnt: u32 = 1;
            for (p_i, &(m, d)) in p.iter_mut().zip(&raw) {
                if m == 0 {
                    // `1 / (2**k * d)`: int / int, correctly rounded.
                    let denominator = BigInt::from(2u32).pow(incvnt) * BigInt::from(d);
                    *p_i = PyNum::Float(
                        BigRational::new(BigInt::from(1), denominator)
                            .to_f64()
                            .unwrap_or(0.0),
                    );
                    incvnt += 1;
                }
            }
        }
        4 => method4(&mut p, &raw, stats)?,
        5 => method5(&mut p, stats)?,
        6 => method6(&mut p, &raw, stats)?,
        7 => {
            method4(&mut p, &raw, stats)?;
            method5(&mut p, stats)?;
        }
        _ => {
            return Err(invalid(
                "cfg.smoothing",
                format!("NLTK smoothing method must be 0..=7, got {method}"),
            ))
        }
    }
    let log_sum = fsum(
        weights
            .iter()
            .zip(&p)
            .filter(|(_, p_i)| p_i.is_positive())
            .map(|(w, p_i)| w * p_i.to_f64().ln()),
    );
    let bleu = bp * log_sum.exp();
    result.bleu = bleu;
    result.score = 100.0 * bleu;
    result.precisions = p.iter().map(PyNum::to_f64).collect();
    result.precisions_pct = result.precisions.iter().map(|p| 100.0 * p).collect();
    result.effective_order = p.iter().filter(|p_i| p_i.is_positive()).count();
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::fsum;

    #[test]
    fn fsum_is_correctly_rounded() {
        assert_eq!(fsum([0.1; 10]), 1.0);
        assert_eq!(
            fsum([1e100, 1.0, -1e100, 1e-100, 1e50, -1.0, -1e50]),
            1e-100
        );
        assert_eq!(fsum([]), 0.0);
        // Half-even across partials (CPython's test_fsum).
        assert_eq!(
            fsum([1.0, 2f64.powi(-53), 2f64.powi(-106)]),
            1.0 + 2f64.powi(-52)
        );
    }
}
