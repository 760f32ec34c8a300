//! The launch plans of the CUDA kernels of the n-gram programs on CTC outputs (`ngrams.cu`), over
//! any back-end's buffers: the CUDA op (`ngrams_cuda.rs`, feature `cuda-unverified`) and the
//! emulator tests run the same plans (see [`launch`](crate::loss::kernels::launch) for the shared
//! types).
//!
//! Forward: `ctc_ngram_fwd`, one launch, one block per element: the output `[B, 1 + N + N·W]`.
//! Backward: `ctc_ngram_bwd`, one launch: the programs again, keeping every frame boundary's
//! scalar and node states and every [`NgramArgs::segment`]-th one's vocabulary-wide states, and
//! the reverse sweep into the gradient `[B, T, V]`, recomputing a segment's states as it enters
//! it. Buffers: the logits, u32 frame counts `[B]`,
//! the u32 trie buffer (`CtcNgramPlan::trie_buffer`) and one workspace in the logits' dtype,
//! sized by [`NgramArgs::workspace_len`].

use crate::loss::kernels::launch::{dim_u32, FloatKind, Launch, LaunchDims, Param, BLOCK};
use candle_core::{bail, Result};

/// The highest order the kernels take (`NGRAM_MAX_COUNTS + 2` in `ngrams.cu`): their per-thread
/// arrays hold the counts `0..=N − 2`. Higher orders run the composed ops.
pub(crate) const NGRAM_MAX_ORDER: usize = 8;

/// The sizes and settings both kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NgramArgs {
    pub batch: usize,
    /// `T'`, the logits' frames (each element reads its first `frames[b]`).
    pub frames: usize,
    pub vocab: usize,
    /// `N`.
    pub max_order: usize,
    /// `W`, the widest element's references laid end to end.
    pub width: usize,
    pub blank: u32,
    /// `K`, the trie nodes of the whole batch.
    pub nodes: usize,
    /// `G`, the (element, token) groups of the nodes.
    pub groups: usize,
}

impl NgramArgs {
    /// Output columns per element: `1 + N + N·W`.
    pub(crate) fn columns(&self) -> usize {
        1 + self.max_order + self.max_order * self.width
    }

    /// `C + 1`: the counts `ℓ = 0..=C` whose probabilities `P(L = ℓ)` the programs track (none
    /// for `N = 1`).
    fn counts(&self) -> usize {
        self.max_order.saturating_sub(1)
    }

    /// The backward's segment: the frames between two checkpoints of the vocabulary-wide
    /// layers, `⌈√T'⌉` (at least 1), so that it keeps about `2·√T'` of them instead of `T' + 1`.
    pub(crate) fn segment(&self) -> usize {
        let mut segment = (self.frames as f64).sqrt().ceil() as usize;
        while segment * segment < self.frames {
            segment += 1;
        }
        segment.max(1)
    }

    /// Elements of the workspace, as `ngram_work` in `ngrams.cu` lays it out: per element, the
    /// length program's vocabulary-wide layers (`C·V` each: two alternating, and in the
    /// backward `⌊T'/segment⌋ + 1` checkpoints and one segment's worth), its scalar layers
    /// (`C + 1` gaps and sums each; two in the forward, `T' + 1` in the backward) with, in the
    /// forward, two frame rows and, in the backward, the runs' adjoints, the row `q_{t+1}` and
    /// the blank's probabilities; then the nodes' layers, their expected counts and, in the
    /// backward, their adjoints.
    pub(crate) fn workspace_len(&self, backward: bool) -> usize {
        let (v, counts, k) = (self.vocab, self.counts(), self.nodes);
        let top = counts.saturating_sub(1);
        let layers = if backward { self.frames + 1 } else { 2 };
        let rows = if backward { 0 } else { 2 };
        let segment = self.segment();
        let run_layers = 2 + if backward {
            self.frames / segment + 1 + segment
        } else {
            0
        };
        let per_element = rows * v
            + run_layers * top * v
            + if backward {
                top * v + v + self.frames
            } else {
                0
            }
            + 2 * layers * counts;
        let node_part = 2 * layers * k + k + if backward { 6 * k } else { 0 };
        self.batch * per_element + node_part
    }

    /// The u32 parameters after the buffers: `B, T', V, N, W, blank, K, G`.
    fn scalars<B>(&self) -> Result<Vec<Param<B>>> {
        if self.max_order == 0 || self.max_order > NGRAM_MAX_ORDER {
            bail!(
                "internal: the CTC n-gram kernels take orders 1..={NGRAM_MAX_ORDER}, got {}",
                self.max_order
            );
        }
        if self.nodes >= NGRAM_NODE_LIMIT {
            bail!(
                "candle-bleu CTC n-gram kernels: {} trie nodes exceed {}",
                self.nodes,
                NGRAM_NODE_LIMIT - 1
            );
        }
        Ok(vec![
            Param::U32(dim_u32(self.batch, "batch")?),
            Param::U32(dim_u32(self.frames, "frames")?),
            Param::U32(dim_u32(self.vocab, "vocabulary size")?),
            Param::U32(dim_u32(self.max_order, "max_order")?),
            Param::U32(dim_u32(self.width, "reference width")?),
            Param::U32(self.blank),
            Param::U32(dim_u32(self.nodes, "trie nodes")?),
            Param::U32(dim_u32(self.groups, "token groups")?),
        ])
    }
}

/// Node indices are 31-bit in `ngrams.cu` (a link's top bit is a flag; `NGRAM_NONE` is
/// `2^31 − 1`).
pub(crate) const NGRAM_NODE_LIMIT: usize = 0x7fff_ffff;

/// One block of [`BLOCK`] threads per element.
fn element_blocks(batch: usize) -> Result<LaunchDims> {
    let grid = match u32::try_from(batch) {
        Ok(grid) if grid <= i32::MAX as u32 => grid,
        _ => bail!("candle-bleu CTC n-gram kernels: {batch} elements exceed a grid of 2^31 - 1"),
    };
    Ok(LaunchDims {
        grid: (grid, 1, 1),
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// The buffers both kernels read: the logits `[B, T', V]`, the u32 frame counts `[B]` and the
/// u32 trie buffer.
pub(crate) struct NgramInputs<B> {
    pub logits: B,
    pub frames: B,
    pub trie: B,
}

/// `ctc_ngram_fwd`: the output `[B, columns]`; `work` holds
/// [`NgramArgs::workspace_len`]`(false)` elements of the logits' dtype.
pub(crate) fn ctc_ngram_fwd<B>(
    float: FloatKind,
    args: &NgramArgs,
    inputs: NgramInputs<B>,
    out: B,
    work: B,
) -> Result<Launch<B>> {
    let mut params = vec![
        Param::Buffer(inputs.logits),
        Param::Buffer(inputs.frames),
        Param::Buffer(inputs.trie),
        Param::Buffer(out),
        Param::Buffer(work),
    ];
    params.extend(args.scalars()?);
    Ok(Launch {
        family: "ctc_ngram_fwd",
        float,
        dims: element_blocks(args.batch)?,
        params,
    })
}

/// `ctc_ngram_bwd`: the logits' gradient `[B, T', V]` (every entry written) from the output's
/// gradient `grad_out` `[B, columns]`; `work` holds [`NgramArgs::workspace_len`]`(true)`
/// elements of the logits' dtype.
pub(crate) fn ctc_ngram_bwd<B>(
    float: FloatKind,
    args: &NgramArgs,
    inputs: NgramInputs<B>,
    (grad_out, grad): (B, B),
    work: B,
) -> Result<Launch<B>> {
    let mut params = vec![
        Param::Buffer(inputs.logits),
        Param::Buffer(inputs.frames),
        Param::Buffer(inputs.trie),
        Param::Buffer(grad_out),
        Param::Buffer(grad),
        Param::Buffer(work),
    ];
    params.extend(args.scalars()?);
    params.push(Param::U32(dim_u32(args.segment(), "segment")?));
    Ok(Launch {
        family: "ctc_ngram_bwd",
        float,
        dims: element_blocks(args.batch)?,
        params,
    })
}
