//! The launch plans of the row op's CUDA kernels (`kernels.cu`, and `ce_options.cu` with the
//! cross-entropy's options or 16-bit logits): for each pass, the kernel, the grid, the block and
//! the parameters in the kernel's order, built on the shared plan types (`kernels/launch.rs`).
//!
//! Built with `cuda` or `cuda-emu`; imports only the shared bottom (the row layout, the
//! cross-entropy terms, the plan types).

use crate::loss::kernels::cpu::CrossEntropyTerms;
use crate::loss::kernels::launch::{dim_u32, rows_dims, FloatKind, Launch, Param};
use crate::loss::kernels::layout::{Pass, RowLayout};
use candle_core::{bail, Result, Shape, Tensor};

/// The kernel families in `kernels.cu`; each is instantiated as `<family>_f32` and `_f64`.
pub(crate) const KERNEL_FAMILIES: [&str; 5] = [
    "row_pass_fwd",
    "row_pass_bwd",
    "softmax_fwd",
    "symmetrize",
    "jacobian_bwd",
];

/// The kernel families of `ce_options.cu` (the row op's passes with the cross-entropy's options,
/// `cuda-unverified` on a GPU), each instantiated as `<family>_f32` and `_f64`.
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) const OPTIONS_FAMILIES: [&str; 5] = [
    "row_options_fwd",
    "row_options_bwd",
    "jacobian_options_bwd",
    "log_softmax_fwd",
    "log_softmax_bwd",
];

/// The families of `ce_options.cu` also instantiated for 16-bit logits, `<family>_f16` and
/// `_bf16` (read and written natively, computed in f32): the row pass and its backward.
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) const OPTIONS_16BIT_FAMILIES: [&str; 2] = ["row_options_fwd", "row_options_bwd"];

/// `kernels.cu` then `ce_options.cu` and `log_softmax.cu` (the public `log_softmax`'s
/// kernels), which use its helpers: the options kernels' module.
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) const OPTIONS_SOURCE: &str = concat!(
    include_str!("kernels.cu"),
    "\n",
    include_str!("float16.cu"),
    "\n",
    include_str!("ce_options.cu"),
    "\n",
    include_str!("log_softmax.cu")
);

/// `log_softmax_fwd` (`log_softmax.cu`): one block per row of `classes`, `y = x − lse(x)` from
/// `x` into `y`, both `[rows, classes]` contiguous.
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) fn log_softmax_fwd<B>(
    float: FloatKind,
    (rows, classes): (usize, usize),
    x: B,
    y: B,
) -> Result<Launch<B>> {
    Ok(Launch {
        family: "log_softmax_fwd",
        float,
        dims: rows_dims(rows)?,
        params: vec![
            Param::Buffer(x),
            Param::Buffer(y),
            Param::U32(dim_u32(classes, "classes")?),
        ],
    })
}

/// `log_softmax_bwd` (`log_softmax.cu`): one block per row, in place on the output's gradient
/// `grad`: `grad ← grad − exp(y)·Σ grad`, `y` the forward's output.
#[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
pub(crate) fn log_softmax_bwd<B>(
    float: FloatKind,
    (rows, classes): (usize, usize),
    grad: B,
    y: B,
) -> Result<Launch<B>> {
    Ok(Launch {
        family: "log_softmax_bwd",
        float,
        dims: rows_dims(rows)?,
        params: vec![
            Param::Buffer(grad),
            Param::Buffer(y),
            Param::U32(dim_u32(classes, "classes")?),
        ],
    })
}
/// What the kernels read of a row op: its pass, the output layout, the tensors it holds (u32
/// ids `[B, K]`, their first-occurrence links, targets `[B, S]`) and its cross-entropy terms.
pub(crate) struct RowArgsIn<'a> {
    pub pass: Pass,
    pub layout: RowLayout,
    pub ids: Option<&'a Tensor>,
    pub links: Option<&'a Tensor>,
    pub targets: Option<&'a Tensor>,
    pub ce: CrossEntropyTerms,
    /// `1 / n` for the `n` non-pad targets (0 without targets).
    pub inv_count: f64,
    /// The z-term's row weight over the cross-entropy's (`TargetRows::z_ratio`).
    pub z_ratio: f64,
    /// Logit soft-capping `c`, applied by the row pass as it reads the logits (`None`: off, or
    /// applied before the op).
    pub softcap: Option<f64>,
}

impl RowArgsIn<'_> {
    /// Whether the op asks for an option of the cross-entropy: class weights, a z-loss, the
    /// token accuracy or a soft cap.
    pub(crate) fn has_options(&self) -> bool {
        self.ce.class_weights.is_some() || self.ce.metrics() || self.softcap.is_some()
    }

    /// Whether launches over `float` logits take `ce_options.cu`'s kernels: with an option, or
    /// 16-bit logits (which only they read); `kernels.cu`'s plain ones otherwise.
    pub(crate) fn takes_options_kernels(&self, float: FloatKind) -> bool {
        self.has_options() || float.is_16bit()
    }

    /// The class weights the options kernels read, in f64 (`None`: every class 1).
    pub(crate) fn class_weights(&self) -> Option<&[f64]> {
        self.ce.class_weights.as_deref()
    }
}

/// The options parameters `ce_options.cu`'s kernels take after the plain kernels' ones:
/// `weights` (the class weights in the launch's float type, or a one-element placeholder),
/// `has_weights`, `W = Σ_v w_v`, `λ`, `z_ratio`, `metrics`, `c` and `1/c` (both 0 without a cap).
fn options_params<B>(op: &RowArgsIn<'_>, weights: Option<B>) -> Result<Vec<Param<B>>> {
    let Some(weights) = weights else {
        bail!("internal: a launch with the cross-entropy's options needs a class-weights buffer");
    };
    let weight_total: f64 = op.class_weights().map_or(0.0, |w| w.iter().sum());
    let (cap, inv_cap) = op.softcap.map_or((0.0, 0.0), |c| (c, 1.0 / c));
    Ok(vec![
        Param::Buffer(weights),
        Param::U32(u32::from(op.class_weights().is_some())),
        Param::Float(weight_total),
        Param::Float(op.ce.z_loss),
        Param::Float(op.z_ratio),
        Param::U32(u32::from(op.ce.metrics())),
        Param::Float(cap),
        Param::Float(inv_cap),
    ])
}

/// The scalar arguments every row kernel shares, for logits of one shape.
pub(crate) struct RowArgs {
    pub rows: usize,
    pub rows_per_batch: u32,
    pub vocab: u32,
    pub width: u32,
    pub has_targets: u32,
    pub has_pad: u32,
    pub pad_id: u32,
}

/// [`RowArgs`] of `op` on logits of shape `shape`.
pub(crate) fn row_args(op: &RowArgsIn<'_>, shape: &Shape) -> Result<RowArgs> {
    let dims = shape.dims();
    let vocab = dims.last().copied().unwrap_or(1);
    let rows = shape.elem_count() / vocab.max(1);
    let seq = match op.pass {
        Pass::Softmax => 1,
        _ => shape.dims3()?.1.max(1),
    };
    Ok(RowArgs {
        rows,
        rows_per_batch: dim_u32(seq, "sequence length")?,
        vocab: dim_u32(vocab, "vocabulary size")?,
        width: dim_u32(op.layout.gathered, "id width")?,
        has_targets: u32::from(op.targets.is_some()),
        has_pad: u32::from(op.ce.pad_id.is_some()),
        pad_id: op.ce.pad_id.unwrap_or(0),
    })
}

/// `softmax_fwd`: `probs[r] = softmax(logits[r])` over `args.rows` rows of `args.vocab`.
pub(crate) fn softmax_fwd<B>(
    float: FloatKind,
    args: &RowArgs,
    logits: B,
    probs: B,
) -> Result<Launch<B>> {
    Ok(Launch {
        family: "softmax_fwd",
        float,
        dims: rows_dims(args.rows)?,
        params: vec![
            Param::Buffer(logits),
            Param::Buffer(probs),
            Param::U32(args.vocab),
        ],
    })
}

/// The buffers of a `row_pass_fwd` launch: the logits, the ids and targets (a one-element
/// placeholder where the op holds none) and the output rows; with the options, the class
/// weights (see [`RowArgsIn::has_options`]).
pub(crate) struct RowPassFwdBuffers<B> {
    pub logits: B,
    pub ids: B,
    pub targets: B,
    pub out: B,
    pub class_weights: Option<B>,
}

/// `row_pass_fwd` (`row_options_fwd` with the options): the gathered probabilities and
/// cross-entropy columns of `op`'s rows, written at the columns after the self-match `Z` of each
/// output row.
pub(crate) fn row_pass_fwd<B>(
    float: FloatKind,
    op: &RowArgsIn<'_>,
    args: &RowArgs,
    buffers: RowPassFwdBuffers<B>,
) -> Result<Launch<B>> {
    let stride = dim_u32(op.layout.stride(), "row")?;
    let offset = dim_u32(op.layout.self_match_columns(), "row")?;
    if (op.softcap.is_some() || float.is_16bit()) && op.pass != Pass::Rows {
        bail!(
            "internal: the {:?} pass takes logits capped before the op, in f32 or f64",
            op.pass
        );
    }
    let mut params = vec![
        Param::Buffer(buffers.logits),
        Param::Buffer(buffers.ids),
        Param::Buffer(buffers.targets),
        Param::Buffer(buffers.out),
        Param::U32(args.rows_per_batch),
        Param::U32(args.vocab),
        Param::U32(args.width),
        Param::U32(stride),
        Param::U32(offset),
        Param::U32(args.has_targets),
        Param::U32(args.has_pad),
        Param::U32(args.pad_id),
        Param::Float(op.ce.label_smoothing),
        Param::Float(op.inv_count),
    ];
    let family = if op.takes_options_kernels(float) {
        params.extend(options_params(op, buffers.class_weights)?);
        "row_options_fwd"
    } else {
        "row_pass_fwd"
    };
    Ok(Launch {
        family,
        float,
        dims: rows_dims(args.rows)?,
        params,
    })
}

/// `symmetrize`: `sym[b, i, j] = dZ[b, i, j] + dZ[b, j, i]` from the first `seq` columns of each
/// row of `grad_out`, for the self-match pass's backward.
pub(crate) fn symmetrize<B>(
    float: FloatKind,
    op: &RowArgsIn<'_>,
    args: &RowArgs,
    seq: usize,
    grad_out: B,
    sym: B,
) -> Result<Launch<B>> {
    Ok(Launch {
        family: "symmetrize",
        float,
        dims: rows_dims(args.rows)?,
        params: vec![
            Param::Buffer(grad_out),
            Param::Buffer(sym),
            Param::U32(dim_u32(seq, "sequence length")?),
            Param::U32(dim_u32(op.layout.stride(), "row")?),
        ],
    })
}

/// The buffers of the backward launch. `dense` is the dense part the Jacobian applies
/// (`grad_out` for the softmax pass, `(dZ + dZᵀ) P` for the self-match pass) and `probs` the
/// probabilities (the softmax's output, or recomputed); the row pass reads the logits instead.
pub(crate) enum BackwardInput<B> {
    /// The row pass: its logits.
    Logits(B),
    /// The softmax and self-match passes: the probabilities and the dense gradient of them.
    Jacobian { probs: B, dense: B },
}

/// The buffers of a backward launch besides its [`BackwardInput`].
pub(crate) struct BackwardBuffers<B> {
    pub input: BackwardInput<B>,
    pub ids: B,
    pub links: B,
    pub targets: B,
    pub out: B,
    pub grad_out: B,
    pub grad: B,
    /// With the options, the class weights (see [`RowArgsIn::has_options`]).
    pub class_weights: Option<B>,
}

/// The logits gradient of `op`'s pass: `row_pass_bwd` for the row pass, `jacobian_bwd` for the
/// softmax and self-match passes (after [`symmetrize`] and the product for the latter); with the
/// options, `row_options_bwd` and `jacobian_options_bwd`.
pub(crate) fn backward<B>(
    float: FloatKind,
    op: &RowArgsIn<'_>,
    args: &RowArgs,
    buffers: BackwardBuffers<B>,
) -> Result<Launch<B>> {
    let stride = dim_u32(op.layout.stride(), "row")?;
    let offset = dim_u32(op.layout.gathered_start(), "row")?;
    let options = op.takes_options_kernels(float);
    if (op.softcap.is_some() || float.is_16bit()) && op.pass != Pass::Rows {
        bail!(
            "internal: the {:?} pass takes logits capped before the op, in f32 or f64",
            op.pass
        );
    }
    let (family, mut params) = match (op.pass, buffers.input) {
        (Pass::Rows, BackwardInput::Logits(logits)) => (
            if options {
                "row_options_bwd"
            } else {
                "row_pass_bwd"
            },
            vec![Param::Buffer(logits)],
        ),
        (Pass::Softmax | Pass::SelfMatch, BackwardInput::Jacobian { probs, dense }) => (
            if options {
                "jacobian_options_bwd"
            } else {
                "jacobian_bwd"
            },
            vec![Param::Buffer(probs), Param::Buffer(dense)],
        ),
        (pass, _) => bail!("internal: the wrong backward input for the {pass:?} pass"),
    };
    params.extend([
        Param::Buffer(buffers.ids),
        Param::Buffer(buffers.links),
        Param::Buffer(buffers.targets),
        Param::Buffer(buffers.out),
        Param::Buffer(buffers.grad_out),
        Param::Buffer(buffers.grad),
        Param::U32(args.rows_per_batch),
        Param::U32(args.vocab),
        Param::U32(args.width),
        Param::U32(stride),
    ]);
    if op.pass != Pass::Rows {
        params.push(Param::U32(offset));
    }
    params.extend([
        Param::U32(args.has_targets),
        Param::U32(args.has_pad),
        Param::U32(args.pad_id),
        Param::Float(op.ce.label_smoothing),
    ]);
    if options {
        params.extend(options_params(op, buffers.class_weights)?);
    }
    Ok(Launch {
        family,
        float,
        dims: rows_dims(args.rows)?,
        params,
    })
}
