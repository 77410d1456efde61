// Decode GEMV (1..8 activation rows): bandwidth-bound, weights dequantized in registers.
//
// Work mapping. A block has 8 warps; `wk` of them split K (interleaved 512-byte segments of a row)
// and the 8 / wk groups take different weight rows, U rows per warp (gemv_rows_per_warp). Lane l of
// K-warp kw reads chunk c = c_begin + 32 kw + l, then steps by 32 wk chunks: per step a lane issues
// U (gate+up: 2U) independent 16-byte streaming loads (ld.global.nc.L1::no_allocate, L2
// evict_first) plus the chunk's scale bytes, so a warp moves U x 512 contiguous bytes per step.
// Each decoded weight is used for all R activation rows (x read as float4 from L1/L2, reused across
// the U rows of the step). Accumulation is f32: per scale group a partial dot of exact decoded values
// (formats.cuh), then acc += factor * partial. Lanes reduce by shuffles, K-warps through shared
// memory in a fixed order; K split across blocks (gridDim.y > 1, skinny shapes) writes partials that
// gemv_splitk_reduce sums in order. Everything is deterministic.
//
// MATMUL_ID: gridDim.z = k_slots * T pairs; a block reads its pair's expert id and DeviceWeight from
// the device (one launch for all routed experts of all tokens, R = 1).
#pragma once

#include "backends/cuda/matmul/formats.cuh"
#include "backends/cuda/matmul/launch.h"

namespace spark::cuda::mm {

template <class F, int R, int U, int NW>
__device__ __forceinline__ void gemv_chunk(const uint4 (&raw)[NW][U], const typename F::Sc (&sc)[NW][U],
                                           const float * const (&xr)[R], int64_t k0, float (&acc)[NW][U][R]) {
    float tmp[NW][U][R];
#pragma unroll
    for (int s = 0; s < F::NSUB; ++s) {
        float xv[R][F::SUB];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4 * xp = reinterpret_cast<const float4 *>(xr[r] + k0 + s * F::SUB);
#pragma unroll
            for (int q = 0; q < F::SUB / 4; ++q) {
                const float4 t    = __ldg(xp + q);
                xv[r][4 * q]     = t.x;
                xv[r][4 * q + 1] = t.y;
                xv[r][4 * q + 2] = t.z;
                xv[r][4 * q + 3] = t.w;
            }
        }
        if constexpr (F::SPS > 0) {
            if (s % F::SPS == 0) {
#pragma unroll
                for (int i = 0; i < NW; ++i)
#pragma unroll
                    for (int u = 0; u < U; ++u)
#pragma unroll
                        for (int r = 0; r < R; ++r) tmp[i][u][r] = 0.0f;
            }
        }
#pragma unroll
        for (int i = 0; i < NW; ++i)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                float v[F::SUB];
                F::sub(raw[i][u], s, sc[i][u], v);
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int e = 0; e < F::SUB; ++e) {
                        if constexpr (F::SPS > 0)
                            tmp[i][u][r] = fmaf(v[e], xv[r][e], tmp[i][u][r]);
                        else
                            acc[i][u][r] = fmaf(v[e], xv[r][e], acc[i][u][r]);
                    }
            }
        if constexpr (F::SPS > 0) {
            if (s % F::SPS == F::SPS - 1) {
#pragma unroll
                for (int i = 0; i < NW; ++i)
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const float f = F::factor(sc[i][u], s / F::SPS);
#pragma unroll
                        for (int r = 0; r < R; ++r) acc[i][u][r] = fmaf(f, tmp[i][u][r], acc[i][u][r]);
                    }
            }
        }
    }
}

template <class F, int R, bool GLU>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(const GemvArgs a) {
    constexpr int NW = GLU ? 2 : 1;
    constexpr int U  = gemv_rows_per_warp(R, NW, F::E);
    constexpr int kWarps = kGemvThreads / 32;

    const int     lane   = int(threadIdx.x) & 31;
    const int     warp   = int(threadIdx.x) >> 5;
    const int     wk     = a.wk;
    const int     kw     = warp % wk;
    const int64_t n_base = int64_t(blockIdx.x) * ((kWarps / wk) * U) + (warp / wk) * U;
    const int64_t N      = a.n;
    const int64_t KC     = a.k / F::E;

    DeviceWeight  w[NW];
    const float * xr[R];
    int64_t       out_row0 = 0;
    bool          valid    = true;
    if (a.table[0] != nullptr) {
        const int     pair = int(blockIdx.z);
        const int     j = pair % a.ids.k_slots, t = pair / a.ids.k_slots;
        const int32_t e = __ldg(a.ids.p + j * a.ids.s0 + t * a.ids.s1);
        valid           = e >= 0 && e < a.ids.n_experts;
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.table[i][valid ? e : 0];
#pragma unroll
        for (int r = 0; r < R; ++r) xr[r] = a.xbase + j * a.x_sj + t * a.x_st;
        out_row0 = pair;
    } else {
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.w[i];
#pragma unroll
        for (int r = 0; r < R; ++r) xr[r] = a.x[r];
    }

    const int64_t c_begin = int64_t(blockIdx.y) * a.chunks_per_split;
    const int64_t c_end   = valid ? min(KC, c_begin + a.chunks_per_split) : c_begin;

    int64_t         nrow[U];
    const uint8_t * rowp[NW][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        nrow[u] = min(n_base + u, N - 1);  // rows past N load row N - 1 and are not stored
#pragma unroll
        for (int i = 0; i < NW; ++i) rowp[i][u] = static_cast<const uint8_t *>(w[i].data) + nrow[u] * KC * 16;
    }

    float acc[NW][U][R];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[i][u][r] = 0.0f;

    const uint64_t policy = l2_evict_first_policy();
    for (int64_t c = c_begin + kw * 32 + lane; c < c_end; c += int64_t(wk) * 32) {
        uint4          raw[NW][U];
        typename F::Sc sc[NW][U];
#pragma unroll
        for (int i = 0; i < NW; ++i)
#pragma unroll
            for (int u = 0; u < U; ++u) raw[i][u] = ld_stream_v4(rowp[i][u] + c * 16, policy);
#pragma unroll
        for (int i = 0; i < NW; ++i)
#pragma unroll
            for (int u = 0; u < U; ++u) sc[i][u] = F::load_scale(w[i], nrow[u], c, w[i].global_scale);
        gemv_chunk<F, R, U, NW>(raw, sc, xr, c * F::E, acc);
    }

#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[i][u][r] = warp_sum(acc[i][u][r]);

    if (wk > 1) {
        __shared__ float red[kWarps][NW][U][R];
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) red[warp][i][u][r] = acc[i][u][r];
        }
        __syncthreads();
        if (kw != 0) return;
        for (int q = 1; q < wk; ++q)
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[i][u][r] += red[warp + q][i][u][r];
    }
    if (lane != 0) return;

    const int rows = a.table[0] != nullptr ? 1 : a.rows;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t n = n_base + u;
        if (n >= N) continue;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (r >= rows) continue;
            const int64_t row = out_row0 + r;
            if (a.partial != nullptr) {
#pragma unroll
                for (int i = 0; i < NW; ++i)
                    a.partial[((int64_t(blockIdx.y) * NW + i) * a.out_rows + row) * N + n] = acc[i][u][r];
            } else if constexpr (GLU) {
                a.y[row * N + n] = silu(acc[0][u][r]) * acc[1][u][r];
            } else {
                a.y[row * N + n] = acc[0][u][r];
            }
        }
    }
}

template <class F>
void gemv_launch(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s) {
    const dim3 block(kGemvThreads);
#define SPARK_GEMV_CASE(R)                                                              \
    case R:                                                                             \
        if (glu)                                                                        \
            gemv_kernel<F, R, true><<<grid, block, 0, s>>>(a);                          \
        else                                                                            \
            gemv_kernel<F, R, false><<<grid, block, 0, s>>>(a);                         \
        return;
    switch (r_tmpl) {
        SPARK_GEMV_CASE(1)
        SPARK_GEMV_CASE(2)
        SPARK_GEMV_CASE(4)
        SPARK_GEMV_CASE(8)
        default: break;
    }
#undef SPARK_GEMV_CASE
}

}  // namespace spark::cuda::mm
