//! Bootstrap confidence intervals and paired significance tests over per-segment BLEU
//! statistics, as sacrebleu 2.6.0 computes them (`sacrebleu/significance.py`,
//! `metrics/base.py`), **with sacrebleu's random numbers**.
//!
//! sacrebleu draws its resamples with NumPy: `np.random.default_rng(seed)` (seed 12345 unless
//! `SACREBLEU_SEED` says otherwise), i.e. a PCG64 generator seeded through NumPy's
//! `SeedSequence`. This module reimplements both (and `Generator.choice` /
//! `Generator.integers(2, dtype=bool)` on top) bit for bit, so the resamples, and with them the
//! means, intervals and p-values, are sacrebleu's own.
//!
//! # Definitions
//! Statistics `s_1..s_S` (one [`BleuStats`] per segment), `B` resamples, seed `σ`:
//! - resample `b` draws `S` segment indices `i_{b,1..S}` uniformly with replacement
//!   (`rng.choice(S, size=(B, S))`, row `b`) and scores `x_b = BLEU(Σ_j s_{i_{b,j}})`;
//! - **confidence** ([`bootstrap_confidence`], `sacrebleu -ci`): sort `x`, `k = ⌊B/40⌋`,
//!   `lower = x_(k)`, `upper = x_(B-k-1)` (0-based order statistics), `ci = (upper - lower)/2`,
//!   `mean = (Σ x_b)/B`. Reported as `μ = mean ± ci`: a 95% percentile interval's half-width
//!   around the bootstrap mean, not `mean ± 1.96·sd`;
//! - **paired bootstrap** ([`paired_bootstrap`], `sacrebleu -pbs`; Koehn 2004 as in Moses'
//!   `bootstrap-hypothesis-difference-significance.pl`): baseline and system are resampled
//!   with the SAME indices; `d_b = |y_b - x_b|`, `δ = |BLEU(system) - BLEU(baseline)|` on the full
//!   corpus, `c = #{b : d_b - mean(d) > δ}`, `p = (c + 1)/(B + 1)`. The system's and baseline's
//!   mean and `ci` are computed as above;
//! - **approximate randomization** ([`paired_approximate_randomization`], `sacrebleu -par`):
//!   trial `t` swaps each segment's statistics between the two systems with probability 1/2
//!   (`rng.integers(2, size=(T, S), dtype=bool)`), `d_t = |BLEU(A_t) - BLEU(B_t)|`,
//!   `c = #{t : d_t > δ}`, `p = (c + 1)/(T + 1)`.
//!
//! # Arithmetic, as sacrebleu's
//! - Bootstrap resamples are summed from a `float32` copy of the statistics and scored with
//!   NumPy 2's promotion rules (a Python float times a `float32` stays `float32`): every
//!   precision `100·m/t` (and `exp`'s `100/(2^k·t)`, `floor`'s `100·v/t`, add-k's `m + k`) is
//!   rounded to `f32`; the logarithms, mean, exponential and brevity penalty are `f64`.
//!   NumPy 1.x promoted those products to `float64`; its last digits can differ.
//! - AR trials are scored in `f64` (NumPy `int64` matrix products); add-k on them truncates
//!   `m + k` to an integer (sacrebleu assigns the float into an `int64` array).
//! - `-ci` means are `statistics.mean` (exact, correctly rounded); the paired tests use
//!   `numpy.mean` (pairwise summation), both reproduced.
//! - The only deliberate difference: resample sums are exact integers, while NumPy sums
//!   `float32` values, which stops being exact once a summed count exceeds 2^24 (a corpus of
//!   more than ~16.7 million tokens).
//!
//! Only sacrebleu's smoothings (`None`, `Floor`, `AddK`, `Exp`) are supported; custom weights are
//! scored with [`score_from_stats`] in `f64` (sacrebleu has no weights).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::ToPrimitive;

use super::sacre::{brevity_penalty, my_log};
use super::{invalid, score_from_stats, BleuConfig, BleuError, BleuStats, Smoothing};

/// sacrebleu's default seed (`SACREBLEU_SEED` unset).
pub const SACREBLEU_SEED: u64 = 12345;

/// NumPy's `PCG64` bit generator as `np.random.default_rng(seed)` creates it (seeded through
/// `SeedSequence`), with `next_uint32`'s half-word buffering. Bit-exact with NumPy >= 1.17.
#[derive(Debug, Clone)]
struct NumpyPcg64 {
    state: u128,
    inc: u128,
    has_u32: bool,
    u32_buf: u32,
}

const PCG_MULT: u128 = (2549297995355413924u128 << 64) | 4865540595714422341u128;

// SeedSequence constants (numpy/random/bit_generator.pyx).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL_SIZE: usize = 4;

/// `SeedSequence(entropy).generate_state(n_words, np.uint32)` for the entropy given as 32-bit
/// words, least significant first (`_coerce_to_uint32_array`), no spawn key.
fn seed_sequence_state(entropy: &[u32], n_words: usize) -> Vec<u32> {
    let mut hash_const = INIT_A;
    let mut hashmix = |value: u32| {
        let mut v = value ^ hash_const;
        hash_const = hash_const.wrapping_mul(MULT_A);
        v = v.wrapping_mul(hash_const);
        v ^ (v >> XSHIFT)
    };
    let mix = |x: u32, y: u32| {
        let r = MIX_MULT_L
            .wrapping_mul(x)
            .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
        r ^ (r >> XSHIFT)
    };
    let mut pool = [0u32; POOL_SIZE];
    for (i, slot) in pool.iter_mut().enumerate() {
        *slot = hashmix(entropy.get(i).copied().unwrap_or(0));
    }
    for src in 0..POOL_SIZE {
        for dst in 0..POOL_SIZE {
            if src != dst {
                let h = hashmix(pool[src]);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &word in entropy.iter().skip(POOL_SIZE) {
        for slot in pool.iter_mut() {
            let h = hashmix(word);
            *slot = mix(*slot, h);
        }
    }
    let mut hash_const = INIT_B;
    (0..n_words)
        .map(|i| {
            let mut v = pool[i % POOL_SIZE] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hash_const);
            v ^ (v >> XSHIFT)
        })
        .collect()
}

impl NumpyPcg64 {
    /// `np.random.default_rng(seed)`.
    fn new(seed: u64) -> Self {
        let words: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        Self::from_entropy(&words)
    }

    /// `np.random.default_rng(SeedSequence(entropy))` with the entropy as 32-bit words, least
    /// significant first (Python's `int` → `uint32` array conversion).
    fn from_entropy(entropy: &[u32]) -> Self {
        let words = seed_sequence_state(entropy, 8);
        let u64_at = |k: usize| words[2 * k] as u64 | (words[2 * k + 1] as u64) << 32;
        // pcg64_set_seed: the first uint64 is the high half.
        let init = (u64_at(0) as u128) << 64 | u64_at(1) as u128;
        let initseq = (u64_at(2) as u128) << 64 | u64_at(3) as u128;
        let mut rng = Self {
            state: 0,
            inc: (initseq << 1) | 1,
            has_u32: false,
            u32_buf: 0,
        };
        rng.step();
        rng.state = rng.state.wrapping_add(init);
        rng.step();
        rng
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// Next 64 random bits (PCG XSL-RR 128/64).
    fn next_u64(&mut self) -> u64 {
        self.step();
        let hi = (self.state >> 64) as u64;
        let lo = self.state as u64;
        (hi ^ lo).rotate_right((hi >> 58) as u32)
    }

    /// NumPy's `next_uint32`: the low half of a 64-bit draw, then its high half.
    fn next_u32(&mut self) -> u32 {
        if self.has_u32 {
            self.has_u32 = false;
            return self.u32_buf;
        }
        let next = self.next_u64();
        self.has_u32 = true;
        self.u32_buf = (next >> 32) as u32;
        next as u32
    }

    /// One draw of `Generator.integers(0, n)` for `1 <= n <= 2^32` (NumPy's Lemire rejection
    /// on 32-bit words; `n == 1` draws nothing).
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!((1..=1u64 << 32).contains(&n));
        let rng = (n - 1) as u32;
        if rng == 0 {
            return 0;
        }
        if rng == u32::MAX {
            return self.next_u32() as u64;
        }
        let rng_excl = rng + 1;
        let mut m = self.next_u32() as u64 * rng_excl as u64;
        let mut leftover = m as u32;
        if leftover < rng_excl {
            let threshold = (u32::MAX - rng) % rng_excl;
            while leftover < threshold {
                m = self.next_u32() as u64 * rng_excl as u64;
                leftover = m as u32;
            }
        }
        m >> 32
    }

    /// Fills `out` as one row of `Generator.choice(n, size=(B, out.len()), replace=True)`.
    fn choice_into(&mut self, n: u64, out: &mut [u32]) {
        for x in out {
            *x = self.below(n) as u32;
        }
    }
}

/// `Generator.integers(2, size=..., dtype=bool)`: one bit per draw from buffered 32-bit words.
#[derive(Debug, Clone, Default)]
struct NumpyBools {
    bcnt: u32,
    buf: u32,
}

impl NumpyBools {
    /// The next boolean from `rng`.
    fn next(&mut self, rng: &mut NumpyPcg64) -> bool {
        if self.bcnt == 0 {
            self.buf = rng.next_u32();
            self.bcnt = 31;
        } else {
            self.buf >>= 1;
            self.bcnt -= 1;
        }
        self.buf & 1 != 0
    }
}

/// The score of one bootstrap resample as sacrebleu computes it: `compute_bleu` on a `float32`
/// NumPy vector under NumPy 2 promotion (see the module docs). `cfg` is validated, its
/// smoothing is a sacrebleu one and `stats` has `cfg.max_order` orders.
fn score_f32(stats: &BleuStats, cfg: &BleuConfig) -> f64 {
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
        if let Smoothing::AddK(k) = cfg.smoothing {
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
                Smoothing::Exp => {
                    smooth_mteval *= 2.0;
                    100f32 / (smooth_mteval as f32 * total)
                }
                Smoothing::Floor(v) => (100.0 * v) as f32 / total,
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

/// Checks the arguments shared by every test.
fn check(cfg: &BleuConfig, n_samples: usize, segments: &[&[BleuStats]]) -> Result<(), BleuError> {
    cfg.validate()?;
    if let Smoothing::Nltk(_) = cfg.smoothing {
        return Err(invalid(
            "cfg.smoothing",
            "bootstrap resampling follows sacrebleu: use Smoothing::None, Floor, AddK or Exp",
        ));
    }
    if n_samples == 0 {
        return Err(invalid("n_samples", "must be >= 1, got 0"));
    }
    let n = segments.first().map_or(0, |s| s.len());
    if n == 0 {
        return Err(invalid("stats", "no segment to resample"));
    }
    if n as u64 > 1 << 32 {
        return Err(invalid("stats", format!("at most 2^32 segments, got {n}")));
    }
    // A resample sums `n` segments, and approximate randomization adds two systems in `i64`:
    // every count times `2n` must fit an `i64`.
    let limit = (i64::MAX as u64) / (2 * n as u64);
    for (k, s) in segments.iter().enumerate() {
        if s.len() != n {
            return Err(invalid(
                "stats",
                format!(
                    "the systems must have the same number of segments: {n} and {} (system {k})",
                    s.len()
                ),
            ));
        }
        if let Some(i) = s
            .iter()
            .position(|st| st.matches.len() != cfg.max_order || st.totals.len() != cfg.max_order)
        {
            return Err(invalid(
                "stats",
                format!(
                    "segment {i} of system {k} does not hold cfg.max_order = {} orders",
                    cfg.max_order
                ),
            ));
        }
        if let Some(i) = s.iter().position(|st| {
            st.hyp_len > limit
                || st.ref_len > limit
                || st.matches.iter().chain(&st.totals).any(|&c| c > limit)
        }) {
            return Err(invalid(
                "stats",
                format!(
                    "segment {i} of system {k} has a count above {limit}: sums of {n} segments \
                     would overflow"
                ),
            ));
        }
    }
    Ok(())
}

/// A bootstrap estimate: the bootstrap mean and the half-width of the 95% percentile interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Confidence {
    /// BLEU (0..=100) of the full corpus.
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
    /// Python's `statistics.mean`: exact sum, one rounding.
    Exact,
    /// `numpy.mean`: NumPy's pairwise summation, then `/ n`.
    Numpy,
}

/// NumPy's `pairwise_sum` of `float64` (unrolled by 8, blocks of 128).
fn numpy_pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        a.iter().fold(0.0, |acc, &x| acc + x)
    } else if n <= 128 {
        let mut r = [0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - n % 8 {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            res += x;
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

fn mean(values: &[f64], how: Mean) -> f64 {
    match how {
        Mean::Exact => exact_mean(values),
        Mean::Numpy => numpy_pairwise_sum(values) / values.len() as f64,
    }
}

/// sacrebleu's `estimate_ci` on resample scores (sorted here).
fn estimate_ci(score: f64, scores: &mut [f64], how: Mean) -> Confidence {
    // sacrebleu sorts first, then takes the mean (which matters for NumPy's pairwise sum).
    scores.sort_by(f64::total_cmp);
    let mean = mean(scores, how);
    let n = scores.len();
    let lower_idx = n / 40;
    let upper_idx = n - lower_idx - 1;
    let (lower, upper) = (scores[lower_idx], scores[upper_idx]);
    Confidence {
        score,
        mean,
        ci: 0.5 * (upper - lower),
        lower,
        upper,
    }
}

/// Scores `B = n_samples` bootstrap resamples of each system, all with the same indices
/// (sacrebleu draws one `(B, S)` index matrix from `default_rng(seed)` per call, so every call
/// with the same seed resamples the same way). Returns `scores[system][b]`.
fn resample_all(
    systems: &[&[BleuStats]],
    cfg: &BleuConfig,
    n_samples: usize,
    seed: u64,
) -> Vec<Vec<f64>> {
    let n = systems[0].len();
    let mut rng = NumpyPcg64::new(seed);
    let mut row = vec![0u32; n];
    let mut sums: Vec<BleuStats> = systems
        .iter()
        .map(|_| BleuStats::zeros(cfg.max_order))
        .collect();
    let mut scores: Vec<Vec<f64>> = systems
        .iter()
        .map(|_| Vec::with_capacity(n_samples.min(1 << 20)))
        .collect();
    for _ in 0..n_samples {
        rng.choice_into(n as u64, &mut row);
        for ((stats, sum), out) in systems.iter().zip(&mut sums).zip(&mut scores) {
            sum.matches.fill(0);
            sum.totals.fill(0);
            sum.hyp_len = 0;
            sum.ref_len = 0;
            for &i in &row {
                let s = &stats[i as usize];
                for (a, b) in sum.matches.iter_mut().zip(&s.matches) {
                    *a += b;
                }
                for (a, b) in sum.totals.iter_mut().zip(&s.totals) {
                    *a += b;
                }
                sum.hyp_len += s.hyp_len;
                sum.ref_len += s.ref_len;
            }
            out.push(score_f32(sum, cfg));
        }
    }
    scores
}

/// The scores of `n_samples` bootstrap resamples of a corpus (per-segment `stats`, e.g. from
/// [`super::corpus_stats`]), drawn and computed exactly as sacrebleu's `_bootstrap_resample`
/// with `SACREBLEU_SEED = seed`.
///
/// Errors: invalid `cfg`, NLTK smoothing, `n_samples == 0`, no segment, segments without
/// `cfg.max_order` orders.
pub fn resample_scores(
    stats: &[BleuStats],
    cfg: &BleuConfig,
    n_samples: usize,
    seed: u64,
) -> Result<Vec<f64>, BleuError> {
    check(cfg, n_samples, &[stats])?;
    Ok(resample_all(&[stats], cfg, n_samples, seed).remove(0))
}

/// sacrebleu's `corpus_score(..., n_bootstrap=n_samples)` confidence estimate (`sacrebleu -ci
/// -cin n_samples`): the corpus score, the mean of `n_samples` resample scores and the
/// half-width of their 95% percentile interval (see the module docs for the formulas).
/// `seed` is `SACREBLEU_SEED` ([`SACREBLEU_SEED`] = 12345 by default).
///
/// sacrebleu only estimates the interval for `n_samples > 1`, and prints it only when the mean
/// is positive. Errors as [`resample_scores`].
///
/// ```
/// use candle_bleu::exact::bootstrap::{bootstrap_confidence, paired_bootstrap, SACREBLEU_SEED};
/// use candle_bleu::exact::{corpus_stats, BleuConfig};
/// let refs: Vec<Vec<Vec<u32>>> = (0..50u32).map(|i| vec![(i..i + 12).collect()]).collect();
/// // A baseline with one wrong token per segment, a system with two.
/// let baseline: Vec<Vec<u32>> = refs.iter().map(|r| { let mut h = r[0].clone(); h[5] = 999; h }).collect();
/// let system: Vec<Vec<u32>> = baseline.iter().map(|h| { let mut h = h.clone(); h[9] = 999; h }).collect();
/// let cfg = BleuConfig::default();
/// let base_stats = corpus_stats(&baseline, &refs, 4)?;
/// let sys_stats = corpus_stats(&system, &refs, 4)?;
/// let ci = bootstrap_confidence(&base_stats, &cfg, 1000, SACREBLEU_SEED)?;
/// // Every segment alike: every resample scores (up to float32 rounding) the corpus score.
/// assert!((ci.mean - ci.score).abs() < 1e-3 && ci.ci < 1e-3);
/// let (_, result) = paired_bootstrap(&base_stats, &sys_stats, &cfg, 1000, SACREBLEU_SEED)?;
/// assert!(result.score < ci.score && result.p_value < 0.05);
/// # Ok::<(), candle_bleu::exact::BleuError>(())
/// ```
pub fn bootstrap_confidence(
    stats: &[BleuStats],
    cfg: &BleuConfig,
    n_samples: usize,
    seed: u64,
) -> Result<Confidence, BleuError> {
    check(cfg, n_samples, &[stats])?;
    let score = score_from_stats(&stats.iter().sum(), cfg)?.score;
    let mut scores = resample_all(&[stats], cfg, n_samples, seed).remove(0);
    Ok(estimate_ci(score, &mut scores, Mean::Exact))
}

/// The result of a paired test of one system against the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedResult {
    /// BLEU (0..=100) of the system on the full corpus.
    pub score: f64,
    /// `(c + 1) / (n + 1)`.
    pub p_value: f64,
    /// Bootstrap mean and interval of the system (paired bootstrap only).
    pub confidence: Option<Confidence>,
}

/// Paired bootstrap resampling of several systems against a baseline, as sacrebleu's
/// `PairedTest(test_type='bs')` (`sacrebleu -pbs -pbsn n_samples`): every resample uses the same
/// segment indices for all systems. Returns the baseline's estimate and one result per
/// system, in order. See the module docs for the formulas.
///
/// Errors: as [`resample_scores`], and systems with another number of segments than the
/// baseline.
pub fn paired_bootstrap_many(
    baseline: &[BleuStats],
    systems: &[&[BleuStats]],
    cfg: &BleuConfig,
    n_samples: usize,
    seed: u64,
) -> Result<(Confidence, Vec<PairedResult>), BleuError> {
    let mut all: Vec<&[BleuStats]> = vec![baseline];
    all.extend_from_slice(systems);
    check(cfg, n_samples, &all)?;
    let actual: Vec<f64> = all
        .iter()
        .map(|s| score_from_stats(&s.iter().sum(), cfg).map(|b| b.score))
        .collect::<Result<_, _>>()?;
    let mut scores = resample_all(&all, cfg, n_samples, seed);
    let bl_scores = scores.remove(0);
    let mut bl_sorted = bl_scores.clone();
    let bl_conf = estimate_ci(actual[0], &mut bl_sorted, Mean::Numpy);
    let results = scores
        .into_iter()
        .zip(&actual[1..])
        .map(|(mut sys_scores, &score)| {
            let diff = (actual[0] - score).abs();
            let sample_diffs: Vec<f64> = sys_scores
                .iter()
                .zip(&bl_scores)
                .map(|(y, x)| (y - x).abs())
                .collect();
            let m = mean(&sample_diffs, Mean::Numpy);
            let c = sample_diffs.iter().filter(|&&d| d - m > diff).count();
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
pub fn paired_bootstrap(
    baseline: &[BleuStats],
    system: &[BleuStats],
    cfg: &BleuConfig,
    n_samples: usize,
    seed: u64,
) -> Result<(Confidence, PairedResult), BleuError> {
    let (bl, mut results) = paired_bootstrap_many(baseline, &[system], cfg, n_samples, seed)?;
    Ok((bl, results.remove(0)))
}

/// sacrebleu's scoring of an AR trial: `f64`, add-k truncated to an integer `k`.
fn score_ar(stats: &BleuStats, cfg: &BleuConfig) -> f64 {
    let score = |cfg: &BleuConfig| score_from_stats(stats, cfg).map_or(0.0, |s| s.score);
    match cfg.smoothing {
        Smoothing::AddK(k) if k.fract() != 0.0 => score(&BleuConfig {
            smoothing: Smoothing::AddK(k.trunc()),
            ..cfg.clone()
        }),
        _ => score(cfg),
    }
}

/// Paired approximate randomization of `system` against `baseline`, as sacrebleu's
/// `PairedTest(test_type='ar')` (`sacrebleu -par -parn n_trials`, without the optional
/// confidence estimate): `p = (c + 1)/(T + 1)` with `c` the trials whose swapped systems differ
/// by more than the real difference (see the module docs). `seed` re-seeds the generator for
/// every system, as sacrebleu does, so all systems see the same swaps.
///
/// Errors: as [`paired_bootstrap_many`].
pub fn paired_approximate_randomization(
    baseline: &[BleuStats],
    system: &[BleuStats],
    cfg: &BleuConfig,
    n_trials: usize,
    seed: u64,
) -> Result<PairedResult, BleuError> {
    check(cfg, n_trials, &[baseline, system])?;
    let bl_sum: BleuStats = baseline.iter().sum();
    let sys_sum: BleuStats = system.iter().sum();
    let bl_score = score_from_stats(&bl_sum, cfg)?.score;
    let score = score_from_stats(&sys_sum, cfg)?.score;
    let diff = (bl_score - score).abs();
    let k = cfg.max_order;
    // A_t = Σ_{pos} bl_i + Σ_{neg} sys_i = sys_sum + Σ_{pos} (bl_i - sys_i); B_t = bl + sys - A_t.
    let width = 2 + 2 * k;
    let flat = |s: &BleuStats, out: &mut Vec<i64>| {
        out.push(s.hyp_len as i64);
        out.push(s.ref_len as i64);
        out.extend(s.matches.iter().map(|&m| m as i64));
        out.extend(s.totals.iter().map(|&t| t as i64));
    };
    let mut delta = Vec::with_capacity(baseline.len() * width);
    let mut a = Vec::with_capacity(width);
    let mut b = Vec::with_capacity(width);
    for (x, y) in baseline.iter().zip(system) {
        a.clear();
        b.clear();
        flat(x, &mut a);
        flat(y, &mut b);
        delta.extend(a.iter().zip(&b).map(|(p, q)| p - q));
    }
    let (mut base_a, mut both) = (Vec::with_capacity(width), Vec::with_capacity(width));
    flat(&sys_sum, &mut base_a);
    flat(&bl_sum, &mut both);
    for (x, y) in both.iter_mut().zip(&base_a) {
        *x += y;
    }
    let to_stats = |v: &[i64]| BleuStats {
        hyp_len: v[0] as u64,
        ref_len: v[1] as u64,
        matches: v[2..2 + k].iter().map(|&x| x as u64).collect(),
        totals: v[2 + k..].iter().map(|&x| x as u64).collect(),
    };
    let mut rng = NumpyPcg64::new(seed);
    let mut bools = NumpyBools::default();
    let mut acc = vec![0i64; width];
    let mut rest = vec![0i64; width];
    let mut c = 0usize;
    for _ in 0..n_trials {
        acc.copy_from_slice(&base_a);
        for d in delta.chunks_exact(width) {
            if bools.next(&mut rng) {
                for (x, y) in acc.iter_mut().zip(d) {
                    *x += y;
                }
            }
        }
        for ((r, t), x) in rest.iter_mut().zip(&both).zip(&acc) {
            *r = t - x;
        }
        let sa = score_ar(&to_stats(&acc), cfg);
        let sb = score_ar(&to_stats(&rest), cfg);
        if (sa - sb).abs() > diff {
            c += 1;
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

    #[test]
    fn pcg64_matches_numpy_default_rng_12345() {
        // np.random.default_rng(12345).bit_generator.state
        let rng = NumpyPcg64::new(12345);
        assert_eq!(rng.state, 33261208707367790463622745601869196757);
        assert_eq!(rng.inc, 268209174141567072605526753992732310247);
        // np.random.default_rng(12345).integers(2**64, dtype=np.uint64, size=2)
        let mut rng = NumpyPcg64::new(12345);
        let first = rng.next_u64();
        assert_eq!(first, 4193609425186963869);
        assert_eq!(rng.next_u64(), 5843160025838961886);
        let mut again = NumpyPcg64::new(12345);
        assert_eq!(
            again.next_u32() as u64 | (again.next_u32() as u64) << 32,
            first
        );
    }

    #[test]
    fn choice_matches_numpy() {
        // np.random.default_rng(12345).choice(10, size=(2, 10))
        let mut rng = NumpyPcg64::new(12345);
        let mut row = [0u32; 10];
        rng.choice_into(10, &mut row);
        assert_eq!(row, [6, 2, 7, 3, 2, 7, 6, 6, 9, 3]);
        rng.choice_into(10, &mut row);
        assert_eq!(row, [8, 3, 5, 5, 2, 1, 2, 6, 6, 9]);
        // n == 1 draws nothing.
        let mut rng = NumpyPcg64::new(12345);
        assert_eq!(rng.below(1), 0);
        assert_eq!(rng.below(10), 6);
    }

    #[test]
    fn bools_match_numpy() {
        // np.random.default_rng(12345).integers(2, size=12, dtype=bool).astype(int)
        let mut rng = NumpyPcg64::new(12345);
        let mut bools = NumpyBools::default();
        let got: Vec<u8> = (0..12).map(|_| bools.next(&mut rng) as u8).collect();
        assert_eq!(got, [1, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0]);
    }

    #[test]
    fn numpy_pairwise_sum_small_and_blocked() {
        let v: Vec<f64> = (0..1000).map(|i| 0.1 * i as f64).collect();
        let s = numpy_pairwise_sum(&v);
        assert!((s - 49950.0).abs() < 1e-6);
        assert_eq!(numpy_pairwise_sum(&[1.0, 2.0]), 3.0);
    }

    fn toy_stats() -> Vec<BleuStats> {
        (0..50)
            .map(|i| {
                let c = 10 + i % 7;
                let m1 = c - i % 4;
                BleuStats {
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
        let a = bootstrap_confidence(&stats, &cfg, 1000, SACREBLEU_SEED).unwrap();
        let b = bootstrap_confidence(&stats, &cfg, 1000, SACREBLEU_SEED).unwrap();
        assert_eq!(a, b);
        assert!(a.lower <= a.score && a.score <= a.upper, "{a:?}");
        assert!(a.ci > 0.0 && (a.mean - a.score).abs() < a.ci);
        let c = bootstrap_confidence(&stats, &cfg, 1000, 7).unwrap();
        assert_ne!(a.mean, c.mean);
    }

    #[test]
    fn paired_tests_give_p_values_in_range() {
        let bl = toy_stats();
        let sys: Vec<BleuStats> = bl
            .iter()
            .map(|s| BleuStats {
                matches: s.matches.iter().map(|m| m.saturating_sub(1)).collect(),
                ..s.clone()
            })
            .collect();
        let cfg = BleuConfig::default();
        let (blc, res) = paired_bootstrap(&bl, &sys, &cfg, 500, 12345).unwrap();
        assert!(res.p_value > 0.0 && res.p_value <= 1.0);
        assert!(res.p_value < 0.05, "{res:?}");
        assert!(blc.score > res.score);
        // A system against itself: no resample differs by more than 0, p = 1/(n+1) (sacrebleu's
        // strict `>`).
        let (_, same) = paired_bootstrap(&bl, &bl, &cfg, 200, 12345).unwrap();
        assert_eq!(same.p_value, 1.0 / 201.0);
        let ar = paired_approximate_randomization(&bl, &sys, &cfg, 1000, 12345).unwrap();
        assert!(ar.p_value > 0.0 && ar.p_value < 0.05, "{ar:?}");
        let ar_same = paired_approximate_randomization(&bl, &bl, &cfg, 100, 12345).unwrap();
        assert_eq!(ar_same.p_value, 1.0 / 101.0);
    }

    #[test]
    fn errors_name_the_argument() {
        let stats = toy_stats();
        let cfg = BleuConfig::default();
        let e = bootstrap_confidence(&stats, &cfg, 0, 1).unwrap_err();
        assert!(e.to_string().contains("n_samples"));
        let e = bootstrap_confidence(&[], &cfg, 10, 1).unwrap_err();
        assert!(e.to_string().contains("stats"));
        let e = paired_bootstrap(&stats, &stats[..3], &cfg, 10, 1).unwrap_err();
        assert!(e.to_string().contains("same number of segments"));
        let e = bootstrap_confidence(&stats, &BleuConfig::nltk(1), 10, 1).unwrap_err();
        assert!(e.to_string().contains("cfg.smoothing"));
    }

    #[test]
    fn exact_mean_is_correctly_rounded() {
        assert_eq!(exact_mean(&[0.1, 0.2, 0.3]), 0.2);
        assert_eq!(exact_mean(&[1e16, 1.0, -1e16]), 1.0 / 3.0);
    }
}
