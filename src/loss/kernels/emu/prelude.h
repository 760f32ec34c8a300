// candle-bleu's emulator of the CUDA execution model: lets the crate's CUDA C (kernels.cu),
// unmodified, run on the CPU as host C++. Included before the kernel source by
// src/loss/kernels/emu/module.rs, which compiles both with the system C++ compiler into a shared
// object at run time (as NVRTC compiles the same source on a GPU) and launches its kernels with
// the grid, block and parameters of the crate's CUDA launch plans (src/loss/kernels/row/launch.rs, ctc/launch.rs).
//
// The model (docs/gpu.md, "The emulator"):
// - every thread of a block is a fiber (ucontext) with its own stack; blocks run one after
//   another, in forward, reverse or seeded-random order;
// - a fiber runs until it reaches a barrier or a warp shuffle, or returns; then the scheduler
//   resumes the next runnable fiber of the block, in the launch's thread order (forward,
//   reverse, or re-shuffled every round);
// - `__syncthreads` and `__syncthreads_and/or/count` are counting barriers: the block is
//   released when every thread has parked there; a barrier reached after some thread returned
//   is an error (the crate's kernels keep every thread to the end);
// - `__shfl_*_sync` (full mask) is a barrier among the 32 lanes of a warp with an exchange slot
//   per lane; a shuffle reached by only some lanes, or a deadlock, is an error reported with the
//   state of every warp;
// - each `__shared__` declaration is rewritten (module.rs, on its own line) into a static variable
//   and an `emu::SharedMemory` registration; the launcher fills every registered variable with
//   NaN bytes (0xff) before each block, so that a read of a slot no thread of the block wrote
//   shows as NaN (or as -1 for an integer); `extern __shared__` (dynamic) is refused;
// - launches are serialised (one block's shared memory at a time).
// What it hides: races between two barriers (fibers never interleave there), timing, and the
// GPU's own rounding of expf/logf (the host libm's differs by a few ulp).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
// `__shared__` is deliberately left undefined: module.rs rewrites every declaration, and one it
// missed fails to compile.

struct uint3 {
    unsigned int x, y, z;
};
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

namespace emu {
// The state the launcher sets for the fiber it resumes.
struct ThreadState {
    uint3 thread_idx;
};
extern ThreadState* current;
extern uint3 block_idx;
extern dim3 block_dim;
extern dim3 grid_dim;

// Parks the calling fiber at the block barrier of source line `line` with `predicate`;
// returns the barrier's reduction: 0 plain, 1 and, 2 or, 3 count.
int block_barrier(int predicate, int reduction, int line);
// Parks the calling fiber at the warp shuffle of line `line`, offering `value` (8 bytes) and
// reading the slot of lane `source`; returns what it read.
uint64_t warp_shuffle(uint64_t value, int source, unsigned mask, int line);
// Parks the calling fiber at the warp barrier (__syncwarp) of line `line`.
void warp_barrier(unsigned mask, int line);
// The calling fiber's lane within its warp.
int lane_id();
// Registers `bytes` bytes at `address` as shared memory (filled with 0xff now and before every
// block); constructed once per rewritten `__shared__` declaration.
struct SharedMemory {
    SharedMemory(void* address, size_t bytes);
};

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles exchange at most 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}
template <typename T> inline T from_bits(uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}
}  // namespace emu

#define threadIdx (emu::current->thread_idx)
#define blockIdx (emu::block_idx)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)
#define warpSize 32

// Barriers and shuffles carry their source line, so that threads parked at two different ones
// are an error (a divergent barrier), not one barrier.
#define __syncthreads() emu::block_barrier(1, 0, __LINE__)
#define __syncthreads_and(p) emu::block_barrier((p) != 0, 1, __LINE__)
#define __syncthreads_or(p) emu::block_barrier((p) != 0, 2, __LINE__)
#define __syncthreads_count(p) emu::block_barrier((p) != 0, 3, __LINE__)
#define __syncwarp(...) emu::syncwarp(__LINE__, ##__VA_ARGS__)
#define __shfl_sync(...) emu::shfl(__LINE__, __VA_ARGS__)
#define __shfl_xor_sync(...) emu::shfl_xor(__LINE__, __VA_ARGS__)
#define __shfl_down_sync(...) emu::shfl_down(__LINE__, __VA_ARGS__)
#define __shfl_up_sync(...) emu::shfl_up(__LINE__, __VA_ARGS__)
// Fibers never interleave between barriers: memory fences order nothing more.
inline void __threadfence() {}
inline void __threadfence_block() {}

namespace emu {
inline void syncwarp(int line, unsigned mask = 0xffffffffu) { warp_barrier(mask, line); }
template <typename T> inline T shfl(int line, unsigned mask, T v, int src, int width = 32) {
    const int lane = lane_id();
    const int source = (lane & ~(width - 1)) + (src & (width - 1));
    return from_bits<T>(warp_shuffle(to_bits(v), source, mask, line));
}
template <typename T> inline T shfl_xor(int line, unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = lane_id();
    int source = lane ^ lane_mask;
    if ((source & ~(width - 1)) != (lane & ~(width - 1))) source = lane;
    return from_bits<T>(warp_shuffle(to_bits(v), source, mask, line));
}
template <typename T> inline T shfl_down(int line, unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = lane_id();
    int source = lane + (int)delta;
    if ((source & ~(width - 1)) != (lane & ~(width - 1))) source = lane;
    return from_bits<T>(warp_shuffle(to_bits(v), source, mask, line));
}
template <typename T> inline T shfl_up(int line, unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = lane_id();
    int source = lane - (int)delta;
    if (source < 0 || (source & ~(width - 1)) != (lane & ~(width - 1))) source = lane;
    return from_bits<T>(warp_shuffle(to_bits(v), source, mask, line));
}
}  // namespace emu

// Bit casts.
inline float __int_as_float(int i) { return emu::from_bits<float>((uint32_t)i); }
inline int __float_as_int(float f) { return (int)(uint32_t)emu::to_bits(f); }
inline float __uint_as_float(unsigned i) { return emu::from_bits<float>(i); }
inline unsigned __float_as_uint(float f) { return (uint32_t)emu::to_bits(f); }
inline double __longlong_as_double(long long i) { return emu::from_bits<double>((uint64_t)i); }
inline long long __double_as_longlong(double d) { return (long long)emu::to_bits(d); }

// Atomics: fibers do not interleave between barriers, so a plain read-modify-write is atomic.
template <typename T> inline T atomicAdd(T* address, T v) {
    const T old = *address;
    *address = old + v;
    return old;
}
template <typename T> inline T atomicMax(T* address, T v) {
    const T old = *address;
    *address = old > v ? old : v;
    return old;
}
template <typename T> inline T atomicMin(T* address, T v) {
    const T old = *address;
    *address = old < v ? old : v;
    return old;
}
template <typename T> inline T atomicExch(T* address, T v) {
    const T old = *address;
    *address = v;
    return old;
}

// The math functions the kernels call resolve to the host libm's (<cmath>): expf, logf, exp,
// log, fmaxf, … in the global namespace; device intrinsics map to them.
using std::exp;
using std::log;
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }

// ---- the launcher's side: a kernel's entry in the table the Rust side generates -------------

namespace emu {
// Parameter kinds, as the Rust launch plans name them: 1 pointer, 2 unsigned 32-bit integer,
// 3 float, 4 double, 5 signed 32-bit, 6 64-bit integer, 0 anything else.
template <typename T> constexpr int kind_of() {
    using U = std::remove_cv_t<std::remove_reference_t<T>>;
    if (std::is_pointer<U>::value) return 1;
    if (std::is_same<U, unsigned int>::value) return 2;
    if (std::is_same<U, float>::value) return 3;
    if (std::is_same<U, double>::value) return 4;
    if (std::is_same<U, int>::value) return 5;
    if (std::is_integral<U>::value && sizeof(U) == 8) return 6;
    return 0;
}

struct Entry {
    const char* name;
    int arity;
    int kinds[32];
    void (*invoke)(void** params);
};

template <typename... Args> struct Invoker {
    template <void (*F)(Args...), size_t... I>
    static void call(void** params, std::index_sequence<I...>) {
        F(*static_cast<std::remove_cv_t<std::remove_reference_t<Args>>*>(params[I])...);
    }
};

template <typename... Args> constexpr Entry entry_of(const char* name, void (*)(Args...),
                                                     void (*invoke)(void**)) {
    static_assert(sizeof...(Args) <= 32, "at most 32 kernel parameters");
    Entry e{name, (int)sizeof...(Args), {kind_of<Args>()...}, invoke};
    return e;
}

template <typename... Args> struct Trampoline;
template <typename... Args> struct Trampoline<void (*)(Args...)> {
    template <void (*F)(Args...)> static void invoke(void** params) {
        Invoker<Args...>::template call<F>(params, std::index_sequence_for<Args...>{});
    }
};
}  // namespace emu

// One entry of the kernel table: the kernel's name, its parameter kinds and a trampoline that
// unpacks CUDA-style kernelParams (an array of pointers to each argument) into the call.
#define EMU_KERNEL(fn) \
    emu::entry_of(#fn, &fn, &emu::Trampoline<decltype(&fn)>::template invoke<&fn>)
