//! Bootstrap confidence intervals and paired significance tests over per-segment statistics of
//! BLEU, chrF or TER, as sacrebleu 2.6.0 computes them (`sacrebleu/significance.py`,
//! `metrics/base.py`), **with sacrebleu's random numbers**.
//!
//! sacrebleu draws its resamples with NumPy: `np.random.default_rng(seed)` (seed 12345 unless
//! `SACREBLEU_SEED` says otherwise), i.e. a PCG64 generator seeded through NumPy's
//! `SeedSequence`. This module reimplements both (and `Generator.choice` /
//! `Generator.integers(2, dtype=bool)` on top) bit for bit, so the resamples, and with them the
//! means, intervals and p-values, are sacrebleu's own.
//!
//! Every function takes the metric's configuration (a [`Metric`]): a [`BleuConfig`] with
//! [`BleuCounts`] per segment (from [`corpus_stats`](super::corpus_stats)), or a
//! [`ChrfConfig`] with [`ChrfCounts`] (from
//! [`corpus_chrf_stats`](super::chrf::corpus_chrf_stats)), or a [`TerConfig`] with [`TerStats`]
//! (from [`corpus_ter_stats`](super::ter::corpus_ter_stats)).
//!
//! # Definitions
//! Statistics `s_1..s_S` (one per segment), `B` resamples, seed `σ`, `M` the metric:
//! - resample `b` draws `S` segment indices `i_{b,1..S}` uniformly with replacement
//!   (`rng.choice(S, size=(B, S))`, row `b`) and scores `x_b = M(Σ_j s_{i_{b,j}})`;
//! - **confidence** ([`bootstrap_confidence`], `sacrebleu -ci`): sort `x`, `k = ⌊B/40⌋`,
//!   `lower = x_(k)`, `upper = x_(B-k-1)` (0-based order statistics), `ci = (upper - lower)/2`,
//!   `mean = (Σ x_b)/B`. Reported as `μ = mean ± ci`: a 95% percentile interval's half-width
//!   around the bootstrap mean, not `mean ± 1.96·sd`;
//! - **paired bootstrap** ([`paired_bootstrap`], `sacrebleu -pbs`; Koehn 2004 as in Moses'
//!   `bootstrap-hypothesis-difference-significance.pl`): baseline and system are resampled
//!   with the SAME indices; `d_b = |y_b - x_b|`, `δ = |M(system) - M(baseline)|` on the full
//!   corpus, `c = #{b : d_b - mean(d) > δ}`, `p = (c + 1)/(B + 1)`. The system's and baseline's
//!   mean and `ci` are computed as above;
//! - **approximate randomization** ([`paired_approximate_randomization`], `sacrebleu -par`):
//!   trial `t` swaps each segment's statistics between the two systems with probability 1/2
//!   (`rng.integers(2, size=(T, S), dtype=bool)`), `d_t = |M(A_t) - M(B_t)|`,
//!   `c = #{t : d_t > δ}`, `p = (c + 1)/(T + 1)`.
//!
//! # Arithmetic, as sacrebleu's
//! - Bootstrap resamples are summed from a `float32` copy of the statistics and scored with
//!   NumPy 2's promotion rules (a Python float meeting a `float32` becomes a `float32`).
//!   - BLEU: every precision `100·m/t` (and `exp`'s `100/(2^k·t)`, `floor`'s `100·v/t`, add-k's
//!     `m + k`) is rounded to `f32`; the logarithms, mean, exponential and brevity penalty are
//!     `f64`, and the score is a Python float. NumPy 1.x promoted those products to
//!     `float64`; its last digits can differ.
//!   - chrF: every precision, recall, average and F-score is `f32` arithmetic, and so is the
//!     score (a NumPy `float32`); so are then the means, the `ci` and the paired differences
//!     (`float32` arrays), and the observed difference is rounded to `f32` before the paired
//!     bootstrap compares against it. A resample whose score sacrebleu returns as a Python
//!     `0.0` (no order with both hypothesis and reference n-grams) makes its array `float64`,
//!     as NumPy does (sacrebleu's `-ci` then raises `TypeError`; this module averages in
//!     `f64`).
//!   - TER: each resample adds the edits and the `float32`-rounded mean reference lengths in
//!     `float32`, in resample order (NumPy's `sum(0)` over a `float32` matrix), and scores
//!     `100 * (edits / ref_len)` in `float32` (a Python `100.0` or `0.0` when the resampled
//!     reference length is 0, which makes the array `float64` as for chrF).
//! - AR trials are scored in `f64` (NumPy `int64` matrix products); BLEU's add-k on them
//!   truncates `m + k` to an integer (sacrebleu assigns the float into an `int64` array).
//! - `-ci` means are `statistics.mean` (exact, correctly rounded; for chrF then rounded to
//!   `f32`); the paired tests use `numpy.mean` (pairwise summation), both reproduced.
//! - The only deliberate difference: resample sums are exact integers, while NumPy sums
//!   `float32` values, which stops being exact once a summed count exceeds 2^24 (a corpus of
//!   more than ~16.7 million tokens, or characters for chrF). TER's AR trials add `f64`
//!   statistics in segment order, where sacrebleu's `float64` matrix product adds them in BLAS's
//!   order: equal when the sums are whole numbers (the edits; the reference lengths with one
//!   reference per segment), else possibly not in the last bit.
//!
//! For BLEU, only sacrebleu's smoothings (`None`, `Floor`, `AddK`, `Exp`) are supported; custom
//! weights are scored with [`score_from_stats`] in `f64` (sacrebleu has no weights).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::ToPrimitive;

use super::bleu::score_from_stats;
use super::chrf::config::{ChrfConfig, ChrfCounts};
use super::chrf::score::{f_score, f_score_f32};
use super::config::{invalid, BleuConfig, BleuCounts, MetricError, SmoothMethod};
use super::numpy_rng::{NumpyBools, NumpyPcg64};
use super::sacre::{brevity_penalty, my_log};
use super::ter::{score_ter_stats, TerConfig, TerStats};

/// sacrebleu's default seed (`SACREBLEU_SEED` unset).
pub const SACREBLEU_SEED: u64 = 12345;

/// The settings of a resampling test: how many resamples (or trials) to draw, and the seed
/// they are drawn from. Every function of this module takes one.
///
/// [`BootstrapConfig::default()`] is sacrebleu's: 1000 samples (`-cin`, `-pbsn`) and seed
/// [`SACREBLEU_SEED`]. sacrebleu's approximate randomization runs 10000 trials by default
/// (`-parn`): `BootstrapConfig { n_samples: 10000, ..Default::default() }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BootstrapConfig {
    /// How many samples to draw, at least 1: the bootstrap resamples `B` of
    /// [`resample_scores`], [`bootstrap_confidence`] and the paired bootstrap, or the trials
    /// `T` of [`paired_approximate_randomization`] (`-cin`, `-pbsn`, `-parn`).
    pub n_samples: usize,
    /// The seed of NumPy's `default_rng`: sacrebleu's `SACREBLEU_SEED`.
    pub seed: u64,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        Self {
            n_samples: 1000,
            seed: SACREBLEU_SEED,
        }
    }
}

impl BootstrapConfig {
    /// Checks the settings: `n_samples >= 1`. The error names the field and its value.
    pub fn validate(&self) -> Result<(), MetricError> {
        if self.n_samples == 0 {
            return Err(invalid(
                "bootstrap.n_samples",
                "must be >= 1 (samples or trials to draw), got 0",
            ));
        }
        Ok(())
    }
}

/// A metric whose statistics [`bootstrap_confidence`], [`paired_bootstrap_many`] and
/// [`paired_approximate_randomization`] resample: its corpus score is a function of the sum of
/// per-segment statistics. Implemented (and only implementable) by
/// - [`BleuConfig`] with a sacrebleu smoothing (`None`, `Floor`, `AddK`, `Exp`), statistics
///   [`BleuCounts`] (from [`corpus_stats`](super::corpus_stats));
/// - [`ChrfConfig`], statistics [`ChrfCounts`] (from
///   [`corpus_chrf_stats`](super::chrf::corpus_chrf_stats));
/// - [`TerConfig`], statistics [`TerStats`] (from
///   [`corpus_ter_stats`](super::ter::corpus_ter_stats)).
///
/// Each reproduces sacrebleu's arithmetic on a resample (see the module docs).
pub trait Metric: sealed::Resample<Self::Counts> {
    /// One segment's statistics.
    type Counts;
}

/// The resampling side of a [`Metric`], out of the API: the trait is public (a supertrait of
/// `Metric` must be) but lives in a private module, so no other crate can name or implement it.
mod sealed {
    use crate::exact::config::MetricError;

    /// What the resampling functions need of a metric whose segments' statistics are `C`.
    pub trait Resample<C> {
        /// Checks the configuration for resampling.
        fn check_resample(&self) -> Result<(), MetricError>;
        /// Length of the flat statistics of a segment.
        fn width(&self) -> usize;
        /// Appends `counts` in sacrebleu's flat layout; `false` (nothing appended) if it does
        /// not hold this metric's orders.
        fn flatten(&self, counts: &C, out: &mut Vec<u64>) -> bool;
        /// What `flatten` expects, for error messages.
        fn orders_text(&self) -> String;
        /// The full-precision score (0..=100) of summed flat statistics.
        fn score_flat(&self, sum: &[u64]) -> f64;
        /// The score of a bootstrap resample as sacrebleu computes it (from a `float32`
        /// vector), and whether sacrebleu holds it as a NumPy `float32` (else a Python
        /// `float`).
        fn resample_flat(&self, sum: &[u64]) -> (f64, bool);
        /// The score of an approximate-randomization trial as sacrebleu computes it (`int64`
        /// statistics).
        fn trial_flat(&self, sum: &[u64]) -> f64;

        /// Whether one segment's flat statistics are too large for sums over `limit`
        /// segments' worth: by default, a count above `limit`.
        fn overflows(&self, segment: &[u64], limit: u64) -> bool {
            segment.iter().any(|&c| c > limit)
        }

        /// The full-precision score of a system from its flat per-segment statistics: by
        /// default, `score_flat` of their (exact, integer) sum.
        fn score_segments(&self, flat: &[u64]) -> f64 {
            self.score_flat(&super::flat_sum(flat, self.width()))
        }

        /// The score of the bootstrap resample that draws the segments `row` of `flat`, as
        /// sacrebleu computes it: by default, `resample_flat` of their integer sum (`sum` is
        /// a buffer of `width` counts).
        fn resample_row(&self, flat: &[u64], row: &[u32], sum: &mut [u64]) -> (f64, bool) {
            let width = self.width();
            sum.fill(0);
            for &i in row {
                let segment = &flat[i as usize * width..(i as usize + 1) * width];
                for (a, b) in sum.iter_mut().zip(segment) {
                    *a += b;
                }
            }
            self.resample_flat(sum)
        }

        /// Whether the flat statistics are floating point (TER's mean reference lengths, kept
        /// as `f64` bits), which only the metric can add: then approximate randomization calls
        /// `trial_pair` for every trial; integer statistics take a faster path that computes
        /// the same sums.
        fn float_stats(&self) -> bool {
            false
        }

        /// The scores of the two pseudo-systems of an approximate-randomization trial:
        /// segment `i` of the first is the baseline's where `swap[i]`, else the system's, and
        /// the other way round for the second. By default, `trial_flat` of their integer sums.
        fn trial_pair(&self, baseline: &[u64], system: &[u64], swap: &[bool]) -> (f64, f64) {
            let width = self.width();
            let (mut a, mut b) = (vec![0u64; width], vec![0u64; width]);
            let rows = baseline.chunks_exact(width).zip(system.chunks_exact(width));
            for ((bl, sys), &s) in rows.zip(swap) {
                let (to_a, to_b) = if s { (bl, sys) } else { (sys, bl) };
                for ((x, y), (p, q)) in a.iter_mut().zip(&mut b).zip(to_a.iter().zip(to_b)) {
                    *x += p;
                    *y += q;
                }
            }
            (self.trial_flat(&a), self.trial_flat(&b))
        }
    }
}

/// `BleuCounts` from sacrebleu's flat layout `[c, r, m_1..m_N, t_1..t_N]`.
fn bleu_from_flat(flat: &[u64]) -> BleuCounts {
    let k = (flat.len() - 2) / 2;
    BleuCounts {
        hyp_len: flat[0],
        ref_len: flat[1],
        matches: flat[2..2 + k].to_vec(),
        totals: flat[2 + k..].to_vec(),
    }
}

impl Metric for BleuConfig {
    type Counts = BleuCounts;
}

impl sealed::Resample<BleuCounts> for BleuConfig {
    fn check_resample(&self) -> Result<(), MetricError> {
        self.validate()?;
        if let SmoothMethod::Nltk(_) = self.smoothing {
            return Err(invalid(
                "cfg.smoothing",
                "bootstrap resampling follows sacrebleu: use SmoothMethod::None, Floor, AddK or Exp",
            ));
        }
        Ok(())
    }

    fn width(&self) -> usize {
        2 + 2 * self.max_order
    }

    fn flatten(&self, counts: &BleuCounts, out: &mut Vec<u64>) -> bool {
        if counts.matches.len() != self.max_order || counts.totals.len() != self.max_order {
            return false;
        }
        out.push(counts.hyp_len);
        out.push(counts.ref_len);
        out.extend_from_slice(&counts.matches);
        out.extend_from_slice(&counts.totals);
        true
    }

    fn orders_text(&self) -> String {
        format!("cfg.max_order = {} orders", self.max_order)
    }

    fn score_flat(&self, sum: &[u64]) -> f64 {
        score_from_stats(&bleu_from_flat(sum), self).map_or(0.0, |s| s.score)
    }

    fn resample_flat(&self, sum: &[u64]) -> (f64, bool) {
        (score_f32(&bleu_from_flat(sum), self), false)
    }

    fn trial_flat(&self, sum: &[u64]) -> f64 {
        score_ar(&bleu_from_flat(sum), self)
    }
}

impl Metric for ChrfConfig {
    type Counts = ChrfCounts;
}

impl sealed::Resample<ChrfCounts> for ChrfConfig {
    fn check_resample(&self) -> Result<(), MetricError> {
        self.validate()
    }

    fn width(&self) -> usize {
        3 * self.orders()
    }

    fn flatten(&self, counts: &ChrfCounts, out: &mut Vec<u64>) -> bool {
        if !counts.has_orders(self.orders()) {
            return false;
        }
        out.extend(counts.to_sacrebleu_vec());
        true
    }

    fn orders_text(&self) -> String {
        format!("cfg.char_order + cfg.word_order = {} orders", self.orders())
    }

    fn score_flat(&self, sum: &[u64]) -> f64 {
        chrf_flat(sum, self)
    }

    fn resample_flat(&self, sum: &[u64]) -> (f64, bool) {
        f_score_f32(sum, self.beta * self.beta, self.eps_smoothing)
    }

    fn trial_flat(&self, sum: &[u64]) -> f64 {
        chrf_flat(sum, self)
    }
}

impl Metric for TerConfig {
    type Counts = TerStats;
}

/// TER's flat layout: `[edits, ref_len.to_bits()]` per segment (the mean reference length is
/// not an integer with several references, so it is kept as its `f64` bits and every sum is
/// taken here, in floating point, in sacrebleu's order).
impl sealed::Resample<TerStats> for TerConfig {
    fn check_resample(&self) -> Result<(), MetricError> {
        Ok(())
    }

    fn width(&self) -> usize {
        2
    }

    fn flatten(&self, stats: &TerStats, out: &mut Vec<u64>) -> bool {
        if stats.validate("stats").is_err() {
            return false;
        }
        out.push(stats.edits as u64);
        out.push(stats.ref_len.to_bits());
        true
    }

    fn orders_text(&self) -> String {
        "TER statistics (edits a finite whole number >= 0, ref_len finite and >= 0)".into()
    }

    fn score_flat(&self, sum: &[u64]) -> f64 {
        ter_score(sum[0] as f64, f64::from_bits(sum[1]))
    }

    fn resample_flat(&self, sum: &[u64]) -> (f64, bool) {
        ter_score_f32(sum[0] as f32, f64::from_bits(sum[1]) as f32)
    }

    fn trial_flat(&self, sum: &[u64]) -> f64 {
        self.score_flat(sum)
    }

    fn overflows(&self, segment: &[u64], limit: u64) -> bool {
        segment[0] > limit
    }

    fn float_stats(&self) -> bool {
        true
    }

    /// sacrebleu's `sum_of_lists`: Python floats added in segment order.
    fn score_segments(&self, flat: &[u64]) -> f64 {
        let (edits, ref_len) = flat.chunks_exact(2).fold((0.0f64, 0.0f64), |(e, r), s| {
            (e + s[0] as f64, r + f64::from_bits(s[1]))
        });
        ter_score(edits, ref_len)
    }

    /// NumPy's `_s.sum(0)` of a `float32` resample: sequential `float32` additions.
    fn resample_row(&self, flat: &[u64], row: &[u32], _sum: &mut [u64]) -> (f64, bool) {
        let (mut edits, mut ref_len) = (0.0f32, 0.0f32);
        for &i in row {
            let s = &flat[2 * i as usize..2 * i as usize + 2];
            edits += s[0] as f32;
            ref_len += f64::from_bits(s[1]) as f32;
        }
        ter_score_f32(edits, ref_len)
    }

    /// sacrebleu adds the pseudo-systems' statistics with a `float64` matrix product (BLAS,
    /// whose order of additions is its own); here in segment order. Edits (and reference
    /// lengths with one reference per segment) are whole numbers, summed exactly either way.
    fn trial_pair(&self, baseline: &[u64], system: &[u64], swap: &[bool]) -> (f64, f64) {
        let (mut a, mut b) = ((0.0f64, 0.0f64), (0.0f64, 0.0f64));
        let rows = baseline.chunks_exact(2).zip(system.chunks_exact(2));
        for ((bl, sys), &s) in rows.zip(swap) {
            let (to_a, to_b) = if s { (bl, sys) } else { (sys, bl) };
            a = (a.0 + to_a[0] as f64, a.1 + f64::from_bits(to_a[1]));
            b = (b.0 + to_b[0] as f64, b.1 + f64::from_bits(to_b[1]));
        }
        (ter_score(a.0, a.1), ter_score(b.0, b.1))
    }
}

/// sacrebleu's `TER._compute_score_from_stats` in Python floats.
fn ter_score(edits: f64, ref_len: f64) -> f64 {
    score_ter_stats(&TerStats { edits, ref_len }).map_or(0.0, |s| s.score)
}

/// `TER._compute_score_from_stats` on a `float32` resample: `float32` division and `100 *`,
/// unless the reference length is 0 (then the Python floats 100.0 or 0.0).
fn ter_score_f32(edits: f32, ref_len: f32) -> (f64, bool) {
    if ref_len > 0.0 {
        (f64::from(100f32 * (edits / ref_len)), true)
    } else if edits > 0.0 {
        (100.0, false)
    } else {
        (0.0, false)
    }
}

/// chrF of flat statistics `[hyp, ref, match]` per order, in `f64` (Python's and NumPy
/// `int64`'s arithmetic alike).
fn chrf_flat(sum: &[u64], cfg: &ChrfConfig) -> f64 {
    let pick = |k: usize| -> Vec<u64> { sum.iter().skip(k).step_by(3).copied().collect() };
    f_score(
        &pick(0),
        &pick(1),
        &pick(2),
        cfg.beta * cfg.beta,
        cfg.eps_smoothing,
    )
}

/// The score of one bootstrap resample as sacrebleu computes BLEU: `compute_bleu` on a
/// `float32` NumPy vector under NumPy 2 promotion (see the module docs). `cfg` is validated,
/// its smoothing is a sacrebleu one and `stats` has `cfg.max_order` orders.
fn score_f32(stats: &BleuCounts, cfg: &BleuConfig) -> f64 {
    if cfg.weights.is_some() {
        return score_from_stats(stats, cfg).map_or(0.0, |s| s.score);
    }
    let n_max = cfg.max_order;
    let bp = brevity_penalty(stats.hyp_len, stats.ref_len);
    if stats.matches.iter().all(|&m| m == 0) {
        return 0.0;
    }
    let mut prec = [0f32; 16];
    let mut prec_vec;
    let precisions: &mut [f32] = if n_max <= 16 {
        &mut prec[..n_max]
    } else {
        prec_vec = vec![0f32; n_max];
        &mut prec_vec
    };
    let mut smooth_mteval = 1.0f64;
    let mut eff_order = n_max;
    for n in 1..=n_max {
        let mut correct = stats.matches[n - 1] as f32;
        let mut total = stats.totals[n - 1] as f32;
        if let SmoothMethod::AddK(k) = cfg.smoothing {
            if n > 1 {
                correct += k as f32;
                total += k as f32;
            }
        }
        if total == 0.0 {
            break;
        }
        if cfg.effective_order {
            eff_order = n;
        }
        precisions[n - 1] = if correct == 0.0 {
            match cfg.smoothing {
                SmoothMethod::Exp => {
                    smooth_mteval *= 2.0;
                    100f32 / (smooth_mteval as f32 * total)
                }
                SmoothMethod::Floor(v) => (100.0 * v) as f32 / total,
                _ => 0.0,
            }
        } else {
            100f32 * correct / total
        };
    }
    let log_sum = precisions[..eff_order]
        .iter()
        .fold(0.0f64, |acc, &p| acc + my_log(p as f64));
    bp * (log_sum / eff_order as f64).exp()
}

/// Checks the arguments shared by every test and flattens every system's statistics
/// (`segments × width`, sacrebleu's layout).
fn check<M: Metric>(
    cfg: &M,
    bootstrap: &BootstrapConfig,
    systems: &[&[M::Counts]],
) -> Result<Vec<Vec<u64>>, MetricError> {
    cfg.check_resample()?;
    bootstrap.validate()?;
    let n = systems.first().map_or(0, |s| s.len());
    if n == 0 {
        return Err(invalid("stats", "no segment to resample"));
    }
    if n as u64 > 1 << 32 {
        return Err(invalid("stats", format!("at most 2^32 segments, got {n}")));
    }
    // A resample sums `n` segments, and approximate randomization adds two systems in `i64`:
    // every count times `2n` must fit an `i64`.
    let limit = (i64::MAX as u64) / (2 * n as u64);
    let width = cfg.width();
    let mut flat_systems = Vec::with_capacity(systems.len());
    for (k, s) in systems.iter().enumerate() {
        if s.len() != n {
            return Err(invalid(
                "stats",
                format!(
                    "the systems must have the same number of segments: {n} and {} (system {k})",
                    s.len()
                ),
            ));
        }
        let mut flat = Vec::with_capacity(n * width);
        for (i, segment) in s.iter().enumerate() {
            if !cfg.flatten(segment, &mut flat) {
                return Err(invalid(
                    "stats",
                    format!(
                        "segment {i} of system {k} does not hold {}",
                        cfg.orders_text()
                    ),
                ));
            }
            if cfg.overflows(&flat[flat.len() - width..], limit) {
                return Err(invalid(
                    "stats",
                    format!(
                        "segment {i} of system {k} has a count above {limit}: sums of {n} \
                         segments would overflow"
                    ),
                ));
            }
        }
        flat_systems.push(flat);
    }
    Ok(flat_systems)
}

/// A bootstrap estimate: the bootstrap mean and the half-width of the 95% percentile interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Confidence {
    /// The metric's score (0..=100) on the full corpus.
    pub score: f64,
    /// Mean of the resample scores (sacrebleu's `μ`).
    pub mean: f64,
    /// `(upper - lower) / 2` (sacrebleu's `± ci`).
    pub ci: f64,
    /// The `⌊B/40⌋`-th smallest resample score.
    pub lower: f64,
    /// The `⌊B/40⌋`-th largest resample score.
    pub upper: f64,
}

/// How the mean of the resample scores is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mean {
    /// Python's `statistics.mean`: exact sum, one rounding (to the scores' type).
    Exact,
    /// `numpy.mean`: NumPy's pairwise summation in the array's type, then `/ n`.
    Numpy,
}

/// Resample scores as sacrebleu holds them: Python floats (`f64`, BLEU), or NumPy `float32`
/// (chrF; the values are exactly `f32`s). An array of scores is `float32` only when every
/// score is (NumPy's array creation from a list that mixes the two gives `float64`).
#[derive(Debug, Clone)]
struct Scores {
    values: Vec<f64>,
    single: bool,
}

impl Scores {
    fn from_samples(samples: Vec<(f64, bool)>) -> Self {
        let single = !samples.is_empty() && samples.iter().all(|s| s.1);
        Self {
            values: samples.into_iter().map(|s| s.0).collect(),
            single,
        }
    }
}

/// NumPy's `pairwise_sum` (unrolled by 8, blocks of 128), in `T`'s arithmetic.
fn numpy_pairwise_sum<T>(a: &[T]) -> T
where
    T: Copy + Default + std::ops::Add<Output = T>,
{
    let n = a.len();
    if n < 8 {
        a.iter().fold(T::default(), |acc, &x| acc + x)
    } else if n <= 128 {
        let mut r = [T::default(); 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for j in 0..8 {
                r[j] = r[j] + a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            res = res + x;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        numpy_pairwise_sum(&a[..n2]) + numpy_pairwise_sum(&a[n2..])
    }
}

/// The exact mean of finite `values`, correctly rounded (Python's `statistics.mean`).
fn exact_mean(values: &[f64]) -> f64 {
    let mut sum = BigRational::from_integer(BigInt::from(0));
    for &v in values {
        if let Some(r) = BigRational::from_float(v) {
            sum += r;
        }
    }
    let n = BigRational::from_integer(BigInt::from(values.len()));
    (sum / n).to_f64().unwrap_or(f64::NAN)
}

/// The mean of `values` taken `how`, in `f32` when `single` (`statistics.mean` converts its
/// exact result to `numpy.float32` through a Python float; NumPy sums `float32` pairwise).
fn mean(values: &[f64], how: Mean, single: bool) -> f64 {
    match (how, single) {
        (Mean::Exact, false) => exact_mean(values),
        (Mean::Exact, true) => f64::from(exact_mean(values) as f32),
        (Mean::Numpy, false) => numpy_pairwise_sum(values) / values.len() as f64,
        (Mean::Numpy, true) => {
            let v: Vec<f32> = values.iter().map(|&x| x as f32).collect();
            f64::from(numpy_pairwise_sum(&v) / values.len() as f32)
        }
    }
}

/// sacrebleu's `estimate_ci` on resample scores (sorted here).
fn estimate_ci(score: f64, scores: &mut Scores, how: Mean) -> Confidence {
    // sacrebleu sorts first, then takes the mean (which matters for NumPy's pairwise sum).
    let values = &mut scores.values;
    values.sort_by(f64::total_cmp);
    let mean = mean(values, how, scores.single);
    let n = values.len();
    let lower_idx = n / 40;
    let upper_idx = n - lower_idx - 1;
    let (lower, upper) = (values[lower_idx], values[upper_idx]);
    let ci = if scores.single {
        f64::from(0.5f32 * (upper as f32 - lower as f32))
    } else {
        0.5 * (upper - lower)
    };
    Confidence {
        score,
        mean,
        ci,
        lower,
        upper,
    }
}

/// Scores `B = bootstrap.n_samples` bootstrap resamples of each system (flat statistics,
/// `width` per segment), all with the same indices (sacrebleu draws one `(B, S)` index matrix
/// from `default_rng(seed)` per call, so every call with the same seed resamples the same
/// way). Returns the scores of each system.
fn resample_all<M: Metric>(
    systems: &[Vec<u64>],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Vec<Scores> {
    let BootstrapConfig { n_samples, seed } = *bootstrap;
    let width = cfg.width();
    let n = systems[0].len() / width;
    let mut rng = NumpyPcg64::new(seed);
    let mut row = vec![0u32; n];
    let mut sum = vec![0u64; width];
    let mut samples: Vec<Vec<(f64, bool)>> = systems
        .iter()
        .map(|_| Vec::with_capacity(n_samples.min(1 << 20)))
        .collect();
    for _ in 0..n_samples {
        rng.choice_into(n as u64, &mut row);
        for (flat, out) in systems.iter().zip(&mut samples) {
            out.push(cfg.resample_row(flat, &row, &mut sum));
        }
    }
    samples.into_iter().map(Scores::from_samples).collect()
}

/// The summed flat statistics of a system.
fn flat_sum(flat: &[u64], width: usize) -> Vec<u64> {
    let mut sum = vec![0u64; width];
    for segment in flat.chunks_exact(width) {
        for (a, b) in sum.iter_mut().zip(segment) {
            *a += b;
        }
    }
    sum
}

/// The scores of `bootstrap.n_samples` bootstrap resamples of a corpus (per-segment `stats`,
/// e.g. from [`corpus_stats`](super::corpus_stats) or
/// [`corpus_chrf_stats`](super::chrf::corpus_chrf_stats)), drawn and computed exactly as
/// sacrebleu's `_bootstrap_resample` with `SACREBLEU_SEED = bootstrap.seed`. chrF's scores
/// are `f32` values, as sacrebleu's are.
///
/// Errors: invalid `cfg`, NLTK smoothing, `bootstrap.n_samples == 0`, no segment, segments
/// without the orders of `cfg`.
pub fn resample_scores<M: Metric>(
    stats: &[M::Counts],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Result<Vec<f64>, MetricError> {
    let flat = check(cfg, bootstrap, &[stats])?;
    Ok(resample_all(&flat, cfg, bootstrap).remove(0).values)
}

/// sacrebleu's `corpus_score(..., n_bootstrap=n_samples)` confidence estimate (`sacrebleu -ci
/// -cin n_samples`): the corpus score, the mean of `bootstrap.n_samples` resample scores and
/// the half-width of their 95% percentile interval (see the module docs for the formulas).
/// `bootstrap.seed` is `SACREBLEU_SEED` ([`SACREBLEU_SEED`] = 12345 by default). `cfg` is a
/// [`BleuConfig`] (statistics from [`corpus_stats`](super::corpus_stats)) or a [`ChrfConfig`]
/// (from [`corpus_chrf_stats`](super::chrf::corpus_chrf_stats)).
///
/// sacrebleu only estimates the interval for `n_samples > 1`, and prints it only when the mean
/// is positive. Errors as [`resample_scores`].
///
/// ```
/// use candle_bleu::exact::bootstrap::{bootstrap_confidence, paired_bootstrap, BootstrapConfig};
/// use candle_bleu::exact::chrf::{corpus_chrf_stats, ChrfConfig};
/// use candle_bleu::exact::{corpus_stats, BleuConfig};
/// let refs: Vec<Vec<Vec<u32>>> = (0..50u32).map(|i| vec![(i..i + 12).collect()]).collect();
/// // A baseline with one wrong token per segment, a system with two.
/// let baseline: Vec<Vec<u32>> = refs.iter().map(|r| { let mut h = r[0].clone(); h[5] = 999; h }).collect();
/// let system: Vec<Vec<u32>> = baseline.iter().map(|h| { let mut h = h.clone(); h[9] = 999; h }).collect();
/// let cfg = BleuConfig::default();
/// let base_stats = corpus_stats(&baseline, &refs, 4)?;
/// let sys_stats = corpus_stats(&system, &refs, 4)?;
/// let bootstrap = BootstrapConfig::default(); // sacrebleu's 1000 resamples, seed 12345
/// let ci = bootstrap_confidence(&base_stats, &cfg, &bootstrap)?;
/// // Every segment alike: every resample scores (up to float32 rounding) the corpus score.
/// assert!((ci.mean - ci.score).abs() < 1e-3 && ci.ci < 1e-3);
/// let (_, result) = paired_bootstrap(&base_stats, &sys_stats, &cfg, &bootstrap)?;
/// assert!(result.score < ci.score && result.p_value < 0.05);
///
/// // chrF: the same functions on chrF statistics.
/// let hyps = ["the cat sat", "a dog barked", "birds sing"];
/// let refs = [vec!["the cat sat down"], vec!["the dog barked"], vec!["birds sing"]];
/// let chrf = ChrfConfig::default();
/// let stats = corpus_chrf_stats(&hyps, &refs, chrf)?;
/// let few = BootstrapConfig { n_samples: 100, ..bootstrap };
/// let ci = bootstrap_confidence(&stats, &chrf, &few)?;
/// assert!(ci.lower <= ci.upper && ci.ci >= 0.0);
/// # Ok::<(), candle_bleu::exact::MetricError>(())
/// ```
pub fn bootstrap_confidence<M: Metric>(
    stats: &[M::Counts],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Result<Confidence, MetricError> {
    let flat = check(cfg, bootstrap, &[stats])?;
    let score = cfg.score_segments(&flat[0]);
    let mut scores = resample_all(&flat, cfg, bootstrap).remove(0);
    Ok(estimate_ci(score, &mut scores, Mean::Exact))
}

/// The result of a paired test of one system against the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedResult {
    /// The metric's score (0..=100) of the system on the full corpus.
    pub score: f64,
    /// `(c + 1) / (n + 1)`.
    pub p_value: f64,
    /// Bootstrap mean and interval of the system (paired bootstrap only).
    pub confidence: Option<Confidence>,
}

/// Paired bootstrap resampling of several systems against a baseline, as sacrebleu's
/// `PairedTest(test_type='bs')` (`sacrebleu -pbs -pbsn n_samples`, `bootstrap.n_samples`
/// resamples from `bootstrap.seed`): every resample uses the same
/// segment indices for all systems. Returns the baseline's estimate and one result per
/// system, in order. See the module docs for the formulas.
///
/// Errors: as [`resample_scores`], and systems with another number of segments than the
/// baseline.
pub fn paired_bootstrap_many<M: Metric>(
    baseline: &[M::Counts],
    systems: &[&[M::Counts]],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Result<(Confidence, Vec<PairedResult>), MetricError> {
    let n_samples = bootstrap.n_samples;
    let mut all: Vec<&[M::Counts]> = vec![baseline];
    all.extend_from_slice(systems);
    let flat = check(cfg, bootstrap, &all)?;
    let actual: Vec<f64> = flat.iter().map(|f| cfg.score_segments(f)).collect();
    let mut scores = resample_all(&flat, cfg, bootstrap);
    let bl_scores = scores.remove(0);
    let mut bl_sorted = bl_scores.clone();
    let bl_conf = estimate_ci(actual[0], &mut bl_sorted, Mean::Numpy);
    let results = scores
        .into_iter()
        .zip(&actual[1..])
        .map(|(mut sys_scores, &score)| {
            let diff = (actual[0] - score).abs();
            // `np.abs(scores_sys - scores_bl)`: float32 when both arrays are.
            let single = sys_scores.single && bl_scores.single;
            let sample_diffs: Vec<f64> = sys_scores
                .values
                .iter()
                .zip(&bl_scores.values)
                .map(|(&y, &x)| {
                    if single {
                        f64::from((y as f32 - x as f32).abs())
                    } else {
                        (y - x).abs()
                    }
                })
                .collect();
            let m = mean(&sample_diffs, Mean::Numpy, single);
            // `sample_diffs - mean > diff`: a Python float compared with float32 values is
            // converted to float32 first.
            let c = if single {
                let (m, diff) = (m as f32, diff as f32);
                sample_diffs
                    .iter()
                    .filter(|&&d| d as f32 - m > diff)
                    .count()
            } else {
                sample_diffs.iter().filter(|&&d| d - m > diff).count()
            };
            let p_value = (c + 1) as f64 / (n_samples + 1) as f64;
            let confidence = estimate_ci(score, &mut sys_scores, Mean::Numpy);
            PairedResult {
                score,
                p_value,
                confidence: Some(confidence),
            }
        })
        .collect();
    Ok((bl_conf, results))
}

/// Paired bootstrap resampling of one system against a baseline ([`paired_bootstrap_many`]
/// with one system): `(baseline estimate, system result)`.
pub fn paired_bootstrap<M: Metric>(
    baseline: &[M::Counts],
    system: &[M::Counts],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Result<(Confidence, PairedResult), MetricError> {
    let (bl, mut results) = paired_bootstrap_many(baseline, &[system], cfg, bootstrap)?;
    Ok((bl, results.remove(0)))
}

/// sacrebleu's scoring of a BLEU AR trial: `f64`, add-k truncated to an integer `k`.
fn score_ar(stats: &BleuCounts, cfg: &BleuConfig) -> f64 {
    let score = |cfg: &BleuConfig| score_from_stats(stats, cfg).map_or(0.0, |s| s.score);
    match cfg.smoothing {
        SmoothMethod::AddK(k) if k.fract() != 0.0 => score(&BleuConfig {
            smoothing: SmoothMethod::AddK(k.trunc()),
            ..cfg.clone()
        }),
        _ => score(cfg),
    }
}

/// Paired approximate randomization of `system` against `baseline`, as sacrebleu's
/// `PairedTest(test_type='ar')` (`sacrebleu -par -parn n_trials`, without the optional
/// confidence estimate): `p = (c + 1)/(T + 1)` with `c` the trials whose swapped systems differ
/// by more than the real difference (see the module docs). Here `bootstrap.n_samples` is the
/// number of trials `T` (sacrebleu's default is 10000, not `BootstrapConfig::default()`'s
/// 1000). `bootstrap.seed` re-seeds the generator for every system, as sacrebleu does, so all
/// systems see the same swaps.
///
/// Errors: as [`paired_bootstrap_many`].
pub fn paired_approximate_randomization<M: Metric>(
    baseline: &[M::Counts],
    system: &[M::Counts],
    cfg: &M,
    bootstrap: &BootstrapConfig,
) -> Result<PairedResult, MetricError> {
    let BootstrapConfig {
        n_samples: n_trials,
        seed,
    } = *bootstrap;
    let flat = check(cfg, bootstrap, &[baseline, system])?;
    let bl_score = cfg.score_segments(&flat[0]);
    let score = cfg.score_segments(&flat[1]);
    let diff = (bl_score - score).abs();
    let mut rng = NumpyPcg64::new(seed);
    let mut bools = NumpyBools::default();
    let mut c = 0usize;
    if cfg.float_stats() {
        let mut swap = vec![false; baseline.len()];
        for _ in 0..n_trials {
            for s in &mut swap {
                *s = bools.next(&mut rng);
            }
            let (sa, sb) = cfg.trial_pair(&flat[0], &flat[1], &swap);
            if (sa - sb).abs() > diff {
                c += 1;
            }
        }
    } else {
        let width = cfg.width();
        let bl_sum = flat_sum(&flat[0], width);
        let sys_sum = flat_sum(&flat[1], width);
        // A_t = Σ_{pos} bl_i + Σ_{neg} sys_i = sys_sum + Σ_{pos} (bl_i - sys_i); B_t = bl + sys - A_t.
        let delta: Vec<i64> = flat[0]
            .iter()
            .zip(&flat[1])
            .map(|(&p, &q)| p as i64 - q as i64)
            .collect();
        let base_a: Vec<i64> = sys_sum.iter().map(|&x| x as i64).collect();
        let both: Vec<i64> = bl_sum
            .iter()
            .zip(&sys_sum)
            .map(|(&x, &y)| x as i64 + y as i64)
            .collect();
        let mut acc = vec![0i64; width];
        let mut sum_a = vec![0u64; width];
        let mut sum_b = vec![0u64; width];
        for _ in 0..n_trials {
            acc.copy_from_slice(&base_a);
            for d in delta.chunks_exact(width) {
                if bools.next(&mut rng) {
                    for (x, y) in acc.iter_mut().zip(d) {
                        *x += y;
                    }
                }
            }
            for (((a, b), t), x) in sum_a.iter_mut().zip(&mut sum_b).zip(&both).zip(&acc) {
                *a = *x as u64;
                *b = (t - x) as u64;
            }
            let sa = cfg.trial_flat(&sum_a);
            let sb = cfg.trial_flat(&sum_b);
            if (sa - sb).abs() > diff {
                c += 1;
            }
        }
    }
    Ok(PairedResult {
        score,
        p_value: (c + 1) as f64 / (n_trials + 1) as f64,
        confidence: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n_samples` samples from `seed`.
    fn bs(n_samples: usize, seed: u64) -> BootstrapConfig {
        BootstrapConfig { n_samples, seed }
    }

    #[test]
    fn numpy_pairwise_sum_small_and_blocked() {
        let v: Vec<f64> = (0..1000).map(|i| 0.1 * i as f64).collect();
        let s = numpy_pairwise_sum(&v);
        assert!((s - 49950.0).abs() < 1e-6);
        assert_eq!(numpy_pairwise_sum(&[1.0, 2.0]), 3.0);
    }

    fn toy_stats() -> Vec<BleuCounts> {
        (0..50)
            .map(|i| {
                let c = 10 + i % 7;
                let m1 = c - i % 4;
                BleuCounts {
                    matches: vec![m1, m1 / 2, m1 / 3, m1 / 5],
                    totals: vec![c, c - 1, c - 2, c - 3],
                    hyp_len: c,
                    ref_len: c + i % 3,
                }
            })
            .collect()
    }

    #[test]
    fn confidence_interval_contains_score_and_is_deterministic() {
        let stats = toy_stats();
        let cfg = BleuConfig::default();
        let a = bootstrap_confidence(&stats, &cfg, &bs(1000, SACREBLEU_SEED)).unwrap();
        let b = bootstrap_confidence(&stats, &cfg, &bs(1000, SACREBLEU_SEED)).unwrap();
        assert_eq!(a, b);
        assert!(a.lower <= a.score && a.score <= a.upper, "{a:?}");
        assert!(a.ci > 0.0 && (a.mean - a.score).abs() < a.ci);
        let c = bootstrap_confidence(&stats, &cfg, &bs(1000, 7)).unwrap();
        assert_ne!(a.mean, c.mean);
    }

    #[test]
    fn paired_tests_give_p_values_in_range() {
        let bl = toy_stats();
        let sys: Vec<BleuCounts> = bl
            .iter()
            .map(|s| BleuCounts {
                matches: s.matches.iter().map(|m| m.saturating_sub(1)).collect(),
                ..s.clone()
            })
            .collect();
        let cfg = BleuConfig::default();
        let (blc, res) = paired_bootstrap(&bl, &sys, &cfg, &bs(500, 12345)).unwrap();
        assert!(res.p_value > 0.0 && res.p_value <= 1.0);
        assert!(res.p_value < 0.05, "{res:?}");
        assert!(blc.score > res.score);
        // A system against itself: no resample differs by more than 0, p = 1/(n+1) (sacrebleu's
        // strict `>`).
        let (_, same) = paired_bootstrap(&bl, &bl, &cfg, &bs(200, 12345)).unwrap();
        assert_eq!(same.p_value, 1.0 / 201.0);
        let ar = paired_approximate_randomization(&bl, &sys, &cfg, &bs(1000, 12345)).unwrap();
        assert!(ar.p_value > 0.0 && ar.p_value < 0.05, "{ar:?}");
        let ar_same = paired_approximate_randomization(&bl, &bl, &cfg, &bs(100, 12345)).unwrap();
        assert_eq!(ar_same.p_value, 1.0 / 101.0);
    }

    #[test]
    fn errors_name_the_argument() {
        let stats = toy_stats();
        let cfg = BleuConfig::default();
        let e = bootstrap_confidence(&stats, &cfg, &bs(0, 1)).unwrap_err();
        assert!(e.to_string().contains("bootstrap.n_samples"), "{e}");
        let e = bootstrap_confidence(&[], &cfg, &bs(10, 1)).unwrap_err();
        assert!(e.to_string().contains("stats"));
        let e = paired_bootstrap(&stats, &stats[..3], &cfg, &bs(10, 1)).unwrap_err();
        assert!(e.to_string().contains("same number of segments"));
        let e = bootstrap_confidence(&stats, &BleuConfig::nltk(1), &bs(10, 1)).unwrap_err();
        assert!(e.to_string().contains("cfg.smoothing"));
    }

    #[test]
    fn exact_mean_is_correctly_rounded() {
        assert_eq!(exact_mean(&[0.1, 0.2, 0.3]), 0.2);
        assert_eq!(exact_mean(&[1e16, 1.0, -1e16]), 1.0 / 3.0);
    }
}
