//! How a custom op's backward applies its backward op: whether the gradient it returns records
//! that op.
//!
//! Candle's backward hands each op its output's gradient detached (tracking no op), unless
//! `CANDLE_GRAD_DO_NOT_DETACH` is set: then every gradient keeps the graph of the ops that made
//! it, candle's own backward formulas included. The custom ops' backward follow the same rule, so
//! that the graph stays whole: their backward op is recorded when the incoming gradient tracks an
//! op, and not otherwise (the training path, where no graph is kept: the backward ops have no
//! backward of their own). `tests/launch_count.rs` counts a step's backward launches from that
//! graph.

use candle_core::{CustomOp2, CustomOp3, Result, Tensor};

/// `a.apply_op2(b, op)`, recorded in the graph only when `grad` (the incoming gradient, one of the
/// arguments) tracks an op.
pub(crate) fn apply_backward_op2<C: CustomOp2 + Send + Sync + 'static>(
    grad: &Tensor,
    a: &Tensor,
    b: &Tensor,
    op: C,
) -> Result<Tensor> {
    if grad.track_op() {
        a.apply_op2(b, op)
    } else {
        a.apply_op2_no_bwd(b, &op)
    }
}

/// `a.apply_op3(b, c, op)`, recorded in the graph only when `grad` (the incoming gradient, one of
/// the arguments) tracks an op.
pub(crate) fn apply_backward_op3<C: CustomOp3 + Send + Sync + 'static>(
    grad: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    op: C,
) -> Result<Tensor> {
    if grad.track_op() {
        a.apply_op3(b, c, op)
    } else {
        a.apply_op3_no_bwd(b, c, &op)
    }
}
