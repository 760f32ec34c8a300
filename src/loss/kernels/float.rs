//! The float types of the CPU kernels and their matrix products: f32 and f64, candle's element
//! type plus the constants and the `exp` the loops need; and what every CPU op of the kernels
//! shares to reach its data: the f32/f64 dispatch `dispatch_float!` and [`contiguous_slice`].

use candle_core::{bail, CpuStorage, DType, Layout, Result, WithDType};

/// The one f32/f64 dispatch of the CPU kernels: `<T> => body` evaluates the body with `T` the
/// kernel's float type for `$dtype`; another dtype is an error naming the operation.
macro_rules! dispatch_float {
    ($dtype:expr, $what:expr, <$float:ident> => $body:expr) => {
        match $dtype {
            candle_core::DType::F32 => {
                type $float = f32;
                $body
            }
            candle_core::DType::F64 => {
                type $float = f64;
                $body
            }
            other => Err($crate::loss::kernels::float::unsupported_dtype(
                $what, other,
            )),
        }
    };
}
pub(crate) use dispatch_float;

pub(crate) fn unsupported_dtype(what: &str, dtype: DType) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{what}: the CPU kernel takes f32 or f64 `logits`, got {dtype:?}"
    ))
}

/// The contiguous data of a CPU storage under `layout`.
pub(crate) fn contiguous_slice<'a, T: candle_core::WithDType>(
    storage: &'a CpuStorage,
    layout: &Layout,
    what: &str,
) -> Result<&'a [T]> {
    let data = storage.as_slice::<T>()?;
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => bail!("`{what}`: the kernel needs a contiguous tensor"),
    }
}

/// The float types of the CPU kernels, f32 and f64: candle's element type plus what the loops
/// need.
pub(crate) trait KernelFloat: WithDType {
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    /// `exp(x)` for `x <= 0` (logits minus their row maximum).
    fn exp_nonpositive(x: Self) -> Self;
    /// The larger of the two; NaN is ignored (the finiteness check reports it).
    #[inline(always)]
    fn larger(self, other: Self) -> Self {
        if other > self {
            other
        } else {
            self
        }
    }
    fn is_finite(self) -> bool;
    /// The hyperbolic tangent (soft-capping).
    fn tanh(self) -> Self;
    /// The natural logarithm, the library's (the score's log-precisions).
    fn ln(self) -> Self;
}

impl KernelFloat for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f32::NEG_INFINITY;

    /// Cephes `expf`: range reduction by `ln 2`, a degree-5 polynomial, and the exponent written
    /// into the bits. Branch-free so that loops over rows vectorise; inputs below `-87` (whose
    /// `exp` is below the smallest normal float) give exactly 0, like the library `exp` rounds to.
    #[inline(always)]
    fn exp_nonpositive(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_359_4;
        const LN2_LO: f32 = -2.121_944_4e-4;
        // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
        const ROUND: f32 = 12_582_912.0;
        let clamped = if x < -87.0 { -87.0 } else { x };
        let shifted = clamped * LOG2E + ROUND;
        // The rounded integer sits in the low mantissa bits of `shifted`: reading it from the
        // bits keeps the loop free of float-to-int conversions, which would not vectorise.
        let n_int = shifted.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
        let n = shifted - ROUND;
        let r = clamped - n * LN2_HI - n * LN2_LO;
        let mut p = 1.987_569_1e-4_f32;
        p = p * r + 1.398_199_9e-3;
        p = p * r + 8.333_452e-3;
        p = p * r + 4.166_579_6e-2;
        p = p * r + 1.666_666_5e-1;
        p = p * r + 5.0e-1;
        let y = p * r * r + r + 1.0;
        let scale = f32::from_bits(((n_int + 127) as u32) << 23);
        let e = y * scale;
        if x < -87.0 {
            0.0
        } else {
            e
        }
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
    /// `tanh` in branch-free arithmetic that vectorises (the library's `tanhf` does not): the odd
    /// series to `x⁹` below `|x| = 1/4` (its truncation error, `< 1e-8` relative, is below
    /// f32's precision), else `(1 − e)/(1 + e)` with `e = exp(−2|x|) ≤ 0.61` (no cancellation)
    /// from [`Self::exp_nonpositive`]; the sign copied back. Within a few ulp of `tanhf`.
    #[inline(always)]
    fn tanh(self) -> Self {
        let a = self.abs();
        let a2 = a * a;
        let series = a
            * (1.0
                + a2 * (-1.0 / 3.0
                    + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0 + a2 * (62.0 / 2835.0)))));
        let e = Self::exp_nonpositive(-2.0 * a);
        let far = (1.0 - e) / (1.0 + e);
        let t = if a < 0.25 { series } else { far };
        t.copysign(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
}

impl KernelFloat for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    const NEG_INFINITY: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp_nonpositive(x: f64) -> f64 {
        x.exp()
    }
    fn is_finite(self) -> bool {
        f64::is_finite(self)
    }
    fn tanh(self) -> Self {
        f64::tanh(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
}

#[cfg(test)]
mod tests {
    use super::KernelFloat;

    /// The vectorising f32 `tanh` against f64's on a fine grid across both branches and into
    /// saturation: within 4 units in the last place of f32 (relative `2⁻²¹`), exact signs, and
    /// ±1 at ±∞.
    #[test]
    fn f32_tanh_is_within_a_few_ulp() {
        let mut worst = 0f64;
        for i in -200_000..=200_000 {
            let x = i as f32 * 1e-4; // −20 … 20, step 1e-4: both branches and the switch at 1/4
            let ours = KernelFloat::tanh(x) as f64;
            let exact = (x as f64).tanh();
            assert_eq!(ours.signum(), exact.signum(), "sign at {x}");
            if exact != 0.0 {
                worst = worst.max(((ours - exact) / exact).abs());
            }
        }
        assert!(
            worst <= 4.0 * f32::EPSILON as f64 / 2.0,
            "relative error {worst}"
        );
        assert_eq!(KernelFloat::tanh(f32::INFINITY), 1.0);
        assert_eq!(KernelFloat::tanh(f32::NEG_INFINITY), -1.0);
        assert_eq!(KernelFloat::tanh(1e-30f32), 1e-30);
    }
}
