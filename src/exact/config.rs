//! The exact metrics' vocabulary: the error type, the BLEU configuration, its statistics and
//! score. Every other file of `exact` imports these from here.

/// Errors of the exact metrics (BLEU and chrF): each names the offending argument and its value.
#[derive(Debug, Clone, PartialEq)]
pub enum MetricError {
    /// A malformed argument: which one, and what is wrong with it.
    InvalidArgument {
        /// The argument's name as in the signature (`"refs"`, `"cfg.max_order"`, ...).
        argument: &'static str,
        /// What is wrong with it, with the offending value, length or index.
        message: String,
    },
}

impl std::fmt::Display for MetricError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetricError::InvalidArgument { argument, message } => {
                write!(f, "invalid `{argument}`: {message}")
            }
        }
    }
}

impl std::error::Error for MetricError {}

/// The largest n-gram order accepted (`max_order` and [`BleuConfig::max_order`]).
///
/// BLEU uses 4; an order beyond the longest hypothesis only adds zero totals. The bound keeps
/// every per-order vector small, and lies past the order where NLTK's smoothing method 4
/// stops being computable (it raises `OverflowError` from its 1022nd order without a match).
pub const MAX_ORDER: usize = 1024;

/// Checks `1 <= max_order <= MAX_ORDER`, naming `argument` in the error.
pub(crate) fn check_max_order(argument: &'static str, max_order: usize) -> Result<(), MetricError> {
    if !(1..=MAX_ORDER).contains(&max_order) {
        return Err(invalid(
            argument,
            format!("must be in 1..={MAX_ORDER}, got {max_order}"),
        ));
    }
    Ok(())
}

pub(crate) fn invalid(argument: &'static str, message: impl Into<String>) -> MetricError {
    MetricError::InvalidArgument {
        argument,
        message: message.into(),
    }
}

/// How zero n-gram precisions are smoothed (sacrebleu's `smooth_method`), and with it whose
/// semantics apply.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmoothMethod {
    /// sacrebleu `none`: a zero-match order makes the score 0.
    None,
    /// sacrebleu `floor` (Chen & Cherry method 1): a zero-match order gets precision
    /// `value / t_n`. sacrebleu's default value is 0.1.
    Floor(f64),
    /// sacrebleu `add-k` (method 2): `(m_n + k) / (t_n + k)` for orders `n >= 2`, applied before
    /// the zero-total test (so `k > 0` makes an empty order 100%, `k = 0` stops there).
    /// sacrebleu's default `k` is 1.
    AddK(f64),
    /// sacrebleu `exp` (NIST, method 3): the i-th zero-match order gets `1 / (2^i · t_n)`.
    Exp,
    /// NLTK `SmoothingFunction().methodK`, K in 0..=7; the whole computation follows NLTK.
    Nltk(u8),
}

/// What to compute.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuConfig {
    /// Largest n-gram order `N` (>= 1).
    pub max_order: usize,
    /// Per-order weights, `max_order` of them, finite and >= 0; `None` = uniform `1/N`.
    pub weights: Option<Vec<f64>>,
    /// How zero precisions are smoothed, and with it whose semantics apply (sacrebleu's or
    /// NLTK's).
    pub smoothing: SmoothMethod,
    /// sacrebleu's `effective_order`: average only over the orders before the first one with
    /// zero total. Ignored under [`SmoothMethod::Nltk`].
    pub effective_order: bool,
}

/// sacrebleu's corpus default (`BLEU()`, `sacrebleu.corpus_bleu`): 4, uniform, `exp`, no
/// effective order.
impl Default for BleuConfig {
    fn default() -> Self {
        Self {
            max_order: 4,
            weights: None,
            smoothing: SmoothMethod::Exp,
            effective_order: false,
        }
    }
}

impl BleuConfig {
    /// sacrebleu's sentence default (`sacrebleu.sentence_bleu`): 4, `exp`, effective order.
    pub fn sacrebleu_sentence() -> Self {
        Self {
            effective_order: true,
            ..Self::default()
        }
    }

    /// NLTK's `corpus_bleu`/`sentence_bleu` with `SmoothingFunction().method{method}` and
    /// default weights `(0.25,) * 4`.
    pub fn nltk(method: u8) -> Self {
        Self {
            smoothing: SmoothMethod::Nltk(method),
            ..Self::default()
        }
    }

    /// Checks `max_order`, `weights` and the smoothing parameters.
    pub fn validate(&self) -> Result<(), MetricError> {
        check_max_order("cfg.max_order", self.max_order)?;
        crate::orders::check_orders(self.max_order, self.weights.as_deref()).map_err(|e| {
            let argument = match e.field {
                "max_order" => "cfg.max_order",
                _ => "cfg.weights",
            };
            invalid(argument, e.message)
        })?;
        match self.smoothing {
            SmoothMethod::Floor(v) if !v.is_finite() || v < 0.0 => Err(invalid(
                "cfg.smoothing",
                format!("Floor value must be finite and >= 0, got {v}"),
            )),
            SmoothMethod::AddK(k) if !k.is_finite() || k < 0.0 => Err(invalid(
                "cfg.smoothing",
                format!("AddK k must be finite and >= 0, got {k}"),
            )),
            SmoothMethod::Nltk(k) if k > 7 => Err(invalid(
                "cfg.smoothing",
                format!("NLTK smoothing method must be 0..=7, got {k}"),
            )),
            _ => Ok(()),
        }
    }

    /// The weights in use: the given ones, or uniform `1/N` (NLTK's `(0.25,) * 4` for N = 4).
    pub fn effective_weights(&self) -> Vec<f64> {
        match &self.weights {
            Some(w) => w.clone(),
            None => vec![1.0 / self.max_order as f64; self.max_order],
        }
    }
}

/// Sufficient statistics of BLEU, summable over segments (`+`, `+=`, `.sum()`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BleuCounts {
    /// Clipped matches `m_n`, orders `1..=N`.
    pub matches: Vec<u64>,
    /// Totals `t_n = max(0, c - n + 1)`, orders `1..=N`.
    pub totals: Vec<u64>,
    /// Hypothesis length `c`.
    pub hyp_len: u64,
    /// Effective (closest) reference length.
    pub ref_len: u64,
}

/// A BLEU score with everything sacrebleu and NLTK report.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuScore {
    /// BLEU on 0..=1 (sacrebleu: `score / 100`; NLTK: its float, which methods 5–7 can push
    /// above 1).
    pub bleu: f64,
    /// BLEU on 0..=100: sacrebleu's `score` exactly (identical strings give
    /// `100.00000000000004`, as in sacrebleu); NLTK: `100 · bleu`.
    pub score: f64,
    /// Smoothed precision per order, 0..=1 (orders after sacrebleu's zero-total stop are 0;
    /// NLTK: its smoothed `p_n` as floats, method0's zero orders as `2.2e-308`).
    pub precisions: Vec<f64>,
    /// The same on 0..=100; under sacrebleu semantics exactly sacrebleu's `precisions`.
    pub precisions_pct: Vec<f64>,
    /// Brevity penalty.
    pub bp: f64,
    /// `hyp_len / ref_len`, 0 when `ref_len == 0`.
    pub ratio: f64,
    /// Hypothesis length `c`, summed over the corpus.
    pub hyp_len: u64,
    /// Effective reference length `r` (closest per segment), summed over the corpus.
    pub ref_len: u64,
    /// Matches per order as the reference implementation reports them: sacrebleu's
    /// `counts` (add-k adds `k` to orders >= 2 up to the last order it reached, as sacrebleu
    /// mutates its list), NLTK's corpus numerators.
    pub counts: Vec<f64>,
    /// Totals per order as reported: sacrebleu's `totals` (add-k as above), NLTK's corpus
    /// denominators `Σ max(1, t_n)`.
    pub totals: Vec<f64>,
    /// Number of orders that entered the geometric mean: sacrebleu's `eff_order` (N without
    /// effective order); NLTK: orders with a positive smoothed precision.
    pub effective_order: usize,
}
