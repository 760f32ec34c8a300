//! Logit soft-capping, `y = c·tanh(z/c)` (Gemma 2's; Liger-Kernel's and Cut Cross-Entropy's
//! `softcap`), with `dy/dz = 1 − (y/c)²`: the slice functions the hidden-state blocks call in
//! place on each block of logits, and [`SoftcapOp`], the op the logits entry points apply
//! before their pass on the CPU — one read and one write forward, and its backward
//! ([`SoftcapBackward`]) one pass over the output and its gradient. Its composed reference
//! (and what other devices run) is `composed::softcap`.

use crate::loss::kernels::backward::apply_backward_op2;
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::atomic::{AtomicBool, Ordering};

const CHUNK: usize = 4096;

/// `c·tanh(z/c)` of one logit.
#[inline(always)]
fn capped<T: KernelFloat>(z: T, cap: T, inv_cap: T) -> T {
    cap * (z * inv_cap).tanh()
}

/// `out[i] = c·tanh(z[i]/c)`; `false` if `z` holds NaN or Inf, which `tanh` would hide (the
/// outputs are then meaningless).
pub(crate) fn softcap_into<T: KernelFloat>(logits: &[T], cap: f64, out: &mut [T]) -> bool {
    let all_finite = AtomicBool::new(true);
    let (cap, inv_cap) = (T::from_f64(cap), T::from_f64(1.0 / cap));
    out.par_chunks_mut(CHUNK)
        .zip(logits.par_chunks(CHUNK))
        .for_each(|(y, z)| {
            let mut finite = true;
            for (y, &z) in y.iter_mut().zip(z) {
                finite &= z.is_finite();
                *y = capped(z, cap, inv_cap);
            }
            if !finite {
                all_finite.store(false, Ordering::Relaxed);
            }
        });
    all_finite.load(Ordering::Relaxed)
}

/// [`softcap_into`] in place, on a block of logits the hidden-state op has just computed.
pub(crate) fn softcap_in_place<T: KernelFloat>(logits: &mut [T], cap: f64) -> bool {
    let all_finite = AtomicBool::new(true);
    let (cap, inv_cap) = (T::from_f64(cap), T::from_f64(1.0 / cap));
    logits.par_chunks_mut(CHUNK).for_each(|chunk| {
        let mut finite = true;
        for x in chunk {
            finite &= x.is_finite();
            *x = capped(*x, cap, inv_cap);
        }
        if !finite {
            all_finite.store(false, Ordering::Relaxed);
        }
    });
    all_finite.load(Ordering::Relaxed)
}

/// The gradient of capped logits turned into that of the logits they were capped from, in
/// place: `g ← g·(1 − (y/c)²)` with `y` the capped logits.
pub(crate) fn softcap_backward_in_place<T: KernelFloat>(grad: &mut [T], capped: &[T], cap: f64) {
    let inv_cap = T::from_f64(1.0 / cap);
    grad.par_chunks_mut(CHUNK)
        .zip(capped.par_chunks(CHUNK))
        .for_each(|(g, y)| {
            for (g, &y) in g.iter_mut().zip(y) {
                let t = y * inv_cap;
                *g *= T::ONE - t * t;
            }
        });
}

/// `c·tanh(z/c)` of `logits`, differentiable: [`SoftcapOp`] where the CPU kernels run (it also
/// refuses NaN and Inf), composed candle ops elsewhere.
pub(crate) fn softcap(logits: &Tensor, cap: f64, cpu_kernels: bool) -> Result<Tensor> {
    if cpu_kernels {
        logits.contiguous()?.apply_op1(SoftcapOp { cap })
    } else {
        crate::loss::kernels::composed::softcap(logits, cap)
    }
}

/// Soft-capping as one CPU op, differentiable: `c·tanh(z/c)` of a contiguous f32 or f64 tensor
/// of any shape; errors on NaN or Inf in it.
pub(crate) struct SoftcapOp {
    pub cap: f64,
}

impl CustomOp1 for SoftcapOp {
    fn name(&self) -> &'static str {
        "candle-bleu-softcap"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let logits = contiguous_slice::<T>(storage, layout, "logits")?;
            let mut out = vec![T::ZERO; logits.len()];
            if !softcap_into(logits, self.cap, &mut out) {
                candle_core::bail!(
                    "`logits` contain NaN or infinite values (shape {:?}); the loss needs finite logits",
                    layout.shape().dims()
                );
            }
            Ok(candle_core::WithDType::to_cpu_storage_owned(out))
        })?;
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _logits: &Tensor, capped: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let op = SoftcapBackward { cap: self.cap };
        let grad = grad.contiguous()?;
        Ok(Some(apply_backward_op2(
            &grad,
            &capped.contiguous()?,
            &grad,
            op,
        )?))
    }
}

/// The backward of a [`SoftcapOp`]: `(capped, grad)` to `grad·(1 − (capped/c)²)`.
pub(crate) struct SoftcapBackward {
    pub cap: f64,
}

impl CustomOp2 for SoftcapBackward {
    fn name(&self) -> &'static str {
        "candle-bleu-softcap-backward"
    }

    fn cpu_fwd(
        &self,
        capped: &CpuStorage,
        capped_layout: &Layout,
        grad: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = dispatch_float!(capped.dtype(), self.name(), <T> => {
            let capped = contiguous_slice::<T>(capped, capped_layout, "capped logits")?;
            let mut grad = contiguous_slice::<T>(grad, grad_layout, "gradient")?.to_vec();
            softcap_backward_in_place(&mut grad, capped, self.cap);
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((out, capped_layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loss::kernels::composed;
    use candle_core::{Device, Var};

    /// The op equals the composed `c·tanh(z/c)` (value and gradient) in f64, and in f32 to a
    /// few units in the last place of the capped values.
    #[test]
    fn the_op_equals_the_composed_reference() -> Result<()> {
        let values: Vec<f64> = (0..997)
            .map(|i| 40.0 * ((i as f64 * 0.618_033_988_75) % 1.0) - 20.0)
            .chain([0.0, 1e-6, -1e-6, 0.2, -0.26, 300.0, -300.0])
            .collect();
        for (dtype, tol) in [
            (candle_core::DType::F64, 1e-14),
            (candle_core::DType::F32, 4e-7),
        ] {
            let z =
                Var::from_tensor(&Tensor::new(values.as_slice(), &Device::Cpu)?.to_dtype(dtype)?)?;
            let weights = Tensor::new(values.as_slice(), &Device::Cpu)?
                .to_dtype(dtype)?
                .cos()?;
            let cap = 7.5;
            let op = z.as_tensor().apply_op1(SoftcapOp { cap })?;
            let reference = composed::softcap(z.as_tensor(), cap)?;
            let grad = |y: &Tensor| -> Result<Vec<f64>> {
                let g = (y * &weights)?.sum_all()?.backward()?;
                g.get(z.as_tensor())
                    .expect("a gradient")
                    .to_dtype(candle_core::DType::F64)?
                    .to_vec1()
            };
            let flat = |t: &Tensor| t.to_dtype(candle_core::DType::F64)?.to_vec1::<f64>();
            for (what, a, b) in [
                ("value", flat(&op)?, flat(&reference)?),
                ("gradient", grad(&op)?, grad(&reference)?),
            ] {
                for (i, (a, b)) in a.iter().zip(&b).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * cap,
                        "{dtype:?} {what}[{i}] (z = {}): {a} vs {b}",
                        values[i]
                    );
                }
            }
        }
        let bad = Tensor::new(&[1f32, f32::INFINITY], &Device::Cpu)?;
        let err = bad
            .apply_op1(SoftcapOp { cap: 2.0 })
            .unwrap_err()
            .to_string();
        assert!(err.contains("NaN or infinite"), "{err}");
        Ok(())
    }
}
