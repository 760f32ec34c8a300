//! The expected n-gram statistics of a CTC output's collapsed sequence (docs/loss.md, §12 BLEU on
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

use super::dispatch_float;
use super::float::KernelFloat;
use super::{contiguous_slice, unsupported_dtype};
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
}

/// One element's frame distributions: `q` with the blank's entry set to 0 (`nonblank`, so that
/// the loops over the vocabulary need no branch), and the blank's probability apart.
struct Frame<'a, T> {
    nonblank: &'a [T],
    blank: T,
}

/// `softmax(logits)` into `out`, the blank's entry moved out: returns `(q(blank), finite)`.
fn softmax_row<T: KernelFloat>(logits: &[T], blank: usize, out: &mut [T]) -> (T, bool) {
    let mut max = T::NEG_INFINITY;
    let mut finite = true;
    for &z in logits {
        finite &= z.is_finite();
        max = max.larger(z);
    }
    let mut sum = T::ZERO;
    for (o, &z) in out.iter_mut().zip(logits) {
        *o = T::exp_nonpositive(z - max);
        sum += *o;
    }
    let inv = T::ONE / sum;
    for o in out.iter_mut() {
        *o *= inv;
    }
    let b = out[blank];
    out[blank] = T::ZERO;
    (b, finite)
}

/// The forward states of one element's programs after a frame.
struct Forward<T> {
    /// Per node: `In_k`, `Gap_k`, `E_k`.
    node_in: Vec<T>,
    node_gap: Vec<T>,
    node_count: Vec<T>,
    /// `E[L]`.
    length: T,
    /// Per count `c = 0..=C`: `Gap_c`, `S_c`; and `In_c(·, v)` for `c = 1..=C`, `[C · V]`.
    gap: Vec<T>,
    runs: Vec<T>,
    in_run: Vec<T>,
}

impl<T: KernelFloat> Forward<T> {
    fn new(nodes: usize, top: Option<usize>, vocab: usize) -> Self {
        let counts = top.map_or(0, |c| c + 1);
        let mut gap = vec![T::ZERO; counts];
        if counts > 0 {
            gap[0] = T::ONE; // before the first frame: count 0, as after a blank
        }
        Self {
            node_in: vec![T::ZERO; nodes],
            node_gap: vec![T::ZERO; nodes],
            node_count: vec![T::ZERO; nodes],
            length: T::ZERO,
            gap,
            runs: vec![T::ZERO; counts],
            in_run: vec![T::ZERO; top.unwrap_or(0) * vocab],
        }
    }

    /// Advances every program by frame `q` (`previous`: the frame before, `nonblank` zeros at the
    /// first frame).
    fn step(&mut self, nodes: &[TrieNode], q: &Frame<T>, previous: &[T]) {
        for (&p, &prev) in q.nonblank.iter().zip(previous) {
            self.length += p * (T::ONE - prev);
        }
        // Children read their parent's values before this frame: parents have smaller indices,
        // so walk the nodes from the last.
        for k in (0..nodes.len()).rev() {
            let node = nodes[k];
            let p = q.nonblank[node.token as usize];
            let ready = node_ready(node, &self.node_in, &self.node_gap, previous);
            let (in_k, gap_k) = (self.node_in[k], self.node_gap[k]);
            self.node_count[k] += p * ready;
            self.node_in[k] = p * (in_k + ready);
            self.node_gap[k] = q.blank * (in_k + gap_k);
        }
        let vocab = q.nonblank.len();
        let counts = self.gap.len();
        // Counts from the highest, so that In_{c−1} is still the previous frame's.
        for c in (1..counts).rev() {
            let entering = self.gap[c - 1] + self.runs[c - 1];
            let (lower, upper) = self.in_run.split_at_mut((c - 1) * vocab);
            let in_c = &mut upper[..vocab];
            let mut sum = T::ZERO;
            if c == 1 {
                for (x, &p) in in_c.iter_mut().zip(q.nonblank) {
                    *x = p * (*x + entering);
                    sum += *x;
                }
            } else {
                let in_lower = &lower[(c - 2) * vocab..];
                for ((x, &p), &below) in in_c.iter_mut().zip(q.nonblank).zip(in_lower) {
                    *x = p * (*x + entering - below);
                    sum += *x;
                }
            }
            self.gap[c] = q.blank * (self.gap[c] + self.runs[c]);
            self.runs[c] = sum;
        }
        if counts > 0 {
            self.gap[0] = q.blank * self.gap[0];
        }
    }
}

/// `R_k`: the probability mass from which a new run of the node's token starts the node's
/// n-gram at the next frame.
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

/// The forward of one element into its output row.
fn element_forward<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    out: &mut [T],
) -> bool {
    let mut state = Forward::<T>::new(element.nodes.len(), plan.top_count(), vocab);
    let mut previous = vec![T::ZERO; vocab];
    let mut current = vec![T::ZERO; vocab];
    let mut finite = true;
    for row in logits.chunks_exact(vocab).take(element.frames) {
        let (blank, row_finite) = softmax_row(row, plan.blank, &mut current);
        finite &= row_finite;
        let frame = Frame {
            nonblank: &current,
            blank,
        };
        state.step(&element.nodes, &frame, &previous);
        std::mem::swap(&mut previous, &mut current);
    }
    let probability_of_count: Vec<T> = state
        .gap
        .iter()
        .zip(&state.runs)
        .map(|(&g, &s)| g + s)
        .collect();
    let totals = raw_totals(state.length, &probability_of_count, plan.max_order);
    out[0] = state.length;
    for (o, &t) in out[1..=plan.max_order].iter_mut().zip(&totals) {
        *o = t.larger(T::ZERO);
    }
    for (o, &slot) in out[1 + plan.max_order..].iter_mut().zip(&element.slots) {
        *o = if slot == NO_NODE {
            T::ZERO
        } else {
            state.node_count[slot as usize]
        };
    }
    finite
}

/// The backward of one element: `grad_out` (its output row's gradient) to the logits' gradient.
fn element_backward<T: KernelFloat>(
    logits: &[T],
    vocab: usize,
    plan: &CtcNgramPlan,
    element: &ElementPlan,
    grad_out: &[T],
    grad: &mut [T],
) {
    let frames = element.frames;
    let nodes = &element.nodes;
    let k_nodes = nodes.len();
    let top = plan.top_count();
    let counts = top.map_or(0, |c| c + 1);
    // The frame distributions, and the states before each frame (index t: before frame t).
    let mut q = vec![T::ZERO; frames * vocab];
    let mut blank = vec![T::ZERO; frames];
    let mut node_in = vec![T::ZERO; (frames + 1) * k_nodes];
    let mut node_gap = vec![T::ZERO; (frames + 1) * k_nodes];
    let mut gap = vec![T::ZERO; (frames + 1) * counts];
    let mut runs = vec![T::ZERO; (frames + 1) * counts];
    let in_width = top.unwrap_or(0) * vocab;
    let mut in_run = vec![T::ZERO; (frames + 1) * in_width];
    let mut state = Forward::<T>::new(k_nodes, top, vocab);
    let zeros = vec![T::ZERO; vocab];
    for t in 0..frames {
        let save = |dst: &mut [T], src: &[T], width: usize| {
            dst[t * width..(t + 1) * width].copy_from_slice(src)
        };
        save(&mut node_in, &state.node_in, k_nodes);
        save(&mut node_gap, &state.node_gap, k_nodes);
        save(&mut gap, &state.gap, counts);
        save(&mut runs, &state.runs, counts);
        save(&mut in_run, &state.in_run, in_width);
        let (before, row) = q.split_at_mut(t * vocab);
        let row = &mut row[..vocab];
        blank[t] = softmax_row(&logits[t * vocab..(t + 1) * vocab], plan.blank, row).0;
        let previous = if t == 0 {
            &zeros[..]
        } else {
            &before[(t - 1) * vocab..]
        };
        let frame = Frame {
            nonblank: row,
            blank: blank[t],
        };
        state.step(nodes, &frame, previous);
    }
    // The output's gradients: per node (summed over the slots that read it), E[L], P(L = ℓ).
    let orders = plan.max_order;
    let mut node_adjoint = vec![T::ZERO; k_nodes];
    for (&slot, &g) in element.slots.iter().zip(&grad_out[1 + orders..]) {
        if slot != NO_NODE {
            node_adjoint[slot as usize] += g;
        }
    }
    let probability_of_count: Vec<T> = state
        .gap
        .iter()
        .zip(&state.runs)
        .map(|(&g, &s)| g + s)
        .collect();
    let totals = raw_totals(state.length, &probability_of_count, orders);
    let mut length_adjoint = grad_out[0];
    let mut count_adjoint = vec![T::ZERO; counts];
    for (order, (&total, &g)) in (1..=orders).zip(totals.iter().zip(&grad_out[1..=orders])) {
        if total <= T::ZERO {
            continue; // floored at 0: no gradient
        }
        length_adjoint += g;
        for (count, a) in count_adjoint.iter_mut().enumerate().take(order - 1) {
            *a += g * T::from_f64((order - 1 - count) as f64);
        }
    }
    // dq: the gradient with respect to each frame's probabilities (the blank's apart).
    let mut dq = vec![T::ZERO; frames * vocab];
    let mut dblank = vec![T::ZERO; frames];
    // E[L] = Σ_t Σ_v q_t(v) (1 − q_{t−1}(v)).
    for t in 0..frames {
        let row = &mut dq[t * vocab..(t + 1) * vocab];
        let previous = if t == 0 {
            &zeros[..]
        } else {
            &q[(t - 1) * vocab..t * vocab]
        };
        let next = if t + 1 < frames {
            &q[(t + 1) * vocab..(t + 2) * vocab]
        } else {
            &zeros[..]
        };
        for ((d, &prev), &nxt) in row.iter_mut().zip(previous).zip(next) {
            *d += length_adjoint * (T::ONE - prev - nxt);
        }
    }
    // The n-gram programs in reverse: adjoints of In_k and Gap_k after the frame being undone.
    let mut in_adjoint = vec![T::ZERO; k_nodes];
    let mut gap_adjoint = vec![T::ZERO; k_nodes];
    let mut ready_adjoint = vec![T::ZERO; k_nodes];
    for t in (0..frames).rev() {
        let qt = &q[t * vocab..(t + 1) * vocab];
        let previous = if t == 0 {
            &zeros[..]
        } else {
            &q[(t - 1) * vocab..t * vocab]
        };
        let in_before = &node_in[t * k_nodes..(t + 1) * k_nodes];
        let gap_before = &node_gap[t * k_nodes..(t + 1) * k_nodes];
        let b = blank[t];
        for (k, node) in nodes.iter().enumerate() {
            let token = node.token as usize;
            let ready = node_ready(*node, in_before, gap_before, previous);
            dq[t * vocab + token] +=
                in_adjoint[k] * (in_before[k] + ready) + node_adjoint[k] * ready;
            dblank[t] += gap_adjoint[k] * (in_before[k] + gap_before[k]);
            ready_adjoint[k] = qt[token] * (in_adjoint[k] + node_adjoint[k]);
            in_adjoint[k] = in_adjoint[k] * qt[token] + gap_adjoint[k] * b;
            gap_adjoint[k] *= b;
        }
        for (k, node) in nodes.iter().enumerate() {
            if node.is_root() {
                if t > 0 {
                    dq[(t - 1) * vocab + node.token as usize] -= ready_adjoint[k];
                }
            } else {
                let parent = node.parent as usize;
                if !node.repeats_parent {
                    in_adjoint[parent] += ready_adjoint[k];
                }
                gap_adjoint[parent] += ready_adjoint[k];
            }
        }
    }
    // The count-capped length program in reverse. `count_adjoint[c]` is the adjoint of Gap_c
    // and of S_c (they enter every recursion as a sum); `run_adjoint[c − 1]` that of In_c(·, v).
    if counts > 0 {
        let mut run_adjoint = vec![T::ZERO; in_width];
        for c in 1..counts {
            run_adjoint[(c - 1) * vocab..c * vocab].fill(count_adjoint[c]);
        }
        let mut entering_adjoint = vec![T::ZERO; counts + 1];
        for t in (0..frames).rev() {
            let qt = &q[t * vocab..(t + 1) * vocab];
            let b = blank[t];
            let gap_before = &gap[t * counts..(t + 1) * counts];
            let runs_before = &runs[t * counts..(t + 1) * counts];
            let in_before = &in_run[t * in_width..(t + 1) * in_width];
            let dq_t = &mut dq[t * vocab..(t + 1) * vocab];
            for c in 0..counts {
                dblank[t] += count_adjoint[c] * (gap_before[c] + runs_before[c]);
            }
            // x̄_c(v) = Ā_c(v) q_t(v), accumulated in place of Ā_c; dq += Ā_c(v) X_c(v).
            entering_adjoint.fill(T::ZERO);
            for c in 1..counts {
                let entering = gap_before[c - 1] + runs_before[c - 1];
                let in_c = &in_before[(c - 1) * vocab..c * vocab];
                let adjoint = &mut run_adjoint[(c - 1) * vocab..c * vocab];
                let mut sum = T::ZERO;
                if c == 1 {
                    for ((a, d), (&p, &x)) in adjoint
                        .iter_mut()
                        .zip(dq_t.iter_mut())
                        .zip(qt.iter().zip(in_c))
                    {
                        *d += *a * (x + entering);
                        *a *= p;
                        sum += *a;
                    }
                } else {
                    let in_lower = &in_before[(c - 2) * vocab..(c - 1) * vocab];
                    for (((a, d), (&p, &x)), &below) in adjoint
                        .iter_mut()
                        .zip(dq_t.iter_mut())
                        .zip(qt.iter().zip(in_c))
                        .zip(in_lower)
                    {
                        *d += *a * (x + entering - below);
                        *a *= p;
                        sum += *a;
                    }
                }
                entering_adjoint[c] = sum;
            }
            // The adjoints before the frame: Gap/S of count c get b·(their own) and Σ x̄_{c+1};
            // In_c gets x̄_c − x̄_{c+1} + the new adjoint of S_c.
            for c in 0..counts {
                count_adjoint[c] = count_adjoint[c] * b + entering_adjoint[c + 1];
            }
            for c in 1..counts {
                let (lower, upper) = run_adjoint.split_at_mut(c * vocab);
                let own = &mut lower[(c - 1) * vocab..];
                let a_c = count_adjoint[c];
                if c + 1 < counts {
                    for (x, &above) in own.iter_mut().zip(&upper[..vocab]) {
                        *x = *x - above + a_c;
                    }
                } else {
                    for x in own.iter_mut() {
                        *x += a_c;
                    }
                }
            }
        }
    }
    // Through the softmax: dz = q ⊙ (dq − Σ_u q_u dq_u), the blank's entry from its own parts.
    for t in 0..frames {
        let qt = &q[t * vocab..(t + 1) * vocab];
        let dq_t = &dq[t * vocab..(t + 1) * vocab];
        let mut dot = blank[t] * dblank[t];
        for (&p, &d) in qt.iter().zip(dq_t) {
            dot += p * d;
        }
        let out = &mut grad[t * vocab..(t + 1) * vocab];
        for ((o, &p), &d) in out.iter_mut().zip(qt).zip(dq_t) {
            *o = p * (d - dot);
        }
        out[plan.blank] = blank[t] * (dblank[t] - dot);
    }
    // Frames at and beyond the length: gradient 0.
    grad[frames * vocab..].fill(T::ZERO);
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
            .map(|((row, element_logits), element)| {
                element_forward(element_logits, vocab, &self.plan, element, row)
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
            .for_each(|(((grad, logits), grad_out), element)| {
                element_backward(logits, vocab, &self.plan, element, grad_out, grad)
            });
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

    fn bwd(&self, logits: &Tensor, _out: &Tensor, grad_out: &Tensor) -> Result<Option<Tensor>> {
        let grad =
            logits.apply_op2_no_bwd(&grad_out.contiguous()?, &CtcNgramBackward(self.clone()))?;
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
            let max_order = rng.random_range(1..=4usize);
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
            element_forward(&logits, vocab, &plan, &plan.elements[0], &mut out);
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
