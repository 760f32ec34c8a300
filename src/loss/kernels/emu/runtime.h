// The launcher of candle-bleu's CUDA emulator (prelude.h says what it models). Included once,
// after the kernel source, in the translation unit that src/loss/kernels/emu/module.rs writes;
// its one entry point is `candle_bleu_emu_launch`.
#pragma once

#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <ucontext.h>
#include <vector>

namespace emu {

ThreadState* current = nullptr;
uint3 block_idx;
dim3 block_dim;
dim3 grid_dim;

namespace {

enum class State { Runnable, AtBarrier, AtShuffle, AtWarpBarrier, Done };

const char* state_name(State s) {
    switch (s) {
        case State::Runnable: return "runnable";
        case State::AtBarrier: return "barrier";
        case State::AtShuffle: return "shuffle";
        case State::AtWarpBarrier: return "syncwarp";
        case State::Done: return "returned";
    }
    return "?";
}

struct Fiber {
    ucontext_t context;
    ThreadState thread;
    State state = State::Runnable;
    int line = 0;           // the source line of the barrier or shuffle it waits at
    int predicate = 0;      // its __syncthreads_* predicate
    int reduction = 0;      // 0 plain, 1 and, 2 or, 3 count
    int result = 0;         // the barrier's reduction, when released
    unsigned mask = 0;      // its shuffle's or syncwarp's lane mask
    int source = 0;         // the lane it reads at its shuffle
    uint64_t offered = 0;   // the value it offers at its shuffle
    uint64_t received = 0;  // the value it read
};

constexpr size_t STACK_BYTES = 64 * 1024;

ucontext_t scheduler_context;
std::vector<Fiber> fibers;
std::vector<std::unique_ptr<char[]>> stacks;
Fiber* running = nullptr;
const Entry* launching = nullptr;
void** launch_params = nullptr;
std::mutex launch_lock;

// Every registered __shared__ variable: (address, bytes). A function's static, so that a
// namespace-scope __shared__ of the kernel source (initialised before this file's globals) finds
// it constructed.
std::vector<std::pair<void*, size_t>>& shared_memory() {
    static std::vector<std::pair<void*, size_t>> regions;
    return regions;
}

void park() { swapcontext(&running->context, &scheduler_context); }

void fiber_main() {
    launching->invoke(launch_params);
    running->state = State::Done;
    // Returning resumes uc_link, the scheduler.
}

}  // namespace

SharedMemory::SharedMemory(void* address, size_t bytes) {
    std::memset(address, 0xff, bytes);
    shared_memory().emplace_back(address, bytes);
}

int lane_id() { return (int)((running - fibers.data()) % 32); }

int block_barrier(int predicate, int reduction, int line) {
    Fiber* self = running;
    self->state = State::AtBarrier;
    self->predicate = predicate;
    self->reduction = reduction;
    self->line = line;
    park();
    return self->result;
}

uint64_t warp_shuffle(uint64_t value, int source, unsigned mask, int line) {
    Fiber* self = running;
    self->state = State::AtShuffle;
    self->offered = value;
    self->source = source;
    self->mask = mask;
    self->line = line;
    park();
    return self->received;
}

void warp_barrier(unsigned mask, int line) {
    Fiber* self = running;
    self->state = State::AtWarpBarrier;
    self->mask = mask;
    self->line = line;
    park();
}

namespace {

std::string describe_block() {
    std::string out;
    char buf[256];
    std::snprintf(buf, sizeof buf, "block (%u, %u, %u) of %zu threads:", block_idx.x, block_idx.y,
                  block_idx.z, fibers.size());
    out += buf;
    for (size_t w = 0; w * 32 < fibers.size(); ++w) {
        std::snprintf(buf, sizeof buf, "\n  warp %zu:", w);
        out += buf;
        for (size_t t = w * 32; t < std::min(fibers.size(), (w + 1) * 32); ++t) {
            const Fiber& f = fibers[t];
            if (f.state == State::Done || f.state == State::Runnable)
                std::snprintf(buf, sizeof buf, " %zu=%s", t % 32, state_name(f.state));
            else
                std::snprintf(buf, sizeof buf, " %zu=%s@%d", t % 32, state_name(f.state), f.line);
            out += buf;
        }
    }
    return out;
}

// The lanes of warp `w` that exist in this block, as a mask.
unsigned existing_lanes(size_t w) {
    const size_t n = std::min<size_t>(32, fibers.size() - w * 32);
    return n == 32 ? 0xffffffffu : ((1u << n) - 1u);
}

// Completes the shuffles and warp barriers whose lanes have all arrived; false if none did.
// Sets `error` when a warp's lanes disagree (different lines or masks, or a lane outside).
bool release_warps(std::string& error) {
    bool released = false;
    for (size_t w = 0; w * 32 < fibers.size(); ++w) {
        Fiber* lanes = &fibers[w * 32];
        const unsigned existing = existing_lanes(w);
        for (unsigned lane = 0; lane < 32; ++lane) {
            if (!(existing >> lane & 1u)) break;
            const Fiber& first = lanes[lane];
            if (first.state != State::AtShuffle && first.state != State::AtWarpBarrier) continue;
            const unsigned mask = first.mask & existing;
            if (!(mask >> lane & 1u)) {
                error = "a lane at a warp operation whose mask leaves it out";
                return false;
            }
            bool all = true;
            for (unsigned l = 0; l < 32; ++l) {
                if (!(mask >> l & 1u)) continue;
                const Fiber& f = lanes[l];
                if (f.state == State::Done) {
                    error = "a warp operation after a lane of its mask returned";
                    return false;
                }
                if (f.state != first.state || f.line != first.line || f.mask != first.mask)
                    all = false;
            }
            if (!all) continue;
            for (unsigned l = 0; l < 32; ++l) {
                if (!(mask >> l & 1u)) continue;
                Fiber& f = lanes[l];
                if (f.state == State::AtShuffle) {
                    const int src = f.source;
                    if (src < 0 || src >= 32 || !(mask >> src & 1u)) {
                        error = "a shuffle reads a lane outside its mask";
                        return false;
                    }
                    f.received = lanes[src].offered;
                }
            }
            for (unsigned l = 0; l < 32; ++l)
                if (mask >> l & 1u) lanes[l].state = State::Runnable;
            released = true;
            break;  // one group per warp per pass
        }
    }
    return released;
}

// Releases the block barrier if every thread has parked there; false otherwise. Sets `error`
// when they wait at different barriers or some thread returned before it.
bool release_block(std::string& error) {
    size_t waiting = 0, done = 0;
    int line = -1, reduction = -1;
    for (const Fiber& f : fibers) {
        if (f.state == State::Done) ++done;
        if (f.state != State::AtBarrier) continue;
        ++waiting;
        if (line < 0) {
            line = f.line;
            reduction = f.reduction;
        } else if (f.line != line || f.reduction != reduction) {
            error = "threads wait at different __syncthreads (lines " + std::to_string(line) +
                    " and " + std::to_string(f.line) + ")";
            return false;
        }
    }
    if (waiting == 0 || waiting + done < fibers.size()) return false;
    if (done > 0) {
        error = "a __syncthreads (line " + std::to_string(line) + ") after " +
                std::to_string(done) + " thread(s) of the block returned";
        return false;
    }
    int all = 1, any = 0, count = 0;
    for (const Fiber& f : fibers) {
        all &= f.predicate;
        any |= f.predicate;
        count += f.predicate;
    }
    const int result = reduction == 1 ? all : reduction == 2 ? any : reduction == 3 ? count : 0;
    for (Fiber& f : fibers) {
        f.result = result;
        f.state = State::Runnable;
    }
    return true;
}

// Runs one block to the end; an empty string, or what went wrong.
std::string run_block(int thread_order, std::mt19937_64& rng) {
    for (const auto& [address, bytes] : shared_memory()) std::memset(address, 0xff, bytes);
    const size_t n = fibers.size();
    for (size_t t = 0; t < n; ++t) {
        Fiber& f = fibers[t];
        f = Fiber{};
        f.thread.thread_idx = uint3{(unsigned)(t % block_dim.x),
                                    (unsigned)(t / block_dim.x % block_dim.y),
                                    (unsigned)(t / (block_dim.x * block_dim.y))};
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = stacks[t].get();
        f.context.uc_stack.ss_size = STACK_BYTES;
        f.context.uc_link = &scheduler_context;
        makecontext(&f.context, fiber_main, 0);
    }
    std::vector<size_t> order(n);
    for (size_t t = 0; t < n; ++t) order[t] = thread_order == 1 ? n - 1 - t : t;
    for (;;) {
        if (thread_order == 2) std::shuffle(order.begin(), order.end(), rng);
        bool ran = false;
        for (size_t t : order) {
            Fiber& f = fibers[t];
            if (f.state != State::Runnable) continue;
            running = &f;
            current = &f.thread;
            swapcontext(&scheduler_context, &f.context);
            ran = true;
        }
        running = nullptr;
        if (ran) continue;
        bool finished = true;
        for (const Fiber& f : fibers) finished &= f.state == State::Done;
        if (finished) return "";
        std::string error;
        if (release_warps(error)) continue;
        if (error.empty() && release_block(error)) continue;
        if (error.empty()) error = "deadlock: no barrier or shuffle can complete";
        return error + "\n" + describe_block();
    }
}

}  // namespace
}  // namespace emu

// Runs `entry` over a grid of blocks, each of `block` threads, with CUDA-style `params` (one
// pointer to each argument's value). Thread order 0 forward, 1 reverse, 2 seeded random (re-drawn
// every round); block order the same. Returns 0, or 1 with a message in `error`.
extern "C" int candle_bleu_emu_launch(const emu::Entry* entry, const unsigned* grid,
                                      const unsigned* block, unsigned shared_bytes,
                                      void** params, int thread_order, int block_order,
                                      unsigned long long seed, char* error, size_t error_len) {
    using namespace emu;
    std::lock_guard<std::mutex> guard(launch_lock);
    auto fail = [&](const std::string& message) {
        std::snprintf(error, error_len, "%s: %s", entry->name, message.c_str());
        return 1;
    };
    if (shared_bytes != 0) return fail("dynamic shared memory is not emulated");
    const unsigned long long threads = (unsigned long long)block[0] * block[1] * block[2];
    if (threads == 0 || threads > 1024) return fail("a block of " + std::to_string(threads) +
                                                    " threads (1 to 1024)");
    block_dim = dim3{block[0], block[1], block[2]};
    grid_dim = dim3{grid[0], grid[1], grid[2]};
    fibers.assign(threads, Fiber{});
    while (stacks.size() < threads) stacks.emplace_back(new char[STACK_BYTES]);
    launching = entry;
    launch_params = params;
    std::mt19937_64 rng(seed);
    const unsigned long long blocks = (unsigned long long)grid[0] * grid[1] * grid[2];
    std::vector<unsigned long long> block_order_list(blocks);
    for (unsigned long long b = 0; b < blocks; ++b)
        block_order_list[b] = block_order == 1 ? blocks - 1 - b : b;
    if (block_order == 2) std::shuffle(block_order_list.begin(), block_order_list.end(), rng);
    for (unsigned long long b : block_order_list) {
        block_idx = uint3{(unsigned)(b % grid[0]), (unsigned)(b / grid[0] % grid[1]),
                          (unsigned)(b / ((unsigned long long)grid[0] * grid[1]))};
        const std::string message = run_block(thread_order, rng);
        if (!message.empty()) return fail(message);
    }
    return 0;
}
