// Prefill GEMM (more than 8 rows): mma.sync m16n8k16 F16 -> F32 on every target (sm_80+).
//
//   y[m][n] = inv_scale[m] * sum_k a[m][k] * W[n][k]   (* the NVFP4 global scale),
//   a = activations converted to F16 by x_to_f16_rows: row m multiplied by a power of two s_m = 1 /
//   inv_scale[m] chosen so that max |a[m][.]| <= 2^14 (no f16 overflow, values down to 2^-27 of the
//   row's maximum stay normal; exact in f32, so the epilogue's inv_scale undoes it exactly), and
//   permuted for act-order weights; W dequantized tile by tile into shared memory as F16.
// F16 (11 significant bits) instead of BF16 (8): the operand rounding error is 8x smaller at the same
// tensor-core throughput; the price is f16's range, which the activations' row scale and the
// weights' saturation below cover.
//
// Block: 8 warps (2 along M x 4 along N), tile BM x 128 (BM = 32 MT), K in stages of 32. Shared
// memory rows are 32 F16 + 8 padding (80 bytes), so ldmatrix and the 16-byte stores hit 8 distinct
// 16-byte bank groups. Two stages: while the tensor cores work on stage s, the activation tile of
// s + 1 arrives by cp.async and the weight chunks of s + 1 are loaded into registers (16 bytes per
// thread and chunk), then decoded (formats.cuh: exact value * factor in f32) and rounded once to F16
// with saturation (cvt.rn.satfinite: |v| > 65504 becomes +-65504, NaN stays NaN) while stored to the
// other buffer. F16 weights skip the decode: cp.async straight into shared memory. Per format:
//   F16      the value (cp.async)
//   BF16     the value; exact in f16 for 2^-14 <= |w| <= 65504. Smaller ones become f16 subnormals
//            (absolute error <= 2^-25 = 3e-8, negligible next to typical |w| ~ 1e-2; |w| <= 2^-25
//            becomes 0), larger ones saturate to +-65504 (not seen in trained projection weights)
//   F32      rounded once to f16 (same ranges)
//   INT4     (q - z) * scale, exact in f32 (|q - z| <= 15 times an f16 or bf16 scale), rounded once;
//            a bf16 scale is not range-checked at upload: a product beyond 65504 saturates
//   NVFP4    e2m1 * e4m3, exact in f16 (|v| <= 6 * 448 = 2688, nonzero |v| >= 0.5 * 2^-9 = 2^-10
//            is normal); the per-tensor global scale multiplies the f32 accumulators in the epilogue
//   FP8      e4m3 * f32 block scale, rounded once (saturating)
//
// Fused gate/up (GLU): shared-memory weight rows 0-63 are gate rows n0..n0+63 and rows 64-127 the
// same up rows; warp wn owns gate columns [16 wn, 16 wn + 16) and the matching up columns, so
// silu(gate) * up is formed in registers, after each accumulator got its row's inv_scale.
//
// Grouped (MATMUL_ID): block x indexes the device-built tile table (expert, first row); rows past
// the expert's end are zero-filled and not stored; a row's inv_scale is indexed by its sorted row
// (the row of `a`), its output row = out_rows[sorted row].
//
// Multi-weight (q/k/v at prefill): the column tiles of up to 4 weights of one format and K side by
// side in grid y, over one F16 conversion of the activations; each block finds its weight.
//
// Split K (plan_gemm): blockIdx.z takes a range of K stages; the partial accumulators go to a
// workspace, and the last block of a tile to arrive (arrival counter) adds them in split order -
// deterministic, whichever block finishes last - and writes the output. It fills the SMs when the
// tiles alone would leave them idle (q/o/down projections at 512 rows: 128 tiles on 132 SMs).
#pragma once

#include "backends/cuda/common/launch.h"
#include "backends/cuda/common/math.cuh"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm80.cuh"
#include "backends/cuda/matmul/formats.cuh"
#include "backends/cuda/matmul/matmul.h"

namespace spark::cuda::mm {

constexpr int kGemmLds = kGemmBK + 8;  // shared-memory row length in F16 elements (80 bytes)

// A short pause in the split-K wait loop (nanosleep: the waiting warp leaves the issue slots to the
// block's other warps and the SM's other block).
__device__ __forceinline__ void gemm_backoff() {
#if SPARK_ARCH_AMPERE_PLUS
    __nanosleep(64);
#endif
}

template <class F, int MT, bool GLU>
__global__ void __launch_bounds__(kGemmThreads, gemm_min_blocks(MT)) gemm_kernel(const GemmArgs a) {
    pdl::launch_dependents();
    pdl::wait();
    constexpr int  BM     = gemm_bm(MT);
    constexpr int  BN     = 128;  // weight rows in shared memory per stage
    constexpr int  NOUT   = gemm_bn(GLU);
    constexpr int  NW     = GLU ? 2 : 1;
    constexpr bool kDirect = F::kFormat == WeightFormat::F16;
    constexpr int  CPR    = kGemmBK / F::E;  // weight chunks per row and stage
    constexpr int  BCH    = BN * CPR;        // weight chunks per stage
    constexpr int  CPT    = (BCH + kGemmThreads - 1) / kGemmThreads;

    __shared__ alignas(16) uint16_t sA[2][BM][kGemmLds];
    __shared__ alignas(16) uint16_t sB[2][BN][kGemmLds];
    __shared__ uint32_t             s_last_split;  // split-K: this block arrived last at its tile

    const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
    const int wm = warp / 4, wn = warp % 4;

    DeviceWeight w[NW];
    int64_t      row0, row_end;
    int64_t      N      = a.n;
    float *      Y      = a.y;
    int64_t      tile_n = blockIdx.y;  // column tile within the block's weight
    if (a.tiles != nullptr) {
        if (int(blockIdx.x) >= __ldg(a.n_tiles)) return;
        const int e = __ldg(a.tiles + 2 * blockIdx.x);
        row0        = __ldg(a.tiles + 2 * blockIdx.x + 1);
        row_end     = __ldg(a.expert_end + e);
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.table[i][e];
    } else {
        row0    = int64_t(blockIdx.x) * BM;
        row_end = a.m;
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.w[i];
        if constexpr (!GLU) {
            if (a.n_mats > 1) {  // multi-weight: the weight owning column tile y (by-value selects: no
                int m = 0;       // runtime index into the parameter arrays, which would go to local memory)
#pragma unroll
                for (int i = 1; i < kGemmMaxMats; ++i)
                    if (i < a.n_mats && tile_n >= a.mat_tile0[i]) m = i;
#pragma unroll
                for (int i = 0; i < kGemmMaxMats; ++i)
                    if (i == m) {
                        w[0] = a.w[i];
                        N    = a.mat_n[i];
                        Y    = a.mat_y[i];
                        tile_n -= a.mat_tile0[i];
                    }
            }
        }
    }
    const int64_t K = a.k, KC = K / F::E;
    const int64_t n0 = tile_n * NOUT;
    // K stages [kt0, kt1) of 32: all of K, or split z of a split-K launch.
    const int64_t kt_all = K / kGemmBK;
    const int64_t kt0    = a.ksplit > 1 ? int64_t(blockIdx.z) * a.kt_per_split : 0;
    const int64_t kt1    = a.ksplit > 1 ? min(kt_all, kt0 + a.kt_per_split) : kt_all;

    // Weight chunks this thread loads each stage: chunk q = tid + i * 256 -> smem row q / CPR,
    // chunk q % CPR of the stage.
    // 4-bit tile-major (device_weight.h; a GLU's two weights have one shape, so one order): brow is
    // the row's first chunk, chunk c lies at chunk_at(c) from it.
    const bool      tiled    = w4_format(F::kFormat) && w[0].tiled;
    auto            chunk_at = [&](int64_t c) { return w4_chunk_index(tiled, 0, c, KC); };
    const uint8_t * brow[CPT];
    int64_t         bn[CPT];
    int             bwi[CPT];
#pragma unroll
    for (int i = 0; i < CPT; ++i) {
        const int q  = tid + i * kGemmThreads;
        const int r  = (q < BCH ? q : 0) / CPR;
        const int wi = GLU ? r / 64 : 0;
        const int64_t n = min(n0 + (GLU ? r % 64 : r), N - 1);  // rows past N compute unused columns
        bwi[i]  = wi;
        bn[i]   = n;
        brow[i] = static_cast<const uint8_t *>(wi != 0 ? w[NW - 1].data : w[0].data) + w4_chunk_index(tiled, n, 0, KC) * 16;
    }

    auto load_a = [&](int buf, int64_t kt) {
#pragma unroll
        for (int p = tid; p < BM * 4; p += kGemmThreads) {
            const int     r  = p / 4, col = (p % 4) * 8;
            const int64_t gr = row0 + r;
            const bool    ok = gr < row_end;
            ptx::cp_async_16(&sA[buf][r][col], a.a + (ok ? gr : 0) * a.lda + kt * kGemmBK + col, ok);
        }
    };
    // F16 weights: cp.async (4 pieces of 16 bytes per row and stage).
    auto load_b_direct = [&](int buf, int64_t kt) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const int q = tid + i * kGemmThreads;
            if (q < BCH) ptx::cp_async_16(&sB[buf][q / CPR][(q % CPR) * F::E], brow[i] + (kt * CPR + q % CPR) * 16, true);
        }
    };

    uint4          braw[CPT];
    typename F::Sc bsc[CPT];
    auto load_b_regs = [&](int64_t kt) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const int q = tid + i * kGemmThreads;
            if (q < BCH) {
                const int64_t c = kt * CPR + q % CPR;
                braw[i]         = ptx::ld_nc_v4(brow[i] + chunk_at(c) * 16);
                // (a by-value select: indexing w[] with a runtime value would put it in local memory)
                const DeviceWeight ws = (NW > 1 && bwi[i] != 0) ? w[NW - 1] : w[0];
                bsc[i]                = F::load_scale(ws, bn[i], c, 1.0f);
            }
        }
    };
    auto store_b = [&](int buf) {
#pragma unroll
        for (int i = 0; i < CPT; ++i) {
            const int q = tid + i * kGemmThreads;
            if (q < BCH) {
                uint16_t * dst = &sB[buf][q / CPR][(q % CPR) * F::E];
#pragma unroll
                for (int s = 0; s < F::NSUB; ++s) {
                    float v[F::SUB];
                    F::sub(braw[i], s, bsc[i], v);
                    float f = 1.0f;
                    if constexpr (F::SPS > 0) f = F::factor(bsc[i], s / F::SPS);
                    uint32_t packed[F::SUB / 2];
#pragma unroll
                    for (int e = 0; e < F::SUB / 2; ++e) packed[e] = ptx::pack_f16x2_satfinite(v[2 * e] * f, v[2 * e + 1] * f);
                    if constexpr (F::SUB == 8)
                        *reinterpret_cast<uint4 *>(dst + s * 8) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
                    else
                        *reinterpret_cast<uint2 *>(dst + s * 4) = make_uint2(packed[0], packed[1]);
                }
            }
        }
    };

    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

    // Prologue: stage kt0.
    load_a(0, kt0);
    if constexpr (kDirect) {
        load_b_direct(0, kt0);
    } else {
        load_b_regs(kt0);
    }
    ptx::cp_async_commit();
    if constexpr (!kDirect) store_b(0);
    ptx::cp_async_wait<0>();
    __syncthreads();

    for (int64_t kt = kt0; kt < kt1; ++kt) {
        const int  cur  = int((kt - kt0) & 1), nxt = cur ^ 1;
        const bool more = kt + 1 < kt1;
        if (more) {
            load_a(nxt, kt + 1);
            if constexpr (kDirect) load_b_direct(nxt, kt + 1);
            ptx::cp_async_commit();
            if constexpr (!kDirect) load_b_regs(kt + 1);
        }
#pragma unroll
        for (int kk = 0; kk < kGemmBK / 16; ++kk) {
            uint32_t af[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                ptx::ldmatrix_x4(af[mt], &sA[cur][wm * MT * 16 + mt * 16 + (lane % 16)][kk * 16 + (lane / 16) * 8]);
            uint32_t bfr[4][2];
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                const int brow0 = GLU ? np * 64 + wn * 16 : wn * 32 + np * 16;
                uint32_t  r[4];
                ptx::ldmatrix_x4(r, &sB[cur][brow0 + (lane % 8) + (lane / 16) * 8][kk * 16 + ((lane / 8) % 2) * 8]);
                bfr[2 * np][0]     = r[0];
                bfr[2 * np][1]     = r[1];
                bfr[2 * np + 1][0] = r[2];
                bfr[2 * np + 1][1] = r[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) ptx::mma_m16n8k16<__half>(acc[mt][nt], af[mt], bfr[nt][0], bfr[nt][1]);
        }
        if constexpr (!kDirect) {
            if (more) store_b(nxt);
        }
        ptx::cp_async_wait<0>();
        __syncthreads();
    }

    // Split K: the blocks of a tile take arrival tickets; all but the last store their raw
    // accumulators and count the store; the last waits for those stores (their blocks have left the
    // main loop and wait for nothing, so this cannot deadlock), adds the partials in split order -
    // its own from registers - and goes on to the epilogue. The last block's partial never goes
    // through memory: a tile of s splits moves s - 1 partials out and back.
    if (a.ksplit > 1) {
        constexpr int kSlot   = kGemmThreads * MT * 4;  // float4s of one block's partial
        const int64_t tile    = int64_t(blockIdx.x) + int64_t(gridDim.x) * blockIdx.y;
        float4 *      part    = reinterpret_cast<float4 *>(a.partial) + tile * a.ksplit * kSlot + tid;
        uint32_t *    arrived = a.counters + 2 * tile, *stored = arrived + 1;
        const int     z       = int(blockIdx.z);
        if (tid == 0) s_last_split = atomicAdd(arrived, 1u) == uint32_t(a.ksplit - 1);
        __syncthreads();
        if (!s_last_split) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
                    part[z * kSlot + (mt * 4 + nt) * kGemmThreads] = make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]);
            __threadfence();  // the partial is visible device-wide before the store is counted
            __syncthreads();
            if (tid == 0) atomicAdd(stored, 1u);
            return;
        }
        if (tid == 0)
            while (*static_cast<volatile uint32_t *>(stored) < uint32_t(a.ksplit - 1)) gemm_backoff();
        __syncthreads();
        __threadfence();
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                // Left to right, p0 + p1 + ... (the own partial in place at z), from L2
                // (ld.global.cg: other blocks' stores are not in this SM's L1).
                const float4 * p = part + (mt * 4 + nt) * kGemmThreads;
                float *        c = acc[mt][nt];
                if (z > 0) {
                    float4 v = __ldcg(p);
                    for (int zz = 1; zz < z; ++zz) {
                        const float4 u = __ldcg(p + zz * kSlot);
                        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
                    }
                    c[0] = v.x + c[0], c[1] = v.y + c[1], c[2] = v.z + c[2], c[3] = v.w + c[3];
                }
                for (int zz = z + 1; zz < a.ksplit; ++zz) {
                    const float4 u = __ldcg(p + zz * kSlot);
                    c[0] += u.x, c[1] += u.y, c[2] += u.z, c[3] += u.w;
                }
            }
    }

    // Epilogue: (acc * inv_scale of the row) * global scale; the first product is exact (a power of
    // two; unless the result leaves f32's normal range), so the row scale costs no accuracy.
    float gscale[NW];
#pragma unroll
    for (int i = 0; i < NW; ++i) gscale[i] = F::kFormat == WeightFormat::NVFP4 ? w[i].global_scale : 1.0f;
    const int g = lane / 4, q4 = lane % 4;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t gr = row0 + wm * MT * 16 + mt * 16 + g + h * 8;
            if (gr >= row_end) continue;
            const float   inv  = __ldg(a.a_inv_scale + gr);
            const int64_t orow = a.out_rows != nullptr ? int64_t(__ldg(a.out_rows + gr)) : gr;
            float *       yr   = Y + orow * N;
#pragma unroll
            for (int nt = 0; nt < (GLU ? 2 : 4); ++nt) {
                const int64_t col = n0 + (GLU ? wn * 16 : wn * 32) + nt * 8 + q4 * 2;
                float         v0, v1;
                if constexpr (GLU) {
                    v0 = silu((acc[mt][nt][2 * h] * inv) * gscale[0]) * ((acc[mt][nt + 2][2 * h] * inv) * gscale[NW - 1]);
                    v1 = silu((acc[mt][nt][2 * h + 1] * inv) * gscale[0]) * ((acc[mt][nt + 2][2 * h + 1] * inv) * gscale[NW - 1]);
                } else {
                    v0 = (acc[mt][nt][2 * h] * inv) * gscale[0];
                    v1 = (acc[mt][nt][2 * h + 1] * inv) * gscale[0];
                }
                if (col + 1 < N && (reinterpret_cast<uintptr_t>(yr + col) & 7u) == 0) {
                    *reinterpret_cast<float2 *>(yr + col) = make_float2(v0, v1);
                } else {
                    if (col < N) yr[col] = v0;
                    if (col + 1 < N) yr[col + 1] = v1;
                }
            }
        }
}

#ifdef __CUDACC__
template <class F>
void gemm_launch(int mt, bool glu, const GemmArgs & a, dim3 grid, cudaStream_t s) {
    const dim3 block(kGemmThreads);
    if (mt == 1) {
        if (glu)
            launch(gemm_kernel<F, 1, true>, grid, block, 0, s, a);
        else
            launch(gemm_kernel<F, 1, false>, grid, block, 0, s, a);
    } else {
        if (glu)
            launch(gemm_kernel<F, 4, true>, grid, block, 0, s, a);
        else
            launch(gemm_kernel<F, 4, false>, grid, block, 0, s, a);
    }
}
#endif

}  // namespace spark::cuda::mm
