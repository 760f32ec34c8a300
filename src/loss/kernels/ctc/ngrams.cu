#line 2 "ngrams.cu"
// CUDA kernels of the expected n-gram statistics of CTC outputs, the BLEU loss on CTC outputs'
// programs (docs/loss.md, §17; the CPU kernel is ctc/ngrams.rs, whose programs these follow step
// for step, and whose comments derive them). Compiled by NVRTC after kernels.cu (whose block
// reductions and float helpers they use) and ctc.cu, as one module.
//
// One block per batch element b, its frames in sequence, the vocabulary-sized work (the softmax,
// E[L]'s term, the count-capped length program In_c(t, v)) across the block's threads, the trie's
// nodes across them too. Nothing is read back to the host and nothing is atomic: every sum has
// one owner and a fixed order, so a launch gives the same bits every time.
//
// Inputs: logits [B, T, V] (f32 or f64), u32 frames [B] (each element's input length: the
// frames at and beyond it change no statistic and get a zero gradient), and one u32 trie buffer
// (ctc/ngrams.rs `CtcNgramPlan::trie_buffer`) whose sections NgramTrie names. The output is the
// CPU op's [B, 1 + N + N·W]: E[L], the totals floored at 0, then the expected count of the
// reference n-gram of order n at position j (0 where none starts). An element whose frame count
// exceeds T, or with a non-finite logit among its frames, gets a NaN row and NaN gradients (the
// CPU op returns an error instead; an error here would need a device-to-host copy).
//
// Workspace (one T buffer, ngram_work's layout, sized by ngrams_launch.rs `NgramArgs`): per
// element the length program's vocabulary-wide layers In_c(t, ·) and the frame rows, then the
// nodes' layers and adjoints indexed by global node. The forward keeps two layers. The backward
// keeps the scalar and node layers of every frame boundary, but the vocabulary-wide ones only at
// every `segment`-th boundary (checkpoints), and recomputes a segment's layers from its
// checkpoint when the reverse sweep enters it: about 2·sqrt(T) layers of C·V instead of T + 1,
// for one more pass of the runs' recursion. It keeps each frame's probabilities q_t in the
// gradient buffer's row t until the reverse sweep overwrites it with the gradient, and q_{t+1}
// in one row of the workspace.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

// C = N - 2, the largest count whose probability the totals need: N <= NGRAM_MAX_COUNTS + 2.
#define NGRAM_MAX_COUNTS 6
// A node's link: its parent's global index in the low 31 bits, NGRAM_NONE at depth 1, and
// NGRAM_REPEATS when its token equals its parent's (a blank must separate the two runs).
#define NGRAM_NONE 0x7fffffffu
#define NGRAM_REPEATS 0x80000000u
// A slot of the output with no n-gram.
#define NGRAM_NO_NODE 0xffffffffu

// The trie buffer's sections, in order (K nodes, G token groups, over the whole batch).
struct NgramTrie {
    const u32* node_start;        // [B + 1]: element b's nodes are [node_start[b], node_start[b + 1])
    const u32* token;             // [K]
    const u32* link;              // [K]
    const u32* child_start;       // [K + 1]: node k's children are children[child_start[k] ..]
    const u32* children;          // [K], ascending within a node
    const u32* group_start;       // [B + 1]: element b's groups
    const u32* group_token;       // [G]: a token some node of the element holds
    const u32* group_root;        // [G]: the depth-1 node of that token, or NGRAM_NONE
    const u32* group_node_start;  // [G + 1]
    const u32* group_nodes;       // [K]: the nodes of each group, ascending
    const u32* slots;             // [B, N·W]: the node each output count reads, or NGRAM_NO_NODE
};

__device__ __forceinline__ NgramTrie ngram_trie(const u32* trie, u32 batch, u32 nodes, u32 groups) {
    NgramTrie t;
    t.node_start = trie;
    trie += batch + 1;
    t.token = trie;
    trie += nodes;
    t.link = trie;
    trie += nodes;
    t.child_start = trie;
    trie += nodes + 1;
    t.children = trie;
    trie += nodes;
    t.group_start = trie;
    trie += batch + 1;
    t.group_token = trie;
    trie += groups;
    t.group_root = trie;
    trie += groups;
    t.group_node_start = trie;
    trie += groups + 1;
    t.group_nodes = trie;
    trie += nodes;
    t.slots = trie;
    return t;
}

// One element's part of the workspace, and the nodes' (indexed by global node). `keep_all`: the
// backward's layout (every frame boundary kept, the adjoints); else the forward's (two layers).
template <typename T> struct NgramWork {
    T* q;            // forward: two frame rows of V
    T* runs;         // two alternating layers of C·V: In_c(·, v), c = 1..C
    T* checkpoints;  // backward: the layers at boundaries 0, segment, 2·segment, … (C·V each)
    T* segment_runs; // backward: the layers of the segment being swept (segment of C·V)
    T* run_adjoint;  // backward: C·V, In_c's adjoints less their common part
    T* next;         // backward: q_{t+1} (then q_t) over V
    T* gap;          // layers of C + 1: Gap_c
    T* sums;         // layers of C + 1: S_c
    T* blank;        // backward: q_t(blank) per frame, T
    T* node_in;      // layers of K: In_k
    T* node_gap;     // layers of K: Gap_k
    T* node_count;   // K: E_k
    T* node_input;   // backward, K each: In_k's and Gap_k's adjoints, the readiness of the
    T* node_gap_adj; //   frame just swept and of the one after it (2K), each node's sparse
    T* ready;        //   gradient at its token, and the adjoint of E_k from the output
    T* value;
    T* node_end;
};

// The backward's checkpoints for `frames_max` frames in segments of `segment`.
__device__ __forceinline__ u64 ngram_checkpoints(u32 frames_max, u32 segment) {
    return (u64)frames_max / segment + 1;
}

template <typename T>
__device__ NgramWork<T> ngram_work(T* work, u32 b, u32 batch, u32 frames_max, u32 vocab,
                                   u32 counts, u32 nodes, bool keep_all, u32 segment) {
    const u64 top = counts ? counts - 1 : 0;
    const u64 layers = keep_all ? (u64)frames_max + 1 : 2;
    const u64 rows = keep_all ? 0 : 2;
    const u64 run_layers = 2 + (keep_all ? ngram_checkpoints(frames_max, segment) + segment : 0);
    const u64 per_element = rows * vocab + run_layers * top * vocab +
                            (keep_all ? top * vocab + vocab + frames_max : 0) + 2 * layers * counts;
    NgramWork<T> w;
    T* p = work + (u64)b * per_element;
    w.q = p;
    p += rows * vocab;
    w.runs = p;
    p += 2 * top * vocab;
    w.checkpoints = p;
    p += keep_all ? ngram_checkpoints(frames_max, segment) * top * vocab : 0;
    w.segment_runs = p;
    p += keep_all ? (u64)segment * top * vocab : 0;
    w.run_adjoint = p;
    p += keep_all ? top * vocab : 0;
    w.next = p;
    p += keep_all ? vocab : 0;
    w.blank = p;
    p += keep_all ? frames_max : 0;
    w.gap = p;
    p += layers * counts;
    w.sums = p;
    T* n = work + (u64)batch * per_element;
    w.node_in = n;
    n += layers * nodes;
    w.node_gap = n;
    n += layers * nodes;
    w.node_count = n;
    n += nodes;
    w.node_input = n;
    w.node_gap_adj = n + nodes;
    w.ready = n + 2 * (u64)nodes;
    w.value = n + 4 * (u64)nodes;
    w.node_end = n + 5 * (u64)nodes;
    return w;
}

// Block-wide sums of v[0..n) (n <= NGRAM_MAX_COUNTS + 1), each in a fixed order; every thread
// gets the totals.
template <typename T> __device__ void ngram_block_sums(T* v, u32 n) {
    __shared__ T ngram_partials[NGRAM_MAX_COUNTS + 1][WARPS];
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    for (u32 i = 0; i < n; ++i) {
        for (int offset = WARP / 2; offset > 0; offset >>= 1)
            v[i] += __shfl_xor_sync(FULL_MASK, v[i], offset);
        if (lane == 0) ngram_partials[i][warp] = v[i];
    }
    __syncthreads();
    if (warp == 0) {
        for (u32 i = 0; i < n; ++i) {
            T x = lane < WARPS ? ngram_partials[i][lane] : T(0);
            for (int offset = WARP / 2; offset > 0; offset >>= 1)
                x += __shfl_xor_sync(FULL_MASK, x, offset);
            if (lane == 0) ngram_partials[i][0] = x;
        }
    }
    __syncthreads();
    for (u32 i = 0; i < n; ++i) v[i] = ngram_partials[i][0];
    __syncthreads();  // the shared array may be reused by the next reduction
}

// The frame's softmax into row q with the blank's entry 0; returns q_t(blank) to every thread,
// or NaN to every thread if a logit is not finite.
template <typename T>
__device__ T ngram_softmax_row(const T* __restrict__ z, T* __restrict__ q, u32 vocab, u32 blank) {
    __shared__ T ngram_blank_probability;
    T m, s;
    int finite;
    row_max_sum(z, vocab, m, s, finite);
    if (!finite) return quiet_nan<T>();  // every thread alike (a block-wide vote)
    const T inverse = T(1) / s;  // as the CPU kernel scales
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
        const T p = acc_exp(z[v] - m) * inverse;
        if (v == blank) {
            ngram_blank_probability = p;
            q[v] = T(0);
        } else {
            q[v] = p;
        }
    }
    __syncthreads();  // the row and the blank's probability written
    return ngram_blank_probability;
}

// R_k: the mass from which a new run of node k's token starts its n-gram at this frame, from the
// states before the frame and q_{t-1} (`prev`, null at the first frame: zeros).
template <typename T>
__device__ __forceinline__ T ngram_ready(u32 link, u32 token, const T* __restrict__ in_before,
                                         const T* __restrict__ gap_before, const T* __restrict__ prev) {
    const u32 parent = link & NGRAM_NONE;
    if (parent == NGRAM_NONE) return T(1) - (prev ? prev[token] : T(0));
    return ((link & NGRAM_REPEATS) ? T(0) : in_before[parent]) + gap_before[parent];
}

// The programs of one element over its frames (ctc/ngrams.rs `run_programs`): the frame rows,
// the length program's and the nodes' layers in `w` (layer t: before frame t), E_k into
// w.node_count, and E[L] to every thread. With keep_all, row t goes to q_rows + t·V and every
// layer is kept; else two of each alternate. Returns false (every thread alike) if a logit is
// not finite.
template <typename T>
__device__ bool ngram_programs(const T* __restrict__ z, u32 frames, u32 vocab, u32 blank,
                               u32 counts, const NgramTrie& trie, u32 k0, u32 k1, u32 nodes,
                               T* __restrict__ q_rows, const NgramWork<T>& w, bool keep_all,
                               u32 segment, T& length) {
    const u32 top = counts ? counts - 1 : 0;
    const u64 run_width = (u64)top * vocab;
    // Before the first frame nothing is emitted: count 0, as after a blank. Each thread owns the
    // columns v = threadIdx.x + k·BLOCK of every vocabulary-wide layer, here and below.
    for (u64 i = threadIdx.x; i < run_width; i += BLOCK) {
        w.runs[i] = T(0);
        if (keep_all) w.checkpoints[i] = T(0);
    }
    if (threadIdx.x < counts) {
        w.gap[threadIdx.x] = threadIdx.x == 0 ? T(1) : T(0);
        w.sums[threadIdx.x] = T(0);
    }
    for (u32 k = k0 + threadIdx.x; k < k1; k += BLOCK) {
        w.node_in[k] = T(0);
        w.node_gap[k] = T(0);
        w.node_count[k] = T(0);
    }
    length = T(0);
    __syncthreads();  // layer 0 written
    for (u32 t = 0; t < frames; ++t) {
        const u64 a = keep_all ? t : (t & 1u), next = keep_all ? (u64)t + 1 : ((t + 1) & 1u);
        T* cur = keep_all ? q_rows + (u64)t * vocab : w.q + (u64)(t & 1u) * vocab;
        const T* prev = t == 0 ? nullptr
                               : (keep_all ? q_rows + (u64)(t - 1) * vocab
                                           : w.q + (u64)((t - 1) & 1u) * vocab);
        const T bt = ngram_softmax_row(z + (u64)t * vocab, cur, vocab, blank);
        if (bt != bt) return false;
        if (keep_all && threadIdx.x == 0) w.blank[t] = bt;
        // The vocabulary: E[L]'s term and In_c(t, v) = q (In_c(t-1, v) + entering_c - In_{c-1}(t-1, v)).
        const T* runs_a = w.runs + (u64)(t & 1u) * run_width;
        T* runs_b = w.runs + (u64)((t + 1) & 1u) * run_width;
        T* checkpoint = keep_all && (t + 1) % segment == 0
                            ? w.checkpoints + (u64)((t + 1) / segment) * run_width
                            : nullptr;
        const T* gap_a = w.gap + a * counts;
        const T* sums_a = w.sums + a * counts;
        T entering[NGRAM_MAX_COUNTS + 1];
        T acc[NGRAM_MAX_COUNTS + 1];  // E[L]'s term, then S_c
        acc[0] = T(0);
        for (u32 c = 1; c <= top; ++c) {
            entering[c] = gap_a[c - 1] + sums_a[c - 1];
            acc[c] = T(0);
        }
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
            const T p = cur[v], before = prev ? prev[v] : T(0);
            acc[0] += p * (T(1) - before);
            T lower = T(0);
            for (u32 c = 1; c <= top; ++c) {
                const T own = runs_a[(u64)(c - 1) * vocab + v];
                const T x = p * (own + entering[c] - lower);
                runs_b[(u64)(c - 1) * vocab + v] = x;
                if (checkpoint) checkpoint[(u64)(c - 1) * vocab + v] = x;
                acc[c] += x;
                lower = own;
            }
        }
        ngram_block_sums(acc, top + 1);
        length += acc[0];
        if (threadIdx.x == 0 && counts) {
            T* gap_b = w.gap + next * counts;
            T* sums_b = w.sums + next * counts;
            for (u32 c = 0; c < counts; ++c) gap_b[c] = bt * (gap_a[c] + sums_a[c]);
            sums_b[0] = T(0);
            for (u32 c = 1; c <= top; ++c) sums_b[c] = acc[c];
        }
        // The nodes: children read their parents' states before this frame (layer a).
        const T* in_a = w.node_in + a * nodes;
        const T* ngap_a = w.node_gap + a * nodes;
        T* in_b = w.node_in + next * nodes;
        T* ngap_b = w.node_gap + next * nodes;
        for (u32 k = k0 + threadIdx.x; k < k1; k += BLOCK) {
            const u32 token = trie.token[k];
            const T p = cur[token];
            const T ready = ngram_ready(trie.link[k], token, in_a, ngap_a, prev);
            w.node_count[k] += p * ready;
            in_b[k] = p * (in_a[k] + ready);
            ngap_b[k] = bt * (in_a[k] + ngap_a[k]);
        }
        __syncthreads();  // layer t + 1 complete before frame t + 1 reads it
    }
    return true;
}

// t_n before the floor at 0: E[L] - (n - 1) + Σ_{ℓ < n-1} P(L = ℓ) (n - 1 - ℓ), with P(L = ℓ) =
// Gap_ℓ + S_ℓ after the last frame (`gap`, `sums`: that layer).
template <typename T>
__device__ __forceinline__ T ngram_raw_total(T length, const T* gap, const T* sums, u32 order) {
    T total = length - T(order - 1);
    for (u32 c = 0; c + 1 < order; ++c) total += (gap[c] + sums[c]) * T(order - 1 - c);
    return total;
}

// ---- forward ---------------------------------------------------------------------------------

// One block per element b: its output row [1 + N + N·W].
template <typename T>
__device__ void ctc_ngram_fwd(const T* __restrict__ logits, const u32* __restrict__ frames_of,
                              const u32* __restrict__ trie_buffer, T* __restrict__ out,
                              T* __restrict__ work, u32 batch, u32 frames_max, u32 vocab,
                              u32 max_order, u32 width, u32 blank, u32 nodes, u32 groups) {
    const u32 b = blockIdx.x;
    const NgramTrie trie = ngram_trie(trie_buffer, batch, nodes, groups);
    const u32 counts = max_order >= 2 ? max_order - 1 : 0;
    const u64 columns = 1 + max_order + (u64)max_order * width;
    T* row = out + (u64)b * columns;
    const u32 frames = frames_of[b];
    T length = T(0);
    const NgramWork<T> w = ngram_work(work, b, batch, frames_max, vocab, counts, nodes, false, 1u);
    if (frames > frames_max ||
        !ngram_programs(logits + (u64)b * frames_max * vocab, frames, vocab, blank, counts, trie,
                        trie.node_start[b], trie.node_start[b + 1], nodes, (T*)nullptr, w, false,
                        1u, length)) {
        for (u64 i = threadIdx.x; i < columns; i += BLOCK) row[i] = quiet_nan<T>();
        return;  // the whole block: no barrier follows
    }
    const u32 last = frames & 1u;
    const T* gap = w.gap + last * counts;
    const T* sums = w.sums + last * counts;
    const u32* slots = trie.slots + (u64)b * max_order * width;
    for (u64 i = threadIdx.x; i < columns; i += BLOCK) {
        T v;
        if (i == 0) {
            v = length;
        } else if (i <= max_order) {
            const T total = ngram_raw_total(length, gap, sums, (u32)i);
            v = total > T(0) ? total : T(0);
        } else {
            const u32 node = slots[i - 1 - max_order];
            v = node == NGRAM_NO_NODE ? T(0) : w.node_count[node];
        }
        row[i] = v;
    }
}

// ---- backward --------------------------------------------------------------------------------

// One block per element b: the gradient rows [T, V] of its logits from grad_out's row (the
// programs again keeping every layer, then one reverse sweep: ctc/ngrams.rs `element_backward`).
template <typename T>
__device__ void ctc_ngram_bwd(const T* __restrict__ logits, const u32* __restrict__ frames_of,
                              const u32* __restrict__ trie_buffer, const T* __restrict__ grad_out,
                              T* __restrict__ grad, T* __restrict__ work, u32 batch,
                              u32 frames_max, u32 vocab, u32 max_order, u32 width, u32 blank,
                              u32 nodes, u32 groups, u32 segment) {
    __shared__ T ngram_count_adjoint[NGRAM_MAX_COUNTS + 1];
    const u32 b = blockIdx.x;
    const NgramTrie trie = ngram_trie(trie_buffer, batch, nodes, groups);
    const u32 counts = max_order >= 2 ? max_order - 1 : 0;
    const u32 top = counts ? counts - 1 : 0;
    const u64 run_width = (u64)top * vocab;
    const u64 columns = 1 + max_order + (u64)max_order * width;
    const u32 frames = frames_of[b];
    T* g_b = grad + (u64)b * frames_max * vocab;
    if (frames > frames_max) {
        for (u64 i = threadIdx.x; i < (u64)frames_max * vocab; i += BLOCK) g_b[i] = quiet_nan<T>();
        return;  // the whole block: no barrier follows
    }
    for (u64 i = (u64)frames * vocab + threadIdx.x; i < (u64)frames_max * vocab; i += BLOCK)
        g_b[i] = T(0);  // frames past the input length change no statistic
    const u32 k0 = trie.node_start[b], k1 = trie.node_start[b + 1];
    const NgramWork<T> w = ngram_work(work, b, batch, frames_max, vocab, counts, nodes, true, segment);
    T length;
    if (!ngram_programs(logits + (u64)b * frames_max * vocab, frames, vocab, blank, counts, trie,
                        k0, k1, nodes, g_b, w, true, segment, length)) {
        for (u64 i = threadIdx.x; i < (u64)frames * vocab; i += BLOCK) g_b[i] = quiet_nan<T>();
        return;  // the whole block: no barrier follows
    }
    // The ends' adjoints: of E[L] (with the totals not floored), of P(L = ℓ), and of each E_k
    // (summed over the slots that read it, in slot order).
    const T* go = grad_out + (u64)b * columns;
    const T* gap_end = w.gap + (u64)frames * counts;
    const T* sums_end = w.sums + (u64)frames * counts;
    T length_adjoint = go[0];
    if (threadIdx.x == 0)
        for (u32 c = 0; c < counts; ++c) ngram_count_adjoint[c] = T(0);
    for (u32 order = 1; order <= max_order; ++order) {
        if (!(ngram_raw_total(length, gap_end, sums_end, order) > T(0))) continue;  // floored
        const T g = go[order];
        length_adjoint += g;
        if (threadIdx.x == 0)
            for (u32 c = 0; c + 1 < order; ++c) ngram_count_adjoint[c] += g * T(order - 1 - c);
    }
    const u32* slots = trie.slots + (u64)b * max_order * width;
    const u64 slot_count = (u64)max_order * width;
    for (u32 k = k0 + threadIdx.x; k < k1; k += BLOCK) {
        T end = T(0);
        for (u64 s = 0; s < slot_count; ++s)
            if (slots[s] == k) end += go[1 + max_order + s];
        w.node_end[k] = end;
        w.node_input[k] = T(0);
        w.node_gap_adj[k] = T(0);
        w.ready[k] = T(0);
        w.ready[nodes + k] = T(0);
    }
    for (u64 i = threadIdx.x; i < run_width; i += BLOCK) w.run_adjoint[i] = T(0);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) w.next[v] = T(0);
    __syncthreads();  // the adjoints initialised
    for (u32 t = frames; t-- > 0;) {
        T* g = g_b + (u64)t * vocab;  // q_t until the dense pass below overwrites it
        const T* prev = t == 0 ? nullptr : g_b + (u64)(t - 1) * vocab;
        const T bt = w.blank[t];
        // Entering a segment (its last frame, the first the sweep meets): its layers again, from
        // its checkpoint and the rows q_u (still in g_b: u < t), each thread its own columns.
        const u32 t0 = t / segment * segment;
        if (t == frames - 1 || (t + 1) % segment == 0) {
            const T* start = w.checkpoints + (u64)(t0 / segment) * run_width;
            for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
                for (u32 c = 1; c <= top; ++c)
                    w.segment_runs[(u64)(c - 1) * vocab + v] = start[(u64)(c - 1) * vocab + v];
                for (u32 u = t0; u < t; ++u) {
                    const T p = g_b[(u64)u * vocab + v];
                    const T* before = w.segment_runs + (u64)(u - t0) * run_width;
                    T* after = w.segment_runs + (u64)(u - t0 + 1) * run_width;
                    T lower = T(0);
                    for (u32 c = 1; c <= top; ++c) {
                        const T entering = w.gap[(u64)u * counts + c - 1] + w.sums[(u64)u * counts + c - 1];
                        const T own = before[(u64)(c - 1) * vocab + v];
                        after[(u64)(c - 1) * vocab + v] = p * (own + entering - lower);
                        lower = own;
                    }
                }
            }
        }
        const T* runs_t = w.segment_runs + (u64)(t - t0) * run_width;
        const T* gap_t = w.gap + (u64)t * counts;
        const T* sums_t = w.sums + (u64)t * counts;
        T entering[NGRAM_MAX_COUNTS + 1];
        T count_adjoint[NGRAM_MAX_COUNTS + 1];
        T acc[NGRAM_MAX_COUNTS + 1];  // Σ q g of the dense part, then Σ_v x̄_c
        acc[0] = T(0);
        for (u32 c = 0; c < counts; ++c) count_adjoint[c] = ngram_count_adjoint[c];
        for (u32 c = 1; c <= top; ++c) {
            entering[c] = gap_t[c - 1] + sums_t[c - 1];
            acc[c] = T(0);
        }
        // Dense: g = λ_L (1 - q_{t-1} - q_{t+1}) + Σ_c a_c (In_c + entering_c - In_{c-1}) with
        // a_c = adjoint_c + count_adjoint[c]; x̄_c = a_c q; the new adjoint_c = x̄_c - x̄_{c+1}.
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
            const T p = g[v], after = w.next[v], before = prev ? prev[v] : T(0);
            T gv = length_adjoint * (T(1) - before - after);
            T lower = T(0), xbar_below = T(0);
            for (u32 c = 1; c <= top; ++c) {
                const u64 at = (u64)(c - 1) * vocab + v;
                const T own = runs_t[at];
                const T a_c = w.run_adjoint[at] + count_adjoint[c];
                gv += a_c * (own + entering[c] - lower);
                const T xbar = a_c * p;
                if (c >= 2) w.run_adjoint[at - vocab] = xbar_below - xbar;
                acc[c] += xbar;
                xbar_below = xbar;
                lower = own;
            }
            if (top >= 1) w.run_adjoint[(u64)(top - 1) * vocab + v] = xbar_below;
            w.next[v] = p;  // q_t: for the rest of this frame, then frame t - 1's q_{t+1}
            g[v] = gv;
            acc[0] += p * gv;
        }
        ngram_block_sums(acc, top + 1);
        // The blank's gradient from the counts, then the nodes.
        T blank_gradient = T(0);
        for (u32 c = 0; c < counts; ++c) blank_gradient += count_adjoint[c] * (gap_t[c] + sums_t[c]);
        const T* in_t = w.node_in + (u64)t * nodes;
        const T* ngap_t = w.node_gap + (u64)t * nodes;
        T* ready_now = w.ready + (u64)(t & 1u) * nodes;
        const T* ready_after = w.ready + (u64)((t + 1) & 1u) * nodes;
        T node_blank = T(0);
        for (u32 k = k0 + threadIdx.x; k < k1; k += BLOCK) {
            const u32 token = trie.token[k];
            const T p = w.next[token];
            const T ready = ngram_ready(trie.link[k], token, in_t, ngap_t, prev);
            const T input = w.node_input[k], gap_adjoint = w.node_gap_adj[k], end = w.node_end[k];
            w.value[k] = input * (in_t[k] + ready) + end * ready;
            node_blank += gap_adjoint * (in_t[k] + ngap_t[k]);
            ready_now[k] = p * (input + end);
            w.node_input[k] = input * p + gap_adjoint * bt;
            w.node_gap_adj[k] = gap_adjoint * bt;
        }
        blank_gradient += block_sum(node_blank);
        // Each parent gathers its children's readiness (in child order); each token gathers
        // its nodes' sparse gradients (the depth-1 node's from the frame after first, as it
        // reads 1 - q_t there).
        for (u32 k = k0 + threadIdx.x; k < k1; k += BLOCK) {
            T input = w.node_input[k], gap_adjoint = w.node_gap_adj[k];
            for (u32 j = trie.child_start[k]; j < trie.child_start[k + 1]; ++j) {
                const u32 child = trie.children[j];
                const T r = ready_now[child];
                if (!(trie.link[child] & NGRAM_REPEATS)) input += r;
                gap_adjoint += r;
            }
            w.node_input[k] = input;
            w.node_gap_adj[k] = gap_adjoint;
        }
        T sparse_dot = T(0);
        for (u32 i = trie.group_start[b] + threadIdx.x; i < trie.group_start[b + 1]; i += BLOCK) {
            const u32 token = trie.group_token[i], root = trie.group_root[i];
            const T p = w.next[token];
            T x = g[token];
            if (root != NGRAM_NONE) {
                const T pending = -ready_after[root];
                x += pending;
                sparse_dot += p * pending;
            }
            for (u32 j = trie.group_node_start[i]; j < trie.group_node_start[i + 1]; ++j) {
                const T value = w.value[trie.group_nodes[j]];
                x += value;
                sparse_dot += p * value;
            }
            g[token] = x;
        }
        sparse_dot = block_sum(sparse_dot);
        // Through the softmax: dz = q ⊙ (dq - Σ_u q_u dq_u), the blank's entry from its parts.
        const T dot = acc[0] + sparse_dot + bt * blank_gradient;
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
            g[v] = v == blank ? bt * (blank_gradient - dot) : w.next[v] * (g[v] - dot);
        // Before the frame: Gap_c and S_c get b·(their own) + Σ_v x̄_{c+1}.
        if (threadIdx.x == 0)
            for (u32 c = 0; c < counts; ++c)
                ngram_count_adjoint[c] = count_adjoint[c] * bt + (c + 1 <= top ? acc[c + 1] : T(0));
        __syncthreads();  // frame t done before frame t - 1 reads q_t, the adjoints and the rows
    }
}

// ---- entry points: <kernel>_<dtype> -----------------------------------------------------------

#define NGRAM_INSTANTIATE(SUFFIX, T)                                                             \
    extern "C" __global__ void __launch_bounds__(BLOCK) ctc_ngram_fwd_##SUFFIX(                  \
        const T* logits, const u32* frames, const u32* trie, T* out, T* work, u32 batch,         \
        u32 frames_max, u32 vocab, u32 max_order, u32 width, u32 blank, u32 nodes, u32 groups) { \
        ctc_ngram_fwd<T>(logits, frames, trie, out, work, batch, frames_max, vocab, max_order,   \
                         width, blank, nodes, groups);                                           \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) ctc_ngram_bwd_##SUFFIX(                  \
        const T* logits, const u32* frames, const u32* trie, const T* grad_out, T* grad,         \
        T* work, u32 batch, u32 frames_max, u32 vocab, u32 max_order, u32 width, u32 blank,      \
        u32 nodes, u32 groups, u32 segment) {                                                    \
        ctc_ngram_bwd<T>(logits, frames, trie, grad_out, grad, work, batch, frames_max, vocab,   \
                         max_order, width, blank, nodes, groups, segment);                       \
    }

NGRAM_INSTANTIATE(f32, float)
NGRAM_INSTANTIATE(f64, double)
