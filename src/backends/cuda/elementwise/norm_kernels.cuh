// Kernels of the row norms (RMS_NORM, gated RMS_NORM, RMS_NORM of rows split over ranks, L2_NORM, fused
// ADD + RMS_NORM) and of SUM_SQR; launched by norm.cu, also compiled by the CPU warp emulator test
// (dev/kernels/elementwise/emu_test.cpp). See norm.cu.
#pragma once

#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/elementwise/ew_common.cuh"

namespace spark::cuda::ew {

struct NormArgs {
    Rows          x;        // input rows (RMS_NORM / L2_NORM), or `a` of the fused add
    Rows          b;        // fused add: the other addend
    Rows          sum;      // fused add: where a + b goes (the ADD node's output)
    Rows          out;      // normalised rows
    Rows          gate;     // rms_norm_gated (GATE kernels): out = silu(gate) * norm
    // rms_norm_split (RMS_NORM's src3; data nullptr: none): row r's sum of squares over the whole row,
    // whose part on this rank x holds, at sums.row(r)[0]; the mean is over sums_n elements.
    Rows          sums;
    float         sums_n = 0.0f;
    const float * w = nullptr;  // weight [n] or nullptr
    int64_t       n = 0, nrows = 0;
    float         eps = 0.0f;
    float         scale = 1.0f;  // SUM_SQR: the sums' multiplier
    bool          zero_centered = false;
    bool          l2            = false;  // L2_NORM: inv = 1 / sqrt(sum + eps)
    bool          b_one_row     = false;  // fused add: b broadcast over rows
};

__device__ __forceinline__ float4 ld4(const float * p) { return *reinterpret_cast<const float4 *>(p); }
// SWIGLU's expression (binary.cu): silu(g) * v.
__device__ __forceinline__ float  gated(float g, float v) { return g / (1.0f + expf(-g)) * v; }
__device__ __forceinline__ void   st4(float * p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }

// Register-resident row (float4 only): NIT float4 per thread, n <= NIT * G * 4.
template <int G, int NIT, bool ADD, bool GATE = false>
__global__ void __launch_bounds__(G == 32 ? 128 : G) norm_reg_kernel(const NormArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ float scratch[G > 32 ? G / 32 : 1];
    const int     t = G == 32 ? int(threadIdx.x & 31) : int(threadIdx.x);
    const int64_t r = G == 32 ? int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5) : int64_t(blockIdx.x);
    if (G == 32 && r >= args.nrows) return;  // whole warps only: no block-wide barrier in this mode
    const int     n = int(args.n);
    const float * w = args.w;

    // Every load first: weight (independent of the previous kernel), then the row (and the addend).
    float4 wv[NIT], xv[NIT];
    if (w) {
#pragma unroll
        for (int k = 0; k < NIT; ++k) {
            const int i = (k * G + t) * 4;
            if (i < n) wv[k] = ldg4(w + i);
        }
    }
    const float * x = reinterpret_cast<const float *>(args.x.row(r));
#pragma unroll
    for (int k = 0; k < NIT; ++k) {
        const int i = (k * G + t) * 4;
        xv[k]       = i < n ? ld4(x + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    const float given = args.sums.data ? *reinterpret_cast<const float *>(args.sums.row(r)) : 0.0f;
    float4 gv[GATE ? NIT : 1];
    if constexpr (GATE) {
        const float * gr = reinterpret_cast<const float *>(args.gate.row(r));
#pragma unroll
        for (int k = 0; k < NIT; ++k) {
            const int i = (k * G + t) * 4;
            if (i < n) gv[k] = ld4(gr + i);
        }
    }
    if constexpr (ADD) {
        const float * b = reinterpret_cast<const float *>(args.b.row(args.b_one_row ? 0 : r));
        float4        bv[NIT];
#pragma unroll
        for (int k = 0; k < NIT; ++k) {
            const int i = (k * G + t) * 4;
            bv[k]       = i < n ? ld4(b + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        float * s = reinterpret_cast<float *>(args.sum.row(r));
#pragma unroll
        for (int k = 0; k < NIT; ++k) {
            const int i = (k * G + t) * 4;
            xv[k]       = make_float4(xv[k].x + bv[k].x, xv[k].y + bv[k].y, xv[k].z + bv[k].z, xv[k].w + bv[k].w);
            if (i < n) st4(s + i, xv[k]);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < NIT; ++k) ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
    ss = row_sum<G>(ss, scratch);
    if (args.sums.data) ss = given;  // a row split over ranks: every rank's part (after the all-reduce)

    // Same expressions as the CPU backend: mean in float, then 1 / sqrt (IEEE, not rsqrtf).
    const float count = args.sums.data ? args.sums_n : float(n);
    const float inv   = args.l2 ? 1.0f / sqrtf(ss + args.eps) : 1.0f / sqrtf(ss / count + args.eps);
    const bool  zc  = args.zero_centered;
    float *     o   = reinterpret_cast<float *>(args.out.row(r));
#pragma unroll
    for (int k = 0; k < NIT; ++k) {
        const int i = (k * G + t) * 4;
        if (i >= n) continue;
        const float4 u = xv[k];
        float4       v = make_float4(u.x * inv, u.y * inv, u.z * inv, u.w * inv);  // CPU order: (x * inv) * w
        if (w) {
            float4 g = wv[k];
            if (zc) g = make_float4(1.0f + g.x, 1.0f + g.y, 1.0f + g.z, 1.0f + g.w);
            v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
        }
        if constexpr (GATE) v = make_float4(gated(gv[k].x, v.x), gated(gv[k].y, v.y), gated(gv[k].z, v.z), gated(gv[k].w, v.w));
        st4(o + i, v);
    }
}

// Streaming two-pass fallback (misaligned rows, rows over 16384 floats): G threads per row (G == 32:
// rows per block = blockDim.x / 32; G > 32: blockDim.x == G, one row per block). V = 4: float4.
template <int G, int V, bool ADD, bool GATE = false> __global__ void norm_stream_kernel(const NormArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ float scratch[32];
    const int     rows_per_block = G == 32 ? int(blockDim.x) / 32 : 1;
    const int     t              = G == 32 ? int(threadIdx.x & 31) : int(threadIdx.x);
    const int64_t r              = int64_t(blockIdx.x) * rows_per_block + (G == 32 ? int(threadIdx.x >> 5) : 0);
    if (G == 32 && r >= args.nrows) return;
    const int64_t n = args.n;

    const float * x = reinterpret_cast<const float *>(args.x.row(r));
    float *       o = reinterpret_cast<float *>(args.out.row(r));
    const float * src = x;  // what pass 2 normalises
    float         ss  = 0.0f;
    if constexpr (ADD) {
        const float * b = reinterpret_cast<const float *>(args.b.row(args.b_one_row ? 0 : r));
        float *       s = reinterpret_cast<float *>(args.sum.row(r));
        for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
            if constexpr (V == 4) {
                const float4 u = ld4(x + i), v = ld4(b + i);
                const float4 y = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
                st4(s + i, y);
                ss += y.x * y.x + y.y * y.y + y.z * y.z + y.w * y.w;
            } else {
                const float y = x[i] + b[i];
                s[i]          = y;
                ss += y * y;
            }
        }
        src = s;  // pass 2 re-reads this thread's own writes
    } else {
        for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
            if constexpr (V == 4) {
                const float4 u = ld4(x + i);
                ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
            } else {
                ss += x[i] * x[i];
            }
        }
    }
    ss = group_sum<G>(ss, scratch);
    if (args.sums.data) ss = *reinterpret_cast<const float *>(args.sums.row(r));  // (as norm_reg_kernel)

    const float   count = args.sums.data ? args.sums_n : float(n);
    const float   inv   = args.l2 ? 1.0f / sqrtf(ss + args.eps) : 1.0f / sqrtf(ss / count + args.eps);
    const float * gr  = GATE ? reinterpret_cast<const float *>(args.gate.row(r)) : nullptr;
    const float * w   = args.w;
    const bool    zc  = args.zero_centered;
    for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
        if constexpr (V == 4) {
            const float4 u = ld4(src + i);
            float4       v = make_float4(u.x * inv, u.y * inv, u.z * inv, u.w * inv);
            if (w) {
                float4 g = ld4(w + i);
                if (zc) g = make_float4(1.0f + g.x, 1.0f + g.y, 1.0f + g.z, 1.0f + g.w);
                v = make_float4(v.x * g.x, v.y * g.y, v.z * g.z, v.w * g.w);
            }
            if constexpr (GATE) {
                const float4 g = ld4(gr + i);
                v              = make_float4(gated(g.x, v.x), gated(g.y, v.y), gated(g.z, v.z), gated(g.w, v.w));
            }
            st4(o + i, v);
        } else {
            float v = src[i] * inv;
            if (w) v *= zc ? (1.0f + w[i]) : w[i];
            if constexpr (GATE) v = gated(gr[i], v);
            o[i] = v;
        }
    }
}

// SUM_SQR: out.row(r)[0] = scale * (sum of squares of row r), a [1, rows] output: the part of a split
// RMS_NORM's sums this rank holds (summed over the ranks by an ALL_REDUCE; the norm then reads them as
// NormArgs::sums). G threads per row as in norm_stream_kernel (G == 32: blockDim.x / 32 rows per
// block; G > 32: blockDim.x == G, one row per block); V = 4: float4.
template <int G, int V> __global__ void sum_sqr_kernel(const NormArgs args) {
    pdl::launch_dependents();
    pdl::wait();
    __shared__ float scratch[32];
    const int     rows_per_block = G == 32 ? int(blockDim.x) / 32 : 1;
    const int     t              = G == 32 ? int(threadIdx.x & 31) : int(threadIdx.x);
    const int64_t r              = int64_t(blockIdx.x) * rows_per_block + (G == 32 ? int(threadIdx.x >> 5) : 0);
    if (G == 32 && r >= args.nrows) return;
    const int64_t n  = args.n;
    const float * x  = reinterpret_cast<const float *>(args.x.row(r));
    float         ss = 0.0f;
    for (int64_t i = int64_t(t) * V; i < n; i += int64_t(G) * V) {
        if constexpr (V == 4) {
            const float4 u = ld4(x + i);
            ss += u.x * u.x + u.y * u.y + u.z * u.z + u.w * u.w;
        } else {
            ss += x[i] * x[i];
        }
    }
    ss = group_sum<G>(ss, scratch);
    if (t == 0) *reinterpret_cast<float *>(args.out.row(r)) = ss * args.scale;
}

}  // namespace spark::cuda::ew
