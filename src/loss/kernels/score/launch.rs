//! The launch plans of the score's CUDA kernels (`score.cu`), over any back-end's buffers: the
//! CUDA op (`score/cuda.rs`, feature `cuda-unverified`) and the emulator tests run the same plans
//! (see [`launch`](crate::loss::kernels::launch) for the shared types).
//!
//! Forward: `score_fwd`, one block: the rows `[K, 2N + 2]` to the loss `[1]`. Backward:
//! `score_bwd`, one thread per row: the rows and the loss's gradient `[1]` to the rows' gradient
//! `[K, 2N + 2]`. The settings travel as kernel parameters (no buffer to upload): `K`, `N`, the
//! additive constant, `tiny`, `ln` of the floor and eight order weights, 0 beyond `N`.

use super::args::ScoreArgs;
use crate::loss::kernels::launch::{dim_u32, FloatKind, Launch, LaunchDims, Param, BLOCK};
use candle_core::{bail, Result};

/// The CUDA source of the score's kernels: `kernels.cu` (whose block sum they use), then
/// `score.cu`.
pub(crate) const SCORE_SOURCE: &str = concat!(
    include_str!("../row/kernels.cu"),
    "\n",
    include_str!("score.cu")
);

/// The kernel families of `score.cu`, each instantiated as `<family>_f32` and `_f64`.
pub(crate) const SCORE_FAMILIES: [&str; 2] = ["score_fwd", "score_bwd"];

/// The highest order the kernels take (`SCORE_MAX_ORDER` in `score.cu`: the order weights are
/// eight kernel parameters). Higher orders run the composed ops.
pub(crate) const SCORE_MAX_ORDER: usize = 8;

/// The parameters after the buffers: `K, N, k, tiny, ln floor, w_0 … w_7`.
fn scalars<B>(args: &ScoreArgs, count: usize) -> Result<Vec<Param<B>>> {
    if args.orders == 0 || args.orders > SCORE_MAX_ORDER || args.weights.len() != args.orders {
        bail!(
            "internal: the score kernels take orders 1..={SCORE_MAX_ORDER} with one weight each, got {} orders and {} weights",
            args.orders,
            args.weights.len()
        );
    }
    let mut params = vec![
        Param::U32(dim_u32(count, "score rows")?),
        Param::U32(dim_u32(args.orders, "max_order")?),
        Param::Float(args.additive),
        Param::Float(args.tiny),
        Param::Float(args.log_floor),
    ];
    params.extend(
        (0..SCORE_MAX_ORDER).map(|n| Param::Float(args.weights.get(n).copied().unwrap_or(0.0))),
    );
    Ok(params)
}

/// `score_fwd`: one block of [`BLOCK`] threads, each summing a strided share of the rows.
pub(crate) fn score_fwd<B>(
    float: FloatKind,
    args: &ScoreArgs,
    count: usize,
    (rows, out): (B, B),
) -> Result<Launch<B>> {
    let mut params = vec![Param::Buffer(rows), Param::Buffer(out)];
    params.extend(scalars(args, count)?);
    Ok(Launch {
        family: "score_fwd",
        float,
        dims: LaunchDims {
            grid: (1, 1, 1),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        params,
    })
}

/// `score_bwd`: `⌈K / BLOCK⌉` blocks (at least one), one thread per row.
pub(crate) fn score_bwd<B>(
    float: FloatKind,
    args: &ScoreArgs,
    count: usize,
    (rows, grad_out, grad): (B, B, B),
) -> Result<Launch<B>> {
    let blocks = count.div_ceil(BLOCK as usize).max(1);
    let mut params = vec![
        Param::Buffer(rows),
        Param::Buffer(grad_out),
        Param::Buffer(grad),
    ];
    params.extend(scalars(args, count)?);
    Ok(Launch {
        family: "score_bwd",
        float,
        dims: LaunchDims {
            grid: (dim_u32(blocks, "score blocks")?, 1, 1),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        },
        params,
    })
}
