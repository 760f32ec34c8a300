//! Any kind of hypotheses, as the caller gave them ([`Hypotheses`]) and checked
//! ([`CheckedInput`]): first their shapes ([`shaped`]: a tensor's `[B, S, V]`, or the hidden
//! states' checks), then the conversion to the compute dtype and the soft cap
//! ([`ShapedInput::finish`]).

use super::hidden::{hidden_call, CheckedHidden};
use super::logits::{hypotheses, logits_shape, CheckedHypotheses, HypothesisShape};
use crate::loss::config::HiddenConfig;
use crate::loss::dispatch::Path;
use crate::loss::kernels::softcap;
use candle_core::{DType, Device, Result, Tensor};
use candle_nn::Linear;

/// The hypotheses a loss takes, as its caller gave them: one validation
/// (the `*_call` functions of `calls.rs`) and one pass (`pipeline`) for every kind.
#[derive(Clone, Copy)]
pub(crate) enum Hypotheses<'a> {
    /// Probabilities `[B, S, V]` (the BLEU loss alone; composed ops).
    Probs(&'a Tensor),
    /// Logits `[B, S, V]`.
    Logits(&'a Tensor),
    /// Hidden states `[B, S, D]`, the output layer and its blocks: the logits are computed and
    /// dropped block by block.
    Hidden {
        hidden: &'a Tensor,
        proj: &'a Linear,
        blocks: &'a HiddenConfig,
    },
}

/// Checked hypotheses of any kind.
pub(crate) enum CheckedInput {
    /// Probabilities or logits `[B, S, V]` in their compute dtype.
    Tensor {
        checked: CheckedHypotheses,
        /// Probabilities (no softmax is taken), not logits.
        probs: bool,
    },
    /// Hidden states as rows and the output layer in the compute dtype, the blocks, and the
    /// hidden states and layer as given (matrix references materialise the logits from them).
    Hidden {
        checked: CheckedHidden,
        blocks: HiddenConfig,
        given: (Tensor, Linear),
    },
}

impl CheckedInput {
    /// The compute dtype.
    pub(crate) fn dtype(&self) -> DType {
        match self {
            CheckedInput::Tensor { checked, .. } => checked.compute_dtype(),
            CheckedInput::Hidden { checked, .. } => checked.dtype,
        }
    }
}

impl Hypotheses<'_> {
    /// The device the hypotheses are on.
    pub(super) fn device(&self) -> &Device {
        match self {
            Hypotheses::Probs(t) | Hypotheses::Logits(t) => t.device(),
            Hypotheses::Hidden { hidden, .. } => hidden.device(),
        }
    }
}

/// The name of a tensor input in messages.
fn input_name(probs: bool) -> &'static str {
    if probs {
        "hyp_probs"
    } else {
        "logits"
    }
}

/// The shape checks of any kind of hypotheses, before any conversion: `[B, S, V]` for
/// tensors; for hidden states, [`hidden_call`]'s checks (which also convert them).
pub(super) enum ShapedInput<'a> {
    Tensor {
        tensor: &'a Tensor,
        probs: bool,
        dims: (usize, usize, usize),
        path: Path,
    },
    Hidden {
        checked: CheckedHidden,
        blocks: HiddenConfig,
        given: (Tensor, Linear),
    },
}

/// Checks the shapes of `input` (and, for hidden states, converts and checks them as
/// [`hidden_call`] does, NaN/Inf with `check_off_cpu` off the CPU).
pub(super) fn shaped(
    input: Hypotheses<'_>,
    path: Path,
    check_off_cpu: bool,
) -> Result<ShapedInput<'_>> {
    Ok(match input {
        Hypotheses::Probs(tensor) | Hypotheses::Logits(tensor) => {
            let probs = matches!(input, Hypotheses::Probs(_));
            let (_, dims) = logits_shape(input_name(probs), tensor)?;
            ShapedInput::Tensor {
                tensor,
                probs,
                dims,
                path,
            }
        }
        Hypotheses::Hidden {
            hidden,
            proj,
            blocks,
        } => ShapedInput::Hidden {
            checked: hidden_call(hidden, proj, blocks, path, check_off_cpu)?,
            blocks: *blocks,
            given: (hidden.clone(), proj.clone()),
        },
    })
}

impl ShapedInput<'_> {
    pub(super) fn shape(&self) -> HypothesisShape<'_> {
        match self {
            ShapedInput::Tensor {
                tensor,
                probs,
                dims,
                ..
            } => HypothesisShape::of(input_name(*probs), tensor, *dims),
            ShapedInput::Hidden { checked, .. } => checked.shape(),
        }
    }

    /// The checked input: tensors converted to their compute dtype and checked for NaN/Inf
    /// (as [`hypotheses`] does); hidden states as they were checked. With `softcap`, the logits
    /// are capped (`c·tanh(z/c)`): logits by one op before any pass (`kernels::softcap`, which
    /// refuses NaN and Inf on the CPU: `tanh` would hide them from the kernels' own check),
    /// hidden states in their blocks.
    pub(super) fn finish(self, check_off_cpu: bool, softcap: Option<f64>) -> Result<CheckedInput> {
        Ok(match self {
            ShapedInput::Tensor {
                tensor,
                probs,
                path,
                ..
            } => {
                let name = input_name(probs);
                // The CUDA options kernels read 16-bit logits as they are.
                let native = !probs && path.runs_options_kernels(tensor.device());
                let mut checked = hypotheses(name, tensor, path, check_off_cpu, native)?;
                if let Some(cap) = softcap.filter(|_| !probs) {
                    if native {
                        // The CUDA options kernels cap each logit as the row pass reads it.
                        checked.softcap = Some(cap);
                    } else {
                        // The CPU op refuses NaN and Inf itself; elsewhere `hypotheses` checked.
                        let cpu_kernels = path.runs_cpu_kernels(checked.tensor.device());
                        checked.tensor = softcap::softcap(&checked.tensor, cap, cpu_kernels)?;
                    }
                }
                CheckedInput::Tensor { checked, probs }
            }
            ShapedInput::Hidden {
                mut checked,
                blocks,
                given,
            } => {
                checked.softcap = softcap;
                CheckedInput::Hidden {
                    checked,
                    blocks,
                    given,
                }
            }
        })
    }
}
