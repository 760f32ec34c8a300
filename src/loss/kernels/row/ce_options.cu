#line 2 "ce_options.cu"
// CUDA kernels of the row op's passes with the cross-entropy's options (src/loss/kernels/cpu.rs's
// `TargetRows`, whose formulas these follow term by term): per-class weights, the z-loss, the
// metric columns (the z-term and whether the target is the argmax) and, in the row pass, logit
// soft-capping y = c·tanh(z/c) read on the fly (no [B,S,V] pass of its own). Compiled by NVRTC
// after kernels.cu (whose block reductions, online softmax and first-occurrence helpers they
// use), as one module; the plain kernels of kernels.cu stay what ran on the H200.
//
// Layout and launch as kernels.cu: one block of BLOCK threads per row, the output row
// [x_0 … x_{K−1} | ce | max | sum | weight | z | correct] (src/loss/kernels/layout.rs; the metric
// columns only when `metrics`). The options arrive as scalars plus the class weights, V values
// of the launch's float type (a one-element placeholder without them):
//   weights, has_weights, weight_total = Σ_v w_v, z_loss = λ, z_ratio (the z-term's row weight
//   over the cross-entropy's with a weighted mean), metrics, cap and inv_cap = 1/c (0: no cap).
// With the soft cap, max, sum and the gathered probabilities are those of the capped logits, and
// the gradient is the capped logits' times dy/dz = 1 − (y/c)², as the CPU's SoftcapOp followed
// by the row op computes it. A row with a NaN or infinite logit gives NaN outputs (the CPU op
// refuses it), checked on the logits before the cap, which would hide an infinity.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

__device__ __forceinline__ float acc_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double acc_tanh(double x) { return tanh(x); }

// The 16-bit storage types and their conversions (`to_acc`, `from_acc`) are float16.cu's,
// compiled before this file.

// The cross-entropy's options of one launch (see the header).
template <typename T> struct CeOptions {
    const T* weights;
    u32 has_weights;
    T weight_total;
    T z_loss;
    T z_ratio;
    u32 metrics;
    T cap;
    T inv_cap;

    // The logit the passes see: c·tanh(z/c) with the cap (the CPU's `c · tanh(z · (1/c))`).
    __device__ __forceinline__ T capped(T z) const {
        return cap != T(0) ? cap * acc_tanh(z * inv_cap) : z;
    }
    // dy/dz at the capped logit y: 1 − (y/c)²; 1 without the cap.
    __device__ __forceinline__ T cap_grad(T y) const {
        if (cap == T(0)) return T(1);
        const T t = y * inv_cap;
        return T(1) - t * t;
    }
    // Class v's weight in the label smoothing's spread: w_v, 1 without weights.
    __device__ __forceinline__ T class_weight(u32 v) const { return has_weights ? weights[v] : T(1); }
    // The coefficient of p_v in a row's gradient (TargetRows::dense_coefficient) from
    // ce_grad = h·w: h·w·((1 − ε)·w_t + ε·W/V + z_ratio·2λ·lse) with weights (0 at padding),
    // h·w·(1 + 2λ·lse) without.
    __device__ __forceinline__ T dense_coefficient(T ce_grad, long long t, T eps, u32 vocab,
                                                   T lse) const {
        if (has_weights) {
            if (t < 0) return T(0);
            T coefficient = (T(1) - eps) * weights[t] + eps * weight_total / T(vocab);
            if (z_loss != T(0)) coefficient += z_ratio * T(2) * z_loss * lse;
            return ce_grad * coefficient;
        }
        return z_loss != T(0) ? ce_grad * (T(1) + T(2) * z_loss * lse) : ce_grad;
    }
    // The target's sparse coefficient (TargetRows::target_coefficient): h·w, times w_t.
    __device__ __forceinline__ T target_coefficient(T ce_grad, long long t) const {
        return (has_weights && t >= 0) ? ce_grad * weights[t] : ce_grad;
    }
};

// Block-wide minimum of a u32; every thread gets it.
__device__ u32 block_min_u32(u32 v) {
    __shared__ u32 shared_min[WARPS];
    for (int offset = WARP / 2; offset > 0; offset >>= 1) {
        const u32 other = __shfl_xor_sync(FULL_MASK, v, offset);
        v = other < v ? other : v;
    }
    const int warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    if (lane == 0) shared_min[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < WARPS ? shared_min[lane] : 0xffffffffu;
        for (int offset = WARP / 2; offset > 0; offset >>= 1) {
            const u32 other = __shfl_xor_sync(FULL_MASK, v, offset);
            v = other < v ? other : v;
        }
        if (lane == 0) shared_min[0] = v;
    }
    __syncthreads();
    v = shared_min[0];
    __syncthreads();
    return v;
}

// ---- the row pass with options ----------------------------------------------------------------
// kernels.cu's row_pass_fwd over the capped logits, with the weighted terms
// (1 − ε)·w_t·(lse − y_t) + (ε/V)·(W·lse − Σ_v w_v y_v) + z_ratio·λ·lse² (PyTorch's weighted
// cross-entropy plus the z-loss) or, unweighted, lse − (1 − ε)·y_t − ε·mean_v y_v + λ·lse²; and
// the metric columns λ·lse² and [t is the first column holding the row's maximum]. `S` is the
// logits' storage type, `A` the arithmetic's and the output rows' (float for f16/bf16).
template <typename S, typename A>
__device__ void row_options_fwd(const S* __restrict__ logits, const u32* __restrict__ ids,
                                const u32* __restrict__ targets, A* __restrict__ out,
                                u32 rows_per_batch, u32 vocab, u32 width, u32 stride, u32 offset,
                                u32 has_targets, u32 has_pad, u32 pad_id, A eps, A inv_count,
                                const CeOptions<A> opt) {
    const u64 r = blockIdx.x;
    const S* row = logits + r * vocab;
    A m = neg_inf<A>(), s = A(0);
    int all_finite = 1;
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
        const A z = to_acc(row[v]);
        all_finite &= is_finite(z);
        push(m, s, opt.capped(z));
    }
    const int finite = __syncthreads_and(all_finite);
    block_max_sum(m, s);
    // The label smoothing's Σ_v w_v y_v (w_v = 1 without weights).
    A smooth_sum = A(0);
    if (eps != A(0)) {
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
            smooth_sum += opt.class_weight(v) * opt.capped(to_acc(row[v]));
        smooth_sum = block_sum(smooth_sum);
    }
    // The argmax as `argmax` picks it: the first column holding the maximum.
    u32 first_max = vocab;
    if (opt.metrics) {
        for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
            if (opt.capped(to_acc(row[v])) == m && v < first_max) first_max = v;
        first_max = block_min_u32(first_max);
    }
    const u32* row_ids = ids + (r / rows_per_batch) * width;
    A* o = out + r * stride + offset;
    const A inv_sum = A(1) / s;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        const u32 id = row_ids[k];
        o[k] = (finite && id < vocab) ? acc_exp(opt.capped(to_acc(row[id])) - m) * inv_sum
                                      : quiet_nan<A>();
    }
    if (threadIdx.x == 0) {
        const long long t = row_target(targets, r, has_targets, has_pad, pad_id);
        const A weight = t >= 0 ? inv_count : A(0);
        A ce = A(0), z_term = A(0), correct = A(0);
        if (t >= 0) {
            const A lse = m + log(s);
            const A target_logit = opt.capped(to_acc(row[t]));
            A term;
            if (opt.has_weights) {
                term = (A(1) - eps) * opt.weights[t] * (lse - target_logit);
                if (eps != A(0)) term += eps / A(vocab) * (opt.weight_total * lse - smooth_sum);
                if (opt.z_loss != A(0)) term += opt.z_ratio * opt.z_loss * lse * lse;
            } else {
                term = lse - (A(1) - eps) * target_logit - eps * (smooth_sum / A(vocab));
                if (opt.z_loss != A(0)) term += opt.z_loss * lse * lse;
            }
            ce = weight * term;
            z_term = opt.z_loss * lse * lse;
            correct = first_max == (u32)t ? A(1) : A(0);
        }
        o[width] = finite ? ce : quiet_nan<A>();
        o[width + 1] = finite ? m : quiet_nan<A>();
        o[width + 2] = finite ? s : quiet_nan<A>();
        o[width + 3] = weight;
        if (opt.metrics) {
            o[width + 4] = finite ? z_term : quiet_nan<A>();
            o[width + 5] = finite ? correct : quiet_nan<A>();
        }
    }
}

// kernels.cu's row_pass_bwd with the options: with y the capped logits and f_v = dy_v/dz_v,
// dlogits[v] = f_v·(p_v·(d − Σ_k g_k x_k) − h w ε w_v / V − c_t (1 − ε) [v = t]
//                   + Σ_k g_k x_k [v = id_k]),
// d the dense coefficient and c_t the target's (CeOptions); one read of the logits, one write
// (in 16 bits, the gathered columns and the target are rounded twice: dense, then with their
// sparse terms).
template <typename S, typename A>
__device__ void row_options_bwd(const S* __restrict__ logits, const u32* __restrict__ ids,
                                const u32* __restrict__ links, const u32* __restrict__ targets,
                                const A* __restrict__ out, const A* __restrict__ grad_out,
                                S* __restrict__ grad, u32 rows_per_batch, u32 vocab, u32 width,
                                u32 stride, u32 has_targets, u32 has_pad, u32 pad_id, A eps,
                                const CeOptions<A> opt) {
    S* const as_storage = nullptr;  // selects from_acc's overload
    const u64 r = blockIdx.x;
    const S* row = logits + r * vocab;
    S* g = grad + r * vocab;
    const A* st = out + r * stride;
    const A* go = grad_out + r * stride;
    const A m = st[width + 1], s = st[width + 2];
    const A ce_grad = go[width] * st[width + 3];
    A weighted = A(0);
    for (u32 k = threadIdx.x; k < width; k += BLOCK) weighted += go[k] * st[k];
    weighted = block_sum(weighted);
    const long long t = row_target(targets, r, has_targets, has_pad, pad_id);
    const A dense = opt.dense_coefficient(ce_grad, t, eps, vocab, m + log(s));
    const A scale = (dense - weighted) / s;
    const A offset = -ce_grad * (eps / A(vocab));
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK) {
        const A y = opt.capped(to_acc(row[v]));
        g[v] = from_acc((scale * acc_exp(y - m) + offset * opt.class_weight(v)) * opt.cap_grad(y),
                        as_storage);
    }
    __syncthreads();  // the dense writes are visible to the block before the sparse ones
    const u64 b = r / rows_per_batch;
    const u32* row_ids = ids + b * width;
    const u32* row_links = links + b * width;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        A sparse;
        if (first_occurrence_dot(row_links, go, st, k, sparse)) {
            const u32 id = row_ids[k];
            g[id] = from_acc(to_acc(g[id]) + sparse * opt.cap_grad(opt.capped(to_acc(row[id]))),
                             as_storage);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0 && t >= 0)
        g[t] = from_acc(to_acc(g[t]) - opt.target_coefficient(ce_grad, t) * (A(1) - eps) *
                                           opt.cap_grad(opt.capped(to_acc(row[t]))),
                        as_storage);
}

// kernels.cu's jacobian_bwd (the self-match pass's backward) with the options' dense and target
// coefficients and the weighted smoothing offset; the self-match pass takes no soft cap here (its
// logits are capped before the op).
template <typename T>
__device__ void jacobian_options_bwd(const T* __restrict__ probs, const T* __restrict__ dense,
                                     const u32* __restrict__ ids, const u32* __restrict__ links,
                                     const u32* __restrict__ targets, const T* __restrict__ out,
                                     const T* __restrict__ grad_out, T* __restrict__ grad,
                                     u32 rows_per_batch, u32 vocab, u32 width, u32 stride,
                                     u32 offset, u32 has_targets, u32 has_pad, u32 pad_id, T eps,
                                     const CeOptions<T> opt) {
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
    const T lse = x[width + 1] + log(x[width + 2]);
    const T shift = opt.dense_coefficient(ce_grad, t, eps, vocab, lse) - dot;
    const T off = -ce_grad * (eps / T(vocab));
    for (u32 v = threadIdx.x; v < vocab; v += BLOCK)
        grad[base + v] = probs[base + v] * (dense[base + v] + shift) + off * opt.class_weight(v);
    __syncthreads();
    const u64 b = r / rows_per_batch;
    const u32* row_ids = ids + b * width;
    const u32* row_links = links + b * width;
    for (u32 k = threadIdx.x; k < width; k += BLOCK) {
        T sparse;
        if (first_occurrence_dot(row_links, x, gx, k, sparse)) grad[base + row_ids[k]] += sparse;
    }
    __syncthreads();
    if (threadIdx.x == 0 && t >= 0) grad[base + t] -= opt.target_coefficient(ce_grad, t) * (T(1) - eps);
}

// ---- entry points: <kernel>_<dtype>, one block of BLOCK threads per row; the options last ------

#define OPTIONS_PARAMS(T)                                                                        \
    const T *weights, u32 has_weights, T weight_total, T z_loss, T z_ratio, u32 metrics, T cap,  \
        T inv_cap
#define OPTIONS(T) CeOptions<T>{weights, has_weights, weight_total, z_loss, z_ratio, metrics, cap, inv_cap}

// The row pass and its backward over logits stored as S, computed in A.
#define INSTANTIATE_ROW_OPTIONS(SUFFIX, S, A)                                                    \
    extern "C" __global__ void __launch_bounds__(BLOCK) row_options_fwd_##SUFFIX(               \
        const S* logits, const u32* ids, const u32* targets, A* out, u32 rows_per_batch,         \
        u32 vocab, u32 width, u32 stride, u32 offset, u32 has_targets, u32 has_pad, u32 pad_id,  \
        A eps, A inv_count, OPTIONS_PARAMS(A)) {                                                 \
        row_options_fwd<S, A>(logits, ids, targets, out, rows_per_batch, vocab, width, stride,   \
                              offset, has_targets, has_pad, pad_id, eps, inv_count, OPTIONS(A)); \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK) row_options_bwd_##SUFFIX(               \
        const S* logits, const u32* ids, const u32* links, const u32* targets, const A* out,     \
        const A* grad_out, S* grad, u32 rows_per_batch, u32 vocab, u32 width, u32 stride,        \
        u32 has_targets, u32 has_pad, u32 pad_id, A eps, OPTIONS_PARAMS(A)) {                    \
        row_options_bwd<S, A>(logits, ids, links, targets, out, grad_out, grad, rows_per_batch,  \
                              vocab, width, stride, has_targets, has_pad, pad_id, eps,           \
                              OPTIONS(A));                                                       \
    }

#define INSTANTIATE_JACOBIAN_OPTIONS(SUFFIX, T)                                                  \
    extern "C" __global__ void __launch_bounds__(BLOCK) jacobian_options_bwd_##SUFFIX(          \
        const T* probs, const T* dense, const u32* ids, const u32* links, const u32* targets,    \
        const T* out, const T* grad_out, T* grad, u32 rows_per_batch, u32 vocab, u32 width,      \
        u32 stride, u32 offset, u32 has_targets, u32 has_pad, u32 pad_id, T eps,                 \
        OPTIONS_PARAMS(T)) {                                                                     \
        jacobian_options_bwd<T>(probs, dense, ids, links, targets, out, grad_out, grad,          \
                                rows_per_batch, vocab, width, stride, offset, has_targets,       \
                                has_pad, pad_id, eps, OPTIONS(T));                               \
    }

INSTANTIATE_ROW_OPTIONS(f32, float, float)
INSTANTIATE_ROW_OPTIONS(f64, double, double)
INSTANTIATE_ROW_OPTIONS(f16, f16_storage, float)
INSTANTIATE_ROW_OPTIONS(bf16, bf16_storage, float)
INSTANTIATE_JACOBIAN_OPTIONS(f32, float)
INSTANTIATE_JACOBIAN_OPTIONS(f64, double)
