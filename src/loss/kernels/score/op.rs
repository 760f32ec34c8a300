//! The score as one custom op: `-log BLEU` of finished statistics rows, averaged over the rows
//! (docs/loss.md, §10 Score: smoothing, brevity penalty, guards), with its CPU kernel, its
//! closed-form backward and its CUDA side (`score.cu`, feature `cuda-unverified`) side by side.
//! Its composed twin is `score::neg_log_bleu_composed` (`loss/score.rs`), the reference it is
//! tested against.
//!
//! A row is `[m_1 … m_N | t_1 … t_N | C | L]`: the matches and totals of every order, the
//! hypothesis length and the reference length (one corpus's sums, or one element's). Its value
//! is `β(C, L) + Σ_n w_n · max(log p̃_n, log floor)`, and the op's output the scalar
//! `−(Σ_r row_r) · (1/K)` over its `K` rows:
//!
//! - `log p̃_n = log(m_n + a_n) − log(t_n + a_n)` (`a_n = k` from the second order with BLEU+1,
//!   else 0), with the composed ops' guards: a total below `tiny` makes the order contribute 0,
//!   a match below it counts as 0, a numerator below it takes the floor without forming its log;
//! - `β(C, L) = min(0, 1 − L/C)` for `C ≥ 1`, `min(0, 1 − 2L + L C)` below one token.
//!
//! The op computes what the composed ops compute, guard for guard and in the same order: a tie of
//! `min`/`max` gives each side half the gradient, as candle's backward does (`C = L` is common:
//! the brevity penalty's `min(0, 1 − L/C)` is then at its kink), and a NaN falls to the
//! floor or to 0 as candle's `maximum`/`minimum` let it.
//!
//! One op forward and one backward instead of about 30 composed ops each way: on CUDA, two
//! launches for the whole score (`score.cu`).

use super::args::ScoreArgs;
use crate::loss::kernels::backward::apply_backward_op2;
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor,
};
use std::sync::Arc;

/// `max(x, floor)` as candle computes it (`x > floor ? x : floor`: NaN gives the floor) and its
/// slope as candle's backward gives it: 1 above, ½ at a tie, 0 below.
#[inline]
fn floored<T: KernelFloat>(x: T, floor: T, half: T) -> (T, T) {
    let slope = if x > floor {
        T::ONE
    } else if x == floor {
        half
    } else {
        T::ZERO
    };
    (if x > floor { x } else { floor }, slope)
}

/// `min(x, 0)` the same way.
#[inline]
fn capped_at_zero<T: KernelFloat>(x: T, half: T) -> (T, T) {
    let slope = if x < T::ZERO {
        T::ONE
    } else if x == T::ZERO {
        half
    } else {
        T::ZERO
    };
    (if x < T::ZERO { x } else { T::ZERO }, slope)
}

/// A term of a row and the partials of its inputs, times the gradient `up` reaching the term.
struct Term<T> {
    value: T,
    d_first: T,
    d_second: T,
}

/// One order's guarded, floored log precision from its match `m` and total `t`, and with `up`
/// the gradient reaching it, the partials of `m` and `t`.
#[inline]
fn order_term<T: KernelFloat>(
    (m, t): (T, T),
    additive: T,
    (tiny, log_floor, half): (T, T, T),
    up: T,
) -> Term<T> {
    // `t_n = 0` means below the smallest normal number of the caller's dtype (`loss/score.rs`
    // says why): the order contributes 0. A match below it is 0: its ratio takes the floor.
    let has_ngrams = t >= tiny;
    let kept = m >= tiny;
    let numerator = if has_ngrams {
        (if kept { m } else { T::ZERO }) + additive
    } else {
        T::ONE
    };
    let denominator = if has_ngrams { t + additive } else { T::ONE };
    // A zero numerator takes the floor directly: its log is never formed.
    let matched = numerator >= tiny;
    let safe_numerator = if matched { numerator } else { T::ONE };
    let log_ratio = safe_numerator.ln() - denominator.ln();
    let (value, slope) = floored(if matched { log_ratio } else { log_floor }, log_floor, half);
    let d_ratio = if matched { up * slope } else { T::ZERO };
    Term {
        value,
        d_first: if has_ngrams && kept {
            d_ratio / safe_numerator
        } else {
            T::ZERO
        },
        d_second: if has_ngrams {
            T::ZERO - d_ratio / denominator
        } else {
            T::ZERO
        },
    }
}

/// `β(C, L)` (`loss/score.rs`, `log_brevity_penalty`) and with `up` the gradient reaching it,
/// the partials of `C` and `L`.
#[inline]
fn log_brevity<T: KernelFloat>(hyp_len: T, ref_len: T, half: T, up: T) -> Term<T> {
    let two = T::ONE + T::ONE;
    let long_enough = hyp_len >= T::ONE;
    let safe = if long_enough { hyp_len } else { T::ONE };
    let above_one = T::ONE - ref_len / safe;
    let below_one = (ref_len * hyp_len - ref_len * two) + T::ONE;
    let (value, slope) = capped_at_zero(if long_enough { above_one } else { below_one }, half);
    let d_raw = up * slope;
    Term {
        value,
        d_first: if long_enough {
            d_raw * ref_len / (safe * safe)
        } else {
            d_raw * ref_len
        },
        d_second: if long_enough {
            (T::ZERO - d_raw) / safe
        } else {
            d_raw * (hyp_len - two)
        },
    }
}

/// The score of `[K, 2N + 2]` rows as a custom op: the scalar `−(Σ_r row_r) · (1/K)`.
#[derive(Debug, Clone)]
pub(crate) struct ScoreOp {
    args: Arc<ScoreArgs>,
}

impl ScoreOp {
    pub(crate) fn new(args: ScoreArgs) -> Result<Self> {
        if args.orders == 0 || args.weights.len() != args.orders {
            bail!(
                "internal: a score of {} orders with {} weights",
                args.orders,
                args.weights.len()
            );
        }
        Ok(Self {
            args: Arc::new(args),
        })
    }

    /// `K`, from the rows' shape `[K, 2N + 2]`.
    pub(crate) fn row_count(&self, shape: &Shape) -> Result<usize> {
        match shape.dims() {
            &[rows, columns] if columns == self.args.columns() => Ok(rows),
            dims => bail!(
                "internal: the score takes rows [K, {}], got {dims:?}",
                self.args.columns()
            ),
        }
    }

    /// One row's log BLEU, with `grad` its partials times `up`.
    fn row<T: KernelFloat>(&self, row: &[T], up: T, grad: Option<&mut [T]>) -> T {
        let a = &*self.args;
        let n_orders = a.orders;
        let settings = (
            T::from_f64(a.tiny),
            T::from_f64(a.log_floor),
            T::from_f64(0.5),
        );
        let brevity = log_brevity(row[2 * n_orders], row[2 * n_orders + 1], settings.2, up);
        let mut precisions = T::ZERO;
        let mut grad = grad;
        for n in 0..n_orders {
            let weight = T::from_f64(a.weights[n]);
            let additive = T::from_f64(if n == 0 { 0.0 } else { a.additive });
            let term = order_term((row[n], row[n_orders + n]), additive, settings, up * weight);
            precisions += term.value * weight;
            if let Some(grad) = grad.as_deref_mut() {
                grad[n] = term.d_first;
                grad[n_orders + n] = term.d_second;
            }
        }
        if let Some(grad) = grad {
            grad[2 * n_orders] = brevity.d_first;
            grad[2 * n_orders + 1] = brevity.d_second;
        }
        brevity.value + precisions
    }

    /// The loss of the rows. A plain loop: `K` is one corpus's row or one per element, a few
    /// dozen flops each, far below what a parallel loop pays to start.
    pub(crate) fn cpu_forward<T: KernelFloat>(&self, rows: &[T]) -> T {
        let width = self.args.columns();
        let count = rows.len() / width;
        let mut sum = T::ZERO;
        for row in rows.chunks_exact(width) {
            sum += self.row(row, T::ZERO, None);
        }
        T::ZERO - sum * (T::ONE / T::from_f64(count as f64))
    }

    /// The rows' gradient `[K, 2N + 2]` from the loss's gradient `grad_out`.
    pub(crate) fn cpu_backward<T: KernelFloat>(&self, rows: &[T], grad_out: T) -> Vec<T> {
        let width = self.args.columns();
        let count = rows.len() / width;
        let up = (T::ZERO - grad_out) * (T::ONE / T::from_f64(count as f64));
        let mut grad = vec![T::ZERO; rows.len()];
        for (row, grad) in rows.chunks_exact(width).zip(grad.chunks_exact_mut(width)) {
            self.row(row, up, Some(grad));
        }
        grad
    }
}

impl CustomOp1 for ScoreOp {
    fn name(&self) -> &'static str {
        "bleu-score"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        self.row_count(layout.shape())?;
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let rows = contiguous_slice::<T>(storage, layout, "rows")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(vec![self.cpu_forward(rows)]))
        })?;
        Ok((out, Shape::from(())))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let count = self.row_count(layout.shape())?;
        let out = super::cuda::forward(&self.args, count, storage, layout)?;
        Ok((out, Shape::from(())))
    }

    fn bwd(&self, rows: &Tensor, _out: &Tensor, grad_out: &Tensor) -> Result<Option<Tensor>> {
        let grad_out = grad_out.contiguous()?;
        let grad = apply_backward_op2(&grad_out, rows, &grad_out, ScoreBackward(self.clone()))?;
        Ok(Some(grad))
    }
}

/// The backward of a [`ScoreOp`]: `(rows, grad_out)` to the rows' gradient.
struct ScoreBackward(ScoreOp);

impl CustomOp2 for ScoreBackward {
    fn name(&self) -> &'static str {
        "bleu-score-backward"
    }

    fn cpu_fwd(
        &self,
        rows: &CpuStorage,
        rows_layout: &Layout,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.0.row_count(rows_layout.shape())?;
        if rows.dtype() != grad_out.dtype() {
            bail!(
                "internal: the score's gradient is {:?}, its rows {:?}",
                grad_out.dtype(),
                rows.dtype()
            );
        }
        let grad = dispatch_float!(rows.dtype(), self.name(), <T> => {
            let grad_out = contiguous_slice::<T>(grad_out, grad_layout, "gradient")?;
            let grad = self.0.cpu_backward(
                contiguous_slice::<T>(rows, rows_layout, "rows")?,
                grad_out[0],
            );
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((grad, rows_layout.shape().clone()))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        rows: &candle_core::CudaStorage,
        rows_layout: &Layout,
        grad_out: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let count = self.0.row_count(rows_layout.shape())?;
        let grad = super::cuda::backward(
            &self.0.args,
            count,
            (rows, rows_layout),
            (grad_out, grad_layout),
        )?;
        Ok((grad, rows_layout.shape().clone()))
    }
}
