// CUDA kernels of candle-bleu's row op (src/loss/kernels/row/op.rs: the row pass, the self-match
// pass, the softmax), compiled at run time with NVRTC for the device's own architecture by
// src/loss/kernels/row/cuda.rs. Self-contained: no #include, so NVRTC needs no CUDA headers. The loss
// hands the kernels logits in their compute dtype, f32 or f64 (f16/bf16 are converted first), so
// the conversions below serve f32 and f64 only.
//
// Layout: one thread block per row of the logits (`rows = B * S` rows of `vocab` entries,
// contiguous), BLOCK threads striding over the row, reductions by warp shuffles and one shared
// array per warp. `T` is float or double. Ids are u32 `[B, width]`: row `r` uses the ids of batch
// `r / rows_per_batch`; `links[b, k]` (computed once on the host, where the references are
// cached) holds in its low 31 bits the next position j > k with the same id (or NONE) and in
// bit 31 whether k is the id's first position, so that repeated ids write their gradient once,
// with no atomics, in O(width) per row. A row with a NaN or infinite logit gives NaN outputs
// (the CPU op returns an error instead; an error here would need a device-to-host copy).
//
// UNVERIFIED ON A GPU: see docs/gpu.md for the runs that remain.

#define BLOCK 256
#define WARP 32
#define WARPS (BLOCK / WARP)
#define FULL_MASK 0xffffffffu

typedef unsigned int u32;
typedef unsigned long long u64;

#define NONE 0x7fffffffu
#define FIRST 0x80000000u

// ---- accumulator helpers --------------------------------------------------------------------

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() {
    return __longlong_as_double(0xfff0000000000000ll);
}
template <typename A> __device__ __forceinline__ A quiet_nan();
template <> __device__ __forceinline__ float quiet_nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double quiet_nan<double>() {
    return __longlong_as_double(0x7ff8000000000000ll);
}
// x - x is 0 for finite x, NaN for NaN and ±inf (no fast-math: this is not folded away).
template <typename A> __device__ __forceinline__ int is_finite(A x) { return (x - x) == A(0); }

// Merges the online-softmax state (m, s) of two parts of a row: s is Σ exp(x - m) over the part.
// An empty part has s = 0 (and m = -inf), and contributes nothing.
template <typename A> __device__ __forceinline__ void merge(A& m, A& s, A m2, A s2) {
    const A mx = m > m2 ? m : m2;
    const A a = s == A(0) ? A(0) : s * acc_exp(m - mx);
    const A b = s2 == A(0) ? A(0) : s2 * acc_exp(m2 - mx);
    m = mx;
    s = a + b;
}

// One more element x into a thread's online-softmax state: one exp per element.
template <typename A> __device__ __forceinline__ void push(A& m, A& s, A x) {
    if (x > m) {
        s = s * acc_exp(m - x) + A(1);  // m = -inf at the start: s = 0 * 0 + 1
        m = x;
    } else {
        s += acc_exp(x - m);
    }
}

// Block-wide merge of every thread's (m, s); every thread gets the row's result.
template <typename A> __device__ void block_max_sum(A& m, A& s) {
    __shared__ A shared_m[WARPS];
    __shared__ A shared_s[WARPS];
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        const A m2 = __shfl_xor_sync(FULL_MASK, m, offset);
        const A s2 = __shfl_xor_sync(FULL_MASK, s, offset);
        merge(m, s, m2, s2);
    }
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();
    if (warp == 0) {
        m = lane < WARPS ? shared_m[lane] : neg_inf<A>();
        s = lane < WARPS ? shared_s[lane] : A(0);
        for (int offset = WARP / 2; offset > 0; offset >>= 1) {
            const A m2 = __shfl_xor_sync(FULL_MASK, m, offset);
            const A s2 = __shfl_xor_sync(FULL_MASK, s, offset);
            merge(m, s, m2, s2);
        }
        if (lane == 0) {
            shared_m[0] = m;
            shared_s[0] = s;
        }
    }
    __syncthreads();
    m = shared_m[0];
    s = shared_s[0];
    __syncthreads();  // the shared arrays may be reused by a later reduction
}

// Block-wide sum; every thread gets the total.
template <typename A> __device__ A block_sum(A v) {
    __shared__ A shared[WARPS];
    for (int offset = WARP / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < WARPS ? shared[lane] : A(0);
        for (int offset = WARP / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

// The row's max and Σ exp(x - max) in one read (online softmax), and whether all x are finite.
template <typename T, typename A>
__device__ void row_max_sum(const T* __restrict__ row, u32 vocab, A& m, A& s, int& finite) {
    m = neg_inf<A>();
    s = A(0);
    int all_finite = 1;
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
        const A x = to_acc(row[v]);
        all_finite &= is_finite(x);
        push(m, s, x);
    }
    finite = __syncthreads_and(all_finite);
    block_max_sum(m, s);
}

// If k is the first position of its id, the sum of w[j] over every position j of that id
// (following the links); otherwise false.
template <typename T>
__device__ __forceinline__ bool first_occurrence_sum(const u32* __restrict__ links,
                                                     const T* __restrict__ w, u32 k, T& total) {
    if (!(links[k] & FIRST)) return false;
    total = T(0);
    for (u32 j = k; j != NONE; j = links[j] & NONE) total += w[j];
    return true;
}

// The same with w[j] = a[j] * b[j].
template <typename T>
__device__ __forceinline__ bool first_occurrence_dot(const u32* __restrict__ links,
                                                     const T* __restrict__ a,
                                                     const T* __restrict__ b, u32 k, T& total) {
    if (!(links[k] & FIRST)) return false;
    total = T(0);
    for (u32 j = k; j != NONE; j = links[j] & NONE) total += a[j] * b[j];
    return true;
}

// The target of row r, or -1 without targets or at padding.
__device__ __forceinline__ long long row_target(const u32* targets, u64 r, u32 has_targets,
                                                u32 has_pad, u32 pad_id) {
    if (!has_targets) return -1;
    const u32 t = targets[r];
    return (has_pad && t == pad_id) ? -1 : (long long)t;
}

// ---- the row pass ---------------------------------------------------------------------------
// o = out + r * stride + offset: o[k] = softmax(logits[r])[ids[b, k]] for k < width, then the
// cross-entropy columns [ce | max | sum | weight] (the CPU kernel's layout).
template <typename T>
__device__ void row_pass_fwd(const T* __restrict__ logits, const u32* __restrict__ ids,
                             const u32* __restrict__ targets, T* __restrict__ out,
                             u32 rows_per_batch, u32 vocab, u32 width, u32 stride, u32 offset,
                             u32 has_targets, u32 has_pad, u32 pad_id, T eps, T inv_count) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    T m, s;
    int finite;
    row_max_sum(row, vocab, m, s, finite);
    T logit_sum = T(0);
    if (eps != T(0)) {
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK) logit_sum += row[v];
        logit_sum = block_sum(logit_sum);
    }
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    T* o = out + r * stride + offset;
    const T inv_sum = T(1) / s;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        const u32 id = row_ids[k];
        o[k] = (finite && id < vocab) ? acc_exp(row[id] - m) * inv_sum : quiet_nan<T>();
    }
    if (threadIdx.x == 0) {
        const long long t = row_target(targets, r, has_targets, has_pad, pad_id);
        const T weight = t >= 0 ? inv_count : T(0);
        T ce = T(0);
        if (t >= 0) {
            const T lse = m + log(s);
            ce = weight * (lse - (T(1) - eps) * row[t] - eps * logit_sum / T(vocab));
        }
        o[width] = finite ? ce : quiet_nan<T>();
        o[width + 1] = finite ? m : quiet_nan<T>();
        o[width + 2] = finite ? s : quiet_nan<T>();
        o[width + 3] = weight;
    }
}

// dlogits[v] = p_v (h w - Σ_k g_k x_k) - h w ε / V - h w (1 - ε) [v = t] + Σ_k g_k x_k [v = id_k],
// with p rebuilt from the forward's max and exp-sum: one read of the logits, one write.
template <typename T>
__device__ void row_pass_bwd(const T* __restrict__ logits, const u32* __restrict__ ids,
                             const u32* __restrict__ links, const u32* __restrict__ targets,
                             const T* __restrict__ out, const T* __restrict__ grad_out,
                             T* __restrict__ grad, u32 rows_per_batch, u32 vocab, u32 width,
                             u32 stride, u32 has_targets, u32 has_pad, u32 pad_id, T eps) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    T* g = grad + r * vocab;
    const T* st = out + r * stride;
    const T* go = grad_out + r * stride;
    const T m = st[width + 1], s = st[width + 2];
    const T ce_grad = go[width] * st[width + 3];
    T weighted = T(0);
    for (u32 k = threadIdx.x; k < width; k += BLOCK) weighted += go[k] * st[k];
    weighted = block_sum(weighted);
    const T scale = (ce_grad - weighted) / s;
    const T offset = -ce_grad * (eps / T(vocab));
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) g[v] = scale * acc_exp(row[v] - m) + offset;
    __syncthreads();  // the dense writes are visible to the block before the sparse ones
    const u64 b = r / rows_per_batch;
    const u32* row_ids = ids + b * width;
    const u32* row_links = links + b * width;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        T sparse;
        if (first_occurrence_dot(row_links, go, st, k, sparse)) g[row_ids[k]] += sparse;
    }
    __syncthreads();
    const long long t = row_target(targets, r, has_targets, has_pad, pad_id);
    if (threadIdx.x == 0 && t >= 0) g[t] -= ce_grad * (T(1) - eps);
}

// ---- the softmax and the self-match pass ------------------------------------------------------
// Two reads of the row (statistics, then the write), one write.
template <typename T>
__device__ void softmax_fwd(const T* __restrict__ logits, T* __restrict__ probs, u32 vocab) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    T* out = probs + r * vocab;
    T m, s;
    int finite;
    row_max_sum(row, vocab, m, s, finite);
    const T inv_sum = T(1) / s;
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        out[v] = finite ? acc_exp(row[v] - m) * inv_sum : quiet_nan<T>();
}

// sym[b, i, j] = dZ[b, i, j] + dZ[b, j, i], with dZ the first `seq` columns of each row of
// grad_out (rows of `stride`): the dense gradient of P is then sym P (a cuBLAS matmul).
template <typename T>
__device__ void symmetrize(const T* __restrict__ grad_out, T* __restrict__ sym, u32 seq,
                           u32 stride) {
    const u64 r = blockIdx.x;  // the row b * seq + i
    const u64 b = r / seq, i = r % seq;
    const T* base = grad_out + b * seq * stride;
    for (u32 j = threadIdx.x; j < seq; j += BLOCK)
        sym[r * seq + j] = base[i * stride + j] + base[(u64)j * stride + i];
}

// The softmax Jacobian applied to a dense gradient d of P plus sparse ones and a cross-entropy
// one: dlogits = p ⊙ (d + h w - Σ_v p_v d_v - Σ_k x_k g_k) - h w ε / V - h w (1 - ε) [v = t]
// + Σ_k x_k g_k [v = id_k], with x_k, g_k at columns offset.. of the rows of out / grad_out
// (stride) and the cross-entropy columns after them. The softmax backward is the case width = 0
// without targets.
template <typename T>
__device__ void jacobian_bwd(const T* __restrict__ probs, const T* __restrict__ dense,
                             const u32* __restrict__ ids, const u32* __restrict__ links,
                             const u32* __restrict__ targets, const T* __restrict__ out,
                             const T* __restrict__ grad_out, T* __restrict__ grad,
                             u32 rows_per_batch, u32 vocab, u32 width, u32 stride, u32 offset,
                             u32 has_targets, u32 has_pad, u32 pad_id, T eps) {
    const u64 r = blockIdx.x;
    const u64 base = r * vocab;
    const T* x = out + r * stride + offset;
    const T* gx = grad_out + r * stride + offset;
    const long long t = row_target(targets, r, has_targets, has_pad, pad_id);
    const T ce_grad = has_targets ? gx[width] * x[width + 3] : T(0);
    T dot = T(0);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) dot += probs[base + v] * dense[base + v];
    for (u32 k = threadIdx.x; k < width; k += BLOCK) dot += x[k] * gx[k];
    dot = block_sum(dot);
    const T shift = ce_grad - dot;
    const T off = -ce_grad * (eps / T(vocab));
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        grad[base + v] = probs[base + v] * (dense[base + v] + shift) + off;
    __syncthreads();
    const u64 b = r / rows_per_batch;
    const u32* row_ids = ids + b * width;
    const u32* row_links = links + b * width;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        T sparse;
        if (first_occurrence_dot(row_links, x, gx, k, sparse)) grad[base + row_ids[k]] += sparse;
    }
    __syncthreads();
    if (threadIdx.x == 0 && t >= 0) grad[base + t] -= ce_grad * (T(1) - eps);
}

// ---- entry points: <kernel>_<dtype>, one block of BLOCK threads per row ----------------------

#define INSTANTIATE(SUFFIX, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(BLOCK) row_pass_fwd_##SUFFIX(                  \
        const T* logits, const u32* ids, const u32* targets, T* out, u32 rows_per_batch,         \
        u32 vocab, u32 width, u32 stride, u32 offset, u32 has_targets, u32 has_pad, u32 pad_id,  \
        T eps, T inv_count) {                                                                     \
        row_pass_fwd<T>(logits, ids, targets, out, rows_per_batch, vocab, width, stride, offset, \
                        has_targets, has_pad, pad_id, eps, inv_count);                           \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) row_pass_bwd_##SUFFIX(                  \
        const T* logits, const u32* ids, const u32* links, const u32* targets, const T* out,     \
        const T* grad_out, T* grad, u32 rows_per_batch, u32 vocab, u32 width, u32 stride,        \
        u32 has_targets, u32 has_pad, u32 pad_id, T eps) {                                       \
        row_pass_bwd<T>(logits, ids, links, targets, out, grad_out, grad, rows_per_batch, vocab, \
                        width, stride, has_targets, has_pad, pad_id, eps);                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        softmax_fwd_##SUFFIX(const T* logits, T* probs, u32 vocab) {                             \
        softmax_fwd<T>(logits, probs, vocab);                                                    \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        symmetrize_##SUFFIX(const T* grad_out, T* sym, u32 seq, u32 stride) {                    \
        symmetrize<T>(grad_out, sym, seq, stride);                                               \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) jacobian_bwd_##SUFFIX(                  \
        const T* probs, const T* dense, const u32* ids, const u32* links, const u32* targets,    \
        const T* out, const T* grad_out, T* grad, u32 rows_per_batch, u32 vocab, u32 width,      \
        u32 stride, u32 offset, u32 has_targets, u32 has_pad, u32 pad_id, T eps) {               \
        jacobian_bwd<T>(probs, dense, ids, links, targets, out, grad_out, grad, rows_per_batch,  \
                        vocab, width, stride, offset, has_targets, has_pad, pad_id, eps);        \
    }

INSTANTIATE(f32, float)
INSTANTIATE(f64, double)
