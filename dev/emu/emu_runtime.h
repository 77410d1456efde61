// The CPU warp emulator every kernel lab of dev/kernels runs the real CUDA kernels on (elementwise,
// attention + SSM, the decode GEMV): no GPU needed, part of the CPU test suite (ctest label emu).
//
// Every CUDA thread of a block is a fiber (ucontext) on one OS thread; fibers switch only at
// __syncthreads, at warp collectives (shuffles, redux, __syncwarp, ldmatrix, mma) and at exit. The scheduler
// picks a random runnable fiber, so code between barriers runs in random warp orders. Warp
// collectives need all 32 lanes and block barriers all live threads: a divergent collective or
// barrier deadlocks, which the scheduler reports. The shadow of the PTX wrappers
// (backends/cuda/common/ptx_sm80.cuh beside this file) follows the PTX fragment layouts for ldmatrix
// and mma and checks that ldmatrix and cp.async addresses lie inside the block's dynamic shared
// memory, 16-byte aligned (ptx_sm120.cuh does the same for the FP4 convert and block-scaled mma of
// sm_120a, for a lab that compiles its kernels as an sm_120a pass: arch.h beside it);
// cp.async copies land either at issue or only at the matching cp.async.wait_group (randomly per
// launch); shared memory starts filled with NaN bytes. Blocks run one after another (clusters: below; static
// __shared__ arrays are plain statics), so a block that reads what another block of the same grid
// writes sees it or not depending on the block order; atomicAdd and __threadfence are plain (blocks
// do not overlap). The global stores of the st_global_16 wrapper are logged (S().global_stores) so
// that tests can check who writes what. The programmatic-dependent-launch model is
// backends/cuda/common/pdl.cuh beside this file.
//
// Thread block clusters (LaunchOptions::cluster, sm_90): the blocks of one cluster run at the same
// time, their threads fibers of one scheduler, each block with its own dynamic shared memory, warps
// and __syncthreads barrier (swapped in when one of its threads runs); clusters run one after
// another. The cluster barrier (barrier.cluster arrive / wait, ptx_sm90.cuh beside this file) is
// modelled with phases, and a block reads another's shared memory through map_cluster_shared (mapa).
// Writes are visible at once, so a missing barrier shows as a read of the NaN fill or of a stale
// value under the random schedule. Static __shared__ arrays are one per process, not per block: a
// kernel launched with clusters must keep its shared memory dynamic (launch() cannot tell).
//
// Launch options (LaunchOptions; the two launch() overloads below are the labs' defaults):
//   random_block_order        blocks of a grid in a random order per launch (else in index order);
//   exited_lanes_leave_warps  a lane that exits no longer takes part in its warp's collectives (the
//                             small-op kernels retire lanes before a reduction of the rest; a redux
//                             with exited lanes still dies, as the hardware's full-mask redux is
//                             undefined then); otherwise a collective after an exit deadlocks.
//
// Not modelled: timing, bank conflicts, register limits, memory-model subtleties, the tensor cores'
// internal rounding (emu::mma_sum in ptx_sm80.cuh and emu::nvf4_add in ptx_sm120.cuh say how the
// shadows sum); the float functions are glibc's
// (expf, sincosf), not CUDA's, so results are compared with tolerances where the CPU backend would.
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

#include "quant/formats.h"  // (host build: no CUDA spelling needed before it)

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
struct alignas(16) uint4 {
    uint32_t x, y, z, w;
};
struct float2 {
    float x, y;
};
struct alignas(8) uint2 {
    uint32_t x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline uint4  make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline uint2  make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
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
    std::fprintf(stderr, "emu: %s (block %u,%u,%u thread %u,%u)\n", msg, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x,
                 threadIdx.y);
    if (die_note) die_note();
    std::abort();
}

struct Copy {
    void *       dst;
    const void * src;
    bool         pred;
};

struct Fiber {
    ucontext_t                     ctx{};
    std::vector<char>              stack;
    uint3                          idx;
    uint3                          block;          // its blockIdx
    int                            slot = 0;       // its block's rank in the cluster
    long long                      cluster_phase = -1;  // the cluster barrier phase it arrived in (-1: none open)
    bool                           done = false, waiting = false;
    std::vector<Copy>              open_group;
    std::vector<std::vector<Copy>> groups;  // committed, oldest first
};

struct Barrier {
    int              expected = 0, arrived = 0;
    std::vector<int> waiters;
};

struct Warp {
    Barrier      bar;
    uint32_t     u[32][8];
    float        f[32][4];
    int          i[32];
    const void * addr[32];
};

// A block's own state while another block of its cluster runs (Sched holds the running block's).
struct BlockState {
    Barrier                    block_bar;
    std::vector<Warp>          warps;
    std::vector<unsigned char> smem;
};

// The cluster barrier: a phase completes when every live thread of the cluster has arrived.
struct ClusterBarrier {
    int              expected = 0, arrived = 0;
    long long        phase    = 0;
    std::vector<int> waiters;
};

struct Sched {
    ucontext_t            main{};
    std::vector<Fiber>    fibers;
    int                   cur = -1;
    Barrier               block_bar;
    std::vector<Warp>     warps;
    std::vector<unsigned char> smem;
    std::vector<BlockState>    others;  // [slot]: the blocks of the cluster that are not running
    int                        active = 0;  // the slot whose state is in block_bar / warps / smem
    ClusterBarrier             cluster_bar;
    std::function<void()> body;
    std::mt19937          rng{1};
    bool                  lazy_copies = false;
    bool                  exited_lanes_leave_warps = false;
    long long             n_collectives = 0;
    std::vector<const void *> global_stores;  // addresses of st_global_16 since the last clear
};

inline Sched & S() {
    static Sched s;
    return s;
}

inline void apply(const Copy & c) {
    if (c.pred) std::memcpy(c.dst, c.src, 16);
    else std::memset(c.dst, 0, 16);
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

inline int lane() { return int(threadIdx.x + threadIdx.y * blockDim.x) & 31; }
inline Warp & warp() { return S().warps[size_t(int(threadIdx.x + threadIdx.y * blockDim.x) >> 5)]; }
inline void warp_sync() {
    ++S().n_collectives;
    arrive(warp().bar);
}

inline unsigned char * dyn_smem() { return S().smem.data(); }

inline void check_smem(const void * p, const char * what) {
    Sched &              s = S();
    const unsigned char * b = s.smem.data();
    const auto *         c = static_cast<const unsigned char *>(p);
    if (c < b || c + 16 > b + s.smem.size()) die(what);
    if ((reinterpret_cast<uintptr_t>(c) & 15u) != 0) die("unaligned 16-byte shared-memory access");
}

inline void trampoline() {
    Sched & s = S();
    s.body();
    Fiber & f = s.fibers[size_t(s.cur)];
    f.done    = true;
    // An exited thread no longer takes part in __syncthreads (nor, with the option, in its warp's
    // collectives).
    auto leave = [&](Barrier & b) {
        --b.expected;
        if (b.expected > 0 && b.arrived >= b.expected) {
            b.arrived = 0;
            for (int w : b.waiters) s.fibers[size_t(w)].waiting = false;
            b.waiters.clear();
        }
    };
    leave(s.block_bar);
    // ... nor in the cluster barrier.
    if (s.cluster_bar.expected > 0) {
        ClusterBarrier & c = s.cluster_bar;
        if (f.cluster_phase >= 0 && f.cluster_phase == c.phase) --c.arrived;  // (arrived, exits before its wait)
        --c.expected;
        if (c.expected > 0 && c.arrived >= c.expected) {
            c.arrived = 0;
            ++c.phase;
            for (int w : c.waiters) s.fibers[size_t(w)].waiting = false;
            c.waiters.clear();
        }
    }
    if (s.exited_lanes_leave_warps) {
        const uint3 i = f.idx;
        leave(s.warps[size_t(int(i.x + i.y * blockDim.x) >> 5)].bar);  // (warp(): blocks of at most 2-D)
    }
}

struct LaunchOptions {
    size_t smem_bytes               = 0;
    bool   random_block_order       = true;
    bool   exited_lanes_leave_warps = false;
    size_t stack_bytes              = 256 * 1024;
    dim3   cluster                  = dim3(1, 1, 1);  // blocks per cluster (each dim divides the grid's)
};

// Makes `slot`'s block the running one (its barrier, warps and shared memory in Sched's fields).
inline void activate(int slot) {
    Sched & s = S();
    if (slot == s.active) return;
    BlockState & out = s.others[size_t(s.active)];
    std::swap(out.block_bar, s.block_bar);
    std::swap(out.warps, s.warps);
    std::swap(out.smem, s.smem);  // (the buffers do not move: pointers into them stay valid)
    BlockState & in = s.others[size_t(slot)];
    std::swap(in.block_bar, s.block_bar);
    std::swap(in.warps, s.warps);
    std::swap(in.smem, s.smem);
    s.active = slot;
}

// The dynamic shared memory of block `rank` of the running cluster at the offset p has in the running
// block's (mapa); p must lie in the running block's dynamic shared memory.
inline void * cluster_smem(const void * p, unsigned rank) {
    Sched &               s = S();
    const unsigned char * b = s.smem.data();
    const auto *          c = static_cast<const unsigned char *>(p);
    if (c < b || c >= b + s.smem.size()) die("mapa: the address is not in this block's dynamic shared memory");
    if (rank >= s.others.size()) die("mapa: no such block in the cluster");
    unsigned char * base = int(rank) == s.active ? s.smem.data() : s.others[rank].smem.data();
    return base + (c - b);
}

// Runs `kernel` (a call of the kernel function with its arguments) over the grid.
inline void launch(dim3 grid, dim3 block, const LaunchOptions & o, const std::function<void()> & kernel, uint64_t seed) {
    Sched & s = S();
    s.rng.seed(uint32_t(seed));
    s.lazy_copies              = (s.rng() & 1) != 0;
    s.exited_lanes_leave_warps = o.exited_lanes_leave_warps;
    const size_t smem_bytes    = o.smem_bytes;
    const int n    = int(block.x * block.y * block.z);
    if (n % 32 != 0) {
        std::fprintf(stderr, "emu: block size %d is not a multiple of 32\n", n);
        std::abort();
    }
    gridDim  = grid;
    blockDim = block;
    s.body   = kernel;
    const dim3 cl = o.cluster;
    if (cl.x == 0 || cl.y == 0 || cl.z == 0 || grid.x % cl.x || grid.y % cl.y || grid.z % cl.z) {
        std::fprintf(stderr, "emu: the cluster does not divide the grid\n");
        std::abort();
    }
    const int cb = int(cl.x * cl.y * cl.z);  // blocks per cluster
    // The clusters (their first block), in order or shuffled; a cluster's blocks run together.
    std::vector<uint3> order;
    for (unsigned bz = 0; bz < grid.z; bz += cl.z)
        for (unsigned by = 0; by < grid.y; by += cl.y)
            for (unsigned bx = 0; bx < grid.x; bx += cl.x) order.push_back(uint3{bx, by, bz});
    if (o.random_block_order)
        for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[s.rng() % i]);
    for (const uint3 & c0 : order) {
        const int nt = n * cb;  // fibers: block-major, rank r's threads at r * n ..
        s.fibers.assign(size_t(nt), Fiber{});
        s.others.assign(size_t(cb), BlockState{});
        for (BlockState & b : s.others) {
            b.smem.assign(smem_bytes + 16, 0xFF);  // NaN in f16, bf16 and f32
            b.warps.assign(size_t(n / 32), Warp{});
            for (Warp & w : b.warps) w.bar.expected = 32;
            b.block_bar.expected = n;
        }
        // Rank 0's state runs first (the others' wait in s.others).
        s.active = 0;
        std::swap(s.others[0].block_bar, s.block_bar);
        std::swap(s.others[0].warps, s.warps);
        std::swap(s.others[0].smem, s.smem);
        s.cluster_bar          = ClusterBarrier{};
        s.cluster_bar.expected = nt;  // (a launch without clusters: each block is a cluster of one)
        for (int t = 0; t < nt; ++t) {
            Fiber &   f = s.fibers[size_t(t)];
            const int r = t / n, u = t % n;  // rank (x fastest, as %cluster_ctarank) and thread
            f.slot      = r;
            f.block     = uint3{c0.x + unsigned(r) % cl.x, c0.y + (unsigned(r) / cl.x) % cl.y, c0.z + unsigned(r) / (cl.x * cl.y)};
            f.idx       = uint3{unsigned(u) % block.x, (unsigned(u) / block.x) % block.y, unsigned(u) / (block.x * block.y)};
            f.stack.resize(o.stack_bytes);
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
            for (int t = 0; t < nt; ++t) {
                const Fiber & f = s.fibers[size_t(t)];
                if (!f.done) all_done = false;
                if (!f.done && !f.waiting) runnable.push_back(t);
            }
            if (all_done) break;
            if (runnable.empty()) {
                threadIdx = s.fibers[0].idx;
                blockIdx  = s.fibers[0].block;
                die("deadlock: every live thread waits at a barrier or warp collective (divergent sync?)");
            }
            s.cur         = runnable[s.rng() % runnable.size()];
            const Fiber & f = s.fibers[size_t(s.cur)];
            activate(f.slot);
            threadIdx = f.idx;
            blockIdx  = f.block;
            swapcontext(&s.main, &s.fibers[size_t(s.cur)].ctx);
        }
        activate(0);
    }
    s.cluster_bar = ClusterBarrier{};
}

// The attention, SSM and GEMV labs: dynamic shared memory, random block order.
inline void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> & kernel, uint64_t seed = 1) {
    LaunchOptions o;
    o.smem_bytes = smem_bytes;
    launch(grid, block, o, kernel, seed);
}

// The small-op kernels: no shared memory of their own, blocks in order, exited lanes leave warps.
inline void launch(dim3 grid, dim3 block, const std::function<void()> & kernel, uint64_t seed = 1) {
    LaunchOptions o;
    o.random_block_order       = false;
    o.exited_lanes_leave_warps = true;
    o.stack_bytes              = 64 * 1024;
    launch(grid, block, o, kernel, seed);
}

}  // namespace emu

// ---- CUDA built-ins used by the kernels
inline void __syncthreads() { emu::arrive(emu::S().block_bar); }
// __syncwarp with the full mask: all 32 lanes meet (a warp collective, as the hardware's barrier).
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu) {
    if (mask != 0xFFFFFFFFu) emu::die("__syncwarp with a partial mask is not modelled");
    emu::warp_sync();
}
inline void __threadfence() {}
template <class T> inline T atomicAdd(T * p, T v) {
    const T old = *p;
    *p          = old + v;
    return old;
}

inline float __shfl_xor_sync(unsigned, float v, int m) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.f[l][0]     = v;
    emu::warp_sync();
    const float r = w.f[l ^ m][0];
    emu::warp_sync();
    return r;
}
inline int __shfl_xor_sync(unsigned, int v, int m) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.i[l]        = v;
    emu::warp_sync();
    const int r = w.i[l ^ m];
    emu::warp_sync();
    return r;
}

// shfl.sync.idx over the whole warp (width 32): lane src's value.
inline float __shfl_sync(unsigned, float v, int src) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.f[l][0]     = v;
    emu::warp_sync();
    const float r = w.f[src & 31][0];
    emu::warp_sync();
    return r;
}

// redux.sync: every lane of the warp must take part (the kernels call it with the full mask).
template <typename Op> inline uint32_t emu_redux(uint32_t v, Op op) {
    emu::Warp & w = emu::warp();
    const int   l = emu::lane();
    w.u[l][0]     = v;
    emu::warp_sync();
    if (w.bar.expected != 32) emu::die("redux.sync with exited lanes");
    uint32_t r = w.u[0][0];
    for (int i = 1; i < 32; ++i) r = op(r, w.u[i][0]);
    emu::warp_sync();
    return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return emu_redux(v, [](uint32_t a, uint32_t b) { return a > b ? a : b; }); }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return emu_redux(v, [](uint32_t a, uint32_t b) { return a < b ? a : b; }); }

// Loads: alignment as the hardware demands it; __ldcg (L2 only) is a plain load here.
template <class T> inline T __ldg(const T * p) {
    if ((reinterpret_cast<uintptr_t>(p) % alignof(T)) != 0) emu::die("misaligned __ldg");
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <class T> inline T __ldcg(const T * p) { return __ldg(p); }

// Bit casts: the host side of quant/formats.h's.
inline uint32_t __float_as_uint(float f) { return spark::f32_bits(f); }
inline float    __uint_as_float(uint32_t u) { return spark::f32_from_bits(u); }
inline float    __int_as_float(int32_t i) { return spark::f32_from_bits(uint32_t(i)); }
// Integer intrinsics.
inline int      __ffs(int v) { return v == 0 ? 0 : __builtin_ctz(uint32_t(v)) + 1; }
inline int      __clz(int v) { return v == 0 ? 32 : __builtin_clz(uint32_t(v)); }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
    const uint64_t v = uint64_t(x) | (uint64_t(y) << 32);
    uint32_t       r = 0;
    for (int i = 0; i < 4; ++i) {
        const uint32_t sel = (s >> (4 * i)) & 7u;
        r |= uint32_t((v >> (8 * sel)) & 0xFFu) << (8 * i);
    }
    return r;
}
// The real wrappers of instructions the emulator does not model trap in a host pass; here that is
// a clear death.
[[noreturn]] inline void __trap() { emu::die("__trap: an instruction the emulator does not model"); }
// Round-to-nearest single operations (the elementwise lab compiles without contraction,
// -ffp-contract=off, so these stay separate roundings).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
