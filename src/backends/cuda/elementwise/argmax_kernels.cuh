// Kernels of ARGMAX; launched by argmax.cu, also compiled by the CPU warp emulator test
// (dev/kernels/elementwise/emu_test.cpp; not the cluster kernel). See argmax.cu.
#pragma once

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm90.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

#if SPARK_ARCH_HOPPER_PLUS
#include <cooperative_groups.h>
#endif

namespace spark::cuda::ew {

constexpr int kArgmaxThreads = 256;
constexpr int kChunk      = 2048;   // floats per pass-1 block of the pre-sm_90 chunked path
constexpr int kRowMax     = 32768;  // rows up to this length: one block per row
constexpr int kClusterN   = 8;      // CTAs per row (portable cluster size)
constexpr int kClusterThr = 1024;
constexpr int kBatch      = 8;      // float4 loads in flight per thread before the compares
constexpr int kNone       = 0x7fffffff;

struct Best {
    float   v;
    int32_t i;
};

// a better than b: larger value, or equal value at a lower index. NaN never enters (skipped at
// load), "none" is (-inf, kNone) so that a real -inf at any index still beats it.
__device__ __forceinline__ Best better(Best a, Best b) { return (a.v > b.v || (a.v == b.v && a.i < b.i)) ? a : b; }

__device__ __forceinline__ void offer(Best & b, float v, int64_t i) {
    if (v > b.v || (v == b.v && int32_t(i) < b.i)) b = Best{v, int32_t(i)};  // NaN: both comparisons false
}

// Warp-wide best: two hardware reductions (value key, then the lowest index holding it).
__device__ __forceinline__ Best warp_best(Best b) {
    const uint32_t key = ordered_key(b.v == 0.0f ? 0.0f : b.v);  // -0 ties +0
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    const uint32_t idx = __reduce_min_sync(0xffffffffu, key == top ? uint32_t(b.i) : 0xffffffffu);
    return Best{from_ordered_key(top), int32_t(idx)};
}

// The CPU's answer for a row whose best non-NaN entry is `b`, given the row's first value.
__device__ __forceinline__ int32_t finish(Best b, float x0) { return (x0 != x0 || b.i == kNone) ? 0 : b.i; }

struct ArgmaxArgs {
    Rows      x;
    int64_t   n = 0, nrows = 0, chunks = 0;
    Best *    partial = nullptr;  // chunked path: [nrows][chunks]
    int32_t * out     = nullptr;  // [nrows]
};

// Offers x[beg, end) to `b`, thread t of T taking elements (V = 4: float4s) t, t + T, ... with up to
// kBatch loads in flight before any compare.
template <int V, int T>
__device__ __forceinline__ void scan(Best & b, const float * row, int64_t beg, int64_t end, int t) {
    for (int64_t base = beg + int64_t(t) * V; base < end; base += int64_t(T) * V * kBatch) {
        float q[kBatch][V];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            const int64_t i = base + int64_t(u) * T * V;
            if (i < end) {
                if constexpr (V == 4) {
                    const float4 f = *reinterpret_cast<const float4 *>(row + i);
                    q[u][0] = f.x, q[u][1] = f.y, q[u][2] = f.z, q[u][3] = f.w;
                } else {
                    q[u][0] = row[i];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
            const int64_t i = base + int64_t(u) * T * V;
            if (i < end)
#pragma unroll
                for (int v = 0; v < V; ++v) offer(b, q[u][v], i + v);
        }
    }
}

// Block-wide best of T threads (all threads get it). `scratch`: T / 32 entries.
template <int T> __device__ __forceinline__ Best block_best(Best b, Best * scratch) {
    b = warp_best(b);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = b;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    return warp_best(lane < T / 32 ? scratch[lane] : Best{-INFINITY, kNone});
}

// One block per row (rows up to kRowMax floats).
template <int V> __global__ void __launch_bounds__(kArgmaxThreads) argmax_row_kernel(const ArgmaxArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ Best scratch[kArgmaxThreads / 32];
    for (int64_t r = blockIdx.x; r < args.nrows; r += gridDim.x) {
        const float * row = reinterpret_cast<const float *>(args.x.row(r));
        const float   x0  = row[0];
        Best          b{-INFINITY, kNone};
        scan<V, kArgmaxThreads>(b, row, 0, args.n, threadIdx.x);
        b = block_best<kArgmaxThreads>(b, scratch);
        if (threadIdx.x == 0) args.out[r] = finish(b, x0);
        __syncthreads();  // scratch is reused for the next row
    }
}

// One cluster of kClusterN CTAs per row (blockIdx.y); CTA `rank` scans the rank-th slice.
template <int V> __global__ void __launch_bounds__(kClusterThr) argmax_cluster_kernel(const ArgmaxArgs args) {
    pdl::launch_dependents();
    pdl::wait();
#if SPARK_ARCH_HOPPER_PLUS
    namespace cg = cooperative_groups;
    __shared__ Best scratch[kClusterThr / 32];
    __shared__ Best ranks[kClusterN];
    // Phase 1 of the "all CTAs have started" barrier, required before touching another CTA's
    // shared memory; its wait comes after the scan, so it costs nothing.
    ptx::barrier_cluster_arrive_relaxed();
    cg::cluster_group cluster = cg::this_cluster();
    const unsigned    rank    = cluster.block_rank();
    const int64_t     r       = blockIdx.y;
    const float *     row     = reinterpret_cast<const float *>(args.x.row(r));
    const float       x0      = rank == 0 && threadIdx.x == 0 ? row[0] : 0.0f;
    // Slice boundaries on multiples of 4 floats (float4 alignment of every slice).
    const int64_t slice = ((args.n + kClusterN - 1) / kClusterN + 3) & ~int64_t(3);
    const int64_t beg   = min(args.n, int64_t(rank) * slice);
    const int64_t end   = min(args.n, beg + slice);
    Best          b{-INFINITY, kNone};
    scan<V, kClusterThr>(b, row, beg, end, threadIdx.x);
    b = block_best<kClusterThr>(b, scratch);
    ptx::barrier_cluster_wait();
    if (threadIdx.x == 0) *cluster.map_shared_rank(&ranks[rank], 0) = b;
    // Release our write to CTA 0, acquire everybody's there.
    ptx::barrier_cluster_arrive_release();
    ptx::barrier_cluster_wait();
    if (rank == 0 && threadIdx.x < 32) {
        b = warp_best(threadIdx.x < kClusterN ? ranks[threadIdx.x] : Best{-INFINITY, kNone});
        if (threadIdx.x == 0) args.out[r] = finish(b, x0);
    }
#endif
}

// ---- pre-sm_90 long rows: chunked two-kernel path

template <int V> __global__ void __launch_bounds__(kArgmaxThreads) argmax_chunks_kernel(const ArgmaxArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ Best scratch[kArgmaxThreads / 32];
    const int64_t c   = blockIdx.x;
    const int64_t beg = c * kChunk;
    const int64_t end = min(args.n, beg + kChunk);
    for (int64_t r = blockIdx.y; r < args.nrows; r += gridDim.y) {
        const float * row = reinterpret_cast<const float *>(args.x.row(r));
        Best          b{-INFINITY, kNone};
        scan<V, kArgmaxThreads>(b, row, beg, end, threadIdx.x);
        b = block_best<kArgmaxThreads>(b, scratch);
        if (threadIdx.x == 0) args.partial[r * args.chunks + c] = b;
        __syncthreads();  // scratch is reused for the next row
    }
}

// One warp per row over its chunk results.
static __global__ void argmax_rows_kernel(const ArgmaxArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t r = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (r >= args.nrows) return;
    const int     lane = threadIdx.x & 31;
    const float * row  = reinterpret_cast<const float *>(args.x.row(r));
    const float   x0   = row[0];
    Best          b{-INFINITY, kNone};
    for (int64_t c = lane; c < args.chunks; c += 32) b = better(b, args.partial[r * args.chunks + c]);
    b = warp_best(b);
    if (lane == 0) args.out[r] = finish(b, x0);
}

}  // namespace spark::cuda::ew
