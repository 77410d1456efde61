// The small kernels around the matmuls: activation staging (F32 rows for the GEMV, row-scaled F16
// rows for the GEMM, both applying act-order permutations), the device-built MoE grouping of the
// grouped GEMM, the unfused SwiGLU, and the generic per-element fallback.
#include "backends/cuda/common/launch.h"
#include "backends/cuda/common/math.cuh"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/cuda_common.h"
#include "backends/cuda/matmul/formats.cuh"
#include "backends/cuda/matmul/matmul.h"

#include <algorithm>

namespace spark::cuda::mm {

namespace {

__device__ __forceinline__ const float * x_row(const XRows & x, int64_t r) {
    if (x.k_slots > 0) {
        const int64_t j = r % x.k_slots, t = r / x.k_slots;
        return reinterpret_cast<const float *>(x.base + j * x.nb1 + t * x.nb2);
    }
    const int64_t i1 = r % x.ne1, i2 = (r / x.ne1) % x.ne2, i3 = r / (x.ne1 * x.ne2);
    return reinterpret_cast<const float *>(x.base + i1 * x.nb1 + i2 * x.nb2 + i3 * x.nb3);
}

__device__ __forceinline__ int32_t pair_expert(const Ids & ids, int64_t p) {
    const int64_t j = p % ids.k_slots, t = p / ids.k_slots;
    return __ldg(ids.p + j * ids.s0 + t * ids.s1);
}

// Whether expert e computes the pairs routed to it: an id in range and, where some expert is absent
// (expert parallelism: Ids::held set), one this device holds. Other pairs output 0.
__device__ __forceinline__ bool expert_ok(const Ids & ids, int32_t e) {
    return e >= 0 && e < ids.n_experts && (ids.held == nullptr || ids.held[e].data != nullptr);
}

// Permutation for row `pair` (pair mode with an expert table) or the single `perm`.
__device__ __forceinline__ const int32_t * row_perm(const int32_t * perm, const DeviceWeight * table, const Ids & ids,
                                                    int64_t pair) {
    if (table == nullptr) return perm;
    const int32_t e = pair_expert(ids, pair);
    return (e >= 0 && e < ids.n_experts) ? table[e].perm : nullptr;
}

// One block per output row.
__global__ void x_to_f32_kernel(const XRows x, int64_t k, const int32_t * perm, const DeviceWeight * table, const Ids ids,
                                float * out) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t   r  = blockIdx.x;
    const float *   src = x_row(x, r);
    const int32_t * p   = row_perm(perm, table, ids, r);
    float *         dst = out + r * k;
    for (int64_t i = threadIdx.x; i < k; i += blockDim.x) dst[i] = src[p ? __ldg(p + i) : i];
}

constexpr int kXF16Threads = 256;

// One block per output row: the row's power-of-two scale (from the maximum |x| over its finite
// elements), then the scaled F16 row. Pass 1 reads the source row in storage order (the maximum does
// not depend on the permutation); pass 2 reads it again (from L1/L2) in the permuted order.
__global__ void __launch_bounds__(kXF16Threads) x_to_f16_kernel(const XRows x, int64_t k, const int32_t * perm,
                                                                const int32_t * order, const int32_t * rows_valid,
                                                                const DeviceWeight * table, const Ids ids, uint16_t * out,
                                                                float * inv_scale) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ uint32_t warp_max[kXF16Threads / 32];
    const int64_t   r    = blockIdx.x;
    if (rows_valid != nullptr && r >= __ldg(rows_valid)) return;
    const int64_t   pair = order ? int64_t(__ldg(order + r)) : r;
    const float *   src  = x_row(x, pair);
    const int32_t * p    = row_perm(perm, table, ids, pair);
    uint16_t *      dst  = out + r * k;

    // Max |x| as a bit pattern: for non-negative floats the integer order is the value order; inf and
    // NaN (bits >= 0x7F800000) are left out, so they neither set the scale nor get clamped.
    uint32_t m = 0;
    for (int64_t i = threadIdx.x; i < k; i += kXF16Threads) {
        const uint32_t b = __float_as_uint(src[i]) & 0x7FFFFFFFu;
        if (b < 0x7F800000u) m = max(m, b);
    }
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kXF16Threads / 32; ++i) m = max(m, warp_max[i]);

    // s = 2^p with max in [2^e, 2^(e + 1)) -> max * s in [2^13, 2^14). e >= -149 (subnormal max:
    // e = floor(log2) of its integer mantissa - 149), e <= 127, so p = 13 - e >= -114; p is capped at
    // 126 so that s and 1 / s are normal f32 (rows with max < 2^-113 keep their values below 2^14
    // anyway). An all-zero (or all non-finite) row: s = 1.
    int pw = 0;
    if (m != 0) {
        const int e = m >= 0x00800000u ? int(m >> 23) - 127 : (31 - __clz(int(m))) - 149;
        pw          = min(13 - e, 126);
    }
    const float s = __int_as_float((127 + pw) << 23);
    if (threadIdx.x == 0) inv_scale[r] = __int_as_float((127 - pw) << 23);

    // Two elements per thread and step (k is even on this path: k % 32 == 0). x * s is exact (a power
    // of two; a product that underflows f32 is far below f16's subnormals too), |x * s| < 2^14 for
    // finite x, so the f16 rounding is the only one and never overflows; inf / NaN stay inf / NaN.
    for (int64_t i = 2 * int64_t(threadIdx.x); i < k; i += 2 * int64_t(kXF16Threads)) {
        const float   v0 = src[p ? __ldg(p + i) : i] * s;
        const float   v1 = src[p ? __ldg(p + i + 1) : i + 1] * s;
        const __half2 h  = __floats2half2_rn(v0, v1);
        *reinterpret_cast<uint32_t *>(dst + i) = *reinterpret_cast<const uint32_t *>(&h);
    }
}

// Block-wide exclusive scan of one int per thread (blockDim.x == 1024); returns the total.
__device__ int32_t block_exclusive_scan(int32_t v, int32_t & exclusive, int32_t * warp_sums) {
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    int32_t   incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int32_t t = __shfl_up_sync(0xFFFFFFFFu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int32_t s = warp_sums[lane];
        int32_t sincl = s;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t t = __shfl_up_sync(0xFFFFFFFFu, sincl, o);
            if (lane >= o) sincl += t;
        }
        warp_sums[lane] = sincl - s;  // exclusive prefix of the warp totals
        if (lane == 31) warp_sums[32] = sincl;
    }
    __syncthreads();
    exclusive           = warp_sums[warp] + incl - v;
    const int32_t total = warp_sums[32];
    __syncthreads();  // warp_sums is reused by the next scan
    return total;
}

constexpr int kRouteThreads    = 1024;
constexpr int kRouteMaxExperts = 4096;  // experts per thread: up to 4

// One block: count pairs per expert, scan, emit the tile table, scatter pairs by expert. Experts are
// handled kPerThread per thread (contiguous), pairs in a strided loop. The order of the pairs of one
// expert follows shared-memory atomics (not stable); each output row is computed independently of
// its position in a tile, so results do not depend on it.
__global__ void __launch_bounds__(kRouteThreads) moe_route_kernel(const Ids ids, int64_t pairs, int32_t bm, int64_t max_tiles,
                                                                  int32_t * offsets, int32_t * order, int32_t * tiles,
                                                                  int32_t * n_tiles) {
    pdl::launch_dependents();
    pdl::wait();
    extern __shared__ int32_t sm[];
    const int E = ids.n_experts;
    int32_t * cnt  = sm;        // [E]
    int32_t * fill = sm + E;    // [E]
    __shared__ int32_t warp_sums[33];

    for (int e = int(threadIdx.x); e < E; e += kRouteThreads) cnt[e] = 0;
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += kRouteThreads) {
        const int32_t e = pair_expert(ids, p);
        if (expert_ok(ids, e)) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();

    constexpr int kPer = kRouteMaxExperts / kRouteThreads;
    const int     e0   = int(threadIdx.x) * kPer;
    int32_t       c[kPer], t[kPer], csum = 0, tsum = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        c[i] = e0 + i < E ? cnt[e0 + i] : 0;
        t[i] = (c[i] + bm - 1) / bm;
        csum += c[i];
        tsum += t[i];
    }
    int32_t cex = 0, tex = 0;
    const int32_t total_rows  = block_exclusive_scan(csum, cex, warp_sums);
    const int32_t total_tiles = block_exclusive_scan(tsum, tex, warp_sums);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int e = e0 + i;
        if (e < E) {
            offsets[e] = cex;
            fill[e]    = cex;
            for (int32_t j = 0; j < t[i] && tex + j < max_tiles; ++j) {
                tiles[2 * (tex + j)]     = e;
                tiles[2 * (tex + j) + 1] = cex + j * bm;
            }
        }
        cex += c[i];
        tex += t[i];
    }
    if (threadIdx.x == 0) {
        offsets[E] = total_rows;
        *n_tiles   = int32_t(min(int64_t(total_tiles), max_tiles));
    }
    __syncthreads();
    for (int64_t p = threadIdx.x; p < pairs; p += kRouteThreads) {
        const int32_t e = pair_expert(ids, p);
        if (expert_ok(ids, e)) order[atomicAdd(&fill[e], 1)] = int32_t(p);
    }
}

__global__ void zero_invalid_pairs_kernel(const Ids ids, int64_t pairs, int64_t n, float * y) {
    pdl::launch_dependents();
    pdl::wait();
    const int64_t p = blockIdx.x;
    if (p >= pairs) return;
    if (expert_ok(ids, pair_expert(ids, p))) return;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) y[p * n + i] = 0.0f;
}

__global__ void swiglu_kernel(const float * gate, const float * up, int64_t count, float * out) {
    pdl::launch_dependents();
    pdl::wait();
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        out[i] = silu(gate[i]) * up[i];
}

// One warp per output element (row r, column n): lanes stride K with the exact per-element decode.
__global__ void generic_kernel(const GenericArgs a) {
    pdl::launch_dependents();
    pdl::wait();
    const int     lane = int(threadIdx.x) & 31;
    const int64_t n    = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (n >= a.n) return;
    for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    const float * x  = x_row(a.x, r);
    const int     nw = a.glu ? 2 : 1;
    float         acc[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (i >= nw) break;
        DeviceWeight w;
        if (a.table[0] != nullptr) {
            const int32_t e = pair_expert(a.ids, r);
            if (e < 0 || e >= a.ids.n_experts || a.table[i][e].data == nullptr) {  // (or absent: Ids::held)
                acc[i] = 0.0f;
                continue;
            }
            w = a.table[i][e];
        } else {
            w = a.w[i];
        }
        float s = 0.0f;
        for (int64_t k = lane; k < a.k; k += 32) s = fmaf(weight_at(w, n, k), x[w.perm ? __ldg(w.perm + k) : k], s);
        acc[i] = warp_sum(s);
    }
    if (lane == 0) a.y[r * a.n + n] = a.glu ? silu(acc[0]) * acc[1] : acc[0];
    }
}

int grid_for(int64_t count, int threads) {
    return int(std::min<int64_t>(std::max<int64_t>(1, (count + threads - 1) / threads), 4096));
}

}  // namespace

void x_to_f32_rows(const XRows & x, int64_t rows, int64_t k, const int32_t * perm, const DeviceWeight * table,
                   const Ids & ids, float * out, cudaStream_t s) {
    if (rows <= 0) return;
    launch(x_to_f32_kernel, unsigned(rows), 256, 0, s, x, k, perm, table, ids, out);
    SPARK_CUDA_CHECK_LAUNCH();
}

void x_to_f16_rows(const XRows & x, int64_t rows, int64_t k, const int32_t * perm, const int32_t * order,
                   const int32_t * rows_valid, const DeviceWeight * table, const Ids & ids, uint16_t * out,
                   float * inv_scale, cudaStream_t s) {
    if (rows <= 0) return;
    launch(x_to_f16_kernel, unsigned(rows), kXF16Threads, 0, s, x, k, perm, order, rows_valid, table, ids, out, inv_scale);
    SPARK_CUDA_CHECK_LAUNCH();
}

void moe_route(const Ids & ids, int64_t n_tok, int32_t bm, int64_t max_tiles, int32_t * offsets, int32_t * order,
               int32_t * tiles, int32_t * n_tiles, cudaStream_t s) {
    if (ids.n_experts > kRouteMaxExperts)
        fail(SPARK_ERR_UNSUPPORTED, "matmul_id: %d experts (the grouped GEMM takes at most %d)", ids.n_experts, kRouteMaxExperts);
    const size_t smem = size_t(ids.n_experts) * 2 * sizeof(int32_t);
    launch(moe_route_kernel, 1, kRouteThreads, smem, s, ids, int64_t(ids.k_slots) * n_tok, bm, max_tiles, offsets, order, tiles,
                                                   n_tiles);
    SPARK_CUDA_CHECK_LAUNCH();
}

void zero_invalid_pairs(const Ids & ids, int64_t n_tok, int64_t n, float * y, cudaStream_t s) {
    const int64_t pairs = int64_t(ids.k_slots) * n_tok;
    if (pairs <= 0) return;
    launch(zero_invalid_pairs_kernel, unsigned(pairs), 128, 0, s, ids, pairs, n, y);
    SPARK_CUDA_CHECK_LAUNCH();
}

void swiglu_rows(const float * gate, const float * up, int64_t count, float * out, cudaStream_t s) {
    if (count <= 0) return;
    launch(swiglu_kernel, grid_for(count, 256), 256, 0, s, gate, up, count, out);
    SPARK_CUDA_CHECK_LAUNCH();
}

void generic_matmul(const GenericArgs & a, cudaStream_t s) {
    if (a.rows <= 0 || a.n <= 0) return;
    constexpr int kWarps = 8;
    const dim3    grid(unsigned((a.n + kWarps - 1) / kWarps), unsigned(std::min<int64_t>(a.rows, 65535)));
    launch(generic_kernel, grid, kWarps * 32, 0, s, a);
    SPARK_CUDA_CHECK_LAUNCH();
}

}  // namespace spark::cuda::mm
