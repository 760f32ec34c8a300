//! The CTC loss's CPU kernel: one candle custom op, [`CtcOp`], over batch-first log-probabilities
//! or logits `[B, T, V]`, with its hand-written backward op, [`CtcOpBackward`], in this file.
//!
//! Per batch element (rayon over the batch), on raw slices:
//!
//! - from logits, each frame's `log Σ_v exp(x_v)` in one read of the row (the fused
//!   log-softmax: only the `2L + 1` emissions `x[l'_s] − lse` are ever formed);
//! - the forward recursion `α` in log space (f64, whatever the input dtype) over the states
//!   `s` of the extended target `l' = (blank, l_1, blank, …, l_L, blank)` that can still be on a
//!   path at frame `t` (`S − 2(T_b − t) <= s <= 2t + 1`), to `log p(l | x)`;
//! - backward, `α` again and `β` (without the emission at its own frame), the occupancies
//!   `γ_t(s) = exp(α_t(s) + β_t(s) − log p)`, and each frame's gradient in one pass over its
//!   `V` entries: `scale · softmax(x_t) − scale · Σ_{s: l'_s = v} γ_t(s)` from logits,
//!   `−scale · Σ_{s: l'_s = v} γ_t(s)` (sparse) from log-probabilities — the true gradient of
//!   the loss as a function of its input, not PyTorch's (pytorch/pytorch#52241).
//!
//! Frames at and beyond an element's input length are never read and get a zero gradient, so is
//! an element whose loss is infinite. The kernel takes plain, checked parameters
//! ([`CtcAlignments`]); it checks only the values it reads (NaN and `+inf`, and from logits any
//! infinity).

use crate::loss::kernels::backward::apply_backward_op3;
use crate::loss::kernels::cpu::{row_log_sum_exp, scaled_softmax_into, vocab_sized_buffer};
use crate::loss::kernels::float::{contiguous_slice, dispatch_float, KernelFloat};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// The alignments of a batch, checked against the input `[B, T, V]` by the caller: each
/// element's target (no blank, each `< V`, no padding), its input length (`1..=T`), the blank
/// (`< V`), and whether infinite losses become 0.
#[derive(Debug, Clone)]
pub(crate) struct CtcAlignments {
    pub targets: Vec<Vec<u32>>,
    pub input_lengths: Vec<usize>,
    pub blank: u32,
    pub zero_infinity: bool,
}

impl CtcAlignments {
    /// `l'_s`: the blank at even `s`, `l_{(s−1)/2}` at odd `s`; `2L + 1` states.
    pub(crate) fn extended(&self, element: usize) -> Vec<u32> {
        let mut states = vec![self.blank; 2 * self.targets[element].len() + 1];
        for (j, &label) in self.targets[element].iter().enumerate() {
            states[2 * j + 1] = label;
        }
        states
    }
}

/// Whether a path may skip from state `s − 2` to `s`: `l'_s` is a label that differs from the
/// label two states back (a blank is needed between repeats).
#[inline]
pub(crate) fn can_skip(states: &[u32], s: usize, blank: u32) -> bool {
    s >= 2 && states[s] != blank && states[s] != states[s - 2]
}

/// `log(e^a + e^b)`, exact at `-inf`.
#[inline]
fn log_add(a: f64, b: f64) -> f64 {
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY {
        hi
    } else {
        hi + (lo - hi).exp().ln_1p()
    }
}

/// `log(e^a + e^b + e^c)`, exact at `-inf`.
#[inline]
fn log_add3(a: f64, b: f64, c: f64) -> f64 {
    let hi = a.max(b).max(c);
    if hi == f64::NEG_INFINITY {
        return hi;
    }
    hi + ((a - hi).exp() + (b - hi).exp() + (c - hi).exp()).ln()
}

/// The CTC loss of each batch element, `[B]` (or `[B, 1 + T]` with each frame's log-sum-exp
/// when from logits), as a custom op on contiguous `[B, T, V]` f32 or f64 input.
#[derive(Clone)]
pub(crate) struct CtcOp {
    alignments: OpAlignments,
    /// The input is logits (a log-softmax is fused in), else log-probabilities.
    from_logits: bool,
}

/// Where a [`CtcOp`]'s alignments are.
#[derive(Clone)]
enum OpAlignments {
    /// Read and checked on the host: the CPU kernel reads them, the CUDA kernels get them
    /// uploaded.
    Host(Arc<CtcAlignments>),
    /// Left on the device, never read by the host (the CUDA kernels with `check_values` off):
    /// an element out of range gets a NaN loss and NaN gradients (`ctc.cu`).
    #[cfg(feature = "cuda-unverified")]
    Device(Arc<crate::loss::kernels::ctc::cuda::DeviceAlignments>),
}

/// One element's view of the input: its frames, emissions and states.
struct Element<'a, T> {
    /// The element's `[T, V]` input.
    x: &'a [T],
    vocab: usize,
    /// Frames read: the input length.
    frames: usize,
    /// `l'`, `S = 2L + 1` states.
    states: Vec<u32>,
    blank: u32,
}

impl<T: KernelFloat> Element<'_, T> {
    /// The emissions `log y_t(l'_s)`, `[frames, S]` in f64: `x − lse_t` from logits (`lse` given),
    /// `x` from log-probabilities.
    fn emissions(&self, lse: Option<&[f64]>) -> Vec<f64> {
        let states = self.states.len();
        let mut em = vec![0f64; self.frames * states];
        for t in 0..self.frames {
            let row = &self.x[t * self.vocab..(t + 1) * self.vocab];
            let shift = lse.map_or(0.0, |l| l[t]);
            for (e, &label) in em[t * states..(t + 1) * states]
                .iter_mut()
                .zip(&self.states)
            {
                *e = row[label as usize].to_f64() - shift;
            }
        }
        em
    }

    /// The states that can be on a complete path at frame `t`: `[lo, hi)`.
    fn window(&self, t: usize) -> (usize, usize) {
        let states = self.states.len();
        let lo = states.saturating_sub(2 * (self.frames - t));
        let hi = states.min(2 * t + 2);
        (lo, hi)
    }

    /// `α` (`[frames, S]`, log space, `-inf` off the window) and `log p(l | x)`.
    fn alpha(&self, em: &[f64]) -> (Vec<f64>, f64) {
        let states = self.states.len();
        let mut alpha = vec![f64::NEG_INFINITY; self.frames * states];
        let (lo, hi) = self.window(0);
        if lo < hi {
            // (lo >= hi: too few frames for the target, no state is on a path.)
            alpha[lo..hi].copy_from_slice(&em[lo..hi]);
        }
        for t in 1..self.frames {
            let (prev, row) = alpha.split_at_mut(t * states);
            let prev = &prev[(t - 1) * states..];
            let (lo, hi) = self.window(t);
            for s in lo..hi {
                let stay = prev[s];
                let step = if s >= 1 {
                    prev[s - 1]
                } else {
                    f64::NEG_INFINITY
                };
                let skip = if can_skip(&self.states, s, self.blank) {
                    prev[s - 2]
                } else {
                    f64::NEG_INFINITY
                };
                row[s] = log_add3(stay, step, skip) + em[t * states + s];
            }
        }
        let last = &alpha[(self.frames - 1) * states..];
        let log_p = if states >= 2 {
            log_add(last[states - 1], last[states - 2])
        } else {
            last[0]
        };
        (alpha, log_p)
    }

    /// Writes the element's gradient (`[T, V]`, zero beyond the input length on entry) for the
    /// upstream gradient `scale`: from logits (`lse` given) `scale · (softmax − posterior)`,
    /// else `−scale · posterior`.
    fn gradient(&self, lse: Option<&[T]>, scale: f64, grad: &mut [T]) {
        let states = self.states.len();
        let lse64: Option<Vec<f64>> = lse.map(|l| l.iter().map(|v| v.to_f64()).collect());
        let em = self.emissions(lse64.as_deref());
        let (alpha, log_p) = self.alpha(&em);
        if log_p == f64::NEG_INFINITY || scale == 0.0 {
            return; // an infinite loss (or no upstream gradient): zero gradient
        }
        let mut beta = vec![f64::NEG_INFINITY; states];
        let mut next = vec![f64::NEG_INFINITY; states];
        let (lo, hi) = self.window(self.frames - 1);
        for b in beta.iter_mut().take(hi).skip(lo) {
            *b = 0.0;
        }
        let scale_t = T::from_f64(scale);
        for t in (0..self.frames).rev() {
            let grad_row = &mut grad[t * self.vocab..(t + 1) * self.vocab];
            if let Some(lse) = lse {
                let row = &self.x[t * self.vocab..(t + 1) * self.vocab];
                scaled_softmax_into(grad_row, row, scale_t, lse[t]);
            }
            let (lo, hi) = self.window(t);
            for s in lo..hi {
                let log_gamma = alpha[t * states + s] + beta[s] - log_p;
                if log_gamma > f64::NEG_INFINITY {
                    let v = self.states[s] as usize;
                    grad_row[v] = T::from_f64(grad_row[v].to_f64() - scale * log_gamma.exp());
                }
            }
            if t == 0 {
                break;
            }
            // β_{t−1}(s) = log Σ_{s' ∈ {s, s+1, s+2 if a skip}} e^{β_t(s') + em_t(s')}.
            let (lo_prev, hi_prev) = self.window(t - 1);
            next.fill(f64::NEG_INFINITY);
            let em_t = &em[t * states..(t + 1) * states];
            for s in lo_prev..hi_prev {
                let stay = beta[s] + em_t[s];
                let step = if s + 1 < states {
                    beta[s + 1] + em_t[s + 1]
                } else {
                    f64::NEG_INFINITY
                };
                let skip = if s + 2 < states && can_skip(&self.states, s + 2, self.blank) {
                    beta[s + 2] + em_t[s + 2]
                } else {
                    f64::NEG_INFINITY
                };
                next[s] = log_add3(stay, step, skip);
            }
            std::mem::swap(&mut beta, &mut next);
        }
    }
}

/// `true` if `row` holds NaN or `+inf` (log-probabilities may be `-inf`).
fn has_nan_or_pos_inf<T: KernelFloat>(row: &[T]) -> bool {
    row.iter().any(|&x| {
        let x = x.to_f64();
        x.is_nan() || x == f64::INFINITY
    })
}

impl CtcOp {
    pub(crate) fn new(alignments: CtcAlignments, from_logits: bool) -> Self {
        Self {
            alignments: OpAlignments::Host(Arc::new(alignments)),
            from_logits,
        }
    }

    /// The op over alignments left on the device (CUDA only: no host copy of the targets or
    /// lengths; see [`DeviceAlignments::unchecked`](crate::loss::kernels::ctc::cuda::DeviceAlignments::unchecked)).
    #[cfg(feature = "cuda-unverified")]
    pub(crate) fn on_device(
        alignments: crate::loss::kernels::ctc::cuda::DeviceAlignments,
        from_logits: bool,
    ) -> Self {
        Self {
            alignments: OpAlignments::Device(Arc::new(alignments)),
            from_logits,
        }
    }

    /// The host alignments the CPU kernel reads.
    fn host_alignments(&self) -> Result<&CtcAlignments> {
        match &self.alignments {
            OpAlignments::Host(alignments) => Ok(alignments),
            #[cfg(feature = "cuda-unverified")]
            OpAlignments::Device(_) => {
                candle_core::bail!("internal: a CTC op over device alignments on the CPU")
            }
        }
    }

    /// The loss of each element, `[B]`, differentiable with respect to `x` (`[B, T, V]`).
    pub(crate) fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let out = x.contiguous()?.apply_op1(self.clone())?;
        out.narrow(1, 0, 1)?.squeeze(1)
    }

    fn argument(&self) -> &'static str {
        if self.from_logits {
            "logits"
        } else {
            "log_probs"
        }
    }

    fn width(&self, frames: usize) -> usize {
        if self.from_logits {
            1 + frames
        } else {
            1
        }
    }

    /// What the CUDA kernels take for input of shape `shape` on `device`: the sizes and
    /// settings, and the alignments uploaded as u32 tensors.
    #[cfg(feature = "cuda-unverified")]
    fn cuda_args(
        &self,
        shape: &Shape,
        device: &candle_core::CudaDevice,
    ) -> Result<(
        crate::loss::kernels::ctc::launch::CtcArgs,
        Arc<crate::loss::kernels::ctc::cuda::DeviceAlignments>,
    )> {
        let (batch, frames, vocab) = shape.dims3()?;
        let device_alignments = match &self.alignments {
            OpAlignments::Host(host) => {
                Arc::new(crate::loss::kernels::ctc::cuda::DeviceAlignments::upload(
                    (&host.targets, &host.input_lengths),
                    (host.blank, host.zero_infinity),
                    &candle_core::Device::Cuda(device.clone()),
                )?)
            }
            OpAlignments::Device(on_device) => on_device.clone(),
        };
        let args = crate::loss::kernels::ctc::launch::CtcArgs {
            batch,
            frames,
            vocab,
            target_max: device_alignments.target_max,
            blank: device_alignments.blank,
            from_logits: self.from_logits,
            zero_infinity: device_alignments.zero_infinity,
        };
        Ok((args, device_alignments))
    }

    fn element<'a, T>(
        alignments: &CtcAlignments,
        x: &'a [T],
        b: usize,
        (frames, vocab): (usize, usize),
    ) -> Element<'a, T> {
        Element {
            x: &x[b * frames * vocab..(b + 1) * frames * vocab],
            vocab,
            frames: alignments.input_lengths[b],
            states: alignments.extended(b),
            blank: alignments.blank,
        }
    }

    fn cpu_forward<T: KernelFloat>(&self, x: &[T], shape: &Shape) -> Result<Vec<T>> {
        let alignments = self.host_alignments()?;
        let (batch, frames, vocab) = shape.dims3()?;
        let width = self.width(frames);
        let mut out = vec![T::ZERO; batch * width];
        let bad = out
            .par_chunks_mut(width)
            .enumerate()
            .map(|(b, out_row)| {
                let element = Self::element(alignments, x, b, (frames, vocab));
                let mut lse = vec![0f64; element.frames];
                for (t, l) in lse.iter_mut().enumerate() {
                    let row = &element.x[t * vocab..(t + 1) * vocab];
                    if self.from_logits {
                        match row_log_sum_exp(row) {
                            Some(v) => {
                                *l = v;
                                out_row[1 + t] = T::from_f64(v);
                            }
                            None => return Some((b, t)),
                        }
                    } else if has_nan_or_pos_inf(row) {
                        return Some((b, t));
                    }
                }
                // From logits the emissions subtract the lse as stored (in `T`), so that the
                // backward, which reads it back, sees the same numbers.
                if self.from_logits {
                    for (l, stored) in lse.iter_mut().zip(&out_row[1..]) {
                        *l = stored.to_f64();
                    }
                }
                let em = element.emissions(self.from_logits.then_some(&lse[..]));
                let (_, log_p) = element.alpha(&em);
                out_row[0] = if log_p == f64::NEG_INFINITY {
                    if alignments.zero_infinity {
                        T::ZERO
                    } else {
                        T::from_f64(f64::INFINITY)
                    }
                } else {
                    T::from_f64(-log_p)
                };
                None
            })
            .find_any(Option::is_some)
            .flatten();
        if let Some(frame) = bad {
            return Err(non_finite_frame(
                self.argument(),
                self.from_logits,
                frame,
                shape.dims(),
            ));
        }
        Ok(out)
    }

    fn cpu_backward<T: KernelFloat>(
        &self,
        x: &[T],
        shape: &Shape,
        out: &[T],
        grad_out: &[T],
    ) -> Result<Vec<T>> {
        let alignments = self.host_alignments()?;
        let (batch, frames, vocab) = shape.dims3()?;
        let width = self.width(frames);
        if out.len() != batch * width || grad_out.len() != batch * width {
            bail!("internal: the CTC backward got an output of the wrong size");
        }
        let mut grad = vocab_sized_buffer::<T>(x.len());
        grad.par_chunks_mut((frames * vocab).max(1))
            .enumerate()
            .for_each(|(b, grad_element)| {
                // An infinite loss (zeroed or not) gets a zero gradient: `gradient` finds
                // `log p = -inf` again and writes nothing.
                let element = Self::element(alignments, x, b, (frames, vocab));
                let lse = self
                    .from_logits
                    .then(|| &out[b * width + 1..b * width + 1 + element.frames]);
                element.gradient(lse, grad_out[b * width].to_f64(), grad_element);
            });
        Ok(grad)
    }
}

impl CustomOp1 for CtcOp {
    fn name(&self) -> &'static str {
        if self.from_logits {
            "candle-bleu-ctc-from-logits"
        } else {
            "candle-bleu-ctc"
        }
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let (batch, frames, _) = layout.shape().dims3()?;
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let x = contiguous_slice::<T>(storage, layout, self.argument())?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.cpu_forward(x, layout.shape())?))
        })?;
        Ok((out, Shape::from((batch, self.width(frames)))))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (args, alignments) = self.cuda_args(layout.shape(), storage.device())?;
        let out = crate::loss::kernels::ctc::cuda::forward(&args, &alignments, storage, layout)?;
        Ok((out, Shape::from((args.batch, args.width()))))
    }

    fn bwd(&self, x: &Tensor, out: &Tensor, grad_out: &Tensor) -> Result<Option<Tensor>> {
        let grad_out = grad_out.contiguous()?;
        let grad = apply_backward_op3(
            &grad_out,
            x,
            &out.contiguous()?,
            &grad_out,
            CtcOpBackward(self.clone()),
        )?;
        Ok(Some(grad))
    }
}

/// The backward of a [`CtcOp`]: `(x, out, grad_out)` to the gradient with respect to `x`.
struct CtcOpBackward(CtcOp);

impl CustomOp3 for CtcOpBackward {
    fn name(&self) -> &'static str {
        if self.0.from_logits {
            "candle-bleu-ctc-from-logits-backward"
        } else {
            "candle-bleu-ctc-backward"
        }
    }

    fn cpu_fwd(
        &self,
        x: &CpuStorage,
        x_layout: &Layout,
        out: &CpuStorage,
        out_layout: &Layout,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = x_layout.shape();
        let grad = dispatch_float!(x.dtype(), self.name(), <T> => {
            let grad = self.0.cpu_backward(
                contiguous_slice::<T>(x, x_layout, self.0.argument())?,
                shape,
                contiguous_slice::<T>(out, out_layout, "output")?,
                contiguous_slice::<T>(grad_out, grad_layout, "gradient")?,
            )?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((grad, shape.clone()))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        x: &candle_core::CudaStorage,
        x_layout: &Layout,
        out: &candle_core::CudaStorage,
        out_layout: &Layout,
        grad_out: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (args, alignments) = self.0.cuda_args(x_layout.shape(), x.device())?;
        let grad = crate::loss::kernels::ctc::cuda::backward(
            &args,
            &alignments,
            (x, x_layout),
            (out, out_layout),
            (grad_out, grad_layout),
        )?;
        Ok((grad, x_layout.shape().clone()))
    }
}

/// The error of a CTC input `name` (`[B, T', V]` of shape `dims`) whose frame `(b, t)` holds a
/// value the loss cannot take: NaN or `+inf` in log-probabilities, or any non-finite logit.
/// The one message of the validation's check (`checked`) and the CPU kernel's own.
pub(crate) fn non_finite_frame(
    name: &str,
    from_logits: bool,
    (b, t): (usize, usize),
    dims: &[usize],
) -> candle_core::Error {
    let (what, needs) = if from_logits {
        ("NaN or infinite values", "finite logits")
    } else {
        ("NaN or +inf", "log-probabilities that are finite or -inf")
    };
    candle_core::Error::Msg(format!(
        "`{name}` contains {what} at batch element {b}, frame {t} (shape {dims:?}); the CTC loss needs {needs}"
    ))
    .bt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collapse `𝓑`: merge repeats, drop blanks.
    fn collapse(path: &[u32], blank: u32) -> Vec<u32> {
        let mut out = Vec::new();
        let mut previous = None;
        for &id in path {
            if Some(id) != previous && id != blank {
                out.push(id);
            }
            previous = Some(id);
        }
        out
    }

    /// `log p(l | x)` by enumerating every path of `frames` ids in `0..vocab`.
    fn brute_force(x: &[f64], frames: usize, vocab: usize, target: &[u32], blank: u32) -> f64 {
        let mut total = 0f64;
        let mut path = vec![0u32; frames];
        for code in 0..vocab.pow(frames as u32) {
            let mut c = code;
            for id in path.iter_mut() {
                *id = (c % vocab) as u32;
                c /= vocab;
            }
            if collapse(&path, blank) == target {
                total += path
                    .iter()
                    .enumerate()
                    .map(|(t, &k)| x[t * vocab + k as usize])
                    .sum::<f64>()
                    .exp();
            }
        }
        total.ln()
    }

    /// The recursion `α` over the pruned state window equals the sum over every path, for
    /// targets with and without repeats, too long for their frames, empty, and blanks first,
    /// in the middle and last.
    #[test]
    fn alpha_equals_the_sum_over_all_paths() {
        let vocab = 4;
        for frames in 1..=6 {
            let x: Vec<f64> = (0..frames * vocab)
                .map(|i| ((i * 7919 % 13) as f64) * -0.3 - 0.1)
                .collect();
            for blank in [0u32, 2, 3] {
                let labels: Vec<u32> = (0..vocab as u32).filter(|&k| k != blank).collect();
                let (a, b) = (labels[0], labels[1]);
                for target in [
                    vec![],
                    vec![a],
                    vec![a, a],
                    vec![a, b],
                    vec![b, a, b],
                    vec![a, a, a],
                ] {
                    let element = Element {
                        x: &x[..],
                        vocab,
                        frames,
                        states: CtcAlignments {
                            targets: vec![target.clone()],
                            input_lengths: vec![frames],
                            blank,
                            zero_infinity: false,
                        }
                        .extended(0),
                        blank,
                    };
                    let (_, log_p) = element.alpha(&element.emissions(None));
                    let expected = brute_force(&x, frames, vocab, &target, blank);
                    if expected == f64::NEG_INFINITY {
                        assert_eq!(log_p, expected, "T = {frames}, {target:?}");
                    } else {
                        assert!(
                            (log_p - expected).abs() < 1e-12,
                            "T = {frames}, blank {blank}, {target:?}: {log_p} vs {expected}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn log_add_is_exact_at_negative_infinity() {
        let ninf = f64::NEG_INFINITY;
        assert_eq!(log_add(ninf, ninf), ninf);
        assert_eq!(log_add(ninf, -3.0), -3.0);
        assert_eq!(log_add3(ninf, ninf, ninf), ninf);
        assert!((log_add3(0.0, 0.0, ninf) - 2f64.ln()).abs() < 1e-15);
    }
}
