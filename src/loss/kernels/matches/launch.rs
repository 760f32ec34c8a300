//! The launch plans of the expected form's matches kernels (`matches.cu`), over any back-end's
//! buffers: the CUDA op (`matches/cuda.rs`, feature `cuda-unverified`) and the emulator tests run
//! the same plans (see [`launch`](crate::loss::kernels::launch) for the shared types).
//!
//! Forward: `matches_fwd`, one block per element: `X [B, S, W]`, `U [B, S]`, the reference
//! counts `[2, N, B, W]` (first occurrences, then clip counts) to `m [B, N]`, with a workspace
//! of `B · S · W`. Backward: `matches_bwd`, one block per element: the same inputs and
//! `grad_out [B, N]` to `[B, S, W + 1]` (`dX`, then `dU` in the last column), with a workspace
//! of `B · ((N + 1) · S · W + W)`.

use super::args::MatchArgs;
use crate::loss::kernels::launch::{dim_u32, rows_dims, FloatKind, Launch, Param};
use candle_core::Result;

/// The CUDA source of the matches kernels: `kernels.cu` (whose block sum they use), then
/// `matches.cu`.
pub(crate) const MATCHES_SOURCE: &str = concat!(
    include_str!("../row/kernels.cu"),
    "\n",
    include_str!("matches.cu")
);

/// The kernel families of `matches.cu`, each instantiated as `<family>_f32` and `_f64`.
pub(crate) const MATCHES_FAMILIES: [&str; 2] = ["matches_fwd", "matches_bwd"];

impl MatchArgs {
    /// Elements of the workspace: `B · S · W` forward, `B · ((N + 1) · S · W + W)` backward.
    pub(crate) fn workspace_len(&self, backward: bool) -> usize {
        let plane = self.seq * self.width;
        if backward {
            self.batch * ((self.orders + 1) * plane + self.width)
        } else {
            self.batch * plane
        }
    }

    fn scalars<B>(&self) -> Result<Vec<Param<B>>> {
        Ok(vec![
            Param::U32(dim_u32(self.batch, "batch")?),
            Param::U32(dim_u32(self.seq, "hypothesis positions")?),
            Param::U32(dim_u32(self.width, "reference width")?),
            Param::U32(dim_u32(self.orders, "max_order")?),
            Param::U32(u32::from(self.shifted)),
        ])
    }
}

/// The buffers both kernels read: `X`, `U` and the reference counts.
pub(crate) struct MatchInputs<B> {
    pub token_match: B,
    pub weights: B,
    pub counts: B,
}

/// `matches_fwd`: `m [B, N]` into `out`.
pub(crate) fn matches_fwd<B>(
    float: FloatKind,
    args: &MatchArgs,
    inputs: MatchInputs<B>,
    (out, work): (B, B),
) -> Result<Launch<B>> {
    let mut params = vec![
        Param::Buffer(inputs.token_match),
        Param::Buffer(inputs.weights),
        Param::Buffer(inputs.counts),
        Param::Buffer(out),
        Param::Buffer(work),
    ];
    params.extend(args.scalars()?);
    Ok(Launch {
        family: "matches_fwd",
        float,
        dims: rows_dims(args.batch)?,
        params,
    })
}

/// `matches_bwd`: `[B, S, W + 1]` into `grad` from `grad_out [B, N]`.
pub(crate) fn matches_bwd<B>(
    float: FloatKind,
    args: &MatchArgs,
    inputs: MatchInputs<B>,
    (grad_out, grad, work): (B, B, B),
) -> Result<Launch<B>> {
    let mut params = vec![
        Param::Buffer(inputs.token_match),
        Param::Buffer(inputs.weights),
        Param::Buffer(inputs.counts),
        Param::Buffer(grad_out),
        Param::Buffer(grad),
        Param::Buffer(work),
    ];
    params.extend(args.scalars()?);
    Ok(Launch {
        family: "matches_bwd",
        float,
        dims: rows_dims(args.batch)?,
        params,
    })
}
