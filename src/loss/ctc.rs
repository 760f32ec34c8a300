//! The CTC loss (Graves et al. 2006): PyTorch's `F.ctc_loss`, batch-first, with the true
//! gradient of its input, and greedy CTC decoding. The definitions, recursions and gradients
//! are `docs/loss.md`, "CTC loss", in the repository.
//!
//! On the CPU one custom op (`kernels::ctc::op`) runs the forward–backward recursions in log
//! space over each batch element (rayon over the batch) with a hand-written backward; from
//! logits it fuses the log-softmax (one read of each frame forward, one write of its gradient
//! backward). Elsewhere, and in the `_composed` references, composed candle ops run the forward
//! recursion and candle's autograd gives the gradient. The same numbers to rounding.

use super::checked::ctc::{ctc_call, ctc_decode_call, CheckedCtc, CtcTargets};
use super::config::{constant, CtcConfig, CtcReduction};
use super::dispatch::Path;
use super::host;
use super::kernels::ctc::composed::{ctc_losses, without_padding_frames};
use super::kernels::ctc::op::CtcOp;
use candle_core::{Result, Tensor, D};

/// The CTC loss of batch-first log-probabilities: PyTorch's
/// `F.ctc_loss(log_probs.transpose(0, 1), targets, input_lengths, target_lengths, blank,
/// reduction, zero_infinity)`.
///
/// For element `b` with input length `T_b` and target `l` (its first `target_lengths[b]` ids),
/// `loss_b = −log Σ_{π ∈ B⁻¹(l)} Π_{t < T_b} exp(log_probs[b, t, π_t])` over the alignments
/// `π` of `T_b` frames that collapse to `l` (merge repeats, then drop blanks). `log_probs` is
/// not required to be normalised, and the gradient is the true gradient of this function of
/// `log_probs` (minus the posterior occupancy of each label at each frame, scaled): a
/// finite-difference check on a leaf `log_probs` passes, and a candle `log_softmax` before it
/// gives the exact logits gradient. PyTorch's gradient for `log_probs` instead assumes a
/// log-softmax upstream (pytorch/pytorch#52241); through a log-softmax the two agree.
///
/// **Batch-first**: `log_probs` is `[B, T', V]`, where PyTorch takes time-first `[T, B, V]`.
///
/// **From logits**, PyTorch's `F.ctc_loss(F.log_softmax(x, -1), …)` is
/// `ctc_loss(&log_softmax(&x)?, …)` with the crate's [`log_softmax`](super::log_softmax) (one
/// pass forward and one backward; 1.25–1.6× the fused op and about 0.7× PyTorch's own idiom
/// on 2 CPU cores, where candle-nn's composed `log_softmax` costs about 5×), and [`ctc_loss_from_logits`]`(&x, …)` is the same loss fused into one op, the fastest:
/// no `[B, T', V]` log-probabilities, and no gradient of them for candle's autograd to
/// accumulate between two ops (BENCHMARKS.md).
///
/// # Arguments
/// * `log_probs` - float `[B, T', V]`; f32 and f64 are computed in their dtype, f16 and bf16 in
///   f32. Values may be `-inf` (probability 0), never NaN or `+inf` (checked in the frames
///   within `input_lengths`: on the CPU always, off it with [`CtcConfig::check_values`], one
///   counted copy). Frames beyond an element's input length are not read and get a zero
///   gradient.
/// * `targets` - u32, i32 or i64 `[B, L]`, padded: row `b`'s first `target_lengths[b]` ids are
///   its target, each `< V` and not the blank; the rest is padding, never read. A label
///   repeated in a row needs a blank frame between its two occurrences, so a target with `r`
///   adjacent repeats needs `T_b >= L_b + r`.
/// * `input_lengths` - u32, i32 or i64 `[B]`, each in `1..=T'`.
/// * `target_lengths` - u32, i32 or i64 `[B]`, each in `0..=L`.
/// * `cfg` - the blank (any id `< V`), the reduction, `zero_infinity`.
///
/// Returns, in the compute dtype: a scalar for [`CtcReduction::Mean`] (each loss divided by its
/// target length clamped to `>= 1`, then the batch mean, as PyTorch) and
/// [`CtcReduction::Sum`], `[B]` for [`CtcReduction::None`]. An element no alignment produces
/// (too few frames, or zero probabilities) has loss `+inf`, or 0 with `cfg.zero_infinity`; its
/// gradient is 0 either way (PyTorch's is NaN without `zero_infinity`).
///
/// Errors (naming the argument and its shape, value, dtype or device) on a wrong rank, dtype or
/// shape, mismatched batch sizes or devices, `blank >= V`, a target id that is the blank or
/// `>= V` (or negative), a negative length, `input_lengths[b]` of 0 or above `T'`,
/// `target_lengths[b] > L`, and NaN or `+inf` in `log_probs` (on the CPU, or with
/// `check_values`).
///
/// Reads `targets` and both lengths to the host (three counted copies,
/// [`host_copies`](super::host_copies)) to check them — except where the CUDA kernels run
/// (feature `cuda-unverified`) with `cfg.check_values` off, the training path on a GPU: there
/// they stay on the device, their dtypes and shapes checked, not their values, and an element
/// whose target or lengths are out of range gets a NaN loss and NaN gradients.
///
/// ```
/// use candle_bleu::loss::{ctc_loss, CtcConfig};
/// use candle_core::{Device, Tensor};
/// let dev = Device::Cpu;
/// // One element, two frames, V = 2 (blank 0, label 1), both frames uniform.
/// let log_probs = Tensor::new(&[[[0.5f64.ln(), 0.5f64.ln()], [0.5f64.ln(), 0.5f64.ln()]]], &dev)?;
/// let targets = Tensor::new(&[[1u32]], &dev)?;
/// let (input_lengths, target_lengths) = (Tensor::new(&[2u32], &dev)?, Tensor::new(&[1u32], &dev)?);
/// let loss = ctc_loss(&log_probs, &targets, &input_lengths, &target_lengths, &CtcConfig::default())?;
/// // "1" has three alignments: (1, 1), (1, blank), (blank, 1), each of probability 1/4.
/// assert!((loss.to_scalar::<f64>()? - (4.0f64 / 3.0).ln()).abs() < 1e-12);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_loss(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    let path = Path::for_device(log_probs.device());
    ctc_on(
        "log_probs",
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        cfg,
        false,
        path,
    )
}

/// The CTC loss of batch-first logits, the log-softmax fused into it: [`ctc_loss`] of
/// `log_softmax(logits, -1)`, the fast path.
///
/// On the CPU one custom op reads each frame within the input lengths once forward (its
/// log-sum-exp; only the `2L + 1` emissions are ever formed) and writes its gradient once
/// backward: `scale · (softmax(logits[b, t]) − posterior[b, t])`, where the posterior sums
/// the occupancies of the states of each label; no `[B, T', V]` log-probabilities are stored.
///
/// `logits` is float `[B, T', V]`, finite within the input lengths (checked on the CPU, and off
/// it with `check_values`); the other arguments, the result and the errors are those of
/// [`ctc_loss`].
///
/// ```
/// use candle_bleu::loss::{ctc_loss_from_logits, CtcConfig, CtcReduction};
/// use candle_core::{Device, Tensor};
/// let dev = Device::Cpu;
/// let logits = Tensor::zeros((2, 4, 5), candle_core::DType::F32, &dev)?; // uniform over 5
/// let targets = Tensor::new(&[[1u32, 2], [3, 3]], &dev)?;
/// let input_lengths = Tensor::new(&[4u32, 3], &dev)?;
/// let target_lengths = Tensor::new(&[2u32, 2], &dev)?;
/// let cfg = CtcConfig { reduction: CtcReduction::None, ..Default::default() };
/// let losses = ctc_loss_from_logits(&logits, &targets, &input_lengths, &target_lengths, &cfg)?;
/// let losses = losses.to_vec1::<f32>()?;
/// // "1 2" in 4 frames: 15 alignments of probability 5⁻⁴. "3 3" in 3 frames: only (3, blank, 3).
/// assert!((losses[0] - (625f32 / 15.0).ln()).abs() < 1e-5);
/// assert!((losses[1] - 125f32.ln()).abs() < 1e-5);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_loss_from_logits(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    let path = Path::for_device(logits.device());
    ctc_on(
        "logits",
        logits,
        targets,
        input_lengths,
        target_lengths,
        cfg,
        true,
        path,
    )
}

/// [`ctc_loss`] as composed candle ops (the forward recursion over frames on `[B, 2L + 1]`
/// tensors, candle's autograd for the gradient), never the crate's kernel: the reference the
/// kernel is tested against, and what devices without the kernel run. The same value and
/// gradient to rounding; slow (`T'` steps of small ops).
pub fn ctc_loss_composed(
    log_probs: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    ctc_on(
        "log_probs",
        log_probs,
        targets,
        input_lengths,
        target_lengths,
        cfg,
        false,
        Path::Composed,
    )
}

/// [`ctc_loss_from_logits`] as composed candle ops: `candle_nn::ops::log_softmax`, then
/// [`ctc_loss_composed`]. The reference of the fused kernel.
pub fn ctc_loss_from_logits_composed(
    logits: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
) -> Result<Tensor> {
    ctc_on(
        "logits",
        logits,
        targets,
        input_lengths,
        target_lengths,
        cfg,
        true,
        Path::Composed,
    )
}

#[allow(clippy::too_many_arguments)]
fn ctc_on(
    name: &str,
    input: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
    from_logits: bool,
    path: Path,
) -> Result<Tensor> {
    let CheckedCtc {
        input,
        targets,
        path,
    } = ctc_call(
        name,
        input,
        targets,
        input_lengths,
        target_lengths,
        cfg,
        from_logits,
        path,
    )?;
    let (alignments, target_lengths) = match targets {
        CtcTargets::Host {
            alignments,
            target_lengths,
        } => (alignments, target_lengths),
        #[cfg(feature = "cuda-unverified")]
        CtcTargets::Device(alignments) => {
            let target_lengths = alignments.target_lengths.clone();
            let losses = CtcOp::on_device(alignments, from_logits).apply(&input)?;
            return reduce_on_device(&losses, &target_lengths, cfg.reduction);
        }
    };
    let losses = if path.runs_ctc_kernels(input.device()) {
        CtcOp::new(alignments, from_logits).apply(&input)?
    } else {
        // Padding frames may hold anything (NaN too): zeroed before the log-softmax, whose
        // backward would otherwise spread NaN into their gradient.
        let input = without_padding_frames(&input, &alignments.input_lengths)?;
        if from_logits {
            let log_probs = candle_nn::ops::log_softmax(&input, D::Minus1)?;
            ctc_losses(&log_probs, &alignments)?
        } else {
            ctc_losses(&input, &alignments)?
        }
    };
    reduce(&losses, &target_lengths, cfg.reduction)
}

/// [`reduce`] with the target lengths on the device (u32 `[B]`, never read by the host): the
/// mean's weights `1 / (max(L_b, 1)·B)` made there.
#[cfg(feature = "cuda-unverified")]
fn reduce_on_device(
    losses: &Tensor,
    target_lengths: &Tensor,
    reduction: CtcReduction,
) -> Result<Tensor> {
    match reduction {
        CtcReduction::None => Ok(losses.clone()),
        CtcReduction::Sum => losses.sum(0),
        CtcReduction::Mean => {
            let batch = losses.dim(0)? as f64;
            let weights = target_lengths
                .to_dtype(losses.dtype())?
                .maximum(1.0)?
                .affine(batch, 0.0)?
                .recip()?;
            (losses * weights)?.sum(0)
        }
    }
}

/// The losses `[B]` reduced as PyTorch does: `Mean` = `mean_b(loss_b / max(L_b, 1))`.
fn reduce(losses: &Tensor, target_lengths: &[usize], reduction: CtcReduction) -> Result<Tensor> {
    match reduction {
        CtcReduction::None => Ok(losses.clone()),
        CtcReduction::Sum => losses.sum(0),
        CtcReduction::Mean => {
            let batch = target_lengths.len() as f64;
            let weights: Vec<f64> = target_lengths
                .iter()
                .map(|&l| 1.0 / (l.max(1) as f64 * batch))
                .collect();
            let weights = constant(
                weights,
                target_lengths.len(),
                losses.dtype(),
                losses.device(),
            )?;
            (losses * weights)?.sum(0)
        }
    }
}

/// Greedy (best-path) CTC decoding: each frame's most likely id (argmax over `V`, so logits,
/// log-probabilities and probabilities decode alike), over each element's first
/// `input_lengths[b]` frames, then repeats merged, then blanks dropped.
///
/// * `logits` - float `[B, T', V]` (batch-first); the argmax runs on its device, and only the
///   u32 ids `[B, T']` are copied to the host (one counted copy, plus one for the lengths).
/// * `input_lengths` - u32, i32 or i64 `[B]`, each in `0..=T'`; `None`: every frame.
/// * `blank` - the blank's id, `< V`.
///
/// Errors on a wrong rank or dtype, `blank >= V`, or lengths of the wrong dtype, shape or
/// device, negative or above `T'`.
///
/// ```
/// use candle_bleu::loss::ctc_greedy_decode;
/// use candle_core::{Device, Tensor};
/// // Frames' argmax: 1 1 0 1 2 2 -> merge repeats: 1 0 1 2 -> drop blanks (0): 1 1 2.
/// let ids = [1u32, 1, 0, 1, 2, 2];
/// let logits: Vec<f32> = ids.iter().flat_map(|&i| (0..3).map(move |v| if v == i { 1.0 } else { 0.0 })).collect();
/// let logits = Tensor::from_vec(logits, (1, 6, 3), &Device::Cpu)?;
/// assert_eq!(ctc_greedy_decode(&logits, None, 0)?, vec![vec![1, 1, 2]]);
/// # Ok::<(), candle_core::Error>(())
/// ```
pub fn ctc_greedy_decode(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    blank: u32,
) -> Result<Vec<Vec<u32>>> {
    let lengths = ctc_decode_call(logits, input_lengths, blank)?;
    let best = host::to_vec2::<u32>(&logits.argmax(D::Minus1)?)?;
    Ok(best
        .iter()
        .zip(&lengths)
        .map(|(frames, &length)| {
            let mut out = Vec::new();
            let mut previous = None;
            for &id in &frames[..length] {
                if Some(id) != previous && id != blank {
                    out.push(id);
                }
                previous = Some(id);
            }
            out
        })
        .collect())
}
