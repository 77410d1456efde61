// A CPU warp emulator for the small-op kernels of src/backends/cuda/elementwise (the *_kernels.cuh
// headers), after the one in dev/kernels/attention/emu: every CUDA thread of a block is a fiber
// (ucontext) on one OS thread; fibers switch only at __syncthreads, at warp collectives (shuffles,
// redux) and at exit, and the scheduler picks a random runnable fiber, so code between barriers runs
// in random warp orders. Warp collectives need all 32 lanes and block barriers all live threads: a
// divergent collective or barrier deadlocks, which is reported. Blocks run one after another (static
// __shared__ arrays are plain statics), so thread block clusters are not modelled.
//
// Not modelled: timing, register limits, memory-model subtleties; the float functions are glibc's
// (sincosf, expf), not CUDA's, so compare with tolerances where the CPU backend would.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <random>
#include <vector>

// ---- CUDA spellings
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __shared__ static
#define __align__(n) alignas(n)

struct uint3 {
    unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
typedef struct CUstream_st * cudaStream_t;
typedef int                 cudaError_t;

inline uint3 threadIdx, blockIdx;
inline dim3  blockDim, gridDim;

inline int      min(int a, int b) { return a < b ? a : b; }
inline int      max(int a, int b) { return a > b ? a : b; }
inline int64_t  min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t  max(int64_t a, int64_t b) { return a > b ? a : b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }
inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }

namespace emu {

// Called by die() before it aborts, when set (the PDL model, pdl.cuh, says whether the launch was
// armed: a thread that read a poisoned input before pdl::wait() may diverge from its warp or block).
inline void (*die_note)() = nullptr;

[[noreturn]] inline void die(const char * msg) {
    std::fprintf(stderr, "emu: %s (block %u,%u,%u thread %u)\n", msg, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
    if (die_note) die_note();
    std::abort();
}

struct Fiber {
    ucontext_t        ctx{};
    std::vector<char> stack;
    uint3             idx;
    bool              done = false, waiting = false;
};

struct Barrier {
    int              expected = 0, arrived = 0;
    std::vector<int> waiters;
};

struct Warp {
    Barrier  bar;
    float    f[32];
    uint32_t u[32];
};

struct Sched {
    ucontext_t            main{};
    std::vector<Fiber>    fibers;
    int                   cur = -1;
    Barrier               block_bar;
    std::vector<Warp>     warps;
    std::function<void()> body;
    std::mt19937          rng{1};
};

inline Sched & S() {
    static Sched s;
    return s;
}

inline void yield() {
    Sched & s = S();
    swapcontext(&s.fibers[size_t(s.cur)].ctx, &s.main);
}

inline void arrive(Barrier & b) {
    Sched & s = S();
    if (++b.arrived >= b.expected) {
        b.arrived = 0;
        for (int w : b.waiters) s.fibers[size_t(w)].waiting = false;
        b.waiters.clear();
        return;
    }
    b.waiters.push_back(s.cur);
    s.fibers[size_t(s.cur)].waiting = true;
    yield();
}

inline int    lane() { return int(threadIdx.x) & 31; }
inline Warp & warp() { return S().warps[size_t(int(threadIdx.x) >> 5)]; }
inline void   warp_sync() { arrive(warp().bar); }

inline void trampoline() {
    Sched & s = S();
    s.body();
    Fiber & f = s.fibers[size_t(s.cur)];
    f.done    = true;
    // An exited thread no longer takes part in __syncthreads; an exited lane in no warp collective.
    for (Barrier * b : {&s.block_bar, &s.warps[size_t(int(f.idx.x) >> 5)].bar}) {
        --b->expected;
        if (b->expected > 0 && b->arrived >= b->expected) {
            b->arrived = 0;
            for (int w : b->waiters) s.fibers[size_t(w)].waiting = false;
            b->waiters.clear();
        }
    }
}

// Runs `kernel` (a call of the kernel function with its arguments) over the grid (1-D blocks).
inline void launch(dim3 grid, dim3 block, const std::function<void()> & kernel, uint64_t seed = 1) {
    Sched & s = S();
    s.rng.seed(uint32_t(seed));
    const int n = int(block.x);
    if (block.y != 1 || block.z != 1 || n % 32 != 0) {
        std::fprintf(stderr, "emu: blocks must be 1-D with a multiple of 32 threads\n");
        std::abort();
    }
    gridDim  = grid;
    blockDim = block;
    s.body   = kernel;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                blockIdx = uint3{bx, by, bz};
                s.fibers.assign(size_t(n), Fiber{});
                s.warps.assign(size_t(n / 32), Warp{});
                for (Warp & w : s.warps) w.bar.expected = 32;
                s.block_bar          = Barrier{};
                s.block_bar.expected = n;
                for (int t = 0; t < n; ++t) {
                    Fiber & f = s.fibers[size_t(t)];
                    f.idx     = uint3{unsigned(t), 0, 0};
                    f.stack.resize(64 * 1024);
                    getcontext(&f.ctx);
                    f.ctx.uc_stack.ss_sp   = f.stack.data();
                    f.ctx.uc_stack.ss_size = f.stack.size();
                    f.ctx.uc_link          = &s.main;
                    makecontext(&f.ctx, trampoline, 0);
                }
                std::vector<int> runnable;
                for (;;) {
                    runnable.clear();
                    bool all_done = true;
                    for (int t = 0; t < n; ++t) {
                        const Fiber & f = s.fibers[size_t(t)];
                        if (!f.done) all_done = false;
                        if (!f.done && !f.waiting) runnable.push_back(t);
                    }
                    if (all_done) break;
                    if (runnable.empty()) {
                        threadIdx = s.fibers[0].idx;
                        die("deadlock: every live thread waits at a barrier or warp collective (divergent sync?)");
                    }
                    s.cur     = runnable[s.rng() % runnable.size()];
                    threadIdx = s.fibers[size_t(s.cur)].idx;
                    swapcontext(&s.main, &s.fibers[size_t(s.cur)].ctx);
                }
            }
}

}  // namespace emu

// ---- CUDA built-ins used by the kernels
inline void __syncthreads() { emu::arrive(emu::S().block_bar); }

inline float __shfl_xor_sync(unsigned, float v, int m) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.f[l]        = v;
    emu::warp_sync();
    const float r = w.f[l ^ m];
    emu::warp_sync();
    return r;
}

// redux.sync: every lane of the warp must take part (the kernels call it with the full mask).
template <typename Op> inline uint32_t emu_redux(uint32_t v, Op op) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.u[l]        = v;
    emu::warp_sync();
    if (w.bar.expected != 32) emu::die("redux.sync with exited lanes");
    uint32_t r = w.u[0];
    for (int i = 1; i < 32; ++i) r = op(r, w.u[i]);
    emu::warp_sync();
    return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return emu_redux(v, [](uint32_t a, uint32_t b) { return a > b ? a : b; }); }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return emu_redux(v, [](uint32_t a, uint32_t b) { return a < b ? a : b; }); }

inline float   __ldg(const float * p) { return *p; }
inline float4  __ldg(const float4 * p) { return *p; }
inline int32_t __ldg(const int32_t * p) { return *p; }

inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __int_as_float(int32_t i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
// Round-to-nearest single operations (the host compiles these without contraction: -ffp-contract=off).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
