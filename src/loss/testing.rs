//! The kernel ops with their own validation, for the crate's tests and benches: not part of
//! the API (the loss's entry points validate their arguments once and call `logits_pass`).

use super::kernels::GatherIds;
use super::pipeline::{check_logits, logits_pass, Gather};
use candle_core::{bail, DType, Result, Tensor};

/// `values[i] = exp(values[i])` for `values[i] <= 0` with the kernels' vectorised f32 `exp`
/// and lane loop (for `benches/stream.rs`).
pub fn exp_nonpositive_in_place(values: &mut [f32]) {
    super::kernels::cpu::exp_nonpositive_in_place(values)
}

/// The PTX of the CUDA kernels for compute capability `(major, minor)`, compiled by NVRTC.
#[cfg(feature = "cuda")]
pub fn cuda_ptx(capability: (i32, i32)) -> Result<String> {
    super::kernels::cuda::compile_ptx(capability)
}

/// Errors from `f`, prefixed with the op's name.
fn named<R>(op: &str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    f().map_err(|e| candle_core::Error::Msg(format!("{op}: {e}")))
}

/// Checks `logits` (float `[B, S, V]`, all >= 1) and `ids` (u32 `[B, K]`, every id `< V`,
/// read back to the host) against each other.
fn check_logits_and_ids(logits: &Tensor, ids: &Tensor) -> Result<GatherIds> {
    let (_, (batch, _, vocab)) = check_logits("logits", logits)?;
    if ids.dtype() != DType::U32 {
        bail!(
            "`ids` must be u32, got {:?} with shape {:?}",
            ids.dtype(),
            ids.dims()
        );
    }
    let width = match ids.dims() {
        &[b, k] if b == batch => k,
        dims => bail!(
            "`ids` must be [B, K] with B = {batch} of `logits` (shape {:?}), got shape {dims:?}",
            logits.dims()
        ),
    };
    if !ids.device().same_device(logits.device()) {
        bail!(
            "`ids` are on {:?} but `logits` on {:?}",
            ids.device(),
            logits.device()
        );
    }
    let ids = super::host::to_vec2::<u32>(ids)?.concat();
    if let Some(p) = ids.iter().position(|&id| id as usize >= vocab) {
        bail!(
            "`ids[{}, {}]` = {} is out of the vocabulary: every id must be < V = {vocab}",
            p / width.max(1),
            p % width.max(1),
            ids[p]
        );
    }
    GatherIds::from_host(&ids, (batch, width), logits.device())
}

/// `softmax(logits)[b, i, ids[b, k]]`: `[B, S, K]`.
pub fn softmax_gather(logits: &Tensor, ids: &Tensor) -> Result<Tensor> {
    named("softmax_gather", || {
        let ids = check_logits_and_ids(logits, ids)?;
        let pass = logits_pass(logits, Gather::Ids(&ids), None)?;
        pass.gathered
            .ok_or_else(|| candle_core::Error::Msg("internal: nothing gathered".into()))
    })
}

/// `(P Pᵀ, P at ids)` with `P = softmax(logits)`: `[B, S, S]` and `[B, S, K]`.
pub fn softmax_self_match_gather(logits: &Tensor, ids: &Tensor) -> Result<(Tensor, Tensor)> {
    named("softmax_self_match_gather", || {
        let ids = check_logits_and_ids(logits, ids)?;
        let pass = logits_pass(logits, Gather::SelfMatch(&ids), None)?;
        match (pass.self_match, pass.gathered) {
            (Some(z), Some(x)) => Ok((z, x)),
            _ => bail!("internal: no self-match"),
        }
    })
}

/// `softmax(logits)` over the last dimension of float `[B, S, V]` logits, with a backward.
pub fn softmax_last_dim(logits: &Tensor) -> Result<Tensor> {
    named("softmax_last_dim", || {
        check_logits("logits", logits)?;
        let pass = logits_pass(logits, Gather::Probs, None)?;
        pass.probs
            .ok_or_else(|| candle_core::Error::Msg("internal: no probabilities".into()))
    })
}
