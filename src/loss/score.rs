//! From statistics to the loss: smoothing, the guards, the brevity penalty, the reduction
//! (SPEC §2, "Score and loss").

use super::{BleuLossConfig, BleuStats, LossSmoothing, Reduction};
use candle_core::{bail, DType, Result, Tensor};

/// Ratios below this are floored before the log (gradient 0 below the floor).
pub const PRECISION_FLOOR: f64 = 1e-30;

/// The effective reference length of each element: the reference length closest to the
/// hypothesis length `c`, the shorter on a tie (sacrebleu and NLTK). A constant: no gradient
/// flows through the choice.
pub(crate) fn closest_reference_lengths(hyp_len: &[f64], ref_lengths: &[Vec<usize>]) -> Vec<f64> {
    hyp_len
        .iter()
        .zip(ref_lengths)
        .map(|(&c, lengths)| {
            lengths
                .iter()
                .map(|&r| r as f64)
                .min_by(|a, b| (a - c).abs().total_cmp(&(b - c).abs()).then(a.total_cmp(b)))
                .unwrap_or(0.0)
        })
        .collect()
}

/// The order weights `w_n`: the configured ones, or `1/N` each.
pub(crate) fn order_weights(cfg: &BleuLossConfig) -> Vec<f64> {
    match &cfg.weights {
        Some(weights) => weights.clone(),
        None => vec![1.0 / cfg.max_order as f64; cfg.max_order],
    }
}

/// Checks `max_order`, `weights` and the smoothing constant.
pub(crate) fn validate_config(cfg: &BleuLossConfig) -> Result<()> {
    if let Err(e) = crate::orders::check_orders(cfg.max_order, cfg.weights.as_deref()) {
        bail!("BleuLossConfig: `{}` {}", e.field, e.message);
    }
    if let LossSmoothing::AddK(k) = cfg.smoothing {
        if !k.is_finite() || k < 0.0 {
            bail!("BleuLossConfig: `smoothing` AddK({k}) needs a finite k >= 0");
        }
    }
    Ok(())
}

/// `β(C, L) = min(0, 1 - L/C)` for `C >= 1`, continued linearly below one token:
/// `min(0, 1 - 2L + L C)` for `C < 1` (value and slope of the first branch at `C = 1`).
pub fn log_brevity_penalty(hyp_len: &Tensor, ref_len: &Tensor) -> Result<Tensor> {
    let long_enough = hyp_len.ge(1.0)?;
    let safe_hyp_len = long_enough.where_cond(hyp_len, &hyp_len.ones_like()?)?;
    let above_one = ref_len.div(&safe_hyp_len)?.affine(-1.0, 1.0)?;
    let below_one = ref_len
        .mul(hyp_len)?
        .sub(&ref_len.affine(2.0, 0.0)?)?
        .affine(1.0, 1.0)?;
    long_enough.where_cond(&above_one, &below_one)?.minimum(0.0)
}

/// `Σ_n w_n log p̃_n` over the last dimension of `[K, N]` statistics, with the guards: an order
/// with `t_n = 0` (below `tiny`, the smallest normal number of the caller's dtype)
/// contributes 0, ratios are floored at [`PRECISION_FLOOR`].
fn weighted_log_precisions(
    matches: &Tensor,
    totals: &Tensor,
    tiny: f64,
    cfg: &BleuLossConfig,
) -> Result<Tensor> {
    let (dtype, device) = (matches.dtype(), matches.device());
    let order_count = cfg.max_order;
    let additive: Vec<f64> = match cfg.smoothing {
        // BLEU+1 (Lin & Och 2004): add k to numerator and denominator of orders >= 2.
        LossSmoothing::AddK(k) => (0..order_count)
            .map(|n| if n == 0 { 0.0 } else { k })
            .collect(),
        LossSmoothing::None => vec![0.0; order_count],
    };
    let additive = Tensor::from_vec(additive, order_count, device)?.to_dtype(dtype)?;
    // `t_n = 0` means below the smallest normal number of the caller's dtype: the gradient
    // of `m / t` scales like `1 / t` and `m / t²`, which overflow (or, squared, underflow to
    // a 0/0) once `t` leaves the normal range, and a single NaN poisons every weight. A
    // statistic that small carries no information that dtype can represent anyway.
    let has_ngrams = totals.ge(tiny)?;
    let ones = totals.ones_like()?;
    // Likewise a match count below the normal range is 0: its ratio is floored (gradient 0)
    // instead of giving a `1 / m` that overflows when cast back to the caller's dtype.
    let matches = matches
        .ge(tiny)?
        .where_cond(matches, &matches.zeros_like()?)?;
    let numerator = has_ngrams.where_cond(&matches.broadcast_add(&additive)?, &ones)?;
    let denominator = has_ngrams.where_cond(&totals.broadcast_add(&additive)?, &ones)?;
    let log_precision = numerator
        .div(&denominator)?
        .maximum(PRECISION_FLOOR)?
        .log()?;
    let weights = Tensor::from_vec(order_weights(cfg), order_count, device)?.to_dtype(dtype)?;
    log_precision.broadcast_mul(&weights)?.sum(1)
}

/// The loss `-log BLEU` from per-element statistics (SPEC §2).
///
/// # Arguments
/// * `stats` - [`BleuStats`]: `matches` and `totals` float `[B, N]` (`m_n` and `t_n` of each
///   element), `hyp_len` and `ref_len` float `[B]` (`c` and the effective reference length).
/// * `cfg` - `max_order` (= N), weights, smoothing and reduction are used.
///
/// `Corpus` sums the statistics over the batch and scores once; `SentenceMean` scores each
/// element and averages the losses. Returns a scalar in the dtype of `matches` (f32 for f16
/// and bf16 statistics, which are upcast).
///
/// Errors (naming the argument and its shape or dtype) on wrong shapes, an empty batch,
/// non-float statistics, NaN or infinite values, or an invalid config.
///
/// Because the corpus loss depends on the batch only through these sums, data-parallel
/// workers can all-reduce (sum) their statistics and call this on the totals: every worker
/// gets the same loss, and the gradient flows back to its own shard's statistics.
pub fn loss_from_stats(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<Tensor> {
    let BleuStats {
        matches,
        totals,
        hyp_len,
        ref_len,
    } = stats;
    validate_config(cfg)?;
    let (batch, orders) = match matches.dims() {
        &[b, n] => (b, n),
        dims => bail!("loss_from_stats: `stats.matches` must be [B, N], got shape {dims:?}"),
    };
    if orders != cfg.max_order {
        bail!(
            "loss_from_stats: `stats.matches` has {orders} orders (shape {:?}) but `max_order` is {}",
            matches.dims(),
            cfg.max_order
        );
    }
    if totals.dims() != matches.dims() {
        bail!(
            "loss_from_stats: `stats.totals` has shape {:?}, `stats.matches` {:?}",
            totals.dims(),
            matches.dims()
        );
    }
    for (name, t) in [("hyp_len", hyp_len), ("ref_len", ref_len)] {
        if t.dims() != [batch] {
            bail!(
                "loss_from_stats: `stats.{name}` must be [{batch}], got shape {:?}",
                t.dims()
            );
        }
    }
    if batch == 0 {
        bail!(
            "loss_from_stats: empty batch (`stats.matches` has shape {:?})",
            matches.dims()
        );
    }
    for (name, t) in [
        ("matches", matches),
        ("totals", totals),
        ("hyp_len", hyp_len),
        ("ref_len", ref_len),
    ] {
        if !t.dtype().is_float() {
            bail!(
                "loss_from_stats: `stats.{name}` must be a float tensor, got {:?} with shape {:?}",
                t.dtype(),
                t.dims()
            );
        }
        // A NaN or infinite statistic would silently give a NaN loss and NaN gradients.
        let total = super::host::to_scalar::<f64>(&t.to_dtype(DType::F64)?.sum_all()?)?;
        if !total.is_finite() {
            bail!(
                "loss_from_stats: `stats.{name}` contains NaN or infinite values (shape {:?})",
                t.dims()
            );
        }
    }
    // The score is computed in f64 whatever the statistics' dtype: on [B, N] numbers it costs
    // nothing, and it keeps the backward of `m / t` (which squares `t`) finite for f32
    // statistics as small as f32's normal range (SoftEos/NotEos totals can be ~1e-25).
    // PRECISION_FLOOR (1e-30) would also be 0 in f16. The loss goes back to the caller's
    // compute dtype (f32 for f16/bf16), and so does the gradient.
    let out_dtype = compute_dtype(matches.dtype())?;
    let tiny = match out_dtype {
        DType::F64 => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    };
    let dtype = DType::F64;
    let matches = &matches.to_dtype(dtype)?;
    let (totals, hyp_len, ref_len) = (
        totals.to_dtype(dtype)?,
        hyp_len.to_dtype(dtype)?,
        ref_len.to_dtype(dtype)?,
    );
    let (matches, totals, hyp_len, ref_len) = match cfg.reduction {
        Reduction::Corpus => (
            matches.sum_keepdim(0)?,
            totals.sum_keepdim(0)?,
            hyp_len.sum_keepdim(0)?,
            ref_len.sum_keepdim(0)?,
        ),
        Reduction::SentenceMean => (matches.clone(), totals, hyp_len, ref_len),
    };
    let log_bleu = log_brevity_penalty(&hyp_len, &ref_len)?
        .add(&weighted_log_precisions(&matches, &totals, tiny, cfg)?)?;
    log_bleu.mean_all()?.neg()?.to_dtype(out_dtype)
}

/// Upcasts half precision to f32; f32 and f64 stay as they are.
pub(crate) fn compute_dtype(dtype: DType) -> Result<DType> {
    match dtype {
        DType::F32 | DType::F64 => Ok(dtype),
        DType::F16 | DType::BF16 => Ok(DType::F32),
        other => bail!("expected a float tensor, got {other:?}"),
    }
}
