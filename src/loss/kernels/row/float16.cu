#line 2 "float16.cu"
// IEEE binary16 and bfloat16 storage for the kernels that read and write 16-bit tensors as they
// are (the options kernels' row pass, ce_options.cu; the CTC loss, ctc.cu), computing in float.
// Compiled after kernels.cu (whose `to_acc` overloads for float and double these extend) in each
// module that uses it.
//
// The row pass reads f16/bf16 logits as they are (no [B,S,V] f32 copy), computes in float and
// writes its rows in float; its backward writes the gradient in the logits' dtype. The
// conversions are the `half` crate's (candle's) bit for bit — exact widening, round to nearest
// even narrowing, NaN kept quiet — written here with integer operations, so that NVRTC needs no
// CUDA header and the emulator runs the same code.
struct f16_storage {
    unsigned short bits;
};
struct bf16_storage {
    unsigned short bits;
};

__device__ __forceinline__ float to_acc(bf16_storage h) {
    const u32 bits = (u32)h.bits;
    return __uint_as_float(((bits & 0x7fffu) > 0x7f80u ? (bits | 0x40u) : bits) << 16);
}

__device__ __forceinline__ float to_acc(f16_storage h) {
    const u32 bits = (u32)h.bits;
    const u32 sign = (bits & 0x8000u) << 16, exponent = bits & 0x7c00u, mantissa = bits & 0x3ffu;
    if ((bits & 0x7fffu) == 0) return __uint_as_float(sign);
    if (exponent == 0x7c00u)
        return __uint_as_float(sign | 0x7f800000u | (mantissa ? 0x400000u | (mantissa << 13) : 0u));
    if (exponent == 0) {  // subnormal: normalised
        u32 shift = 0;
        while (!((mantissa << shift) & 0x400u)) ++shift;
        return __uint_as_float(sign | ((127u - 15u - shift + 1u) << 23) |
                               (((mantissa << shift) & 0x3ffu) << 13));
    }
    return __uint_as_float(sign | (((exponent >> 10) + 112u) << 23) | (mantissa << 13));
}

// Narrowing with the rounding of `half`: up when the round bit is set and the rest (or the last
// kept bit) is not zero, which is round to nearest, ties to even.
__device__ __forceinline__ bf16_storage to_bf16(float x) {
    const u32 bits = __float_as_uint(x);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_storage{(unsigned short)((bits >> 16) | 0x40u)};
    const u32 round_bit = 0x8000u;
    const u32 up = ((bits & round_bit) && (bits & (3u * round_bit - 1u))) ? 1u : 0u;
    return bf16_storage{(unsigned short)((bits >> 16) + up)};
}

__device__ __forceinline__ f16_storage to_f16(float x) {
    const u32 bits = __float_as_uint(x);
    const u32 sign = bits & 0x80000000u, exponent = bits & 0x7f800000u, mantissa = bits & 0x7fffffu;
    const u32 half_sign = sign >> 16;
    if (exponent == 0x7f800000u)
        return f16_storage{(unsigned short)(half_sign | 0x7c00u | (mantissa ? 0x200u : 0u) | (mantissa >> 13))};
    const int half_exponent = (int)(exponent >> 23) - 127 + 15;
    if (half_exponent >= 0x1f) return f16_storage{(unsigned short)(half_sign | 0x7c00u)};
    if (half_exponent <= 0) {
        if (14 - half_exponent > 24) return f16_storage{(unsigned short)half_sign};
        const u32 full = mantissa | 0x800000u;
        u32 half_mantissa = full >> (14 - half_exponent);
        const u32 round_bit = 1u << (13 - half_exponent);
        if ((full & round_bit) && (full & (3u * round_bit - 1u))) ++half_mantissa;
        return f16_storage{(unsigned short)(half_sign | half_mantissa)};
    }
    const u32 packed = half_sign | ((u32)half_exponent << 10) | (mantissa >> 13);
    const u32 round_bit = 0x1000u;
    const u32 up = ((mantissa & round_bit) && (mantissa & (3u * round_bit - 1u))) ? 1u : 0u;
    return f16_storage{(unsigned short)(packed + up)};
}

// A gradient element in the logits' storage type from its value in the accumulation type.
__device__ __forceinline__ float from_acc(float x, float*) { return x; }
__device__ __forceinline__ double from_acc(double x, double*) { return x; }
__device__ __forceinline__ f16_storage from_acc(float x, f16_storage*) { return to_f16(x); }
__device__ __forceinline__ bf16_storage from_acc(float x, bf16_storage*) { return to_bf16(x); }

