#line 2 "matches.cu"
// CUDA kernels of the expected form's clipped matches (docs/loss.md, §8.2; the CPU kernel is
// matches/op.rs, whose loops these follow step for step). Compiled by NVRTC after kernels.cu,
// whose block sum they use, as one module.
//
// One block per batch element b. Inputs: the token matches X [B, S, W], the match weights' source
// U [B, S] (order n's weight at start i is U[i + n - 1] when `shifted`, else U[i]), and the
// reference side packed as `counts` [2, N, B, W] (first occurrences, then clip counts). Forward:
// the block's threads own the columns j (reference starts); each keeps its column of the n-gram
// matches M_n[i, j] in the workspace, updated in place order by order, sums E_j = sum_i M_n u_n
// over i in order, clips, and one block sum per order gives m_n into out [B, N]. Backward: the
// columns' M_n of every order kept, then the orders in reverse: the column owners compute dE_j
// and the gradient of M_n; the row owners (threads over i) sum du_n[i] = sum_j dE_j M_n[i, j];
// the column owners pass the gradient of M_n to X[i+n-1, j+n-1] (a column only its owner
// writes in that phase) and down to M_{n-1}. The gradient [B, S, W + 1] holds dX in its first W
// columns and dU in the last. No sum is atomic: the same bits every launch.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

struct MatchDims {
    u32 batch, seq, width, orders, shifted;
};

__device__ __forceinline__ u32 match_weight_index(const MatchDims& d, u32 order, u32 start) {
    return d.shifted ? start + order - 1 : start;
}

__device__ __forceinline__ bool match_order_valid(const MatchDims& d, u32 order) {
    return order <= d.seq && order <= d.width;
}

// d min(clip, v) / dv as candle's backward gives it: 1/2 at a tie, 0 where clip is smaller or v
// is NaN.
template <typename T> __device__ __forceinline__ T match_clip_slope(T clip, T value) {
    const T node = clip < value ? clip : value;
    if (node != value) return T(0);
    return node == clip ? T(0.5) : T(1);
}

template <typename T>
__device__ void matches_fwd(const T* __restrict__ x, const T* __restrict__ u,
                            const T* __restrict__ counts, T* __restrict__ out,
                            T* __restrict__ work, const MatchDims d) {
    const u64 b = blockIdx.x;
    const u32 s = d.seq, w = d.width;
    const T* xb = x + b * s * w;
    const T* ub = u + b * s;
    T* ngram = work + b * s * w;
    for (u32 j = threadIdx.x; j < w; j += BLOCK)
        for (u32 i = 0; i < s; ++i) ngram[i * w + j] = xb[i * w + j];
    for (u32 order = 1; order <= d.orders; ++order) {
        if (!match_order_valid(d, order)) {
            if (threadIdx.x == 0) out[b * d.orders + order - 1] = T(0);
            continue;
        }
        const u32 rows = s - order + 1, cols = w - order + 1;
        const T* first = counts + ((u64)(order - 1) * d.batch + b) * w;
        const T* clip = counts + ((u64)(d.orders + order - 1) * d.batch + b) * w;
        T local = T(0);
        for (u32 j = threadIdx.x; j < cols; j += BLOCK) {
            if (order > 1)
                for (u32 i = 0; i < rows; ++i)
                    ngram[i * w + j] *= xb[(i + order - 1) * w + j + order - 1];
            T expected = T(0);
            for (u32 i = 0; i < rows; ++i)
                expected += ngram[i * w + j] * ub[match_weight_index(d, order, i)];
            const T value = first[j] * expected;
            local += clip[j] < value ? clip[j] : value;
        }
        const T sum = block_sum(local);
        if (threadIdx.x == 0) out[b * d.orders + order - 1] = sum;
    }
}

template <typename T>
__device__ void matches_bwd(const T* __restrict__ x, const T* __restrict__ u,
                            const T* __restrict__ counts, const T* __restrict__ grad_out,
                            T* __restrict__ grad, T* __restrict__ work, const MatchDims d) {
    const u64 b = blockIdx.x;
    const u32 s = d.seq, w = d.width, plane = s * w;
    const T* xb = x + b * plane;
    const T* ub = u + b * s;
    T* gb = grad + b * s * (w + 1);
    T* ngrams = work + b * ((u64)d.orders * plane + plane + w);
    T* pending = ngrams + (u64)d.orders * plane;
    T* expected_grad = pending + plane;
    u32 last = 0;
    for (u32 order = 1; order <= d.orders && match_order_valid(d, order); ++order) last = order;
    // The forward again, each column's M_n of every order; the gradient and pending zeroed.
    for (u32 j = threadIdx.x; j < w; j += BLOCK) {
        for (u32 i = 0; i < s; ++i) {
            ngrams[i * w + j] = xb[i * w + j];
            pending[i * w + j] = T(0);
            gb[i * (w + 1) + j] = T(0);
        }
        for (u32 order = 2; order <= last; ++order) {
            const u32 rows = s - order + 1;
            if (j >= w - order + 1) break;
            const T* previous = ngrams + (u64)(order - 2) * plane;
            T* current = ngrams + (u64)(order - 1) * plane;
            for (u32 i = 0; i < rows; ++i)
                current[i * w + j] = previous[i * w + j] * xb[(i + order - 1) * w + j + order - 1];
        }
    }
    for (u32 i = threadIdx.x; i < s; i += BLOCK) gb[i * (w + 1) + w] = T(0);
    __syncthreads();  // every column's n-gram matches and the zeroed gradient before the sweep
    for (u32 order = last; order >= 1; --order) {
        const u32 rows = s - order + 1, cols = w - order + 1;
        const T* ngram = ngrams + (u64)(order - 1) * plane;
        const T* first = counts + ((u64)(order - 1) * d.batch + b) * w;
        const T* clip = counts + ((u64)(d.orders + order - 1) * d.batch + b) * w;
        const T upstream = grad_out[b * d.orders + order - 1];
        for (u32 j = threadIdx.x; j < cols; j += BLOCK) {
            T expected = T(0);
            for (u32 i = 0; i < rows; ++i)
                expected += ngram[i * w + j] * ub[match_weight_index(d, order, i)];
            const T nu = first[j];
            const T de = upstream * match_clip_slope(clip[j], nu * expected) * nu;
            expected_grad[j] = de;
            for (u32 i = 0; i < rows; ++i)
                pending[i * w + j] += de * ub[match_weight_index(d, order, i)];
        }
        __syncthreads();  // every dE_j before the rows sum them
        for (u32 i = threadIdx.x; i < rows; i += BLOCK) {
            T sum = T(0);
            for (u32 j = 0; j < cols; ++j) sum += expected_grad[j] * ngram[i * w + j];
            gb[match_weight_index(d, order, i) * (w + 1) + w] += sum;
        }
        for (u32 j = threadIdx.x; j < cols; j += BLOCK) {
            if (order == 1) {
                for (u32 i = 0; i < rows; ++i) gb[i * (w + 1) + j] += pending[i * w + j];
            } else {
                const T* previous = ngrams + (u64)(order - 2) * plane;
                for (u32 i = 0; i < rows; ++i) {
                    const u32 at_row = i + order - 1, at_col = j + order - 1;
                    const T g = pending[i * w + j];
                    gb[at_row * (w + 1) + at_col] += g * previous[i * w + j];
                    pending[i * w + j] = g * xb[at_row * w + at_col];
                }
            }
        }
        __syncthreads();  // order n done before order n - 1 overwrites dE and reads pending
    }
}

#define MATCHES_INSTANTIATE(SUFFIX, T)                                                           \
    extern "C" __global__ void __launch_bounds__(BLOCK) matches_fwd_##SUFFIX(                   \
        const T* x, const T* u, const T* counts, T* out, T* work, u32 batch, u32 seq,           \
        u32 width, u32 orders, u32 shifted) {                                                    \
        const MatchDims d = {batch, seq, width, orders, shifted};                                \
        matches_fwd<T>(x, u, counts, out, work, d);                                              \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) matches_bwd_##SUFFIX(                   \
        const T* x, const T* u, const T* counts, const T* grad_out, T* grad, T* work,           \
        u32 batch, u32 seq, u32 width, u32 orders, u32 shifted) {                                \
        const MatchDims d = {batch, seq, width, orders, shifted};                                \
        matches_bwd<T>(x, u, counts, grad_out, grad, work, d);                                   \
    }

MATCHES_INSTANTIATE(f32, float)
MATCHES_INSTANTIATE(f64, double)
