//! Hypotheses given as hidden states `[B, S, D]` with the output layer and its blocks: checked
//! and converted to rows in the compute dtype ([`hidden_call`] → [`CheckedHidden`]), and their
//! logits where a matrix reference materialises them ([`materialised_logits`]).

use super::logits::{finite, float_compute_dtype, CheckedHypotheses, HypothesisShape};
use crate::loss::config::HiddenConfig;
use crate::loss::dispatch::Path;
use crate::loss::kernels::softcap;
use candle_core::{bail, DType, Result, Tensor};
use candle_nn::Linear;

/// Checked hidden states and output layer: `hidden` as `[B·S, D]` rows, the projection's weight
/// `[V, D]` and bias `[V]`, contiguous, in the compute dtype (f32 for f16/bf16).
pub(crate) struct CheckedHidden {
    pub hidden: Tensor,
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub batch: usize,
    pub seq: usize,
    pub vocab: usize,
    pub dtype: DType,
    pub path: Path,
    /// `hidden` and `proj`'s shapes, for messages.
    pub described: String,
    /// Logit soft-capping `c` of the cross-entropy's config (`None`: off), applied to each
    /// block of logits.
    pub softcap: Option<f64>,
}

impl CheckedHidden {
    pub(super) fn shape(&self) -> HypothesisShape<'_> {
        HypothesisShape {
            name: "hidden",
            described: self.described.clone(),
            batch: self.batch,
            seq: self.seq,
            vocab: self.vocab,
            device: self.hidden.device(),
        }
    }
}

/// Checks the hidden states `[B, S, D]` and the output layer (weight `[V, D]`, optional bias
/// `[V]`, the dtype and device of `hidden`) and the block settings; converts them to rows in
/// the compute dtype. With `check_off_cpu`, and on the CPU when the path's kernels do not find
/// non-finite logits themselves, refuses NaN and Inf in each.
pub(super) fn hidden_call(
    hidden: &Tensor,
    proj: &Linear,
    hidden_cfg: &HiddenConfig,
    path: Path,
    check_off_cpu: bool,
) -> Result<CheckedHidden> {
    hidden_cfg.validate()?;
    let (batch, seq, dim) = match hidden.dims() {
        &[b, s, d] => (b, s, d),
        dims => bail!("`hidden` must be [B, S, D], got shape {dims:?}"),
    };
    let dtype = float_compute_dtype("hidden", hidden)?;
    if batch == 0 || seq == 0 || dim == 0 {
        bail!(
            "`hidden` has an empty dimension: shape {:?}; B, S and D must be >= 1",
            hidden.dims()
        );
    }
    let weight = proj.weight();
    let vocab = match weight.dims() {
        &[v, d] if d == dim && v >= 1 => v,
        dims => bail!(
            "`proj.weight` must be [V, D] with V >= 1 and D = {dim} (the last dimension of `hidden` {:?}), got shape {dims:?}",
            hidden.dims()
        ),
    };
    let same_kind = |name: &str, t: &Tensor| -> Result<()> {
        if t.dtype() != hidden.dtype() {
            bail!(
                "`{name}` is {:?} but `hidden` is {:?}: the projection takes one dtype",
                t.dtype(),
                hidden.dtype()
            );
        }
        if !t.device().same_device(hidden.device()) {
            bail!(
                "`{name}` is on {:?} but `hidden` is on {:?}",
                t.device(),
                hidden.device()
            );
        }
        Ok(())
    };
    same_kind("proj.weight", weight)?;
    if let Some(bias) = proj.bias() {
        if bias.dims() != [vocab] {
            bail!(
                "`proj.bias` must be [V] = [{vocab}] (the V of `proj.weight` {:?}), got shape {:?}",
                weight.dims(),
                bias.dims()
            );
        }
        same_kind("proj.bias", bias)?;
    }
    let prepare = |t: &Tensor| t.to_dtype(dtype)?.contiguous();
    let checked = CheckedHidden {
        hidden: prepare(&hidden.reshape((batch * seq, dim))?)?,
        weight: prepare(weight)?,
        bias: proj.bias().map(prepare).transpose()?,
        batch,
        seq,
        vocab,
        dtype,
        path,
        described: format!(
            "`hidden` shape {:?}, `proj.weight` shape {:?}",
            hidden.dims(),
            weight.dims()
        ),
        softcap: None,
    };
    if !path.checks_finite(hidden.device()) {
        finite("hidden", &checked.hidden, check_off_cpu)?;
        finite("proj.weight", &checked.weight, check_off_cpu)?;
        if let Some(bias) = &checked.bias {
            finite("proj.bias", bias, check_off_cpu)?;
        }
    }
    Ok(checked)
}

/// The logits `proj.forward(hidden)` of checked hidden states, materialised (for matrix
/// references, which are `[B, T, V]` themselves), as checked hypotheses in the compute dtype:
/// finite inputs can still overflow to infinite logits, so they are checked as logits are.
pub(crate) fn materialised_logits(
    inputs: &CheckedHidden,
    logits: Tensor,
    check_off_cpu: bool,
) -> Result<CheckedHypotheses> {
    let mut tensor = logits.to_dtype(inputs.dtype)?;
    if !inputs.path.checks_finite(tensor.device()) {
        finite("logits", &tensor, check_off_cpu)?;
    }
    if let Some(cap) = inputs.softcap {
        // The CPU op refuses NaN and Inf, which `tanh` would hide from the kernels' own check.
        let cpu_kernels = inputs.path.runs_cpu_kernels(tensor.device());
        tensor = softcap::softcap(&tensor, cap, cpu_kernels)?;
    }
    Ok(CheckedHypotheses {
        tensor,
        path: inputs.path,
        softcap: None,
    })
}
