#line 2 "ctc.cu"
// CUDA kernels of candle-bleu's CTC loss (src/loss/kernels/ctc/cuda.rs; the CPU kernel is
// ctc/op.rs, whose recursions these follow step for step: docs/loss.md, "CTC loss"). Compiled
// by NVRTC after kernels.cu (whose block reductions and float helpers they use), as one module.
//
// Layout: batch-first input x [B, T, V] (log-probabilities, or logits with the log-softmax fused
// in), u32 targets [B, L] (padded), u32 input_lengths [B] and target_lengths [B], all on the
// device: nothing is read back to the host. The op's output is [B, width] with width = 1 + T
// from logits (the loss, then each frame's log-sum-exp, 0 past the input length) and 1 from
// log-probabilities. The recursions run in log space in double whatever T is (as the CPU
// kernel), over the extended target l' = (blank, l_1, blank, …, l_L, blank) of S = 2 L_b + 1
// states, restricted to the states still on a complete path (the CPU kernel's window).
//
// Targets and lengths the host has not read (the training path off the CPU without
// `check_values`) may be out of range: an element whose alignment inputs are (ctc_element_in_range)
// gets a NaN loss and NaN gradients in all its frames, and no read outside the buffers.
//
// Dtypes: f32 and f64 inputs are computed in their own type; f16 and bf16 inputs (float16.cu's
// storage) are read as they are and computed in float — the output in f32, the input's gradient
// in its own type, each element rounded once — so the training path makes no f32 copy of a
// 16-bit input (the n-gram programs of ngrams.cu take f32 or f64 only).
//
// Workspaces (allocated by the launcher, [B, T, S_max] doubles with S_max = 2L + 1): alpha, and
// in the backward the state occupancies gamma; two beta rows [B, 2, S_max]; the per-element
// gradient scale [B]. Values the CPU kernel refuses (NaN or +inf input within the input lengths,
// and -inf logits) give a NaN loss here and NaN gradients, as the row kernels do.
//
// UNVERIFIED ON A GPU: tested on the emulator of the CUDA execution model (docs/gpu.md); built
// into the library only with the `cuda-unverified` feature.

#define CTC_BLOCK 256
// ctc_lse uses kernels.cu's block reductions, which stride by BLOCK and size their shared arrays
// by its warps.
static_assert(CTC_BLOCK == BLOCK, "the CTC kernels' blocks must be kernels.cu's");

// l'_s: the blank at even s, target label (s - 1) / 2 at odd s.
__device__ __forceinline__ u32 ctc_label(const u32* __restrict__ target, u32 blank, u32 s) {
    return (s & 1u) ? target[s >> 1] : blank;
}

// Whether a path may skip from state s - 2 to s: l'_s is a label that differs from l'_{s-2}.
// (Targets never hold the blank, so even states never skip; state 1 has no label before it.)
__device__ __forceinline__ bool ctc_can_skip(const u32* __restrict__ target, u32 s) {
    return (s & 1u) && s >= 3 && target[s >> 1] != target[(s >> 1) - 1];
}

// The states [lo, hi) that can be on a complete path at frame t of `frames`.
__device__ __forceinline__ void ctc_window(u32 states, u32 frames, u32 t, u32& lo, u32& hi) {
    const unsigned long long need = 2ull * (frames - t);
    lo = need >= states ? 0u : (u32)(states - need);
    hi = states < 2 * t + 2 ? states : 2 * t + 2;
}

// Whether element b's alignment inputs are in range: 1 <= frames <= frames_max, its target
// length <= target_max, and each of its target ids < vocab and not the blank. The host checks
// them whenever it reads them (the CPU, or `check_values`); on the training path off the CPU
// they stay on the device unread, and an element out of range gets a NaN loss and NaN gradients
// here instead of reads outside the buffers.
__device__ __forceinline__ bool ctc_element_in_range(const u32* __restrict__ target, u32 frames,
                                                     u32 target_length, u32 frames_max,
                                                     u32 target_max, u32 vocab, u32 blank) {
    if (frames == 0 || frames > frames_max || target_length > target_max) return false;
    for (u32 j = 0; j < target_length; ++j)
        if (target[j] >= vocab || target[j] == blank) return false;
    return true;
}

__device__ __forceinline__ double ctc_log_add(double a, double b) {
    const double hi = a > b ? a : b, lo = a > b ? b : a;
    if (lo == neg_inf<double>()) return hi;
    return hi + log1p(exp(lo - hi));
}

__device__ __forceinline__ double ctc_log_add3(double a, double b, double c) {
    double hi = a > b ? a : b;
    hi = hi > c ? hi : c;
    if (hi == neg_inf<double>()) return hi;
    return hi + log(exp(a - hi) + exp(b - hi) + exp(c - hi));
}

// The emission log y_t(l'_s) in double: x - lse from logits (lse as stored in the output, so that
// forward and backward see the same numbers), x from log-probabilities. `S` is the input's
// storage type (f16/bf16 read as they are, float16.cu), `T` the output's and the arithmetic's.
template <typename S, typename T>
__device__ __forceinline__ double ctc_emission(const S* __restrict__ x_t, const T* __restrict__ out_b,
                                               u32 from_logits, u32 t, u32 label) {
    const double v = (double)to_acc(x_t[label]);
    return from_logits ? v - (double)out_b[1 + t] : v;
}

// alpha [frames, S] of element b into `alpha` (rows of s_max), -inf off the window; returns
// log p(l | x) to every thread.
template <typename S, typename T>
__device__ double ctc_alpha_rows(const S* __restrict__ x, const u32* __restrict__ target,
                                 const T* __restrict__ out_b, double* __restrict__ alpha,
                                 u32 frames, u32 states, u32 s_max, u32 vocab, u32 blank,
                                 u32 from_logits) {
    for (u32 t = 0; t < frames; ++t) {
        const S* x_t = x + (unsigned long long)t * vocab;
        double* row = alpha + (unsigned long long)t * s_max;
        u32 lo, hi;
        ctc_window(states, frames, t, lo, hi);
        for (u32 s = threadIdx.x; s < states; s += CTC_BLOCK) {
            double a = neg_inf<double>();
            if (s >= lo && s < hi) {
                const double em = ctc_emission(x_t, out_b, from_logits, t, ctc_label(target, blank, s));
                if (t == 0) {
                    a = em;
                } else {
                    const double* prev = row - s_max;
                    const double stay = prev[s];
                    const double step = s >= 1 ? prev[s - 1] : neg_inf<double>();
                    const double skip = ctc_can_skip(target, s) ? prev[s - 2] : neg_inf<double>();
                    a = ctc_log_add3(stay, step, skip) + em;
                }
            }
            row[s] = a;
        }
        __syncthreads();  // row t complete before row t + 1 reads it
    }
    const double* last = alpha + (unsigned long long)(frames - 1) * s_max;
    return states >= 2 ? ctc_log_add(last[states - 1], last[states - 2]) : last[0];
}

// ---- forward ---------------------------------------------------------------------------------

// One block per frame row (b, t): out[b, 1 + t] = log Σ_v exp(x[b, t, v]) (NaN if a logit is not
// finite), 0 past the input length.
template <typename S, typename T>
__device__ void ctc_lse(const S* __restrict__ x, const u32* __restrict__ input_lengths,
                        T* __restrict__ out, u32 frames_max, u32 vocab) {
    const unsigned long long r = blockIdx.x;
    const u32 b = (u32)(r / frames_max), t = (u32)(r % frames_max);
    T* o = out + (unsigned long long)b * (1 + frames_max) + 1 + t;
    if (t >= input_lengths[b]) {
        if (threadIdx.x == 0) *o = T(0);
        return;  // the whole block: no barrier follows
    }
    T m, s;
    int finite;
    row_max_sum(x + r * vocab, vocab, m, s, finite);
    if (threadIdx.x == 0) *o = finite ? m + log(s) : quiet_nan<T>();
}

// One block per element b: the loss out[b, 0] = -log p(l | x) (+inf, or 0 with zero_infinity,
// when no alignment has a probability).
template <typename S, typename T>
__device__ void ctc_alpha(const S* __restrict__ x, const u32* __restrict__ targets,
                          const u32* __restrict__ input_lengths,
                          const u32* __restrict__ target_lengths, T* __restrict__ out,
                          double* __restrict__ alpha, u32 frames_max, u32 vocab, u32 target_max,
                          u32 width, u32 blank, u32 from_logits, u32 zero_infinity) {
    const u32 b = blockIdx.x;
    const u32 s_max = 2 * target_max + 1;
    const u32 frames = input_lengths[b], states = 2 * target_lengths[b] + 1;
    if (!ctc_element_in_range(targets + (unsigned long long)b * target_max, frames,
                              target_lengths[b], frames_max, target_max, vocab, blank)) {
        if (threadIdx.x == 0) out[(unsigned long long)b * width] = quiet_nan<T>();
        return;  // the whole block: no barrier follows
    }
    const double log_p = ctc_alpha_rows(
        x + (unsigned long long)b * frames_max * vocab, targets + (unsigned long long)b * target_max,
        out + (unsigned long long)b * width, alpha + (unsigned long long)b * frames_max * s_max,
        frames, states, s_max, vocab, blank, from_logits);
    if (threadIdx.x == 0) {
        T loss;
        if (log_p == neg_inf<double>())
            loss = zero_infinity ? T(0) : T(-neg_inf<double>());
        else
            loss = T(-log_p);
        out[(unsigned long long)b * width] = loss;
    }
}

// ---- backward --------------------------------------------------------------------------------

// One block per element b: alpha again, beta (without the emission at its own frame, two rows
// in `beta`), and the occupancies gamma_t(s) = exp(alpha + beta - log p) into `gamma` ([T, S_max]
// per element, 0 off the window and past the input length); scale[b] = the upstream gradient of
// the loss, or 0 for an infinite loss (whose gradient is 0, as on the CPU).
template <typename S, typename T>
__device__ void ctc_beta(const S* __restrict__ x, const u32* __restrict__ targets,
                         const u32* __restrict__ input_lengths,
                         const u32* __restrict__ target_lengths, const T* __restrict__ out,
                         const T* __restrict__ grad_out, double* __restrict__ alpha,
                         double* __restrict__ beta, double* __restrict__ gamma,
                         double* __restrict__ scale, u32 frames_max, u32 vocab, u32 target_max,
                         u32 width, u32 blank, u32 from_logits) {
    const u32 b = blockIdx.x;
    const u32 s_max = 2 * target_max + 1;
    const u32 frames = input_lengths[b], states = 2 * target_lengths[b] + 1;
    const S* xb = x + (unsigned long long)b * frames_max * vocab;
    const u32* target = targets + (unsigned long long)b * target_max;
    const T* out_b = out + (unsigned long long)b * width;
    double* alpha_b = alpha + (unsigned long long)b * frames_max * s_max;
    double* gamma_b = gamma + (unsigned long long)b * frames_max * s_max;
    double* beta_now = beta + (unsigned long long)b * 2 * s_max;
    double* beta_next = beta_now + s_max;
    for (unsigned long long i = threadIdx.x; i < (unsigned long long)frames_max * s_max; i += CTC_BLOCK)
        gamma_b[i] = 0.0;
    if (!ctc_element_in_range(target, frames, target_lengths[b], frames_max, target_max, vocab,
                              blank)) {
        if (threadIdx.x == 0) scale[b] = quiet_nan<double>();  // NaN gradients (ctc_grad_rows)
        return;  // the whole block: no barrier follows
    }
    const double log_p = ctc_alpha_rows(xb, target, out_b, alpha_b, frames, states, s_max, vocab,
                                        blank, from_logits);
    const double upstream = (double)grad_out[(unsigned long long)b * width];
    const bool finite_loss = log_p != neg_inf<double>() && upstream != 0.0;
    if (threadIdx.x == 0) scale[b] = finite_loss ? upstream : 0.0;
    if (!finite_loss) return;  // the whole block: no barrier follows
    u32 lo, hi;
    ctc_window(states, frames, frames - 1, lo, hi);
    for (u32 s = threadIdx.x; s < states; s += CTC_BLOCK)
        beta_now[s] = (s >= lo && s < hi) ? 0.0 : neg_inf<double>();
    __syncthreads();
    for (u32 t = frames; t-- > 0;) {
        ctc_window(states, frames, t, lo, hi);
        for (u32 s = threadIdx.x; s < states; s += CTC_BLOCK) {
            if (s >= lo && s < hi) {
                const double log_gamma = alpha_b[(unsigned long long)t * s_max + s] + beta_now[s] - log_p;
                gamma_b[(unsigned long long)t * s_max + s] =
                    log_gamma > neg_inf<double>() ? exp(log_gamma) : 0.0;
            }
        }
        if (t == 0) break;  // every thread alike
        // beta_{t-1}(s) = log Σ_{s' in {s, s+1, s+2 if a skip}} exp(beta_t(s') + em_t(s')).
        const S* x_t = xb + (unsigned long long)t * vocab;
        u32 lo_prev, hi_prev;
        ctc_window(states, frames, t - 1, lo_prev, hi_prev);
        for (u32 s = threadIdx.x; s < states; s += CTC_BLOCK) {
            double v = neg_inf<double>();
            if (s >= lo_prev && s < hi_prev) {
                const double stay = beta_now[s] + ctc_emission(x_t, out_b, from_logits, t, ctc_label(target, blank, s));
                const double step = s + 1 < states
                    ? beta_now[s + 1] + ctc_emission(x_t, out_b, from_logits, t, ctc_label(target, blank, s + 1))
                    : neg_inf<double>();
                const double skip = s + 2 < states && ctc_can_skip(target, s + 2)
                    ? beta_now[s + 2] + ctc_emission(x_t, out_b, from_logits, t, ctc_label(target, blank, s + 2))
                    : neg_inf<double>();
                v = ctc_log_add3(stay, step, skip);
            }
            beta_next[s] = v;
        }
        __syncthreads();  // every thread has read beta_now
        double* swap = beta_now;
        beta_now = beta_next;
        beta_next = swap;
    }
}

// Whether state s is the first of its label among the states 0..S (the blank's is 0).
__device__ __forceinline__ bool ctc_first_of_label(const u32* __restrict__ target, u32 s) {
    if (!(s & 1u)) return s == 0;
    const u32 label = target[s >> 1];
    for (u32 j = 0; j < (s >> 1); ++j)
        if (target[j] == label) return false;
    return true;
}

// One block per frame row (b, t): grad = scale (softmax(x) - posterior) from logits, -scale
// posterior from log-probabilities, with posterior(v) = Σ_{s: l'_s = v} gamma_t(s); 0 past the
// input length and for an infinite loss. Each element is computed in double and rounded once to
// the input's storage type `S` (a label's dense part is recomputed, not read back rounded).
template <typename S, typename T>
__device__ void ctc_grad_rows(const S* __restrict__ x, const u32* __restrict__ targets,
                              const u32* __restrict__ input_lengths,
                              const u32* __restrict__ target_lengths, const T* __restrict__ out,
                              const double* __restrict__ gamma, const double* __restrict__ scale,
                              S* __restrict__ grad, u32 frames_max, u32 vocab, u32 target_max,
                              u32 width, u32 blank, u32 from_logits) {
    S* const as_storage = nullptr;  // selects from_acc's overload
    const unsigned long long r = blockIdx.x;
    const u32 b = (u32)(r / frames_max), t = (u32)(r % frames_max);
    const u32 s_max = 2 * target_max + 1;
    S* g = grad + r * vocab;
    const double element_scale = scale[b];
    if (element_scale != element_scale) {  // an element out of range (ctc_beta)
        for (u32 v = threadIdx.x; v < vocab; v += CTC_BLOCK) g[v] = from_acc(quiet_nan<T>(), as_storage);
        return;  // the whole block: no barrier follows
    }
    if (t >= input_lengths[b] || element_scale == 0.0) {
        for (u32 v = threadIdx.x; v < vocab; v += CTC_BLOCK) g[v] = from_acc(T(0), as_storage);
        return;  // the whole block: no barrier follows
    }
    const S* x_t = x + r * vocab;
    const double lse = from_logits ? (double)out[(unsigned long long)b * width + 1 + t] : 0.0;
    for (u32 v = threadIdx.x; v < vocab; v += CTC_BLOCK) {
        const double dense = from_logits ? element_scale * exp((double)to_acc(x_t[v]) - lse) : 0.0;
        g[v] = from_acc(T(dense), as_storage);
    }
    __syncthreads();  // the dense writes are visible before the sparse ones
    const u32* target = targets + (unsigned long long)b * target_max;
    const u32 states = 2 * target_lengths[b] + 1;
    const double* gamma_t = gamma + ((unsigned long long)b * frames_max + t) * s_max;
    for (u32 s = threadIdx.x; s < states; s += CTC_BLOCK) {
        if (!ctc_first_of_label(target, s)) continue;
        const u32 label = ctc_label(target, blank, s);
        double posterior = 0.0;
        for (u32 j = s; j < states; j += 2)  // the states of one parity
            if (ctc_label(target, blank, j) == label) posterior += gamma_t[j];
        const double dense =
            from_logits ? element_scale * exp((double)to_acc(x_t[label]) - lse) : 0.0;
        g[label] = from_acc(T(dense - element_scale * posterior), as_storage);
    }
}

// ---- entry points: <kernel>_<dtype> -----------------------------------------------------------

#define CTC_INSTANTIATE(SUFFIX, S, T)                                                               \
    extern "C" __global__ void __launch_bounds__(CTC_BLOCK) ctc_lse_##SUFFIX(                    \
        const S* x, const u32* input_lengths, T* out, u32 frames_max, u32 vocab) {               \
        ctc_lse<S, T>(x, input_lengths, out, frames_max, vocab);                                    \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(CTC_BLOCK) ctc_alpha_##SUFFIX(                  \
        const S* x, const u32* targets, const u32* input_lengths, const u32* target_lengths,     \
        T* out, double* alpha, u32 frames_max, u32 vocab, u32 target_max, u32 width, u32 blank,  \
        u32 from_logits, u32 zero_infinity) {                                                    \
        ctc_alpha<S, T>(x, targets, input_lengths, target_lengths, out, alpha, frames_max, vocab,   \
                     target_max, width, blank, from_logits, zero_infinity);                      \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(CTC_BLOCK) ctc_beta_##SUFFIX(                   \
        const S* x, const u32* targets, const u32* input_lengths, const u32* target_lengths,     \
        const T* out, const T* grad_out, double* alpha, double* beta, double* gamma,             \
        double* scale, u32 frames_max, u32 vocab, u32 target_max, u32 width, u32 blank,          \
        u32 from_logits) {                                                                       \
        ctc_beta<S, T>(x, targets, input_lengths, target_lengths, out, grad_out, alpha, beta,       \
                    gamma, scale, frames_max, vocab, target_max, width, blank, from_logits);     \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(CTC_BLOCK) ctc_grad_rows_##SUFFIX(              \
        const S* x, const u32* targets, const u32* input_lengths, const u32* target_lengths,     \
        const T* out, const double* gamma, const double* scale, S* grad, u32 frames_max,         \
        u32 vocab, u32 target_max, u32 width, u32 blank, u32 from_logits) {                      \
        ctc_grad_rows<S, T>(x, targets, input_lengths, target_lengths, out, gamma, scale, grad,     \
                         frames_max, vocab, target_max, width, blank, from_logits);              \
    }

CTC_INSTANTIATE(f32, float, float)
CTC_INSTANTIATE(f64, double, double)
// 16-bit inputs (float16.cu), computed in float: the output in f32, the gradient in the input's
// storage type.
CTC_INSTANTIATE(f16, f16_storage, float)
CTC_INSTANTIATE(bf16, bf16_storage, float)
