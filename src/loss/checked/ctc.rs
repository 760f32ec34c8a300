//! CTC: the arguments of `ctc_loss`, `ctc_loss_from_logits`, their composed references and
//! `ctc_greedy_decode` ([`ctc_call`], [`ctc_decode_call`]), and of the BLEU loss on CTC outputs
//! ([`ctc_bleu_call`]). Lengths and targets are read to the host (counted copies: the alignment
//! structure is built there); the pieces here are meant for every CTC entry point.

use super::logits::{float_compute_dtype, logits_shape, CheckedHypotheses, HypothesisShape};
use super::targets::reference_arguments;
use crate::loss::config::{BleuLossConfig, CtcConfig, Form, LengthModel};
use crate::loss::dispatch::Path;
use crate::loss::host;
#[cfg(feature = "cuda-unverified")]
use crate::loss::kernels::ctc::cuda::DeviceAlignments;
use crate::loss::kernels::ctc::op::{non_finite_frame, CtcAlignments};
use crate::loss::references::References;
use crate::loss::score;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Checked arguments of a CTC loss: the input in its compute dtype, the targets and lengths
/// (read and checked on the host, or left on the device) and the path.
pub(crate) struct CheckedCtc {
    /// The input `[B, T', V]` in its compute dtype (f32 for f16/bf16), contiguous.
    pub input: Tensor,
    pub targets: CtcTargets,
    pub path: Path,
}

/// A CTC loss's targets and lengths, as the loss takes them.
pub(crate) enum CtcTargets {
    /// Read to the host and checked there (three counted copies off the CPU): the alignments
    /// every back-end takes, and each target length (for the mean).
    Host {
        alignments: CtcAlignments,
        target_lengths: Vec<usize>,
    },
    /// Left on the device, never read by the host: the CUDA kernels' training path with
    /// `check_values` off (`cuda-unverified`). Dtypes and shapes are checked, values are not: an
    /// element out of range gets a NaN loss and NaN gradients from the kernels.
    #[cfg(feature = "cuda-unverified")]
    Device(DeviceAlignments),
}

/// Checks a batch-first CTC input `name` (`log_probs` or `logits`): float `[B, T', V]` with
/// `B, T', V >= 1`. Returns the compute dtype (f32 for f16/bf16) and `(B, T', V)`.
fn ctc_input_shape(name: &str, t: &Tensor) -> Result<(DType, (usize, usize, usize))> {
    let dims = match t.dims() {
        &[b, frames, v] => (b, frames, v),
        dims => bail!(
            "`{name}` must be batch-first [B, T', V] (PyTorch's ctc_loss takes time-first [T, B, V]), got shape {dims:?}"
        ),
    };
    let dtype = float_compute_dtype(name, t)?;
    if dims.0 == 0 || dims.1 == 0 || dims.2 == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, T' and V must be >= 1",
            t.dims()
        );
    }
    Ok((dtype, dims))
}

/// Checks that `name` is a u32, i32 or i64 tensor of `shape` (described as `expected`) on
/// `device`, without reading it.
fn ctc_integer_tensor(
    name: &str,
    t: &Tensor,
    shape: &[usize],
    expected: &str,
    device: &Device,
) -> Result<()> {
    if !matches!(t.dtype(), DType::U32 | DType::I32 | DType::I64) || t.dims() != shape {
        bail!(
            "`{name}` must be u32, i32 or i64 {expected}, got {:?} with shape {:?}",
            t.dtype(),
            t.dims()
        );
    }
    if !t.device().same_device(device) {
        bail!(
            "`{name}` is on {:?} but the input is on {device:?}",
            t.device()
        );
    }
    Ok(())
}

/// The values of the integer tensor `name` (u32, i32 or i64, any shape) as i64, in one counted
/// copy to the host, after checking its dtype, its shape (`shape`, described in `expected`) and
/// its device.
fn ctc_integers(
    name: &str,
    t: &Tensor,
    shape: &[usize],
    expected: &str,
    device: &Device,
) -> Result<Vec<i64>> {
    ctc_integer_tensor(name, t, shape, expected, device)?;
    let flat = t.flatten_all()?;
    Ok(match t.dtype() {
        DType::U32 => host::to_vec1::<u32>(&flat)?
            .into_iter()
            .map(i64::from)
            .collect(),
        DType::I32 => host::to_vec1::<i32>(&flat)?
            .into_iter()
            .map(i64::from)
            .collect(),
        _ => host::to_vec1::<i64>(&flat)?,
    })
}

/// Checked lengths `name` (u32, i32 or i64 `[B]`, each in `0..=limit`, the size of the
/// dimension `limit_name`), on the host.
fn ctc_lengths(
    name: &str,
    lengths: &Tensor,
    batch: usize,
    (limit, limit_name): (usize, &str),
    described: &str,
    device: &Device,
) -> Result<Vec<usize>> {
    let values = ctc_integers(
        name,
        lengths,
        &[batch],
        &format!("[{batch}] ({described})"),
        device,
    )?;
    values
        .iter()
        .enumerate()
        .map(|(b, &length)| {
            if length < 0 {
                bail!("`{name}[{b}]` = {length} is negative");
            }
            if length as usize > limit {
                bail!("`{name}[{b}]` = {length} exceeds {limit_name} = {limit} ({described})");
            }
            Ok(length as usize)
        })
        .collect()
}

/// Checked `input_lengths` of a CTC input `[B, T', V]` (described in `described`): u32, i32 or
/// i64 `[B]` on `device`, each in `0..=T'`, as host values (one counted copy).
fn ctc_input_lengths(
    input_lengths: &Tensor,
    (batch, frames): (usize, usize),
    described: &str,
    device: &Device,
) -> Result<Vec<usize>> {
    ctc_lengths(
        "input_lengths",
        input_lengths,
        batch,
        (frames, "T'"),
        described,
        device,
    )
}

/// Checks that `blank` is in the vocabulary `V` (of the input described in `described`).
fn ctc_blank(blank: u32, vocab: usize, described: &str) -> Result<()> {
    if blank as usize >= vocab {
        bail!("`blank` {blank} is out of the vocabulary (V = {vocab}, {described})");
    }
    Ok(())
}

/// Checked CTC targets: `targets` u32, i32 or i64 `[B, L]` on `device`, `target_lengths` likewise
/// `[B]`, each `<= L`; the first `target_lengths[b]` ids of row `b` each `< V` and not `blank`
/// (the rest is padding, not read). Returns each element's target on the host and the lengths
/// (two counted copies).
fn ctc_targets(
    targets: &Tensor,
    target_lengths: &Tensor,
    (batch, vocab): (usize, usize),
    blank: u32,
    described: &str,
    device: &Device,
) -> Result<(Vec<Vec<u32>>, Vec<usize>)> {
    let width = match targets.dims() {
        &[b, width] if b == batch => width,
        dims => bail!(
            "`targets` must be padded [B, L] with B = {batch} ({described}), got shape {dims:?}"
        ),
    };
    let lengths = ctc_lengths(
        "target_lengths",
        target_lengths,
        batch,
        (width, "L, the width of `targets`"),
        described,
        device,
    )?;
    let ids = ctc_integers(
        "targets",
        targets,
        &[batch, width],
        &format!("[{batch}, {width}]"),
        device,
    )?;
    let mut out = Vec::with_capacity(batch);
    for (b, &length) in lengths.iter().enumerate() {
        let row = &ids[b * width..b * width + length];
        let mut target = Vec::with_capacity(length);
        for (j, &id) in row.iter().enumerate() {
            if id < 0 || id as usize >= vocab {
                bail!("`targets[{b}, {j}]` = {id} is out of the vocabulary (V = {vocab}, {described})");
            }
            if id == i64::from(blank) {
                bail!(
                    "`targets[{b}, {j}]` = {id} is the blank: targets hold labels only (`target_lengths[{b}]` = {length})"
                );
            }
            target.push(id as u32);
        }
        out.push(target);
    }
    Ok((out, lengths))
}

/// The arguments of a CTC loss on `name` (`log_probs`, or `logits` when `from_logits`),
/// checked: the input, the targets and both lengths, each input length `>= 1`, `cfg.blank`.
/// Where the CUDA kernels run with `cfg.check_values` off (`cuda-unverified`), the targets and
/// lengths stay on the device: their dtypes, shapes and device are checked, not their values;
/// and an f16/bf16 input stays in its dtype (elsewhere it is converted to f32).
/// The frames within the input lengths are checked for NaN and `+inf` (and `-inf` from logits)
/// where the path's kernel does not find them in its own pass: on the CPU in place, off it
/// only with `cfg.check_values` (one counted copy).
#[allow(clippy::too_many_arguments)]
pub(crate) fn ctc_call(
    name: &str,
    input: &Tensor,
    targets: &Tensor,
    input_lengths: &Tensor,
    target_lengths: &Tensor,
    cfg: &CtcConfig,
    from_logits: bool,
    path: Path,
) -> Result<CheckedCtc> {
    let blank = cfg.blank;
    let (dtype, (batch, frames, vocab)) = ctc_input_shape(name, input)?;
    let described = format!("`{name}` shape {:?}", input.dims());
    let device = input.device();
    ctc_blank(blank, vocab, &described)?;
    #[cfg(feature = "cuda-unverified")]
    if path.runs_ctc_kernels(device) && !device.is_cpu() && !cfg.check_values {
        // The training path off the CPU: nothing is read to the host.
        let width = match targets.dims() {
            &[b, width] if b == batch => width,
            dims => bail!(
                "`targets` must be padded [B, L] with B = {batch} ({described}), got shape {dims:?}"
            ),
        };
        ctc_integer_tensor(
            "targets",
            targets,
            &[batch, width],
            &format!("[{batch}, {width}]"),
            device,
        )?;
        for (name, lengths) in [
            ("input_lengths", input_lengths),
            ("target_lengths", target_lengths),
        ] {
            ctc_integer_tensor(
                name,
                lengths,
                &[batch],
                &format!("[{batch}] ({described})"),
                device,
            )?;
        }
        let alignments = DeviceAlignments::unchecked(
            targets,
            (input_lengths, target_lengths),
            blank,
            cfg.zero_infinity,
        )?;
        return Ok(CheckedCtc {
            // f16/bf16 as they are: the kernels read them natively (no f32 copy of the input)
            // and write the gradient in their dtype; the losses come back in f32.
            input: input.contiguous()?,
            targets: CtcTargets::Device(alignments),
            path,
        });
    }
    let lengths = ctc_input_lengths(input_lengths, (batch, frames), &described, device)?;
    if let Some(b) = lengths.iter().position(|&l| l == 0) {
        bail!("`input_lengths[{b}]` = 0: every element needs at least one frame to align");
    }
    let (targets, target_lengths) = ctc_targets(
        targets,
        target_lengths,
        (batch, vocab),
        blank,
        &described,
        device,
    )?;
    let input = input.to_dtype(dtype)?.contiguous()?;
    if !path.runs_cpu_kernels(device) {
        ctc_finite_input(name, &input, &lengths, from_logits, cfg.check_values)?;
    }
    Ok(CheckedCtc {
        input,
        targets: CtcTargets::Host {
            alignments: CtcAlignments {
                targets,
                input_lengths: lengths,
                blank,
                zero_infinity: cfg.zero_infinity,
            },
            target_lengths,
        },
        path,
    })
}

/// Errors if a frame within the input lengths of `input` (`[B, T', V]`, f32 or f64) holds NaN
/// or `+inf`, or from logits `-inf`: read in place on the CPU; off it with `check_off_cpu`
/// from one counted copy to the host, else not checked. Frames beyond the lengths are never
/// read.
fn ctc_finite_input(
    name: &str,
    input: &Tensor,
    lengths: &[usize],
    from_logits: bool,
    check_off_cpu: bool,
) -> Result<()> {
    if input.device().is_cpu() {
        return ctc_finite_frames(name, &input.contiguous()?, lengths, from_logits);
    }
    if !check_off_cpu {
        return Ok(());
    }
    let on_host = match input.dtype() {
        DType::F64 => Tensor::from_vec(
            host::to_vec1::<f64>(&input.flatten_all()?)?,
            input.shape(),
            &Device::Cpu,
        )?,
        _ => Tensor::from_vec(
            host::to_vec1::<f32>(&input.flatten_all()?)?,
            input.shape(),
            &Device::Cpu,
        )?,
    };
    ctc_finite_frames(name, &on_host, lengths, from_logits)
}

/// Errors if a frame within the input lengths of the CPU tensor `input` (`[B, T', V]`, f32 or
/// f64) holds NaN or `+inf`, or from logits `-inf`, read in place.
fn ctc_finite_frames(
    name: &str,
    input: &Tensor,
    lengths: &[usize],
    from_logits: bool,
) -> Result<()> {
    let (_, frames, vocab) = input.dims3()?;
    let bad = |x: f64| x.is_nan() || x == f64::INFINITY || (from_logits && x == f64::NEG_INFINITY);
    fn first_bad(
        mut values: impl Iterator<Item = f64>,
        bad: impl Fn(f64) -> bool,
    ) -> Option<usize> {
        values.position(bad)
    }
    let found = match input.dtype() {
        DType::F64 => host::with_cpu_slice::<f64, _>(input, |s| {
            Ok(lengths.iter().enumerate().find_map(|(b, &l)| {
                let frames_of = &s[b * frames * vocab..(b * frames + l) * vocab];
                first_bad(frames_of.iter().copied(), bad).map(|i| (b, i / vocab))
            }))
        })?,
        _ => host::with_cpu_slice::<f32, _>(input, |s| {
            Ok(lengths.iter().enumerate().find_map(|(b, &l)| {
                let frames_of = &s[b * frames * vocab..(b * frames + l) * vocab];
                first_bad(frames_of.iter().map(|&x| f64::from(x)), bad).map(|i| (b, i / vocab))
            }))
        })?,
    };
    if let Some(frame) = found {
        return Err(non_finite_frame(name, from_logits, frame, input.dims()));
    }
    Ok(())
}

/// The arguments of `ctc_greedy_decode`, checked: `logits` `[B, T', V]` (any float dtype), the
/// blank, and the input lengths (`T'` each without them). Returns the lengths on the host.
pub(crate) fn ctc_decode_call(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    blank: u32,
) -> Result<Vec<usize>> {
    let (_, (batch, frames, vocab)) = ctc_input_shape("logits", logits)?;
    let described = format!("`logits` shape {:?}", logits.dims());
    ctc_blank(blank, vocab, &described)?;
    match input_lengths {
        Some(lengths) => ctc_input_lengths(lengths, (batch, frames), &described, logits.device()),
        None => Ok(vec![frames; batch]),
    }
}

// ---- BLEU on CTC outputs ----------------------------------------------------------------------

/// Checked arguments of the BLEU loss on CTC outputs: the logits in their compute dtype, the
/// frames each element uses (on the host where they can be read in place or were checked), and
/// the `[B, T']` frame mask on the logits' device.
pub(crate) struct CheckedCtcLogits {
    pub logits: CheckedHypotheses,
    /// `frames[b]`: element `b`'s input length; `None` off the CPU without `check_values`
    /// (the composed ops read the lengths on the device).
    pub frames: Option<Vec<usize>>,
    /// The caller's `input_lengths` as given (u32, i32 or i64 `[B]` on the logits' device,
    /// its dtype and shape checked): what the CUDA kernels read on the device when `frames` is
    /// `None`.
    #[cfg_attr(not(feature = "cuda-unverified"), allow(dead_code))]
    pub input_lengths: Option<Tensor>,
    /// `[B, T']` in the compute dtype: 1 at the frames in use, 0 beyond.
    pub frame_mask: Tensor,
}

/// The arguments of the BLEU loss on CTC outputs, checked: `logits` `[B, T', V]`,
/// `input_lengths` (u32, i32 or i64 `[B]`, each `<= T'`), id `refs` none of whose tokens is `blank`,
/// `blank < V`; `cfg` is checked by [`ctc_bleu_config`] (its `max_order` and `check_values`
/// are read here).
pub(crate) fn ctc_bleu_call(
    logits: &Tensor,
    input_lengths: Option<&Tensor>,
    refs: &References,
    blank: u32,
    cfg: &BleuLossConfig,
    path: Path,
) -> Result<CheckedCtcLogits> {
    ctc_bleu_config(cfg)?;
    let check_values = cfg.check_values;
    let (compute, dims) = logits_shape("logits", logits)?;
    let (batch, frames, vocab) = dims;
    let shape = HypothesisShape::of("logits", logits, dims);
    ctc_blank(blank, vocab, &shape.described)?;
    reference_arguments(&shape, refs)?;
    let Some(ids) = refs.ids() else {
        bail!(
            "ctc_bleu_loss: `refs` must be token ids (References::from_ids): the dynamic programs over the frames count reference n-grams by id"
        );
    };
    for (element, element_refs) in ids.iter().enumerate() {
        for (r, reference) in element_refs.iter().enumerate() {
            if let Some(position) = reference.iter().position(|&id| id == blank) {
                bail!(
                    "`refs`: reference {r} of batch element {element} holds the blank id {blank} at position {position}: a CTC output never emits the blank"
                );
            }
        }
    }
    // The kernel reads the lengths on the host: in place on the CPU. Off the CPU the composed
    // ops read them on the device (the frame mask), so they are copied only to be checked.
    let frame_counts = match input_lengths {
        None => Some(vec![frames; batch]),
        Some(lengths) if logits.device().is_cpu() || check_values => Some(ctc_input_lengths(
            lengths,
            (batch, frames),
            &shape.described,
            logits.device(),
        )?),
        Some(lengths) => {
            ctc_integer_tensor(
                "input_lengths",
                lengths,
                &[batch],
                &format!("[{batch}] ({})", shape.described),
                logits.device(),
            )?;
            None
        }
    };
    // Only the frames in use are checked, as `ctc_loss` does: padding frames may hold anything,
    // NaN included (the composed ops zero them before the softmax). The CPU kernel finds
    // non-finite logits in its own pass over those frames.
    let logits = CheckedHypotheses {
        tensor: logits.to_dtype(compute)?,
        path,
        softcap: None,
    };
    if !path.checks_finite(logits.tensor.device()) {
        if let Some(frames) = &frame_counts {
            ctc_finite_input("logits", &logits.tensor, frames, true, check_values)?;
        }
    }
    let (dtype, device) = (logits.tensor.dtype(), logits.tensor.device());
    let frame_mask = match input_lengths {
        None => Tensor::ones((batch, frames), dtype, device)?,
        Some(lengths) => Tensor::arange(0u32, frames as u32, device)?
            .unsqueeze(0)?
            .broadcast_lt(&lengths.to_dtype(DType::U32)?.unsqueeze(1)?)?
            .to_dtype(dtype)?,
    };
    Ok(CheckedCtcLogits {
        logits,
        frames: frame_counts,
        input_lengths: input_lengths.cloned(),
        frame_mask,
    })
}

/// Checks that a BLEU loss config applies to CTC outputs: the `Expected` form (the others pair
/// hypothesis positions, which a collapsed sequence does not have) and `Given` lengths (the
/// collapse decides the length; there is no EOS to stop at).
fn ctc_bleu_config(cfg: &BleuLossConfig) -> Result<()> {
    score::validate_config(cfg)?;
    if cfg.length != LengthModel::Given {
        bail!(
            "ctc_bleu_loss: `length` {:?} does not apply to CTC outputs: the collapsed sequence's length is the expected number of runs, so no EOS length model applies; use LengthModel::Given",
            cfg.length
        );
    }
    if cfg.form != Form::Expected {
        bail!(
            "ctc_bleu_loss: `form` {:?} does not apply to CTC outputs: only Form::Expected (clip each reference n-gram's expected count in the collapsed sequence) has no hypothesis positions to pair",
            cfg.form
        );
    }
    Ok(())
}
