// The W4A4 NVFP4 GEMM kernel for sm_120a / sm_121a (device code; the launcher is
// fp4/gemm_w4a4_sm120.cu, compiled only for those targets, and the CPU warp emulator runs this
// header too: dev/kernels/fp4/emu_w4a4.cpp):
// y[r][n] = alpha * sum_k A[r][k] W[n][k], both operands E2M1 with one E4M3 scale per 16 K-elements,
// on the block-scaled tensor-core MMA m16n8k64 (kind::mxf4nvf4, scale_vec::4X, ue4m3).
//
// The weight is the MMA's A operand (16 output features per MMA) and the activations its B
// operand (8 tokens per MMA): at decode and verify batch sizes the 8-wide N side is the small one.
// Fragments come straight from global memory in the device layouts (weight codes [rows][K/2]
// row-major or in 16 x 128 tiles, device_weight.h; scales [rows][K/16]; activations row-major): for
// every MMA a lane reads four 32-bit words of weight codes (its rows g and g + 8, K offsets 8t and
// 32 + 8t), two of activation codes and one 32-bit word (four scales) per operand. A warp's weight
// loads cover 16 rows x 32 contiguous bytes per K step (whole 32-byte sectors, through L1; a 64-byte
// row block of a tile holds two steps). No shared memory, no barriers: a warp owns an MT x NT grid of 16x8 tiles and walks
// K; blocks of WARPS_M x WARPS_N warps tile N x rows. The float32 accumulators are scaled by
// alpha = a_global * w.global_scale once at the end.
//
// Out-of-range tile rows (N or rows not a multiple of the tile) load a clamped, valid row and are
// never stored. Never run on an sm_120 GPU (none was available): see docs/SM120.md, which also says
// what the emulator checks.
#pragma once

#include "backends/cuda/common/arch.h"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm120.cuh"
#include "backends/cuda/device_weight.h"

#include <cstdint>

namespace spark::cuda::fp4 {

struct W4A4Args {
    const uint8_t * w_codes;   // [N][K/2], in the order of w4_byte_index(w_tiled, ...)
    const uint8_t * w_scales;  // [N][K/16]
    const uint8_t * a_codes;   // [R][K/2]
    const uint8_t * a_scales;  // [R][K/16]
    float *         y;         // [R][y_stride]
    int64_t         n, k, rows, y_stride;
    float           alpha;
    bool            w_tiled;
};

__device__ __forceinline__ uint32_t w4a4_ld_u32(const uint8_t * p) { return __ldg(reinterpret_cast<const unsigned int *>(p)); }

template <int MT, int NT, int WARPS_M, int WARPS_N>
__global__ void __launch_bounds__(32 * WARPS_M * WARPS_N) gemm_w4a4_kernel(const W4A4Args args) {
    pdl::launch_dependents();
    pdl::wait();
#if SPARK_ARCH_FP4_MMA_SYNC
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int g    = lane >> 2;  // row within an 8-row group
    const int t    = lane & 3;   // thread in the quad: K offset 8t
    const int64_t m0 = (int64_t(blockIdx.x) * WARPS_M + warp % WARPS_M) * (MT * 16);  // first weight row of the warp
    const int64_t n0 = (int64_t(blockIdx.y) * WARPS_N + warp / WARPS_M) * (NT * 8);   // first token of the warp
    const int64_t code_stride  = args.k / 2;
    const int64_t scale_stride = args.k / 16;

    // Row pointers, clamped to the last valid row (those tiles are computed but not stored).
    const uint8_t * wc[MT][2];
    const uint8_t * ws[MT];
    const uint8_t * ac[NT];
    const uint8_t * as[NT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        const int64_t r_lo = min(m0 + 16 * i + g, args.n - 1);
        const int64_t r_hi = min(m0 + 16 * i + g + 8, args.n - 1);
        const int64_t r_sf = min(m0 + 16 * i + g + 8 * (lane & 1), args.n - 1);
        wc[i][0]           = args.w_codes + w4_byte_index(args.w_tiled, r_lo, 0, code_stride) + 4 * t;
        wc[i][1]           = args.w_codes + w4_byte_index(args.w_tiled, r_hi, 0, code_stride) + 4 * t;
        ws[i]              = args.w_scales + r_sf * scale_stride;
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int64_t tok = min(n0 + 8 * j + g, args.rows - 1);
        ac[j]             = args.a_codes + tok * code_stride + 4 * t;
        as[j]             = args.a_scales + tok * scale_stride;
    }

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;

    const int64_t steps = args.k / 64;
#pragma unroll 2
    for (int64_t s = 0; s < steps; ++s) {
        const int64_t cb = s * 32;  // code bytes of this K step (64 codes)
        const int64_t sb = s * 4;   // scale bytes of this K step (4 blocks)
        const int64_t wb = w4_byte_index(args.w_tiled, 0, cb, code_stride);  // (a tile's 64-byte row block: two steps)
        uint32_t      a[MT][4], b[NT][2], sfa[MT], sfb[NT];
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            a[i][0] = w4a4_ld_u32(wc[i][0] + wb);
            a[i][1] = w4a4_ld_u32(wc[i][1] + wb);
            a[i][2] = w4a4_ld_u32(wc[i][0] + wb + 16);
            a[i][3] = w4a4_ld_u32(wc[i][1] + wb + 16);
            sfa[i]  = w4a4_ld_u32(ws[i] + sb);
        }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            b[j][0] = w4a4_ld_u32(ac[j] + cb);
            b[j][1] = w4a4_ld_u32(ac[j] + cb + 16);
            sfb[j]  = w4a4_ld_u32(as[j] + sb);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) ptx::mma_m16n8k64_nvf4(acc[i][j], a[i], b[j], sfa[i], sfb[j]);
    }

    // d[0] = (feature g, token 2t), d[1] = (g, 2t+1), d[2] = (g+8, 2t), d[3] = (g+8, 2t+1).
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int64_t feat = m0 + 16 * i + g + 8 * (q >> 1);
                const int64_t tok  = n0 + 8 * j + 2 * t + (q & 1);
                if (feat < args.n && tok < args.rows) args.y[tok * args.y_stride + feat] = acc[i][j][q] * args.alpha;
            }
#endif
}

// The launch configurations (gemm_w4a4_sm120.cu picks one by the token count; the emulator runs
// both): decode / small verify batches (<= kW4A4SmallRows tokens: one 16x8 tile per warp, 64 weight
// rows per block, so even N = 2048 spreads over 32 blocks) and larger batches (a 2x4 grid of tiles
// per warp, 2x2 warps: 64 features x 64 tokens per block, each weight fragment reused by 4 MMAs and
// each activation fragment by 2).
template <int MT_, int NT_, int WARPS_M_, int WARPS_N_> struct W4A4Config {
    static constexpr int MT = MT_, NT = NT_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
    static constexpr int kThreads = 32 * WARPS_M * WARPS_N;
    static constexpr int kFeatures = MT * 16 * WARPS_M;  // weight rows per block (grid x)
    static constexpr int kTokens   = NT * 8 * WARPS_N;   // tokens per block (grid y)
};
using W4A4Small = W4A4Config<1, 1, 4, 1>;
using W4A4Large = W4A4Config<2, 4, 2, 2>;
constexpr int kW4A4SmallRows = 8;

}  // namespace spark::cuda::fp4
