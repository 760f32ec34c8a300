// CUDA kernels of candle-bleu's fused softmax ops (src/loss/fused.rs), compiled at run time with
// NVRTC by src/loss/fused/cuda.rs. Self-contained: no #include, so NVRTC needs no CUDA headers
// (f16/bf16 conversions are written out below).
//
// Layout: one thread block per row of the logits (`rows = B * S` rows of `vocab` entries,
// contiguous), BLOCK threads striding over the row, reductions by warp shuffles and one shared
// array per warp. `T` is the storage type (float, double, f16_bits, bf16_bits); `A` the
// accumulator (double for double, float otherwise). Ids are u32 `[B, width]`: row `r` uses the
// ids of batch `r / rows_per_batch`. A row with a NaN or infinite logit gives NaN outputs (the CPU
// op returns an error instead; an error here would need a device-to-host copy).
//
// UNVERIFIED ON A GPU: see docs/gpu.md for the runs that remain.

#define BLOCK 256
#define WARP 32
#define WARPS (BLOCK / WARP)
#define FULL_MASK 0xffffffffu

typedef unsigned int u32;
typedef unsigned long long u64;

struct f16_bits {
    unsigned short bits;
};
struct bf16_bits {
    unsigned short bits;
};

// ---- storage <-> accumulator conversions ----------------------------------------------------

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(f16_bits x) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
    return f;
}
__device__ __forceinline__ float to_acc(bf16_bits x) {
    return __uint_as_float(((u32)x.bits) << 16);
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(f16_bits* p, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p->bits = h;
}
// Round to nearest even (cvt.rn.bf16.f32 needs sm_80; this runs on every architecture).
__device__ __forceinline__ void store(bf16_bits* p, float v) {
    u32 u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        p->bits = (unsigned short)((u >> 16) | 0x0040u);  // quiet NaN, sign kept
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        p->bits = (unsigned short)(u >> 16);
    }
}

// ---- accumulator helpers --------------------------------------------------------------------

__device__ __forceinline__ float acc_exp(float x) { return expf(x); }
__device__ __forceinline__ double acc_exp(double x) { return exp(x); }

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

// In row k of the gather width, whether ids[k] is the first occurrence of its id; if so the
// sum of w[j] over every j >= k with ids[j] == ids[k]. Repeated ids thus write their gradient
// once, with no atomics and in a fixed order. O(width²) per row, width being a reference length.
template <typename T, typename A>
__device__ __forceinline__ bool first_occurrence_sum(const u32* __restrict__ ids,
                                                     const T* __restrict__ w, u32 width, u32 k,
                                                     A& total) {
    const u32 id = ids[k];
    for (u32 j = 0; j < k; ++j)
        if (ids[j] == id) return false;
    total = A(0);
    for (u32 j = k; j < width; ++j)
        if (ids[j] == id) total += to_acc(w[j]);
    return true;
}

// ---- softmax gathered at ids --------------------------------------------------------------
// out[r, k] = softmax(logits[r])[ids[b, k]] for k < width, then out[r, width] = max and
// out[r, width + 1] = Σ exp(logit - max): the CPU op's layout, in the accumulator type.
template <typename T, typename A>
__device__ void softmax_gather_fwd(const T* __restrict__ logits, const u32* __restrict__ ids,
                                   A* __restrict__ out, u32 rows_per_batch, u32 vocab, u32 width) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    A m, s;
    int finite;
    row_max_sum(row, vocab, m, s, finite);
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    A* o = out + r * (width + 2);
    const A inv_sum = A(1) / s;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        const u32 id = row_ids[k];
        o[k] = (finite && id < vocab) ? acc_exp(to_acc(row[id]) - m) * inv_sum : quiet_nan<A>();
    }
    if (threadIdx.x == 0) {
        o[width] = finite ? m : quiet_nan<A>();
        o[width + 1] = finite ? s : quiet_nan<A>();
    }
}

// dlogits[r, v] = Σ_k w_k [v = ids_k] - p_v Σ_k w_k, with w_k = g_k x_k (the gathered
// probabilities times their incoming gradient) and p = softmax(logits[r]) rebuilt from the
// forward's max and exp-sum: one read of the logits, one write of the gradient.
// packed[r] = (w_0 … w_{width-1}, max, sum) in the accumulator type.
template <typename T, typename A>
__device__ void softmax_gather_bwd(const T* __restrict__ logits, const u32* __restrict__ ids,
                                   const A* __restrict__ packed, T* __restrict__ grad,
                                   u32 rows_per_batch, u32 vocab, u32 width) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    T* grad_row = grad + r * vocab;
    const A* w = packed + r * (width + 2);
    const A m = w[width], s = w[width + 1];
    A weighted = A(0);
    for (u32 k = threadIdx.x; k < width; k += BLOCK) weighted += w[k];
    weighted = block_sum(weighted);
    const A scale = -weighted / s;
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        store(grad_row + v, scale * acc_exp(to_acc(row[v]) - m));
    __syncthreads();  // the dense writes above are visible to the block before the sparse ones
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        A sparse;
        const u32 id = row_ids[k];
        if (id < vocab && first_occurrence_sum(row_ids, w, width, k, sparse))
            store(grad_row + id, scale * acc_exp(to_acc(row[id]) - m) + sparse);
    }
}

// ---- softmax over the last dimension --------------------------------------------------------
// Two reads of the row (statistics, then the write), one write.
template <typename T, typename A>
__device__ void softmax_fwd(const T* __restrict__ logits, T* __restrict__ probs, u32 vocab) {
    const u64 r = blockIdx.x;
    const T* row = logits + r * vocab;
    T* out = probs + r * vocab;
    A m, s;
    int finite;
    row_max_sum(row, vocab, m, s, finite);
    const A inv_sum = A(1) / s;
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        store(out + v, finite ? acc_exp(to_acc(row[v]) - m) * inv_sum : quiet_nan<A>());
}

// dlogits = p ⊙ (dp - Σ_v p_v dp_v), row by row.
template <typename T, typename A>
__device__ void softmax_bwd(const T* __restrict__ probs, const T* __restrict__ grad_probs,
                            T* __restrict__ grad, u32 vocab) {
    const u64 base = (u64)blockIdx.x * vocab;
    A dot = A(0);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        dot += to_acc(probs[base + v]) * to_acc(grad_probs[base + v]);
    dot = block_sum(dot);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        store(grad + base + v, to_acc(probs[base + v]) * (to_acc(grad_probs[base + v]) - dot));
}

// out[r * out_stride + out_offset + k] = probs[r, ids[b, k]]: the gather half of the paired
// form's [Z | X] output (candle's matmul and copy2d fill Z).
template <typename T, typename A>
__device__ void gather_rows(const T* __restrict__ probs, const u32* __restrict__ ids,
                            T* __restrict__ out, u32 rows_per_batch, u32 vocab, u32 width,
                            u32 out_stride, u32 out_offset) {
    const u64 r = blockIdx.x;
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    T* o = out + r * out_stride + out_offset;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        const u32 id = row_ids[k];
        if (id < vocab)
            o[k] = probs[r * vocab + id];
        else
            store(o + k, quiet_nan<A>());
    }
}

// The paired form's backward: dlogits = p ⊙ (g - Σ_v p_v g_v) with g = dense + scatter(sparse at
// ids), where dense = (dZ + dZᵀ) P and w_k = p[ids_k] · dX_k (so p_v · sparse_v = Σ w at v).
template <typename T, typename A>
__device__ void self_match_bwd(const T* __restrict__ probs, const T* __restrict__ dense,
                               const u32* __restrict__ ids, const T* __restrict__ weighted,
                               T* __restrict__ grad, u32 rows_per_batch, u32 vocab, u32 width) {
    const u64 r = blockIdx.x;
    const u64 base = r * vocab;
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    const T* w = weighted + r * width;
    A dot = A(0);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        dot += to_acc(probs[base + v]) * to_acc(dense[base + v]);
    for (u32 k = threadIdx.x; k < width; k += BLOCK) dot += to_acc(w[k]);
    dot = block_sum(dot);
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        store(grad + base + v, to_acc(probs[base + v]) * (to_acc(dense[base + v]) - dot));
    __syncthreads();
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        A sparse;
        const u32 id = row_ids[k];
        if (id < vocab && first_occurrence_sum(row_ids, w, width, k, sparse))
            store(grad + base + id,
                  to_acc(probs[base + id]) * (to_acc(dense[base + id]) - dot) + sparse);
    }
}

// ---- entry points: <kernel>_<dtype>, one block of BLOCK threads per row ----------------------

#define INSTANTIATE(SUFFIX, T, A)                                                                 \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        softmax_gather_fwd_##SUFFIX(const T* logits, const u32* ids, A* out, u32 rows_per_batch, \
                                    u32 vocab, u32 width) {                                      \
        softmax_gather_fwd<T, A>(logits, ids, out, rows_per_batch, vocab, width);                \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        softmax_gather_bwd_##SUFFIX(const T* logits, const u32* ids, const A* packed, T* grad,   \
                                    u32 rows_per_batch, u32 vocab, u32 width) {                  \
        softmax_gather_bwd<T, A>(logits, ids, packed, grad, rows_per_batch, vocab, width);       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        softmax_fwd_##SUFFIX(const T* logits, T* probs, u32 vocab) {                             \
        softmax_fwd<T, A>(logits, probs, vocab);                                                 \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        softmax_bwd_##SUFFIX(const T* probs, const T* grad_probs, T* grad, u32 vocab) {          \
        softmax_bwd<T, A>(probs, grad_probs, grad, vocab);                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        gather_rows_##SUFFIX(const T* probs, const u32* ids, T* out, u32 rows_per_batch,         \
                             u32 vocab, u32 width, u32 out_stride, u32 out_offset) {             \
        gather_rows<T, A>(probs, ids, out, rows_per_batch, vocab, width, out_stride, out_offset);\
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        self_match_bwd_##SUFFIX(const T* probs, const T* dense, const u32* ids,                  \
                                const T* weighted, T* grad, u32 rows_per_batch, u32 vocab,       \
                                u32 width) {                                                     \
        self_match_bwd<T, A>(probs, dense, ids, weighted, grad, rows_per_batch, vocab, width);   \
    }

INSTANTIATE(f32, float, float)
INSTANTIATE(f64, double, double)
INSTANTIATE(f16, f16_bits, float)
INSTANTIATE(bf16, bf16_bits, float)
