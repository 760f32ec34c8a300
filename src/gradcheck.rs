//! Finite-difference gradient checks against candle's autograd, for any scalar function of a
//! tensor. candle has none; its own tests compare gradients with hard-coded values.
//!
//! ```
//! use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
//! use candle_core::{Device, Tensor, D};
//!
//! let x = Tensor::new(&[[0.3f64, -1.2, 2.0], [0.1, 0.4, -0.7]], &Device::Cpu)?;
//! // log-sum-exp of a softmax-weighted sum: smooth everywhere.
//! let f = |x: &Tensor| candle_nn::ops::softmax(x, D::Minus1)?.mul(x)?.sum_all();
//! let report = check_gradients(f, &x, &GradCheckConfig::default())?;
//! assert!(report.passed, "{report}");
//! # Ok::<(), candle_core::Error>(())
//! ```
//!
//! # Staying off kinks
//! Central differences assume the function is smooth within `eps` of the point. Piecewise
//! functions are not at their switches, and autograd then picks one side (or, for candle's
//! `minimum`/`maximum` at an exact tie, half of each). For the BLEU loss the switches are:
//! - ties inside `min` (clipping, `min(κ_j, ν_j E_j)`; the lower bound's `min(1, ·)`): exact at
//!   one-hot inputs, so check at soft inputs (logits of moderate scale, e.g. N(0, 1)), where a
//!   tie has probability zero;
//! - the brevity penalty's switch at `C = L` and its `C = 1` branch point: with `Given` lengths
//!   `C` is a constant; with the EOS models keep `C` away from every reference length by more
//!   than `eps` times the gradient scale;
//! - the effective reference length, which jumps where `C` is equidistant from two references.
//!
//! The report names the worst coordinate, so a failure at a kink is easy to tell from a bug:
//! move the point and check again.

use candle_core::{bail, DType, Result, Tensor, Var};
use rand09::rngs::StdRng;
use rand09::seq::index::sample;
use rand09::SeedableRng;

/// Settings of [`check_gradients`].
#[derive(Debug, Clone, PartialEq)]
pub struct GradCheckConfig {
    /// Central-difference step (in f64). Default `1e-6`.
    pub eps: f64,
    /// Absolute tolerance. Default `1e-7`.
    pub atol: f64,
    /// Relative tolerance: a coordinate passes if `|analytic - numeric| <= atol + rtol |numeric|`.
    /// Default `1e-5`.
    pub rtol: f64,
    /// Check only this many coordinates, drawn at random without replacement (for large inputs).
    /// `None` (default) checks every coordinate.
    pub max_coordinates: Option<usize>,
    /// Seed of the coordinate draw.
    pub seed: u64,
}

impl Default for GradCheckConfig {
    fn default() -> Self {
        Self {
            eps: 1e-6,
            atol: 1e-7,
            rtol: 1e-5,
            max_coordinates: None,
            seed: 0,
        }
    }
}

/// The outcome of [`check_gradients`].
#[derive(Debug, Clone, PartialEq)]
pub struct GradCheckReport {
    /// Coordinates compared.
    pub checked: usize,
    /// Coordinates outside the tolerance.
    pub failures: usize,
    /// `max |analytic - numeric|`.
    pub max_abs_error: f64,
    /// `max |analytic - numeric| / max(|analytic|, |numeric|)` over coordinates where either is
    /// above `atol`.
    pub max_rel_error: f64,
    /// Multi-index of the coordinate with the largest excess over its tolerance.
    pub worst_index: Vec<usize>,
    /// Autograd's gradient at the worst coordinate.
    pub worst_analytic: f64,
    /// The central difference at the worst coordinate.
    pub worst_numeric: f64,
    /// Autograd returned no gradient for the input at all (every analytic entry was taken as
    /// 0): the function does not depend on it, or an op on the path has no backward (e.g.
    /// `candle_nn::ops::softmax_last_dim`).
    pub gradient_missing: bool,
    /// No coordinate failed.
    pub passed: bool,
}

impl std::fmt::Display for GradCheckReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({} of {} coordinates failed; max abs {:.3e}, max rel {:.3e}; worst at {:?}: autograd {:.6e} vs finite difference {:.6e}{})",
            if self.passed { "passed" } else { "FAILED" },
            self.failures,
            self.checked,
            self.max_abs_error,
            self.max_rel_error,
            self.worst_index,
            self.worst_analytic,
            self.worst_numeric,
            if self.gradient_missing { "; autograd returned NO gradient" } else { "" }
        )
    }
}

fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (slot, &dim) in index.iter_mut().zip(dims).rev() {
        *slot = flat % dim;
        flat /= dim;
    }
    index
}

fn scalar_value(out: &Tensor) -> Result<f64> {
    if out.elem_count() != 1 {
        bail!(
            "check_gradients: `f` must return a scalar, got shape {:?}",
            out.dims()
        );
    }
    out.to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()
        .map(|v| v[0])
}

/// Compares candle's autograd gradient of `f` at `x` with central finite differences.
///
/// # Arguments
/// * `f` - any function from a tensor of `x`'s shape to a scalar (any shape with one element).
///   It is called with an f64 tensor on the CPU.
/// * `x` - the point, any float dtype and shape; converted to f64 (finite differences in f32
///   are too coarse: with `eps = 1e-6` errors reach 0.3).
/// * `cfg` - step, tolerances, and an optional random subset of coordinates.
///
/// Runs one backward pass and two evaluations of `f` per checked coordinate. A check of a
/// tool, not a training path: it reads `x` and the gradient to the host.
///
/// `f` is called on f64 tensors on `x`'s device (so it may close over other tensors on that
/// device, e.g. references on a GPU; Metal, which has no f64, cannot run it).
///
/// Errors (naming the argument and its value) on a non-float or empty `x`, a NaN or infinite
/// coordinate of `x`, `eps` not finite and > 0, negative or NaN tolerances,
/// `max_coordinates: Some(0)`, an `f` that does not return a single value, or an error of `f`.
///
/// ```
/// use candle_bleu::gradcheck::{check_gradients, GradCheckConfig};
/// use candle_bleu::loss::{bleu_loss_from_logits, BleuLossConfig, References};
/// use candle_core::{Device, Tensor};
///
/// // The BLEU loss's gradient with respect to f64 logits, against finite differences.
/// let refs = References::from_ids(&Tensor::new(&[[1u32, 2, 3, 1]], &Device::Cpu)?, 0)?;
/// let logits = Tensor::randn(0f64, 1.0, (1, 4, 5), &Device::Cpu)?;
/// let cfg = BleuLossConfig { max_order: 2, ..Default::default() };
/// let loss = |x: &Tensor| Ok(bleu_loss_from_logits(x, None, &refs, &cfg)?.loss);
/// let report = check_gradients(loss, &logits, &GradCheckConfig::default())?;
/// assert!(report.passed, "{report}");
/// assert_eq!(report.checked, 20);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn check_gradients<F>(f: F, x: &Tensor, cfg: &GradCheckConfig) -> Result<GradCheckReport>
where
    F: Fn(&Tensor) -> Result<Tensor>,
{
    if !(cfg.eps.is_finite() && cfg.eps > 0.0) {
        bail!(
            "check_gradients: `eps` must be finite and > 0, got {}",
            cfg.eps
        );
    }
    if !(cfg.atol >= 0.0 && cfg.rtol >= 0.0) {
        bail!(
            "check_gradients: `atol` and `rtol` must be >= 0, got {} and {}",
            cfg.atol,
            cfg.rtol
        );
    }
    if !x.dtype().is_float() {
        bail!(
            "check_gradients: `x` must be a float tensor, got {:?} with shape {:?}",
            x.dtype(),
            x.dims()
        );
    }
    if x.elem_count() == 0 {
        bail!(
            "check_gradients: `x` has no coordinates to check (shape {:?})",
            x.dims()
        );
    }
    if cfg.max_coordinates == Some(0) {
        bail!("check_gradients: `max_coordinates` must be >= 1 (or None for all), got 0");
    }
    let dims = x.dims().to_vec();
    let device = x.device().clone();
    let point = x.to_dtype(DType::F64)?;
    let mut values = point.flatten_all()?.to_vec1::<f64>()?;
    if let Some(k) = values.iter().position(|v| !v.is_finite()) {
        bail!(
            "check_gradients: `x` has a non-finite value {} at {:?} (shape {:?})",
            values[k],
            unravel(k, &dims),
            dims
        );
    }
    let var = Var::from_tensor(&point)?;
    let out = f(var.as_tensor())?;
    scalar_value(&out)?;
    let grads = out.backward()?;
    let (analytic, gradient_missing) = match grads.get(var.as_tensor()) {
        Some(grad) => (
            grad.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?,
            false,
        ),
        None => (vec![0.0; point.elem_count()], true),
    };

    let coordinates: Vec<usize> = match cfg.max_coordinates {
        Some(limit) if limit < values.len() => {
            let mut rng = StdRng::seed_from_u64(cfg.seed);
            let mut chosen = sample(&mut rng, values.len(), limit).into_vec();
            chosen.sort_unstable();
            chosen
        }
        _ => (0..values.len()).collect(),
    };
    let evaluate = |values: &[f64]| -> Result<f64> {
        scalar_value(&f(&Tensor::from_slice(values, dims.as_slice(), &device)?)?)
    };

    let mut report = GradCheckReport {
        checked: coordinates.len(),
        failures: 0,
        max_abs_error: 0.0,
        max_rel_error: 0.0,
        worst_index: Vec::new(),
        worst_analytic: 0.0,
        worst_numeric: 0.0,
        gradient_missing,
        passed: true,
    };
    let mut worst_excess = f64::NEG_INFINITY;
    for &k in &coordinates {
        let original = values[k];
        values[k] = original + cfg.eps;
        let above = evaluate(&values)?;
        values[k] = original - cfg.eps;
        let below = evaluate(&values)?;
        values[k] = original;
        let numeric = (above - below) / (2.0 * cfg.eps);
        let error = (analytic[k] - numeric).abs();
        let tolerance = cfg.atol + cfg.rtol * numeric.abs();
        // NaN on either side is a failure, never a silent pass.
        let failed = error.is_nan() || error > tolerance;
        if failed {
            report.failures += 1;
        }
        report.max_abs_error =
            report
                .max_abs_error
                .max(if error.is_nan() { f64::INFINITY } else { error });
        let scale = analytic[k].abs().max(numeric.abs());
        if scale > cfg.atol {
            report.max_rel_error = report.max_rel_error.max(error / scale);
        }
        // The worst coordinate is the one closest to (or furthest past) its tolerance, as a
        // ratio: a difference would name the coordinate with the smallest tolerance when all
        // errors are 0.
        let excess = if error.is_nan() {
            f64::INFINITY
        } else if tolerance > 0.0 {
            error / tolerance
        } else if error > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        if excess > worst_excess {
            worst_excess = excess;
            report.worst_index = unravel(k, &dims);
            report.worst_analytic = analytic[k];
            report.worst_numeric = numeric;
        }
    }
    report.passed = report.failures == 0;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn a_wrong_gradient_is_caught() -> Result<()> {
        let x = Tensor::new(&[0.5f64, -0.25, 1.5], &Device::Cpu)?;
        // sqr has a correct backward: passes.
        let good = check_gradients(|x| x.sqr()?.sum_all(), &x, &GradCheckConfig::default())?;
        assert!(good.passed, "{good}");
        assert_eq!(good.checked, 3);
        // detach drops the gradient: the check must fail, and say so.
        let bad = check_gradients(
            |x| x.detach().sqr()?.sum_all(),
            &x,
            &GradCheckConfig::default(),
        )?;
        assert!(!bad.passed);
        assert!(bad.gradient_missing);
        assert_eq!(bad.failures, 3);
        assert_eq!(bad.worst_index, vec![2]);
        assert!((bad.worst_numeric - 3.0).abs() < 1e-6);
        Ok(())
    }

    #[test]
    fn subsets_are_drawn_without_replacement() -> Result<()> {
        let x = Tensor::arange(0f64, 100.0, &Device::Cpu)?.reshape((10, 10))?;
        let cfg = GradCheckConfig {
            max_coordinates: Some(7),
            ..Default::default()
        };
        let report = check_gradients(|x| x.sqr()?.sum_all(), &x, &cfg)?;
        assert_eq!(report.checked, 7);
        assert!(report.passed, "{report}");
        Ok(())
    }

    #[test]
    fn bad_points_and_settings_are_errors_naming_them() {
        let f = |x: &Tensor| x.sqr()?.sum_all();
        let cfg = GradCheckConfig::default();
        let cpu = &Device::Cpu;
        let cases: Vec<(Tensor, GradCheckConfig, &[&str])> = vec![
            (
                Tensor::zeros((2, 0), DType::F64, cpu).unwrap(),
                cfg.clone(),
                &["`x`", "no coordinates", "[2, 0]"],
            ),
            (
                Tensor::new(&[1.0f64, f64::NAN], cpu).unwrap(),
                cfg.clone(),
                &["`x`", "NaN", "[1]"],
            ),
            (
                Tensor::new(&[1u32, 2], cpu).unwrap(),
                cfg.clone(),
                &["`x`", "float", "U32", "[2]"],
            ),
            (
                Tensor::new(&[1.0f64, 2.0], cpu).unwrap(),
                GradCheckConfig {
                    max_coordinates: Some(0),
                    ..cfg.clone()
                },
                &["`max_coordinates`", "0"],
            ),
            (
                Tensor::new(&[1.0f64, 2.0], cpu).unwrap(),
                GradCheckConfig {
                    eps: f64::NAN,
                    ..cfg.clone()
                },
                &["`eps`", "NaN"],
            ),
            (
                Tensor::new(&[1.0f64, 2.0], cpu).unwrap(),
                GradCheckConfig {
                    rtol: -1.0,
                    ..cfg.clone()
                },
                &["`rtol`", "-1"],
            ),
        ];
        for (x, cfg, needles) in cases {
            let err = check_gradients(f, &x, &cfg).unwrap_err().to_string();
            for needle in needles {
                assert!(err.contains(needle), "{err:?} lacks {needle:?}");
            }
        }
        // An f32 point is checked in f64, and a gradient of another dtype is read as f64.
        let x = Tensor::new(&[0.5f32, -1.0], cpu).unwrap();
        let report =
            check_gradients(|x| x.to_dtype(DType::F32)?.sqr()?.sum_all(), &x, &cfg).unwrap();
        assert_eq!(report.checked, 2);
    }

    #[test]
    fn non_scalar_outputs_are_an_error() {
        let x = Tensor::new(&[1.0f64, 2.0], &Device::Cpu).unwrap();
        let err = check_gradients(|x| x.sqr(), &x, &GradCheckConfig::default()).unwrap_err();
        assert!(err.to_string().contains("scalar"), "{err}");
    }
}
