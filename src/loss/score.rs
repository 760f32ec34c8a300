//! From finished sums to the loss: smoothing, the guards, the brevity penalty, `-log BLEU`
//! (docs/loss.md, §10 Score: smoothing, brevity penalty, guards).
//!
//! The bottom of the path: the reduction stage (`reduce`) decides what is summed where — over
//! this process's batch, or over a data-parallel group — and hands the rows to score to
//! [`neg_log_bleu`]; nothing here sums over a batch or a group, checks statistics, or calls
//! back up. The checks of statistics a caller gives are `checked`'s. The score runs as one op
//! (`kernels::score`, its CPU and CUDA kernels) or as the composed ops below, its reference
//! ([`neg_log_bleu_composed`]); the dispatch chooses.

use super::config::{constant, BleuLossConfig, BleuStats, LossSmoothing};
use super::kernels::score::args::ScoreArgs;
use super::kernels::score::op::ScoreOp;
use candle_core::{bail, DType, Result, Tensor};

/// Ratios below this are floored before the log (gradient 0 below the floor).
pub const PRECISION_FLOOR: f64 = 1e-30;

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

/// `-log BLEU` of finished sums, averaged over their rows: the loss of one corpus (`rows` the
/// statistics summed over the batch, and over the group in data-parallel training: `[1, N]`
/// and `[1]`) or the mean of the sentences' losses (`rows` each element's: `[B, N]` and `[B]`).
///
/// * `rows` - [`BleuStats`] in the dtype the score is taken in (`config::sum_dtype`: f64, or
///   f32 on Metal), on one device, checked and well formed (`checked` for a caller's).
/// * `guard_dtype` - the compute dtype of the statistics the rows came from, which sets the
///   guards: a total or match below its smallest normal number counts as 0 (f64's only when
///   both it and `rows` are f64, else f32's; docs/design.md, "`t_n = 0` means below the smallest
///   normal number of the caller's dtype").
/// * `on_kernel` - whether the score runs as one op (`kernels::score`, the dispatch's
///   `Path::runs_score_kernel`): the rows packed into `[K, 2N + 2]` and scored by its CPU or CUDA
///   kernel, one op each way; else [`neg_log_bleu_composed`], the same numbers to rounding.
///
/// Returns a scalar in the dtype of `rows`; the caller casts it to its compute dtype.
pub(crate) fn neg_log_bleu(
    rows: &BleuStats,
    cfg: &BleuLossConfig,
    guard_dtype: DType,
    on_kernel: bool,
) -> Result<Tensor> {
    if !on_kernel {
        return neg_log_bleu_composed(rows, cfg, guard_dtype);
    }
    neg_log_bleu_packed(&packed_rows(rows)?, cfg, guard_dtype)
}

/// The statistics as the score op's rows `[K, 2N + 2]` = `[m | t | C | L]`, one `cat`, in their
/// own dtype.
pub(crate) fn packed_rows(stats: &BleuStats) -> Result<Tensor> {
    Tensor::cat(
        &[
            &stats.matches,
            &stats.totals,
            &stats.hyp_len.unsqueeze(1)?,
            &stats.ref_len.unsqueeze(1)?,
        ],
        1,
    )
}

/// [`neg_log_bleu`] on its kernel, from rows already packed ([`packed_rows`]), `[K, 2N + 2]` in
/// the dtype the score is taken in.
pub(crate) fn neg_log_bleu_packed(
    packed: &Tensor,
    cfg: &BleuLossConfig,
    guard_dtype: DType,
) -> Result<Tensor> {
    packed.apply_op1(ScoreOp::new(score_args(
        cfg,
        guard_tiny(guard_dtype, packed.dtype()),
    ))?)
}

/// The smallest statistic that counts: f64's smallest normal number when both the statistics'
/// compute dtype and the rows are f64, else f32's.
fn guard_tiny(guard_dtype: DType, rows_dtype: DType) -> f64 {
    match (guard_dtype, rows_dtype) {
        (DType::F64, DType::F64) => f64::MIN_POSITIVE,
        _ => f32::MIN_POSITIVE as f64,
    }
}

/// The score op's settings from the loss config: the additive constant of BLEU+1 (applied from
/// the second order), the order weights (`1/N` each by default), the guard and the floor.
fn score_args(cfg: &BleuLossConfig, tiny: f64) -> ScoreArgs {
    let orders = cfg.max_order;
    ScoreArgs {
        orders,
        additive: match cfg.smoothing {
            LossSmoothing::AddK(k) => k,
            LossSmoothing::None => 0.0,
        },
        weights: order_weights(cfg),
        tiny,
        log_floor: PRECISION_FLOOR.ln(),
    }
}

/// The order weights `w_n`: the configured ones, or `1/N` each.
fn order_weights(cfg: &BleuLossConfig) -> Vec<f64> {
    match &cfg.weights {
        Some(weights) => weights.clone(),
        None => vec![1.0 / cfg.max_order as f64; cfg.max_order],
    }
}

/// [`neg_log_bleu`] as composed candle ops: the reference the score op (`kernels::score`) is
/// tested against, and what devices without its kernels run.
pub(crate) fn neg_log_bleu_composed(
    rows: &BleuStats,
    cfg: &BleuLossConfig,
    guard_dtype: DType,
) -> Result<Tensor> {
    let tiny = guard_tiny(guard_dtype, rows.matches.dtype());
    let log_bleu = log_brevity_penalty(&rows.hyp_len, &rows.ref_len)?.add(
        &weighted_log_precisions(&rows.matches, &rows.totals, tiny, cfg)?,
    )?;
    log_bleu.mean_all()?.neg()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::config::{sum_dtype, Reduction};
    use candle_core::{Device, Var};

    #[test]
    fn the_score_runs_in_f64_except_on_metal() {
        assert_eq!(sum_dtype(&Device::Cpu), DType::F64);
    }

    /// The single-process score of f32 statistics, taken in `dtype` (f64, or f32 as on Metal):
    /// the rows the reduction stage hands down (summed over the batch for `Corpus`), scored
    /// with f32's guards, the loss in f32; by the score op (`on_kernel`) or the composed ops.
    fn score_in(
        stats: &BleuStats,
        cfg: &BleuLossConfig,
        dtype: DType,
        on_kernel: bool,
    ) -> Result<Tensor> {
        let rows = |t: &Tensor| -> Result<Tensor> {
            let t = t.to_dtype(dtype)?;
            match cfg.reduction {
                Reduction::Corpus => t.sum_keepdim(0),
                Reduction::SentenceMean => Ok(t),
            }
        };
        let rows = BleuStats {
            matches: rows(&stats.matches)?,
            totals: rows(&stats.totals)?,
            hyp_len: rows(&stats.hyp_len)?,
            ref_len: rows(&stats.ref_len)?,
        };
        neg_log_bleu(&rows, cfg, DType::F32, on_kernel)?.to_dtype(DType::F32)
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
                    for on_kernel in [false, true] {
                        let f64_loss =
                            score_in(&stats, &cfg, DType::F64, on_kernel)?.to_scalar::<f32>()?;
                        let f32_loss = score_in(&stats, &cfg, DType::F32, on_kernel)?;
                        let what = format!(
                            "{matches:?} {totals:?} {reduction:?} {smoothing:?}, op {on_kernel}"
                        );
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
        for on_kernel in [false, true] {
            let totals = candle_core::Var::new(&[[2f32, 1e-25]], &Device::Cpu)?;
            let stats = BleuStats {
                matches: Tensor::new(&[[1f32, 5e-26]], &Device::Cpu)?,
                totals: totals.as_tensor().clone(),
                hyp_len: Tensor::new(&[2f32], &Device::Cpu)?,
                ref_len: Tensor::new(&[2f32], &Device::Cpu)?,
            };
            let loss = score_in(&stats, &cfg, DType::F32, on_kernel)?;
            // -(½ log ½ + ½ log ½) = log 2.
            assert!((loss.to_scalar::<f32>()? - std::f32::consts::LN_2).abs() < 1e-6);
            let grad = loss.backward()?.get(&totals).unwrap().to_vec2::<f32>()?;
            assert!(grad[0].iter().all(|g| g.is_finite()), "{grad:?}");
            // d/dt (-½ log(m/t)) = ½ / t.
            assert!((grad[0][0] - 0.25).abs() < 1e-6 && (grad[0][1] / 5e24 - 1.0).abs() < 1e-5);
        }
        Ok(())
    }

    /// Rows `[K, 2N + 2]` of the cases the score op must get exactly as the composed ops do:
    /// every guard and tie, then random rows. `N = 3`; `(rows, label)`.
    pub(crate) fn edge_rows() -> Vec<(Vec<[f64; 8]>, &'static str)> {
        let tiny = f32::MIN_POSITIVE as f64;
        let mut cases: Vec<(Vec<[f64; 8]>, &'static str)> = vec![
            (vec![[2.0, 1.0, 0.5, 3.0, 2.0, 1.0, 3.0, 4.0]], "short"),
            (
                vec![[3.0, 2.0, 1.0, 4.0, 3.0, 2.0, 4.0, 4.0]],
                "C = L, the brevity penalty's kink",
            ),
            (vec![[3.0, 2.0, 1.0, 4.0, 3.0, 2.0, 6.0, 4.0]], "long"),
            (
                vec![[0.5, 0.0, 0.0, 0.8, 0.0, 0.0, 0.8, 3.0]],
                "under one token",
            ),
            (
                vec![[0.5, 0.0, 0.0, 0.9, 0.0, 0.0, 0.5, 2.0]],
                "under one token, short",
            ),
            (
                vec![[1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]],
                "no bigrams, C = L = 1",
            ),
            (vec![[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.0]], "empty"),
            (
                vec![[2.0, 0.0, 1.0, 4.0, 3.0, 2.0, 4.0, 5.0]],
                "no bigram match",
            ),
            (
                vec![[2.0, tiny / 4.0, 1.0, 4.0, tiny / 2.0, 2.0, 4.0, 5.0]],
                "statistics below tiny",
            ),
            (
                vec![[2.0, 1e-40, 1.0, 4.0, 1.0, 2.0, 4.0, 5.0]],
                "a precision under the floor",
            ),
            (
                vec![[2.0, 1e-30, 1.0, 4.0, 1.0, 2.0, 4.0, 5.0]],
                "a precision at the floor",
            ),
            (
                vec![[5.0, 4.0, 3.0, 5.0, 4.0, 3.0, 5.0, 5.0]],
                "every n-gram matched, C = L",
            ),
            (
                vec![
                    [2.0, 1.0, 0.5, 3.0, 2.0, 1.0, 3.0, 4.0],
                    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
                    [4.0, 3.0, 1.0, 6.0, 5.0, 4.0, 6.0, 6.0],
                ],
                "three rows",
            ),
        ];
        let random: Vec<[f64; 8]> = (0..40u64)
            .map(|r| {
                let u = |i: u64| (((r * 8 + i) * 2654435761) % 1000) as f64 / 1000.0;
                let c = 1.0 + 30.0 * u(6);
                let t = [c, (c - 1.0).max(0.0), (c - 2.0).max(0.0)];
                [
                    t[0] * u(0),
                    t[1] * u(1),
                    t[2] * u(2),
                    t[0],
                    t[1],
                    t[2],
                    c,
                    1.0 + 30.0 * u(7),
                ]
            })
            .collect();
        cases.push((random, "forty random rows"));
        cases
    }

    /// The score op against the composed ops on [`edge_rows`], f64 and f32, every smoothing,
    /// default and uneven weights, f64's and f32's guards, both reductions' row counts: the loss
    /// and the gradient of every statistic to 1e-13 relative in f64 (1e-6 in f32).
    #[test]
    fn the_score_op_matches_the_composed_score() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, label) in edge_rows() {
            for dtype in [DType::F64, DType::F32] {
                for guard_dtype in [DType::F64, DType::F32] {
                    for smoothing in [
                        LossSmoothing::None,
                        LossSmoothing::AddK(1.0),
                        LossSmoothing::AddK(0.0),
                    ] {
                        for weights in [None, Some(vec![0.5, 0.3, 0.2])] {
                            let cfg = BleuLossConfig {
                                max_order: 3,
                                smoothing,
                                weights: weights.clone(),
                                ..Default::default()
                            };
                            let what = format!("{label}, {dtype:?} rows, {guard_dtype:?} guards, {smoothing:?}, {weights:?}");
                            let k = rows.len();
                            let flat: Vec<f64> = rows.iter().flatten().copied().collect();
                            let column = |from: usize, to: usize| -> Result<Var> {
                                let t = Tensor::from_vec(flat.clone(), (k, 8), &dev)?
                                    .narrow(1, from, to - from)?
                                    .to_dtype(dtype)?;
                                Var::from_tensor(&t)
                            };
                            let run = |on_kernel: bool| -> Result<(f64, Vec<f64>)> {
                                let (m, t) = (column(0, 3)?, column(3, 6)?);
                                let (c, l) = (column(6, 7)?, column(7, 8)?);
                                let stats = BleuStats {
                                    matches: m.as_tensor().clone(),
                                    totals: t.as_tensor().clone(),
                                    hyp_len: c.as_tensor().squeeze(1)?,
                                    ref_len: l.as_tensor().squeeze(1)?,
                                };
                                let loss = neg_log_bleu(&stats, &cfg, guard_dtype, on_kernel)?;
                                let grads = loss.backward()?;
                                let mut grad = Vec::new();
                                for v in [&m, &t, &c, &l] {
                                    let g = match grads.get(v.as_tensor()) {
                                        Some(g) => g
                                            .to_dtype(DType::F64)?
                                            .flatten_all()?
                                            .to_vec1::<f64>()?,
                                        None => vec![0.0; v.elem_count()],
                                    };
                                    grad.extend(g);
                                }
                                Ok((loss.to_dtype(DType::F64)?.to_scalar::<f64>()?, grad))
                            };
                            let (want, want_grad) = run(false)?;
                            let (got, got_grad) = run(true)?;
                            let rtol = if dtype == DType::F64 { 1e-13 } else { 1e-6 };
                            let close = |a: f64, b: f64| {
                                (a.is_nan() && b.is_nan())
                                    || (a - b).abs() <= rtol * (1.0 + b.abs())
                            };
                            assert!(close(got, want), "{what}: op {got}, composed {want}");
                            for (i, (g, w)) in got_grad.iter().zip(&want_grad).enumerate() {
                                assert!(
                                    close(*g, *w),
                                    "{what}: gradient {i}: op {g}, composed {w}"
                                );
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The op's backward against central differences of its own forward (the crate's gradcheck)
    /// in f64, away from the kinks: one corpus row and a batch of rows, both smoothings.
    #[test]
    fn the_score_op_passes_gradcheck() -> Result<()> {
        let dev = Device::Cpu;
        for (rows, smoothing) in [
            (
                vec![[3.0, 1.5, 0.7, 5.0, 4.0, 3.0, 5.0, 6.5]],
                LossSmoothing::None,
            ),
            (
                vec![
                    [3.0, 1.5, 0.7, 5.0, 4.0, 3.0, 5.0, 6.5],
                    [2.0, 1.0, 0.5, 4.0, 3.0, 2.0, 4.0, 3.0],
                    [0.5, 0.2, 0.1, 0.9, 0.3, 0.1, 0.9, 2.0],
                ],
                LossSmoothing::AddK(1.0),
            ),
        ] {
            let cfg = BleuLossConfig {
                max_order: 3,
                smoothing,
                ..Default::default()
            };
            let flat: Vec<f64> = rows.iter().flatten().copied().collect();
            let x = Tensor::from_vec(flat, (rows.len(), 8), &dev)?;
            let op = ScoreOp::new(score_args(&cfg, f64::MIN_POSITIVE))?;
            let report = crate::gradcheck::check_gradients(
                |x: &Tensor| x.apply_op1(op.clone()),
                &x,
                &crate::gradcheck::GradCheckConfig::default(),
            )?;
            assert!(report.passed, "{smoothing:?}: {report}");
            assert!(!report.gradient_missing && report.checked == x.elem_count());
        }
        Ok(())
    }
}
