//! Hypotheses given as a tensor — probabilities or logits `[B, S, V]` — checked and converted
//! to their compute dtype ([`CheckedHypotheses`]); the `[B, S, V]` every kind of hypotheses
//! reports in messages ([`HypothesisShape`]); and the float and finiteness checks the other
//! kinds share ([`float_compute_dtype`], [`finite`]).

use crate::loss::config::compute_dtype;
use crate::loss::dispatch::Path;
use crate::loss::host;
use candle_core::{bail, DType, Device, Result, Tensor};

/// The `[B, S, V]` of the hypotheses, however they are given (probabilities, logits, or hidden
/// states and an output layer), for validation messages.
pub(super) struct HypothesisShape<'a> {
    /// The argument the batch and positions come from.
    pub name: &'a str,
    /// The hypothesis arguments and their shapes, for messages.
    pub described: String,
    pub batch: usize,
    pub seq: usize,
    pub vocab: usize,
    pub device: &'a Device,
}

impl<'a> HypothesisShape<'a> {
    /// The shape of the hypothesis tensor `name` (already checked as `[B, S, V]`).
    pub(super) fn of(
        name: &'a str,
        t: &'a Tensor,
        (batch, seq, vocab): (usize, usize, usize),
    ) -> Self {
        Self {
            name,
            described: format!("`{name}` shape {:?}", t.dims()),
            batch,
            seq,
            vocab,
            device: t.device(),
        }
    }
}

/// Checked hypothesis probabilities or logits `[B, S, V]` (`B, S, V >= 1`), in their compute
/// dtype (f32 for f16/bf16) — except 16-bit logits for the CUDA options kernels, which read them
/// as they are (`Path::runs_options_kernels`) — with the path that runs on them.
pub(crate) struct CheckedHypotheses {
    pub tensor: Tensor,
    pub path: Path,
    /// A soft cap `c` left to the row pass, which reads each logit through `c·tanh(z/c)` (the
    /// CUDA options kernels: `Path::runs_options_kernels`); `None` when `tensor` is capped already or
    /// there is no cap.
    pub softcap: Option<f64>,
}

impl CheckedHypotheses {
    /// The dtype the passes compute in: the tensor's, f32 for 16-bit logits left for the CUDA
    /// options kernels.
    pub(crate) fn compute_dtype(&self) -> DType {
        match self.tensor.dtype() {
            DType::F16 | DType::BF16 => DType::F32,
            dtype => dtype,
        }
    }
}

/// Checks a hypothesis tensor of logits or probabilities, `name`: float `[B, S, V]` with
/// `B, S, V >= 1`. Returns the compute dtype (f32 for f16/bf16) and `(B, S, V)`.
pub(super) fn logits_shape(name: &str, t: &Tensor) -> Result<(DType, (usize, usize, usize))> {
    let dims = match t.dims() {
        &[b, s, v] => (b, s, v),
        dims => bail!("`{name}` must be [B, S, V], got shape {dims:?}"),
    };
    let compute_dtype = float_compute_dtype(name, t)?;
    if dims.0 == 0 || dims.1 == 0 || dims.2 == 0 {
        bail!(
            "`{name}` has an empty dimension: shape {:?}; B, S and V must be >= 1",
            t.dims()
        );
    }
    Ok((compute_dtype, dims))
}

/// The compute dtype of the float tensor `name`, else an error naming it.
pub(super) fn float_compute_dtype(name: &str, t: &Tensor) -> Result<DType> {
    compute_dtype(t.dtype()).map_err(|_| {
        candle_core::Error::Msg(format!(
            "`{name}` must be a float tensor, got {:?} with shape {:?}",
            t.dtype(),
            t.dims()
        ))
    })
}

/// Checks hypotheses `name` (`[B, S, V]`) and converts them to their compute dtype; with
/// `check_finite`, refuses NaN and Inf unless the path's kernels find them in their own pass
/// (in place on the CPU; off it a copy, only with `check_off_cpu`).
pub(super) fn hypotheses(
    name: &str,
    t: &Tensor,
    path: Path,
    check_off_cpu: bool,
    keep_16bit: bool,
) -> Result<CheckedHypotheses> {
    let (dtype, _) = logits_shape(name, t)?;
    let tensor = match t.dtype() {
        DType::F16 | DType::BF16 if keep_16bit => t.clone(),
        _ => t.to_dtype(dtype)?,
    };
    if !path.checks_finite(tensor.device()) {
        finite(name, &tensor, check_off_cpu)?;
    }
    Ok(CheckedHypotheses {
        tensor,
        path,
        softcap: None,
    })
}

/// Errors if `t` holds NaN or Inf: in place on the CPU, with a copy elsewhere only when
/// `check_off_cpu`.
pub(super) fn finite(name: &str, t: &Tensor, check_off_cpu: bool) -> Result<()> {
    if host::all_finite(t, check_off_cpu)? == Some(false) {
        bail!(
            "`{name}` contains NaN or infinite values (shape {:?})",
            t.dims()
        );
    }
    Ok(())
}
