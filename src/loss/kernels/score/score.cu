#line 2 "score.cu"
// CUDA kernels of the score: -log BLEU of finished statistics rows, averaged over the rows
// (docs/loss.md, §10; the CPU kernel is score/op.rs, whose arithmetic these follow step for step
// and whose comments derive the guards and ties). Compiled by NVRTC after kernels.cu, whose
// block reduction they use, as one module.
//
// A row is [m_1 .. m_N | t_1 .. t_N | C | L] (K rows, f32 or f64): the matches and totals of
// every order, the hypothesis length and the reference length, summed over a corpus (K = 1) or
// one element's (K = B). score_fwd: one block, each thread a strided set of rows, one block sum,
// the loss -(sum of rows) * (1 / K) written by thread 0 into out[0]. score_bwd: one thread per
// row, the row's 2N + 2 partial derivatives times -grad_out[0] * (1 / K). Nothing is atomic and
// the block sum has a fixed order, so a launch gives the same bits every time.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

// The highest order the kernels take: their order weights are kernel parameters w0 .. w7.
#define SCORE_MAX_ORDER 8

__device__ __forceinline__ float score_log(float x) { return logf(x); }
__device__ __forceinline__ double score_log(double x) { return log(x); }

// The settings of a launch: N, the additive constant k of the orders from the second (BLEU+1;
// 0 for none), the smallest statistic that counts (`tiny`), ln of the precision floor, and the
// order weights.
template <typename T> struct ScoreSettings {
    u32 orders;
    T additive, tiny, log_floor;
    T weights[SCORE_MAX_ORDER];
};

// max(x, floor) as candle computes it (x > floor ? x : floor, NaN gives the floor) and its slope
// as candle's backward gives it: 1 above, 1/2 at a tie (split between the two sides), 0 below.
template <typename T> __device__ __forceinline__ T floored(T x, T floor, T& slope) {
    slope = x > floor ? T(1) : (x == floor ? T(0.5) : T(0));
    return x > floor ? x : floor;
}

// min(x, 0) the same way.
template <typename T> __device__ __forceinline__ T capped_at_zero(T x, T& slope) {
    slope = x < T(0) ? T(1) : (x == T(0) ? T(0.5) : T(0));
    return x < T(0) ? x : T(0);
}

// One order's guarded log precision: a total below `tiny` makes the order contribute 0, a match
// below it counts as 0, a zero numerator takes the floor directly; log n - log d, floored. With
// `up` the gradient reaching the floored value, the partials of the order's match and total.
template <typename T>
__device__ T order_term(T m, T t, T additive, T tiny, T log_floor, T up, T& d_m, T& d_t) {
    const bool has_ngrams = t >= tiny;
    const bool kept = m >= tiny;
    const T numerator = has_ngrams ? (kept ? m : T(0)) + additive : T(1);
    const T denominator = has_ngrams ? t + additive : T(1);
    const bool matched = numerator >= tiny;
    const T safe_numerator = matched ? numerator : T(1);
    const T log_ratio = score_log(safe_numerator) - score_log(denominator);
    T slope;
    const T value = floored(matched ? log_ratio : log_floor, log_floor, slope);
    const T d_ratio = matched ? up * slope : T(0);
    d_m = (has_ngrams && kept) ? d_ratio / safe_numerator : T(0);
    d_t = has_ngrams ? T(0) - d_ratio / denominator : T(0);
    return value;
}

// log BP = min(0, 1 - L/C) for C >= 1, min(0, 1 - 2L + L C) below one token; with `up` the
// gradient reaching it, the partials of C and L.
template <typename T> __device__ T log_brevity(T c, T l, T up, T& d_c, T& d_l) {
    const bool long_enough = c >= T(1);
    const T safe = long_enough ? c : T(1);
    const T above_one = T(1) - l / safe;
    const T below_one = (l * c - l * T(2)) + T(1);
    T slope;
    const T value = capped_at_zero(long_enough ? above_one : below_one, slope);
    const T d_raw = up * slope;
    d_c = long_enough ? d_raw * l / (safe * safe) : d_raw * l;
    d_l = long_enough ? (T(0) - d_raw) / safe : d_raw * (c - T(2));
    return value;
}

// One row's log BLEU, and with `grad` (non-null) its partials times `up` into grad[0 .. 2N + 2).
template <typename T>
__device__ T score_row(const T* __restrict__ row, const ScoreSettings<T>& s, T up,
                       T* __restrict__ grad) {
    const u32 n_orders = s.orders;
    T d_c, d_l;
    const T brevity = log_brevity(row[2 * n_orders], row[2 * n_orders + 1], up, d_c, d_l);
    T precisions = T(0);
    for (u32 n = 0; n < n_orders; ++n) {
        T d_m, d_t;
        const T additive = n == 0 ? T(0) : s.additive;
        const T term = order_term(row[n], row[n_orders + n], additive, s.tiny, s.log_floor,
                                  up * s.weights[n], d_m, d_t);
        precisions += term * s.weights[n];
        if (grad) {
            grad[n] = d_m;
            grad[n_orders + n] = d_t;
        }
    }
    if (grad) {
        grad[2 * n_orders] = d_c;
        grad[2 * n_orders + 1] = d_l;
    }
    return brevity + precisions;
}

template <typename T>
__device__ void score_fwd(const T* __restrict__ rows, T* __restrict__ out, u32 count,
                          const ScoreSettings<T>& s) {
    const u32 width = 2 * s.orders + 2;
    T sum = T(0);
    for (u32 r = threadIdx.x; r < count; r += BLOCK) sum += score_row<T>(rows + (u64)r * width, s, T(0), nullptr);
    sum = block_sum(sum);
    if (threadIdx.x == 0) out[0] = T(0) - sum * (T(1) / T(count));
}

template <typename T>
__device__ void score_bwd(const T* __restrict__ rows, const T* __restrict__ grad_out,
                          T* __restrict__ grad, u32 count, const ScoreSettings<T>& s) {
    const u32 width = 2 * s.orders + 2;
    const u64 r = (u64)blockIdx.x * BLOCK + threadIdx.x;
    if (r >= count) return;
    const T up = (T(0) - grad_out[0]) * (T(1) / T(count));
    score_row<T>(rows + r * width, s, up, grad + r * width);
}

#define SCORE_PARAMS(T)                                                                          \
    u32 count, u32 orders, T additive, T tiny, T log_floor, T w0, T w1, T w2, T w3, T w4, T w5,  \
        T w6, T w7
#define SCORE_SETTINGS(T)                                                                        \
    ScoreSettings<T> s;                                                                          \
    s.orders = orders;                                                                           \
    s.additive = additive;                                                                       \
    s.tiny = tiny;                                                                               \
    s.log_floor = log_floor;                                                                     \
    s.weights[0] = w0;                                                                           \
    s.weights[1] = w1;                                                                           \
    s.weights[2] = w2;                                                                           \
    s.weights[3] = w3;                                                                           \
    s.weights[4] = w4;                                                                           \
    s.weights[5] = w5;                                                                           \
    s.weights[6] = w6;                                                                           \
    s.weights[7] = w7;

#define SCORE_INSTANTIATE(SUFFIX, T)                                                             \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        score_fwd_##SUFFIX(const T* rows, T* out, SCORE_PARAMS(T)) {                             \
        SCORE_SETTINGS(T)                                                                        \
        score_fwd<T>(rows, out, count, s);                                                       \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                          \
        score_bwd_##SUFFIX(const T* rows, const T* grad_out, T* grad, SCORE_PARAMS(T)) {         \
        SCORE_SETTINGS(T)                                                                        \
        score_bwd<T>(rows, grad_out, grad, count, s);                                            \
    }

SCORE_INSTANTIATE(f32, float)
SCORE_INSTANTIATE(f64, double)
