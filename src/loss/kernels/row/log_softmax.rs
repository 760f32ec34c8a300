//! `log_softmax` over the last dimension as one custom op: a forward that reads each row once
//! for its maximum and exp-sum (online, as the row kernels do) and writes `x − lse`, and a
//! backward that reads the saved output and the incoming gradient once per row,
//! `grad_x = g − exp(y)·Σ_v g_v`: no `[.., V]` intermediate beyond the output and the gradient.
//! Rows run in parallel (rayon), over raw slices. Off the CPU the same function runs as composed
//! candle ops ([`log_softmax_slow`]).
//!
//! Non-finite inputs propagate as through the composed ops, never an error: a `-inf` entry is
//! a probability of 0 (output `-inf`, the row's other entries as without it; its gradient is
//! `g_v`, whatever reaches it); a row holding NaN or `+inf`, or only `-inf`, is NaN throughout,
//! and so is its gradient.

use crate::loss::kernels::cpu::{row_softmax_stats, vocab_sized_buffer, wide_vectors, LANES};
use crate::loss::kernels::float::{
    contiguous_slice, dispatch_float, unsupported_dtype, KernelFloat,
};
use candle_core::{
    backend::BackendStorage, CpuStorage, CustomOp1, DType, InplaceOp2, Layout, Result, Shape,
    Tensor, D,
};
use rayon::prelude::*;

/// `log_softmax(x)` over the last dimension: `x − log Σ_v exp(x_v)` per row, with its
/// gradient.
///
/// * `x` - a float tensor of rank `>= 1` whose last dimension (the classes) is `>= 1`, on any
///   device, contiguous or a view. f32 and f64 are computed in their dtype, f16 and bf16 in f32
///   (converted on the way in and out); the result has `x`'s shape and dtype.
///
/// On the CPU one custom op runs the forward and another the backward, each one read of its
/// rows, rayon over the rows; on CUDA with the `cuda-unverified` feature the same ops run CUDA
/// kernels (`log_softmax.cu`, one block per row; tested on the emulator, not yet on a GPU);
/// elsewhere it is [`log_softmax_slow`]. Non-finite values
/// propagate, never an error: a `-inf` entry is a probability of 0 (output `-inf`; its
/// gradient is the incoming one), and a row holding NaN or `+inf`, or only `-inf`, is NaN in
/// value and gradient, the other rows unchanged. Errors on an integer
/// dtype, a rank-0 tensor or an empty last dimension, naming `x`.
///
/// `ctc_loss(&log_softmax(&x)?, …)` is PyTorch's `F.ctc_loss(F.log_softmax(x, -1), …)`.
pub fn log_softmax(x: &Tensor) -> Result<Tensor> {
    let compute = checked_dtype(x)?;
    if !x.device().is_cpu() && !super::op::options_kernels_loaded(x.device()) {
        return log_softmax_slow(x);
    }
    let y = x.to_dtype(compute)?.contiguous()?.apply_op1(LogSoftmax)?;
    y.to_dtype(x.dtype())
}

/// [`log_softmax`] as composed candle ops (`x − max`, `exp`, `sum`, `log`, with candle's
/// autograd), its reference: the same values and gradients to rounding, in the same dtypes.
pub fn log_softmax_slow(x: &Tensor) -> Result<Tensor> {
    let compute = checked_dtype(x)?;
    let xc = x.to_dtype(compute)?;
    let max = xc.max_keepdim(D::Minus1)?.detach();
    let shifted = xc.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)?.to_dtype(x.dtype())
}

/// `x`'s compute dtype (f32 for f16 and bf16), or an error naming `x` on a rank-0 tensor, an
/// empty last dimension or an integer dtype.
fn checked_dtype(x: &Tensor) -> Result<DType> {
    let Some(&classes) = x.dims().last() else {
        candle_core::bail!(
            "`x` must have rank >= 1 (log_softmax over its last dimension), got a scalar"
        );
    };
    if classes == 0 {
        candle_core::bail!(
            "`x` has an empty last dimension (shape {:?}): log_softmax needs >= 1 class",
            x.dims()
        );
    }
    match x.dtype() {
        DType::F64 => Ok(DType::F64),
        DType::F32 | DType::F16 | DType::BF16 => Ok(DType::F32),
        other => candle_core::bail!(
            "`x` must be a float tensor, got {other:?} with shape {:?}",
            x.dims()
        ),
    }
}

/// The forward op: rows of the last dimension, f32 or f64, contiguous.
struct LogSoftmax;

/// One row: `out = row − lse`, `lse = max + log Σ exp(row − max)` from one read of the row
/// (the log in f64, then rounded: `lse >= max`, so every output is `<= 0`).
#[inline(always)]
fn forward_row_body<T: KernelFloat>(row: &[T], out: &mut [T]) {
    let (max, sum, _, _) = row_softmax_stats(row, false);
    let lse = T::from_f64(max.to_f64() + sum.to_f64().ln());
    for (o, &x) in out.iter_mut().zip(row) {
        *o = x - lse;
    }
}

wide_vectors! {
    /// One row of the forward (see [`forward_row_body`]).
    fn forward_row(row: &[T], out: &mut [T]) -> () = forward_row_body;
}

/// One row of the backward, in place: `g ← g − exp(y)·Σ_v g_v`, `y` the forward's output row.
#[inline(always)]
fn backward_row_body<T: KernelFloat>(y: &[T], g: &mut [T]) {
    let mut lanes = [T::ZERO; LANES];
    let chunks = g.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..LANES {
            lanes[lane] += chunk[lane];
        }
    }
    let mut total = T::ZERO;
    for lane in lanes {
        total += lane;
    }
    for &x in rest {
        total += x;
    }
    for (o, &yv) in g.iter_mut().zip(y) {
        *o -= T::exp_nonpositive(yv) * total;
    }
}

wide_vectors! {
    /// One row of the backward (see [`backward_row_body`]).
    fn backward_row(y: &[T], g: &mut [T]) -> () = backward_row_body;
}

/// The rows' length: the last dimension of `shape` (checked `>= 1` by [`log_softmax`]).
fn classes(shape: &Shape) -> usize {
    shape.dims().last().copied().unwrap_or(1).max(1)
}

impl CustomOp1 for LogSoftmax {
    fn name(&self) -> &'static str {
        "candle-bleu-log-softmax"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let classes = classes(layout.shape());
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let x = contiguous_slice::<T>(storage, layout, "x")?;
            let mut y = vocab_sized_buffer::<T>(x.len());
            y.par_chunks_mut(classes)
                .zip(x.par_chunks(classes))
                .for_each(|(out, row)| forward_row(row, out));
            Ok(candle_core::WithDType::to_cpu_storage_owned(y))
        })?;
        Ok((out, layout.shape().clone()))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let y = super::cuda::log_softmax_forward(storage, layout)?;
        Ok((y, layout.shape().clone()))
    }

    /// `grad_y` becomes the input's gradient in place when it is what candle's backward hands
    /// each op — the output's gradient taken out of the gradient store, detached, a fresh
    /// contiguous tensor of its own (tracking no op) — which saves a `[.., V]` buffer; else a
    /// copy of it does.
    fn bwd(&self, _x: &Tensor, y: &Tensor, grad_y: &Tensor) -> Result<Option<Tensor>> {
        let grad = if grad_y.is_contiguous()
            && !grad_y.track_op()
            && grad_y.layout().start_offset() == 0
        {
            grad_y.clone()
        } else {
            grad_y.contiguous()?.copy()?
        };
        grad.inplace_op2(y, &LogSoftmaxBackward)?;
        Ok(Some(grad))
    }
}

/// The backward op, in place on the output's gradient: `grad_y ← grad_y − exp(y)·Σ grad_y`
/// per row, `y` the forward's output.
struct LogSoftmaxBackward;

impl InplaceOp2 for LogSoftmaxBackward {
    fn name(&self) -> &'static str {
        "candle-bleu-log-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        grad: &mut CpuStorage,
        grad_layout: &Layout,
        y: &CpuStorage,
        y_layout: &Layout,
    ) -> Result<()> {
        let classes = classes(y_layout.shape());
        match (grad, y) {
            (CpuStorage::F32(g), CpuStorage::F32(y)) => {
                backward_rows(g, grad_layout, y, y_layout, classes)
            }
            (CpuStorage::F64(g), CpuStorage::F64(y)) => {
                backward_rows(g, grad_layout, y, y_layout, classes)
            }
            (g, y) => Err(unsupported_dtype(
                self.name(),
                if g.dtype() == y.dtype() {
                    g.dtype()
                } else {
                    y.dtype()
                },
            )),
        }
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        grad: &mut candle_core::CudaStorage,
        grad_layout: &Layout,
        y: &candle_core::CudaStorage,
        y_layout: &Layout,
    ) -> Result<()> {
        super::cuda::log_softmax_backward(grad, grad_layout, y, y_layout)
    }
}

/// [`backward_row`] over every row of the contiguous `g` (in place) and `y`, rows of `classes`.
fn backward_rows<T: KernelFloat>(
    g: &mut [T],
    g_layout: &Layout,
    y: &[T],
    y_layout: &Layout,
    classes: usize,
) -> Result<()> {
    let (Some((g_start, g_end)), Some((y_start, y_end))) =
        (g_layout.contiguous_offsets(), y_layout.contiguous_offsets())
    else {
        candle_core::bail!("internal: the log_softmax backward needs contiguous tensors");
    };
    let (g, y) = (&mut g[g_start..g_end], &y[y_start..y_end]);
    if g.len() != y.len() {
        candle_core::bail!(
            "internal: a log_softmax gradient of {} values for {}",
            g.len(),
            y.len()
        );
    }
    g.par_chunks_mut(classes)
        .zip(y.par_chunks(classes))
        .for_each(|(g, y)| backward_row(y, g));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::{check_gradients, GradCheckConfig};
    use candle_core::{Device, Var};

    fn values(n: usize, scale: f64, phase: f64) -> Vec<f64> {
        (0..n)
            .map(|i| scale * (2.0 * ((i as f64 * 0.618_033_988_75 + phase) % 1.0) - 1.0))
            .collect()
    }

    fn flat(t: &Tensor) -> Vec<f64> {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    }

    /// Each row by hand in f64: `x − max − log Σ exp(x − max)`.
    fn by_hand(x: &[f64], classes: usize) -> Vec<f64> {
        x.chunks(classes)
            .flat_map(|row| {
                let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
                row.iter().map(move |v| v - lse).collect::<Vec<_>>()
            })
            .collect()
    }

    /// Value and gradient against the hand computation and the composed reference, in f64 and
    /// f32, at row lengths around the 8-lane chunks and the 2048-entry blocks (a later block
    /// holding the maximum), and on ranks 1 to 4.
    #[test]
    fn the_op_equals_the_hand_values_and_the_composed_reference() -> Result<()> {
        let dev = Device::Cpu;
        for shape in [
            vec![1usize],
            vec![7],
            vec![3, 8],
            vec![2, 3, 13],
            vec![2, 4097],
            vec![2, 1, 3, 9],
        ] {
            let n: usize = shape.iter().product();
            let classes = *shape.last().unwrap();
            let mut data = values(n, 6.0, 0.1);
            if classes > 4096 {
                data[classes + 4000] = 9.0; // the second row's maximum in its second block
            }
            let expected = by_hand(&data, classes);
            for (dtype, tol) in [(DType::F64, 1e-13), (DType::F32, 2e-6)] {
                let x = Var::from_tensor(
                    &Tensor::from_vec(data.clone(), shape.clone(), &dev)?.to_dtype(dtype)?,
                )?;
                let y = log_softmax(x.as_tensor())?;
                assert_eq!((y.dims(), y.dtype()), (x.dims(), dtype));
                let slow = log_softmax_slow(x.as_tensor())?;
                for (i, ((a, b), e)) in flat(&y).iter().zip(flat(&slow)).zip(&expected).enumerate()
                {
                    assert!(
                        (a - e).abs() <= tol * e.abs().max(1.0),
                        "{shape:?} {dtype:?} [{i}]: {a} vs {e}"
                    );
                    assert!(
                        (a - b).abs() <= tol * e.abs().max(1.0),
                        "{shape:?} {dtype:?} [{i}]: {a} vs slow {b}"
                    );
                }
                // A gradient that differs per entry: Σ w ⊙ y.
                let w =
                    Tensor::from_vec(values(n, 1.0, 0.4), shape.clone(), &dev)?.to_dtype(dtype)?;
                let fast = (&y * &w)?.sum_all()?.backward()?;
                let slow = (&slow * &w)?.sum_all()?.backward()?;
                let (fast, slow) = (flat(fast.get(&x).unwrap()), flat(slow.get(&x).unwrap()));
                for (i, (a, b)) in fast.iter().zip(&slow).enumerate() {
                    assert!(
                        (a - b).abs() <= 10.0 * tol,
                        "{shape:?} {dtype:?} grad[{i}]: {a} vs {b}"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn gradcheck_in_f64() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(values(3 * 11, 3.0, 0.2), (3, 11), &dev)?;
        let w = Tensor::from_vec(values(3 * 11, 1.0, 0.7), (3, 11), &dev)?;
        let report = check_gradients(
            |x| (log_softmax(x)? * &w)?.sum_all(),
            &x,
            &GradCheckConfig::default(),
        )?;
        assert!(report.passed && !report.gradient_missing, "{report}");
        Ok(())
    }

    /// f16 and bf16 in, the same dtype out, computed in f32: within one rounding to the dtype
    /// (`2⁻¹¹` relative for f16, `2⁻⁸` for bf16) of the f64 values of the same rounded inputs;
    /// the gradient in the input's dtype.
    #[test]
    fn half_precision_is_computed_in_f32() -> Result<()> {
        let dev = Device::Cpu;
        let data = values(4 * 33, 5.0, 0.3);
        for (dtype, unit) in [(DType::F16, 2f64.powi(-11)), (DType::BF16, 2f64.powi(-8))] {
            let x =
                Var::from_tensor(&Tensor::from_vec(data.clone(), (4, 33), &dev)?.to_dtype(dtype)?)?;
            let y = log_softmax(x.as_tensor())?;
            assert_eq!(y.dtype(), dtype);
            let expected = by_hand(&flat(x.as_tensor()), 33);
            for (i, (a, e)) in flat(&y).iter().zip(&expected).enumerate() {
                assert!(
                    (a - e).abs() <= unit * e.abs() + 1e-6,
                    "{dtype:?} [{i}]: {a} vs {e}"
                );
            }
            let grads = y.sum_all()?.backward()?;
            assert_eq!(grads.get(&x).unwrap().dtype(), dtype);
        }
        Ok(())
    }

    /// A transposed view and a narrowed one give what their contiguous copies give.
    #[test]
    fn views_equal_their_contiguous_copies() -> Result<()> {
        let dev = Device::Cpu;
        let x = Tensor::from_vec(values(6 * 10, 4.0, 0.5), (6, 10), &dev)?;
        // Transposed; narrowed along the rows; every other row.
        let every_other_row = x.reshape((3, 2, 10))?.narrow(1, 0, 1)?.squeeze(1)?;
        for view in [x.t()?, x.narrow(1, 2, 5)?, every_other_row] {
            assert!(!view.is_contiguous());
            let a = flat(&log_softmax(&view)?);
            let b = flat(&log_softmax(&view.contiguous()?)?);
            assert_eq!(a, b);
        }
        Ok(())
    }

    /// `-inf` is a probability of 0; NaN or `+inf` in a row, or a row of only `-inf`, makes that
    /// row NaN (value and gradient) and leaves the others alone, as the composed ops do.
    #[test]
    fn non_finite_values_propagate_as_through_the_composed_ops() -> Result<()> {
        let dev = Device::Cpu;
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let rows = [
            [0.0, -inf, 1.0],
            [nan, 0.0, 1.0],
            [inf, 0.0, 1.0],
            [-inf, -inf, -inf],
            [0.5, 0.25, -1.0],
        ];
        let data: Vec<f64> = rows.iter().flatten().copied().collect();
        for dtype in [DType::F64, DType::F32] {
            let x =
                Var::from_tensor(&Tensor::from_vec(data.clone(), (5, 3), &dev)?.to_dtype(dtype)?)?;
            let y = log_softmax(x.as_tensor())?;
            let v = flat(&y);
            let lse = (1f64 + 1f64.exp()).ln();
            assert!(
                (v[0] + lse).abs() < 1e-6 && v[1] == -inf && (v[2] - 1.0 + lse).abs() < 1e-6,
                "{v:?}"
            );
            assert!(v[3..12].iter().all(|x| x.is_nan()), "{dtype:?}: {v:?}");
            assert!(v[12..].iter().all(|x| x.is_finite()), "{v:?}");
            let grads = y.sum_all()?.backward()?;
            let g = flat(grads.get(&x).unwrap());
            // Row 0: g − p·Σg with g = 1: 1 − 3p, and 1 at the -inf entry.
            assert_eq!(g[1], 1.0);
            assert!(g[3..12].iter().all(|x| x.is_nan()), "{g:?}");
            assert!(g[12..].iter().all(|x| x.is_finite()), "{g:?}");
            // The composed reference agrees on which entries are NaN or infinite.
            let slow = flat(&log_softmax_slow(x.as_tensor())?);
            for (a, b) in v.iter().zip(&slow) {
                assert_eq!(
                    (a.is_nan(), a.is_infinite()),
                    (b.is_nan(), b.is_infinite()),
                    "{v:?} vs {slow:?}"
                );
            }
        }
        Ok(())
    }

    #[test]
    fn bad_inputs_are_named_errors() -> Result<()> {
        let dev = Device::Cpu;
        for (x, needle) in [
            (Tensor::new(1f32, &dev)?, "rank >= 1"),
            (
                Tensor::zeros((2, 0), DType::F32, &dev)?,
                "empty last dimension",
            ),
            (Tensor::new(&[1u32, 2], &dev)?, "must be a float tensor"),
        ] {
            for result in [log_softmax(&x), log_softmax_slow(&x)] {
                let err = result.unwrap_err().to_string();
                assert!(err.contains("`x`") && err.contains(needle), "{err}");
            }
        }
        Ok(())
    }
}
