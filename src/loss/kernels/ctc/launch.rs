//! The launch plans of the CTC loss's CUDA kernels (`ctc.cu`), over any back-end's buffers: the
//! CUDA op (`ctc_cuda.rs`, feature `cuda-unverified`) and the emulator tests run the same plans
//! (see [`launch`](crate::loss::kernels::launch) for the shared types).
//!
//! Forward: `ctc_lse` (from logits: each frame's log-sum-exp into the output's columns
//! `1..=T`), then `ctc_alpha` (the forward recursion, the loss into column 0). Backward:
//! `ctc_beta` (alpha again, beta, the occupancies and each element's gradient scale), then
//! `ctc_grad_rows` (each frame's gradient row). Buffers: `x` `[B, T, V]`, u32 `targets`
//! `[B, L]`, u32 `input_lengths` and `target_lengths` `[B]`, the output `[B, width]`, and the f64
//! workspaces sized by [`CtcArgs`].

use crate::loss::kernels::launch::{dim_u32, FloatKind, Launch, LaunchDims, Param};
use candle_core::{bail, Result};

/// The CUDA source of the CTC family's kernels: `kernels.cu` (whose helpers they use) and
/// `float16.cu` (16-bit storage), then `ctc.cu` (the CTC loss) and `ngrams.cu` (the n-gram
/// programs of the BLEU loss on CTC outputs, planned in `ngrams_launch.rs`).
pub(crate) const CTC_SOURCE: &str = concat!(
    include_str!("../row/kernels.cu"),
    "\n",
    include_str!("../row/float16.cu"),
    "\n",
    include_str!("ctc.cu"),
    "\n",
    include_str!("ngrams.cu")
);

/// Threads per block; must equal `CTC_BLOCK` in `ctc.cu`.
pub(crate) const CTC_BLOCK: u32 = 256;

/// The kernel families of `ctc.cu` and `ngrams.cu`, each instantiated as `<family>_f32` and
/// `_f64`.
pub(crate) const CTC_FAMILIES: [&str; 6] = [
    "ctc_lse",
    "ctc_alpha",
    "ctc_beta",
    "ctc_grad_rows",
    "ctc_ngram_fwd",
    "ctc_ngram_bwd",
];

/// The CTC loss's kernel families also instantiated for 16-bit inputs (`_f16`, `_bf16`: the input
/// and its gradient in 16 bits, read and written as they are, the output and the arithmetic in
/// f32). The n-gram programs take f32 or f64 only.
pub(crate) const CTC_16BIT_FAMILIES: [&str; 4] =
    ["ctc_lse", "ctc_alpha", "ctc_beta", "ctc_grad_rows"];

/// The sizes and settings every CTC kernel takes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CtcArgs {
    pub batch: usize,
    /// `T`, the input's frames (each element reads its first `input_lengths[b]`).
    pub frames: usize,
    pub vocab: usize,
    /// `L`, the targets' padded width.
    pub target_max: usize,
    pub blank: u32,
    /// The input is logits (the log-softmax fused in), else log-probabilities.
    pub from_logits: bool,
    pub zero_infinity: bool,
}

impl CtcArgs {
    /// The output's columns per element: the loss, then from logits each frame's log-sum-exp.
    pub(crate) fn width(&self) -> usize {
        if self.from_logits {
            1 + self.frames
        } else {
            1
        }
    }

    /// `2L + 1`, the most states an element has.
    pub(crate) fn states_max(&self) -> usize {
        2 * self.target_max + 1
    }

    /// f64 elements of the alpha and occupancy workspaces, `[B, T, 2L + 1]` each.
    pub(crate) fn table_len(&self) -> usize {
        self.batch * self.frames * self.states_max()
    }

    /// f64 elements of the two beta rows per element, `[B, 2, 2L + 1]`.
    pub(crate) fn beta_len(&self) -> usize {
        self.batch * 2 * self.states_max()
    }

    /// The u32 parameters after the buffers: `T, V, L, width, blank` (`ctc_lse` takes `T, V`).
    fn sizes(&self) -> Result<[u32; 5]> {
        Ok([
            dim_u32(self.frames, "frames")?,
            dim_u32(self.vocab, "vocabulary size")?,
            dim_u32(self.target_max, "target width")?,
            dim_u32(self.width(), "output width")?,
            self.blank,
        ])
    }
}

/// `blocks` blocks of [`CTC_BLOCK`] threads.
fn blocks(blocks: usize) -> Result<LaunchDims> {
    let grid = match u32::try_from(blocks) {
        Ok(grid) if grid <= i32::MAX as u32 => grid,
        _ => bail!("candle-bleu CTC kernels: {blocks} blocks exceed a grid of 2^31 - 1"),
    };
    Ok(LaunchDims {
        grid: (grid, 1, 1),
        block: (CTC_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The buffers every CTC kernel reads: the input and the alignments.
pub(crate) struct CtcInputs<B> {
    pub x: B,
    pub targets: B,
    pub input_lengths: B,
    pub target_lengths: B,
}

/// `ctc_lse`: one block per frame row, each frame's log-sum-exp into `out[b, 1 + t]` (0 past the
/// input length). From logits only.
pub(crate) fn ctc_lse<B>(
    float: FloatKind,
    args: &CtcArgs,
    x: B,
    input_lengths: B,
    out: B,
) -> Result<Launch<B>> {
    if !args.from_logits {
        bail!("internal: ctc_lse is for logits");
    }
    let [frames, vocab, ..] = args.sizes()?;
    Ok(Launch {
        family: "ctc_lse",
        float,
        dims: blocks(args.batch * args.frames)?,
        params: vec![
            Param::Buffer(x),
            Param::Buffer(input_lengths),
            Param::Buffer(out),
            Param::U32(frames),
            Param::U32(vocab),
        ],
    })
}

/// `ctc_alpha`: one block per element, the loss into `out[b, 0]`; `alpha` is a workspace of
/// [`CtcArgs::table_len`] f64.
pub(crate) fn ctc_alpha<B>(
    float: FloatKind,
    args: &CtcArgs,
    inputs: CtcInputs<B>,
    out: B,
    alpha: B,
) -> Result<Launch<B>> {
    let [frames, vocab, target_max, width, blank] = args.sizes()?;
    Ok(Launch {
        family: "ctc_alpha",
        float,
        dims: blocks(args.batch)?,
        params: vec![
            Param::Buffer(inputs.x),
            Param::Buffer(inputs.targets),
            Param::Buffer(inputs.input_lengths),
            Param::Buffer(inputs.target_lengths),
            Param::Buffer(out),
            Param::Buffer(alpha),
            Param::U32(frames),
            Param::U32(vocab),
            Param::U32(target_max),
            Param::U32(width),
            Param::U32(blank),
            Param::U32(u32::from(args.from_logits)),
            Param::U32(u32::from(args.zero_infinity)),
        ],
    })
}

/// The workspaces of the backward: alpha and the occupancies ([`CtcArgs::table_len`] f64 each),
/// the beta rows ([`CtcArgs::beta_len`]) and each element's gradient scale (`B`).
pub(crate) struct CtcWorkspace<B> {
    pub alpha: B,
    pub beta: B,
    pub gamma: B,
    pub scale: B,
}

/// `ctc_beta`: one block per element, the occupancies and the gradient scales.
pub(crate) fn ctc_beta<B>(
    float: FloatKind,
    args: &CtcArgs,
    inputs: CtcInputs<B>,
    (out, grad_out): (B, B),
    workspace: CtcWorkspace<B>,
) -> Result<Launch<B>> {
    let [frames, vocab, target_max, width, blank] = args.sizes()?;
    Ok(Launch {
        family: "ctc_beta",
        float,
        dims: blocks(args.batch)?,
        params: vec![
            Param::Buffer(inputs.x),
            Param::Buffer(inputs.targets),
            Param::Buffer(inputs.input_lengths),
            Param::Buffer(inputs.target_lengths),
            Param::Buffer(out),
            Param::Buffer(grad_out),
            Param::Buffer(workspace.alpha),
            Param::Buffer(workspace.beta),
            Param::Buffer(workspace.gamma),
            Param::Buffer(workspace.scale),
            Param::U32(frames),
            Param::U32(vocab),
            Param::U32(target_max),
            Param::U32(width),
            Param::U32(blank),
            Param::U32(u32::from(args.from_logits)),
        ],
    })
}

/// `ctc_grad_rows`: one block per frame row, the gradient `[B, T, V]` from the occupancies and
/// scales `ctc_beta` wrote.
pub(crate) fn ctc_grad_rows<B>(
    float: FloatKind,
    args: &CtcArgs,
    inputs: CtcInputs<B>,
    out: B,
    (gamma, scale): (B, B),
    grad: B,
) -> Result<Launch<B>> {
    let [frames, vocab, target_max, width, blank] = args.sizes()?;
    Ok(Launch {
        family: "ctc_grad_rows",
        float,
        dims: blocks(args.batch * args.frames)?,
        params: vec![
            Param::Buffer(inputs.x),
            Param::Buffer(inputs.targets),
            Param::Buffer(inputs.input_lengths),
            Param::Buffer(inputs.target_lengths),
            Param::Buffer(out),
            Param::Buffer(gamma),
            Param::Buffer(scale),
            Param::Buffer(grad),
            Param::U32(frames),
            Param::U32(vocab),
            Param::U32(target_max),
            Param::U32(width),
            Param::U32(blank),
            Param::U32(u32::from(args.from_logits)),
        ],
    })
}
