// Decode GEMV (1..8 activation rows): bandwidth-bound, weights dequantized in registers.
//
// Work mapping. A block has 8 warps; `wk` of them split K and the 8 / wk others take different
// weight rows. Inside a warp, `lpr` lanes (32, 16 or 8: "lanes per row") share a row group of U
// rows (gemv_rows_per_warp), so a warp covers 32 / lpr groups: short rows (the MoE down projection,
// K = 768 INT4 = 24 chunks) and grids that should fit one wave take fewer lanes per row. Lane `sl` of
// K-warp `kw` reads chunks c = c_begin + kw lpr + sl + j lpr wk (j = 0, 1, ...): every load
// instruction of a warp reads lpr x 16 contiguous bytes of each of its rows. plan_gemv (plan.cpp)
// picks lpr, wk and the K split from a cost model of the launch.
//
// Pipeline. One step j of a lane is U (gate+up: 2U) independent 16-byte streaming loads
// (ld.global.nc.L1::no_allocate, L2 evict_first) plus their scale loads. The loads of D steps are in
// flight at once (a register ring, gemv_depth): the loads of step j + D - 1 are issued before step j
// is decoded, so decoding overlaps the memory latency, and a lane with J <= D steps issues all its
// loads at its start (a small matrix is one round trip). One activation row: 80 registers (3 blocks,
// 24 warps per SM; NVFP4 and INT4 with zero points 128), 8 loads (128 bytes) in flight per lane.
//
// Decode (GEMV-specific decoders below; exact, as formats.cuh): INT4 builds each f32 2^m + q with
// one LOP3 (the nibble masked in place under an exponent that makes its bit position the units) and
// one FADD of 2^m + zero; NVFP4 / FP8 through f16 bits; per scale group a partial dot of exact
// decoded values, then acc += factor * partial. Each decoded weight is used for all R activation
// rows (x read as float4 from L1/L2, reused across the U rows of a step).
//
// Reduction, all in fixed orders (deterministic): butterfly shuffles inside a row group, K-warps
// through shared memory (warp kw = 0 adds kw = 1, 2, ... in order), and, when K is split across
// blocks (gridDim.y > 1, skinny shapes only), every block writes its partial sums, and the last block
// of a tile to arrive (arrival counter in a workspace buffer zeroed on the stream before the launch)
// sums the splits in split order and applies SwiGLU. One launch either way.
//
// MATMUL_ID: gridDim.z = k_slots * T pairs; a block reads its pair's expert id and DeviceWeight from
// the device (one launch for all routed experts of all tokens, R = 1); (row tile, split, pair) is one
// flat grid.
//
// Multi-weight launches (op_matmul_multi, a.n_mats > 1): several weights over the same activations;
// block x belongs to weight m for x in [mat_tile0[m], mat_tile0[m + 1]) (gemv_mat) and is then a
// plain one-weight block of that weight's rows and output.
//
// INT4 with groups of a multiple of 128 (or one group) and NVFP4 take the tensor-core decode kernel
// of gemv_mma_kernels.cuh instead (plan.mma), which shares the helpers below the decoders.
//
// The CPU emulation dev/kernels/matmul/emu_gemv.cpp runs this kernel (every format, split and path)
// against a double reference without a GPU.
#pragma once

#include "backends/cuda/common/launch.h"
#include "backends/cuda/common/math.cuh"
#include "backends/cuda/common/pdl.cuh"
#include "backends/cuda/common/ptx_sm80.cuh"
#include "backends/cuda/matmul/formats.cuh"
#include "backends/cuda/matmul/matmul.h"

namespace spark::cuda::mm {

// ---- GEMV decoders ---------------------------------------------------------------------------------
// Interface (all __device__):
//   E, SUB, NSUB, SPS          as formats.cuh (elements per chunk, sub-chunk size, sub-chunks, sub-chunks
//                              per scale factor; SPS = 0: unscaled)
//   Wt   prep(w)               per-weight constants, once per block
//   Row  row(w, wt, n)         row n's offset into the scales (32 bits: one register per row)
//   Sc   load_scale(w, wt, row, c) the raw scale bits of chunk c (loaded with the chunk, in flight
//                              with it; kept small: they sit in the register ring)
//   Cst  cst(wt, sc)           the decoded scale(s) and per-chunk constants, when the chunk is used
//   sub(raw, s, cst, v)        the exact values of sub-chunk s
//   factor(cst, g)             the multiplier of scale group g of the chunk

// Chunk index -> block index (scale group / k-block) for a per-weight block of d chunks, without a
// division in the loop: c / d = (umulhi(c, m) + c) >> l with l = ceil(log2 d), m = floor(2^32 (2^l - d)
// / d) + 1 (exact for c < 2^31; d a power of two gives m = 1, a plain shift); one block per row: 0.
struct ChunkDiv {
    uint32_t m = 0;
    int      l = 31;
    __device__ __forceinline__ uint32_t operator()(uint32_t c) const { return (__umulhi(c, m) + c) >> l; }
    __device__ __forceinline__ static ChunkDiv make(int64_t block_elems, int64_t k, int e) {
        ChunkDiv r;
        if (block_elems >= k || block_elems <= 0) return r;  // (0 + c) >> 31 = 0 for c < 2^31
        const uint32_t d = uint32_t(block_elems / e);
        r.l              = d <= 1 ? 0 : 32 - __clz(int(d - 1));
        r.m              = (d & (d - 1)) == 0 ? 1u : uint32_t((uint64_t(1) << 32) * ((uint64_t(1) << r.l) - d) / d + 1);
        return r;
    }
};

// F32 / F16 / BF16: no scales; the formats.cuh decoders.
template <class F>
struct GvPlain {
    static constexpr WeightFormat kFormat = F::kFormat;
    static constexpr int          E = F::E, SUB = F::SUB, NSUB = F::NSUB, SPS = 0;
    static constexpr int          kMinBlocksR1 = gemv_min_blocks(1, kFormat);  // see matmul.h
    struct Wt {};
    struct Row {};
    struct Sc {};
    struct Cst {};
    __device__ __forceinline__ static Wt  prep(const DeviceWeight &) { return {}; }
    __device__ __forceinline__ static Row row(const DeviceWeight &, const Wt &, int64_t) { return {}; }
    __device__ __forceinline__ static Sc  load_scale(const DeviceWeight &, const Wt &, const Row &, uint32_t) { return {}; }
    __device__ __forceinline__ static Cst cst(const Wt &, const Sc &) { return {}; }
    __device__ __forceinline__ static float factor(const Cst &, int) { return 1.0f; }
    __device__ __forceinline__ static void  sub(const uint4 & raw, int s, const Cst &, float (&v)[SUB]) {
        F::sub(raw, s, typename F::Sc{}, v);
    }
};

// INT4 (chunk = 32 consecutive K inside one group). Element j of word s (nibble j) is decoded with
// one LOP3 and one FADD: nibble j < 4 of w (j >= 4: of w >> 16) sits at bits 4j'..4j'+3 (j' = j % 4);
// OR-ing the exponent field 150 - 4j' makes those bits the units of the f32 2^(23-4j') + q (the
// mantissa bits below are masked off), and subtracting 2^(23-4j') + zero (exact in f32) gives q - zero
// exactly. kAsym: per-group zero points (zeros == nullptr still means 8); otherwise zero = 8 and the
// subtrahends are immediates.
template <bool kAsym>
struct GvInt4 {
    static constexpr WeightFormat kFormat = WeightFormat::INT4;
    static constexpr int          E = 32, SUB = 8, NSUB = 4, SPS = 4;
    static constexpr int          kMinBlocksR1 = kAsym ? 2 : gemv_min_blocks(1, kFormat);  // zero points need registers
    struct Wt {
        ChunkDiv grp;
        int32_t  n_groups;
        bool     bf16;
    };
    struct Row {
        uint32_t off;  // n * n_groups (scales and zeros)
    };
    struct Sc {
        uint32_t bits;  // scale bits (f16 / bf16) | zero << 16
    };
    struct Cst {
        float scale;
        float c[4];  // kAsym: 2^(23 - 4j) + zero
    };
    __device__ __forceinline__ static float magic(int j) { return __uint_as_float(uint32_t(150 - 4 * j) << 23); }  // 2^(23-4j)
    __device__ __forceinline__ static Wt prep(const DeviceWeight & w) {
        return {ChunkDiv::make(w.group_size, w.k, 32), w.n_groups, w.scale_type == ScaleType::BF16};
    }
    __device__ __forceinline__ static Row row(const DeviceWeight &, const Wt & p, int64_t n) { return {uint32_t(n) * uint32_t(p.n_groups)}; }
    __device__ __forceinline__ static Sc  load_scale(const DeviceWeight & w, const Wt & p, const Row & r, uint32_t c) {
        const uint32_t i = r.off + p.grp(c);
        uint32_t       b = __ldg(static_cast<const uint16_t *>(w.scales) + i);
        if constexpr (kAsym) b |= (w.zeros ? uint32_t(__ldg(w.zeros + i)) : 8u) << 16;
        return {b};
    }
    __device__ __forceinline__ static Cst cst(const Wt & p, const Sc & sc) {
        Cst            c{};
        const uint32_t h = sc.bits & 0xFFFFu;
        c.scale          = p.bf16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half(uint16_t(h)));
        if constexpr (kAsym) {
            const float z = float(sc.bits >> 16);
#pragma unroll
            for (int j = 0; j < 4; ++j) c.c[j] = magic(j) + z;
        }
        return c;
    }
    __device__ __forceinline__ static float factor(const Cst & c, int) { return c.scale; }
    template <int j>
    __device__ __forceinline__ static void pair(uint32_t w, uint32_t hi, const Cst & cs, float (&v)[SUB]) {
        constexpr uint32_t kMask = 0xFu << (4 * j), kExpo = uint32_t(150 - 4 * j) << 23;
        const float        b     = kAsym ? cs.c[j] : magic(j) + 8.0f;
        v[j]                     = __uint_as_float(ptx::and_or<kMask>(w, kExpo)) - b;
        v[j + 4]                 = __uint_as_float(ptx::and_or<kMask>(hi, kExpo)) - b;
    }
    __device__ __forceinline__ static void sub(const uint4 & raw, int s, const Cst & cs, float (&v)[SUB]) {
        const uint32_t w = word_of(raw, s), hi = w >> 16;
        pair<0>(w, hi, cs, v);
        pair<1>(w, hi, cs, v);
        pair<2>(w, hi, cs, v);
        pair<3>(w, hi, cs, v);
    }
};

// NVFP4: chunk = 32 consecutive K = two scale blocks of 16; factor = f32(e4m3) * global * 2^14 (as
// FmtNvfp4::load_scale), values from FmtNvfp4::sub.
struct GvNvfp4 {
    static constexpr WeightFormat kFormat = WeightFormat::NVFP4;
    static constexpr int          E = 32, SUB = 8, NSUB = 4, SPS = 2;
    static constexpr int          kMinBlocksR1 = gemv_min_blocks(1, kFormat);
    struct Wt {
        float global;
    };
    struct Row {
        uint32_t off;  // n * k / 32: row n's scale pairs (one u16 per chunk)
    };
    struct Sc {
        uint32_t two;  // the chunk's two E4M3 scale codes
    };
    struct Cst {
        float s[2];
    };
    __device__ __forceinline__ static Wt  prep(const DeviceWeight & w) { return {w.global_scale}; }
    __device__ __forceinline__ static Row row(const DeviceWeight & w, const Wt &, int64_t n) { return {uint32_t(n) * uint32_t(w.k / 32)}; }
    __device__ __forceinline__ static Sc  load_scale(const DeviceWeight & w, const Wt &, const Row & r, uint32_t c) {
        return {__ldg(static_cast<const uint16_t *>(w.scales) + (r.off + c))};
    }
    __device__ __forceinline__ static Cst cst(const Wt & p, const Sc & sc) {
        const float2 f = e4m3x2_to_float2(sc.two);
        return {{(f.x * p.global) * 16384.0f, (f.y * p.global) * 16384.0f}};
    }
    __device__ __forceinline__ static float factor(const Cst & c, int g) { return c.s[g]; }
    __device__ __forceinline__ static void  sub(const uint4 & raw, int s, const Cst &, float (&v)[SUB]) {
        FmtNvfp4::sub(raw, s, FmtNvfp4::Sc{}, v);
    }
};

// FP8 E4M3: chunk = 16 consecutive K inside one k-block; factor = block scale * 2^8 (as
// FmtFp8::load_scale), values from FmtFp8::sub.
struct GvFp8 {
    static constexpr WeightFormat kFormat = WeightFormat::FP8;
    static constexpr int          E = 16, SUB = 8, NSUB = 2, SPS = 2;
    static constexpr int          kMinBlocksR1 = gemv_min_blocks(1, kFormat);
    struct Wt {
        ChunkDiv kb;
    };
    struct Row {
        uint32_t off;  // (n / block_n) * k_blocks
    };
    struct Sc {
        float s;
    };
    struct Cst {
        float s;
    };
    __device__ __forceinline__ static Wt  prep(const DeviceWeight & w) { return {ChunkDiv::make(w.block_k, w.k, 16)}; }
    __device__ __forceinline__ static Row row(const DeviceWeight & w, const Wt &, int64_t n) {
        const uint32_t k_blocks = (uint32_t(w.k) + uint32_t(w.block_k) - 1) / uint32_t(w.block_k);  // 32-bit: N, K < 2^31
        return {uint32_t(n) / uint32_t(w.block_n) * k_blocks};
    }
    __device__ __forceinline__ static Sc load_scale(const DeviceWeight & w, const Wt & p, const Row & r, uint32_t c) {
        return {__ldg(static_cast<const float *>(w.scales) + (r.off + p.kb(c)))};
    }
    __device__ __forceinline__ static Cst   cst(const Wt &, const Sc & sc) { return {sc.s * 256.0f}; }
    __device__ __forceinline__ static float factor(const Cst & c, int) { return c.s; }
    __device__ __forceinline__ static void  sub(const uint4 & raw, int s, const Cst &, float (&v)[SUB]) {
        FmtFp8::sub(raw, s, FmtFp8::Sc{0.0f}, v);
    }
};

// ---- one step: U rows (x NW weights) of one chunk position, all R activation rows --------------------

template <class F, int R, int U, int NW>
__device__ __forceinline__ void gemv_chunk(const uint4 (&raw)[NW][U], const typename F::Sc (&sc)[NW][U], const typename F::Wt (&wt)[NW],
                                           const float * const (&xr)[R], size_t k0, float (&acc)[NW][U][R]) {
    typename F::Cst cs[NW][U];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u) cs[i][u] = F::cst(wt[i], sc[i][u]);
    float tmp[NW][U][R];
#pragma unroll
    for (int s = 0; s < F::NSUB; ++s) {
        float xv[R][F::SUB];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float4 * xp = reinterpret_cast<const float4 *>(xr[r] + k0 + s * F::SUB);
#pragma unroll
            for (int q = 0; q < F::SUB / 4; ++q) {
                const float4 t   = __ldg(xp + q);
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
                F::sub(raw[i][u], s, cs[i][u], v);
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
                        const float f = F::factor(cs[i][u], s / F::SPS);
#pragma unroll
                        for (int r = 0; r < R; ++r) acc[i][u][r] = fmaf(f, tmp[i][u][r], acc[i][u][r]);
                    }
            }
        }
    }
}

// ---- shared by the FMA kernel (below) and the MMA kernel (gemv_mma_kernels.cuh) ----------------------------

// Which weight of a multi-weight launch this block computes, and its block x within that weight.
struct GemvMat {
    int      m  = 0;
    unsigned bx = 0;
    int64_t  n = 0, row_off = 0;
    float *  y = nullptr;
};
__device__ __forceinline__ GemvMat gemv_mat(const GemvArgs & a) {
    GemvMat r;
    r.bx = blockIdx.x;
    r.n  = a.n;
    r.y  = a.y;
    if (a.n_mats > 1) {
        for (int m = 1; m < a.n_mats; ++m)
            if (int(blockIdx.x) >= a.mat_tile0[m]) r.m = m;
        r.bx      = blockIdx.x - unsigned(a.mat_tile0[r.m]);
        r.n       = a.mat_n[r.m];
        r.row_off = a.mat_row0[r.m];
        r.y       = a.mat_y[r.m];
    }
    return r;
}

// A MATMUL_ID block's activation row: its (slot, token) pair's (no memory read; pair: blockIdx.z,
// or a warp's slot of the experts' combine).
template <int R>
__device__ __forceinline__ void gemv_expert_rows(const GemvArgs & a, const float * (&xr)[R], int64_t & out_row0, int pair = int(blockIdx.z)) {
    const int j = pair % a.ids.k_slots, t = pair / a.ids.k_slots;
#pragma unroll
    for (int r = 0; r < R; ++r) xr[r] = a.xbase + j * a.x_sj + t * a.x_st;
    out_row0 = pair;
}

// A MATMUL_ID block's weights: it reads its (slot, token) pair's expert id (an invalid id, or an
// expert this device does not hold: an absent_expert entry with null data, device_weight.h:
// valid = false, the block reads no weight and writes zeros; its w are then the launch's a.w, a
// held expert whose pointers nothing reads), then the expert's table entry, or, where the set lies
// at one stride (a.grid, expert_grid), computes the addresses from expert 0's (a.w): one dependent
// trip less before the weights are requested.
template <int NW>
__device__ __forceinline__ void gemv_expert_weights(const GemvArgs & a, DeviceWeight (&w)[NW], bool & valid, int pair = int(blockIdx.z)) {
    if (!a.ids_early) pdl::wait();  // the expert ids come from the router
    const int       j = pair % a.ids.k_slots, t = pair / a.ids.k_slots;
    const int32_t * ip = a.ids.p + j * a.ids.s0 + t * a.ids.s1;
    const int32_t   e  = a.ids_early ? __ldcg(ip) : __ldg(ip);
    valid              = e >= 0 && e < a.ids.n_experts;
    if (a.grid[0].uniform) {  // every expert held, at one stride: its addresses from the id (expert_grid)
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            w[i] = a.w[i];
            if (!valid) continue;
            const ExpertGrid & g = a.grid[i];
            w[i].data            = static_cast<const char *>(w[i].data) + int64_t(e) * g.data;
            if (w[i].scales) w[i].scales = static_cast<const char *>(w[i].scales) + int64_t(e) * g.scales;
            if (w[i].zeros) w[i].zeros = w[i].zeros + int64_t(e) * g.zeros;
        }
        return;
    }
#pragma unroll
    for (int i = 0; i < NW; ++i) {
        if (valid) w[i] = a.table[i][e];
        valid = valid && w[i].data != nullptr;
    }
    if (!valid) {
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.w[i];
    }
}

// The weights and activation rows of this block: a MATMUL_ID's expert (above), or weight mt.m
// (.. + NW - 1) of a MATMUL and the launch's rows.
template <int NW, int R>
__device__ __forceinline__ void gemv_block_operands(const GemvArgs & a, const GemvMat & mt, DeviceWeight (&w)[NW], const float * (&xr)[R],
                                                    int64_t & out_row0, bool & valid) {
    if (a.table[0] != nullptr) {
        gemv_expert_weights(a, w, valid);
        gemv_expert_rows(a, xr, out_row0);
    } else {
#pragma unroll
        for (int i = 0; i < NW; ++i) w[i] = a.w[mt.m + i];
#pragma unroll
        for (int r = 0; r < R; ++r) xr[r] = a.x[r];
    }
}

// K split across blocks: every block has written its sums to partial[split][nw][out_rows][a.n] (the
// rows of its weight from row_off); the last block of the tile to arrive (arrival counter) sums the
// splits in split order into y and applies SwiGLU.
template <bool GLU>
__device__ __forceinline__ void gemv_splitk_finish(const GemvArgs & a, int64_t tile_n0, int rows_per_block, int rows,
                                                   int64_t out_row0, const GemvMat & mt) {
    constexpr int NW = GLU ? 2 : 1;
    __threadfence();
    __syncthreads();
    __shared__ bool last;
    if (threadIdx.x == 0) last = atomicAdd(a.counters + (size_t(blockIdx.z) * gridDim.x + blockIdx.x), 1u) == gridDim.y - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int     ks       = int(gridDim.y);
    const int64_t out_rows = a.out_rows, NT = a.n;
    for (int idx = int(threadIdx.x); idx < rows_per_block * rows; idx += kGemvThreads) {
        const int64_t n = tile_n0 + idx % rows_per_block;
        if (n >= mt.n) continue;
        const int64_t row = out_row0 + idx / rows_per_block;
        float         g = 0.0f, up = 0.0f;
        for (int s = 0; s < ks; ++s) {
            g += __ldcg(a.partial + ((int64_t(s) * NW) * out_rows + row) * NT + mt.row_off + n);
            if constexpr (GLU) up += __ldcg(a.partial + ((int64_t(s) * NW + 1) * out_rows + row) * NT + mt.row_off + n);
        }
        if constexpr (GLU)
            mt.y[row * mt.n + n] = silu(g) * up;
        else
            mt.y[row * mt.n + n] = g;
    }
}

// ---- the kernel ---------------------------------------------------------------------------------

template <class F, int R, bool GLU>
__global__ void __launch_bounds__(kGemvThreads, R == 1 ? F::kMinBlocksR1 : gemv_min_blocks(R, F::kFormat)) gemv_kernel(const GemvArgs a) {
    constexpr int NW     = GLU ? 2 : 1;
    constexpr int U      = gemv_rows_per_warp(R, NW, F::E);
    constexpr int D      = gemv_depth(R, NW, F::E);
    constexpr int kWarps = kGemvThreads / 32;

    const int lane      = int(threadIdx.x) & 31;
    const int warp      = int(threadIdx.x) >> 5;
    const int wk        = a.wk;   // 1, 2, 4, 8
    const int lpr       = a.lpr;  // 32, 16, 8
    const int lpr_shift = __ffs(lpr) - 1;
    const int kw        = warp & (wk - 1);
    const int wr        = warp >> (__ffs(wk) - 1);
    const int G         = 32 >> lpr_shift;  // row groups per warp
    const int grp       = lane >> lpr_shift;
    const int sl        = lane & (lpr - 1);
    const int rows_per_block = (kWarps / wk) * G * U;

    const GemvMat  mt      = gemv_mat(a);  // multi-weight launches: this block's weight
    const int64_t  N       = mt.n;
    const uint32_t KC      = uint32_t(a.k / F::E);
    const int64_t  tile_n0 = int64_t(mt.bx) * rows_per_block;
    const int64_t  n_base  = tile_n0 + int64_t(wr * G + grp) * U;

    DeviceWeight  w[NW];
    const float * xr[R];
    int64_t       out_row0 = 0;
    bool          valid    = true;
    gemv_block_operands(a, mt, w, xr, out_row0, valid);

    // This block's K range, and this lane's chunks c0 + j * stride (j < J).
    const uint32_t cps     = uint32_t(a.chunks_per_split);
    const uint32_t c_begin = blockIdx.y * cps;
    const uint32_t c_end   = valid ? min(KC, c_begin + cps) : c_begin;  // invalid expert: no steps, output 0
    const uint32_t stride  = uint32_t(lpr * wk);
    const uint32_t c0      = c_begin + uint32_t(kw * lpr + sl);
    const int      J       = c_end > c_begin ? int((c_end - c_begin + stride - 1) / stride) : 0;

    // Row offsets in chunks (32 bits: weights below 64 GB) and into the scales: one register each.
    // Tile-major INT4 / NVFP4 (device_weight.h; a GLU's two weights have one shape, so one order): the
    // row's first chunk plus w4_chunk_index(tiled, 0, c).
    const bool      tiled = w[0].tiled;
    typename F::Wt  wt[NW];
    typename F::Row rr[NW][U];
    uint32_t        roff[U];
#pragma unroll
    for (int i = 0; i < NW; ++i) wt[i] = F::prep(w[i]);
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int64_t n = min(n_base + u, N - 1);  // rows past N load row N - 1 and are not stored
        roff[u]         = uint32_t(w4_chunk_index(tiled, n, 0, KC));
#pragma unroll
        for (int i = 0; i < NW; ++i) rr[i][u] = F::row(w[i], wt[i], n);
    }

    float acc[NW][U][R];
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[i][u][r] = 0.0f;

    // The register ring: slot d holds step j with j % D == d.
    uint4          raw[D][NW][U];
    typename F::Sc sc[D][NW][U];
    const uint64_t policy = ptx::l2_evict_first_policy();
    auto issue = [&](const int slot, const int j) {
        const uint32_t c = c0 + uint32_t(j) * stride;
        if (c < c_end) {
            const uint32_t cw = uint32_t(w4_chunk_index(tiled, 0, c, KC));
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u)
                    raw[slot][i][u] = ptx::ld_stream_v4(static_cast<const uint4 *>(w[i].data) + (roff[u] + cw), policy);
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u) sc[slot][i][u] = F::load_scale(w[i], wt[i], rr[i][u], c);
        }
    };
    auto consume = [&](const int slot, const int j) {
        const uint32_t c = c0 + uint32_t(j) * stride;
        if (c < c_end) gemv_chunk<F, R, U, NW>(raw[slot], sc[slot], wt, xr, size_t(c) * F::E, acc);
    };
    // The weights do not depend on the previous kernel: the first D steps are requested before
    // waiting for it (a plain MATMUL, or a MATMUL_ID with ids_early; other MATMUL_IDs waited for
    // their ids above), so their latency overlaps its tail.
    // The next kernel may launch once this block has streamed all its weights: triggered at the
    // start, the kernels launched behind this one cost more than they gained (H100: 8B FP8 216.6 ->
    // 230.8, 30B-A3B int4 (router, lm_head) 414 -> 425 tokens/s; docs/PERF.md).
#pragma unroll
    for (int d = 0; d < D; ++d) issue(d, d);
    if (a.table[0] == nullptr || a.ids_early) pdl::wait();
    for (int j0 = 0; j0 < J; j0 += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (j0 + d > 0) issue((d + D - 1) % D, j0 + d + D - 1);  // step D - 1 came with the prologue
            consume(d, j0 + d);
        }
    }
    pdl::launch_dependents();

    // Row-group sums (lanes of a group hold partial dots of the same rows over different chunks).
#pragma unroll
    for (int i = 0; i < NW; ++i)
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    if (o < lpr) acc[i][u][r] += __shfl_xor_sync(0xFFFFFFFFu, acc[i][u][r], o);

    // K-warps: warp kw = 0 of each row set adds the others in order.
    bool writer = sl == 0;
    if (wk > 1) {
        __shared__ float red[kWarps][4][NW * U * R];  // 4: row groups per warp at lpr = 8
        if (sl == 0) {
#pragma unroll
            for (int i = 0; i < NW; ++i)
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) red[warp][grp][(i * U + u) * R + r] = acc[i][u][r];
        }
        __syncthreads();
        writer = writer && kw == 0;
        if (writer) {
            for (int q = 1; q < wk; ++q)
#pragma unroll
                for (int i = 0; i < NW; ++i)
#pragma unroll
                    for (int u = 0; u < U; ++u)
#pragma unroll
                        for (int r = 0; r < R; ++r) acc[i][u][r] += red[warp + q][grp][(i * U + u) * R + r];
        }
    }

    const int     rows     = a.table[0] != nullptr ? 1 : a.rows;
    const int64_t out_rows = a.out_rows;
    if (a.partial == nullptr) {
        if (!writer) return;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t n = n_base + u;
            if (n >= N) continue;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= rows) continue;
                const int64_t row = out_row0 + r;
                if constexpr (GLU)
                    mt.y[row * N + n] = silu(acc[0][u][r]) * acc[1][u][r];
                else
                    mt.y[row * N + n] = acc[0][u][r];
            }
        }
        return;
    }

    // K split across blocks: partial[split][nw][out_rows][a.n]; the tile's last block sums the splits.
    if (writer) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int64_t n = n_base + u;
            if (n >= N) continue;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r >= rows) continue;
                const int64_t row = out_row0 + r;
#pragma unroll
                for (int i = 0; i < NW; ++i)
                    a.partial[((int64_t(blockIdx.y) * NW + i) * out_rows + row) * a.n + mt.row_off + n] = acc[i][u][r];
            }
        }
    }
    gemv_splitk_finish<GLU>(a, tile_n0, rows_per_block, rows, out_row0, mt);
}

// The instantiation for r_tmpl activation rows (glu: the fused gate/up), passed to run(kernel): the
// one choice of the GPU's launcher and the CPU emulator's (dev/kernels/matmul), so that the emulator
// runs what the GPU runs. Returns the reason there is none (a plan the kernel has no form for), or
// nullptr.
template <class F, class Run>
const char * gemv_select(int r_tmpl, bool glu, Run && run) {
    switch (r_tmpl * 2 + int(glu)) {
        case 2: run(gemv_kernel<F, 1, false>); return nullptr;
        case 3: run(gemv_kernel<F, 1, true>); return nullptr;
        case 4: run(gemv_kernel<F, 2, false>); return nullptr;
        case 5: run(gemv_kernel<F, 2, true>); return nullptr;
        case 6: run(gemv_kernel<F, 3, false>); return nullptr;
        case 7: run(gemv_kernel<F, 3, true>); return nullptr;
        case 8: run(gemv_kernel<F, 4, false>); return nullptr;
        case 9: run(gemv_kernel<F, 4, true>); return nullptr;
        case 16: run(gemv_kernel<F, 8, false>); return nullptr;
        case 17: run(gemv_kernel<F, 8, true>); return nullptr;
        default: return "gemv: no instantiation for this row count";
    }
}

#ifdef __CUDACC__
// a.pdl: programmatic dependent launch (the kernel waits for the previous one in-kernel). A row
// count without an instantiation is an error, never a step without its launch.
template <class F>
void gemv_launch(int r_tmpl, bool glu, const GemvArgs & a, dim3 grid, cudaStream_t s) {
    const char * why = gemv_select<F>(r_tmpl, glu, [&](auto kernel) { launch_kernel(kernel, grid, dim3(kGemvThreads), 0, s, a.pdl != 0, a); });
    if (why != nullptr) fail(SPARK_ERR_INTERNAL, "%s (%d rows)", why, r_tmpl);
}
#endif

}  // namespace spark::cuda::mm
