//! The expected n-gram statistics of a CTC output's collapsed sequence (docs/loss.md, §17 BLEU on
//! CTC outputs), as a candle custom op over the logits with its CPU kernel and its hand-written
//! backward side by side.
//!
//! Frame `t` of a batch element has its own distribution `q_t = softmax(z_t)` over `V` symbols,
//! one of them the blank; an alignment `a` draws every frame independently, and the hypothesis is
//! its collapse `B(a)`: repeats merged, then blanks removed. For every reference n-gram `g` the
//! op computes `E[count of g in B(a)]`, and besides the expected length `E[|B(a)|]` and the
//! expected number of n-grams `E[max(|B(a)| − n + 1, 0)]` of every order, each by a dynamic
//! program that is linear in the frames:
//!
//! - **n-gram counts.** The reference n-grams' prefixes form a trie. For node `k` (token `g_k`,
//!   parent `p`), `In_k(t)` is the probability that the last `d` tokens of `B(a_{..t})` are the
//!   node's prefix and frame `t` is still inside the run of `g_k`; `Gap_k(t)` the same with
//!   frame `t` a blank after that run. A new run of `g_k` starts at `t` with probability
//!   `Start_k(t) = q_t(g_k) R_k(t−1)`, where `R_k = 1 − q_{t−1}(g_k)` at depth 1 (any frame but
//!   `g_k` before it) and `R_k = [g_k ≠ g_p] In_p + Gap_p` below (equal neighbours need a blank
//!   between them). Then `In_k(t) = q_t(g_k) (In_k(t−1) + R_k(t−1))`,
//!   `Gap_k(t) = q_t(blank) (In_k(t−1) + Gap_k(t−1))` and `E_k = Σ_t Start_k(t)`.
//! - **Length.** `E[|B(a)|] = Σ_t Σ_{v ≠ blank} q_t(v) (1 − q_{t−1}(v))`: the expected number
//!   of runs.
//! - **Totals.** `E[max(L − n + 1, 0)] = E[L] − (n − 1) + Σ_{ℓ < n−1} P(L = ℓ) (n − 1 − ℓ)`, with
//!   `P(L = ℓ)` for `ℓ ≤ N − 2` from a count-capped program over the vocabulary:
//!   `In_c(t, v)` (count `c`, frame `t` inside a run of `v`) and `Gap_c(t)` (count `c`, a blank),
//!   `In_c(t, v) = q_t(v) (In_c(t−1, v) + Gap_{c−1}(t−1) + S_{c−1}(t−1) − In_{c−1}(t−1, v))`,
//!   `Gap_c(t) = q_t(blank) (Gap_c(t−1) + S_c(t−1))`, `S_c = Σ_v In_c(·, v)`,
//!   `P(L = c) = Gap_c(T−1) + S_c(T−1)`. A total that rounds below 0 is 0 (gradient 0).
//!
//! The op's output per element is `[E[L] | t_1 … t_N | E_{1,0} … E_{1,W−1} | … | E_{N,W−1}]`
//! ([`CtcNgramPlan::columns`]): the expected count of the reference n-gram of order `n`
//! starting at position `j` of the element's references laid end to end (the layout of the
//! loss's reference side), 0 where no n-gram of that order starts inside a reference. Frames
//! at and beyond an element's length are skipped (a blank frame changes no statistic), so their
//! gradient is 0.
//!
//! The backward recomputes the programs storing their states, sweeps them in reverse
//! (the adjoint of each recursion above), and applies the softmax's Jacobian.

use crate::loss::kernels::backward::apply_backward_op2;
use crate::loss::kernels::cpu::{self, wide_vectors, LANES};
use crate::loss::kernels::float::{
    contiguous_slice, dispatch_float, unsupported_dtype, KernelFloat,
};
use candle_core::{
    backend::BackendStorage, bail, CpuStorage, CustomOp1, CustomOp2, Layout, Result, Shape, Tensor,
};
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;

/// A parent index meaning "depth 1": the node's n-gram starts with it.
const ROOT: u32 = u32::MAX;
/// A slot with no n-gram (it would cross the end of a reference).
pub(crate) const NO_NODE: u32 = u32::MAX;

/// One node of an element's trie of reference n-gram prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TrieNode {
    /// The prefix's last token (never the blank).
    pub token: u32,
    /// The node of the prefix one token shorter, or [`ROOT`]; always a smaller index.
    pub parent: u32,
    /// Whether `token` equals the parent's token: then a blank must separate the two runs.
    pub repeats_parent: bool,
}

impl TrieNode {
    pub(crate) fn is_root(&self) -> bool {
        self.parent == ROOT
    }
}

/// What the op computes for one element: its frames, its trie, and which node each output slot
/// reads.
#[derive(Debug, Clone)]
pub(crate) struct ElementPlan {
    /// Frames in use (the element's input length, `<= T'`).
    pub frames: usize,
    pub nodes: Vec<TrieNode>,
    /// `[N · W]`, order-major: the node of the n-gram of order `n` at reference position `j`,
    /// or [`NO_NODE`].
    pub slots: Vec<u32>,
}

/// The host-side plan of one call: plain parameters, built from the reference ids once per call.
#[derive(Debug, Clone)]
pub(crate) struct CtcNgramPlan {
    pub max_order: usize,
    pub blank: usize,
    /// `W`: the widest element's references laid end to end (at least 1).
    pub width: usize,
    pub elements: Vec<ElementPlan>,
}

impl CtcNgramPlan {
    /// The plan for references `refs[b][r]` (ids, never `blank`), laid end to end in a row of
    /// `width` positions, with `frames[b]` frames per element.
    pub(crate) fn new(
        refs: &[Vec<Vec<u32>>],
        frames: &[usize],
        max_order: usize,
        blank: u32,
        width: usize,
    ) -> Self {
        let elements = refs
            .iter()
            .zip(frames)
            .map(|(element_refs, &frames)| {
                let mut nodes: Vec<TrieNode> = Vec::new();
                let mut index: HashMap<(u32, u32), u32> = HashMap::new();
                let mut slots = vec![NO_NODE; max_order * width];
                let mut offset = 0;
                for reference in element_refs {
                    for start in 0..reference.len() {
                        let mut parent = ROOT;
                        for order in 1..=max_order.min(reference.len() - start) {
                            let token = reference[start + order - 1];
                            let node = *index.entry((parent, token)).or_insert_with(|| {
                                let repeats_parent =
                                    parent != ROOT && nodes[parent as usize].token == token;
                                nodes.push(TrieNode {
                                    token,
                                    parent,
                                    repeats_parent,
                                });
                                (nodes.len() - 1) as u32
                            });
                            slots[(order - 1) * width + offset + start] = node;
                            parent = node;
                        }
                    }
                    offset += reference.len();
                }
                ElementPlan {
                    frames,
                    nodes,
                    slots,
                }
            })
            .collect();
        Self {
            max_order,
            blank: blank as usize,
            width,
            elements,
        }
    }

    /// Output columns per element: `1 + N + N · W`.
    pub(crate) fn columns(&self) -> usize {
        1 + self.max_order + self.max_order * self.width
    }

    /// The plan as the CUDA kernels read it (`ngrams.cu`, `NgramTrie`): one u32 buffer holding,
    /// in order, each element's first node `[B + 1]`, each node's token `[K]` and link `[K]`
    /// (its parent's global index in the low 31 bits, `2^31 − 1` at depth 1, the top bit when
    /// its token repeats the parent's), each node's first child `[K + 1]` and the children
    /// `[K]` (ascending), each element's first token group `[B + 1]`, each group's token `[G]`
    /// and depth-1 node (or `2^31 − 1`) `[G]`, each group's first node `[G + 1]` and the nodes
    /// `[K]` (ascending), then the slots `[B, N·W]` as global nodes (or `u32::MAX`). Returns
    /// the buffer, `K` and `G`. Built on the host from the plan, so that no sum on the device
    /// needs an atomic: a parent gathers its children, a token its nodes.
    #[cfg(any(feature = "cuda-unverified", all(test, feature = "cuda-emu")))]
    pub(crate) fn trie_buffer(&self) -> (Vec<u32>, usize, usize) {
        const NONE: u32 = 0x7fff_ffff;
        const REPEATS: u32 = 0x8000_0000;
        let batch = self.elements.len();
        let nodes: usize = self.elements.iter().map(|e| e.nodes.len()).sum();
        let mut node_start = Vec::with_capacity(batch + 1);
        let (mut token, mut link) = (Vec::with_capacity(nodes), Vec::with_capacity(nodes));
        let mut children_of: Vec<Vec<u32>> = vec![Vec::new(); nodes];
        let mut group_start = Vec::with_capacity(batch + 1);
        let (mut group_token, mut group_root) = (Vec::new(), Vec::new());
        let (mut group_node_start, mut group_nodes) = (Vec::new(), Vec::with_capacity(nodes));
        let mut slots = Vec::with_capacity(batch * self.max_order * self.width);
        let mut offset = 0u32;
        for element in &self.elements {
            node_start.push(offset);
            group_start.push(group_token.len() as u32);
            let mut by_token: std::collections::BTreeMap<u32, (u32, Vec<u32>)> =
                std::collections::BTreeMap::new();
            for (k, node) in element.nodes.iter().enumerate() {
                let global = offset + k as u32;
                token.push(node.token);
                let entry = by_token.entry(node.token).or_insert((NONE, Vec::new()));
                entry.1.push(global);
                if node.is_root() {
                    entry.0 = global;
                    link.push(NONE);
                } else {
                    let parent = offset + node.parent;
                    children_of[parent as usize].push(global);
                    link.push(parent | if node.repeats_parent { REPEATS } else { 0 });
                }
            }
            for (t, (root, members)) in by_token {
                group_token.push(t);
                group_root.push(root);
                group_node_start.push(group_nodes.len() as u32);
                group_nodes.extend(members);
            }
            slots.extend(element.slots.iter().map(|&slot| {
                if slot == NO_NODE {
                    u32::MAX
                } else {
                    offset + slot
                }
            }));
            offset += element.nodes.len() as u32;
        }
        node_start.push(offset);
        group_start.push(group_token.len() as u32);
        group_node_start.push(group_nodes.len() as u32);
        let groups = group_token.len();
        let mut buffer = node_start;
        buffer.extend(token);
        buffer.extend(link);
        let mut first_child = 0u32;
        for children in &children_of {
            buffer.push(first_child);
            first_child += children.len() as u32;
        }
        buffer.push(first_child);
        let child_count = first_child as usize;
        buffer.extend(children_of.into_iter().flatten());
        buffer.extend(std::iter::repeat_n(0, nodes - child_count));
        buffer.extend(group_start);
        buffer.extend(group_token);
        buffer.extend(group_root);
        buffer.extend(group_node_start);
        buffer.extend(group_nodes);
        buffer.extend(slots);
        (buffer, nodes, groups)
    }

    /// `C`: the largest count whose probability `P(L = C)` the totals need (`N − 2`), or `None`
    /// when `N <= 1`.
    fn top_count(&self) -> Option<usize> {
        self.max_order.checked_sub(2)
    }
}

/// The op: logits `[B, T', V]` to the statistics `[B, 1 + N + N·W]`.
#[derive(Debug, Clone)]
pub(crate) struct CtcNgramOp {
    pub plan: Arc<CtcNgramPlan>,
    /// The CUDA side (`cuda-unverified`): the frame counts left on the device, if the host never
    /// read them (u32 `[B]`; they replace the plan's), and the plan once uploaded, shared by the
    /// forward and the backward.
    #[cfg(feature = "cuda-unverified")]
    device_frames: Option<Tensor>,
    #[cfg(feature = "cuda-unverified")]
    device_plan: Arc<std::sync::OnceLock<super::ngrams_cuda::DeviceNgramPlan>>,
}

impl CtcNgramOp {
    pub(crate) fn new(plan: CtcNgramPlan) -> Self {
        Self {
            plan: Arc::new(plan),
            #[cfg(feature = "cuda-unverified")]
            device_frames: None,
            #[cfg(feature = "cuda-unverified")]
            device_plan: Arc::default(),
        }
    }

    /// The op with the frame counts on the device (CUDA only): `frames` (u32, i32 or i64 `[B]`,
    /// never read by the host) converted to u32 there. An element whose count exceeds `T'` (a
    /// negative count wraps to a large one) gets a NaN row and NaN gradients from the kernels.
    #[cfg(feature = "cuda-unverified")]
    pub(crate) fn with_device_frames(self, frames: &Tensor) -> Result<Self> {
        Ok(Self {
            device_frames: Some(frames.to_dtype(candle_core::DType::U32)?.contiguous()?),
            ..self
        })
    }

    /// The kernels' sizes for logits of `shape`, and the plan on `device` (uploaded once).
    #[cfg(feature = "cuda-unverified")]
    fn cuda_plan(
        &self,
        shape: &Shape,
        device: &candle_core::CudaDevice,
    ) -> Result<(
        super::ngrams_launch::NgramArgs,
        super::ngrams_cuda::DeviceNgramPlan,
    )> {
        let (batch, frames, vocab) = self.check_shape(shape)?;
        let on_device = match self.device_plan.get() {
            Some(uploaded) => uploaded.clone(),
            None => {
                let device = candle_core::Device::Cuda(device.clone());
                let (buffer, nodes, groups) = self.plan.trie_buffer();
                let len = buffer.len();
                let frames = match &self.device_frames {
                    Some(frames) => frames.clone(),
                    None => Tensor::from_vec(
                        self.plan
                            .elements
                            .iter()
                            .map(|e| e.frames as u32)
                            .collect::<Vec<_>>(),
                        batch,
                        &device,
                    )?,
                };
                let uploaded = super::ngrams_cuda::DeviceNgramPlan {
                    trie: Tensor::from_vec(buffer, len, &device)?,
                    frames,
                    nodes,
                    groups,
                };
                let _ = self.device_plan.set(uploaded.clone());
                uploaded
            }
        };
        let args = super::ngrams_launch::NgramArgs {
            batch,
            frames,
            vocab,
            max_order: self.plan.max_order,
            width: self.plan.width,
            blank: self.plan.blank as u32,
            nodes: on_device.nodes,
            groups: on_device.groups,
        };
        Ok((args, on_device))
    }
}

/// The lane sum `Σ_v f(v)` over `len` entries, `f` reading entry `v`.
#[inline(always)]
fn lanes_sum<T: KernelFloat>(len: usize, mut f: impl FnMut(usize) -> T) -> T {
    let mut lanes = [T::ZERO; LANES];
    let full = len - len % LANES;
    for start in (0..full).step_by(LANES) {
        for (lane, acc) in lanes.iter_mut().enumerate() {
            *acc += f(start + lane);
        }
    }
    let mut sum = T::ZERO;
    for lane in lanes {
        sum += lane;
    }
    for v in full..len {
        sum += f(v);
    }
    sum
}

/// `Σ_v q(v) (1 − q_prev(v))`: a frame's share of `E[L]`.
#[inline(always)]
fn length_term_body<T: KernelFloat>(q: &[T], previous: &[T]) -> T {
    let previous = &previous[..q.len()];
    lanes_sum(q.len(), |v| q[v] * (T::ONE - previous[v]))
}

/// `after = q ⊙ (before + entering − lower)` (no `lower` when it is empty: count 1); returns
/// `Σ_v after(v)`, the next `S_c`.
#[inline(always)]
fn run_step_body<T: KernelFloat>(
    q: &[T],
    before: &[T],
    lower: &[T],
    entering: T,
    after: &mut [T],
) -> T {
    let vocab = q.len();
    let (before, after) = (&before[..vocab], &mut after[..vocab]);
    if lower.is_empty() {
        lanes_sum(vocab, |v| {
            let x = q[v] * (before[v] + entering);
            after[v] = x;
            x
        })
    } else {
        let lower = &lower[..vocab];
        lanes_sum(vocab, |v| {
            let x = q[v] * (before[v] + entering - lower[v]);
            after[v] = x;
            x
        })
    }
}

/// `g = scale · (1 − q_prev − q_next)`: the gradient of `scale · E[L]` at a frame.
#[inline(always)]
fn length_gradient_body<T: KernelFloat>(g: &mut [T], previous: &[T], next: &[T], scale: T) {
    let vocab = g.len();
    let (previous, next) = (&previous[..vocab], &next[..vocab]);
    for v in 0..vocab {
        g[v] = scale * (T::ONE - previous[v] - next[v]);
    }
}

/// One count of the length program in reverse at a frame: with `a = adjoint + offset` (the
/// adjoint of `In_c(·, v)` after the frame), `g += a ⊙ (before + entering − lower)` and
/// `adjoint = a ⊙ q` (`x̄_c`); returns `Σ_v x̄_c(v)`.
#[inline(always)]
fn run_adjoint_body<T: KernelFloat>(
    q: &[T],
    before: &[T],
    lower: &[T],
    entering: T,
    adjoint: &mut [T],
    offset: T,
    g: &mut [T],
) -> T {
    let vocab = q.len();
    let (before, adjoint, g) = (&before[..vocab], &mut adjoint[..vocab], &mut g[..vocab]);
    if lower.is_empty() {
        lanes_sum(vocab, |v| {
            let a = adjoint[v] + offset;
            g[v] += a * (before[v] + entering);
            let x = a * q[v];
            adjoint[v] = x;
            x
        })
    } else {
        let lower = &lower[..vocab];
        lanes_sum(vocab, |v| {
            let a = adjoint[v] + offset;
            g[v] += a * (before[v] + entering - lower[v]);
            let x = a * q[v];
            adjoint[v] = x;
            x
        })
    }
}

/// `g = q ⊙ (g − dot)`: through the softmax.
#[inline(always)]
fn softmax_jacobian_body<T: KernelFloat>(g: &mut [T], q: &[T], dot: T) {
    let q = &q[..g.len()];
    for v in 0..g.len() {
        g[v] = q[v] * (g[v] - dot);
    }
}

/// Zips the `LANES`-sized chunks of equal-length slices (the first `n` entries of each: a
/// multiple of `LANES`), so that the loops over a chunk's lanes compile without bounds checks
/// and vectorise; the remainder is handled by the caller.
macro_rules! lane_chunks {
    ($n:expr; $first:expr $(, $rest:expr)*) => {
        $first[..$n].chunks_exact(LANES) $(.zip($rest[..$n].chunks_exact(LANES)))*
    };
}

/// `sums` plus the three lane accumulators' totals.
#[inline(always)]
fn add_lanes<T: KernelFloat>(mut sums: (T, T, T), acc: &[[T; LANES]; 3]) -> (T, T, T) {
    for ((&a, &b), &c) in acc[0].iter().zip(&acc[1]).zip(&acc[2]) {
        sums.0 += a;
        sums.1 += b;
        sums.2 += c;
    }
    sums
}

/// One frame of the programs over the vocabulary for `N <= 4` (counts `c <= 2`), in one pass
/// over the frame's probabilities `q` (the blank's entry 0): `E[L]`'s term, and
/// `In_1 = q ⊙ (In_1 + entering_1)`, `In_2 = q ⊙ (In_2 + entering_2 − In_1)` from the states
/// before the frame (`in_1`, `in_2`: empty for counts the plan lacks) into `out_1`, `out_2`.
/// Returns `(E[L] term, S_1, S_2)`.
#[inline(always)]
fn frame_forward_body<T: KernelFloat>(
    q: &[T],
    previous: &[T],
    in_1: &[T],
    in_2: &[T],
    entering: (T, T),
    out_1: &mut [T],
    out_2: &mut [T],
) -> (T, T, T) {
    let vocab = q.len();
    let n = vocab - vocab % LANES;
    let mut acc = [[T::ZERO; LANES]; 3];
    let (e1, e2) = entering;
    // One element: (E[L] term, In_1, In_2).
    let one =
        |p: T, prev: T, i1: T, i2: T| (p * (T::ONE - prev), p * (i1 + e1), p * (i2 + e2 - i1));
    let mut sums = (T::ZERO, T::ZERO, T::ZERO);
    match (in_1.is_empty(), in_2.is_empty()) {
        (true, _) => {
            for (qc, pc) in lane_chunks!(n; q, previous) {
                for l in 0..LANES {
                    acc[0][l] += one(qc[l], pc[l], T::ZERO, T::ZERO).0;
                }
            }
            for v in n..vocab {
                sums.0 += one(q[v], previous[v], T::ZERO, T::ZERO).0;
            }
        }
        (false, true) => {
            let (out_head, out_tail) = out_1[..vocab].split_at_mut(n);
            for (oc, ((qc, pc), ic)) in out_head
                .chunks_exact_mut(LANES)
                .zip(lane_chunks!(n; q, previous, in_1))
            {
                for l in 0..LANES {
                    let (term, x1, _) = one(qc[l], pc[l], ic[l], T::ZERO);
                    oc[l] = x1;
                    acc[0][l] += term;
                    acc[1][l] += x1;
                }
            }
            for v in n..vocab {
                let (term, x1, _) = one(q[v], previous[v], in_1[v], T::ZERO);
                out_tail[v - n] = x1;
                sums.0 += term;
                sums.1 += x1;
            }
        }
        (false, false) => {
            let (o1_head, o1_tail) = out_1[..vocab].split_at_mut(n);
            let (o2_head, o2_tail) = out_2[..vocab].split_at_mut(n);
            for ((o1, o2), (((qc, pc), i1), i2)) in o1_head
                .chunks_exact_mut(LANES)
                .zip(o2_head.chunks_exact_mut(LANES))
                .zip(lane_chunks!(n; q, previous, in_1, in_2))
            {
                for l in 0..LANES {
                    let (term, x1, x2) = one(qc[l], pc[l], i1[l], i2[l]);
                    o1[l] = x1;
                    o2[l] = x2;
                    acc[0][l] += term;
                    acc[1][l] += x1;
                    acc[2][l] += x2;
                }
            }
            for v in n..vocab {
                let (term, x1, x2) = one(q[v], previous[v], in_1[v], in_2[v]);
                o1_tail[v - n] = x1;
                o2_tail[v - n] = x2;
                sums.0 += term;
                sums.1 += x1;
                sums.2 += x2;
            }
        }
    }
    add_lanes(sums, &acc)
}

/// One frame of the reverse sweep over the vocabulary for `N <= 4`, in one pass: the gradient
/// `g = length_adjoint · (1 − q_prev − q_next) + Σ_c a_c ⊙ X_c` with `a_c = adjoint_c + offset_c`
/// and `X_c` the bracket of `In_c`'s recursion, the new `adjoint_1 = x̄_1 − x̄_2`,
/// `adjoint_2 = x̄_2` (`x̄_c = a_c ⊙ q`). Returns `(Σ_v q g, Σ x̄_1, Σ x̄_2)`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn frame_reverse_body<T: KernelFloat>(
    g: &mut [T],
    q: &[T],
    previous: &[T],
    next: &[T],
    length_adjoint: T,
    in_1: &[T],
    in_2: &[T],
    entering: (T, T),
    adjoint_1: &mut [T],
    adjoint_2: &mut [T],
    offset: (T, T),
) -> (T, T, T) {
    let vocab = g.len();
    let n = vocab - vocab % LANES;
    let (e1, e2) = entering;
    let (o1, o2) = offset;
    let mut acc = [[T::ZERO; LANES]; 3];
    let mut sums = (T::ZERO, T::ZERO, T::ZERO);
    // One element: (g, x̄_1, x̄_2, new adjoint_1) from q, q_prev, q_next, In_1, In_2 before the
    // frame and the adjoints' stored parts.
    let one = |p: T, prev: T, nxt: T, i1: T, i2: T, a1: T, a2: T| {
        let (a1, a2) = (a1 + o1, a2 + o2);
        let gv = length_adjoint * (T::ONE - prev - nxt) + a1 * (i1 + e1) + a2 * (i2 + e2 - i1);
        let (x1, x2) = (a1 * p, a2 * p);
        (gv, x1, x2, x1 - x2)
    };
    match (in_1.is_empty(), in_2.is_empty()) {
        (true, _) => {
            let (head, tail) = g.split_at_mut(n);
            for (gc, (qc, (pc, nc))) in head.chunks_exact_mut(LANES).zip(
                q[..n]
                    .chunks_exact(LANES)
                    .zip(lane_chunks!(n; previous, next)),
            ) {
                for l in 0..LANES {
                    let gv = length_adjoint * (T::ONE - pc[l] - nc[l]);
                    gc[l] = gv;
                    acc[0][l] += qc[l] * gv;
                }
            }
            for v in n..vocab {
                let gv = length_adjoint * (T::ONE - previous[v] - next[v]);
                tail[v - n] = gv;
                sums.0 += q[v] * gv;
            }
        }
        (false, true) => {
            let (head, tail) = g.split_at_mut(n);
            let (a_head, a_tail) = adjoint_1[..vocab].split_at_mut(n);
            for ((gc, ac), (((qc, pc), nc), ic)) in head
                .chunks_exact_mut(LANES)
                .zip(a_head.chunks_exact_mut(LANES))
                .zip(lane_chunks!(n; q, previous, next, in_1))
            {
                for l in 0..LANES {
                    let (gv, x1, _, _) =
                        one(qc[l], pc[l], nc[l], ic[l], T::ZERO, ac[l], T::ZERO - o2);
                    gc[l] = gv;
                    ac[l] = x1;
                    acc[0][l] += qc[l] * gv;
                    acc[1][l] += x1;
                }
            }
            for v in n..vocab {
                let (gv, x1, _, _) = one(
                    q[v],
                    previous[v],
                    next[v],
                    in_1[v],
                    T::ZERO,
                    a_tail[v - n],
                    T::ZERO - o2,
                );
                tail[v - n] = gv;
                a_tail[v - n] = x1;
                sums.0 += q[v] * gv;
                sums.1 += x1;
            }
        }
        (false, false) => {
            let (head, tail) = g.split_at_mut(n);
            let (a1_head, a1_tail) = adjoint_1[..vocab].split_at_mut(n);
            let (a2_head, a2_tail) = adjoint_2[..vocab].split_at_mut(n);
            for (((gc, a1c), a2c), ((((qc, pc), nc), i1), i2)) in head
                .chunks_exact_mut(LANES)
                .zip(a1_head.chunks_exact_mut(LANES))
                .zip(a2_head.chunks_exact_mut(LANES))
                .zip(lane_chunks!(n; q, previous, next, in_1, in_2))
            {
                for l in 0..LANES {
                    let (gv, x1, x2, new_1) =
                        one(qc[l], pc[l], nc[l], i1[l], i2[l], a1c[l], a2c[l]);
                    gc[l] = gv;
                    a1c[l] = new_1;
                    a2c[l] = x2;
                    acc[0][l] += qc[l] * gv;
                    acc[1][l] += x1;
                    acc[2][l] += x2;
                }
            }
            for v in n..vocab {
                let (gv, x1, x2, new_1) = one(
                    q[v],
                    previous[v],
                    next[v],
                    in_1[v],
                    in_2[v],
                    a1_tail[v - n],
                    a2_tail[v - n],
                );
                tail[v - n] = gv;
                a1_tail[v - n] = new_1;
                a2_tail[v - n] = x2;
                sums.0 += q[v] * gv;
                sums.1 += x1;
                sums.2 += x2;
            }
        }
    }
    add_lanes(sums, &acc)
}

wide_vectors! {
    fn frame_forward(
        q: &[T],
        previous: &[T],
        in_1: &[T],
        in_2: &[T],
        entering: (T, T),
        out_1: &mut [T],
        out_2: &mut [T],
    ) -> (T, T, T) = frame_forward_body;
}
wide_vectors! {
    fn frame_reverse(
        g: &mut [T],
        q: &[T],
        previous: &[T],
        next: &[T],
        length_adjoint: T,
        in_1: &[T],
        in_2: &[T],
        entering: (T, T),
        adjoint_1: &mut [T],
        adjoint_2: &mut [T],
        offset: (T, T),
    ) -> (T, T, T) = frame_reverse_body;
}

/// The counts up to which one pass per frame does the vocabulary-sized work (`N <= 4`); beyond,
/// one pass per count.
const FUSED_TOP: usize = 2;

wide_vectors! {
    fn length_term(q: &[T], previous: &[T]) -> T = length_term_body;
}
wide_vectors! {
    fn run_step(q: &[T], before: &[T], lower: &[T], entering: T, after: &mut [T]) -> T
        = run_step_body;
}
wide_vectors! {
    fn length_gradient(g: &mut [T], previous: &[T], next: &[T], scale: T) -> ()
        = length_gradient_body;
}
wide_vectors! {
    fn run_adjoint(
        q: &[T],
        before: &[T],
        lower: &[T],
        entering: T,
        adjoint: &mut [T],
        offset: T,
        g: &mut [T],
    ) -> T = run_adjoint_body;
}
wide_vectors! {
    fn softmax_jacobian(g: &mut [T], q: &[T], dot: T) -> () = softmax_jacobian_body;
}

/// `R_k`: the probability mass from which a new run of the node's token starts the node's
/// n-gram at the next frame, from the states before it (`previous`: the frame before's
/// probabilities).
#[inline(always)]
fn node_ready<T: KernelFloat>(node: TrieNode, node_in: &[T], node_gap: &[T], previous: &[T]) -> T {
    if node.is_root() {
        T::ONE - previous[node.token as usize]
    } else {
        let parent = node.parent as usize;
        let in_parent = if node.repeats_parent {
            T::ZERO
        } else {
            node_in[parent]
        };
        in_parent + node_gap[parent]
    }
}

/// In a layer of the length program's states (`In_c(·, v)` for `c = 1..=C`, `V` each), the row
/// of count `c` and the row of count `c − 1` (empty for `c = 1`: no `In_0`).
fn count_rows<T>(layer: &[T], c: usize, vocab: usize) -> (&[T], &[T]) {
    let own = &layer[(c - 1) * vocab..c * vocab];
    let lower = if c == 1 {
        &layer[..0]
    } else {
        &layer[(c - 2) * vocab..(c - 1) * vocab]
    };
    (own, lower)
}

/// The totals `t_n` from `E[L]` and `P(L = ℓ)`, before the floor at 0.
fn raw_totals<T: KernelFloat>(length: T, probability_of_count: &[T], max_order: usize) -> Vec<T> {
    (1..=max_order)
        .map(|order| {
            let mut total = length - T::from_f64((order - 1) as f64);
            for (count, &p) in probability_of_count.iter().enumerate().take(order - 1) {
                total += p * T::from_f64((order - 1 - count) as f64);
            }
            total
        })
        .collect()
}

/// Per-thread working memory, grown as needed and reused across the elements a thread runs
/// (fresh buffers would cost a page fault per page, per element).
struct Scratch<T> {
    /// Frame rows `q_t` (the blank's entry 0): every frame's in the backward, two in the forward.
    q: Vec<T>,
    /// `q_t(blank)` per frame.
    blank: Vec<T>,
    /// Layers of `In_c(·, v)` for `c = 1..=C` (`C · V` each), one per frame boundary kept.
    runs: Vec<T>,
    /// Layers of `Gap_c` and `S_c` (`C + 1` each).
    gap: Vec<T>,
    run_sums: Vec<T>,
    /// Layers of the nodes' `In_k`, `Gap_k` (`K` each); `E_k`.
    node_in: Vec<T>,
    node_gap: Vec<T>,
    node_count: Vec<T>,
    /// A row of zeros: the frame before the first and after the last.
    zeros: Vec<T>,
    /// The backward's adjoints of `In_c(·, v)`, less their common offset (`C · V`).
    adjoint: Vec<T>,
}

impl<T: KernelFloat> Scratch<T> {
    fn new() -> Self {
        Self {
            q: Vec::new(),
            blank: Vec::new(),
            runs: Vec::new(),
            gap: Vec::new(),
            run_sums: Vec::new(),
            node_in: Vec::new(),
            node_gap: Vec::new(),
            node_count: Vec::new(),
            zeros: Vec::new(),
            adjoint: Vec::new(),
        }
    }
}

/// `buffer[..len]`, grown with zeros if needed (what it held before is kept, not cleared).
fn sized<T: KernelFloat>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::ZERO);
    }
    &mut buffer[..len]
}

/// The two layers `a` (read) and `b` (written) of `buffer`, `width` entries each.
fn layers<T>(buffer: &mut [T], width: usize, a: usize, b: usize) -> (&[T], &mut [T]) {
    debug_assert_ne!(a, b);
    if a < b {
        let (low, high) = buffer.split_at_mut(b * width);
        (&low[a * width..(a + 1) * width], &mut high[..width])
    } else {
        let (low, high) = buffer.split_at_mut(a * width);
        (&high[..width], &mut low[b * width..(b + 1) * width])
    }
}

/// What the programs end with: `E[L]` and `P(L = ℓ)` for `ℓ = 0..=C`.
struct Ends<T> {
    length: T,
    probability_of_count: Vec<T>,
}

/// Runs the programs over one element's frames in `s`. With `keep_all`, every frame's row and the
/// states at every frame boundary stay in `s` (layer `t`: before frame `t`), as the backward
/// needs; otherwise two layers alternate. Returns `None` if a logit is NaN or infinite.
fn run_programs<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    s: &mut Scratch<T>,
    keep_all: bool,
) -> Option<Ends<T>> {
    let frames = element.frames;
    let nodes = &element.nodes;
    let k_nodes = nodes.len();
    let top = plan.top_count().unwrap_or(0);
    let counts = plan.top_count().map_or(0, |c| c + 1);
    let run_width = top * vocab;
    let kept = if keep_all { frames + 1 } else { 2 };
    let layer = |t: usize| if keep_all { t } else { t % 2 };
    let row = |t: usize| if keep_all { t } else { t % 2 };
    let q = sized(&mut s.q, kept.max(2) * vocab);
    let blank = sized(&mut s.blank, frames.max(1));
    let runs = sized(&mut s.runs, kept * run_width);
    let gap = sized(&mut s.gap, kept * counts);
    let run_sums = sized(&mut s.run_sums, kept * counts);
    let node_in = sized(&mut s.node_in, kept * k_nodes);
    let node_gap = sized(&mut s.node_gap, kept * k_nodes);
    let node_count = sized(&mut s.node_count, k_nodes);
    let zeros = sized(&mut s.zeros, vocab);
    // Before the first frame: nothing emitted (count 0, as after a blank).
    runs[..run_width].fill(T::ZERO);
    gap[..counts].fill(T::ZERO);
    run_sums[..counts].fill(T::ZERO);
    if counts > 0 {
        gap[0] = T::ONE;
    }
    node_in[..k_nodes].fill(T::ZERO);
    node_gap[..k_nodes].fill(T::ZERO);
    node_count.fill(T::ZERO);
    let mut length = T::ZERO;
    for t in 0..frames {
        let (a, b) = (layer(t), layer(t + 1));
        // The frame's row, and the one before it (zeros at the first frame).
        let (current, previous): (&mut [T], &[T]) = {
            let this = row(t);
            if t == 0 {
                (&mut q[this * vocab..(this + 1) * vocab], &zeros[..])
            } else {
                let (prev_layer, this_layer) = layers(q, vocab, row(t - 1), this);
                (this_layer, prev_layer)
            }
        };
        cpu::softmax_row_into(&logits[t * vocab..(t + 1) * vocab], current, false)?;
        let b_t = current[plan.blank];
        current[plan.blank] = T::ZERO;
        blank[t] = b_t;
        // The vocabulary-sized work: the softmax's scale, E[L]'s term and the count-capped
        // length program.
        if counts > 0 {
            let (runs_a, runs_b) = layers(runs, run_width, a, b);
            let (gap_a, gap_b) = layers(gap, counts, a, b);
            let (sums_a, sums_b) = layers(run_sums, counts, a, b);
            let entering = |c: usize| gap_a[c - 1] + sums_a[c - 1];
            sums_b[0] = T::ZERO;
            if top <= FUSED_TOP {
                let (before_1, before_2) = runs_a.split_at(vocab.min(run_width));
                let (after_1, after_2) = runs_b.split_at_mut(vocab.min(run_width));
                let (term, s1, s2) = frame_forward(
                    current,
                    previous,
                    before_1,
                    before_2,
                    (
                        if top >= 1 { entering(1) } else { T::ZERO },
                        if top >= 2 { entering(2) } else { T::ZERO },
                    ),
                    after_1,
                    after_2,
                );
                length += term;
                for (c, s) in [(1, s1), (2, s2)] {
                    if c <= top {
                        sums_b[c] = s;
                    }
                }
            } else {
                length += length_term(current, previous);
                for c in 1..counts {
                    let (own, lower) = count_rows(runs_a, c, vocab);
                    sums_b[c] = run_step(
                        current,
                        own,
                        lower,
                        entering(c),
                        &mut runs_b[(c - 1) * vocab..c * vocab],
                    );
                }
            }
            for c in 0..counts {
                gap_b[c] = b_t * (gap_a[c] + sums_a[c]);
            }
        } else {
            let (term, _, _) = frame_forward(
                current,
                previous,
                &[],
                &[],
                (T::ZERO, T::ZERO),
                &mut [],
                &mut [],
            );
            length += term;
        }
        // The nodes: children read their parents' values before this frame (layer a).
        let (in_a, in_b) = layers(node_in, k_nodes, a, b);
        let (gap_a, gap_b) = layers(node_gap, k_nodes, a, b);
        for (k, node) in nodes.iter().enumerate() {
            let p = current[node.token as usize];
            let ready = node_ready(*node, in_a, gap_a, previous);
            node_count[k] += p * ready;
            in_b[k] = p * (in_a[k] + ready);
            gap_b[k] = b_t * (in_a[k] + gap_a[k]);
        }
    }
    let last = layer(frames);
    let probability_of_count = (0..counts)
        .map(|c| gap[last * counts + c] + run_sums[last * counts + c])
        .collect();
    Some(Ends {
        length,
        probability_of_count,
    })
}

/// The forward of one element into its output row; `false` if a logit is NaN or infinite.
fn element_forward<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    s: &mut Scratch<T>,
    out: &mut [T],
) -> bool {
    let Some(ends) = run_programs(logits, vocab, plan, element, s, false) else {
        return false;
    };
    let totals = raw_totals(ends.length, &ends.probability_of_count, plan.max_order);
    out[0] = ends.length;
    for (o, &t) in out[1..=plan.max_order].iter_mut().zip(&totals) {
        *o = t.larger(T::ZERO);
    }
    for (o, &slot) in out[1 + plan.max_order..].iter_mut().zip(&element.slots) {
        *o = if slot == NO_NODE {
            T::ZERO
        } else {
            s.node_count[slot as usize]
        };
    }
    true
}

/// The adjoints of the programs' ends, from the gradient of an element's output row: per node
/// (summed over the slots that read it), of `E[L]`, and of `P(L = ℓ)` for `ℓ = 0..=C`.
struct EndAdjoints<T> {
    node: Vec<T>,
    length: T,
    count: Vec<T>,
}

/// [`EndAdjoints`] of `element` from `grad_out` and the programs' `ends`.
fn end_adjoints<T: KernelFloat>(
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    grad_out: &[T],
    ends: &Ends<T>,
) -> EndAdjoints<T> {
    let orders = plan.max_order;
    let counts = plan.top_count().map_or(0, |c| c + 1);
    let mut node = vec![T::ZERO; element.nodes.len()];
    for (&slot, &g) in element.slots.iter().zip(&grad_out[1 + orders..]) {
        if slot != NO_NODE {
            node[slot as usize] += g;
        }
    }
    let totals = raw_totals(ends.length, &ends.probability_of_count, orders);
    let mut length = grad_out[0];
    let mut count = vec![T::ZERO; counts];
    for (order, (&total, &g)) in (1..=orders).zip(totals.iter().zip(&grad_out[1..=orders])) {
        if total <= T::ZERO {
            continue; // floored at 0: no gradient
        }
        length += g;
        for (c, a) in count.iter_mut().enumerate().take(order - 1) {
            *a += g * T::from_f64((order - 1 - c) as f64);
        }
    }
    EndAdjoints {
        node,
        length,
        count,
    }
}

/// One frame's rows for the reverse sweep: `q_t`, `q_{t−1}` and `q_{t+1}` (zeros beyond the
/// element's frames) and the blank's probability `b`.
struct FrameRows<'a, T> {
    q: &'a [T],
    previous: &'a [T],
    next: &'a [T],
    blank: T,
}

/// The length program's state before a frame, as the forward kept it: `Gap_c`, `S_c` and the
/// runs `In_c(·, v)`.
struct LengthLayers<'a, T> {
    gap: &'a [T],
    sums: &'a [T],
    runs: &'a [T],
}

/// The length program's adjoints carried backwards: `In_c(·, v)`'s as `runs + count[c]` (the
/// common part kept apart, so that each frame updates it once rather than at every `v`), and
/// the scratch of each frame's entering adjoints.
struct LengthAdjoints<'a, T> {
    runs: &'a mut [T],
    count: &'a mut [T],
    entering: &'a mut [T],
}

/// One frame of `E[L]`'s term and the count-capped length program in reverse, writing the
/// frame's dense gradient into `g`: returns `Σ_v q_v g_v` of that dense part when the fused pass
/// computes it, and the blank's gradient from the counts.
fn length_frame_reverse<T: KernelFloat>(
    (plan, vocab): (&CtcNgramPlan, usize),
    frame: &FrameRows<'_, T>,
    before: LengthLayers<'_, T>,
    (length_adjoint, adjoints): (T, &mut LengthAdjoints<'_, T>),
    g: &mut [T],
) -> (Option<T>, T) {
    let top = plan.top_count().unwrap_or(0);
    let counts = plan.top_count().map_or(0, |c| c + 1);
    let run_width = top * vocab;
    let (qt, previous, next, b) = (frame.q, frame.previous, frame.next, frame.blank);
    if counts == 0 {
        let (dot, _, _) = frame_reverse(
            g,
            qt,
            previous,
            next,
            length_adjoint,
            &[],
            &[],
            (T::ZERO, T::ZERO),
            &mut [],
            &mut [],
            (T::ZERO, T::ZERO),
        );
        return (Some(dot), T::ZERO);
    }
    let LengthAdjoints {
        runs: adjoint,
        count: count_adjoint,
        entering: entering_adjoint,
    } = adjoints;
    let mut blank_gradient = T::ZERO;
    for c in 0..counts {
        blank_gradient += count_adjoint[c] * (before.gap[c] + before.sums[c]);
    }
    let entering = |c: usize| before.gap[c - 1] + before.sums[c - 1];
    entering_adjoint.fill(T::ZERO);
    let mut dense_dot = None;
    if top <= FUSED_TOP {
        let (before_1, before_2) = before.runs.split_at(vocab.min(run_width));
        let (adjoint_1, adjoint_2) = adjoint.split_at_mut(vocab.min(run_width));
        let at = |c: usize, x: &[T]| if top >= c { x[c] } else { T::ZERO };
        let (dot, s1, s2) = frame_reverse(
            g,
            qt,
            previous,
            next,
            length_adjoint,
            before_1,
            before_2,
            (
                if top >= 1 { entering(1) } else { T::ZERO },
                if top >= 2 { entering(2) } else { T::ZERO },
            ),
            adjoint_1,
            adjoint_2,
            (at(1, count_adjoint), at(2, count_adjoint)),
        );
        dense_dot = Some(dot);
        entering_adjoint[1] = s1;
        if top >= 2 {
            entering_adjoint[2] = s2;
        }
    } else {
        length_gradient(g, previous, next, length_adjoint);
        for c in 1..counts {
            let (own, lower) = count_rows(before.runs, c, vocab);
            entering_adjoint[c] = run_adjoint(
                qt,
                own,
                lower,
                entering(c),
                &mut adjoint[(c - 1) * vocab..c * vocab],
                count_adjoint[c],
                g,
            );
        }
        for c in 1..counts.saturating_sub(1) {
            let (own, above) = adjoint.split_at_mut(c * vocab);
            for (x, &y) in own[(c - 1) * vocab..].iter_mut().zip(&above[..vocab]) {
                *x -= y;
            }
        }
    }
    // Before the frame: Gap_c and S_c get b·(their own) + Σ_v x̄_{c+1}; In_c(·, v) gets
    // x̄_c − x̄_{c+1} and, as its offset, the new count_adjoint[c].
    for c in 0..counts {
        count_adjoint[c] = count_adjoint[c] * b + entering_adjoint[c + 1];
    }
    (dense_dot, blank_gradient)
}

/// The n-gram programs' adjoints carried backwards: each node's `In_k`, `Gap_k` and readiness,
/// and the gradients depth-1 nodes send to the frame before (they read `1 − q_{t−1}`).
struct NodeAdjoints<T> {
    input: Vec<T>,
    gap: Vec<T>,
    ready: Vec<T>,
    pending: Vec<(usize, T)>,
}

/// One frame of the n-gram programs in reverse (`t`: the frame; `in_before`, `gap_before`: the
/// nodes' states before it), adding the sparse gradients — the ones the frame after sent, then
/// each node's — to `g`: returns their `Σ_v q_v ·` value, and `blank_gradient` (the blank's
/// gradient so far this frame) with the nodes' parts added in order.
fn ngram_frame_reverse<T: KernelFloat>(
    (t, nodes, node_adjoint): (usize, &[TrieNode], &[T]),
    frame: &FrameRows<'_, T>,
    (in_before, gap_before): (&[T], &[T]),
    (adjoints, mut blank_gradient): (&mut NodeAdjoints<T>, T),
    g: &mut [T],
) -> (T, T) {
    let (qt, b) = (frame.q, frame.blank);
    let mut sparse_dot = T::ZERO;
    for (token, value) in adjoints.pending.drain(..) {
        g[token] += value;
        sparse_dot += qt[token] * value;
    }
    for (k, node) in nodes.iter().enumerate() {
        let token = node.token as usize;
        let ready = node_ready(*node, in_before, gap_before, frame.previous);
        let value = adjoints.input[k] * (in_before[k] + ready) + node_adjoint[k] * ready;
        g[token] += value;
        sparse_dot += qt[token] * value;
        blank_gradient += adjoints.gap[k] * (in_before[k] + gap_before[k]);
        adjoints.ready[k] = qt[token] * (adjoints.input[k] + node_adjoint[k]);
        adjoints.input[k] = adjoints.input[k] * qt[token] + adjoints.gap[k] * b;
        adjoints.gap[k] *= b;
    }
    for (k, node) in nodes.iter().enumerate() {
        if node.is_root() {
            if t > 0 {
                adjoints
                    .pending
                    .push((node.token as usize, T::ZERO - adjoints.ready[k]));
            }
        } else {
            let parent = node.parent as usize;
            if !node.repeats_parent {
                adjoints.input[parent] += adjoints.ready[k];
            }
            adjoints.gap[parent] += adjoints.ready[k];
        }
    }
    (sparse_dot, blank_gradient)
}

/// The backward of one element: `grad_out` (its output row's gradient) to the logits' gradient
/// `grad` (`[T', V]`, every entry written): the programs again, keeping every frame's state,
/// then one reverse sweep over the frames — the length program, the n-gram programs, and the
/// softmax Jacobian of each frame's gradient.
fn element_backward<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    grad_out: &[T],
    s: &mut Scratch<T>,
    grad: &mut [T],
) {
    let frames = element.frames;
    grad[frames * vocab..].fill(T::ZERO);
    let Some(ends) = run_programs(logits, vocab, plan, element, s, true) else {
        // The forward refused non-finite logits, so no backward runs on them.
        grad.fill(T::ZERO);
        return;
    };
    let nodes = &element.nodes;
    let k_nodes = nodes.len();
    let top = plan.top_count().unwrap_or(0);
    let counts = plan.top_count().map_or(0, |c| c + 1);
    let run_width = top * vocab;
    let EndAdjoints {
        node: node_adjoint,
        length: length_adjoint,
        count: mut count_adjoint,
    } = end_adjoints(plan, element, grad_out, &ends);
    let Scratch {
        q,
        blank,
        runs,
        gap,
        run_sums,
        node_in,
        node_gap,
        zeros,
        adjoint,
        ..
    } = s;
    let zeros = &zeros[..vocab];
    let adjoint = sized(adjoint, run_width);
    adjoint.fill(T::ZERO);
    let mut entering_adjoint = vec![T::ZERO; counts + 1];
    let mut length_adjoints = LengthAdjoints {
        runs: adjoint,
        count: &mut count_adjoint,
        entering: &mut entering_adjoint,
    };
    let mut node_adjoints = NodeAdjoints {
        input: vec![T::ZERO; k_nodes],
        gap: vec![T::ZERO; k_nodes],
        ready: vec![T::ZERO; k_nodes],
        pending: Vec::new(),
    };
    for t in (0..frames).rev() {
        let frame = FrameRows {
            q: &q[t * vocab..(t + 1) * vocab],
            previous: if t == 0 {
                zeros
            } else {
                &q[(t - 1) * vocab..t * vocab]
            },
            next: if t + 1 < frames {
                &q[(t + 1) * vocab..(t + 2) * vocab]
            } else {
                zeros
            },
            blank: blank[t],
        };
        let g = &mut grad[t * vocab..(t + 1) * vocab];
        let before = LengthLayers {
            gap: &gap[t * counts..(t + 1) * counts],
            sums: &run_sums[t * counts..(t + 1) * counts],
            runs: &runs[t * run_width..(t + 1) * run_width],
        };
        let (dense_dot, length_blank) = length_frame_reverse(
            (plan, vocab),
            &frame,
            before,
            (length_adjoint, &mut length_adjoints),
            g,
        );
        let nodes_before = (
            &node_in[t * k_nodes..(t + 1) * k_nodes],
            &node_gap[t * k_nodes..(t + 1) * k_nodes],
        );
        let (sparse_dot, blank_gradient) = ngram_frame_reverse(
            (t, nodes, &node_adjoint),
            &frame,
            nodes_before,
            (&mut node_adjoints, length_blank),
            g,
        );
        // Through the softmax: dz = q ⊙ (dq − Σ_u q_u dq_u), the blank's entry from its parts.
        let dot = match dense_dot {
            Some(dense) => dense + sparse_dot,
            None => cpu::dot(frame.q, g),
        } + frame.blank * blank_gradient;
        softmax_jacobian(g, frame.q, dot);
        g[plan.blank] = frame.blank * (blank_gradient - dot);
    }
}

impl CtcNgramOp {
    fn check_shape(&self, shape: &Shape) -> Result<(usize, usize, usize)> {
        let (batch, frames, vocab) = shape.dims3()?;
        if batch != self.plan.elements.len() {
            bail!(
                "internal: CTC n-gram op planned for {} elements, logits have shape {:?}",
                self.plan.elements.len(),
                shape.dims()
            );
        }
        Ok((batch, frames, vocab))
    }

    fn cpu_forward<T: KernelFloat>(&self, logits: &[T], shape: &Shape) -> Result<Vec<T>> {
        let (_, frames, vocab) = self.check_shape(shape)?;
        let columns = self.plan.columns();
        let mut out = vec![T::ZERO; self.plan.elements.len() * columns];
        let finite = out
            .par_chunks_mut(columns)
            .zip(logits.par_chunks(frames * vocab))
            .zip(&self.plan.elements)
            .map_init(Scratch::new, |scratch, ((row, element_logits), element)| {
                element_forward(element_logits, vocab, &self.plan, element, scratch, row)
            })
            .reduce(|| true, |a, b| a && b);
        if !finite {
            bail!(
                "`logits` holds NaN or Inf values (shape {:?})",
                shape.dims()
            );
        }
        Ok(out)
    }

    fn cpu_backward<T: KernelFloat>(
        &self,
        logits: &[T],
        grad_out: &[T],
        shape: &Shape,
    ) -> Result<Vec<T>> {
        let (_, frames, vocab) = self.check_shape(shape)?;
        let columns = self.plan.columns();
        let mut grad = vec![T::ZERO; logits.len()];
        grad.par_chunks_mut(frames * vocab)
            .zip(logits.par_chunks(frames * vocab))
            .zip(grad_out.par_chunks(columns))
            .zip(&self.plan.elements)
            .for_each_init(
                Scratch::new,
                |scratch, (((grad, logits), grad_out), element)| {
                    element_backward(logits, vocab, &self.plan, element, grad_out, scratch, grad)
                },
            );
        Ok(grad)
    }
}

impl CustomOp1 for CtcNgramOp {
    fn name(&self) -> &'static str {
        "ctc-ngram-expectations"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = dispatch_float!(storage.dtype(), self.name(), <T> => {
            let logits = contiguous_slice::<T>(storage, layout, "logits")?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(self.cpu_forward(logits, layout.shape())?))
        })?;
        Ok((
            out,
            Shape::from((self.plan.elements.len(), self.plan.columns())),
        ))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (args, plan) = self.cuda_plan(layout.shape(), storage.device())?;
        let out = super::ngrams_cuda::forward(&args, &plan, storage, layout)?;
        Ok((out, Shape::from((args.batch, args.columns()))))
    }

    fn bwd(&self, logits: &Tensor, _out: &Tensor, grad_out: &Tensor) -> Result<Option<Tensor>> {
        let grad_out = grad_out.contiguous()?;
        let grad =
            apply_backward_op2(&grad_out, logits, &grad_out, CtcNgramBackward(self.clone()))?;
        Ok(Some(grad))
    }
}

/// The backward of a [`CtcNgramOp`]: `(logits, grad_out)` to the logits' gradient.
struct CtcNgramBackward(CtcNgramOp);

impl CustomOp2 for CtcNgramBackward {
    fn name(&self) -> &'static str {
        "ctc-ngram-expectations-backward"
    }

    fn cpu_fwd(
        &self,
        logits: &CpuStorage,
        logits_layout: &Layout,
        grad_out: &CpuStorage,
        grad_layout: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let shape = logits_layout.shape();
        if logits.dtype() != grad_out.dtype() {
            return Err(unsupported_dtype(self.name(), grad_out.dtype()));
        }
        let grad = dispatch_float!(logits.dtype(), self.name(), <T> => {
            let grad = self.0.cpu_backward(
                contiguous_slice::<T>(logits, logits_layout, "logits")?,
                contiguous_slice::<T>(grad_out, grad_layout, "gradient")?,
                shape,
            )?;
            Ok(candle_core::WithDType::to_cpu_storage_owned(grad))
        })?;
        Ok((grad, shape.clone()))
    }

    #[cfg(feature = "cuda-unverified")]
    fn cuda_fwd(
        &self,
        logits: &candle_core::CudaStorage,
        logits_layout: &Layout,
        grad_out: &candle_core::CudaStorage,
        grad_layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (args, plan) = self.0.cuda_plan(logits_layout.shape(), logits.device())?;
        let grad = super::ngrams_cuda::backward(
            &args,
            &plan,
            (logits, logits_layout),
            (grad_out, grad_layout),
        )?;
        Ok((grad, logits_layout.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every alignment of `q` (`[T][V]`, rows summing to 1), enumerated: `(E[count of each
    /// n-gram], E[L], E[max(L − n + 1, 0)] per order)`.
    fn enumerate(
        q: &[Vec<f64>],
        blank: u32,
        ngrams: &[Vec<u32>],
        max_order: usize,
    ) -> (Vec<f64>, f64, Vec<f64>) {
        let frames = q.len();
        let vocab = q.first().map_or(1, Vec::len);
        let mut counts = vec![0.0; ngrams.len()];
        let (mut length, mut totals) = (0.0, vec![0.0; max_order]);
        for code in 0..vocab.pow(frames as u32) {
            let (mut rest, mut p, mut collapsed, mut previous) = (code, 1.0, vec![], None);
            for row in q {
                let symbol = (rest % vocab) as u32;
                rest /= vocab;
                p *= row[symbol as usize];
                if Some(symbol) != previous && symbol != blank {
                    collapsed.push(symbol);
                }
                previous = Some(symbol);
            }
            length += p * collapsed.len() as f64;
            for (n, total) in totals.iter_mut().enumerate() {
                *total += p * collapsed.len().saturating_sub(n) as f64;
            }
            for (g, count) in ngrams.iter().zip(&mut counts) {
                let hits = collapsed.windows(g.len()).filter(|w| w == g).count();
                *count += p * hits as f64;
            }
        }
        (counts, length, totals)
    }

    #[test]
    fn the_programs_equal_enumeration_on_small_cases() -> Result<()> {
        use rand09::{Rng, SeedableRng};
        let mut rng = rand09::rngs::StdRng::seed_from_u64(7);
        let mut worst = 0f64;
        for _ in 0..300 {
            let frames = rng.random_range(0..=6usize);
            let vocab = rng.random_range(2..=4usize);
            let blank = rng.random_range(0..vocab) as u32;
            let max_order = rng.random_range(1..=6usize);
            let tokens: Vec<u32> = (0..vocab as u32).filter(|&v| v != blank).collect();
            let reference: Vec<u32> = (0..rng.random_range(1..=6usize))
                .map(|_| tokens[rng.random_range(0..tokens.len())])
                .collect();
            let logits: Vec<f64> = (0..frames.max(1) * vocab)
                .map(|_| rng.random_range(-3.0..3.0))
                .collect();
            let q: Vec<Vec<f64>> = logits
                .chunks(vocab)
                .take(frames)
                .map(|row| {
                    let sum: f64 = row.iter().map(|z| z.exp()).sum();
                    row.iter().map(|z| z.exp() / sum).collect()
                })
                .collect();
            let width = reference.len();
            let plan = CtcNgramPlan::new(
                &[vec![reference.clone()]],
                &[frames],
                max_order,
                blank,
                width,
            );
            let mut out = vec![0.0; plan.columns()];
            element_forward(
                &logits,
                vocab,
                &plan,
                &plan.elements[0],
                &mut Scratch::new(),
                &mut out,
            );
            let mut ngrams = vec![];
            let mut slots = vec![];
            for n in 1..=max_order {
                for j in 0..width {
                    if j + n <= width {
                        ngrams.push(reference[j..j + n].to_vec());
                        slots.push(1 + max_order + (n - 1) * width + j);
                    }
                }
            }
            let (counts, length, totals) = enumerate(&q, blank, &ngrams, max_order);
            worst = worst.max((out[0] - length).abs());
            for n in 0..max_order {
                worst = worst.max((out[1 + n] - totals[n]).abs());
            }
            for (&slot, &count) in slots.iter().zip(&counts) {
                worst = worst.max((out[slot] - count).abs());
            }
        }
        assert!(worst < 1e-12, "largest difference {worst:e}");
        Ok(())
    }
}
