//! The expected form's clipped matches as one op (docs/loss.md, §8.2 Expected form): from the
//! token matches `X [B, S, W]` and the length model's match weights `U [B, S]` to
//! `m [B, N]`, with its CPU kernel and its backward side by side. Its composed twin is
//! `forms::expected` over `products::extend_ngram_match`, which it is tested against.
//!
//! Per element and order `n`: `M_n[i, j] = Π_{k<n} X[i+k, j+k]` (built in place from
//! `M_{n−1}`), `E_j = Σ_i M_n[i, j] u_n[i]`, `m_n = Σ_j min(κ_j, ν_j E_j)`, every sum in the
//! composed ops' order. The backward sweeps the orders in reverse, as autograd does through the
//! composed chain: the gradient of `M_n` collects its own term `dE_j u_n[i]`, passes
//! `· X[i+n−1, j+n−1]` down to `M_{n−1}` and `· M_{n−1}` to that `X`; a tie of the clip
//! (`ν_j E_j = κ_j`) gives the expected count half the gradient, as candle's `minimum` does.

use super::args::MatchArgs;
use crate::loss::kernels::backward::apply_backward_op3;
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;

/// The clipped matches of the expected form as a custom op over `(X, U)`, with the reference
/// side's counts `[2, N, B, W]` (`ν` of every order, then `κ`: constants, id references' first
/// occurrences and clip counts, on the inputs' device and in their dtype).
#[derive(Debug, Clone)]
pub(crate) struct ExpectedMatchesOp {
    args: MatchArgs,
    counts: Tensor,
}

/// The slope of `min(κ, v)` in `v` as candle's backward gives it: `node = κ < v ? κ : v`, then
/// `[node == v] / (1 + [node == κ])` (½ at a tie, 0 where `κ` is smaller or `v` is NaN).
#[inline]
fn clip_slope<T: KernelFloat>(clip: T, value: T) -> T {
    let node = if clip < value { clip } else { value };
    if node != value {
        T::ZERO
    } else if node == clip {
        T::from_f64(0.5)
    } else {
        T::ONE
    }
}

impl ExpectedMatchesOp {
    pub(crate) fn new(args: MatchArgs, counts: Tensor) -> Result<Self> {
        if counts.dims() != [2, args.orders, args.batch, args.width] {
            bail!(
                "internal: the matches op's reference counts are {:?}, not [2, {}, {}, {}]",
                counts.dims(),
                args.orders,
                args.batch,
                args.width
            );
        }
        Ok(Self { args, counts })
    }

    /// `ν` and `κ` of order `n` for element `b`, `W` each, from the packed counts.
    #[inline]
    fn element_counts<'c, T>(&self, counts: &'c [T], order: usize, b: usize) -> (&'c [T], &'c [T]) {
        let a = &self.args;
        let at = |row: usize| &counts[(row * a.batch + b) * a.width..][..a.width];
        (at(order - 1), at(a.orders + order - 1))
    }

    /// The counts' CPU data as `T`, handed to `f`.
    fn with_counts<T: candle_core::WithDType, R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        let (storage, layout) = self.counts.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            bail!("internal: the matches op's reference counts are not on the CPU");
        };
        Ok(f(contiguous_slice::<T>(cpu, layout, "reference counts")?))
    }

    fn check_shapes(&self, x: &Shape, u: &Shape) -> Result<()> {
        let a = &self.args;
        if x.dims() != [a.batch, a.seq, a.width] || u.dims() != [a.batch, a.seq] {
            bail!(
                "internal: the matches op takes X [{}, {}, {}] and U [{}, {}], got {x:?} and {u:?}",
                a.batch,
                a.seq,
                a.width,
                a.batch,
                a.seq
            );
        }
        Ok(())
    }

    /// One element's `m_n` into `out` (`N`); `ngram` is an `S · W` scratch.
    fn element_forward<T: KernelFloat>(
        &self,
        b: usize,
        (x, u, counts): (&[T], &[T], &[T]),
        ngram: &mut [T],
        out: &mut [T],
    ) {
        let a = &self.args;
        let w = a.width;
        ngram.copy_from_slice(x);
        for order in 1..=a.orders {
            out[order - 1] = T::ZERO;
            let Some((rows, cols)) = a.starts(order) else {
                continue;
            };
            if order > 1 {
                for i in 0..rows {
                    for j in 0..cols {
                        ngram[i * w + j] *= x[(i + order - 1) * w + j + order - 1];
                    }
                }
            }
            let (first, clip) = self.element_counts(counts, order, b);
            let mut sum = T::ZERO;
            for j in 0..cols {
                let mut expected = T::ZERO;
                for i in 0..rows {
                    expected += ngram[i * w + j] * u[a.weight_index(order, i)];
                }
                let value = first[j] * expected;
                sum += if clip[j] < value { clip[j] } else { value };
            }
            out[order - 1] = sum;
        }
    }

    /// One element's gradients: `dx` (`S · W`) and `du` (`S`), from `grad_out` (`N`).
    /// `ngrams` holds `M_1 … M_N` (`N · S · W`), `pending` the gradient of the current `M_n`.
    #[allow(clippy::too_many_arguments)]
    fn element_backward<T: KernelFloat>(
        &self,
        b: usize,
        (x, u, counts): (&[T], &[T], &[T]),
        grad_out: &[T],
        (ngrams, pending, expected_grad): (&mut [T], &mut [T], &mut [T]),
        (dx, du): (&mut [T], &mut [T]),
    ) {
        let a = &self.args;
        let (s, w) = (a.seq, a.width);
        let plane = s * w;
        // The forward again, keeping every order's n-gram matches.
        let mut last = 0;
        for order in 1..=a.orders {
            let Some((rows, cols)) = a.starts(order) else {
                break;
            };
            last = order;
            if order == 1 {
                ngrams[..plane].copy_from_slice(x);
                continue;
            }
            let (before, current) = ngrams.split_at_mut((order - 1) * plane);
            let previous = &before[(order - 2) * plane..];
            for i in 0..rows {
                for j in 0..cols {
                    current[i * w + j] =
                        previous[i * w + j] * x[(i + order - 1) * w + j + order - 1];
                }
            }
        }
        dx.fill(T::ZERO);
        du.fill(T::ZERO);
        pending.fill(T::ZERO);
        for order in (1..=last).rev() {
            let (rows, cols) = a.starts(order).expect("a valid order");
            let ngram = &ngrams[(order - 1) * plane..][..plane];
            let (first, clip) = self.element_counts(counts, order, b);
            let upstream = grad_out[order - 1];
            // dE_j = (a_n · slope) · ν_j.
            for j in 0..cols {
                let mut expected = T::ZERO;
                for i in 0..rows {
                    expected += ngram[i * w + j] * u[a.weight_index(order, i)];
                }
                let nu = first[j];
                let slope = clip_slope(clip[j], nu * expected);
                expected_grad[j] = upstream * slope * nu;
            }
            // du_n[i] = Σ_j dE_j M_n[i, j]; the gradient of M_n gains dE_j u_n[i].
            for i in 0..rows {
                let weight = u[a.weight_index(order, i)];
                let mut sum = T::ZERO;
                for j in 0..cols {
                    sum += expected_grad[j] * ngram[i * w + j];
                    pending[i * w + j] += expected_grad[j] * weight;
                }
                du[a.weight_index(order, i)] += sum;
            }
            if order == 1 {
                for i in 0..rows {
                    for j in 0..cols {
                        dx[i * w + j] += pending[i * w + j];
                    }
                }
            } else {
                // M_n = M_{n−1} · X[i+n−1, j+n−1]: to that X, and down to M_{n−1}.
                let previous = &ngrams[(order - 2) * plane..][..plane];
                for i in 0..rows {
                    for j in 0..cols {
                        let at = (i + order - 1) * w + j + order - 1;
                        let g = pending[i * w + j];
                        dx[at] += g * previous[i * w + j];
                        pending[i * w + j] = g * x[at];
                    }
                }
            }
        }
    }

    fn cpu_forward<T: KernelFloat>(&self, x: &[T], u: &[T], counts: &[T]) -> Vec<T> {
        let a = &self.args;
        let (s, w, n) = (a.seq, a.width, a.orders);
        let mut out = vec![T::ZERO; a.batch * n];
        out.par_chunks_mut(n.max(1))
            .zip(x.par_chunks(s * w).zip(u.par_chunks(s)))
            .enumerate()
            .for_each_init(
                || vec![T::ZERO; s * w],
                |ngram, (b, (out, (x, u)))| self.element_forward(b, (x, u, counts), ngram, out),
            );
        out
    }

    /// `[B, S, W + 1]`: the gradient of `X` in the first `W` columns, of `U` in the last.
    fn cpu_backward<T: KernelFloat>(
        &self,
        x: &[T],
        u: &[T],
        counts: &[T],
        grad_out: &[T],
    ) -> Vec<T> {
        let a = &self.args;
        let (s, w, n) = (a.seq, a.width, a.orders);
        let mut grad = vec![T::ZERO; a.batch * s * (w + 1)];
        grad.par_chunks_mut(s * (w + 1))
            .zip(x.par_chunks(s * w).zip(u.par_chunks(s)))
            .enumerate()
            .for_each_init(
                || {
                    (
                        vec![T::ZERO; n * s * w],
                        vec![T::ZERO; s * w],
                        vec![T::ZERO; w],
                        vec![T::ZERO; s * w],
                        vec![T::ZERO; s],
                    )
                },
                |(ngrams, pending, expected_grad, dx, du), (b, (grad, (x, u)))| {
                    self.element_backward(
                        b,
                        (x, u, counts),
                        &grad_out[b * n..][..n],
                        (ngrams, pending, expected_grad),
                        (dx, du),
                    );
                    for i in 0..s {
                        grad[i * (w + 1)..][..w].copy_from_slice(&dx[i * w..][..w]);
                        grad[i * (w + 1) + w] = du[i];
                    }
                },
            );
        grad
    }
}

impl CustomOp2 for ExpectedMatchesOp {
    fn name(&self) -> &'static str {
        "expected-clipped-matches"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        u: &CpuStorage,
        u_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.check_shapes(x_layout.shape(), u_layout.shape())?;
        if x.dtype() != u.dtype() {
            bail!("internal: the matches op's X and U differ in dtype");
        }
        let out = dispatch_float!(x.dtype(), self.name(), <T> => {
            let (x, u) = (
                contiguous_slice::<T>(x, x_layout, "token matches")?,
                contiguous_slice::<T>(u, u_layout, "match weights")?,
            );
            let out = self.with_counts(|counts| self.cpu_forward(x, u, counts))?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(out))
        })?;
        Ok((out, Shape::from((self.args.batch, self.args.orders))))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_layout: &Layout,
        u: &candle_core::CudaStorage,
        u_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.check_shapes(x_layout.shape(), u_layout.shape())?;
        let out = super::cuda::forward(&self.args, &self.counts, (x, x_layout), (u, u_layout))?;
        Ok((out, Shape::from((self.args.batch, self.args.orders))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        u: &Tensor,
        _out: &Tensor,
        grad_out: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad_out = grad_out.contiguous()?;
        let grad = apply_backward_op3(&grad_out, x, u, &grad_out, MatchesBackward(self.clone()))?;
        let w = self.args.width;
        Ok((
            Some(grad.narrow(2, 0, w)?),
            Some(grad.narrow(2, w, 1)?.squeeze(2)?),
        ))
    }
}

/// The backward of an [`ExpectedMatchesOp`]: `(X, U, grad_out)` to `[B, S, W + 1]`.
struct MatchesBackward(ExpectedMatchesOp);

impl CustomOp3 for MatchesBackward {
    fn name(&self) -> &'static str {
        "expected-clipped-matches-backward"
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        u: &CpuStorage,
        u_layout: &Layout,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let a = &self.0.args;
        self.0.check_shapes(x_layout.shape(), u_layout.shape())?;
        let grad = dispatch_float!(x.dtype(), self.name(), <T> => {
            let (x, u, grad_out) = (
                contiguous_slice::<T>(x, x_layout, "token matches")?,
                contiguous_slice::<T>(u, u_layout, "match weights")?,
                contiguous_slice::<T>(grad_out, grad_layout, "gradient")?,
            );
            let grad = self
                .0
                .with_counts(|counts| self.0.cpu_backward(x, u, counts, grad_out))?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((grad, Shape::from((a.batch, a.seq, a.width + 1))))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_layout: &Layout,
        u: &candle_core::CudaStorage,
        u_layout: &Layout,
        grad_out: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let a = &self.0.args;
        self.0.check_shapes(x_layout.shape(), u_layout.shape())?;
        let grad = super::cuda::backward(
            a,
            &self.0.counts,
            (x, x_layout),
            (u, u_layout),
            (grad_out, grad_layout),
        )?;
        Ok((grad, Shape::from((a.batch, a.seq, a.width + 1))))
    }
}
