//! The float types of the CPU kernels and their matrix products: f32 and f64, candle's element
//! type plus the constants and the `exp` the loops need.

use candle_core::WithDType;

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
    fn tanh(self) -> Self {
        f32::tanh(self)
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
}
