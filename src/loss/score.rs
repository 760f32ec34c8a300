//! From statistics to the loss: smoothing, the guards, the brevity penalty, the reduction
//! (docs/loss.md, §10 Score: smoothing, brevity penalty, guards).

use super::config::{constant, BleuLossConfig, BleuStats, LossSmoothing, Reduction};
use super::host;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Ratios below this are floored before the log (gradient 0 below the floor).
pub const PRECISION_FLOOR: f64 = 1e-30;

/// The effective reference length of each element: the reference length closest to the
/// hypothesis length `c`, the shorter on a tie (sacrebleu and NLTK), chosen with tensor ops on
/// the device. A constant: no gradient flows through the choice.
///
/// * `hyp_len` - float `[B]`;
/// * `ref_lengths` - float `[B, R]` in the dtype of `hyp_len`, `ref_mask` u8 `[B, R]` (1 where a
///   reference is). Distances are taken in that dtype, so a tie between fractional lengths is a
///   tie of its rounded distances.
pub(crate) fn closest_reference_lengths(
    hyp_len: &Tensor,
    ref_lengths: &Tensor,
    ref_mask: &Tensor,
) -> Result<Tensor> {
    let far = Tensor::full(f32::INFINITY, ref_lengths.shape(), ref_lengths.device())?
        .to_dtype(ref_lengths.dtype())?;
    let distance = ref_lengths
        .broadcast_sub(&hyp_len.detach().unsqueeze(1)?)?
        .abs()?;
    // Padding is infinitely far; every element has a reference, so its nearest is finite.
    let distance = ref_mask.where_cond(&distance, &far)?;
    let nearest = distance.min_keepdim(1)?;
    let is_nearest = distance.broadcast_eq(&nearest)?;
    is_nearest.where_cond(ref_lengths, &far)?.min(1)
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
    let additive = constant(additive, order_count, dtype, device)?;
    // `t_n = 0` means below the smallest normal number of the caller's dtype: the gradient
    // of `log t` scales like `1 / t`, which overflows once `t` leaves the normal range, and a
    // single NaN poisons every weight. A statistic that small carries no information that
    // dtype can represent anyway.
    let has_ngrams = totals.ge(tiny)?;
    let ones = totals.ones_like()?;
    // Likewise a match count below the normal range is 0: its ratio is floored (gradient 0)
    // instead of giving a `1 / m` that overflows when cast back to the caller's dtype.
    let matches = matches
        .ge(tiny)?
        .where_cond(matches, &matches.zeros_like()?)?;
    let numerator = has_ngrams.where_cond(&matches.broadcast_add(&additive)?, &ones)?;
    let denominator = has_ngrams.where_cond(&totals.broadcast_add(&additive)?, &ones)?;
    // log(n / d) as log n - log d: the backward of a quotient squares d (`n / d²`), which
    // underflows in f32 for d below ~1e-19 (NotEos/SoftEos totals reach 1e-25); the logs'
    // backward divides by d once, finite down to f32's smallest normal number. So the f32
    // score (devices without f64) has the f64 score's guards. A zero numerator (k = 0, no
    // match) takes the floor directly: its log is never formed, so no `1 / 0` reaches autograd.
    let log_floor = PRECISION_FLOOR.ln();
    let matched = numerator.ge(tiny)?;
    let safe_numerator = matched.where_cond(&numerator, &ones)?;
    let log_ratio = safe_numerator.log()?.sub(&denominator.log()?)?;
    let log_precision = matched
        .where_cond(&log_ratio, &ones.affine(0.0, log_floor)?)?
        .maximum(log_floor)?;
    let weights = constant(order_weights(cfg), order_count, dtype, device)?;
    log_precision.broadcast_mul(&weights)?.sum(1)
}

/// The dtype the score is computed in: f64 where the device has it, f32 on Metal (whose
/// backend has no f64).
pub(crate) fn score_dtype(device: &Device) -> DType {
    if device.is_metal() {
        DType::F32
    } else {
        DType::F64
    }
}

/// The loss `-log BLEU` from per-element statistics (docs/loss.md, §Score and loss).
///
/// # Arguments
/// * `stats` - [`BleuStats`]: `matches` and `totals` float `[B, N]` (`m_n` and `t_n` of each
///   element), `hyp_len` and `ref_len` float `[B]` (`c` and the effective reference length),
///   all on one device.
/// * `cfg` - `max_order` (= N), weights, smoothing, reduction and `check_values` are used.
///
/// `Corpus` sums the statistics over the batch and scores once; `SentenceMean` scores each
/// element and averages the losses. Returns a scalar in the dtype of `matches` (f32 for f16
/// and bf16 statistics, which are upcast). The score runs in f64 where the device has it and
/// in f32 on Metal, with the same guards (tiny totals and matches count as zero, ratios are
/// floored at [`PRECISION_FLOOR`]).
///
/// Errors (naming the argument and its shape or dtype) on wrong shapes, an empty batch,
/// non-float statistics, statistics on different devices, an invalid config, or NaN or
/// infinite values — checked in place on the CPU; on other devices only with
/// `cfg.check_values` (one device-to-host copy per statistic), since the check needs the data
/// on the host.
///
/// Because the corpus loss depends on the batch only through these sums, data-parallel
/// workers can all-reduce (sum) their statistics and call this on the totals: every worker
/// gets the same loss, and the gradient flows back to its own shard's statistics.
///
/// ```
/// use candle_bleu::loss::{bleu_loss_from_logits, loss_from_stats, BleuLossConfig, BleuStats, References};
/// use candle_core::{DType, Device, Tensor};
///
/// let dev = Device::Cpu;
/// let cfg = BleuLossConfig::default();
/// let ids = Tensor::new(&[[1u32, 2, 3, 4], [2, 3, 4, 5]], &dev)?;
/// let logits = Tensor::randn(0f32, 1., (2, 4, 6), &dev)?;
/// // Two workers, one element each: each computes its shard's statistics...
/// let shard = |b: usize| -> candle_core::Result<BleuStats> {
///     let refs = References::from_ids(&ids.narrow(0, b, 1)?, 0)?;
///     Ok(bleu_loss_from_logits(&logits.narrow(0, b, 1)?, None, &refs, &cfg)?.stats)
/// };
/// let (a, b) = (shard(0)?, shard(1)?);
/// // ...the statistics are all-reduced (summed over workers; here: concatenated)...
/// let cat = |x: &Tensor, y: &Tensor| Tensor::cat(&[x, y], 0);
/// let all = BleuStats {
///     matches: cat(&a.matches, &b.matches)?,
///     totals: cat(&a.totals, &b.totals)?,
///     hyp_len: cat(&a.hyp_len, &b.hyp_len)?,
///     ref_len: cat(&a.ref_len, &b.ref_len)?,
/// };
/// // ...and every worker scores the same corpus: the full batch's loss.
/// let reduced = loss_from_stats(&all, &cfg)?.to_scalar::<f32>()?;
/// let refs = References::from_ids(&ids, 0)?;
/// let full = bleu_loss_from_logits(&logits, None, &refs, &cfg)?.loss.to_scalar::<f32>()?;
/// assert!((reduced - full).abs() < 1e-6);
/// # Ok::<(), candle_core::Error>(())
/// ```
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
        if !t.device().same_device(matches.device()) {
            bail!(
                "loss_from_stats: `stats.{name}` is on {:?} but `stats.matches` on {:?}",
                t.device(),
                matches.device()
            );
        }
    }
    check_stats_values("loss_from_stats: ", stats, cfg.check_values)?;
    score(stats, cfg)
}

/// Errors unless every statistic is finite and `>= 0` (on the CPU always, elsewhere when
/// `check_off_cpu`; see [`BleuLossConfig::check_values`]). No text gives a negative count or
/// length: negative values would be scored as a finite, wrong loss, and a NaN or infinite one
/// would give a NaN loss and NaN gradients. `context` prefixes the message.
pub(crate) fn check_stats_values(
    context: &str,
    stats: &BleuStats,
    check_off_cpu: bool,
) -> Result<()> {
    let named = [
        ("matches", &stats.matches),
        ("totals", &stats.totals),
        ("hyp_len", &stats.hyp_len),
        ("ref_len", &stats.ref_len),
    ];
    for (name, t) in named {
        match host::finite_and_nonnegative(t, check_off_cpu)? {
            Some((false, _)) => bail!(
                "{context}`stats.{name}` contains NaN or infinite values (shape {:?})",
                t.dims()
            ),
            Some((true, false)) => bail!(
                "{context}`stats.{name}` contains negative values (shape {:?}): counts and \
                 lengths are >= 0",
                t.dims()
            ),
            _ => {}
        }
    }
    Ok(())
}

/// [`loss_from_stats`] on statistics known to be well formed (from the loss itself).
///
/// The score is computed in f64 where the device has it, whatever the statistics' dtype: on
/// [B, N] numbers it costs nothing. PRECISION_FLOOR (1e-30) would be 0 in f16. The loss goes
/// back to the caller's compute dtype (f32 for f16/bf16), and so does the gradient.
pub(crate) fn score(stats: &BleuStats, cfg: &BleuLossConfig) -> Result<Tensor> {
    score_in(stats, cfg, score_dtype(stats.matches.device()))
}

/// [`score`] computed in `dtype` (f64, or f32 as on Metal).
fn score_in(stats: &BleuStats, cfg: &BleuLossConfig, dtype: DType) -> Result<Tensor> {
    let out_dtype = compute_dtype(stats.matches.dtype())?;
    let tiny = match (out_dtype, dtype) {
        (DType::F64, DType::F64) => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    };
    let (matches, totals, hyp_len, ref_len) = (
        stats.matches.to_dtype(dtype)?,
        stats.totals.to_dtype(dtype)?,
        stats.hyp_len.to_dtype(dtype)?,
        stats.ref_len.to_dtype(dtype)?,
    );
    let (matches, totals, hyp_len, ref_len) = match cfg.reduction {
        Reduction::Corpus => (
            matches.sum_keepdim(0)?,
            totals.sum_keepdim(0)?,
            hyp_len.sum_keepdim(0)?,
            ref_len.sum_keepdim(0)?,
        ),
        Reduction::SentenceMean => (matches, totals, hyp_len, ref_len),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_score_runs_in_f64_except_on_metal() {
        assert_eq!(score_dtype(&Device::Cpu), DType::F64);
    }

    /// The f32 score (Metal's path) against the f64 one on extreme statistics: every
    /// reduction and smoothing, counts from 0 to 1e30 and totals down to 1e-25 (the EOS length
    /// models' order-4 totals in f32). The same loss to 1e-5 relative (1e-6 absolute near 0)
    /// and finite gradients.
    #[test]
    fn the_f32_score_matches_the_f64_score_on_extreme_statistics() -> Result<()> {
        let dev = Device::Cpu;
        // (matches, totals, hyp_len, ref_len) of two elements, N = 2.
        type Case = ([[f64; 2]; 2], [[f64; 2]; 2], [f64; 2], [f64; 2]);
        let cases: [Case; 6] = [
            (
                [[0.0, 0.0], [0.0, 0.0]],
                [[0.0, 0.0], [0.0, 0.0]],
                [0.0, 0.0],
                [3.0, 4.0],
            ),
            (
                [[1.0, 5e-26], [2.0, 1.0]],
                [[2.0, 1e-25], [3.0, 2.0]],
                [2.0, 3.0],
                [2.0, 4.0],
            ),
            (
                [[3.0, 2.0], [4.0, 3.0]],
                [[3.0, 2.0], [4.0, 3.0]],
                [3.0, 4.0],
                [3.0, 4.0],
            ),
            (
                [[1e30, 1e29], [1e30, 1e29]],
                [[1e30, 1e30], [1e30, 1e30]],
                [1e30, 1e30],
                [2e30, 1e30],
            ),
            (
                [[0.5, 0.0], [0.0, 0.0]],
                [[0.9, 1e-7], [1e-3, 0.0]],
                [0.9, 1e-3],
                [5.0, 1.0],
            ),
            (
                [[7.0, 0.0], [1.0, 0.0]],
                [[9.0, 8.0], [1.0, 0.0]],
                [9.0, 1.0],
                [12.0, 1.0],
            ),
        ];
        for (matches, totals, hyp_len, ref_len) in cases {
            for reduction in [Reduction::Corpus, Reduction::SentenceMean] {
                for smoothing in [
                    LossSmoothing::None,
                    LossSmoothing::AddK(1.0),
                    LossSmoothing::AddK(0.1),
                ] {
                    let cfg = BleuLossConfig {
                        max_order: 2,
                        reduction,
                        smoothing,
                        ..Default::default()
                    };
                    let totals_var = candle_core::Var::from_tensor(
                        &Tensor::new(&totals, &dev)?.to_dtype(DType::F32)?,
                    )?;
                    let stats = BleuStats {
                        matches: Tensor::new(&matches, &dev)?.to_dtype(DType::F32)?,
                        totals: totals_var.as_tensor().clone(),
                        hyp_len: Tensor::new(&hyp_len, &dev)?.to_dtype(DType::F32)?,
                        ref_len: Tensor::new(&ref_len, &dev)?.to_dtype(DType::F32)?,
                    };
                    let f64_loss = score_in(&stats, &cfg, DType::F64)?.to_scalar::<f32>()?;
                    let f32_loss = score_in(&stats, &cfg, DType::F32)?;
                    let what = format!("{matches:?} {totals:?} {reduction:?} {smoothing:?}");
                    let f32_value = f32_loss.to_scalar::<f32>()?;
                    assert!(f64_loss.is_finite() && f32_value.is_finite(), "{what}");
                    assert!(
                        (f32_value - f64_loss).abs() <= 1e-5 * f64_loss.abs().max(0.1),
                        "{what}: f32 score {f32_value} vs f64 score {f64_loss}"
                    );
                    if let Some(grad) = f32_loss.backward()?.get(&totals_var) {
                        let grad = grad.flatten_all()?.to_vec1::<f32>()?;
                        assert!(grad.iter().all(|g| g.is_finite()), "{what}: {grad:?}");
                    }
                }
            }
        }
        Ok(())
    }

    /// Totals of 1e-25 (NotEos/SoftEos order-4 totals in f32): the quotient's backward would
    /// square them to 0 in f32; the log-difference form keeps the f32 gradient finite.
    #[test]
    fn f32_score_of_tiny_totals_has_finite_gradients() -> Result<()> {
        let cfg = BleuLossConfig {
            max_order: 2,
            smoothing: LossSmoothing::None,
            ..Default::default()
        };
        let totals = candle_core::Var::new(&[[2f32, 1e-25]], &Device::Cpu)?;
        let stats = BleuStats {
            matches: Tensor::new(&[[1f32, 5e-26]], &Device::Cpu)?,
            totals: totals.as_tensor().clone(),
            hyp_len: Tensor::new(&[2f32], &Device::Cpu)?,
            ref_len: Tensor::new(&[2f32], &Device::Cpu)?,
        };
        let loss = score_in(&stats, &cfg, DType::F32)?;
        // -(½ log ½ + ½ log ½) = log 2.
        assert!((loss.to_scalar::<f32>()? - std::f32::consts::LN_2).abs() < 1e-6);
        let grad = loss.backward()?.get(&totals).unwrap().to_vec2::<f32>()?;
        assert!(grad[0].iter().all(|g| g.is_finite()), "{grad:?}");
        // d/dt (-½ log(m/t)) = ½ / t.
        assert!((grad[0][0] - 0.25).abs() < 1e-6 && (grad[0][1] / 5e24 - 1.0).abs() < 1e-5);
        Ok(())
    }
}
