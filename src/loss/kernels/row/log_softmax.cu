#line 2 "log_softmax.cu"
// CUDA kernels of the crate's public log_softmax (row/log_softmax.rs, whose CPU op they follow
// step for step), compiled by NVRTC after kernels.cu (whose block reductions they use) and
// ce_options.cu, as the options module. One block per row of the last dimension, f32 or f64.
//
// Forward: the row's maximum M, then s = Σ exp(x - M), lse = M + log s (in double, then rounded,
// as the CPU op), y = x - lse. No value is refused: a -inf entry gives -inf (exp(-inf) = 0 in the
// sum), and a row holding NaN or +inf, or only -inf, gives NaN everywhere (through s), as on the
// CPU. Backward, in place on the output's gradient: g <- g - exp(y) Σ g.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

// Block-wide maximum, NaN if any thread's value is NaN; every thread gets it.
template <typename A> __device__ A log_softmax_block_max(A v) {
    __shared__ A log_softmax_partials[WARPS];
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        const A other = __shfl_xor_sync(FULL_MASK, v, offset);
        v = (other > v || other != other) ? other : v;
    }
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) log_softmax_partials[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < WARPS ? log_softmax_partials[lane] : neg_inf<A>();
        for (int offset = WARP / 2; offset > 0; offset >>= 1) {
            const A other = __shfl_xor_sync(FULL_MASK, v, offset);
            v = (other > v || other != other) ? other : v;
        }
        if (lane == 0) log_softmax_partials[0] = v;
    }
    __syncthreads();
    v = log_softmax_partials[0];
    __syncthreads();  // the shared array may be reused by a later reduction
    return v;
}

// One block per row r: y[r] = x[r] - lse(x[r]).
template <typename T>
__device__ void log_softmax_fwd(const T* __restrict__ x, T* __restrict__ y, u32 classes) {
    const u64 r = blockIdx.x;
    const T* row = x + r * classes;
    T* out = y + r * classes;
    T m = neg_inf<T>();
    for (u32 v = threadIdx.x; v < classes; v += BLOCK) {
        const T xv = row[v];
        m = (xv > m || xv != xv) ? xv : m;
    }
    m = log_softmax_block_max(m);
    T s = T(0);
    for (u32 v = threadIdx.x; v < classes; v += BLOCK) s += acc_exp(row[v] - m);
    s = block_sum(s);
    const T lse = T((double)m + log((double)s));
    for (u32 v = threadIdx.x; v < classes; v += BLOCK) out[v] = row[v] - lse;
}

// One block per row r, in place: g[r] <- g[r] - exp(y[r]) Σ g[r].
template <typename T>
__device__ void log_softmax_bwd(T* __restrict__ g, const T* __restrict__ y, u32 classes) {
    const u64 r = blockIdx.x;
    T* grad = g + r * classes;
    const T* out = y + r * classes;
    T total = T(0);
    for (u32 v = threadIdx.x; v < classes; v += BLOCK) total += grad[v];
    total = block_sum(total);
    for (u32 v = threadIdx.x; v < classes; v += BLOCK) grad[v] -= acc_exp(out[v]) * total;
}

// ---- entry points: <kernel>_<dtype> -----------------------------------------------------------

#define LOG_SOFTMAX_INSTANTIATE(SUFFIX, T)                                                       \
    extern "C" __global__ void __launch_bounds__(BLOCK) log_softmax_fwd_##SUFFIX(                \
        const T* x, T* y, u32 classes) {                                                         \
        log_softmax_fwd<T>(x, y, classes);                                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) log_softmax_bwd_##SUFFIX(                \
        T* g, const T* y, u32 classes) {                                                         \
        log_softmax_bwd<T>(g, y, classes);                                                       \
    }

LOG_SOFTMAX_INSTANTIATE(f32, float)
LOG_SOFTMAX_INSTANTIATE(f64, double)
